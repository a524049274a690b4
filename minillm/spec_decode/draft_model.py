"""Draft-model speculation: a much smaller model with the same tokenizer guesses k tokens one after another, and the
target verifies them in one step. The draft runs on the engine's own machinery: a ModelRunner with its own paged KV
cache and BlockManager, where each running request has a mirror Sequence. A mirror keeps the keys and values of the
tokens it has seen; after a verify step its entries past what the target kept are dropped (num_computed_tokens
falls back to the common prefix), so the next proposal recomputes only the tokens that changed."""

from dataclasses import replace

import torch

from minillm.config import Config, ModelConfig, SpeculativeConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.model_runner import ModelRunner
from minillm.engine.sequence import Sequence
from minillm.layers.sampler import SamplingMetadata, probabilities
from minillm.utils.loader import resolve_model_path
from minillm.utils.parallel import cpu_threads


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class DraftModelProposer:
    def __init__(self, spec: SpeculativeConfig, target: Config, vocab_size: int, num_blocks: int):
        """spec: the draft's settings (its model, k, and its own quantization and KV-cache dtype); target: the target
        engine's settings; vocab_size and num_blocks: the target's vocabulary and KV blocks (the draft's cache gets as
        many blocks: the same tokens, in far fewer bytes)."""
        model = spec.model
        path = resolve_model_path(model)
        draft = ModelConfig.from_pretrained(path)
        if draft.vocab_size != vocab_size:
            raise ValueError(
                f"the draft model {model} has a vocabulary of {draft.vocab_size} tokens, the target {vocab_size}: "
                "a draft must share the target's tokenizer"
            )
        if draft.max_position_embeddings < target.max_model_len:
            raise ValueError(
                f"the draft model {model} reads at most {draft.max_position_embeddings} positions, the target's "
                f"max_model_len is {target.max_model_len}: lower max_model_len or use another draft"
            )
        config = replace(
            target,
            model=path,
            speculative_config=None,
            tensor_parallel_size=1,
            num_kvcache_blocks=num_blocks,
            quantization=spec.quantization,
            kv_cache_dtype=spec.kv_cache_dtype,
        )
        self.runner = ModelRunner(config, path)
        self.block_manager = BlockManager(self.runner.num_kvcache_blocks, config.kvcache_block_size)
        self.k, self.budget = spec.num_speculative_tokens, config.max_num_batched_tokens
        self.mirrors: dict[int, Sequence] = {}  # the target sequence's seq_id -> its mirror in the draft's cache

    def propose(self, seqs: list[Sequence]) -> None:
        """Set each sequence's draft_token_ids (and spec_probs, the draft's distribution of each, when it samples):
        up to k drafts, fewer where max_tokens leaves less room, none where the draft's cache is full."""
        for seq_id in set(self.mirrors) - {seq.seq_id for seq in seqs}:  # preempted: recomputed when it is back
            self.block_manager.deallocate(self.mirrors.pop(seq_id))
        batch = []
        for seq in seqs:
            seq.draft_token_ids, seq.spec_probs = [], None
            k = min(self.k, seq.remaining_tokens - 1)
            if k > 0 and (mirror := self.sync(seq, k)) is not None:
                batch.append((seq, mirror, k))
        with torch.inference_mode(), cpu_threads(self.runner.platform.threads):
            logits = self.catch_up([mirror for _, mirror, _ in batch])
            for step in range(self.k):
                batch = [(seq, m, k) for seq, m, k in batch if step < k]
                if not batch:
                    break
                if step:  # the previous draft's keys and values, one decode step for all
                    logits = self.runner.execute(self.runner.prepare_decode([m for _, m, _ in batch]))
                    for _, m, _ in batch:
                        m.num_computed_tokens += 1
                drafts, probs = self.sample(logits, [seq for seq, _, _ in batch])
                for (seq, mirror, _), token, q in zip(batch, drafts, probs):
                    seq.draft_token_ids.append(token)
                    if q is not None:
                        seq.spec_probs = q[None] if seq.spec_probs is None else torch.cat([seq.spec_probs, q[None]])
                    mirror.token_ids.append(token)

    def release(self, seqs: list[Sequence]) -> None:
        """Free the mirrors of requests that finished or were aborted."""
        for seq in seqs:
            if seq.seq_id in self.mirrors:
                self.block_manager.deallocate(self.mirrors.pop(seq.seq_id))

    def sync(self, seq: Sequence, k: int) -> Sequence | None:
        """seq's mirror, holding seq's tokens, its cache entries past the common prefix dropped, and blocks for k - 1
        drafts more; None (the mirror freed) if the draft's cache has no room."""
        bm, mirror = self.block_manager, self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = Sequence(seq.token_ids, seq.sampling_params)
            if not bm.can_allocate(mirror):
                return None
            bm.allocate(mirror)
            mirror.num_computed_tokens = min(mirror.num_cached_tokens, len(seq) - 1)
            self.mirrors[seq.seq_id] = mirror
        else:
            kept = common_prefix(mirror.token_ids, seq.token_ids)
            mirror.num_computed_tokens = min(mirror.num_computed_tokens, kept, len(seq) - 1)  # the newest: its logits
            mirror.token_ids = list(seq.token_ids)
        need = bm.num_blocks(len(seq) + k - 1) - len(mirror.block_table)
        if need > bm.num_free_blocks:
            bm.deallocate(self.mirrors.pop(seq.seq_id))
            return None
        mirror.block_table += [bm._take_new().block_id for _ in range(max(0, need))]
        return mirror

    def catch_up(self, mirrors: list[Sequence]) -> torch.Tensor | None:
        """Compute the mirrors' tokens not yet in the draft's cache, in steps of at most max_num_batched_tokens
        tokens; returns the logits after each mirror's newest token (for its first draft), a row per mirror."""
        logits, pending = {}, list(mirrors)
        while pending:
            batch, budget = [], self.budget
            for m in pending:
                m.num_scheduled_tokens = min(len(m) - m.num_computed_tokens, budget)
                if m.num_scheduled_tokens == 0:
                    break
                budget -= m.num_scheduled_tokens
                batch.append(m)
            out = self.runner.execute(self.runner.prepare_prefill(batch))
            for row, m in enumerate(m for m in batch if m.samples_this_step):
                logits[id(m)] = out[row]
            for m in batch:
                m.num_computed_tokens += m.num_scheduled_tokens
            pending = [m for m in pending if m.num_computed_tokens < len(m)]
        return torch.stack([logits[id(m)] for m in mirrors]) if mirrors else None

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[torch.Tensor | None]]:
        """A draft token per row: the draft's argmax for a greedy request, else a draw from the draft's own
        distribution under the request's sampling settings (q, returned for the rejection rule)."""
        md = SamplingMetadata.build([seq.sampling_params for seq in seqs], [None] * len(seqs), logits.device)
        if md.all_greedy:
            return logits.argmax(dim=-1).tolist(), [None] * len(seqs)
        probs, tokens, qs = probabilities(logits, md), [], []
        for row, seq in enumerate(seqs):
            if seq.sampling_params.temperature == 0:
                tokens.append(int(logits[row].argmax()))
                qs.append(None)
            else:
                tokens.append(int(torch.multinomial(probs[row], 1, generator=seq.generator)))
                qs.append(probs[row])
        return tokens, qs
