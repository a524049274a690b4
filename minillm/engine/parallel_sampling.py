"""Parallel sampling: n > 1 answers to one prompt (chapter 16). As in vLLM V1 (vllm/v1/engine/parallel_sampling.py)
the front end sends such a request as n child requests, "0_<id>" to "<n-1>_<id>", each with a seed of its own. Unlike
vLLM V1, which counts on the prefix cache to share the prompt's full blocks, the children here share all of it, the
last, partly filled block included, as vLLM V0 did: children 1.. name child 0 (`fork_of`) and wait in the engine
core until child 0's prompt ends; the step that samples its first token samples theirs from the same logits row, and
each child then holds child 0's blocks (BlockManager.fork). A child copies a shared block only when it writes into
it (copy-on-write, BlockManager.copy_on_write), so the prompt's keys and values are computed once and held once."""

from dataclasses import replace

from msgspec.structs import replace as with_fields

from minillm.engine.messages import EngineCoreRequest
from minillm.engine.sequence import Sequence, SequenceStatus, finish_reason

_INT64 = 1 << 64


def child_requests(request: EngineCoreRequest) -> list[EngineCoreRequest]:
    """The n requests the engine core runs for a request with n answers (itself, if n is 1). A seeded request's
    children get seeds seed, seed + 1, ...: reproducible, and different from one another."""
    sp, n = request.sampling_params, request.sampling_params.n
    if n == 1:
        return [request]
    ids = [f"{i}_{request.request_id}" for i in range(n)]
    seed = lambda i: None if sp.seed is None else (sp.seed + i + _INT64 // 2) % _INT64 - _INT64 // 2  # stays an int64
    return [
        with_fields(
            request, request_id=ids[i], sampling_params=replace(sp, seed=seed(i)), fork_of=ids[0] if i else None
        )
        for i in range(n)
    ]


def split_request_id(request_id: str, n: int) -> tuple[int, str]:
    """(index, parent request id) of a child request's id ("2_17" -> (2, "17")); (0, request_id) when n is 1."""
    if n == 1:
        return 0, request_id
    index, parent = request_id.split("_", 1)
    return int(index), parent


def wait_for_fork(requests: dict[str, Sequence], seq: Sequence, fork_of: str | None) -> bool:
    """In the engine core: make seq wait for the sibling it forks from, if that one's prompt has not ended yet (its
    first token not sampled). False if seq must run on its own (no such sibling any more, or too late to share)."""
    parent = requests.get(fork_of) if fork_of else None
    if parent is None or parent.is_finished or parent.num_completion_tokens or parent.spec_token_ids:
        return False
    parent.forks.append(seq)
    return True


def fork(scheduler, parent: Sequence, child: Sequence, token: int) -> None:
    """Start child as a copy of parent at the end of parent's prompt, with its first token: parent's blocks (shared),
    its cache counts, and a place among the running requests. Called before the step's tokens are recorded, while
    parent's blocks hold exactly its prompt's keys and values."""
    scheduler.block_manager.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens + parent.num_scheduled_tokens
    child.num_cached_tokens, child.num_prompt_cached_tokens = parent.num_cached_tokens, parent.num_prompt_cached_tokens
    child.token_ids.append(token)
    child.status = SequenceStatus.RUNNING
    scheduler.running.append(child)
    child.finish_reason = finish_reason(child, scheduler.eos_token_ids)
    if child.finish_reason:
        child.status = SequenceStatus.FINISHED
        scheduler.block_manager.deallocate(child)
        scheduler.running.remove(child)


def release_forks(scheduler, parent: Sequence) -> None:
    """parent ends before its prompt did (aborted, failed): its waiting children run on their own."""
    for child in parent.forks:
        if not child.is_finished:
            scheduler.add(child)
    parent.forks = []
