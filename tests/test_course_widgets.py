"""The notebook helpers every chapter uses: interact, Hints, engine_map."""

import html

import ipywidgets as widgets
import matplotlib
import pytest

from minillm.course import CHAPTERS, Hints, engine_map, interact
from minillm.course.figures import HERE, PIECES
from minillm.course.hints import HINTS

matplotlib.use("Agg")


def test_interact_draws_the_default_then_redraws_on_every_change(capsys):
    calls = []
    slider = widgets.FloatSlider(value=1.0, min=0.1, max=3.0)
    interact(lambda temperature: calls.append(temperature) or f"T={temperature}", temperature=slider)
    assert calls == [1.0], "the default must be drawn at once, so a headless run records it"
    slider.value = 2.5
    assert calls == [1.0, 2.5]
    assert slider.description == "temperature", "a control without a description is labelled by its name"


def test_hints_fold_every_level_of_an_exercise_and_reject_unknown_ones():
    page = Hints("5.4")._repr_html_()
    assert page.count("<details>") == 3 and all(html.escape(h.split("`")[0]) in page for h in HINTS["05.4"])
    assert "`" not in page and "<code>self.num_blocks(len(seq))</code>" in page, "code in backticks is set as code"
    with pytest.raises(ValueError, match="no exercise 09.9"):
        Hints("09.9")


@pytest.mark.parametrize("chapter", ["00", "05", "11"])
def test_engine_map_highlights_exactly_the_chapters_pieces(chapter):
    fig = engine_map(chapter)
    highlighted = [p for p in fig.axes[0].patches if matplotlib.colors.to_hex(p.get_facecolor()) == HERE]
    assert len(highlighted) == sum(ch == chapter for _, _, ch in PIECES)
    assert {ch for _, _, ch in PIECES} == set(CHAPTERS) - {"00"}, "every chapter has a place on the map"
