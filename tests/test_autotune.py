"""Kernels chosen by measuring (minillm.utils.autotune): the faster of two candidates is chosen and cached per CPU,
kernel version and shape; a cached decision is reused without timing; a forced choice is obeyed; the engine packs
exactly the weight shapes where the packed kernel was chosen, and its tokens stay the naive loop's."""

import json
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.config import PACKED_PREFETCH, Config
from minillm.layers import linear_method
from minillm.layers.linear import LinearBase
from minillm.utils import autotune
from minillm.utils.autotune import KernelChoices, fastest_runs, from_memory, last_level_cache_bytes, pick


def fake(seconds: float):
    """A candidate that takes `seconds` at every batch size, counting its runs."""

    def run(n):
        run.calls += 1
        time.sleep(seconds)

    run.calls = 0
    return run


def test_the_faster_of_two_candidates_is_chosen_and_cached(tmp_path):
    slow, fast = fake(0.002), fake(0.0)
    choices = KernelChoices("v1", tmp_path / "choices.json")
    assert choices.choose("linear", (8, 4), [1, 2], lambda: {"slow": slow, "fast": fast}) == "fast"
    assert slow.calls >= 2 * 5 and fast.calls >= 2 * 5 and choices.timed == 1  # every batch size, several rounds
    (entry,) = json.loads((tmp_path / "choices.json").read_text()).values()
    assert entry["choice"] == "fast" and entry["rows"] == [1, 2] and entry["seconds"]["slow"][0] >= 0.002
    assert "linear 8x4: fast (at batch 1,2: slow " in choices.summary()

    def untimed():
        raise AssertionError("a cached decision was timed again")

    again = KernelChoices("v1", tmp_path / "choices.json")  # a later engine on this CPU
    assert again.choose("linear", (8, 4), [1, 2], untimed) == "fast" and again.timed == 0


