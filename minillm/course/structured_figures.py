"""Drawings of chapter 16 (structured outputs and the sampling API): an automaton, its token masks, the stack of a
JSON text, the packed bitmask, forced characters and the block tables of n answers.

    draw_dfa(ax, transitions, accepting)          states as circles, accepting ones doubled, edges labelled
    draw_token_masks(ax, masks, vocab, labels)    which token each state allows (a grid)
    json_stacks(text) / draw_json_stack(ax, text) the open objects, arrays and strings at every character
    draw_bitmask_words(ax, allowed, vocab_size)   32 tokens to an int32 word, bit 0 first
    draw_forced_text(ax, texts, forced)           the characters a grammar forced, highlighted
    draw_block_tables(ax, tables, ref_counts)     each answer's block table, shared blocks apart from its own

Each takes a matplotlib Axes and draws on it; the notebook owns the figure (its size, its title, plt.show()).
"""

from collections import deque

import numpy as np

ALLOWED, REFUSED = "#59a14f", "#eeeeee"
SHARED, OWN, COPIED = "#a0cbe8", "#ffbe7d", "#f28e2b"
LEVELS = {"{": ("#4e79a7", "object"), "[": ("#59a14f", "array"), '"': ("#edc948", "string")}


def _layout(transitions: list[dict[str, int]], start: int) -> dict[int, tuple[float, float]]:
    """(x, y) of each state: x its distance from the start (breadth first), states at one distance one above another."""
    depth, queue = {start: 0}, deque([start])
    while queue:
        s = queue.popleft()
        for t in transitions[s].values():
            if t not in depth:
                depth[t] = depth[s] + 1
                queue.append(t)
    columns: dict[int, list[int]] = {}
    for s in sorted(depth):
        columns.setdefault(depth[s], []).append(s)
    return {s: (d, (len(states) - 1) / 2 - i) for d, states in columns.items() for i, s in enumerate(states)}


