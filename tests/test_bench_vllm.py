"""vLLM as a bench peer (--peer vllm), the bench's memory field and --model by hub id.

Most tests need no vLLM: a fake runner plays the subprocess by running minillm/bench/vllm_run.py's main() in this
process against a fake `vllm` module (backed by minillm's own engine, so its greedy tokens are minillm's); the
request and result files, the environment, the per-round timings and the comparison's record are all real. One
test runs vLLM itself, only where its environment exists (`make peers-vllm`; CI does not build it)."""

import json
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from checkpoints import make_checkpoint

from minillm import LLM, SamplingParams, default_model_path
from minillm.bench import main, vllm_peer, vllm_run
from minillm.bench import models as bench_models
from minillm.bench.backends import Models
from minillm.bench.cli import parse_args
from minillm.bench.memory import describe, engine_growth, process_memory
from minillm.bench.workloads import Workload

TINY = [
    "--workload",
    "mixed",
    "--num-prompts",
    "3",
    "--input-range",
    "3:12",
    "--output-range",
    "1:5",
    "--backends",
    "minillm",
]


class FakeVLLM:
    """Stands for the vllm package inside vllm_run.main: LLM(**engine) records its arguments and generates with
    minillm's engine (greedy, the requested lengths); SamplingParams keeps its keywords."""

    instances = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **engine):
            FakeVLLM.instances.append(engine)
            self.engine = engine
            self.calls = 0
            self.llm = LLM(
                engine["model"],
                max_num_seqs=engine["max_num_seqs"],
                max_num_batched_tokens=engine["max_num_batched_tokens"],
                kvcache_memory_bytes=engine["kv_cache_memory_bytes"],
                skip_tokenizer_init=engine["skip_tokenizer_init"],
            )

        def generate(self, prompts, params, use_tqdm=True):
            assert use_tqdm is False and all(p.kwargs["temperature"] == 0 and p.kwargs["ignore_eos"] for p in params)
            outs = self.llm.generate(
                [p["prompt_token_ids"] for p in prompts],
                [SamplingParams(temperature=0, max_tokens=p.kwargs["max_tokens"], ignore_eos=True) for p in params],
                use_tqdm=False,
            )
            metrics = SimpleNamespace(first_token_latency=0.25, first_token_ts=10.0, last_token_ts=10.5)
            return [
                SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(o.token_ids))], metrics=metrics) for o in outs
            ]


@pytest.fixture
def fake_vllm(monkeypatch):
    """vllm_peer runs "the subprocess" in this process: vllm_run.main on the request, with the fake vllm module;
    returns the list of runner calls (argv, env)."""
    module = types.ModuleType("vllm")
    module.__version__, module.LLM, module.SamplingParams = "0.0-fake", FakeVLLM.LLM, FakeVLLM.SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeVLLM.instances = []
    calls = []

    def runner(argv, env, log, timeout):
        calls.append((argv, env))
        log.write_text("fake vLLM log\n")
        vllm_run.main(argv[-2], argv[-1])
        return 0

    monkeypatch.setattr(vllm_peer, "run_subprocess", runner)
    monkeypatch.setattr(vllm_peer, "unavailable", lambda venv: None)
    return calls


