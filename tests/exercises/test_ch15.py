"""Chapter 15 exercises: splitting the layers into pipeline stages (15.1), the least-loaded engine core of a
data-parallel server (15.2) and the bubble of a pipeline's timeline (15.3).

Each is checked on hand-made inputs, then in the engine: the default model is built stage by stage with your split
and the stages, run one after the other, must give the whole model's logits (15.1); a data-parallel front end with
two engine-core processes sends every request where your pick says, and its answers are one engine's (15.2); your
bubble share is measured on the stage timeline of a real two-stage pipeline (15.3).

    python -m minillm.course grade 15
"""

import asyncio
import random
import re
from types import SimpleNamespace

import pytest
import torch
from pytest import approx

from minillm import LLM, SamplingParams, default_model_path
from minillm.course import use_impl
from minillm.engine.async_llm import AsyncLLM
from minillm.engine.exceptions import EngineDeadError
from minillm.models import build_model
from minillm.utils.pipeline import IntermediateTensors, PPMissingLayer, StageRecord, pipeline_parallel

PROMPTS = ["Once upon a time", "The little dog", "Tom had a red ball", "One day, Lily went to the park"]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


# --- 15.1: splitting the layers into stages -------------------------------------------------------------------------


@pytest.mark.exercise("15.1")
def test_stages_of_the_docstring(impl):
    assert [impl.get_pp_indices(4, r, 2) for r in range(2)] == [(0, 2), (2, 4)]
    assert [impl.get_pp_indices(5, r, 2) for r in range(2)] == [(0, 3), (3, 5)], "the extra layer: stage 0, not 1"
    assert [impl.get_pp_indices(6, r, 4) for r in range(4)] == [(0, 1), (1, 3), (3, 5), (5, 6)], (
        "6 layers on 4 stages: the two extra layers go to stages 2 and 1, counting back from the one before the last"
    )
    assert [impl.get_pp_indices(7, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert impl.get_pp_indices(30, 0, 1) == (0, 30), "one stage holds every layer"


@pytest.mark.exercise("15.1")
def test_stages_cover_every_layer_once_the_extras_just_before_the_last(impl):
    for layers in range(1, 41):
        for size in range(1, min(layers, 9) + 1):
            parts = [impl.get_pp_indices(layers, r, size) for r in range(size)]
            sizes = [end - start for start, end in parts]
            assert parts[0][0] == 0 and parts[-1][1] == layers, f"{layers} layers on {size} stages: every layer once"
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:])), f"{parts}: stages are contiguous"
            base, extra = layers // size, layers % size
            with_extra = [r for r, n in enumerate(sizes) if n == base + 1]
            assert sorted(sizes) == sorted([base] * (size - extra) + [base + 1] * extra), (
                f"{layers} layers on {size} stages: {layers // size} each, {extra} of them one more; got {sizes}"
            )
            assert with_extra == list(range(size - 1 - extra, size - 1)), (
                f"{layers} layers on {size} stages, sizes {sizes}: the extra layers go to the stages just before "
                "the last (counting back from it), never to the last"
            )


def stage_model(rank: int, size: int):
    """The default model as stage `rank` of `size` builds it: its layers only, the others PPMissingLayer."""
    with pipeline_parallel(SimpleNamespace(rank=rank, size=size)):
        return build_model(default_model_path())


@pytest.mark.exercise("15.1")
def test_the_model_built_stage_by_stage_with_your_split_gives_its_logits(impl):
    whole = build_model(default_model_path())
    ids = torch.tensor([1, 45, 300, 12, 7, 99, 250, 3])
    positions = torch.arange(len(ids))
    with torch.inference_mode():
        expected = whole.compute_logits(whole(ids, positions))
    layers = whole.config.num_hidden_layers
    for size in (2, 3):  # the default model's 4 layers: 2 + 2, then 1 + 2 + 1
        with use_impl(impl, "15.1"):
            stages = [stage_model(r, size) for r in range(size)]
        hidden = None
        for rank, stage in enumerate(stages):
            held = [i for i, layer in enumerate(stage.model.layers) if not isinstance(layer, PPMissingLayer)]
            start, end = impl.get_pp_indices(layers, rank, size)
            assert held == list(range(start, end)), f"stage {rank} of {size} built layers {held}"
            with torch.inference_mode():
                hidden = stage(ids, positions, hidden)
            if rank < size - 1:
                assert isinstance(hidden, IntermediateTensors), "every stage but the last hands on hidden states"
        with torch.inference_mode():
            logits = stages[-1].compute_logits(hidden)
        torch.testing.assert_close(
            logits, expected, msg=f"{size} stages run in turn must give the whole model's logits"
        )


# --- 15.2: the least-loaded engine core -----------------------------------------------------------------------------


