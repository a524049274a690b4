"""Claims from measurements: the sentence that states a measured comparison is rendered from the measured values.

A notebook's prose keeps the reasoning; the figure and the direction come from the run (DESIGN §5, "Prose never
hard-codes a measured figure or direction"). The cell that measures prints or displays the verdict:

    verdict(eager_ms, compiled_ms, "compiled steps")            # compiled steps are 1.62x faster here
    verdict(eager_ms, compiled_ms, "compiled layers")           # compiled layers are 0.79x: slower here
    verdict(t1, t2, "TP=2 steps", than="TP=1 steps")            # TP=2 steps are 0.31x: slower than TP=1 steps here
    verdict_range(eager, compiled, "compiled forwards")         # compiled forwards are 1.37x to 2.43x faster here

The value is a `Claim`: a str that a notebook shows as Markdown when it ends a cell (or through
`IPython.display.display`), and that `print` writes as plain text. `ratio_text(a, b)` is the bare ratio and
`direction(ratio)` the bare word, for a sentence of your own.

`find_claims(markdown)` is the other side: the hard-coded measured figures a notebook's Markdown holds
(tests/test_notebook_claims.py runs it over every notebook, with an allow-list for constants).
"""

import re
from dataclasses import dataclass

SAME_WITHIN = 0.05  # ratios within 5% of 1 are "about the same": on a shared CPU that is inside the noise


class Claim(str):
    """A sentence rendered from measured values: plain text to print, Markdown when a notebook displays it."""

    def _repr_markdown_(self) -> str:
        return str(self)


def speedup(baseline: float, candidate: float, lower_is_better: bool = True) -> float:
    """How many times better the candidate is: baseline/candidate for times, candidate/baseline for rates."""
    if not (baseline > 0 and candidate > 0):
        raise ValueError(f"a comparison needs two positive measurements, got {baseline!r} and {candidate!r}")
    return baseline / candidate if lower_is_better else candidate / baseline


def ratio_text(baseline: float, candidate: float, lower_is_better: bool = True, digits: int = 2) -> str:
    """The speedup of candidate over baseline as text: "1.62x" (above 1: the candidate is better)."""
    return f"{speedup(baseline, candidate, lower_is_better):.{digits}f}x"


def direction(
    ratio: float, same_within: float = SAME_WITHIN, words: tuple[str, str, str] = ("faster", "slower", "about the same")
) -> str:
    """words[0] for a speedup above 1 + same_within, words[1] below 1 - same_within, else words[2]."""
    return words[2] if abs(ratio - 1) <= same_within else words[0] if ratio > 1 else words[1]


def verdict(baseline: float, candidate: float, subject: str, **options) -> Claim:
    """The measured comparison of `candidate` with `baseline`, as a sentence about `subject`.

    baseline, candidate: two measurements of the same thing, both > 0; times by default (lower is better), or
    rates such as tokens/s with lower_is_better=False. The ratio is a speedup (above 1: the candidate is
    better), and the sentence says which way it went:

        verdict(6.7, 4.1, "compiled steps")                   compiled steps are 1.63x faster here
        verdict(6.7, 8.5, "compiled layers", than="eager")    compiled layers are 0.79x: slower than eager here
        verdict(6.7, 6.8, "compiled layers", than="eager")    compiled layers are 0.99x: about the same as eager here

    The options are verdict_range's: a verdict is the range of one pair.
    """
    return verdict_range([baseline], [candidate], subject, **options)


