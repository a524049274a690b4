"""The baselines the early chapters build and the benchmarks compare against."""
from minillm.naive.generate import generate_cached, generate_naive

__all__ = ["generate_cached", "generate_naive"]