def draw_dfa(ax, transitions: list[dict[str, int]], accepting: set[int], start: int = 0) -> None:
    """A deterministic automaton: transitions[s] maps a character to the next state; states in `accepting` are
    doubled circles; characters that lead from one state to the same next state share one edge ("t | r")."""
    from matplotlib.patches import Circle, FancyArrowPatch

    pos, r = _layout(transitions, start), 0.22
    for s, (x, y) in pos.items():
        ax.add_patch(Circle((x, y), r, facecolor="white", edgecolor="0.2", lw=1.3, zorder=3))
        if s in accepting:
            ax.add_patch(Circle((x, y), r * 0.8, facecolor="none", edgecolor="0.2", lw=1.0, zorder=4))
        ax.text(x, y, str(s), ha="center", va="center", fontsize=11, zorder=5)
    sx, sy = pos[start]
    ax.annotate("", (sx - r, sy), (sx - r - 0.4, sy), arrowprops=dict(arrowstyle="->", lw=1.2))
    ax.text(sx - r - 0.42, sy + 0.07, "start", ha="left", va="bottom", fontsize=8)
    for s, edges in enumerate(transitions):
        targets: dict[int, list[str]] = {}
        for ch, t in edges.items():
            targets.setdefault(t, []).append(ch)
        for t, chars in targets.items():
            (x0, y0), (x1, y1) = pos[s], pos[t]
            label = " | ".join(repr(c)[1:-1] for c in sorted(chars))
            if s == t:  # a loop over the state
                ax.add_patch(
                    FancyArrowPatch(
                        (x0 - 0.1, y0 + r),
                        (x0 + 0.1, y0 + r),
                        connectionstyle="arc3,rad=-2.2",
                        arrowstyle="->",
                        mutation_scale=12,
                        lw=1.1,
                    )
                )
                ax.text(x0, y0 + r + 0.35, label, ha="center", va="bottom", fontsize=10, family="monospace")
                continue
            bend = 0.0 if x1 > x0 else 0.5
            ax.add_patch(
                FancyArrowPatch(
                    (x0, y0),
                    (x1, y1),
                    connectionstyle=f"arc3,rad={bend}",
                    arrowstyle="->",
                    mutation_scale=14,
                    lw=1.1,
                    shrinkA=r * 72,
                    shrinkB=r * 72 + 2,
                )
            )
            ax.text(
                (x0 + x1) / 2,
                (y0 + y1) / 2 + 0.08,
                label,
                ha="center",
                va="bottom",
                fontsize=10,
                family="monospace",
                color="#b6003a",
            )
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.5)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.75)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_token_masks(ax, masks, vocab: list[str], row_labels: list[str]) -> None:
    """masks[i][t]: does row i (a state) allow token t? Green allowed, grey not, one column per token."""
    from matplotlib.colors import ListedColormap

    grid = np.array(masks, dtype=float)
    ax.imshow(grid, cmap=ListedColormap([REFUSED, ALLOWED]), vmin=0, vmax=1, aspect="auto")
    for i, j in zip(*np.nonzero(grid)):
        ax.text(j, i, "✓", ha="center", va="center", color="white", fontsize=9, weight="bold")
    ax.set_xticks(
        range(len(vocab)), [repr(t)[1:-1] for t in vocab], rotation=60, ha="right", family="monospace", fontsize=9
    )
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=9)
    ax.set_xticks(np.arange(len(vocab) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(row_labels) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1.5)
    ax.tick_params(which="minor", length=0)


def json_stacks(text: str) -> list[str]:
    """The stack before each character of a JSON text: "{" an open object, "[" an open array, '"' an open string
    (innermost last). A pushdown automaton for JSON keeps at least this; a regular automaton cannot, as the stack
    can grow without bound."""
    stacks, stack, escaped = [], [], False
    for ch in text:
        stacks.append("".join(stack))
        if stack and stack[-1] == '"':
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                stack.pop()
        elif ch in '{["':
            stack.append(ch)
        elif ch in "}]":
            stack.pop()
    return stacks


def draw_json_stack(ax, text: str) -> None:
    """One column per character of `text` (labelled below it), holding the stack after that character as
    coloured cells, the bottom of the stack at the bottom."""
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator

    after = json_stacks(text)[1:] + [json_stacks(text + " ")[-1]]
    for i, stack in enumerate(after):
        for level, kind in enumerate(stack):
            ax.add_patch(Rectangle((i - 0.45, level), 0.9, 0.9, facecolor=LEVELS[kind][0], edgecolor="white"))
    ax.set_xticks(range(len(text)), list(text), family="monospace", fontsize=10)
    ax.set_xlim(-0.6, len(text) - 0.4)
    ax.set_ylim(0, max(map(len, after), default=0) + 0.2)
    ax.set_ylabel("stack depth")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(
        handles=[
            Patch(color=c, label=f"inside an {n}" if n[0] in "ao" else f"inside a {n}") for c, n in LEVELS.values()
        ],
        loc="upper left",
        bbox_to_anchor=(1.005, 1),
        fontsize=8,
        frameon=False,
    )
    ax.tick_params(axis="x", length=0)


def draw_bitmask_words(ax, allowed: set[int], vocab_size: int, words: np.ndarray) -> None:
    """The packed layout: one row per int32 word, bit j of word w (bit 0 on the left) speaking for token 32w + j,
    green where allowed; past vocab_size hatched; each word's value (as int32) on the right."""
    from matplotlib.patches import Rectangle

    rows = len(words)
    for w in range(rows):
        for j in range(32):
            token = 32 * w + j
            past = token >= vocab_size
            color = "white" if past else ALLOWED if token in allowed else REFUSED
            ax.add_patch(
                Rectangle(
                    (j, rows - 1 - w),
                    0.95,
                    0.9,
                    facecolor=color,
                    edgecolor="0.6",
                    lw=0.5,
                    hatch="///" if past else None,
                )
            )
            if not past:
                ax.text(
                    j + 0.47,
                    rows - 1 - w + 0.45,
                    str(token),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white" if token in allowed else "0.4",
                )
        ax.text(32.4, rows - 1 - w + 0.45, f"word {w} = {int(words[w])}", va="center", fontsize=9, family="monospace")
    ax.set_xlim(0, 40)
    ax.set_ylim(-0.1, rows)
    ax.set_xticks([0.47, 31.47], ["bit 0", "bit 31 (the sign bit)"], fontsize=8)
    if 32 * rows > vocab_size:
        ax.text(
            vocab_size % 32 + (32 - vocab_size % 32) / 2,
            0.45,
            "past the vocabulary: ignored",
            ha="center",
            va="center",
            fontsize=8,
            color="0.3",
            bbox=dict(facecolor="white", edgecolor="none"),
        )
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def draw_forced_text(ax, texts: list[str], forced: list[list[bool]], width: int = 90, fontsize: float = 13) -> None:
    """Each text in monospace, wrapped at spaces into lines of at most `width` characters, with the characters flagged in `forced` on an
    orange ground (the grammar allowed nothing else) and the others plain (the model chose them). Pick the figure's
    width so that a character's cell fits the font: about 11 inches for 90 characters at 13 points."""
    from matplotlib.patches import Rectangle

    lines = []
    for text, flags in zip(texts, forced):
        start = 0
        while start < len(text):
            end = min(len(text), start + width)
            if end < len(text) and (space := text.rfind(" ", start, end)) > start:
                end = space + 1  # after a space: no word cut in two
            lines.append((text[start:end], flags[start:end]))
            start = end
        lines.append(("", []))
    for row, (chunk, flags) in enumerate(lines):
        y = -row
        for i, (ch, f) in enumerate(zip(chunk, flags)):
            if f:
                ax.add_patch(Rectangle((i, y - 0.42), 1, 0.84, facecolor=COPIED, alpha=0.55, lw=0))
            ax.text(i + 0.5, y, ch, ha="center", va="center", family="monospace", fontsize=fontsize)
    ax.set_xlim(0, width)
    ax.set_ylim(-len(lines) + 0.5, 0.6)
    ax.axis("off")


def draw_block_tables(
    ax,
    tables: list[list[int]],
    ref_counts: dict[int, int],
    copies: dict[int, int] | None = None,
    block_size: int | None = None,
) -> None:
    """One row per answer, one cell per entry of its block table (the block id written in it), blue where the block
    is shared (ref count above 1, written in the cell), orange where it is the answer's own; `copies` maps a new
    block to the shared block it was copied from (copy-on-write), drawn darker with "copy of N"."""
    from matplotlib.patches import FancyBboxPatch

    copies = copies or {}
    for row, table in enumerate(tables):
        for col, block in enumerate(table):
            shared, copied = ref_counts[block] > 1, block in copies
            color = COPIED if copied else SHARED if shared else OWN
            ax.add_patch(
                FancyBboxPatch(
                    (col + 0.05, -row - 0.4), 0.9, 0.8, boxstyle="round,pad=0.02", facecolor=color, edgecolor="0.3"
                )
            )
            note = f"copy of {copies[block]}" if copied else f"ref count {ref_counts[block]}"
            ax.text(col + 0.5, -row + 0.1, f"block {block}", ha="center", va="center", fontsize=9, weight="bold")
            ax.text(col + 0.5, -row - 0.18, note, ha="center", va="center", fontsize=7.5, color="0.2")
    width = max(map(len, tables))
    ax.set_xlim(-0.05, width + 0.05)
    ax.set_ylim(-len(tables) + 0.45, 0.55)
    ax.set_yticks([-r for r in range(len(tables))], [f"answer {r}" for r in range(len(tables))], fontsize=9)
    labels = [
        f"tokens {c * block_size}-{(c + 1) * block_size - 1}" if block_size else f"place {c}" for c in range(width)
    ]
    ax.set_xticks([c + 0.5 for c in range(width)], labels, fontsize=8)
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