def verdict_range(
    baselines,
    candidates,
    subject: str,
    *,
    than: str = "",
    where: str = "here",
    verb: str = "are",
    lower_is_better: bool = True,
    same_within: float = SAME_WITHIN,
    digits: int = 2,
) -> Claim:
    """verdict over several paired measurements (one per batch size, say): the range of the speedups, and
    whether they all went one way ("1.37x to 2.43x faster"), or not ("0.92x to 1.40x: faster at some, slower
    at others"). `than` names the baseline, `where` the place of the measurement ("here", "on this CPU", "" for
    none), `verb` agrees with the subject ("is" for a singular one); within `same_within` of 1 is "about the
    same"."""
    ratios = [speedup(b, c, lower_is_better) for b, c in zip(baselines, candidates, strict=True)]
    if not ratios:
        raise ValueError("verdict_range needs at least one pair of measurements")
    words = {direction(r, same_within) for r in ratios}
    low, high = f"{min(ratios):.{digits}f}x", f"{max(ratios):.{digits}f}x"
    span = low if low == high else f"{low} to {high}"
    against = f" {'as' if words == {'about the same'} else 'than'} {than}" if than else ""
    if words == {"faster"}:
        text = f"{span} faster{against}"
    elif len(words) == 1:
        text = f"{span}: {words.pop()}{against}"
    else:
        text = f"{span}{(' against ' + than) if than else ''}: " + (
            "faster at some, slower at others"
            if {"faster", "slower"} <= words
            else "faster at some, about the same at others"
            if "faster" in words
            else "slower at some, about the same at others"
        )
    return Claim(f"{subject} {verb} {text}{' ' + where if where else ''}")


# --- the scanner ------------------------------------------------------------------------------------------------

NUMBER = r"(?<![\w.,/])\d[\d,]*(?:\.\d+)?"  # 3, 1.62, 25,715 (not part of a word, a version or a path)
UNITS = r"(?:ms|µs|us|ns|s|sec|seconds?|GB/s|MB/s|GiB/s|tok/s|tokens/s|req/s|requests/s|TB|GB|MB|KB|GiB|MiB|KiB)"
PATTERNS = {
    "ratio": rf"{NUMBER}[x×](?![\w\d])",  # 1.6x, 4× (with a space, "8 × 32" is a product)
    "percent": rf"{NUMBER}\s?%(?!\s*\d)",  # not "9 % 4", a remainder
    "quantity": rf"{NUMBER}\s?{UNITS}(?![\w\d])",
    "times": rf"{NUMBER}\s+times\s+(?:faster|slower|more|fewer|less|larger|smaller|the|as)\b",
}
# a direction stated about this machine's measurement, with no number: "no faster here", "slower on this CPU"
DIRECTION = (
    r"\b(?:faster|slower|wins?|loses?|lose|outweighs?|pays? (?:off|back))\b[^.;:()]{0,40}?"
    r"\b(?:here|on this (?:CPU|machine|laptop))\b"
    r"|\b(?:here|on this (?:CPU|machine|laptop))\b[^.;:()]{0,40}?\b(?:faster|slower|wins?|loses?|lose)\b"
)
PATTERNS["direction"] = DIRECTION
QUESTION = re.compile(r"\b(?:whether|which|printed|prints|verdict)\b", re.I)  # a direction asked, not stated
FENCED = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE = re.compile(r"`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|<https?://[^>]*>|\]\([^)]*\)|https?://\S+", re.S)


@dataclass(frozen=True)
class Finding:
    kind: str  # which pattern: ratio, percent, quantity, times
    text: str  # the figure as written ("1.37x", "92%", "13.4 MB")
    line: str  # the line of Markdown it is on (code spans blanked), to read and to allow-list against


def prose(markdown: str) -> str:
    """The Markdown with code blocks, code spans, formulas and link targets blanked (same length per line kept
    irrelevant: only the words a reader reads as prose remain)."""
    text = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
    return INLINE.sub(" ", text)


def find_claims(markdown: str) -> list[Finding]:
    """The figures in `markdown`'s prose that look measured: speedups (1.6x), percentages, quantities with a
    unit of time, bandwidth, rate or size, "N times faster/more ...", and a direction stated about this machine
    with no number ("slower here", "faster on this CPU"; not "whether ... faster here", a question the cell's
    printed verdict answers). Code (fenced or in backticks), formulas ($...$) and links are not prose and are
    skipped; a product ("8 × 32"), a remainder ("9 % 4") and a figure without a unit (a layer count, a batch
    size) are not claims. Deciding which findings are constants (a datasheet figure, a model's size) is the
    caller's."""
    found = []
    for line in prose(markdown).splitlines():
        for kind, pattern in PATTERNS.items():
            for m in re.finditer(pattern, line):
                if kind == "direction" and QUESTION.search(line[max(0, m.start() - 50) : m.end()]):
                    continue  # "whether two ranks are faster here", "printed which is faster here": no claim
                found.append(Finding(kind, m.group(0).strip(), line.strip()))
    return found