def test_the_subprocess_gets_minillms_settings_and_its_result_becomes_one_run_per_round(fake_vllm, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # whole GiB: it would override the exact bytes
    models = Models(default_model_path(), {"kvcache_memory_bytes": 64 * 2**20, "max_num_seqs": 8})
    rounds = [Workload([[5, 6, 7], [9, 8, 7, 6]], [4, 2]), Workload([[10, 11], [12, 13, 14]], [1, 3])]
    runs = vllm_peer.run(models, rounds, Workload([[3, 4]], [2]), threads=1, venv=Path("/venv"))
    ((argv, env),) = fake_vllm  # one subprocess for every round
    assert argv[:3] == ["/venv/bin/python", "-I", str(vllm_peer.RUNNER)] and argv[3].endswith("request.json")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == vllm_peer.cpu_bind(1) and "," not in env["VLLM_CPU_OMP_THREADS_BIND"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["HF_HUB_OFFLINE"] == "1"
    (engine,) = FakeVLLM.instances
    assert engine == dict(
        model=str(default_model_path()),
        dtype="float32",
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        kv_cache_memory_bytes=64 * 2**20,
        enable_prefix_caching=True,
        skip_tokenizer_init=False,
        seed=0,
        disable_log_stats=False,
    )
    ours = [
        [
            o.token_ids
            for o in models.engine.generate(
                w.prompts,
                [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in w.output_lens],
                use_tqdm=False,
            )
        ]
        for w in rounds
    ]
    assert [run.token_ids for run in runs] == ours
    assert [list(map(len, run.token_ids)) for run in runs] == [[4, 2], [1, 3]]
    assert all(run.elapsed > 0 and run.times == [(0.0, 0.25, 0.75)] * 2 for run in runs)
    assert runs[0].info["vllm_version"] == "0.0-fake" and runs[0].info["threads"] == 1
    assert runs[0].info["startup_seconds"] > 0 and runs[0].info["dropped_quantization_config"] is None
    assert not Path(argv[3]).parent.exists()  # the request's files are gone once read


def test_a_failed_subprocess_says_so_with_its_log_and_keeps_the_files(tmp_path):
    def runner(argv, env, log, timeout):
        log.write_text("loading...\nValueError: Unknown quantization method\n")
        return 1

    models = Models(default_model_path(), {})
    with pytest.raises(vllm_peer.PeerFailed, match=r"(?s)status 1 .*kept in .*Unknown quantization method") as e:
        vllm_peer.run(models, [Workload([[5, 6]], [2])], Workload([[5]], [1]), 1, tmp_path, runner=runner)
    kept = Path(str(e.value).split("kept in ")[1].split(")")[0])
    assert (kept / "request.json").is_file() and (kept / "vllm.log").is_file()
    shutil.rmtree(kept)


def test_a_quantization_config_is_dropped_for_vllm_only(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "gguf"}})
    )
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    with vllm_peer.vllm_checkpoint(tmp_path) as (path, dropped):
        assert dropped == "gguf" and path != tmp_path
        assert json.loads((path / "config.json").read_text()) == {"model_type": "llama"}
        assert (path / "model.safetensors").read_bytes() == b"weights"
    assert "quantization_config" in json.loads((tmp_path / "config.json").read_text())  # the original untouched
    with vllm_peer.vllm_checkpoint(default_model_path()) as (path, dropped):
        assert path == default_model_path() and dropped is None


