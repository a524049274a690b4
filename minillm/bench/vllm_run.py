"""The vLLM side of `python -m minillm.bench --peer vllm`: run by the python of vLLM's own virtual environment
(`make peers-vllm`), never imported by minillm.

    .venv-vllm/bin/python -I minillm/bench/vllm_run.py REQUEST.json RESULT.json

It reads the request (checkpoint directory, engine settings, a warm-up workload and the timed rounds: prompts
as token ids and each request's output length), starts vLLM's offline LLM (25-80 s on a CPU, not timed), runs
the warm-up, then times one LLM.generate call per round: greedy, ignore_eos, every request in one call, as
minillm's backend does. It writes the generated token ids, each round's seconds and, where vLLM recorded them,
each request's TTFT and decode time. Only the standard library and vLLM are imported: minillm is not installed
in that environment. The engine core runs in a spawned process, hence the `__main__` guard.
"""

import json
import os
import sys
import time


def greedy(output_lens: list[int], detokenize: bool) -> list:
    from vllm import SamplingParams

    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=detokenize) for n in output_lens]


def generate(llm, workload: dict, detokenize: bool) -> tuple[list, float]:
    """One generate call on every request of the workload: its outputs in request order and its seconds."""
    prompts = [{"prompt_token_ids": ids} for ids in workload["prompts"]]
    params = greedy(workload["output_lens"], detokenize)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def request_times(output) -> list[float] | None:
    """(arrival, first token, finish) in seconds from the request's arrival, from vLLM's per-request stats
    (recorded when stats logging is on); None where it has none."""
    m = getattr(output, "metrics", None)
    if m is None or not getattr(m, "first_token_ts", 0) or not getattr(m, "last_token_ts", 0):
        return None
    ttft = m.first_token_latency
    return [0.0, ttft, ttft + (m.last_token_ts - m.first_token_ts)]


def main(request_path: str, result_path: str) -> None:
    request = json.loads(open(request_path).read())
    started = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM

    llm = LLM(**request["engine"])
    startup = time.perf_counter() - started
    detokenize = not request["engine"].get("skip_tokenizer_init", False)
    _, warmup_seconds = generate(llm, request["warmup"], detokenize)
    rounds = []
    for workload in request["rounds"]:
        outputs, elapsed = generate(llm, workload, detokenize)
        times = [request_times(out) for out in outputs]
        rounds.append(
            dict(
                elapsed=elapsed,
                token_ids=[list(out.outputs[0].token_ids) for out in outputs],
                times=None if None in times else times,
            )
        )
    result = dict(
        rounds=rounds,
        startup_seconds=startup,
        warmup_seconds=warmup_seconds,
        vllm_version=vllm.__version__,
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        env={k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU", "OMP_"))},
    )
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)  # the parent reads a result only once it is whole


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # minillm/bench's modules (models, metrics, ...) must not shadow vLLM's imports
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
