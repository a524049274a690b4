"""No notebook's prose hard-codes a measured figure or direction (DESIGN §5): the cell that measures prints it, or
renders the verdict from its values (minillm.course.claims.verdict), so a re-run on another machine cannot
contradict the text.

`find_claims` flags, in every Markdown cell, speedups (1.6x), percentages, quantities with a unit of time,
bandwidth, rate or size, "N times faster/more", and directions stated about this machine ("slower here"). What
is flagged and is no measurement (a datasheet figure, a model's size, arithmetic on shapes, a self-check's
hypothetical) is listed in ALLOWED with its reason; anything else fails, naming the notebook, the cell and the
line. An entry that no longer matches anything fails too (the list stays honest).
"""

from dataclasses import dataclass

import nbformat
import pytest

from minillm.course.claims import Claim, find_claims, ratio_text, verdict, verdict_range
from minillm.course.notebooks import find_notebooks


@dataclass(frozen=True)
class Allowed:
    notebook: str  # its two-digit number
    text: str  # the flagged figure, exactly as find_claims reports it
    context: str  # words on the same line, to pin the entry to one sentence
    reason: str

    def covers(self, notebook: str, finding) -> bool:
        return notebook == self.notebook and finding.text == self.text and self.context in finding.line


SHAPES = "arithmetic on the model's or the tensors' shapes: the same on every machine"
ALLOWED = [
    Allowed("00", "64 MiB", "a copy costs a pass over", "the size of a [4096, 4096] float32 tensor: " + SHAPES),
    Allowed("02", "90%", "tokens are needed to cover", "a top-p threshold: a parameter, not a measurement"),
    Allowed("02", "90%", "cover 90% of the probability", "a top-p threshold: a parameter, not a measurement"),
    Allowed("03", "4×", "sharing them makes that cache", "8 query heads over 2 KV heads: the model's config"),
    Allowed("03", "4×", "which makes what chapter 04 caches", "8 query heads over 2 KV heads: the model's config"),
    Allowed("03", "4×", "key and value vectors per token and layer", "32 heads over 8 KV heads: a config"),
    Allowed("03", "70%", "The MLPs hold 70% of the weights", "shares of the parameter count: " + SHAPES),
    Allowed("03", "20%", "The MLPs hold 70% of the weights", "shares of the parameter count: " + SHAPES),
    Allowed("03", "10%", "The MLPs hold 70% of the weights", "shares of the parameter count: " + SHAPES),
    Allowed("03", "70%", "holds about 70% of the weights", "a share of the parameter count: " + SHAPES),
    Allowed("03", "13 MiB", "these weights once (13 MiB here", "the default model's size, a constant"),
    Allowed("04", "1 GB", "sequence of 8k tokens needs about", "KV-cache bytes from a model's config: " + SHAPES),
    Allowed("04", "69 GB", "four times the 16 GB of weights", "KV-cache bytes from a model's config: " + SHAPES),
    Allowed("04", "16 GB", "four times the 16 GB of weights", "a model's size, a constant"),
    Allowed("04", "4×", "needs 4× the cache of Mistral-7B", "KV heads of two configs: " + SHAPES),
    Allowed("04", "24 GB", "the memory of three GPUs", "a GPU's memory: datasheet"),
    Allowed("04", "80 GB", "80 GB H100, a 141 GB H200", "a GPU's memory: datasheet"),
    Allowed("04", "141 GB", "80 GB H100, a 141 GB H200", "a GPU's memory: datasheet"),
    Allowed("04", "128 KiB", "131,072 bytes = 128 KiB per token", "the worked KV-cache formula: " + SHAPES),
    Allowed("04", "1 GiB", "131,072 bytes = 128 KiB per token", "the worked KV-cache formula: " + SHAPES),
    Allowed("04", "1.07 GB", "131,072 bytes = 128 KiB per token", "the worked KV-cache formula: " + SHAPES),
    Allowed("05", "4 KiB", "copies each 4 KiB block", "a block's size: " + SHAPES),
    Allowed("05", "128 KiB", "Bytes are for Llama-3-8B in bf16", "KV bytes per token from a config: " + SHAPES),
    Allowed("05", "82 %", "holds 5.6 times the memory", "counted on a seeded synthetic workload: deterministic"),
    Allowed(
        "05", "5.6 times the", "holds 5.6 times the memory", "counted on a seeded synthetic workload: deterministic"
    ),
    Allowed("05", "1 %", "paging allocates within 1 %", "counted on a seeded synthetic workload: deterministic"),
    Allowed("05", "80 %", "The vLLM paper measured 60–80 %", "a published figure, cited"),
    Allowed("05", "1 %", "which is why vLLM and minillm default to 16", "counted on a seeded workload: deterministic"),
    Allowed("05", "80 %", "for this chapter's workload", "counted on a seeded synthetic workload: deterministic"),
    Allowed("05", "1 %", "around 1 % at the default 16 tokens", "counted on a seeded workload: deterministic"),
    Allowed("05", "0.9 %", "from about 0.9 % to 0.4 %", "counted on a seeded synthetic workload: deterministic"),
    Allowed("05", "0.4 %", "from about 0.9 % to 0.4 %", "counted on a seeded synthetic workload: deterministic"),
    Allowed("05", "1 %", "At 16 the waste is already around", "counted on a seeded workload: deterministic"),
    Allowed("05", "80 %", "and the 60–80 % of KV memory", "a published figure (the vLLM paper), cited"),
    Allowed("06", "512 MiB", "rather than its default 512 MiB", "a configuration default, a constant"),
    Allowed("07", "47%", "15 of 32 rows, about 47%", "a self-check's arithmetic on bucket sizes"),
    Allowed("08", "2.5 times the", "moves about 2.5 times the bytes", "bytes counted from shapes: " + SHAPES),
    Allowed("08", "16 KB", "At 16 tokens each tensor is 16 KB", "a tensor's size: " + SHAPES),
    Allowed("08", "4 MB", "At 4096 tokens each tensor is 4 MB", "a tensor's size: " + SHAPES),
    Allowed("08", "40 MB", "about 40 MB through the memory hierarchy", "bytes counted from shapes: " + SHAPES),
    Allowed("08", "16 MB", "about 40 MB through the memory hierarchy", "bytes counted from shapes: " + SHAPES),
    Allowed("08", "4 MB", "fresh 4 MB allocation", "a tensor's size: " + SHAPES),
    Allowed("08", "2.5x", "the bytes grow in proportion", "bytes counted from shapes: " + SHAPES),
    Allowed("08", "2.5 times fewer", "about 2.5 times fewer bytes than eager", "bytes counted from shapes: " + SHAPES),
    Allowed("08", "16 KB", "At 16 tokens a 16 KB tensor", "a tensor's size: " + SHAPES),
    Allowed("08", "4 MB", "at 4096 tokens each is 4 MB", "a tensor's size: " + SHAPES),
    Allowed("08", "5 s", "Suppose a compiled function took 5 s", "a self-check's hypothetical"),
    Allowed("08", "20 µs", "Suppose a compiled function took 5 s", "a self-check's hypothetical"),
    Allowed("09", "23 times more", "About 23 times more", "a self-check's arithmetic on context lengths"),
    Allowed("10", "1 MiB", "call into a 1 MiB", "nano-vllm's shared-memory segment size, a constant of its code"),
    Allowed("10", "1 KB", "1 KB per sequence in a decode", "a tensor's size: " + SHAPES),
    Allowed("10", "4 MB", "up to 4 MB for a prefill step", "a tensor's size: " + SHAPES),
    Allowed("10", "16 MB", "from 256 bytes to 16 MB", "the measured sizes' range, chosen by the cell"),
    Allowed("10", "450 GB/s", "NVLink 4 on an H100/H200 moves about", "a link's nominal bandwidth: datasheet"),
    Allowed("10", "900 GB/s", "NVLink 4 on an H100/H200 moves about", "a link's nominal bandwidth: datasheet"),
    Allowed("10", "25 GB/s", "about 25 GB/s in practice", "PCIe 4.0 x16's usual bandwidth: datasheet"),
    Allowed("10", "32 GB/s", "about 25 GB/s in practice", "PCIe 4.0 x16's nominal bandwidth: datasheet"),
    Allowed("10", "140 GB", "a 70B model in bf16 is 140 GB", "a model's size, a constant"),
    Allowed("10", "16 KB", "16 × 256 × 4 bytes = 16 KB", "a self-check's arithmetic on shapes"),
    # notebook 11: constants and parameters (its measured figures are printed by the cells that measure them)
    Allowed("11", "100%", "a share below 100% is not an error", "a bound, not a measurement"),
    Allowed("11", "256 requests/s", "at 4, 16, 64 and 256 requests/s", "the sweep's request rates: parameters"),
    Allowed("11", "1 GiB", "streaming a 1 GiB array", "the probe's array size, chosen by the cell"),
    Allowed("11", "400 MB", "random-weight Qwen3 of about 100M parameters", "a model's size, a constant"),
    Allowed("11", "64×", "64× the FLOPs for nearly the same bytes", "the batch size, a parameter"),
    Allowed("11", "70%", "The bench's acceptance targets are 70%", "a target, not a measurement"),
    Allowed("11", "40%", "40% of the matmul FLOP/s at batch 64", "a target, not a measurement"),
    Allowed("11", "2 MiB", "The packed copies live in 2 MiB pages", "the huge-page size, a constant"),
    Allowed("11", "400 MB", "a token reads 400 MB", "a model's size, a constant"),
    Allowed("11", "4 KiB", "which in 4 KiB pages", "the base page size, a constant"),
    Allowed("11", "400 MB", "everything the 100M model reads per token", "a model's size, a constant"),
    Allowed("11", "2 MiB", "The packed layout and the 2 MiB", "the huge-page size, a constant"),
    Allowed("11", "3.35 TB", "H100 SXM", "a GPU's bandwidth: datasheet"),
    Allowed("11", "4.8 TB", "H200 SXM", "a GPU's bandwidth: datasheet"),
    Allowed("11", "400 MB", "400 MB per token, so an H200's bandwidth", "a model's size, a constant"),
    Allowed("11", "12,000 tokens/s", "allows at most about 12,000 tokens/s", "datasheet bandwidth / model size"),
    Allowed("11", "20 GB/s", "a machine with 20 GB/s of memory", "a self-check's hypothetical"),
    Allowed("11", "400 MB", "Each token reads about 400 MB of weights", "a self-check's arithmetic"),
    Allowed("11", "50 tokens/s", "20e9 / 400e6 = 50 tokens/s", "a self-check's arithmetic"),
    Allowed("11", "200 MB", "weights are 200 MB, so the ceiling doubles", "a self-check's arithmetic"),
    Allowed("11", "100 tokens/s", "the ceiling doubles to about 100 tokens/s", "a self-check's arithmetic"),
    Allowed("14", "13 MB", "a step of this 13 MB model", "the default model's size, a constant"),
    Allowed("14", "40 GB/s", "on a machine with 40 GB/s of memory", "a self-check's hypothetical"),
    Allowed("14", "3.9 GB", "a step reads about 7e9", "a self-check's arithmetic"),
    Allowed("14", "14 GB", "Float16 reads 14 GB a step", "a self-check's arithmetic"),
    Allowed("14", "100%", "a relative error of 100% for them", "a self-check's arithmetic"),
]

