"""The baselines the early chapters build and the benchmarks compare against."""

from minillm.naive.generate import generate_cached, generate_naive
from minillm.naive.static_batch import generate_static

__all__ = ["generate_cached", "generate_naive", "generate_static"]
