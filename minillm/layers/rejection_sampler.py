"""Verifying drafts (speculative decoding), batched as vLLM V1's vllm/v1/sample/rejection_sampler.py: the target
scored each sequence's newest token and its drafts in one forward; row i of a sequence is the target's distribution
for the token after draft i (row 0: after the newest token). The rules below keep a prefix of each sequence's drafts
and add one token of the target's own, so a step yields 1 to k + 1 tokens per sequence, and the output is exactly
what the target alone would give: the same tokens under greedy decoding (up to the floating-point numerics of a
(k + 1)-row forward against a one-row one), the same distribution under sampling (Leviathan et al. 2023; Chen et
al. 2023). Every sequence is a row of [B, k] or [B, k + 1] tensors, padded where it has fewer drafts than k."""

import torch

from minillm.layers.sampler import SamplingMetadata, probabilities

PLACEHOLDER_TOKEN_ID = -1  # vLLM's name: the padding after the tokens a sequence keeps
GREEDY_TEMPERATURE = 1e-5  # below this a temperature samples as greedy (vLLM's _SAMPLING_EPS)


def greedy_accept(target_ids: torch.Tensor, draft_ids: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """The tokens each greedy sequence keeps: its drafts up to the first the target disagrees with, then the
    target's own.

    target_ids [B, k + 1] (long): the target's argmax at each row of each sequence; draft_ids [B, k] (long): the
    drafts, of which sequence b has num_drafts[b] (0..k; the entries after them are padding, to be ignored).
    Draft i of sequence b is right when it equals target_ids[b, i], what the target itself would pick there. Keep
    the drafts while they are right; at the first wrong one the target's pick replaces it and the rest are dropped
    (they followed a wrong token). If all of its drafts are right, the row after them gives one more token (the
    bonus token). Returns [B, k + 1] (long): sequence b's n + 1 tokens (n drafts kept, then the target's) in its
    first n + 1 columns, PLACEHOLDER_TOKEN_ID (-1) after them. No Python loop over sequences.

    Example: target_ids [[5, 6, 7, 8], [4, 6, 0, 0]], draft_ids [[5, 6, 9], [5, 0, 0]], num_drafts [3, 1]:
    [[5, 6, 7, -1], [4, -1, -1, -1]]. (As the kept drafts equal the target's picks, the output is target_ids cut
    after n + 1 columns.)
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 13.2: greedy verification — keep each row's drafts while the target agrees, then its own token
    k = draft_ids.shape[1]
    real = torch.arange(k, device=draft_ids.device) < num_drafts[:, None]
    agree = (draft_ids == target_ids[:, :k]) & real
    num_accepted = agree.int().cumprod(dim=1).sum(dim=1)  # drafts before the first disagreement
    keep = torch.arange(k + 1, device=draft_ids.device) <= num_accepted[:, None]
    return torch.where(keep, target_ids, PLACEHOLDER_TOKEN_ID)
    # END EXERCISE


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> torch.Tensor:
    """The tokens each sampled sequence keeps, so that each is distributed exactly as the target alone would draw
    it. A pure function: the randomness comes in as `uniform` and `exponential`.

    target_probs [B, k + 1, V]: the target's distribution p at each row (after temperature, top-k, top-p);
    draft_ids [B, k] (long), of which sequence b has num_drafts[b] (the entries after them are padding);
    draft_probs [B, k, V]: the distribution q each draft was drawn from, or None for drafts that were looked up
    (n-gram) or picked greedily: then q is all on the draft token, q(d) = 1, 0 elsewhere. uniform [B, k] (float64,
    in [0, 1)); exponential [B, V] (float32, Exponential(1) draws, none 0).

    1. Accept draft i of sequence b, d = draft_ids[b, i], if uniform[b, i] * q(d) < p(d) (p, q at row i): that is
       with probability min(1, p(d) / q(d)). The comparison is strict and in float64: u can be exactly 0, and a
       draft the target gives probability 0 (outside its top-k or top-p) must never be kept. A sequence keeps its
       drafts up to the first rejected one: n of them (n = num_drafts[b] if none is rejected).
    2. Then one token of the target's own, from row n: the residual r = max(p - q, 0) at that row, where q is the
       rejected draft's distribution (as in 1), or nothing (all zeros) at the bonus row after every draft. Why:
       accepted mass min(p, q) plus residual mass max(p - q, 0) add up to p. Where float rounding leaves r all
       zeros (p ≤ q everywhere), use p itself. Draw from r without normalising it, as `sample` does:
       argmax(r / exponential[b]) picks token i with probability r_i / sum(r).
    Returns [B, k + 1] (long): sequence b's n kept drafts, then its token, then PLACEHOLDER_TOKEN_ID (-1).
    No Python loop over sequences.

    Example: V = 3, one sequence, one looked-up draft d = 0, p = [0.25, 0.75, 0] at row 0. uniform 0.1: kept
    (0.1 · 1 < 0.25), then the bonus from row 1. uniform 0.5: rejected, r = [0, 0.75, 0]: token 1. Either way
    token 0 comes first with probability 0.25, token 1 with 0.75: as if the target had drawn it.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 13.3: rejection sampling — accept draft d if u·q(d) < p(d), else draw from max(p - q, 0)
    b, k = draft_ids.shape
    rows, cols = torch.arange(b, device=draft_ids.device), torch.arange(k + 1, device=draft_ids.device)
    real = cols[:k] < num_drafts[:, None]
    p_d = target_probs[:, :k].gather(2, draft_ids[:, :, None]).squeeze(2)
    q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.gather(2, draft_ids[:, :, None]).squeeze(2)
    accepted = (uniform * q_d.double() < p_d.double()) & real
    n = accepted.int().cumprod(dim=1).sum(dim=1)  # drafts kept: up to the first rejection
    p = target_probs[rows, n]
    rejected = n < num_drafts  # a draft was rejected at row n (else row n is the bonus row)
    d = draft_ids[rows, n.clamp(max=k - 1)]
    if draft_probs is None:
        q = torch.zeros_like(p).scatter_(1, d[:, None], 1.0)
    else:
        q = draft_probs[rows, n.clamp(max=k - 1)]
    residual = (p - q * rejected[:, None]).clamp_min(0)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p)  # all zeros only by rounding
    token = residual.div(exponential).argmax(dim=1)
    out = torch.where(cols[:k] < n[:, None], draft_ids, PLACEHOLDER_TOKEN_ID)
    out = torch.cat([out, torch.full_like(out[:, :1], PLACEHOLDER_TOKEN_ID)], dim=1)
    return out.scatter_(1, n[:, None], token[:, None])
    # END EXERCISE