def test_an_absent_environment_is_reported_with_the_command_that_makes_it(tmp_path):
    assert vllm_peer.unavailable(tmp_path / "none") == (
        f"no vLLM environment at {tmp_path / 'none'}: {vllm_peer.INSTALL}"
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    assert vllm_peer.unavailable(tmp_path).startswith(f"vllm is not installed in {tmp_path}: make peers-vllm")


def test_the_environment_is_found_by_argument_variable_or_in_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("MINILLM_VLLM_VENV", raising=False)
    assert vllm_peer.venv_dir() == vllm_peer.REPO / ".venv-vllm"
    monkeypatch.setenv("MINILLM_VLLM_VENV", str(tmp_path))
    assert vllm_peer.venv_dir() == tmp_path and vllm_peer.venv_dir("elsewhere") == Path("elsewhere")


def test_the_bench_skips_an_absent_vllm_and_records_the_engines_memory(tmp_path, capsys):
    """The default model, a tiny workload: the comparison runs, vLLM is skipped with the reason, and the record
    has the memory building the engine took."""
    out = tmp_path / "r.json"
    record = main([*TINY, "--peer", "vllm", "--vllm-venv", str(tmp_path / "none"), "--output-json", str(out)])
    printed = capsys.readouterr().out
    assert "vLLM peer skipped: no vLLM environment" in printed and "make peers-vllm" in printed
    assert record["vllm"] == {"unavailable": vllm_peer.unavailable(tmp_path / "none")}
    assert list(record["results"]) == ["minillm"] and json.loads(out.read_text())["vllm"] == record["vllm"]
    memory = record["memory"]
    assert memory["weight_bytes"] == record["model"]["num_parameters"] * 4
    assert memory["kv_cache_budget_bytes"] == record["config"]["engine_options"]["kvcache_memory_bytes"]
    assert memory["kv_cache_allocated_bytes"] == pytest.approx(memory["kv_cache_budget_bytes"], rel=0.01)
    if memory["source"] is not None:  # Linux: /proc/self/status
        assert memory["rss_after_bytes"] - memory["rss_before_bytes"] == memory["rss_growth_bytes"] > 0
        assert memory["growth_over_weights_and_kv"] == pytest.approx(
            memory["rss_growth_bytes"] / (memory["weight_bytes"] + memory["kv_cache_budget_bytes"])
        )
        assert "minillm engine memory: resident +" in printed


def test_the_comparison_reports_vllm_beside_minillm_with_tokens_compared(fake_vllm, tmp_path, capsys):
    record = main([*TINY, "--repeats", "2", "--peer", "vllm", "--output-json", str(tmp_path / "r.json")])
    assert len(fake_vllm) == 1 and len(FakeVLLM.instances) == 1  # both rounds in one start-up
    assert list(record["results"]) == ["minillm", "vllm"]
    vllm = record["results"]["vllm"]
    assert vllm["same_tokens_as_minillm"] == 1 and len(vllm["rounds_output_tokens_per_second"]) == 2
    assert vllm["num_output_tokens"] == record["workload"]["num_output_tokens"] and vllm["mean_ttft_ms"] == 250
    assert record["minillm_speedup"]["vllm"] == pytest.approx(
        record["results"]["minillm"]["output_tokens_per_second"] / vllm["output_tokens_per_second"]
    )
    assert "vllm" not in record  # neither skipped nor failed
    printed = capsys.readouterr().out
    assert "same greedy tokens as minillm on 100% of the requests; minillm / vLLM" in printed


def test_a_vllm_failure_leaves_the_other_results(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(vllm_peer, "unavailable", lambda venv: None)
    monkeypatch.setattr(vllm_peer, "run_subprocess", lambda argv, env, log, timeout: 3)
    record = main([*TINY, "--peer", "vllm", "--output-json", str(tmp_path / "r.json")])
    assert list(record["results"]) == ["minillm"] and "status 3" in record["vllm"]["failed"]
    shutil.rmtree(record["vllm"]["failed"].split("kept in ")[1].split(")")[0])
    assert "vLLM peer failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peer", "vllm", "--roofline"], "--peer vllm runs with the throughput comparison"),
        (["--peer", "vllm", "--serve-rates", "2"], "--peer vllm runs with the throughput comparison"),
        (["--peer", "vllm", "--device", "cuda"], "vLLM's CPU build runs on --device cpu only"),
        (["--peer", "llama-cpp"], "--peer llama-cpp runs with --roofline only"),
        (["--vllm-venv", "x"], "--vllm-venv goes with --peer vllm"),
        (["--peer", "sglang"], "invalid choice: 'sglang'"),
    ],
)
def test_peer_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_peer_arguments_accepted():
    assert parse_args(["--peer", "vllm", "--workload", "mixed"]).peer == "vllm"
    assert parse_args(["--peer", "vllm", "--sizes", "tiny"]).peer == "vllm"
    assert parse_args(["--peer", "llama-cpp", "--roofline"]).peer == "llama-cpp"


