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
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or None)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return dict(cpu=cpu, num_cores=os.cpu_count(), torch_threads=torch.get_num_threads(), device=device, gpu=gpu)


def versions() -> dict:
    import transformers

    try:
        minillm = version("minillm")
    except PackageNotFoundError:
        minillm = None
    return dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                minillm=minillm)


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
    header = (f"{'backend':<18}{'req/s':>8}{'out tok/s':>11}{'total tok/s':>13}{'elapsed s':>11}"
              f"{'TTFT mean/p99 ms':>19}{'TPOT mean/p99 ms':>19}{'minillm x':>11}")
    rows = [header, "-" * len(header)]
    for name, r in results.items():
        ratio = f"{speedup[name]:.2f}" if name in speedup else "-"
        rows.append(f"{name:<18}{r['requests_per_second']:>8.2f}{r['output_tokens_per_second']:>11.1f}"
                    f"{r['total_tokens_per_second']:>13.1f}{r['elapsed_time']:>11.2f}"
                    f"{_ms(r.get('mean_ttft_ms')) + ' / ' + _ms(r.get('p99_ttft_ms')):>19}"
                    f"{_ms(r.get('mean_tpot_ms')) + ' / ' + _ms(r.get('p99_tpot_ms')):>19}{ratio:>11}")
    return "\n".join(rows)


def breakdown_table(breakdown: dict) -> str:
    """minillm's steps, prefill and decode apart: count, mean batch size, mean duration, share of each part."""
    parts = [*PARTS, "other"]
    header = f"{'step':<9}{'steps':>7}{'batch':>7}{'ms/step':>9}" + "".join(f"{p:>13}" for p in parts)
    rows = [header]
    for kind, b in breakdown.items():
        rows.append(f"{kind:<9}{b['num_steps']:>7}{b['mean_batch_size']:>7.1f}{b['mean_step_ms']:>9.2f}"
                    + "".join(f"{b['share'][p]:>13.1%}" for p in parts))
    return "\n".join(rows)


def write_json(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def plot(results: dict, speedup: dict, title: str, path: Path) -> None:
    """A PNG bar chart of output tokens/s per backend, each peer's bar labelled with minillm's ratio to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    values = [results[n]["output_tokens_per_second"] for n in names]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 4))
    bars = ax.bar(names, values, color=["tab:blue" if n == "minillm" else "tab:gray" for n in names])
    labels = [f"{v:.0f}" + (f"\nminillm {speedup[n]:.2f}x" if n in speedup else "") for n, v in zip(names, values)]
    ax.bar_label(bars, labels, fontsize=8)
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(0, max(values) * 1.25)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