class RejectionSampler:
    """The sampler of a step that verifies drafts: sequence i has 1 + len(drafts[i]) rows of logits, in order, and
    gets the drafts it keeps followed by one token of the target's own. Greedy sequences (temperature below
    GREEDY_TEMPERATURE) go through greedy_accept, the others through rejection_sample, each batch in one call; a
    seeded request draws its uniforms and noise from its own generator, on the device that samples."""

    def __call__(
        self,
        logits: torch.Tensor,
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None],
        md: SamplingMetadata,
    ) -> list[list[int]]:
        """draft_probs[i]: the draft model's distributions of drafts[i] ([len(drafts[i]), V]), None for looked-up
        drafts; md: the sampling settings per row (each sequence's repeated over its rows)."""
        device, k = logits.device, max(map(len, drafts))
        counts = [len(ids) for ids in drafts]
        starts = torch.tensor([0, *counts[:-1]], device=device).add_(1).cumsum(0) - 1  # each sequence's first row
        num_drafts = torch.tensor(counts, device=device)
        # each sequence's rows as a [B, k + 1] index into logits (rows past its own repeat its last)
        index = starts[:, None] + torch.minimum(torch.arange(k + 1, device=device), num_drafts[:, None])
        draft_ids = torch.tensor([ids + [0] * (k - len(ids)) for ids in drafts], device=device, dtype=torch.long)
        target_ids = greedy_accept(logits.argmax(dim=-1)[index], draft_ids, num_drafts)
        temperatures = md.temperatures[starts]
        if md.all_greedy or bool((temperatures < GREEDY_TEMPERATURE).all()):
            return to_lists(target_ids)
        probs = probabilities(logits, md)[index]
        q = None
        if any(p is not None for p in draft_probs):  # a draft model's distributions, zeros past each one's drafts
            q = probs.new_zeros(len(drafts), k, probs.shape[-1])
            for i, (p, n) in enumerate(zip(draft_probs, counts)):
                if p is not None:
                    q[i, :n] = p[:n]  # the scheduler may have verified fewer than were drafted
        uniform = torch.rand(len(drafts), k, dtype=torch.float64, device=device)
        exponential = torch.empty(len(drafts), probs.shape[-1], device=device).exponential_()
        for i, row in enumerate(starts.tolist()):  # a seeded request: its own stream, as many draws every step
            if (generator := md.generators.get(row)) is not None:
                uniform[i, : counts[i]] = torch.rand(counts[i], dtype=torch.float64, device=device, generator=generator)
                exponential[i].exponential_(generator=generator)
        sampled = rejection_sample(probs, draft_ids, num_drafts, q, uniform, exponential.clamp_min_(1e-10))
        greedy = (temperatures < GREEDY_TEMPERATURE)[:, None]
        return to_lists(torch.where(greedy, target_ids, sampled))


def to_lists(tokens: torch.Tensor) -> list[list[int]]:
    """[B, k + 1] tokens padded with PLACEHOLDER_TOKEN_ID as a list of each row's tokens."""
    return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in tokens.tolist()]
