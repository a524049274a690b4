"""The speedup ladder: one workload through the course's techniques, added one rung at a time.

Each rung is a named configuration of the real package, and adds one technique to the rung below it:
recomputing everything per token (chapter 03) → a contiguous KV cache (04) → static batches on the paged
cache (05) → continuous batching (06) → prefix caching (05/06) → the C++ CPU kernels (decode attention read
through the block tables, small-batch matmuls; CPU only) → decode steps compiled per batch-size bucket (CUDA
graphs on a GPU) and the layers' hot functions compiled (07/08) → Triton attention kernels (09, CUDA only).
The two one-request-at-a-time rungs are far slower, so they run only the first --ladder-slow-prompts requests;
every rung reports output tokens/s, which stays comparable across slices of the same workload. All rungs are
greedy: each must generate the naive loop's tokens, and the record says whether it did.
"""

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from minillm.bench.backends import Models, Run, progress, run_compiled, run_minillm, run_static
from minillm.bench.metrics import latency, throughput
from minillm.bench.workloads import Workload
from minillm.naive import generate_cached, generate_naive


def one_at_a_time(generate: Callable, name: str) -> Callable:
    """A backend running generate(model, prompt_ids, max_new_tokens) on the engine's model, request by request."""

    def run(models: Models, workload: Workload, warmup: Workload, args) -> Run:
        model = models.engine.model_runner.model
        list(generate(model, warmup.prompts[0], warmup.output_lens[0]))
        tokens = []
        with progress(len(workload), name, "req") as bar:
            start = time.perf_counter()
            for prompt, n in zip(workload.prompts, workload.output_lens):
                tokens.append(list(generate(model, prompt, n)))
                bar.update(1)
            elapsed = time.perf_counter() - start
        return Run(elapsed, tokens)

    return run


@dataclass(frozen=True)
class Rung:
    name: str
    label: str  # what this rung adds to the one below
    run: Callable  # a backend: (models, workload, warmup, args) -> Run
    adds: dict = field(default_factory=dict)  # engine options it turns on, kept by every rung above it
    slow: bool = False  # runs the first --ladder-slow-prompts requests only
    device: str | None = None  # "cpu" or "cuda": runs only there


# the engine with every technique of the ladder off; each rung turns on one more
NOTHING = dict(
    enforce_eager=True,
    compile_layers=False,
    attention_backend="torch",
    native_kernels=False,
    enable_prefix_caching=False,
)
RUNGS = [
    Rung("naive", "recompute all tokens, 1 request at a time", one_at_a_time(generate_naive, "naive"), slow=True),
    Rung("kv-cache", "+ contiguous KV cache", one_at_a_time(generate_cached, "kv-cache"), slow=True),
    Rung("static", "+ static batches, paged cache", run_static),
    Rung("continuous", "+ continuous batching", run_minillm),
    Rung("prefix-caching", "+ prefix caching", run_minillm, dict(enable_prefix_caching=True)),
    Rung(
        "cpu-kernels",
        "+ C++ CPU kernels",
        run_minillm,
        dict(attention_backend="cpu", native_kernels=True),
        device="cpu",
    ),
    Rung(
        "compiled",
        "+ compiled steps and layers / CUDA graphs",
        run_compiled,
        dict(enforce_eager=False, compile_layers=True),
    ),
    Rung("triton", "+ Triton attention kernels", run_compiled, dict(attention_backend="triton"), device="cuda"),
]


def rungs_for(device: str) -> list[str]:
    """The rungs that run on this device, in order."""
    return [r.name for r in RUNGS if r.device in (None, torch.device(device).type)]


def rung_options(name: str, device: str) -> dict:
    """The engine options of a rung: NOTHING, with what it and every rung below it on this device turn on."""
    names = rungs_for(device)
    if name not in names:
        raise ValueError(f"rung {name!r} does not run on {device}")
    options = dict(NOTHING)
    for rung in (r for r in RUNGS if r.name in names[: names.index(name) + 1]):
        options |= rung.adds
    return options


def run(path, engine_options: dict, workload: Workload, warmup: Workload, args) -> dict:
    """Every rung of --rungs on the workload (the slow ones on its first requests); per rung its throughput,
    latency where recorded, speedups over the rung before and the first, and whether its tokens equal the
    first rung's on the requests both ran."""
    head = Workload(workload.prompts[: args.ladder_slow_prompts], workload.output_lens[: args.ladder_slow_prompts])
    rungs, first = {}, None
    device = engine_options.get("device", "cpu")
    for rung in (r for r in RUNGS if r.name in args.rungs):
        part = head if rung.slow else workload
        result = rung.run(Models(path, engine_options | rung_options(rung.name, device)), part, warmup, args)
        first = first or result
        same = sum(a == b for a, b in zip(result.token_ids, first.token_ids))  # zip: the shorter run's requests
        rungs[rung.name] = dict(
            label=rung.label,
            first_requests_only=rung.slow,
            **throughput(part, result.elapsed),
            **(latency(result.times, part.output_lens) if result.times else {}),
            same_tokens_as_first=same / min(len(part), len(first.token_ids)),
            **{k: v for k, v in result.info.items() if k != "breakdown"},
        )
        print(
            f"{rung.name}: {rungs[rung.name]['output_tokens_per_second']:.1f} output tokens/s on {len(part)} requests"
        )
    speeds = [r["output_tokens_per_second"] for r in rungs.values()]
    for r, speed, before in zip(rungs.values(), speeds, speeds[:1] + speeds):
        r["speedup_over_previous"], r["speedup_over_first"] = speed / before, speed / speeds[0]
    return dict(ladder=dict(rungs=rungs, slow_prompts=len(head), engine_base_options=NOTHING))