@pytest.mark.exercise("15.2")
def test_the_least_loaded_engine_waiting_counting_four_times(impl):
    assert impl.choose_engine([(2, 0), (0, 5), None]) == 1, "scores 8 and 5"
    assert impl.choose_engine([(0, 3), (1, 0)]) == 0, "3 against 4: a waiting request weighs four running ones"
    assert impl.choose_engine([(0, 0), (0, 0)]) == 0, "a tie goes to the lowest index"
    assert impl.choose_engine([(1, 2), (0, 5), (0, 5)]) == 1, "6 against 5 and 5: the lowest index of the tie"
    assert impl.choose_engine([None, (9, 9)]) == 1, "an engine that is not serving (None) gets nothing"
    assert impl.choose_engine([(0, 7)]) == 0
    with pytest.raises(EngineDeadError, match=re.compile("no engine core is serving", re.I)):
        impl.choose_engine([None, None])


@pytest.mark.exercise("15.2")
def test_random_loads_go_to_the_lowest_score(impl):
    rng = random.Random(0)
    for _ in range(500):
        loads = [
            None if rng.random() < 0.2 else (rng.randrange(6), rng.randrange(20)) for _ in range(rng.randint(1, 6))
        ]
        scores = [4 * load[0] + load[1] if load else None for load in loads]
        if all(s is None for s in scores):
            with pytest.raises(EngineDeadError):
                impl.choose_engine(loads)
            continue
        best = min(s for s in scores if s is not None)
        assert impl.choose_engine(loads) == scores.index(best), f"loads {loads}: scores {scores}"


@pytest.mark.exercise("15.2")
def test_a_data_parallel_front_end_sends_each_request_where_your_pick_says(impl):
    async def serve():
        with use_impl(impl, "15.2"):
            async_llm = AsyncLLM.from_engine_args(data_parallel_size=2, enforce_eager=True)
            try:
                client, picks, streams = async_llm.client, [], []
                for prompt in PROMPTS * 2:  # added back to back: no step's report comes in between
                    before = client.loads()
                    streams.append(await async_llm.add_request(prompt, GREEDY))
                    after = client.loads()
                    picks.append(next(i for i, (a, b) in enumerate(zip(before, after)) if a != b))
                texts = []
                for stream in streams:
                    texts.append("".join([out.text async for out in stream]))
                return picks, texts
            finally:
                async_llm.close()

    picks, texts = asyncio.run(serve())
    expected = [o.text for o in LLM(enforce_eager=True).generate(PROMPTS * 2, GREEDY, use_tqdm=False)]
    assert picks == [0, 1] * 4, (
        f"eight requests added at once to two idle cores go 0, 1, 0, 1, ... (each new one waits, scoring 4): {picks}"
    )
    assert texts == expected, "the data-parallel server's answers are one engine's"


# --- 15.3: the bubble of a pipeline's timeline ----------------------------------------------------------------------


def records(spans):
    """StageRecords from (stage, start, end) triples, batch numbers in order."""
    return [StageRecord(stage, batch, start, end, 0) for batch, (stage, start, end) in enumerate(spans)]


@pytest.mark.exercise("15.3")
def test_bubble_of_the_docstring_timelines(impl):
    one_at_a_time = records([(0, 0, 1), (1, 1, 2), (0, 2, 3), (1, 3, 4)])
    overlapped = records([(0, 0, 1), (0, 1, 2), (0, 2, 3), (1, 1, 2), (1, 2, 3), (1, 3, 4)])
    assert impl.bubble_share(one_at_a_time, 2) == approx(0.5), "one batch in flight on 2 stages: half idle"
    assert impl.bubble_share(overlapped, 2) == approx(0.25), "only filling and draining is left"
    assert impl.bubble_share([], 2) == 0.0, "no records: 0"
    assert impl.bubble_share(records([(0, 5, 5), (1, 5, 5)]), 2) == 0.0, "a span of 0: 0"


@pytest.mark.exercise("15.3")
def test_bubble_takes_records_in_any_order_and_counts_the_stages_given(impl):
    spans = records([(0, 0.0, 0.4), (1, 0.5, 1.5), (2, 1.5, 1.7), (0, 1.0, 1.2), (1, 2.0, 2.1)])
    busy = sum(r.end - r.start for r in spans)
    assert impl.bubble_share(spans, 3) == approx(1 - busy / (3 * 2.1))
    shuffled = spans[::-1]
    assert impl.bubble_share(shuffled, 3) == approx(impl.bubble_share(spans, 3)), "the order does not matter"
    assert impl.bubble_share(spans, 4) == approx(1 - busy / (4 * 2.1)), "an idle stage counts as idle"
    assert impl.bubble_share(records([(0, 10.0, 12.0)]), 1) == approx(0.0), "one stage always busy: no bubble"


@pytest.mark.exercise("15.3")
def test_bubble_of_a_real_two_stage_pipeline(impl):
    with LLM(pipeline_parallel_size=2) as llm:
        llm.model_runner.timeline = []
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        timeline = llm.model_runner.timeline
    assert {r.stage for r in timeline} == {0, 1}
    span = max(r.end for r in timeline) - min(r.start for r in timeline)
    busy = sum(r.end - r.start for r in timeline)
    share = impl.bubble_share(timeline, 2)
    assert share == approx(1 - busy / (2 * span)), "1 - busy seconds / (2 stages x the span)"
    assert 0 < share < 1