def test_a_decision_belongs_to_its_cpu_kernel_version_and_shape(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    KernelChoices("v1", path).choose("linear", (8, 4), [1], lambda: {"a": fake(0.0), "b": fake(0.002)})
    for version, shape, cpu in (("v2", (8, 4), None), ("v1", (8, 5), None), ("v1", (8, 4), "Another CPU")):
        if cpu:
            monkeypatch.setattr(autotune, "cpu_model", lambda: cpu)
        choices = KernelChoices(version, path)
        assert choices.choose("linear", shape, [1], lambda: {"a": fake(0.002), "b": fake(0.0)}) == "b"
        assert choices.timed == 1
    assert len(json.loads(path.read_text())) == 4


def test_pick_weighs_every_batch_size_alike():
    """b is 3x slower at batch 1 and 10% faster at batch 32, whose times are 100x longer: a sum of seconds would
    pick b; relative to each batch size's best, a wins."""
    assert pick({"a": [1.0, 110.0], "b": [3.0, 100.0]}) == "a"
    assert pick({"a": [1.0, 200.0], "b": [1.1, 100.0]}) == "b"


def test_fastest_runs_interleaves_the_candidates():
    order = []
    fastest_runs([lambda: order.append("a"), lambda: order.append("b")], budget=0.0, min_rounds=3)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # a warm-up each, then rounds of one run of each,
    # each round starting one candidate later


def test_a_forced_choice_is_obeyed_and_a_bad_one_named(monkeypatch):
    monkeypatch.setenv("MINILLM_LINEAR_KERNEL", "torch")
    assert Config().linear_kernel == "torch" and Config(linear_kernel="packed").linear_kernel == "packed"
    monkeypatch.delenv("MINILLM_LINEAR_KERNEL")
    assert Config().linear_kernel == "auto"
    with pytest.raises(ValueError, match=r"linear_kernel \(or \$MINILLM_LINEAR_KERNEL\) must be one of auto, "):
        Config(linear_kernel="fast")


def linear_layers(llm: LLM) -> list:
    model = llm.model_runner.model
    return [m for m in model.modules() if isinstance(m, LinearBase)] + [model.lm_head]


@pytest.mark.parametrize("forced, packed", [("torch", False), ("packed", True)])
def test_the_engine_obeys_a_forced_linear_kernel(forced, packed, monkeypatch):
    monkeypatch.setattr(KernelChoices, "choose", lambda *a: pytest.fail("a forced choice timed the kernels"))
    layers = linear_layers(LLM(num_kvcache_blocks=8, linear_kernel=forced))
    assert all((m.weight.dim() == 3) == packed for m in layers)


def shape_of(layer) -> tuple:
    """The (out, in) of a layer's weight, plain [out, in] or packed [panels, in, P] (the default model's sizes are
    whole panels)."""
    w = layer.weight
    return (w.shape[0] * w.shape[2], w.shape[1]) if w.dim() == 3 else tuple(w.shape)


def test_auto_times_each_shape_once_says_so_and_packs_where_packed_won(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    calls = []

    def made_up(runs, *args, **kwargs):  # the candidates in turn: the packed variants, then torch
        calls.append(len(runs))
        return [1.0] + [2.0] * (len(runs) - 1)

    monkeypatch.setattr(autotune, "fastest_runs", made_up)
    layers = linear_layers(LLM(num_kvcache_blocks=8, linear_kernel="auto"))
    shapes = {shape_of(m) for m in layers}
    assert len(calls) == len(shapes) * len(linear_method.PackedLinearMethod.ROWS)
    assert set(calls) == {len(PACKED_PREFETCH) + 1}
    assert all(m.weight.dim() == 3 for m in layers)
    err = capsys.readouterr().err
    assert f"minillm: linear kernels timed on {autotune.cpu_model()}, cached in {tmp_path}" in err
    for o, i in shapes:  # the GB/s of 1 s for the weight's bytes, then every other candidate
        assert f"linear {o}x{i}: packed, {o * i * 4 / 1e9:.1f} GB/s at batch 1 (at batch 1,2,8,32: " in err
        assert "; torch 2.00x 2.00x 2.00x 2.00x)" in err


def test_auto_reuses_the_cached_choices_and_keeps_plain_weights_where_torch_won(monkeypatch, tmp_path):
    """Choices written beforehand (packed for one shape, torch for the others): the engine times nothing, packs
    the one shape only, and generates the same greedy tokens as with F.linear everywhere."""
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    reference = LLM(num_kvcache_blocks=16, linear_kernel="torch")
    shapes = sorted({shape_of(m) for m in linear_layers(reference)})
    key = f"{autotune.cpu_model()} | {linear_method.build_name()} | linear"
    table = {f"{key} {o}x{i}": {"choice": "torch", "rows": [1], "seconds": {}} for o, i in shapes}
    table[f"{key} {shapes[0][0]}x{shapes[0][1]}"]["choice"] = "packed-t0"
    (tmp_path / "kernel-choices.json").write_text(json.dumps(table))
    monkeypatch.setattr(autotune, "fastest_runs", lambda *a: pytest.fail("a cached choice was timed again"))
    llm = LLM(num_kvcache_blocks=16, linear_kernel="auto")
    for m in linear_layers(llm):
        assert (m.weight.dim() == 3) == (shape_of(m) == shapes[0]), shape_of(m)
        if m.weight.dim() == 3:  # the chosen variant's prefetch
            assert m.kernel.keywords["prefetch"] == PACKED_PREFETCH["packed-t0"]
    params = SamplingParams(temperature=0, max_tokens=24)
    prompts = ["Once upon a time", "Lily and Max went"]
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == [
        o.token_ids for o in reference.generate(prompts, params, use_tqdm=False)
    ]


def test_auto_times_the_real_kernels(monkeypatch, tmp_path, tiny_checkpoint):
    """No made-up times: each shape of a tiny model is timed both ways, and the tokens are F.linear's."""
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    llm = LLM(tiny_checkpoint, num_kvcache_blocks=16, linear_kernel="auto", skip_tokenizer_init=True)
    table = json.loads((tmp_path / "kernel-choices.json").read_text())
    assert {shape_of(m) for m in linear_layers(llm)} == {
        tuple(map(int, key.rsplit(" ", 1)[1].split("x"))) for key in table
    }
    for key, entry in table.items():
        out, inputs = map(int, key.rsplit(" ", 1)[1].split("x"))
        assert set(entry["seconds"]) == {*PACKED_PREFETCH, "torch"} and entry["choice"] in entry["seconds"]
        assert entry["bytes"] == 4 * out * inputs  # a float32 weight's bytes: the summary's GB/s
        assert all(0 < t < 1 for times in entry["seconds"].values() for t in times)
    reference = LLM(tiny_checkpoint, num_kvcache_blocks=16, linear_kernel="torch", skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == [
        o.token_ids for o in reference.generate(prompts, params, use_tqdm=False)
    ]


def test_each_prefetch_variant_of_the_packed_kernel_computes_f_linear():
    import torch
    import torch.nn.functional as F

    from minillm.kernels.cpu import cpu_kernels, linear_packed
    from minillm.kernels.packing import pack_weight

    if not cpu_kernels():
        pytest.skip("the C++ kernels do not build here")
    weight, bias = torch.randn(100, 64), torch.randn(100)
    packed = pack_weight(weight)
    for rows in (1, 2, 5):  # the matrix-vector stream (1, 2 rows) prefetches; the tile does not
        x = torch.randn(rows, 64)
        for prefetch in PACKED_PREFETCH.values():
            y = linear_packed(x, packed, bias, out_features=100, prefetch=prefetch)
            torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match=r"prefetch hint 0 \(none\), 1 \(t0\) or 2 \(nta\)"):
        linear_packed(x[:1], packed, out_features=100, prefetch=(3, 0))


def test_from_memory_cycles_through_copies_that_fill_twice_the_last_level_cache(monkeypatch):
    import torch

    monkeypatch.setattr(autotune, "last_level_cache_bytes", lambda: 1000)
    tensor = torch.arange(25, dtype=torch.float32)  # 100 bytes: 20 copies make 2000
    nxt = from_memory(tensor)
    seen = [nxt() for _ in range(21)]
    assert len({t.data_ptr() for t in seen}) == 20 and seen[20].data_ptr() == seen[0].data_ptr()
    assert all(torch.equal(t, tensor) for t in seen)
    if autotune.Path("/sys/devices/system/cpu/cpu0/cache").is_dir():
        assert last_level_cache_bytes() >= 1 << 20  # this machine's largest cache, from sysfs
