"""The sampling half of a step, on the rank that samples: from the logits of the rows that sample to each sequence's
new tokens. Chapter 16 adds three things around the sampler, as vLLM V1's model runner does: a request's grammar
masks its rows first (structured outputs: every token that would leave the grammar gets -inf); the log-probability
of every new token, and of the likeliest alternatives, is read from the model's logits before temperature,
penalties or truncation (vLLM's default, raw logprobs), but after a grammar's mask, as in vLLM V1 (a token the grammar
forces gets probability 1); and a request with n > 1 samples its children's first tokens from its own last prompt
row, so that the children start with the prompt's keys and values computed once (minillm.engine.parallel_sampling).
"""

from itertools import accumulate

import torch

from minillm.engine.input_batch import StepInputs
from minillm.engine.scheduler_output import ModelRunnerOutput
from minillm.engine.sequence import Sequence
from minillm.utils.compile import compiled_layers
from minillm.utils.parallel import cpu_threads


def sample_step(
    runner, seqs: list[Sequence], sampled: list[Sequence], logits: torch.Tensor | None
) -> ModelRunnerOutput:
    """The tokens of a step that ran over `seqs`, from the logits of the rows of `sampled` (one row each, or one per
    draft and one more where the step verifies drafts, chapter 13)."""
    verify = any(seq.spec_token_ids for seq in sampled)
    starts = (
        list(accumulate((1 + len(seq.spec_token_ids) for seq in sampled[:-1]), initial=0))
        if verify
        else range(len(sampled))
    )
    if sampled and any(seq.grammar for seq in sampled):
        mask_rows(runner, logits, sampled, starts)
    parents = [(seq, start) for seq, start in zip(sampled, starts) if seq.forks and not seq.num_completion_tokens]
    wanted = [seq.sampling_params.logprobs is not None for seq in sampled + [c for p, _ in parents for c in p.forks]]
    raw = logits.float().log_softmax(dim=-1) if any(wanted) else None  # raw: before any sampling setting (after a mask)
    with compiled_layers(runner.compile_layers):
        if verify:
            md = runner.prepare_sample(sampled, rows_per_draft=True)
            drafts, probs = [seq.spec_token_ids for seq in sampled], [seq.spec_probs for seq in sampled]
            tokens = runner.rejection_sampler(logits, drafts, probs, md)
        else:
            tokens = [[t] for t in runner.sampler(logits, runner.prepare_sample(sampled)).tolist()] if sampled else []
        forked = [
            (child, token, token_logprobs(raw, start, [token], child))
            for parent, start in parents
            for child, token in zip(parent.forks, sample_forks(runner, parent, logits[start]))
        ]
    logprobs = (
        {seq: token_logprobs(raw, start, ids, seq) for seq, start, ids in zip(sampled, starts, tokens)}
        if raw is not None
        else None
    )
    tokens = dict(zip(sampled, tokens))
    output = ModelRunnerOutput(
        [tokens.get(seq, []) for seq in seqs],
        logprobs=[logprobs.get(seq) for seq in seqs] if logprobs is not None else None,
        forked=forked,
        prompt_logprobs={
            seq: prompt_logprobs(runner, seq)
            for seq in sampled
            if seq.sampling_params.prompt_logprobs is not None and not seq.num_completion_tokens
        },
    )
    if runner.drafter is not None:
        with cpu_threads(runner.platform.threads), compiled_layers(runner.compile_layers):
            output.draft_token_ids, output.draft_probs = runner.propose(seqs, output.sampled_token_ids)
    return output


def sample_forks(runner, parent: Sequence, row: torch.Tensor) -> list[int]:
    """The first tokens of parent's children (n > 1), each drawn from parent's last prompt row with its own sampling
    parameters and seed."""
    children = parent.forks
    return runner.sampler(row.expand(len(children), -1), runner.prepare_sample(children)).tolist()


def mask_rows(runner, logits: torch.Tensor, sampled: list[Sequence], starts: list[int]) -> None:
    """Structured outputs: each grammar-bound request's rows get its grammar's token bitmask, in place. A row after
    a draft is masked by the grammar's state once that draft is accepted (the drafts were checked against the
    grammar when they were proposed), then the grammar is rolled back."""
    from minillm.structured_output import apply_bitmask_inplace

    bitmask, indices = runner.structured_output.allocate_bitmask(logits.shape[0]), []  # bitmask row r: logits row r
    for seq, start in [(seq, start) for seq, start in zip(sampled, starts) if seq.grammar]:
        grammar, drafts = seq.grammar, seq.spec_token_ids
        for j in range(len(drafts) + 1):
            grammar.fill_bitmask(bitmask, start + j)
            indices.append(start + j)
            if j < len(drafts):
                grammar.accept_tokens([drafts[j]])
        grammar.rollback(len(drafts))
    apply_bitmask_inplace(logits, bitmask, indices)


def prompt_logprobs(runner, seq: Sequence) -> list:
    """vLLM's prompt_logprobs, when seq's prompt has just been computed: for each prompt token after the first, its
    logprob given the tokens before it and the `prompt_logprobs` likeliest alternatives. One more forward pass over
    the prompt that writes no keys or values (every slot -1) and keeps the logits of every position, so the prefix
    cache and the chunks the prompt ran in change nothing."""
    ids = seq.token_ids[: seq.num_prompt_tokens]
    n = len(ids)
    inputs = StepInputs(True, ids, list(range(n)), [-1] * n, None, [0, n], [0, n], list(range(n - 1)))
    with cpu_threads(runner.platform.threads):
        raw = runner.execute(inputs).float().log_softmax(dim=-1)
    return token_logprobs(raw, 0, ids[1:], seq, seq.sampling_params.prompt_logprobs)


def token_logprobs(
    raw: torch.Tensor, start: int, token_ids: list[int], seq: Sequence, k: int | None = -1
) -> list | None:
    """For each of seq's new tokens (token i from row start + i): (ids, logprobs, rank), the chosen token first,
    then the seq's `logprobs` likeliest tokens (k of them, if given); rank is the chosen token's place in the
    vocabulary (1 = likeliest). None where seq asked for none."""
    k = seq.sampling_params.logprobs if k == -1 else k
    if raw is None or k is None or not token_ids:
        return None
    rows = raw[start : start + len(token_ids)]
    chosen = torch.tensor(token_ids, device=raw.device)[:, None]
    chosen_lp = rows.gather(1, chosen)
    ranks = (rows > chosen_lp).sum(dim=-1) + 1
    top_lp, top_ids = rows.topk(k, dim=-1) if k else (rows[:, :0], chosen[:, :0])
    ids, lps = torch.cat([chosen, top_ids], dim=1).tolist(), torch.cat([chosen_lp, top_lp], dim=1).tolist()
    return [(i, lp, r) for i, lp, r in zip(ids, lps, ranks.tolist())]
