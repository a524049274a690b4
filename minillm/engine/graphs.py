"""Decode steps replayed per batch-size bucket instead of run op by op (chapter 07).

A decode step of a small model is hundreds of small operations; run eagerly, each costs Python and dispatcher
time on the host and, on a GPU, a kernel launch. So the step is prepared once per batch size and replayed: a
batch of n sequences runs in the smallest bucket that holds it, its rows padded. On a GPU the replay is a CUDA
graph (one launch for the whole step, as nano-vllm and vLLM do); on a CPU it is the step compiled by
torch.compile with fixed shapes (inductor's generated C++: one call, elementwise chains fused) and called
directly, built the first time a batch needs it, so that an engine starts at once.

Both read their inputs from the model runner's input buffers (minillm.engine.input_batch), so each replay finds
the step's tokens, positions, slots and block tables at the addresses it was recorded with.
"""

import sys
import time
import weakref

import torch

from minillm.engine.input_batch import StepInputs, decode_rows
from minillm.utils.compile import compiled_layers
from minillm.utils.context import Context, get_context, reset_context, set_context

PAD_SLOT_ID = -1  # vLLM's name: the cache slot of a padded row. The runner's cache keeps a spare block at its
# end, and slot -1 indexes the last slot, so padded rows write there and every decode store is mask-free.


def decode_buckets(max_batch: int) -> list[int]:
    """The batch sizes a decode step is prepared for: 1, 2, 4, 8, then every multiple of 16 up to max_batch.

    max_batch is a positive int, the most sequences a step can hold (the engine passes max_num_seqs, capped at
    512). Returns a list of ints in increasing order, none larger than max_batch: the powers of two 1, 2, 4
    and 8 that are ≤ max_batch, followed by 16, 32, 48, ... up to the largest multiple of 16 that is
    ≤ max_batch. This is nano-vllm's list: small batches get tight buckets, and a larger batch wastes at
    most 15 padded rows, with one prepared step per 16 rows instead of one per batch size.

    Examples: max_batch 256 gives [1, 2, 4, 8, 16, 32, ..., 240, 256]; 20 gives [1, 2, 4, 8, 16]; 3 gives
    [1, 2]; 1 gives [1]. When max_batch is not a multiple of 16 (20), the largest bucket is below it, and a
    batch of 17-20 has no bucket (it runs eagerly).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 07.1: decode buckets — 1, 2, 4, 8, then every multiple of 16, none past max_batch
    return [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))
    # END EXERCISE


def pick_bucket(buckets: list[int], batch: int) -> int | None:
    """The bucket a decode batch of `batch` rows runs in: the smallest of `buckets` that is ≥ batch.

    buckets is a list of ints in increasing order (as decode_buckets returns); batch is a positive int, the
    number of sequences in the step. Returns that bucket as an int, or None when batch is larger than every
    bucket: then no prepared step holds it and the step runs eagerly. A batch equal to a bucket gets exactly
    that bucket (no padding).

    Examples, buckets [1, 2, 4, 8, 16, 32]: batch 1 → 1, 3 → 4, 8 → 8, 9 → 16, 17 → 32, 33 → None.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 07.2: pick the bucket — the smallest one that holds the batch, None if none does
    return next((b for b in buckets if b >= batch), None)
    # END EXERCISE


