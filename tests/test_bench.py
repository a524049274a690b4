"""minillm.bench: its workloads, metrics, step breakdown, peers' token counts, CLI and JSON record; the ladder,
online serving, the roofline and cost against size (that each runs and records its fields, never speed)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from checkpoints import make_checkpoint

from minillm import default_model_path
from minillm.bench import ladder, main, workloads
from minillm.bench.backends import Models, greedy, run_compiled, run_compiled_layers, run_eager, run_minillm, run_static
from minillm.bench.breakdown import PARTS, StepBreakdown
from minillm.bench.cli import DEFAULT_BACKENDS, check_token_counts, make_workload, parse_args
from minillm.bench.hf import batch_sizes, generate_padded, run_hf_generate_batch
from minillm.bench.metrics import latency
from minillm.bench.models import RANDOM_SIZES, num_parameters, save_random_qwen3, special_token_ids
from minillm.bench.serving import poisson_arrivals, serve_minillm, serve_static
from minillm.bench.workloads import Workload

POOL = workloads.token_pool(1000, {0, 1, 2})


def test_token_pool_leaves_out_special_ids():
    assert special_token_ids(default_model_path()) == {0, 1, 2}
    assert POOL == list(range(3, 1000))


def test_fixed_workload():
    w = workloads.fixed(5, 7, 3, POOL, seed=0)
    assert [len(p) for p in w.prompts] == [7] * 5 and w.output_lens == [3] * 5
    assert (w.num_input_tokens, w.num_output_tokens, w.max_len) == (35, 15, 10)


def test_mixed_workload_lengths_in_range_ids_in_pool_and_seeded():
    w = workloads.mixed(200, (16, 40), (1, 9), POOL, seed=3)
    assert {len(p) for p in w.prompts} == set(range(16, 41))  # both ends reached, nothing outside
    assert set(w.output_lens) == set(range(1, 10))
    assert {t for p in w.prompts for t in p} <= set(POOL)
    assert w == workloads.mixed(200, (16, 40), (1, 9), POOL, seed=3)
    assert w != workloads.mixed(200, (16, 40), (1, 9), POOL, seed=4)
    other = workloads.mixed(200, (16, 40), (1, 9), POOL, seed=3, token_seed=5)  # a repeat: same lengths, other ids
    assert [len(p) for p in other.prompts] == [len(p) for p in w.prompts] and other.output_lens == w.output_lens
    assert all(a != b for a, b in zip(other.prompts, w.prompts))


def test_shared_prefix_workload_shares_its_preamble_only():
    w = workloads.shared_prefix(6, 32, 5, 4, POOL, seed=0)
    assert all(len(p) == 37 for p in w.prompts) and w.output_lens == [4] * 6
    assert len({tuple(p[:32]) for p in w.prompts}) == 1
    assert len({tuple(p[32:]) for p in w.prompts}) == 6
    assert w.prompts[0][:32] != workloads.shared_prefix(6, 32, 5, 4, POOL, seed=1).prompts[0][:32]


def test_latency_from_timestamps():
    # request 0: arrives at 0, first token at 0.1 s, 5 tokens by 0.5 s; request 1: a single token
    stats = latency([(0.0, 0.1, 0.5), (0.0, 0.3, 0.3)], [5, 1])
    assert stats["mean_ttft_ms"] == pytest.approx(200) and stats["median_ttft_ms"] == pytest.approx(200)
    assert stats["mean_tpot_ms"] == pytest.approx(100) and stats["p99_tpot_ms"] == pytest.approx(100)
    assert stats["mean_e2el_ms"] == pytest.approx(400) and stats["p99_e2el_ms"] == pytest.approx(500, rel=0.01)
    assert latency([(0.0, 0.1, 0.1)], [1])["mean_tpot_ms"] is None


class FakeSampler(torch.nn.Module):
    def forward(self, logits):
        return logits


class FakeRunner:
    def __init__(self):
        self.sampler = FakeSampler()

    def prepare_prefill(self, seqs):
        return seqs

    def prepare_decode(self, seqs):
        return seqs

    def load(self, inputs):
        return None

    def run_model(self, ctx, replay=False):
        return sum(range(10_000))

    def prepare_sample(self, seqs):
        return seqs


class FakeScheduler:
    def __init__(self):
        self.num_steps = 0

    def schedule(self):
        self.num_steps += 1
        return SimpleNamespace(scheduled=["a", "b", "c"][: self.num_steps], is_prefill=self.num_steps == 1)

    def update_from_output(self, output, sampled):
        return output.scheduled


class FakeEngine:
    """An engine's step, made of the methods the breakdown times."""

    def __init__(self):
        self.scheduler, self.model_runner = FakeScheduler(), FakeRunner()

    def step(self):
        output = self.scheduler.schedule()
        runner = self.model_runner
        inputs = (runner.prepare_prefill if output.is_prefill else runner.prepare_decode)(output.scheduled)
        logits = runner.run_model(runner.load(inputs))
        runner.sampler(runner.prepare_sample(logits))
        return self.scheduler.update_from_output(output, [])


