"""Verifying drafts (speculative decoding): the target model scored a sequence's newest token and its k draft tokens
in one forward, giving k + 1 rows of logits; row i is the target's distribution for the token after draft i (row 0:
after the newest token). The rules below keep a prefix of the drafts and add one token of the target's own, so a step
yields 1 to k + 1 tokens, and the output is exactly what the target alone would give: the same tokens under greedy
decoding, the same distribution under sampling (Leviathan et al. 2023; Chen et al. 2023)."""

import torch

from minillm.layers.sampler import SamplingMetadata, probabilities


def greedy_accept(target_ids: list[int], draft_ids: list[int]) -> list[int]:
    """The tokens a greedy step keeps: the drafts up to the first the target disagrees with, then the target's own.

    target_ids: the target's argmax at each of the k + 1 rows (len(draft_ids) + 1 ints); draft_ids: the k drafts.
    Draft i is right when it equals target_ids[i], what the target itself would pick there. Keep the drafts while
    they are right; at the first wrong one, the target's pick replaces it and the rest are dropped (they followed a
    wrong token). If all k are right, the last row gives one more token for free (the bonus token).
    Returns between 1 and k + 1 tokens: the kept drafts, then one target token.

    Examples: target_ids [5, 6, 7, 8], draft_ids [5, 6, 9]: [5, 6, 7]. target_ids [4, 6], draft_ids [5]: [4].
    target_ids [5, 6, 7], draft_ids [5, 6]: [5, 6, 7] (all kept, 7 the bonus). No drafts, target_ids [3]: [3].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 13.2: greedy verification — keep the drafts the target agrees with, then one token of its own
    n = 0
    while n < len(draft_ids) and draft_ids[n] == target_ids[n]:
        n += 1
    return target_ids[: n + 1]
    # END EXERCISE


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """The tokens a sampling step keeps, so that each is distributed exactly as the target alone would draw it.

    target_probs [k + 1, V]: the target's distribution p at each row (after temperature, top-k, top-p).
    draft_ids: the k drafts. draft_probs [k, V]: the distribution q each draft was drawn from, or None for a
    draft that was not drawn but looked up (n-gram): then q is all on the draft token, q(d) = 1 and 0 elsewhere.
    generator: the request's seeded torch.Generator, or None; pass it to every random draw (torch.rand,
    torch.multinomial), so that a seeded request is reproducible.
    For draft i, token d = draft_ids[i], p = target_probs[i], q its draft distribution: draw u uniform in [0, 1)
    on p's device (`torch.rand((), generator=generator, device=p.device)`) and accept d if u * q(d) < p(d), that
    is with probability min(1, p(d) / q(d)). The comparison is strict: u can be exactly 0, and a draft the target
    gives probability 0 (outside its top-k or top-p) must never be kept. On acceptance go on to the next draft. On
    the first rejection, draw the replacement from the residual distribution max(p - q, 0), normalised to sum to 1,
    keep it after the accepted drafts and stop: the drafts after it are dropped. (Why: accepted mass min(p, q) plus
    residual mass max(p - q, 0) add up to p.) Where float rounding leaves the residual all zeros (p ≤ q at every
    token, although both should sum to 1), draw from p itself. If every draft is accepted, draw one more token from
    the last row, target_probs[k] (the bonus token).
    Draw a token from a distribution r with `torch.multinomial(r, 1, generator=generator).item()`.
    Returns between 1 and k + 1 tokens (ints).

    Example: V = 3, one n-gram draft d = 0, p = [0.25, 0.75, 0] at row 0. The draft is kept with probability 0.25;
    else the residual is p without token 0, [0, 0.75, 0] / 0.75, so token 1. Either way token 0 comes out with
    probability 0.25, token 1 with 0.75: as if the target had drawn it.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 13.3: rejection sampling — accept draft d with probability min(1, p(d)/q(d)), else draw from max(p - q, 0)
    tokens = []
    for i, d in enumerate(draft_ids):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_probs[i]
        if torch.rand((), generator=generator, device=p.device) * q[d] < p[d]:
            tokens.append(d)
            continue
        residual = (p - q).clamp_min(0)
        residual = residual if residual.sum() > 0 else p  # all zeros only by rounding: p is then what remains
        tokens.append(torch.multinomial(residual / residual.sum(), 1, generator=generator).item())
        return tokens
    tokens.append(torch.multinomial(target_probs[len(draft_ids)], 1, generator=generator).item())
    return tokens
    # END EXERCISE


class RejectionSampler:
    """The sampler of a step that verifies drafts: sequence i has 1 + len(drafts[i]) rows of logits, in order, and
    gets the drafts it keeps followed by one token of the target's own."""

    def __call__(
        self,
        logits: torch.Tensor,
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None],
        md: SamplingMetadata,
    ) -> list[list[int]]:
        """draft_probs[i]: the draft model's distributions of drafts[i] ([k, V]), None for looked-up drafts; md: the
        sampling settings per row (each sequence's repeated over its rows)."""
        greedy_ids = logits.argmax(dim=-1).tolist()
        probs = None if md.all_greedy else probabilities(logits, md)
        temperatures, out, row = md.temperatures.tolist(), [], 0
        for ids, q in zip(drafts, draft_probs):
            rows = slice(row, row + 1 + len(ids))
            if temperatures[row] == 0:
                out.append(greedy_accept(greedy_ids[rows], ids))
            else:
                out.append(rejection_sample(probs[rows], ids, q, md.generators.get(row)))
            row = rows.stop
        return out
