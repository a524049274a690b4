"""What `python -m minillm.bench serve` prints and draws: vLLM's result block with one column per server, the
latency distributions of one rate, and latency and throughput against the request rate for a sweep."""

import math
from pathlib import Path

import numpy as np

from minillm.bench.report import figure, save

METRICS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")]
ROWS = [
    ("Successful requests", "completed", "d"),
    ("Failed requests", "failed", "d"),
    ("Benchmark duration (s)", "elapsed_time", ".2f"),
    ("Request throughput (req/s)", "requests_per_second", ".2f"),
    ("Request goodput (req/s)", "request_goodput", ".2f"),
    ("Output token throughput (tok/s)", "output_tokens_per_second", ".1f"),
    ("Total token throughput (tok/s)", "total_tokens_per_second", ".1f"),
    *[
        (f"{stat} {label} (ms)", f"{key}_{metric}_ms", ".1f")
        for metric, label in METRICS
        for stat, key in (("Mean", "mean"), ("Median", "median"), ("P99", "p99"))
    ],
]
COLOURS = {"minillm": "tab:blue", "minillm-separate": "tab:gray", "vllm": "tab:orange"}


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def result_table(heading: str, results: dict[str, dict]) -> str:
    """vLLM's "Serving Benchmark Result" block, a column per server; rows with no value anywhere (goodput without
    --goodput) are left out."""
    width = max(12, *(len(name) + 2 for name in results))
    lines = [f"{heading:<40}" + "".join(f"{name:>{width}}" for name in results)]
    lines.append("-" * len(lines[0]))
    for label, key, fmt in ROWS:
        values = [r.get(key) for r in results.values()]
        if all(v is None for v in values):
            continue
        lines.append(f"{label:<40}" + "".join(f"{'-' if v is None else format(v, fmt):>{width}}" for v in values))
    return "\n".join(lines)


def column(by_rate: list[dict], key: str) -> list[float]:
    """One result field at every rate; nan where there is none (no request succeeded), a gap in the line."""
    return [math.nan if r.get(key) is None else r[key] for r in by_rate]


def plain_numbers(axis) -> None:
    """Log-scale ticks as plain numbers (1, 2, 3, 5, 10, 20 ...), no minor ones: readable over a narrow range too."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    axis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())


def colour(name: str, i: int) -> str:
    return COLOURS.get(name, f"C{i + 2}")


def plot_distributions(results: dict[str, dict], title: str, path: Path) -> None:
    """The share of requests (or of token gaps) at or under each latency: TTFT, ITL and E2EL, one line per server,
    its median in the legend; on a log axis when the values span a decade or more (queueing spreads TTFT so)."""
    fig, axes = figure(13, 3.8, ncols=3)
    for ax, (key, name) in zip(
        axes[0], [("ttfts", "time to first token"), ("itls", "inter-token latency"), ("e2els", "end-to-end latency")]
    ):
        spread = []
        for i, (server, r) in enumerate(results.items()):
            values = r[key] if key != "itls" else [gap for gaps in r[key] for gap in gaps]
            ms = np.sort(np.array([v for v in values if v is not None]) * 1000)
            if not len(ms):
                continue
            spread += [ms[0], ms[-1]]
            share = np.arange(1, len(ms) + 1) / len(ms)
            ax.step(ms, share, where="post", color=colour(server, i), label=f"{server} (median {np.median(ms):.0f} ms)")
        log = bool(spread) and max(spread) > 10 * min(spread)  # a log axis when the values span a decade or more
        ax.set(
            xlabel="ms (log scale)" if log else "ms",
            ylabel="share of token gaps" if key == "itls" else "share of requests",
        )
        ax.set(title=name, xscale="log" if log else "linear", ylim=(0, 1.02))
        if log:
            plain_numbers(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    save(fig, title, path)


def plot_sweep(rates: list[float], results: dict[str, list[dict]], title: str, path: Path) -> None:
    """TTFT and ITL (p50 solid, p99 dashed, log scale) and output tokens/s against the request rate, one colour per
    server. The rates sit evenly spaced, in the order given, so that inf (everything at once) has its place."""
    x = list(range(len(rates)))
    fig, axes = figure(13, 4, ncols=3)
    for i, (server, by_rate) in enumerate(results.items()):
        for ax, metric in zip(axes[0][:2], ("ttft", "itl")):
            for stat, style in (("median", "-"), ("p99", "--")):
                ax.plot(
                    x,
                    column(by_rate, f"{stat}_{metric}_ms"),
                    style,
                    color=colour(server, i),
                    marker="o",
                    markersize=4,
                    label=f"{server} {'p50' if stat == 'median' else stat}",
                )
        axes[0][2].plot(
            x, column(by_rate, "output_tokens_per_second"), color=colour(server, i), marker="o", label=server
        )
    names = [("ms (log scale)", "time to first token"), ("ms (log scale)", "inter-token latency")]
    for ax, (ylabel, name) in zip(axes[0], [*names, ("output tokens/s", "output throughput")]):
        ax.set_xticks(x, [rate_label(r) for r in rates])
        ax.set(xlabel="request rate (requests/s)", ylabel=ylabel, title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[0][:2]:
        ax.set_yscale("log")
        plain_numbers(ax.yaxis)
    axes[0][2].set_ylim(bottom=0)
    save(fig, title, path)
