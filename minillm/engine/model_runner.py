"""ModelRunner: owns the model and the KV cache; turns a batch of sequences into flat tensors, runs, samples.

Three steps, as in nano-vllm: `prepare_prefill` / `prepare_decode` lay the batch out as host-side lists (the
`StepInputs`), `load` writes them into preallocated input buffers as the step's Context; `run_model` is the
forward pass (the one place that chooses between eager, compiled and graph replay); the `Sampler` picks the
tokens. What the device offers (kernels, attention backend, threads, defaults) is the runner's Platform. Under
tensor parallelism (chapter 10) every rank has a ModelRunner with its shard of the model: rank 0 prepares each
step and broadcasts its StepInputs, every rank loads and runs them, rank 0 samples. With speculative decoding
(chapter 13) rank 0 also owns the proposer (`drafter`, as in vLLM V1) and calls it right after sampling: the drafts
come back with the step's tokens, for the scheduler to verify in the next step. Under pipeline parallelism (chapter
15) each rank's runner holds one stage's layers (see minillm.engine.pipeline).
"""

import torch

from minillm.config import Config
from minillm.engine.graphs import CompiledDecodeSteps, CUDADecodeGraphs, why_eager
from minillm.engine.input_batch import InputBuffers, StepInputs, rows_step_inputs
from minillm.engine.kv_budget import kv_cache_budget
from minillm.engine.kv_cache import (
    allocate_int8_kv_cache,
    allocate_kv_cache,
    copy_blocks,
    kv_cache_bytes_per_token,
    kv_cache_int8_bytes_per_token,
)
from minillm.engine.pipeline import stage_loop
from minillm.engine.sample_step import sample_step
from minillm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minillm.engine.sequence import Sequence
from minillm.layers.attention.paged_attention import slot_mapping_for
from minillm.layers.logits_processors import LogitsProcessors
from minillm.layers.rejection_sampler import RejectionSampler
from minillm.layers.sampler import Sampler, SamplingMetadata
from minillm.models import build_model
from minillm.platforms import select_platform
from minillm.spec_decode import draft_inputs, make_proposer
from minillm.utils.compile import compiled_layers
from minillm.utils.context import Context, reset_context, set_context
from minillm.utils.parallel import TensorParallelGroup, cpu_threads, tensor_parallel
from minillm.utils.pipeline import IntermediateTensors, PipelineGroup, StageRecord, pipeline_parallel


