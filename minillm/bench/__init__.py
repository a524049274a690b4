"""minillm.bench: offline throughput of minillm against its peers, in the style of vLLM's benchmark_throughput.

Every backend runs the same seeded token-id prompts on the same model in one process: requests/s, output
and total tokens/s, TTFT/TPOT, and where minillm's decode step spends its time. `python -m minillm.bench -h`.
"""

from minillm.bench.cli import main

__all__ = ["main"]
