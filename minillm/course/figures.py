"""Drawings every chapter shares: the "you are here" map of the engine.

    engine_map("05")   the whole engine, chapter 05's pieces highlighted, earlier chapters' pieces shaded

The map is one picture for the whole course, so a student sees each new piece land in the same place.
"""

# (row, label, chapter): row 0 is the model (one forward pass), row 1 the engine (serving many requests),
# row 2 the accelerations. Left to right in each row is the order data flows through them.
PIECES = [
    (0, "tokenizer\nBPE, detokenize", "01"),
    (0, "embedding\nid → vector", "02"),
    (0, "transformer layers\nRMSNorm · RoPE\nGQA attention · SwiGLU", "03"),
    (0, "LM head\nvector → logits", "02"),
    (0, "logits processors\ngrammar bitmask,\npenalties", "16"),
    (0, "sampler\ntemperature, top-k/p", "06"),
    (1, "server\nOpenAI API, SSE\n/metrics", "12"),
    (1, "LLM / LLMEngine\ngenerate, stream", "06"),
    (1, "Scheduler\ncontinuous batching", "06"),
    (1, "BlockManager\npaged blocks\nprefix cache", "05"),
    (1, "ModelRunner\nflat batch, slot_mapping", "06"),
    (1, "KV cache\nprefill / decode", "04"),
    (1, "paged attention\nblock_tables", "05"),
    (2, "CUDA graphs", "07"),
    (2, "torch.compile", "08"),
    (2, "Triton kernels", "09"),
    (2, "tensor parallel", "10"),
    (2, "benchmarks\nthe full engine", "11"),
    (2, "speculative decoding\ndraft, verify", "13"),
    (2, "quantization\nint8, GGUF blocks", "14"),
    (2, "scaling out\npipeline stages,\nreplicas, router", "15"),
]
ROWS = ["the model: one forward pass", "the engine: many requests at once", "making it fast"]
HERE, DONE, LATER = "#f28e2b", "#cfe2f3", "white"


def engine_map(chapter: str, figsize: tuple[float, float] = (9.5, 3.6)):
    """The engine as boxes, three rows; the boxes of `chapter` ("05") in orange, earlier chapters' in blue.

    Returns the matplotlib Figure (a notebook shows it; `.savefig` writes it)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=figsize)
    ax.set_xlim(0, 6)
    ax.set_ylim(-0.2, 3.2)
    ax.axis("off")
    for row, title in enumerate(ROWS):
        pieces = [p for p in PIECES if p[0] == row]
        y = 2.55 - row * 1.1
        ax.text(0.02, y + 0.5, title, fontsize=8, color="0.35", style="italic", va="bottom")
        width = 5.9 / len(pieces)
        for i, (_, label, ch) in enumerate(pieces):
            x = 0.05 + i * width
            face = HERE if ch == chapter else DONE if ch < chapter else LATER
            ax.add_patch(
                FancyBboxPatch(
                    (x + 0.03, y - 0.3),
                    width - 0.12,
                    0.75,
                    boxstyle="round,pad=0.02",
                    facecolor=face,
                    edgecolor="0.3",
                    lw=1.6 if ch == chapter else 0.8,
                    linestyle="-" if ch <= chapter else "--",
                )
            )
            ax.text(
                x + width / 2 - 0.03,
                y + 0.07,
                label,
                ha="center",
                va="center",
                fontsize=7.5,
                weight="bold" if ch == chapter else "normal",
            )
            ax.text(x + width - 0.12, y + 0.38, ch, ha="right", va="center", fontsize=6.5, color="0.4")
            if i and row < 2:
                ax.annotate("", (x + 0.03, y + 0.07), (x - 0.09, y + 0.07), arrowprops=dict(arrowstyle="->", lw=0.8))
    here = any(ch == chapter for _, _, ch in PIECES)
    ax.set_title(
        f"You are here: chapter {chapter} (orange); blue = built in earlier chapters"
        if here
        else "The engine this course builds, one box per piece (its chapter in the corner)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
