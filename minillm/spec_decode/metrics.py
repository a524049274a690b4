"""What speculation gained: vLLM's SpecDecodingStats, counted over the steps that verified drafts."""

from dataclasses import dataclass


@dataclass
class SpecDecodingStats:
    num_drafts: int = 0  # verify runs: a sequence's drafts checked in one step
    num_draft_tokens: int = 0  # drafts checked
    num_accepted_tokens: int = 0  # drafts kept

    def observe(self, seqs: list, drafted: list[int], sampled: list[list[int]], appended: list[int]):
        """Count a step's verified drafts: seqs[i] checked drafted[i] drafts, the sampler gave it sampled[i] (the
        drafts kept, then one token of the target's own) and appended[i] of those became its tokens (fewer where
        one finished it: a kept EOS draft drops the drafts after it, and they count as drafted, not accepted).
        The engine's totals, and each request's own (seqs: the step's requests, each counting its num_draft_tokens
        and num_accepted_tokens)."""
        for seq, k, tokens, n in zip(seqs, drafted, sampled, appended):
            if k and tokens:
                accepted = min(len(tokens) - 1, n)
                self.num_drafts += 1
                self.num_draft_tokens += k
                self.num_accepted_tokens += accepted
                seq.num_draft_tokens += k
                seq.num_accepted_tokens += accepted

    def counts(self) -> tuple[int, int, int]:
        return self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens

    @property
    def acceptance_rate(self) -> float | None:
        """The fraction of drafts kept."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a verify run yields on average: the drafts it kept and the target's own token after them."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None
