"""Workloads: seeded random token-id prompts and the exact number of tokens each request generates.

Every request runs with ignore_eos, so output_lens[i] is what request i produces on every backend, and
throughput compares like with like. Prompts are drawn from a pool of ordinary token ids (no EOS, BOS or
padding), so no backend treats a prompt token specially.
"""

import random
from dataclasses import dataclass


@dataclass
class Workload:
    """prompts[i] (token ids) generates exactly output_lens[i] tokens."""

    prompts: list[list[int]]
    output_lens: list[int]

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_input_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_len(self) -> int:
        """The longest request, prompt plus output: what the model's context must hold."""
        return max(len(p) + n for p, n in zip(self.prompts, self.output_lens))


def round_seed(seed: int, repeat: int) -> int:
    """The seed of round `repeat` of a repeated benchmark (round 0 keeps `seed`): other prompts for each round."""
    return seed + 1000 * repeat


def token_pool(vocab_size: int, special_ids: set[int]) -> list[int]:
    """The ids a random prompt may use: the whole vocabulary except its special tokens."""
    return [i for i in range(vocab_size) if i not in special_ids]


def fixed(num_prompts: int, input_len: int, output_len: int, pool: list[int], seed: int = 0) -> Workload:
    """Every prompt input_len tokens, every output output_len tokens."""
    rng = random.Random(seed)
    return Workload([rng.choices(pool, k=input_len) for _ in range(num_prompts)], [output_len] * num_prompts)


def mixed(
    num_prompts: int,
    input_range: tuple[int, int],
    output_range: tuple[int, int],
    pool: list[int],
    seed: int = 0,
    token_seed: int | None = None,
) -> Workload:
    """Prompt and output lengths drawn uniformly from [min, max] (inclusive): the case static batching wastes
    most on, since a padded batch runs to its longest request. The lengths come from seed; the prompts' tokens
    too, or from token_seed when given (the same lengths with other prompts)."""
    rng = random.Random(seed)
    input_lens = [rng.randint(*input_range) for _ in range(num_prompts)]
    output_lens = [rng.randint(*output_range) for _ in range(num_prompts)]
    tokens = rng if token_seed is None else random.Random(token_seed)
    return Workload([tokens.choices(pool, k=n) for n in input_lens], output_lens)


def shared_prefix(
    num_prompts: int, prefix_len: int, suffix_len: int, output_len: int, pool: list[int], seed: int = 0
) -> Workload:
    """One common preamble of prefix_len tokens, then suffix_len tokens of each request's own (a system prompt
    or few-shot examples followed by the question): what a prefix cache saves."""
    rng = random.Random(seed)
    prefix = rng.choices(pool, k=prefix_len)
    return Workload([prefix + rng.choices(pool, k=suffix_len) for _ in range(num_prompts)], [output_len] * num_prompts)