def test_memory_arithmetic_and_line():
    mb = 10**6
    m = engine_growth(dict(rss=100 * mb, peak_rss=150 * mb), dict(rss=700 * mb, peak_rss=900 * mb), 200 * mb, 300 * mb)
    assert m["rss_growth_bytes"] == 600 * mb and m["peak_rss_growth_bytes"] == 800 * mb  # 900 - 100
    assert m["growth_over_weights_and_kv"] == pytest.approx(1.2)
    assert describe(m) == (
        "minillm engine memory: resident +600 MB building LLM(...) = 1.20 x (weights 200 MB + "
        "KV cache budget 300 MB); its peak +800 MB"
    )
    earlier_peak = engine_growth(dict(rss=100 * mb, peak_rss=950 * mb), dict(rss=700 * mb, peak_rss=950 * mb), 1, 1)
    assert earlier_peak["peak_rss_growth_bytes"] is None  # the build's own peak is hidden under an earlier one
    assert describe(earlier_peak).endswith("MB)")
    unknown = engine_growth(None, None, 200 * mb, 300 * mb)
    assert unknown["rss_growth_bytes"] is None and "not measurable" in describe(unknown)
    now = process_memory()
    if sys.platform.startswith("linux"):
        assert now["rss"] > 10 * mb and now["peak_rss"] >= now["rss"]


def test_model_by_hub_id_resolves_to_its_directory_and_is_named_by_the_id(monkeypatch, tmp_path):
    cache = tmp_path / "HuggingFaceTB--SmolLM2-135M-Instruct"
    make_checkpoint("qwen3-gqa-tied", cache)
    asked = []
    monkeypatch.setattr(bench_models, "resolve_model_path", lambda model: asked.append(model) or cache)
    with bench_models.checkpoint("HuggingFaceTB/SmolLM2-135M-Instruct", None) as (path, name):
        assert path == cache and name == "SmolLM2-135M-Instruct"
    assert asked == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    monkeypatch.undo()
    with bench_models.checkpoint(str(cache), None) as (path, name):
        assert path == cache and name == cache.name


VENV = vllm_peer.venv_dir()


@pytest.mark.slow
@pytest.mark.skipif(vllm_peer.unavailable(VENV) is not None, reason=f"vLLM peer: {vllm_peer.unavailable(VENV)}")
def test_vllm_generates_minillms_greedy_tokens_on_the_default_model():
    """vLLM itself (about a minute: its start-up), on the default model: the same greedy tokens as minillm."""
    models = Models(default_model_path(), {"kvcache_memory_bytes": 64 * 2**20})
    workload = Workload([[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], [30] * 20], [12, 1, 20])
    (run,) = vllm_peer.run(models, [workload], Workload([[3, 4, 5]], [4]), threads=2, venv=VENV)
    ours = models.engine.generate(
        workload.prompts,
        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens],
        use_tqdm=False,
    )
    assert run.token_ids == [o.token_ids for o in ours]
    assert run.info["vllm_version"].startswith("0.") and run.info["startup_seconds"] > 0 and run.elapsed > 0


def test_a_peer_out_of_memory_is_left_out_with_the_reason(monkeypatch, tmp_path, capsys):
    from minillm.bench import cli

    def out_of_memory(models, workload, warmup, args):
        raise MemoryError("Memory footprint 8507072512 is more than available memory 6623603097")

    monkeypatch.setitem(cli.BACKENDS, "hf-generate-batch", out_of_memory)
    record = main(
        [*TINY[:-1], "minillm,hf-generate-batch", "--repeats", "2", "--output-json", str(tmp_path / "r.json")]
    )
    assert list(record["results"]) == ["minillm"] and list(record["minillm_speedup"]) == []
    assert record["failed_backends"] == {
        "hf-generate-batch": "MemoryError: Memory footprint 8507072512 is more than available memory 6623603097"
    }
    assert "hf-generate-batch failed, left out of the comparison: MemoryError" in capsys.readouterr().out
