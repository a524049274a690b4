"""What `python -m minillm.bench autotune` prints and draws: a row per trial, and every trial as a point of request
throughput against p99 latency, the throughput/latency frontier through them, the best and the defaults marked."""

from pathlib import Path

from minillm.bench.autotune_search import pareto_front
from minillm.bench.report import figure, save
from minillm.bench.serve_report import plain_numbers

LABELS = dict(  # the table's column per flag
    max_num_seqs="seqs",
    max_num_batched_tokens="tokens",
    long_prefill_token_threshold="long-prefill",
    block_size="block",
    scheduling_policy="policy",
    data_parallel_size="dp",
)
METRIC_NAMES = dict(ttft="time to first token", tpot="time per output token", e2el="end-to-end latency")


def _number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def trial_table(trials: list[dict], space: dict[str, list], best: int | None) -> str:
    """A row per trial: the values of the flags searched over more than one value, request throughput, goodput,
    the share of requests that met every SLO, p99 TTFT, TPOT and E2EL, whether it met the goal, its seconds (server
    start-up included). The best trial is starred, trial 0 is the defaults."""
    flags = [dest for dest, values in space.items() if len(values) > 1]
    width = {dest: max(len(LABELS[dest]), *(len(str(v)) for v in space[dest])) + 2 for dest in flags}
    header = (
        f"{'trial':<7}"
        + "".join(f"{LABELS[dest]:>{width[dest]}}" for dest in flags)
        + f"{'req/s':>8}{'goodput':>9}{'SLOs met':>10}{'p99 TTFT':>10}{'p99 TPOT':>10}{'p99 E2EL':>10}{'goal':>6}"
        + f"{'s':>6}"
    )
    rows = [header, "-" * len(header)]
    for t in trials:
        r = t["result"] or {}
        mark = "*" if t["number"] == best else ""
        rows.append(
            f"{str(t['number']) + mark:<7}"
            + "".join(f"{t['params'][dest]!s:>{width[dest]}}" for dest in flags)
            + f"{_number(r.get('requests_per_second'), '.2f'):>8}{t['goodput']:>9.2f}{t['slo_attainment']:>10.0%}"
            + "".join(f"{_number(r.get(f'p99_{m}_ms'), '.0f'):>10}" for m in ("ttft", "tpot", "e2el"))
            + f"{'met' if t['meets_goal'] else 'no':>6}{t['seconds']:>6.0f}"
        )
    fixed = ", ".join(f"{dest} {values[0]}" for dest, values in space.items() if len(values) == 1)
    notes = "(latencies in ms; * the best; trial 0 the server's defaults" + (
        f"; every trial: {fixed})" if fixed else ")"
    )
    return "\n".join([*rows, notes])


def plot_frontier(trials: list[dict], slos: dict[str, float], best: int | None, title: str, path: Path) -> None:
    """For each SLO's metric, a panel of every trial that completed requests: request throughput against its p99, filled where it
    met the goal; the frontier (trials no other beats on both) as a staircase; the SLO a dotted line; the best a
    star, the defaults (trial 0) a square. A log latency axis where the values span a decade or more."""
    measured = [t for t in trials if t["result"] and t["result"]["completed"]]
    fig, axes = figure(5.2 * len(slos), 4.2, ncols=len(slos))
    for ax, (metric, ms) in zip(axes[0], slos.items()):
        points = [(t["result"][f"p99_{metric}_ms"], t["result"]["requests_per_second"]) for t in measured]
        right = max([ms, *(x for x, _ in points)]) * 1.05
        front = [points[i] for i in pareto_front(points)]  # a step per point: its throughput at any higher latency
        ax.plot(
            [x for x, _ in front] + [right],
            [y for _, y in front] + [front[-1][1]],
            drawstyle="steps-post",
            color="tab:blue",
            alpha=0.5,
            label="frontier",
        )
        for met in (True, False):
            chosen = [p for p, t in zip(points, measured) if t["meets_goal"] == met]
            if not chosen:
                continue
            ax.scatter(
                [x for x, _ in chosen],
                [y for _, y in chosen],
                s=30,
                facecolors="tab:blue" if met else "none",
                edgecolors="tab:blue" if met else "tab:gray",
                label="met the goal" if met else "missed it",
            )
        for point, t in zip(points, measured):
            ax.annotate(str(t["number"]), point, fontsize=7, textcoords="offset points", xytext=(4, 3))
            if t["number"] == 0:
                ax.scatter(*point, s=140, marker="s", facecolors="none", edgecolors="black", label="defaults (0)")
            if t["number"] == best:
                ax.scatter(*point, s=160, marker="*", color="tab:orange", zorder=3, label=f"best ({best})")
        ax.axvline(ms, color="tab:red", linestyle=":", label=f"SLO {ms:g} ms")
        xs = [x for x, _ in points if x > 0] + [ms]
        log = max(xs) > 10 * min(xs)
        ax.set(xlabel=f"p99 {METRIC_NAMES[metric]}, ms" + (" (log scale)" if log else ""), ylabel="requests/s")
        if log:
            ax.set_xscale("log")
            plain_numbers(ax.xaxis)
        else:
            ax.set_xlim(0, right)
        ax.set_ylim(0, max(y for _, y in points) * 1.25)  # room above the highest point for the legend
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, title, path)