def test_step_breakdown_times_parts_apart_for_prefill_and_decode_and_restores_the_engine():
    engine, seen = FakeEngine(), []
    with StepBreakdown(engine, on_step=seen.append) as breakdown:
        for _ in range(4):
            engine.step()
    summary = breakdown.summary()
    assert [summary["prefill"]["num_steps"], summary["decode"]["num_steps"]] == [1, 3]
    assert summary["decode"]["mean_batch_size"] == pytest.approx((2 + 3 + 3) / 3)
    for kind in summary.values():
        assert list(kind["share"]) == [*PARTS, "other"]
        assert sum(kind["share"].values()) == pytest.approx(1)
        assert kind["share"]["forward"] > 0 and all(0 <= s <= 1 for s in kind["share"].values())
    assert seen == [["a"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c"]]
    # the wrappers were instance attributes, gone again: the classes' methods show through
    assert "schedule" not in vars(engine.scheduler) and "run_model" not in vars(engine.model_runner)
    assert "forward" not in vars(engine.model_runner.sampler) and "step" not in vars(engine)


def test_step_breakdown_names_a_missing_engine_method():
    engine = FakeEngine()
    engine.model_runner.run_model = None
    with pytest.raises(RuntimeError, match=r"engine\.model_runner\.run_model\(\)"):
        StepBreakdown(engine)


@pytest.fixture(scope="module")
def eos_checkpoint(tmp_path_factory):
    """A random checkpoint whose EOS is the first token it generates greedily: a peer that stops at EOS would
    produce one token."""
    path = tmp_path_factory.mktemp("eos")
    model = make_checkpoint("qwen3-gqa-tied", path)
    first = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=1, do_sample=False)[0, -1].item()
    for name in ("config.json", "generation_config.json"):
        if not (path / name).is_file():
            continue
        cfg = json.loads((path / name).read_text())
        (path / name).write_text(json.dumps(cfg | {"eos_token_id": first}))
    return path


def test_every_backend_generates_the_same_greedy_tokens_past_eos(eos_checkpoint):
    workload, warmup = Workload([[5, 6, 7], [9, 8, 7, 6, 5, 4], [3] * 10], [6, 1, 11]), Workload([[1, 2]], [2])
    models = Models(eos_checkpoint, {})
    padded = generate_padded(models.hf_model, workload, batch_size=2)
    assert [len(t) for t in padded] == workload.output_lens
    assert padded[0][0] == json.loads((eos_checkpoint / "config.json").read_text())["eos_token_id"]
    alone = [
        generate_padded(models.hf_model, Workload([p], [n]), 1)[0]
        for p, n in zip(workload.prompts, workload.output_lens)
    ]
    assert padded == alone  # padding changes nothing: greedy, masked
    runs = [
        run_hf_generate_batch(models, workload, warmup, args=None),
        run_minillm(models, workload, warmup, None),
        run_static(models, workload, warmup, SimpleNamespace(static_batch_size=2)),
        run_compiled(models, workload, warmup, None),
        run_compiled_layers(models, workload, warmup, None),
        run_eager(models, workload, warmup, None),
    ]
    for run in runs:
        assert run.token_ids == alone
        assert all(arrival <= first <= finish for arrival, first, finish in run.times)
    assert runs[1].info["breakdown"]["decode"]["num_steps"] == 10  # the longest request's 11 tokens - 1
    assert sorted(models.compiled_engine.model_runner.graphs.build_seconds) == [1, 2]  # built before the clock
    assert runs[3].info["capture_seconds"] > 0 and runs[1].info["graph_mode"].startswith("eager")
    assert runs[4].info["graph_mode"].endswith("layers compiled") and runs[5].info["graph_mode"] == (
        "eager (enforce_eager=True); layers eager"
    )
    engine = models.engine  # the breakdown's and the static run's wrappers are gone
    assert "step" not in vars(engine) and "schedule" not in vars(engine.scheduler)
    assert "run_model" not in vars(engine.model_runner) and "forward" not in vars(engine.model_runner.sampler)


def test_token_count_check_names_the_backend_and_request():
    check_token_counts("x", [[1, 2], [3]], [2, 1])
    with pytest.raises(RuntimeError, match="hf-generate generated 1 tokens for request 1, which asked for 2"):
        check_token_counts("hf-generate", [[1, 2], [3]], [2, 2])


def test_auto_batch_sizes_are_capped_at_the_number_of_prompts():
    assert batch_sizes("auto", 20) == [8, 16, 20]
    assert batch_sizes("auto", 500) == [8, 16, 32, 64, 128]
    assert batch_sizes(5, 20) == [5]


def test_random_model_sizes(tmp_path):
    save_random_qwen3("tiny", tmp_path)
    assert 0.8e6 < num_parameters(tmp_path) < 1.2e6
    assert set(RANDOM_SIZES) == {"tiny", "25m", "100m"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--backends", "minillm,vllm"],
            "unknown backend(s) vllm; choose from minillm, minillm-compiled, "
            "minillm-compiled-layers, minillm-eager, minillm-static, hf-generate, "
            "hf-generate-batch",
        ),
        (["--input-range", "256:16"], "expected MIN:MAX with 1 <= MIN <= MAX, got '256:16'"),
        (["--num-prompts", "0"], "expected a positive integer, got '0'"),
        (["--hf-batch-size", "big"], "expected a positive integer, got 'big'"),
        (["--model", "x", "--random-size", "tiny"], "not allowed with argument --model"),
        (["--random-size", "1b"], "invalid choice: '1b'"),
        (["--serve-rates", "2,0"], "expected comma-separated request rates > 0 (or inf), got '2,0'"),
        (
            ["--rungs", "naive,turbo"],
            "unknown name(s) turbo; choose from naive, kv-cache, static, continuous, "
            "prefix-caching, cpu-kernels, compiled, triton",
        ),
        (["--sizes", "tiny,1b"], "unknown name(s) 1b"),
        (["--ladder", "--rungs", "static,triton"], "--rungs: triton runs on --device cuda only"),
        (["--ladder", "--roofline"], "not allowed with argument --ladder"),
    ],
)
def test_cli_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_cli_rejects_a_workload_longer_than_the_model(tmp_path):
    with pytest.raises(SystemExit, match="1000 tokens .* does not fit the model's 512 positions"):
        main(["--input-len", "900", "--output-len", "100", "--output-json", str(tmp_path / "r.json")])
    with pytest.raises(FileNotFoundError, match="no config.json"):
        main(["--model", str(tmp_path), "--output-json", str(tmp_path / "r.json")])


