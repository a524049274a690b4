"""The minillm backends: the engine's continuous batching, and static batching on the same engine.

A backend takes the models, the workload and a short warm-up workload; it runs the warm-up (first calls
pay for allocations and lazy initialisation), then times the workload and returns a Run.
"""

import gc
import time
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minillm import LLM, SamplingParams
from minillm.bench.breakdown import StepBreakdown, find, wrapped
from minillm.bench.memory import engine_growth, process_memory
from minillm.bench.models import num_parameters, weight_bytes
from minillm.bench.workloads import Workload
from minillm.config import Config, ModelConfig, resolve_dtype
from minillm.kernels.cpu import release_freed_memory
from minillm.naive import generate_static

PAD = 0  # the transformers backends' padding token: any id serves, padded positions are masked out


@dataclass
class Run:
    """One backend's timed run: its wall time, each request's generated tokens, (arrival, first token,
    finish) per request where the backend records them, and facts about the run for the record."""

    elapsed: float
    token_ids: list[list[int]]
    times: list[tuple[float, float, float]] | None = None
    info: dict = field(default_factory=dict)


class Models:
    """The backends' models, each loaded on first use: one minillm engine (continuous and static batching
    share its model and KV cache) and one transformers model (both transformers backends)."""

    def __init__(self, path: Path, engine_options: dict):
        self.path, self.engine_options = path, engine_options
        self.memory = None  # the resident memory building the engine took (minillm.bench.memory), once built

    def engine_option(self, name: str):
        """An engine setting as the engine will have it: given, or Config's default."""
        return self.engine_options.get(name, getattr(Config, name))

    @cached_property
    def engine(self) -> LLM:
        """The engine; building it records self.memory: the process's resident memory before and after, against
        the checkpoint's weights and the KV cache budget."""
        on_cpu = str(self.engine_option("device")) == "cpu"  # elsewhere the weights and cache are not resident here
        if on_cpu:  # heap pages freed earlier but still resident would be returned during the build, not grown
            gc.collect()
            release_freed_memory()
        before = process_memory() if on_cpu else None
        llm = LLM(self.path, **self.engine_options)
        after = process_memory() if on_cpu else None
        dtype = getattr(torch, llm.config.dtype)
        kv_cache = getattr(llm.model_runner, "kv_cache", None)
        scales = getattr(llm.model_runner, "kv_scales", None)  # an int8 cache's scales (kv_cache_dtype="int8")
        self.memory = engine_growth(
            before,
            after,
            weight_bytes(llm.model_runner.model)
            if llm.config.quantization
            else num_parameters(self.path) * dtype.itemsize,
            self.engine_option("kvcache_memory_bytes"),
            kv_cache.nbytes + (scales.nbytes if isinstance(scales, torch.Tensor) else 0)
            if isinstance(kv_cache, torch.Tensor)
            else None,
        )
        return llm

    @cached_property
    def compiled_engine(self) -> LLM:
        """A second engine with everything compiled: decode steps per batch-size bucket (enforce_eager=False), and
        the layers' hot functions in prefill steps (compile_layers, the default on CUDA)."""
        return LLM(self.path, **self.engine_options | {"enforce_eager": False, "compile_layers": True})

    @cached_property
    def compiled_layers_engine(self) -> LLM:
        """A third engine whose steps run op by op, with the layers' hot functions compiled (compile_layers)."""
        return LLM(self.path, **self.engine_options | {"compile_layers": True})

    @cached_property
    def eager_engine(self) -> LLM:
        """An engine with nothing compiled or captured, on any device (on a CPU, that is the default engine)."""
        return LLM(self.path, **self.engine_options | {"enforce_eager": True, "compile_layers": False})

    @cached_property
    def hf_model(self):
        """The transformers model, on the engine's device in the engine's dtype."""
        device = self.engine_option("device")
        dtype = resolve_dtype(self.engine_option("dtype"), device, ModelConfig.from_pretrained(self.path).dtype)
        return load_model(self.path, getattr(torch, dtype)).to(device)


def load_model(path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The checkpoint in `dtype` with transformers' default attention (sdpa), set up for greedy, EOS-free runs."""
    from transformers import AutoModelForCausalLM, GenerationConfig  # only the transformers backends pay its import

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.generation_config = GenerationConfig(do_sample=False, num_beams=1, pad_token_id=PAD)
    return model


def progress(total: int, desc: str, unit: str) -> tqdm:
    """A progress bar on a terminal (none when output is redirected), gone when done."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, disable=None)


def counting(fn, bar: tqdm):
    """fn, ticking bar once per call."""

    def wrapper(*args, **kwargs):
        bar.update(1)
        return fn(*args, **kwargs)

    return wrapper


def greedy(output_lens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]


def run_minillm(models: Models, workload: Workload, warmup: Workload, args, llm: LLM | None = None) -> Run:
    """Continuous batching: all requests in one generate call. The step breakdown is taken in this run."""
    llm = llm or models.engine
    llm.generate(warmup.prompts, greedy(warmup.output_lens), use_tqdm=False)
    with progress(len(workload), "minillm", "req") as bar:
        breakdown = StepBreakdown(llm, on_step=lambda seqs: bar.update(sum(seq.is_finished for seq in seqs)))
        with breakdown:
            start = time.perf_counter()
            outputs = llm.generate(workload.prompts, greedy(workload.output_lens), use_tqdm=False)
            elapsed = time.perf_counter() - start
    return Run(
        elapsed,
        [out.token_ids for out in outputs],
        [(out.arrival_time, out.first_token_time, out.finish_time) for out in outputs],
        {
            "breakdown": breakdown.summary(),
            "graph_mode": llm.model_runner.graph_mode,
            "attention_backend": llm.model_runner.platform.attention_backend.name,
        },
    )


def run_compiled(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """minillm with decode steps compiled per bucket: every bucket the workload can use is built before the
    clock starts (its build time is recorded, not timed)."""
    llm = models.compiled_engine
    start = time.perf_counter()
    llm.model_runner.graphs.capture(max_batch=len(workload))
    capture_seconds = time.perf_counter() - start
    run = run_minillm(models, workload, warmup, args, llm)
    run.info["capture_seconds"] = capture_seconds
    return run


def run_compiled_layers(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """minillm with the layers' hot functions compiled: they compile in the warm-up, before the clock."""
    return run_minillm(models, workload, warmup, args, models.compiled_layers_engine)


def run_eager(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """minillm with every step op by op and nothing compiled: the baseline for CUDA graphs on a GPU."""
    return run_minillm(models, workload, warmup, args, models.eager_engine)


def run_static(models: Models, workload: Workload, warmup: Workload, args) -> Run:
    """Static batching (minillm.naive.generate_static) on the engine's model and cache: batches of
    --static-batch-size requests in order, each running until its longest request is done."""
    llm = models.engine
    batch_size = args.static_batch_size or models.engine_option("max_num_seqs")
    generate_static(llm, warmup.prompts, greedy(warmup.output_lens), batch_size)
    num_steps = sum(max(workload.output_lens[i : i + batch_size]) for i in range(0, len(workload), batch_size))
    with (
        progress(num_steps, "minillm-static", "step") as bar,
        wrapped(*find(llm, "model_runner.run_model"), partial(counting, bar=bar)),
    ):
        start = time.perf_counter()
        seqs = generate_static(llm, workload.prompts, greedy(workload.output_lens), batch_size)
        elapsed = time.perf_counter() - start
    return Run(
        elapsed,
        [seq.completion_token_ids for seq in seqs],
        [(seq.arrival_time, seq.first_token_time, seq.finish_time) for seq in seqs],
        {"batch_size": batch_size},
    )