def pad_decode_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    batch: int,
    bucket: int,
) -> None:
    """Turn rows batch .. bucket-1 of a decode step's input buffers into padding, in place.

    The buffers are the model runner's, each at least `bucket` rows long, with the step's real rows
    0 .. batch-1 already written: input_ids, positions, slot_mapping and context_lens are integer tensors
    [rows]; block_tables is [rows, max_blocks]. A prepared step always runs on exactly `bucket` rows, so
    the rows past the batch must hold inputs that are harmless: a padded row reads token 0 at position 0,
    writes its key and value to slot PAD_SLOT_ID (-1, the spare last slot of the cache, never a real
    sequence's), attends to one key (context_lens 1) in block 0 (every entry of its block_tables row is 0).
    Its output is computed and never read. Rows before `batch` and rows from `bucket` on are not touched;
    nothing is returned. batch == bucket pads nothing; batch 0 pads every row (used when a bucket is
    prepared before any request exists).

    Example: batch 3, bucket 4 → row 3 becomes input_ids 0, positions 0, slot_mapping -1, context_lens 1,
    block_tables row [0, 0, ...]; rows 0-2 keep the step's values.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 07.3: pad the batch — fill rows batch..bucket-1 with a harmless row writing to PAD_SLOT_ID
    rows = slice(batch, bucket)
    input_ids[rows] = 0
    positions[rows] = 0
    slot_mapping[rows] = PAD_SLOT_ID
    context_lens[rows] = 1
    block_tables[rows] = 0
    # END EXERCISE


class DecodeGraphs:
    """Runs decode steps of `runner`'s model per bucket: the choice of bucket and building every bucket are
    shared; how a bucket is built and replayed is the subclass's. A replayed step reads its inputs from the
    runner's input buffers, which the runner has loaded and padded to the bucket (InputBuffers.load)."""

    def __init__(self, runner, max_batch: int, sizes: list[int] | None = None):
        self.runner, self.buckets = runner, sorted(set(sizes)) if sizes else decode_buckets(max_batch)
        self.build_seconds: dict[int, float] = {}  # bucket -> time building it took

    def bucket_for(self, batch: int) -> int | None:
        """The bucket a decode step of `batch` rows runs in; None if none holds it (then it runs op by op)."""
        return pick_bucket(self.buckets, batch)

    def __call__(self, ctx: Context) -> torch.Tensor:
        """The hidden states [batch, hidden] of the decode step in `ctx`, loaded at its bucket's rows: padded,
        then replayed in that bucket."""
        batch = len(ctx.context_lens_cpu)
        return self.replay(self.pad(ctx, batch))[:batch]

    def pad(self, ctx: Context, batch: int) -> int:
        """Turn the context's rows past `batch` into padding (pad_decode_inputs); returns its bucket."""
        bucket = len(ctx.input_ids)
        pad_decode_inputs(
            ctx.input_ids, ctx.positions, ctx.slot_mapping, ctx.context_lens, ctx.block_tables, batch, bucket
        )
        ctx.context_lens_cpu = ctx.context_lens_cpu[:batch] + [1] * (bucket - batch)
        return bucket

    @torch.inference_mode()
    def capture(self, max_batch: int | None = None) -> None:
        """Build every bucket (up to max_batch) now, largest first as nano-vllm captures, on padding alone, with
        the layers compiled or not as the steps will run them (a compiled step is only valid for that setting)."""
        for bucket in reversed([b for b in self.buckets if max_batch is None or b <= max_batch]):
            if bucket not in self.build_seconds:
                ctx = self.runner.load(StepInputs(False, [], [], [], [], context_lens=[]), bucket)
                self.pad(ctx, 0)
                set_context(ctx)
                try:
                    with compiled_layers(self.runner.compile_layers):
                        self.timed_build(bucket)
                finally:
                    reset_context()

    def timed_build(self, bucket: int) -> None:
        start = time.perf_counter()
        self.build(bucket)
        self.build_seconds[bucket] = time.perf_counter() - start

    def describe(self) -> str:
        built = ", ".join(f"{b} ({s:.1f} s)" for b, s in sorted(self.build_seconds.items())) or "none yet"
        return f"{self.kind} in buckets {self.buckets}; built so far: {built}"


class CompiledDecodeSteps(DecodeGraphs):
    """The CPU's replay: each bucket's step traced once by dynamo (fixed shapes) and compiled by inductor, whose
    wrapper around the generated kernels is C++ too (`cpp_wrapper`), then replayed by calling that compiled code
    directly on the same input tensors, as a CUDA graph is replayed: no check of dynamo's guards (hundreds,
    one per parameter) and no Python between the step's operations. Like vLLM's compilation backend, a small
    torch.compile backend hands the graph to inductor and keeps what it returns. Attention is the backend's
    decode op where it has one (the CPU kernels' store-and-attend), else one opaque op (see Attention.forward);
    either way the step's tensors are read from the runner's buffers, block tables at their full width."""

    kind = "compiled decode steps"
    inductor_options = {"cpp_wrapper": True, "size_asserts": False}  # shapes are fixed: no size checks per call

    def __init__(self, runner, max_batch: int, sizes: list[int] | None = None):
        super().__init__(runner, max_batch, sizes)
        self.steps: dict[int, tuple] = {}  # bucket -> (inductor's compiled step, the tensors it was compiled on)
        # every bucket is one more compiled version of the model's forward, and dynamo keeps one cache per function
        # for every engine in the process (two engines, two models): let it keep them all
        torch._dynamo.config.recompile_limit += len(self.buckets)
        torch._dynamo.config.accumulated_recompile_limit += len(self.buckets)

    def build(self, bucket: int) -> None:
        from torch._inductor.compile_fx import compile_fx  # here: importing inductor takes a second

        # dynamo keeps the backend for as long as the process lives: it holds this object weakly, so that a deleted
        # engine (its KV cache, its weights) is freed
        this, options = weakref.ref(self), self.inductor_options

        def backend(graph, example_inputs):  # dynamo's traced step: the inputs are the parameters and the buffers' rows
            compiled = compile_fx(graph, example_inputs, config_patches=options)
            this().steps[bucket] = compiled, list(example_inputs)
            return compiled

        ctx = get_context()  # the bucket's padded inputs, views of the runner's buffers
        torch.compile(self.runner.model, backend=backend, dynamic=False, fullgraph=True)(ctx.input_ids, ctx.positions)

    def capture(self, max_batch: int | None = None) -> None:
        """DecodeGraphs.capture, said first on stderr: compiling takes seconds per bucket."""
        if todo := [b for b in self.buckets if (max_batch is None or b <= max_batch) and b not in self.build_seconds]:
            print(f"minillm: compiling the decode step for batch sizes {todo} (once per model and size; a later "
                  "start reuses inductor's cache)", file=sys.stderr, flush=True)  # fmt: skip
        super().capture(max_batch)

    def replay(self, bucket: int) -> torch.Tensor:
        if bucket not in self.steps:  # the first batch that needs a bucket builds it
            self.timed_build(bucket)
        compiled, inputs = self.steps[bucket]
        return compiled(*inputs)[0]