class ModelRunner:
    # pipeline parallelism, rank 0: set to [] to record every stage's forward passes (StageRecords) into it
    timeline: list[StageRecord] | None = None
    eos_token_ids: tuple[int, ...] = ()  # set by the engine core: what min_tokens holds back (chapter 16)
    structured_output = None  # the engine core's StructuredOutputManager, once a request needs a grammar

    def __init__(
        self,
        config: Config,
        model_path,
        group: TensorParallelGroup | None = None,
        kv_cache: bool = True,
        pp: PipelineGroup | None = None,
    ):
        """group: this rank's stage's tensor-parallel group; pp: its pipeline group (None: one process holds the
        whole model). kv_cache=False: no KV cache yet (a draft model's runner: the target sizes both caches and gives
        it as many blocks as its own, `initialize_kv_cache`)."""
        self.config, self.group, self.pp = config, group, pp
        self.dtype = getattr(torch, config.dtype)
        ranks = (group.size if group else 1) * (pp.size if pp else 1)
        self.platform = select_platform(config, self.dtype, ranks, (group or pp).local_rank if ranks > 1 else 0)
        self.device = self.platform.device
        if ranks > 1 and self.device.type == "cuda":  # one device per rank
            torch.cuda.set_device(self.device)
        with tensor_parallel(group), pipeline_parallel(pp):
            self.model = build_model(model_path, self.dtype, self.device, self.platform.linear_method)
        self.attn_layers = self.platform.prepare_model(self.model)  # kernels, weight layout, attention backend
        self.block_size = config.kvcache_block_size
        self.buffers = InputBuffers(config, self.block_size, self.device)
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler()
        self.eager_reason = why_eager(self, config)  # before the KV budget: CUDA graphs keep a memory pool
        self.kv_cache_dtype = config.kv_cache_dtype  # "int8": int8 keys and values, a float32 scale per token and head
        self.compile_layers = self.platform.compile_layers if config.compile_layers is None else config.compile_layers
        self.drafter = None  # speculative decoding's proposer (chapter 13), on the rank that samples
        if not kv_cache:
            return
        if not (group and group.rank or pp and pp.rank):  # rank 0; a draft model is loaded before the KV budget
            load = lambda draft, path: ModelRunner(draft, path, kv_cache=False)
            self.drafter = make_proposer(config, self.model.config.vocab_size, load)
        draft = getattr(self.drafter, "runner", None)
        bytes_per_block = self.kv_cache_bytes_per_block + (draft.kv_cache_bytes_per_block if draft else 0)
        num_blocks = config.num_kvcache_blocks or kv_cache_budget(self, config) // bytes_per_block
        for g in (group, pp):  # every rank must hold the same blocks: the fewest any rank has room for
            if g:
                num_blocks = g.min(num_blocks)
        if num_blocks < 1:
            raise ValueError(
                f"no memory is left for the KV cache (one block needs {bytes_per_block} bytes): "
                "raise kvcache_memory_bytes / gpu_memory_utilization or use a smaller model"
            )
        self.initialize_kv_cache(num_blocks)
        if draft:
            draft.initialize_kv_cache(num_blocks)

    @property
    def kv_cache_bytes_per_block(self) -> int:
        """Bytes of this runner's share of one KV block: each tensor-parallel rank caches its share of the heads,
        each pipeline stage its own layers (so the same memory holds more blocks)."""
        c = self.model.config
        if self.kv_cache_dtype == "int8":
            per_token = kv_cache_int8_bytes_per_token(c)
        else:
            per_token = kv_cache_bytes_per_token(c, self.dtype)
        per_token = per_token // c.num_hidden_layers * len(self.attn_layers)
        return per_token * self.block_size // (self.group.size if self.group else 1)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache, num_blocks blocks, and prepare the decode steps replayed over it."""
        self.num_kvcache_blocks, config = num_blocks, self.config
        # one spare block at the end, never handed out: padded rows of a decode step write there (PAD_SLOT_ID)
        if self.kv_cache_dtype == "int8":  # kv_scales: [2, layers, blocks, block_size, kv_heads]
            self.kv_cache, self.kv_scales = allocate_int8_kv_cache(self.model, num_blocks + 1, self.block_size)
        else:
            self.kv_cache = allocate_kv_cache(self.model, num_blocks + 1, self.block_size)
        cuda, sizes = self.device.type == "cuda", config.cudagraph_capture_sizes
        kind = CUDADecodeGraphs if cuda else CompiledDecodeSteps
        # buckets up to a decode step's most rows: a sequence each, and one per draft a verify step checks
        self.graphs = None if self.eager_reason else kind(self, min(self.buffers.decode_rows, 512), sizes)
        if self.graphs and (cuda or sizes):  # every bucket on CUDA, the named ones on a CPU: built now, not mid-service
            self.graphs.capture()

    @property
    def graph_mode(self) -> str:
        """How decode steps run: eager (and why) or per bucket (and what was built, in how long); and whether
        the layers' hot functions are compiled."""
        steps = f"eager ({self.eager_reason})" if self.graphs is None else self.graphs.describe()
        return f"{steps}; layers {'compiled' if self.compile_layers else 'eager'}"

    def prepare_prefill(self, seqs: list[Sequence]) -> StepInputs:
        """Pack each sequence's scheduled tokens end to end: cu_seqlens, slot_mapping (and block_tables when some
        keys come from the cache). The leading decoding sequences (the decode tokens of a mixed step) are rows of
        one token each, counted, with their context lengths, so that attention runs them as a decode."""
        rows, num_decodes = [], 0
        for seq in seqs:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_scheduled_tokens
            if seq.decodes_this_step and num_decodes == len(rows):
                rows += [(seq, pos, pos + 1) for pos in range(start, end)]
                num_decodes = len(rows)
            else:
                rows.append((seq, start, end))
        input_ids, positions, slot_mapping, cu_q, cu_k, logits_indices = [], [], [], [0], [0], []
        for seq, start, end in rows:
            input_ids += seq.tokens_at(start, end)
            positions += range(start, end)
            cu_q.append(cu_q[-1] + end - start)
            cu_k.append(cu_k[-1] + end)
            if end >= len(seq):  # the rows from the newest token on give next-token logits
                logits_indices += range(cu_q[-1] - (end - max(start, len(seq) - 1)), cu_q[-1])
            slots = slot_mapping_for(seq.block_table, start, end, self.block_size)
            # a fully cached prompt recomputes its last token; its K/V are in a shared block already
            slot_mapping += [-1 if pos < seq.num_cached_tokens else s for pos, s in zip(range(start, end), slots)]
        block_tables = [seq.block_table for seq, _, _ in rows] if num_decodes or cu_k[-1] > cu_q[-1] else None
        context_lens = [b - a for a, b in zip(cu_k, cu_k[1 : num_decodes + 1])] if num_decodes else None
        return StepInputs(
            True,
            input_ids,
            positions,
            slot_mapping,
            block_tables,
            cu_q,
            cu_k,
            logits_indices,
            context_lens,
            num_decodes,
        )

    def prepare_decode(self, seqs: list[Sequence]) -> StepInputs:
        """A row per new token: each sequence's newest, at position len - 1, then its drafts (chapter 13), each a
        decode of its own over the keys before it, so that verifying k drafts is a decode step of k + 1 rows."""
        rows = [(seq, pos) for seq in seqs for pos in range(len(seq) - 1, len(seq) + len(seq.spec_token_ids))]
        return StepInputs(
            False,
            [seq.tokens_at(pos, pos + 1)[0] for seq, pos in rows],
            [pos for _, pos in rows],
            [slot_mapping_for(seq.block_table, pos, pos + 1, self.block_size)[0] for seq, pos in rows],
            [seq.block_table for seq, _ in rows],
            context_lens=[pos + 1 for _, pos in rows],
        )

    def load(self, inputs: StepInputs, bucket: int | None = None) -> Context:
        """A step's inputs written into the input buffers, as its Context (at a bucket's rows, for a replay)."""
        return self.buffers.load(inputs, self.attn_layers, bucket)

    def prepare_sample(self, seqs: list[Sequence], rows_per_draft: bool = False) -> SamplingMetadata:
        """Per-row sampling settings of the sequences that get a token this step (with rows_per_draft, each
        sequence's repeated over its 1 + len(spec_token_ids) rows)."""
        for seq in seqs:  # a seeded request's own random stream, on the device that samples
            if seq.generator is None and seq.sampling_params.seed is not None:
                seq.generator = torch.Generator(self.device).manual_seed(seq.sampling_params.seed)
        rows = [1 + len(seq.spec_token_ids) if rows_per_draft else 1 for seq in seqs]
        vocab = self.model.config.vocab_size  # penalties, bias and bans (chapter 16): not with drafts (refused)
        processors = None if rows_per_draft else LogitsProcessors.build(seqs, vocab, self.eos_token_ids, self.device)
        return SamplingMetadata.build(
            [seq.sampling_params for seq, n in zip(seqs, rows) for _ in range(n)],
            [seq.generator for seq, n in zip(seqs, rows) for _ in range(n)],
            self.device,
            processors,
        )

    @torch.inference_mode()
    def run_model(
        self, ctx: Context, replay: bool = False, intermediate: IntermediateTensors | None = None
    ) -> torch.Tensor | IntermediateTensors:
        """The forward pass of a loaded step: logits of the rows that sample (in a prefill, the last new token of
        each sequence that reaches its end; in a decode, every row). With `replay`, a decode step loaded at its
        bucket's rows runs in that bucket's compiled step or CUDA graph (self.graphs), else op by op. A pipeline
        stage before the last returns its IntermediateTensors; a later one starts from the stage before's."""
        with compiled_layers(self.compile_layers):
            hidden = self.graphs(ctx) if replay else self.model(ctx.input_ids, ctx.positions, intermediate)
            if isinstance(hidden, IntermediateTensors):
                return hidden
            if ctx.is_prefill:
                hidden = hidden[ctx.logits_indices]
            return self.model.compute_logits(hidden)

    def execute(
        self, inputs: StepInputs, intermediate: IntermediateTensors | None = None
    ) -> torch.Tensor | IntermediateTensors | None:
        """Load a step's inputs and run the forward pass: the logits of its sampled rows (None on the tensor-parallel
        ranks > 0; a pipeline stage's IntermediateTensors before the last stage)."""
        bucket = None if inputs.is_prefill or self.graphs is None else self.graphs.bucket_for(len(inputs.input_ids))
        if inputs.blocks_to_copy:  # copy-on-write: shared blocks this step writes into get copies first
            copy_blocks([self.kv_cache, getattr(self, "kv_scales", None)], inputs.blocks_to_copy)
        ctx = self.load(inputs, bucket)
        set_context(ctx)
        try:
            if intermediate is None:
                return self.run_model(ctx, replay=bucket is not None)
            return self.run_model(ctx, intermediate=intermediate)  # a later pipeline stage: eager
        finally:
            reset_context()

    def run(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """One step; for each of output.scheduled, the tokens it produced: [] for a prompt chunk that did not reach
        the end, else its kept drafts (chapter 13) and one token; and, with speculative decoding, the drafts its
        next step is to verify."""
        sampled, inputs = self.prepare(output)
        return self.sample(output.scheduled, sampled, self.forward(inputs))

    def prepare(self, output: SchedulerOutput) -> tuple[list[Sequence], StepInputs]:
        """A step's StepInputs, its sequences laid out as decoding ones first, ordered by length (similar contexts
        side by side, see CPUAttentionBackend), then the prompt chunks in the order scheduled; and, in that order,
        those that sample (a logits row each)."""
        batch = sorted((seq for seq in output.scheduled if seq.decodes_this_step), key=len)
        batch += [seq for seq in output.scheduled if not seq.decodes_this_step]
        inputs = (self.prepare_prefill if output.is_prefill else self.prepare_decode)(batch)
        inputs.blocks_to_copy = output.blocks_to_copy or None
        if inputs.blocks_to_copy and (draft := getattr(self.drafter, "runner", None)):  # its cache has the same blocks
            copy_blocks([draft.kv_cache, getattr(draft, "kv_scales", None)], inputs.blocks_to_copy)
        return [seq for seq in batch if seq.samples_this_step], inputs

    def forward(self, inputs: StepInputs) -> torch.Tensor | IntermediateTensors:
        """Rank 0: hand a step to the other ranks of its stage and run it (see `execute`)."""
        if self.group:
            self.group.send_step(inputs)  # the other ranks run the same step on their shards
        try:
            with cpu_threads(self.platform.threads):  # ranks sharing a CPU split its cores
                return self.execute(inputs)
        except BaseException as e:
            if self.group:  # the other ranks may wait in a collective this rank will never join
                self.group.abandon_step(e)
            raise

    def sample(self, seqs: list[Sequence], sampled: list[Sequence], logits: torch.Tensor | None) -> ModelRunnerOutput:
        """The tokens of a step that ran over `seqs`, from the logits of the rows of `sampled` (`sample_step`)."""
        return sample_step(self, seqs, sampled, logits)

    def propose(self, seqs: list[Sequence], new_token_ids: list[list[int]]):
        """Speculative decoding (chapter 13), right after sampling: the drafter's guesses of what follows each
        sequence's new tokens (at most k, and at most what max_tokens leaves after the token the next step samples
        anyway), and a draft model's distributions of them."""
        return self.drafter.propose(draft_inputs(seqs, new_token_ids, self.drafter.k))

    def execute_rows(self, rows: list[tuple[list[int], int, list[int], bool]]) -> torch.Tensor:
        """A draft model's forward (chapter 13): the logits of the rows that sample (`rows_step_inputs`)."""
        return self.execute(rows_step_inputs(rows, self.block_size))

    def loop(self) -> None:
        """Ranks 1..N-1: run every step rank 0 sends until it sends the end (see TensorParallelGroup); under
        pipeline parallelism, minillm.engine.pipeline's `stage_loop`."""
        if self.pp:
            return stage_loop(self)
        while (inputs := self.group.receive_step()) is not None:
            try:
                self.execute(inputs)
            except Exception as e:  # rank 0 abandoned the step, or this rank failed: both end it for all
                self.group.abandon_step(e)
