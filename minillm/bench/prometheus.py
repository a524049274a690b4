"""Reading a Prometheus /metrics page, as a monitor does: samples by name, histogram buckets, and percentiles
estimated from how the buckets grew (Prometheus's histogram_quantile). The dashboard (minillm.course.dashboard)
reads the server's vLLM-named metrics with these."""

import math

from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict:
    """A scrape as {sample name: value} (summed over label sets: a server may label per engine) and, for the
    histograms, {name: [(le, cumulative count), ...]} in bucket order."""
    values, buckets = {}, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket"):
                bounds = buckets.setdefault(s.name.removesuffix("_bucket"), {})
                le = float(s.labels["le"])
                bounds[le] = bounds.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return values | {name: sorted(b.items()) for name, b in buckets.items()}


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's estimate of the q-quantile (q in [0, 1]; 0.99 for p99) of what a histogram counted.

    A Prometheus histogram keeps no samples, only cumulative bucket counts: `buckets` is [(le, count), ...] in
    increasing le (upper bound, in seconds), where count is how many observations were <= le; the last le is
    math.inf, and its count is the total. (Over a window, the counts are how much each bucket grew.) Return None
    if the total is 0. Otherwise the q-quantile's rank is q * total: find the first bucket whose count is >= rank,
    and interpolate linearly inside it, from its lower bound (the previous bucket's le; 0 for the first) with the
    previous count, to its le with its count: lower + (le - lower) * (rank - previous) / (count - previous).
    When that bucket is the +Inf one, return its lower bound (the largest finite le): no upper edge to
    interpolate to. When the bucket counted nothing new (count == previous, only possible at rank 0), return le.

    Example: buckets [(0.1, 10), (0.5, 30), (inf, 40)]: the median's rank is 20, in the second bucket (10 below it,
    30 by its end): 0.1 + 0.4 * (20 - 10) / (30 - 10) = 0.3; the 0.9-quantile's rank, 36, falls in +Inf: 0.5.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 12.2: a percentile from a histogram — find the rank's bucket, interpolate inside it
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below) if count > below else le
        lower, below = le, count
    return lower
    # END EXERCISE


def grown(new: list, old: list) -> list:
    """Bucket counts added between two scrapes of one histogram."""
    before = dict(old)
    return [(le, count - before.get(le, 0.0)) for le, count in new]
