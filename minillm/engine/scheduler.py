"""Scheduler: which sequences run in the next step, and what happens to them after it.

A step is mixed, as in vLLM V1: every running sequence decodes one token, and in what is left of the token budget
(max_num_batched_tokens) waiting sequences are admitted while the batch has a seat (max_num_seqs) and the KV
cache has blocks; a prompt longer than what is left is prefilled in chunks over several steps (each at most
long_prefill_token_threshold tokens, if set), so an arriving prompt never stalls the running ones. With
mixed_steps=False a step is all prefill (prompts first) or all decode.
A new request is admitted only while the cache keeps room for part of its own and the running ones'
growth (new_token_ratio); when it runs out anyway during decode, a sequence is preempted: its blocks are
freed and it waits to be recomputed (its prefix blocks often survive in the prefix cache). A step that fails is rolled back: the
blocks it was to fill stop being findable by hash, and its sequences are preempted.
"""

from bisect import bisect_right
from collections import deque

from minillm.config import Config
from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence, SequenceStatus


def finish_reason(seq: Sequence, eos_token_ids: set[int]) -> str | None:
    """Why seq stops after its newest token: "stop" (EOS or a stop token), "length" (max_tokens), or None."""
    sp, token = seq.sampling_params, seq.last_token
    if (token in eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
        return "stop"
    return "length" if seq.num_completion_tokens >= sp.max_tokens else None


class Scheduler:
    def __init__(self, config: Config, block_manager: BlockManager, eos_token_ids: list[int]):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.mixed_steps = config.mixed_steps
        self.long_prefill_token_threshold = config.long_prefill_token_threshold
        self.policy = config.scheduling_policy
        self.new_token_ratio = config.new_token_ratio
        self.block_manager = block_manager
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0  # how many times a running sequence was sent back to be recomputed

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def queue_key(self, seq: Sequence):
        """Waiting order: by arrival (FCFS), or by priority (higher first) and then arrival."""
        return (-seq.priority, seq.seq_id) if self.policy == "priority" else (seq.seq_id,)

    def add(self, seq: Sequence) -> None:
        """Queue seq in policy order, behind a partly prefilled sequence (it holds blocks and must finish)."""
        pos = bisect_right(self.waiting, self.queue_key(seq), key=self.queue_key)
        if self.waiting and self.waiting[0].block_table:
            pos = max(pos, 1)
        self.waiting.insert(pos, seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step, each with num_scheduled_tokens set, and whether it prefills (a
        prefill or a mixed step: decode tokens first, then prompt chunks) or only decodes (each running sequence's
        newest token, and the drafts after it, chapter 13)."""
        if self.policy == "priority":
            self.preempt_for_priority()
        if self.mixed_steps:
            preemptions = self.num_preemptions
            decodes = self.schedule_decode()
            # as vLLM: a step that had to preempt admits no one (the victim would be readmitted at once)
            used = sum(seq.num_scheduled_tokens for seq in decodes)
            budget = self.max_num_batched_tokens - used if self.num_preemptions == preemptions else 0
            prefills = self.schedule_prefill(budget)
        else:
            decodes, prefills = [], self.schedule_prefill(self.max_num_batched_tokens)
            if not prefills:
                decodes = self.schedule_decode()
        for seq in prefills:  # what the output reports: the prompt's cache hits at its first admission
            if seq.num_prompt_cached_tokens is None:
                seq.num_prompt_cached_tokens = seq.num_cached_tokens
        return decodes + prefills, bool(prefills)

    def preempt_for_priority(self) -> None:
        """Under the priority policy, a waiting request that cannot be admitted (no seat or no blocks) preempts
        running requests of lower priority, lowest first, until it can."""
        while self.waiting and self.running:
            head, victim = self.waiting[0], max(self.running, key=self.queue_key)
            has_room = len(self.running) < self.max_num_seqs and (head.block_table or self.can_admit(head))
            if has_room or victim.priority >= head.priority:
                return
            self.preempt(victim)

    def can_admit(self, seq: Sequence) -> bool:
        """Whether a new (or preempted) seq may take blocks for its tokens now: they fit with room for
        new_token_ratio of its remaining max_tokens and of every running sequence's, so that admitting seq does
        not force a preemption (a recomputation from scratch) some steps later."""
        bm, ratio = self.block_manager, self.new_token_ratio
        growth = sum(
            max(0, bm.num_blocks(len(s) + int(ratio * s.remaining_tokens)) - len(s.block_table)) for s in self.running
        )
        return bm.num_free_blocks >= bm.num_blocks(len(seq) + int(ratio * seq.remaining_tokens)) + growth

    def schedule_prefill(self, budget: int) -> list[Sequence]:
        """The waiting sequences this step prefills, in order, each with `num_scheduled_tokens` set ([] if none),
        in at most `budget` tokens (what the step's decode tokens left of max_num_batched_tokens).

        Loop while `self.waiting` is not empty, fewer than `self.max_num_seqs` sequences are in `self.running`
        (a free seat), and `budget` is above 0. Always
        look at the head, `seq = self.waiting[0]`; never skip it, so nobody overtakes a request that waits.
        1. If `seq.block_table` is empty (new, or preempted), it needs blocks: stop the loop if
           `self.can_admit(seq)` is False (the cache is full, or would be once the running sequences grow: it
           stays first in waiting, with no block_table). Otherwise `self.block_manager.allocate(seq)` (this sets `seq.num_cached_tokens`,
           the prefix-cache hit) and start `seq.num_computed_tokens` there, but at most `len(seq) - 1`: the
           last token is always computed, as its logits give the next token. A head that already has a
           block_table is a long prompt part-way through its chunks: do not allocate it again.
        2. Schedule `seq.num_scheduled_tokens = min(len(seq) - seq.num_computed_tokens, budget)`, and at most
           `self.long_prefill_token_threshold` if that is above 0 (a cap that keeps every step short), and take
           them off the budget. Make the blocks this step fills findable by their hash:
           `self.block_manager.cache_blocks(seq, seq.num_computed_tokens + seq.num_scheduled_tokens)`.
        3. Add seq to the returned list. If the step does not reach its end (`seq.samples_this_step` is
           False), it is a chunk: stop the loop; seq stays first in `waiting` with its blocks and continues
           next step. Otherwise move it from `waiting` (popleft) to the end of `running` and set `seq.status`
           to SequenceStatus.RUNNING.
        Do not touch `num_computed_tokens` after scheduling: `postprocess` advances it once the step ran.

        Examples (blocks of 4 tokens, new_token_ratio 0, where can_admit asks only that the prompt fit): with
        max_num_seqs=2 and prompts of 10, 11 and 12 tokens, one step admits the first two (both RUNNING, each
        with a block_table) and the third stays in waiting. With a budget of 8, a 20-token prompt is scheduled
        as 8, 8 and 4 over three steps (only the last samples); with a budget of 100 and a threshold of 8, the
        same. With 3 free blocks, prompts of 8 and 8 tokens:
        the first takes 2 blocks and runs; the second cannot be allocated, so the step returns only the first
        and the second waits with an empty block_table.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 06.2: prefill selection — admit waiting sequences under the sequence, token and block budgets
        scheduled, cap = [], self.long_prefill_token_threshold
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not seq.block_table:
                if not self.can_admit(seq):
                    break
                self.block_manager.allocate(seq)
                seq.num_computed_tokens = min(seq.num_cached_tokens, len(seq) - 1)  # always compute one token
            seq.num_scheduled_tokens = min(len(seq) - seq.num_computed_tokens, budget, cap or budget)
            budget -= seq.num_scheduled_tokens
            self.block_manager.cache_blocks(seq, seq.num_computed_tokens + seq.num_scheduled_tokens)
            scheduled.append(seq)
            if not seq.samples_this_step:
                break  # a chunk of a long prompt: the rest comes in the next steps
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        return scheduled
        # END EXERCISE

    def schedule_decode(self) -> list[Sequence]:
        """One token for each running sequence (up to max_num_seqs), preempting when the cache is full; and its
        draft tokens to verify (chapter 13), as far as the token budget and the free blocks allow (drafts are
        dropped rather than cause a preemption)."""
        scheduled, running = [], list(self.running)[: self.max_num_seqs]
        spare = self.max_num_batched_tokens - len(running)  # the budget beyond one token per sequence
        for seq in running:
            del seq.spec_token_ids[max(spare, 0) :]
            if not self.block_manager.can_append(seq):
                seq.spec_token_ids = []
            if seq.status == SequenceStatus.RUNNING and self.make_room(seq):
                self.block_manager.may_append(seq)
                seq.num_scheduled_tokens = 1 + len(seq.spec_token_ids)
                spare -= len(seq.spec_token_ids)
                self.block_manager.cache_blocks(seq, len(seq))
                scheduled.append(seq)
        return [seq for seq in scheduled if seq.status == SequenceStatus.RUNNING]  # a victim may be among them

    def make_room(self, seq: Sequence) -> bool:
        """Preempt running sequences until seq's next token has a cache slot. Returns True if seq can run this
        step, False if seq itself was preempted.

        seq is a RUNNING sequence about to decode one token (`schedule_decode` calls this for each running
        sequence in turn); a new block is needed every block_size tokens. Loop while
        `self.block_manager.can_append(seq)` is False: pick the victim, the running sequence that the waiting
        order puts last, `max(self.running, key=self.queue_key)`: the latest arrival under FCFS; the lowest
        priority, then the latest arrival, under the priority policy. Every sequence in `self.running` is a
        candidate, one already scheduled in this step and seq itself included. Call `self.preempt(victim)`:
        it frees the victim's blocks (its block_table becomes []), sets its status to
        SequenceStatus.WAITING and puts it back in `self.waiting` in queue order, to be recomputed later. If
        the victim is seq (compare with `is`), return False at once; otherwise check again. Return True once
        can_append says yes (at once if a block is free or seq's last block has room).

        Example (priority policy, 3 blocks of 2 tokens): `low` (priority 0) and `high` (priority 5), prompts
        of 2 tokens, are prefilled and each sampled a token (1 block each, 3 tokens each). Decoding needs a
        second block for both, but 1 is free: `high` gets it; for `low`, the victim is `low` itself, so low
        is WAITING, first in waiting, with an empty block_table, and make_room(low) returns False; high stays
        RUNNING with 2 blocks in its block_table.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 06.3: preemption — free the least important running sequence until seq fits
        while not self.block_manager.can_append(seq):
            victim = max(self.running, key=self.queue_key)
            self.preempt(victim)
            if victim is seq:
                return False
        return True
        # END EXERCISE

    def release(self, seq: Sequence) -> None:
        """Free seq's blocks and take it out of its queue."""
        self.block_manager.deallocate(seq)
        (self.running if seq.status == SequenceStatus.RUNNING else self.waiting).remove(seq)

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and queue it to be recomputed from its tokens so far (counted in num_preemptions)."""
        self.num_preemptions += 1
        self.requeue(seq)

    def requeue(self, seq: Sequence) -> None:
        """Free seq's blocks and put it back in waiting, in queue order."""
        self.release(seq)
        seq.status, seq.spec_token_ids = SequenceStatus.WAITING, []
        self.add(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop an unfinished request: out of its queue, its blocks freed."""
        self.release(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"

    def rollback(self, seqs: list[Sequence]) -> None:
        """Undo a step that failed: its sequences go back to waiting, to be recomputed. Scheduling made the blocks
        it was to fill findable by hash (so that requests admitted together share a prefix: every layer stores a
        step's keys before any attends); freeing them forgets those hashes (`deallocate`), as their contents may
        never have been written. A sequence the step had already finished is released completely (the fault may
        have come half-way)."""
        for seq in seqs:
            if seq.is_finished:
                if seq.block_table:
                    self.block_manager.deallocate(seq)
                if seq in self.running:
                    self.running.remove(seq)
            else:
                self.requeue(seq)  # not a preemption: nothing chose to evict it

    def accept_drafts(self, seqs: list[Sequence], token_ids: list[int | None]) -> list[int | None]:
        """Record the drafts a step verified (speculative decoding), before `postprocess`; returns the token_ids
        postprocess is to append (the same, but where a kept draft ends the request).

        The step ran each sequence over its newest token and its drafts: seq.num_scheduled_tokens is 1 + the
        number of drafts scheduled, and their keys and values are in the cache at the positions after
        seq.num_computed_tokens. The sampler has left in `seq.spec_token_ids` the drafts it kept (a prefix of
        them, maybe none) and `token_ids[i]` is the target's own token after them. For each sequence whose
        token is not None and whose step went past its end (num_computed_tokens + num_scheduled_tokens >
        len(seq): drafts were scheduled):
        1. append the kept drafts to seq.token_ids one by one; if one ends the request (`finish_reason(seq,
           self.eos_token_ids)` is not None after it is appended: a stop token, EOS), take it off again and
           make it this sequence's token in the returned list, dropping the kept drafts after it and the
           target's token;
        2. roll back the rest: set `seq.num_scheduled_tokens = len(seq) - seq.num_computed_tokens`, so that
           postprocess advances num_computed_tokens past the kept tokens only (the rejected drafts' keys and
           values stay in their slots, to be overwritten: they are no longer counted as computed), give back the
           blocks past what the sequence will hold after postprocess appends its token,
           `self.block_manager.free_tail(seq, len(seq) + 1)`, and empty seq.spec_token_ids.
        Other sequences (a prompt's chunk, a decode without drafts) keep their token as it is.

        Example, blocks of 4: a running sequence of 6 tokens (num_computed_tokens 5) verified 3 drafts
        (num_scheduled_tokens 4; blocks for 9 tokens: 3); the sampler kept 1 draft, 40, and gave token 41. Then
        its tokens are the 6 and 40 (7), num_scheduled_tokens is 2, its block_table 2 blocks (for 8 tokens); it
        returns [41], and postprocess makes it 8 tokens with
        num_computed_tokens 7. Had 40 been the EOS id, it would return [40] with tokens the 6 only.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 13.4: KV rollback — keep the accepted drafts, uncount and free what the rejected ones used
        token_ids = list(token_ids)
        for i, (seq, token) in enumerate(zip(seqs, token_ids)):
            if token is None or seq.num_computed_tokens + seq.num_scheduled_tokens <= len(seq):
                continue
            kept, seq.spec_token_ids = seq.spec_token_ids, []
            for draft in kept:
                seq.token_ids.append(draft)
                if finish_reason(seq, self.eos_token_ids):  # a kept draft ends the request: it is the last token
                    token_ids[i] = seq.token_ids.pop()
                    break
            seq.num_scheduled_tokens = len(seq) - seq.num_computed_tokens
            self.block_manager.free_tail(seq, len(seq) + 1)
        return token_ids
        # END EXERCISE

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> list[Sequence]:
        """Record a step that ran: `seqs` are the sequences it computed and `token_ids[i]` is the token sampled
        for `seqs[i]` (an int), or None for a prefill chunk that did not reach the end of its prompt. Returns
        the sequences that got a new token, in order.

        For each sequence and its token, in order:
        1. advance `seq.num_computed_tokens` by `seq.num_scheduled_tokens` (the keys and values of those
           tokens are now in the cache), for every sequence, chunks included;
        2. if the token is None, nothing more: the chunk keeps its blocks and stays where it is;
        3. otherwise append the token to `seq.token_ids` (so it shows in `seq.completion_token_ids`) and add
           seq to the returned list;
        4. set `seq.finish_reason = finish_reason(seq, self.eos_token_ids)`: "stop" (an EOS token unless
           sampling_params.ignore_eos, or one of stop_token_ids), "length" (max_tokens reached), or None.
           If it is not None the sequence is done: status SequenceStatus.FINISHED, its blocks given back with
           `self.block_manager.deallocate(seq)` (its block_table becomes []), and removed from
           `self.running`. That free seat is what the next step refills.

        Example, EOS id 0: three sequences scheduled together, prompts [1, 2], [3] with max_tokens=1, and
        [5, 6, 7] cut to a 2-token chunk, with token_ids [0, 9, None]: the first finishes with "stop" and
        completion_token_ids [0], block_table []; the second with "length" and [9]; the third gets no token,
        has num_computed_tokens 2, finish_reason None, and is the only one left in running.
        Returns the first two.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 06.4: postprocess — append each sampled token, finish on EOS / stop token / max_tokens, free
        updated = []
        for seq, token in zip(seqs, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            if token is None:  # a prefill chunk that did not reach the end of the prompt
                continue
            seq.token_ids.append(token)
            updated.append(seq)
            seq.finish_reason = finish_reason(seq, self.eos_token_ids)
            if seq.finish_reason:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
        return updated
        # END EXERCISE
