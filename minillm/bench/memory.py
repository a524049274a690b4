"""The engine's memory: how much the process's resident memory grows when LLM(...) is built, against what it
has to hold (the weights and the KV cache budget).

Resident memory (RSS) is read from /proc/self/status (VmRSS, and VmHWM: its peak so far), where Linux has it;
elsewhere from psutil when it is installed (no peak); otherwise it is not measured.
"""


def process_memory() -> dict | None:
    """{"rss": bytes, "peak_rss": bytes or None} of this process now, or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        kib = lambda name: int(fields[name].split()[0]) * 1024 if name in fields else None  # "123456 kB"
        if kib("VmRSS") is not None:
            return dict(rss=kib("VmRSS"), peak_rss=kib("VmHWM"))
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return dict(rss=psutil.Process().memory_info().rss, peak_rss=None)


def engine_growth(
    before: dict | None,
    after: dict | None,
    weight_bytes: int,
    kv_cache_budget_bytes: int,
    kv_cache_allocated_bytes: int | None = None,
) -> dict:
    """The record's memory field: resident memory before and after building the engine, its growth, the bytes the
    engine must hold (the checkpoint's weights, the KV cache budget) and growth / (weights + KV budget): 1.0 would
    be nothing but the weights and the cache. And the build's peak above the memory before, where the process's
    peak (VmHWM) rose during the build, so that the new peak is the build's own; None otherwise."""
    out = dict(
        weight_bytes=weight_bytes,
        kv_cache_budget_bytes=kv_cache_budget_bytes,
        kv_cache_allocated_bytes=kv_cache_allocated_bytes,
        source=None,
        rss_before_bytes=None,
        rss_after_bytes=None,
        rss_growth_bytes=None,
        peak_rss_growth_bytes=None,
        growth_over_weights_and_kv=None,
    )
    if before is None or after is None:
        return out
    growth = after["rss"] - before["rss"]
    peak = (
        after["peak_rss"] - before["rss"]
        if after.get("peak_rss") is not None
        and before.get("peak_rss") is not None
        and after["peak_rss"] > before["peak_rss"]
        else None
    )
    return out | dict(
        source="/proc/self/status" if after.get("peak_rss") is not None else "psutil",
        rss_before_bytes=before["rss"],
        rss_after_bytes=after["rss"],
        rss_growth_bytes=growth,
        peak_rss_growth_bytes=peak,
        growth_over_weights_and_kv=growth / (weight_bytes + kv_cache_budget_bytes),
    )


def describe(memory: dict) -> str:
    """One line for the terminal."""
    need = f"weights {memory['weight_bytes'] / 1e6:.0f} MB + KV cache budget {memory['kv_cache_budget_bytes'] / 1e6:.0f} MB"
    if memory["rss_growth_bytes"] is None:
        return f"minillm engine memory: resident memory not measurable here ({need})"
    peak = (
        f"; its peak +{memory['peak_rss_growth_bytes'] / 1e6:.0f} MB"
        if memory["peak_rss_growth_bytes"] is not None
        else ""
    )
    return (
        f"minillm engine memory: resident +{memory['rss_growth_bytes'] / 1e6:.0f} MB building LLM(...) = "
        f"{memory['growth_over_weights_and_kv']:.2f} x ({need}){peak}"
    )