class CUDADecodeGraphs(DecodeGraphs):
    """The GPU's replay: each bucket's step recorded once as a torch.cuda.CUDAGraph (all buckets captured at
    start, largest first, sharing one memory pool) and replayed with one call. A graph replays the kernels it
    recorded on the addresses it recorded: inputs are read from the runner's buffers, the output is written to
    one static buffer, block tables always span every column, and nothing in the step may depend on a value
    read back to the host (the decode store writes padding to PAD_SLOT_ID instead of masking it out)."""

    kind = "CUDA graphs"

    def __init__(self, runner, max_batch: int, sizes: list[int] | None = None):
        super().__init__(runner, max_batch, sizes)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None  # the memory pool of the first (largest) graph, shared by the others
        self.outputs = torch.zeros(
            self.buckets[-1],
            runner.model.config.hidden_size,
            dtype=runner.model.model.norm.weight.dtype,
            device=runner.device,
        )

    def build(self, bucket: int) -> None:
        model, ctx, graph = self.runner.model, get_context(), torch.cuda.CUDAGraph()
        self.outputs[:bucket] = model(ctx.input_ids, ctx.positions)  # warm-up: lazy init, compile
        with torch.cuda.graph(graph, self.pool):
            self.outputs[:bucket] = model(ctx.input_ids, ctx.positions)
        self.pool = self.pool or graph.pool()
        self.graphs[bucket] = graph
        torch.cuda.synchronize()

    def replay(self, bucket: int) -> torch.Tensor:
        self.graphs[bucket].replay()
        return self.outputs[:bucket]


TORCH_GRAPH_GATHER_BYTES = 2**30  # the most the torch backend's decode attention may copy out per layer in a graph


def why_eager(runner, config) -> str | None:
    """Why a model runner's decode steps run op by op, or None when they are replayed per bucket (CUDA graphs, or compiled
    steps on a CPU). The torch backend's decode attention copies every row's keys and values out of the cache
    at the block tables' width, which a CUDA graph fixes at max_model_len: past TORCH_GRAPH_GATHER_BYTES per
    layer that is refused (an error if graphs were asked for, eager steps by default)."""
    if config.enforce_eager:
        return "enforce_eager=True"
    if runner.pp:  # check_pipeline_parallel refuses enforce_eager=False
        return "pipeline parallelism: a stage's step starts from the hidden states the stage before sent"
    if config.enforce_eager is None and not runner.platform.replays_decode:
        return "the CPU default: compiling costs seconds per batch-size bucket; enforce_eager=False turns it on"
    if runner.device.type == "cuda" and runner.platform.attention_backend.name == "torch":
        c, rows = runner.model.config, min(decode_rows(config), 512)
        kv_heads = max(1, c.num_key_value_heads // (runner.group.size if runner.group else 1))
        width = -(-config.max_model_len // runner.block_size) * runner.block_size
        gathered = 2 * rows * width * kv_heads * c.head_dim * runner.dtype.itemsize
        if config.kv_cache_dtype == "int8":  # the int8 blocks dequantized into a copy, then gathered from it
            gathered *= 2
        if gathered > TORCH_GRAPH_GATHER_BYTES:
            reason = (
                f"attention_backend='torch' in a CUDA graph would copy {gathered / 2**30:.1f} GiB of keys "
                f"and values per layer ({rows} rows x {width} positions, the max_model_len)"
            )
            if config.enforce_eager is False:
                raise ValueError(
                    f"{reason}: use attention_backend='triton' (it reads the blocks in place), or "
                    "lower max_model_len or max_num_seqs, or leave enforce_eager unset (eager steps)"
                )
            return reason
    return None
