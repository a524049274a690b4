"""What a benchmark leaves behind: printed tables, a JSON record that says where and how it ran, a bar chart."""

import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from minillm.bench.breakdown import PARTS


def machine(device: str = "cpu") -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or None,
    )
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return dict(cpu=cpu, num_cores=os.cpu_count(), torch_threads=torch.get_num_threads(), device=device, gpu=gpu)


def versions() -> dict:
    import transformers

    try:
        minillm = version("minillm")
    except PackageNotFoundError:
        minillm = None
    return dict(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        minillm=minillm,
    )


def git_state() -> dict:
    """The commit of the repository minillm is imported from, and whether its work tree has changes; None
    outside a git repository."""

    def git(*args):
        out = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return dict(git_commit=commit, git_dirty=bool(git("status", "--porcelain")) if commit else None)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def results_table(results: dict, speedup: dict) -> str:
    """One row per backend; "minillm x" is minillm's output tokens/s over that backend's."""
    header = (
        f"{'backend':<18}{'req/s':>8}{'out tok/s':>11}{'total tok/s':>13}{'elapsed s':>11}"
        f"{'TTFT mean/p99 ms':>19}{'TPOT mean/p99 ms':>19}{'minillm x':>11}"
    )
    rows = [header, "-" * len(header)]
    for name, r in results.items():
        ratio = f"{speedup[name]:.2f}" if name in speedup else "-"
        rows.append(
            f"{name:<18}{r['requests_per_second']:>8.2f}{r['output_tokens_per_second']:>11.1f}"
            f"{r['total_tokens_per_second']:>13.1f}{r['elapsed_time']:>11.2f}"
            f"{_ms(r.get('mean_ttft_ms')) + ' / ' + _ms(r.get('p99_ttft_ms')):>19}"
            f"{_ms(r.get('mean_tpot_ms')) + ' / ' + _ms(r.get('p99_tpot_ms')):>19}{ratio:>11}"
        )
    return "\n".join(rows)


def breakdown_table(breakdown: dict) -> str:
    """minillm's steps, prefill and decode apart: count, mean batch size, mean duration, share of each part."""
    parts = [*PARTS, "other"]
    header = f"{'step':<9}{'steps':>7}{'batch':>7}{'ms/step':>9}" + "".join(f"{p:>13}" for p in parts)
    rows = [header]
    for kind, b in breakdown.items():
        rows.append(
            f"{kind:<9}{b['num_steps']:>7}{b['mean_batch_size']:>7.1f}{b['mean_step_ms']:>9.2f}"
            + "".join(f"{b['share'][p]:>13.1%}" for p in parts)
        )
    return "\n".join(rows)


def ladder_table(ladder: dict) -> str:
    """One row per rung: what it adds, requests run, output tokens/s, speedups, whether it matched the first rung."""
    header = f"{'rung':<16}{'adds':<40}{'requests':>9}{'out tok/s':>11}{'x prev':>8}{'x first':>9}{'same tokens':>13}"
    rows = [header, "-" * len(header)]
    for name, r in ladder["rungs"].items():
        rows.append(
            f"{name:<16}{r['label']:<40}{r['num_requests']:>9}{r['output_tokens_per_second']:>11.1f}"
            f"{r['speedup_over_previous']:>8.2f}{r['speedup_over_first']:>9.2f}{r['same_tokens_as_first']:>13.0%}"
        )
    return "\n".join(
        rows
        + [
            f"(the slow rungs ran the first {ladder['slow_prompts']} requests; same tokens: share "
            "of the requests both ran whose greedy tokens equal the first rung's)"
        ]
    )


def serving_table(results: dict) -> str:
    """One row per backend and request rate: throughput, then mean/p50/p99 of TTFT, TPOT and E2EL in ms."""
    header = f"{'backend':<16}{'rate':>7}{'req/s':>8}{'out tok/s':>11}" + "".join(
        f"{m + ' mean/p50/p99 ms':>30}" for m in ("TTFT", "TPOT", "E2EL")
    )
    rows = [header, "-" * len(header)]
    for name, by_rate in results.items():
        for r in by_rate:
            rows.append(
                f"{name:<16}{r['request_rate']:>7g}{r['requests_per_second']:>8.2f}"
                f"{r['output_tokens_per_second']:>11.1f}"
                + "".join(
                    f"{' / '.join(_ms(r[f'{s}_{m}_ms']) for s in ('mean', 'median', 'p99')):>30}"
                    for m in ("ttft", "tpot", "e2el")
                )
            )
    return "\n".join(rows)


