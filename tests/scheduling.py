"""Driving a Scheduler by hand, with no model: each step's plan, and tokens made up for it."""

from minillm.engine.scheduler import Scheduler


def run_step(s: Scheduler, token: int = 7):
    """Schedule one step and pretend the model sampled `token` for every sequence that reached its end (no draft
    kept); returns the step's sequences and whether it prefilled."""
    output = s.schedule()
    s.update_from_output(output, [[token] if seq.samples_this_step else [] for seq in output.scheduled])
    return output.scheduled, output.is_prefill
