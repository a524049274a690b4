"""Kernels chosen by measuring, as Triton's autotuner and vLLM's tuned configs choose them: where several kernels
compute the same thing, each is timed on the shapes it will meet, on this CPU, for a few milliseconds, and the
fastest is kept. Which kernel wins depends on the CPU (a matrix-vector product that streams at the memory's speed
on one vendor's chips can run at a third of it on another's), so no choice is written into the code.

Each candidate is timed on copies of its weight that together fill twice the last-level cache, one copy a run: as
in a decode step, whose model is larger than the cache, it reads its weight from memory. (Timed on one copy, every run
after the first would read it from the cache, and reward a kernel for a speed it never has in the engine.)

A decision is cached under minillm's cache directory (kernel-choices.json), keyed by the CPU's model, the kernels'
version and the shape, so the next start reuses it; `forced` (LLM(linear_kernel=...) or the environment variable
MINILLM_LINEAR_KERNEL) skips the measuring."""

import json
import math
import os
import platform
import time
from collections.abc import Callable
from functools import partial
from itertools import cycle
from pathlib import Path

import torch

from minillm.utils.cache import cache_dir

BUDGET_SECONDS = 0.01  # per candidate and batch size: enough runs to see past one slow one


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (platform.processor() elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return name or platform.processor() or platform.machine()


def last_level_cache_bytes() -> int:
    """The size of the largest CPU cache the OS reports for CPU 0 (/sys/devices/system/cpu), 0 where it says nothing."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [
        int(size.rstrip("KMG")) * units.get(size[-1], 1)
        for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")
        if (size := path.read_text().strip())
    ]
    return max(sizes, default=0)


def from_memory(
    tensor: torch.Tensor, empty: Callable[[tuple], torch.Tensor] = torch.empty
) -> Callable[[], torch.Tensor]:
    """A function that returns the next of enough copies of `tensor` to fill twice the last-level cache at each call
    (copies in memory from `empty(shape)`, as the engine allocates its weights): a kernel run on them reads its
    operand from memory, not from a cache it will never fit in beside the rest of the model."""
    copies = empty((max(1, -(-2 * last_level_cache_bytes() // tensor.nbytes)), *tensor.shape))
    copies.copy_(tensor.expand_as(copies))
    return partial(next, cycle(copies))


def fastest_runs(runs: list[Callable[[], object]], budget: float = BUDGET_SECONDS, min_rounds: int = 5) -> list[float]:
    """The seconds of each function's fastest run, after one warm-up each. They run in turn, one run of each a
    round, for as many rounds as fit the budget per function (at least min_rounds), so that whatever else the
    machine does at the time slows them alike; each round starts one function later than the last, so that none
    always runs just after the same other one (whose traces in the caches and prefetchers would favour or hinder
    it). The fastest, not the mean, since what slows a run (an interrupt, another process) is not the kernel."""
    for run in runs:
        run()
    best, spent, rounds = [math.inf] * len(runs), 0.0, 0
    while rounds < min_rounds or spent < budget * len(runs):
        for j in range(len(runs)):
            i = (rounds + j) % len(runs)
            start = time.perf_counter()
            runs[i]()
            seconds = time.perf_counter() - start
            best[i], spent = min(best[i], seconds), spent + seconds
        rounds += 1
    return best


def pick(seconds: dict[str, list[float]]) -> str:
    """The candidate whose times, each over the best time at its batch size, add up least: every batch size counts
    alike, not only the largest (whose times are the longest)."""
    best = [min(times) for times in zip(*seconds.values())]
    return min(seconds, key=lambda name: sum(t / b for t, b in zip(seconds[name], best)))


class KernelChoices:
    """The decisions of this CPU, read from and written to a JSON file: "<cpu> | <version> | <op> <shape>" ->
    {"choice": name, "rows": [batch sizes], "seconds": {name: [seconds at each batch size]}}."""

    def __init__(self, version: str, path: Path | None = None):
        self.version, self.path = version, path or cache_dir() / "kernel-choices.json"
        self.table = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.made: dict[str, dict] = {}  # the decisions this engine made or reused, for its log line
        self.timed = 0  # how many of them it had to time

    def choose(
        self,
        op: str,
        shape: tuple,
        rows: list[int],
        candidates: Callable[[], dict[str, Callable[[int], object]]],
        nbytes: int = 0,
    ) -> str:
        """The name of the fastest of candidates(), each a function of the batch size, timed at each of `rows`.
        Cached: a later engine on this CPU with these kernels reuses the decision without calling candidates()
        (which may set up a kernel's inputs, copies of a weight). nbytes: what one run reads, for the GB/s the
        summary gives."""
        key = f"{cpu_model()} | {self.version} | {op} {'x'.join(map(str, shape))}"
        if key not in self.table:
            named = candidates()
            by_rows = [fastest_runs([partial(run, n) for run in named.values()]) for n in rows]
            seconds = {name: [times[i] for times in by_rows] for i, name in enumerate(named)}
            self.table[key] = {"choice": pick(seconds), "rows": rows, "seconds": seconds, "bytes": nbytes}
            self.timed += 1
            self.save()
        self.made[f"{op} {'x'.join(map(str, shape))}"] = self.table[key]
        return self.table[key]["choice"]

    def save(self) -> None:
        """Write the table whole, through a temporary file and a rename: an engine reading it (a tensor-parallel
        rank, another process) never sees half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.table, indent=1))
        tmp.replace(self.path)

    def summary(self) -> str:
        """One line per decision: the op and shape, the choice and the GB/s it read at the first batch size, and
        each other candidate's time over the choice's at each batch size (above 1: the choice was faster)."""
        lines = []
        for what, made in self.made.items():
            chosen = made["seconds"][made["choice"]]
            speed = (
                f", {made['bytes'] / chosen[0] / 1e9:.1f} GB/s at batch {made['rows'][0]}" if made.get("bytes") else ""
            )
            others = "; ".join(
                f"{name} " + " ".join(f"{t / c:.2f}x" for t, c in zip(times, chosen))
                for name, times in made["seconds"].items()
                if name != made["choice"]
            )
            lines.append(f"{what}: {made['choice']}{speed} (at batch {','.join(map(str, made['rows']))}: {others})")
        return "\n".join(lines)