def write_json(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def figure(width: float, height: float = 4, ncols: int = 1):
    """A matplotlib figure with ncols axes, made without pyplot: the bench runs without a display, and a notebook
    that calls it keeps its own backend."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(1, ncols, squeeze=False)


def save(fig, title: str, path: Path) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def plot(results: dict, speedup: dict, title: str, path: Path) -> None:
    """A PNG bar chart of output tokens/s per backend, each peer's bar labelled with minillm's ratio to it."""
    names = list(results)
    values = [results[n]["output_tokens_per_second"] for n in names]
    fig, ((ax,),) = figure(1.6 * len(names) + 2)
    bars = ax.bar(names, values, color=["tab:blue" if n == "minillm" else "tab:gray" for n in names])
    labels = [f"{v:.0f}" + (f"\nminillm {speedup[n]:.2f}x" if n in speedup else "") for n, v in zip(names, values)]
    ax.bar_label(bars, labels, fontsize=8)
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(0, max(values) * 1.25)
    save(fig, title, path)


def plot_ladder(rungs: dict, title: str, path: Path) -> None:
    """Horizontal bars of output tokens/s per rung, first rung at the top, each labelled with its speedup over
    the rung before it and over the first (naive) rung."""
    names = list(rungs)[::-1]
    values = [rungs[n]["output_tokens_per_second"] for n in names]
    fig, ((ax,),) = figure(8, 0.5 * len(names) + 1.5)
    bars = ax.barh(
        [f"{n}\n{rungs[n]['label']}" for n in names],
        values,
        color=["tab:gray" if rungs[n]["first_requests_only"] else "tab:blue" for n in names],
    )
    ax.bar_label(
        bars,
        [
            f" {v:.0f} tok/s  {rungs[n]['speedup_over_previous']:.2f}x prev, "
            f"{rungs[n]['speedup_over_first']:.1f}x naive"
            for n, v in zip(names, values)
        ],
        fontsize=8,
    )
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("output tokens/s (gray: run on the first requests only)")
    ax.set_xlim(0, max(values) * 1.6)
    save(fig, title, path)


def plot_serving(rates: list[float], results: dict, title: str, path: Path) -> None:
    """TTFT, TPOT and end-to-end latency (p50 solid, p99 dashed) against request rate, one colour per backend.
    An infinite rate (everything at once) has no place on the axis and is left out."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    finite = [i for i, rate in enumerate(rates) if rate != float("inf")]
    fig, axes = figure(12, 3.8, ncols=3)
    for ax, (metric, name) in zip(
        axes[0], [("ttft", "time to first token"), ("tpot", "time per output token"), ("e2el", "end-to-end latency")]
    ):
        for colour, (backend, by_rate) in zip(["tab:blue", "tab:gray", "tab:orange"], results.items()):
            for stat, style in (("median", "-"), ("p99", "--")):
                ax.plot(
                    [rates[i] for i in finite],
                    [by_rate[i][f"{stat}_{metric}_ms"] for i in finite],
                    style,
                    color=colour,
                    marker="o",
                    markersize=3,
                    label=f"{backend} {'p50' if stat == 'median' else stat}",
                )
        ax.set(xlabel="request rate (requests/s)", ylabel="ms", title=name, xscale="log", yscale="log")
        ax.set_xticks([rates[i] for i in finite], [f"{rates[i]:g}" for i in finite], minor=False)
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))  # labels inside a decade, as plain numbers
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.title.set_fontsize(9)
    axes[0][0].legend(fontsize=7)
    save(fig, title, path)


def plot_sizes(sizes: list[dict], title: str, path: Path) -> None:
    """Output tokens/s against parameters (log-log), one line per backend."""
    fig, ((ax,),) = figure(6)
    for backend in sizes[0]["results"]:
        ax.plot(
            [s["num_parameters"] for s in sizes],
            [s["results"][backend]["output_tokens_per_second"] for s in sizes],
            marker="o",
            label=backend,
        )
    for s in sizes:
        ax.annotate(
            s["size"],
            (s["num_parameters"], s["results"][next(iter(s["results"]))]["output_tokens_per_second"]),
            fontsize=8,
            textcoords="offset points",
            xytext=(4, 4),
        )
    ax.set(xlabel="parameters", ylabel="output tokens/s", xscale="log", yscale="log")
    ax.legend(fontsize=8)
    save(fig, title, path)