def test_end_to_end_record(tmp_path):
    """All four backends on a random tiny model, mixed lengths (some of one token): the JSON record."""
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    returned = main(
        [
            "--random-size",
            "tiny",
            "--num-prompts",
            "4",
            "--workload",
            "mixed",
            "--input-range",
            "3:20",
            "--output-range",
            "1:9",
            "--hf-batch-size",
            "auto",
            "--output-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    record = json.loads(out.read_text())
    assert record == json.loads(json.dumps(returned, default=str))
    assert set(record) >= {
        "machine",
        "versions",
        "git_commit",
        "config",
        "model",
        "workload",
        "results",
        "minillm_speedup",
        "breakdown",
    }
    assert set(record["machine"]) == {"cpu", "num_cores", "torch_threads", "device", "gpu"}
    assert set(record["versions"]) == {"python", "torch", "transformers", "minillm"}
    assert set(vars(parse_args([]))) <= set(record["config"])
    assert record["model"]["name"] == "random-tiny" and record["model"]["path"] is None
    assert list(record["results"]) == DEFAULT_BACKENDS  # minillm-compiled is opt-in
    expected = record["workload"]["num_output_tokens"]
    for name, result in record["results"].items():
        assert result["num_output_tokens"] == expected and result["output_tokens_per_second"] > 0
        assert (name == "minillm") != ("same_tokens_as_minillm" in result)
        assert ("mean_ttft_ms" in result) == (name != "hf-generate")
    assert record["results"]["hf-generate"]["batch_size"] == 4  # auto capped at 4 prompts
    assert set(record["minillm_speedup"]) == set(DEFAULT_BACKENDS) - {"minillm"}
    assert set(record["breakdown"]) == {"prefill", "decode"}
    assert sum(record["breakdown"]["decode"]["share"].values()) == pytest.approx(1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeats_run_every_backend_each_round_on_fresh_prompts_and_count_the_fastest(tmp_path):
    out = tmp_path / "r.json"
    record = main(
        [
            "--random-size",
            "tiny",
            "--num-prompts",
            "10",
            "--workload",
            "mixed",
            "--input-range",
            "3:12",
            "--output-range",
            "1:6",
            "--backends",
            "minillm,hf-generate",
            "--hf-batch-size",
            "auto",
            "--repeats",
            "3",
            "--output-json",
            str(out),
        ]
    )
    for name, result in record["results"].items():
        rounds = result["rounds_output_tokens_per_second"]
        assert len(rounds) == 3 and result["output_tokens_per_second"] == max(rounds)
    hf = record["results"]["hf-generate"]
    assert [t["batch_size"] for t in hf["tried"]] == [8, 10]  # the sweep (capped at 10 prompts): first round only
    assert hf["same_tokens_as_minillm"] == 1  # compared round by round, on each round's prompts
    first = make_workload(parse_args(["--workload", "mixed"]), POOL, 0, 8)
    again = make_workload(parse_args(["--workload", "mixed"]), POOL, 0, 8, repeat=1)
    assert again.output_lens == first.output_lens and again.prompts != first.prompts
    assert list(map(len, again.prompts)) == list(map(len, first.prompts))


def test_poisson_arrivals_are_seeded_increasing_and_have_the_rate_on_average():
    arrivals = poisson_arrivals(4000, 8.0, seed=1)
    assert arrivals == poisson_arrivals(4000, 8.0, seed=1) and arrivals != poisson_arrivals(4000, 8.0, seed=2)
    assert all(a < b for a, b in zip(arrivals, arrivals[1:])) and arrivals[0] > 0
    assert len(arrivals) / arrivals[-1] == pytest.approx(8.0, rel=0.05)
    assert poisson_arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_serving_counts_latency_from_each_arrival_and_generates_the_offline_tokens(eos_checkpoint):
    workload = Workload([[5, 6, 7], [9, 8, 7, 6, 5, 4], [3] * 10, [4, 4]], [6, 1, 11, 3])
    engine = Models(eos_checkpoint, {"enable_prefix_caching": False}).engine
    offline = [out.token_ids for out in engine.generate(workload.prompts, greedy(workload.output_lens), use_tqdm=False)]
    arrivals = [0.0, 0.05, 0.05, 0.2]
    for run in (serve_minillm(engine, workload, arrivals), serve_static(engine, workload, arrivals, batch_size=2)):
        assert run.token_ids == offline
        start = run.times[0][0]
        assert [arrival - start for arrival, _, _ in run.times] == pytest.approx(arrivals)
        assert all(arrival <= first <= finish for arrival, first, finish in run.times)
        assert run.times[3][1] - start >= 0.2  # the last request was not served before it arrived
        assert run.elapsed == pytest.approx(max(finish for _, _, finish in run.times) - start)
    assert engine.is_finished() and engine.block_manager.num_free_blocks == len(engine.block_manager.blocks)


def test_every_ladder_rung_generates_the_naive_loops_greedy_tokens(eos_checkpoint):
    workload, warmup = Workload([[5, 6, 7], [9, 8, 7, 6, 5, 4], [3] * 10], [6, 1, 11]), Workload([[1, 2]], [2])
    args = SimpleNamespace(rungs=ladder.rungs_for("cpu"), ladder_slow_prompts=3, static_batch_size=None)
    rungs = ladder.run(eos_checkpoint, {}, workload, warmup, args)["ladder"]["rungs"]
    assert list(rungs) == ["naive", "kv-cache", "static", "continuous", "prefix-caching", "cpu-kernels", "compiled"]
    assert [r.get("attention_backend") for r in rungs.values()][3:] == ["torch", "torch", "cpu", "cpu"]
    for name, r in rungs.items():
        assert r["same_tokens_as_first"] == 1.0, name  # the first rung is the naive loop, on every request
        assert r["num_requests"] == 3 and r["num_output_tokens"] == 18
    assert rungs["naive"]["speedup_over_first"] == rungs["naive"]["speedup_over_previous"] == 1.0
    assert rungs["continuous"]["graph_mode"].startswith("eager") and not rungs["compiled"]["graph_mode"].startswith(
        "eager"
    )
    assert rungs["compiled"]["graph_mode"].endswith("layers compiled")


def test_each_ladder_rung_turns_on_one_more_technique():
    assert ladder.rung_options("continuous", "cpu") == ladder.NOTHING
    assert ladder.rung_options("prefix-caching", "cpu") == ladder.NOTHING | dict(enable_prefix_caching=True)
    cpu, cuda = ladder.rung_options("compiled", "cpu"), ladder.rung_options("compiled", "cuda")
    assert (
        cpu == cuda | dict(attention_backend="cpu", native_kernels=True) and cuda["attention_backend"] == "torch"
    )  # kernels: CPU only
    assert cpu["compile_layers"] and cpu["enforce_eager"] is False  # compiled steps and layers, as run_compiled runs
    assert ladder.rung_options("triton", "cuda")["attention_backend"] == "triton"
    with pytest.raises(ValueError, match="does not run on cpu"):
        ladder.rung_options("triton", "cpu")


def test_ladder_record_runs_the_slow_rungs_on_the_first_requests(tmp_path):
    out, png = tmp_path / "l.json", tmp_path / "l.png"
    main(
        [
            "--ladder",
            "--random-size",
            "tiny",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--rungs",
            "naive,kv-cache,static,continuous",
            "--ladder-slow-prompts",
            "2",
            "--output-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    record = json.loads(out.read_text())
    assert record["ladder"]["slow_prompts"] == 2 and record["workload"]["num_requests"] == 4
    rungs = record["ladder"]["rungs"]
    assert list(rungs) == ["naive", "kv-cache", "static", "continuous"]
    assert [r["num_requests"] for r in rungs.values()] == [2, 2, 4, 4]
    assert [r["first_requests_only"] for r in rungs.values()] == [True, True, False, False]
    for r in rungs.values():
        assert (
            set(r)
            >= {
                "label",
                "output_tokens_per_second",
                "speedup_over_previous",
                "speedup_over_first",
                "same_tokens_as_first",
                "elapsed_time",
            }
            and r["same_tokens_as_first"] == 1.0
        )
    first, second = rungs["naive"]["output_tokens_per_second"], rungs["kv-cache"]["output_tokens_per_second"]
    assert rungs["kv-cache"]["speedup_over_previous"] == pytest.approx(second / first)
    assert "mean_ttft_ms" in rungs["static"] and "mean_ttft_ms" not in rungs["naive"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serving_record_has_latency_per_rate_for_both_backends(tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    main(
        [
            "--serve-rates",
            "40,inf",
            "--random-size",
            "tiny",
            "--num-prompts",
            "4",
            "--workload",
            "mixed",
            "--input-range",
            "3:12",
            "--output-range",
            "1:6",
            "--static-batch-size",
            "2",
            "--output-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    serving = json.loads(out.read_text())["serving"]
    assert serving["request_rates"] == [40, math.inf] and serving["static_batch_size"] == 2
    assert list(serving["results"]) == ["minillm", "minillm-static"]
    for by_rate in serving["results"].values():
        assert [r["request_rate"] for r in by_rate] == [40, math.inf]
        for r in by_rate:
            assert r["num_requests"] == 4 and r["output_tokens_per_second"] > 0
            for metric in ("ttft", "tpot", "e2el"):
                assert 0 < r[f"median_{metric}_ms"] <= r[f"p99_{metric}_ms"]
            assert r["mean_e2el_ms"] >= r["mean_ttft_ms"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_record_has_fractions_of_the_measured_ceilings(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    monkeypatch.setenv("MINILLM_LINEAR_KERNEL", "auto")  # the kernels chosen by timing, as a user's bench chooses
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    main(
        [
            "--roofline",
            "--random-size",
            "tiny",
            "--roofline-batch",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--roofline-bytes",
            str(64 * 2**20),
            "--repeats",
            "2",
            "--output-json",
            str(out),
        ]
    )
    roofline = json.loads(out.read_text())["roofline"]
    bandwidth = roofline["memory_bandwidth"]
    assert bandwidth["array_bytes"] == 64 * 2**20 and bandwidth["matvec_gb_s"] > 0  # the CPU kernels are built here
    methods = ("read_gb_s", "copy_gb_s", "torch_matvec_gb_s", "matvec_gb_s")
    assert bandwidth["gb_s"] == max(bandwidth[m] for m in methods)  # the best method, measured twice: the best run
    assert bandwidth["gb_s"] == max(bandwidth["before_gb_s"], bandwidth["after_gb_s"])
    choices = roofline["kernel_choices"]  # one per weight shape of the model, each with every candidate's times
    assert len(choices) >= 4 and all(c["choice"] in c["seconds"] and c["bytes"] > 0 for c in choices.values())
    matmul = roofline["matmul"]  # the ceiling is the faster matmul: BLAS's, or the packed kernel's where it is built
    assert matmul["flops"] == max(matmul["mm_flops"], matmul.get("packed_flops", 0)) > 0
    assert 0.8e6 < roofline["num_parameters"] < 1.2e6
    one, many = roofline["batch_1"], roofline["batched"]
    assert one["batch_size"] == 1 and many["batch_size"] == 4
    assert one["weight_bytes_per_token"] == 4 * roofline["num_parameters"] and one["kv_bytes_per_token"] > 0
    assert many["flops_per_token"] == 2 * roofline["num_parameters"]
    assert 0 < one["fraction_of_bandwidth"] < 1.5 and 0 < many["fraction_of_matmul_flops"] < 1.5
    for rate in one, many:  # --repeats 2: the faster of two runs counts
        assert len(rate["rounds_tokens_per_second"]) == 2 and rate["tokens_per_second"] == max(
            rate["rounds_tokens_per_second"]
        )


def test_cost_against_size_record(tmp_path):
    out, png = tmp_path / "z.json", tmp_path / "z.png"
    main(
        [
            "--sizes",
            "tiny",
            "--backends",
            "minillm,hf-generate",
            "--num-prompts",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--output-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    sizes = json.loads(out.read_text())["sizes"]
    assert [s["size"] for s in sizes] == ["tiny"] and 0.8e6 < sizes[0]["num_parameters"] < 1.2e6
    assert list(sizes[0]["results"]) == ["minillm", "hf-generate"] and set(sizes[0]["minillm_speedup"]) == {
        "hf-generate"
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
