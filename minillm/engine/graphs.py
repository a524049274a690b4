"""Decode steps replayed per batch-size bucket instead of run op by op (chapter 07).

A decode step of a small model is hundreds of small operations; run eagerly, each costs Python and dispatcher
time on the host (and, on a GPU, a kernel launch). So the step is prepared once per batch size and then
replayed: a batch of n sequences runs in the smallest bucket that holds it, its rows padded. On a GPU the
replay would be a CUDA graph (one launch for the whole step, as nano-vllm and vLLM do); on a CPU it is the
step compiled by torch.compile with fixed shapes (inductor's generated C++: one call, elementwise chains fused).
A bucket is compiled the first time a batch needs it, so an engine starts at once.
"""
import time

import torch

from minillm.utils.context import Context, get_context, reset_context, set_context


def decode_buckets(max_batch: int) -> list[int]:
    """The batch sizes prepared in advance: 1, 2, 4, 8, then every multiple of 16 up to max_batch (nano-vllm's
    list). Small batches get tight buckets; larger ones waste at most 15 padded rows."""
    return [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))


def pick_bucket(buckets: list[int], batch: int) -> int | None:
    """The smallest bucket that holds `batch` rows, or None when the batch is larger than every bucket (then the
    step runs eagerly)."""
    return next((b for b in buckets if b >= batch), None)


class DecodeGraphs:
    """Runs decode steps of `runner`'s model per bucket, on the runner's preallocated input buffers."""

    def __init__(self, runner, max_batch: int):
        self.runner, self.buckets = runner, decode_buckets(max_batch)
        # one compiled model; dynamo specialises it once per input shape, i.e. once per bucket
        self.compiled = torch.compile(runner.model, dynamic=False, fullgraph=True)
        self.build_seconds: dict[int, float] = {}  # bucket -> time its first run took (compiling included)
        # every bucket is one more compiled version of the same forward: let dynamo keep them all
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(self.buckets) + 8)

    def __call__(self, batch: int) -> torch.Tensor | None:
        """The hidden states [batch, hidden] of the decode step prepared in the runner's buffers and context
        (prepare_decode), computed in its bucket; None if no bucket holds `batch`."""
        bucket = pick_bucket(self.buckets, batch)
        if bucket is None:
            return None
        self.pad(batch, bucket)
        return self.step(bucket)[:batch]

    def step(self, bucket: int) -> torch.Tensor:
        """Run the bucket's compiled step on the first `bucket` rows of the input buffers (compiled on first use)."""
        r, start = self.runner, time.perf_counter()
        hidden = self.compiled(r.input_ids[:bucket], r.positions[:bucket])
        self.build_seconds.setdefault(bucket, time.perf_counter() - start)
        return hidden

    @torch.inference_mode()
    def capture(self, max_batch: int | None = None) -> None:
        """Build every bucket (up to max_batch) now rather than on first use, largest first as nano-vllm
        captures, on padding rows alone (they write no cache slot)."""
        for bucket in reversed([b for b in self.buckets if max_batch is None or b <= max_batch]):
            set_context(Context(block_tables=self.runner.block_tables_buf[:0, :1]))
            try:
                self.pad(0, bucket)
                self.step(bucket)
            finally:
                reset_context()

    def pad(self, batch: int, bucket: int) -> None:
        """Extend the step from `batch` to `bucket` rows: a padded row reads token 0 at position 0, writes to no
        cache slot (-1) and attends to one key of block 0; its output is never read."""
        r, ctx = self.runner, get_context()
        r.input_ids[batch:bucket] = 0
        r.positions[batch:bucket] = 0
        r.slot_mapping[batch:bucket] = -1
        r.context_lens[batch:bucket] = 1
        r.block_tables_buf[batch:bucket] = 0
        set_context(Context(slot_mapping=r.slot_mapping[:bucket], context_lens=r.context_lens[:bucket],
                            block_tables=r.block_tables_buf[:bucket, :ctx.block_tables.shape[1]],
                            context_lens_cpu=ctx.context_lens_cpu + [1] * (bucket - batch)))

    def describe(self) -> str:
        built = ", ".join(f"{b} ({s:.1f} s)" for b, s in sorted(self.build_seconds.items())) or "none yet"
        return f"compiled decode steps in buckets {self.buckets}; built so far: {built}"
