"""Draft-model speculation: a much smaller model with the same tokenizer guesses k tokens one after another, and the
target verifies them in one step. As in vLLM V1, the draft keeps no state of its own: its KV cache has the target's
blocks (the same block ids, in its own far smaller tensors), written through the target's block tables. After every
step it runs over the tokens the target computed in that step, the rejected drafts left out and the step's new token
added, which fills its cache where the target's was filled and gives the logits of its first draft; then k - 1
decode steps give the others."""

from dataclasses import replace

import torch

from minillm.config import Config, ModelConfig, SpeculativeConfig
from minillm.layers.sampler import SamplingMetadata, draw, probabilities
from minillm.spec_decode.inputs import DraftInput
from minillm.utils.loader import resolve_model_path


def draft_config(spec: SpeculativeConfig, target: Config, vocab_size: int) -> tuple[Config, str]:
    """The draft model's engine settings and checkpoint: the target's, with the draft's own quantization and KV-cache
    dtype, one process, and room in a step for the target's tokens plus one new token per sequence. Refuses a draft
    that cannot serve this target."""
    path = resolve_model_path(spec.model)
    draft = ModelConfig.from_pretrained(path)
    if draft.vocab_size != vocab_size:
        raise ValueError(
            f"the draft model {spec.model} has a vocabulary of {draft.vocab_size} tokens, the target {vocab_size}: "
            "a draft must share the target's tokenizer"
        )
    if draft.max_position_embeddings < target.max_model_len:
        raise ValueError(
            f"the draft model {spec.model} reads at most {draft.max_position_embeddings} positions, the target's "
            f"max_model_len is {target.max_model_len}: lower max_model_len or use another draft"
        )
    config = replace(
        target,
        model=path,
        speculative_config=None,
        tensor_parallel_size=1,
        max_num_batched_tokens=target.max_num_batched_tokens + target.max_num_seqs,
        quantization=spec.quantization,
        kv_cache_dtype=spec.kv_cache_dtype,
    )
    return config, path


class DraftModelProposer:
    def __init__(self, num_speculative_tokens: int, runner):
        """runner: the draft model's ModelRunner (built by the target's runner, which gives it a KV cache of as many
        blocks as its own)."""
        self.k, self.runner = num_speculative_tokens, runner

    def propose(self, inputs: list[DraftInput]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Each sequence's drafts, and the draft's distributions they were drawn from ([n, V], None where they were
        picked greedily). A sequence gets at most num_drafts, and fewer where its blocks end: the draft writes keys
        and values at the positions of its new token and of all drafts but the last."""
        size = self.runner.block_size
        capacity = [len(i.block_table) * size for i in inputs]
        ks = [max(0, min(i.num_drafts, c - i.end + 1)) for i, c in zip(inputs, capacity)]
        # the target's tokens of the step, as far as the blocks hold them (a new token past them waits a step)
        first = [
            (i.token_ids[i.start : min(i.end, c)], i.start, i.block_table, k > 0)
            for i, c, k in zip(inputs, capacity, ks)
        ]
        drafts, probs = [[] for _ in inputs], [None] * len(inputs)
        active = [n for n, k in enumerate(ks) if k]
        with torch.inference_mode():
            rows = [row for row in first if row[0]]
            logits = self.runner.execute_rows(rows) if rows else None
            for step in range(max(ks, default=0)):
                if step:  # the previous draft's keys and values, and the logits after it: one decode step for all
                    active = [n for n in active if step < ks[n]]
                    batch = [([drafts[n][-1]], inputs[n].end - 1 + step, inputs[n].block_table, True) for n in active]
                    logits = self.runner.execute_rows(batch)
                tokens, q = self.sample(logits, [inputs[n] for n in active])
                for row, (n, token) in enumerate(zip(active, tokens)):
                    drafts[n].append(token)
                    if q is not None and inputs[n].sampling_params.temperature > 0:
                        probs[n] = q[row : row + 1] if probs[n] is None else torch.cat([probs[n], q[row : row + 1]])
        return drafts, probs

    @staticmethod
    def sample(logits: torch.Tensor, inputs: list[DraftInput]) -> tuple[list[int], torch.Tensor | None]:
        """A draft token per row: the draft's argmax for a greedy request, else a draw from the draft's own
        distribution under the request's sampling settings (returned too: q, for the rejection rule)."""
        md = SamplingMetadata.build([i.sampling_params for i in inputs], [i.generator for i in inputs], logits.device)
        greedy = logits.argmax(dim=-1)
        if md.all_greedy:
            return greedy.tolist(), None
        q = probabilities(logits, md)
        return draw(q, md, greedy).tolist(), q