NOTEBOOKS = find_notebooks()


def findings(nb: nbformat.NotebookNode) -> list[tuple[int, object]]:
    """(cell index, finding) for every flagged figure in the notebook's Markdown cells."""
    return [(i, f) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown" for f in find_claims(cell.source)]


def unallowed(number: str, nb: nbformat.NotebookNode) -> list[str]:
    return [
        f"notebook {number}, cell {i}: {f.kind} {f.text!r} in: {f.line}"
        for i, f in findings(nb)
        if not any(a.covers(number, f) for a in ALLOWED)
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_prose_states_no_measured_figure(path):
    problems = unallowed(path.name[:2], nbformat.read(path, as_version=4))
    assert not problems, (
        "hard-coded figures in the prose: print them from the cell that measures them, or render the sentence with "
        "minillm.course.claims.verdict; if one is a constant (a datasheet figure, a model's size), add it to ALLOWED "
        "in tests/test_notebook_claims.py with its reason:\n  " + "\n  ".join(problems)
    )


def test_every_allowance_still_matches_something():
    found = {p.name[:2]: [f for _, f in findings(nbformat.read(p, as_version=4))] for p in NOTEBOOKS}
    stale = [a for a in ALLOWED if not any(a.covers(a.notebook, f) for f in found.get(a.notebook, []))]
    assert not stale, "allow-list entries that match no text any more (remove them):\n  " + "\n  ".join(map(str, stale))


def synthetic(*markdown: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(m) for m in markdown]
    return nb


def test_a_hard_coded_speedup_is_caught_naming_notebook_cell_and_text():
    nb = synthetic("## 5. Compiled steps", "On this CPU compiled steps are 1.37x faster, and the rest is overhead.")
    (problem,) = unallowed("07", nb)
    assert "notebook 07, cell 1" in problem and "'1.37x'" in problem and "compiled steps are 1.37x faster" in problem


@pytest.mark.parametrize(
    "text, figure",
    [
        ("compiled steps are 1.37x faster", "1.37x"),
        ("MKL reads at 92% of the bandwidth", "92%"),
        ("it saves 3.76 ms of a step", "3.76 ms"),
        ("the broadcast costs 500 µs", "500 µs"),
        ("llama.cpp decodes at 22.6 GB/s", "22.6 GB/s"),
        ("a 4 MB model", "4 MB"),
        ("serving 105 req/s", "105 req/s"),
        ("about 2.5 times faster than eager", "2.5 times faster"),
        ("compiled layers are no faster here", "faster here"),
        ("two ranks are slower on this CPU", "slower on this CPU"),
    ],
)
def test_the_patterns_catch_measured_claims(text, figure):
    assert figure in [f.text for f in find_claims(text)]


@pytest.mark.parametrize(
    "text",
    [
        "speedup against length (O(n²) → O(n)) for a 4-layer model, 8 heads, 2 KV heads",
        "the buckets `[1, 2, 4, 8, 16]`, a `16x16` tile and `x.pow(2)` in backticks: `1.6x faster`",
        "```python\nprint(f'{ratio:.2f}x faster')  # 1.6x\n```",
        "the slot is 9 × 4 + 1 = 37 and position 9 % 4 = 1",
        "$2 \\cdot (N-1)/N \\cdot$ bytes, see <https://example.com/1.6x> and [the post](https://x.org/92%)",
        "measure whether two ranks are faster here, and what decides it",
        "Chapter 09 on PCIe 4.0 x16; torch 2.13; step 3 of 5; about 75 min",
    ],
)
def test_the_patterns_leave_alone_what_is_no_measurement(text):
    assert find_claims(text) == []


def test_verdict_says_the_direction_the_numbers_went():
    assert verdict(6.0, 4.0, "compiled steps") == "compiled steps are 1.50x faster here"
    assert verdict(6.72, 8.51, "compiled layers", than="eager") == "compiled layers are 0.79x: slower than eager here"
    assert (
        verdict(6.0, 6.1, "compiled layers", than="eager") == "compiled layers are 0.98x: about the same as eager here"
    )
    assert (
        verdict(502, 1419, "TP=2 runs", lower_is_better=False, where="on this CPU")
        == "TP=2 runs are 2.83x faster on this CPU"
    )  # rates: higher is better
    assert ratio_text(3.0, 2.0) == "1.50x" and isinstance(verdict(1, 2, "x"), Claim)
    assert verdict(1.0, 2.0, "x")._repr_markdown_() == "x are 0.50x: slower here"
    with pytest.raises(ValueError):
        verdict(0.0, 1.0, "x")


def test_verdict_range_says_whether_every_pair_went_the_same_way():
    assert (
        verdict_range([4.9, 8.7], [2.0, 4.5], "compiled forwards") == "compiled forwards are 1.93x to 2.45x faster here"
    )
    mixed = verdict_range([4.0, 8.0], [5.0, 4.0], "compiled forwards", than="eager")
    assert mixed == "compiled forwards are 0.80x to 2.00x against eager: faster at some, slower at others here"
    assert verdict_range([4.0, 8.0], [5.0, 10.0], "x") == "x are 0.80x: slower here"  # one ratio: no range


# --- portability: what the notebooks say where Triton or OpenMP is missing -----------------------------------------


@pytest.fixture
def on(monkeypatch):
    """on("Darwin"): play a system without Triton (the module search finds none), as macOS or Windows are."""
    from minillm.course import portability

    def play(system: str):
        real = portability.importlib.util.find_spec
        monkeypatch.setattr(portability, "system", lambda: system)
        monkeypatch.setattr(
            portability.importlib.util, "find_spec", lambda name, *args: None if name == "triton" else real(name, *args)
        )
        return portability

    return play


@pytest.mark.parametrize("system, name", [("Darwin", "macOS"), ("Windows", "Windows")])
def test_without_triton_chapter_09_says_it_needs_linux_or_wsl(on, system, name):
    reason = on(system).triton_missing()
    assert f"this is {name}" in reason and "Linux" in reason and "WSL" in reason


def test_with_triton_nothing_is_said():
    from minillm.course import portability

    if portability.importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed here")
    assert portability.triton_missing() is None


def test_without_triton_the_notebook_skips_every_later_cell_cleanly(on, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    on("Darwin").skip_without_triton("09", shell=shell)
    try:
        result = shell.run_cell("import a_module_that_does_not_exist\nran = True")
    finally:
        shell.input_transformers_post.pop()
    out = capsys.readouterr().out
    assert result.success and "ran" not in shell.user_ns
    assert "need Linux" in out and "skipped: this cell needs Triton" in out


def test_notebook_09_checks_for_triton_before_importing_it():
    nb = nbformat.read(next(p for p in NOTEBOOKS if p.name.startswith("09")), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    guard = next(i for i, s in enumerate(code) if "skip_without_triton(" in s)
    first_import = next(i for i, s in enumerate(code) if "import triton" in s or "from minillm.kernels.triton" in s)
    assert guard < first_import, "the Triton check must run in a cell before any cell that imports Triton"


def test_without_triton_grading_chapter_09_skips_with_the_reason():
    """`grade 09` in a process where Triton cannot be imported, on a system that plays macOS."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom minillm.course import portability\nfrom minillm.course.grade import grade\n"
        "sys.modules['triton'] = None\nportability.system = lambda: 'Darwin'\nsys.exit(grade('09'))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr  # nothing graded, nothing failed
    assert "SKIP  09.1" in run.stdout and "need Linux" in run.stdout and "FAIL" not in run.stdout


def test_on_linux_a_missing_triton_stays_an_error():
    from minillm.course.pytest_plugin import TRITON_IMPORT_ERROR

    assert TRITON_IMPORT_ERROR.search("E   ModuleNotFoundError: No module named 'triton'")
    assert not TRITON_IMPORT_ERROR.search("E   ModuleNotFoundError: No module named 'tritonish_pkg'")


def test_inductor_on_macos_names_openmp(on):
    portability = on("Darwin")
    assert "OpenMP" in portability.inductor_note() and "libomp" in portability.inductor_note()
    assert on("Linux").inductor_note() is None
    nb = nbformat.read(next(p for p in NOTEBOOKS if p.name.startswith("08")), as_version=4)
    assert "inductor_note()" in next(c.source for c in nb.cells if c.cell_type == "code")
    assert any("OpenMP" in c.source for c in nb.cells if c.cell_type == "markdown")
