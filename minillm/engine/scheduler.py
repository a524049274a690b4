"""Scheduler: which requests run in the next step (`schedule()`, a `SchedulerOutput`), and what happens to them
after it (`update_from_output()`), as vLLM V1's. Every running request has work in every step: its next token (a
full cache preempts the request last in queue order), then its drafts (chapter 13), or the next chunk of its
prompt. Waiting requests are admitted in what is left of the token budget while there is a seat and the cache
keeps room for everyone's growth; an admitted request holds blocks, so it is running, even part-way through its
prompt. A step that fails is rolled back: its requests wait to be recomputed. Under pipeline parallelism (chapter 15)
several batches are in flight at once; a plan leaves out the requests of those (`in_flight`), whose tokens are not
back yet."""

from collections import deque

from minillm.config import Config
from minillm.engine.block_manager import BlockManager
from minillm.engine.pipeline import held_back
from minillm.engine.request_queue import RequestQueues
from minillm.engine.scheduler_output import SchedulerOutput
from minillm.engine.sequence import Sequence, SequenceStatus, finish_reason


class Scheduler(RequestQueues):
    def __init__(self, config: Config, block_manager: BlockManager, eos_token_ids: list[int]):
        self.max_num_seqs, self.max_num_batched_tokens = config.max_num_seqs, config.max_num_batched_tokens
        self.mixed_steps, self.long_prefill_token_threshold = config.mixed_steps, config.long_prefill_token_threshold
        self.policy, self.new_token_ratio = config.scheduling_policy, config.new_token_ratio
        self.block_manager = block_manager
        spec = config.speculative_config or {}  # a draft model writes keys and values past the tokens a step verifies
        self.num_lookahead_tokens = spec["num_speculative_tokens"] if spec.get("method") == "draft_model" else 0
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Sequence] = deque()  # in queue order (queue_key); none of them holds blocks
        self.running: deque[Sequence] = deque()  # admitted: holding blocks, decoding or part-way through a prompt
        self.num_preemptions = 0  # how many times a running sequence was sent back to be recomputed
        self.in_flight: set[Sequence] = set()  # running requests of the batches in flight (pipeline parallelism)
        self.held: list[Sequence] = []  # while a plan is made: the running requests it leaves out (pipeline.held_back)

    def schedule(self, max_seqs: int | None = None) -> SchedulerOutput:
        """The next step's plan, never empty while a request is unfinished: the running requests' work (their next
        tokens, their drafts, the next chunks of their prompts), then waiting requests in what is left of the token
        budget. As in vLLM, a step that had to preempt admits no one (the victim would be readmitted at once),
        unless it would otherwise be empty. Under pipeline parallelism the plan leaves out the requests in flight
        (it may then be empty) and takes at most `max_seqs` requests, leaving the others to the next batches."""
        if not self.in_flight and max_seqs is None:
            return self.plan()
        with held_back(self, max_seqs):
            return self.plan()

    def plan(self) -> SchedulerOutput:
        """`schedule`'s plan over the running requests in `running` (see held_back)."""
        if self.policy == "priority":
            self.preempt_for_priority()
        preemptions, budget, decodes, chunks, new = self.num_preemptions, self.max_num_batched_tokens, [], [], []
        if self.mixed_steps or not self.has_prompt_work():
            decodes = self.schedule_decode()
            budget -= len(decodes) + self.schedule_drafts(decodes, budget - len(decodes))
        if self.mixed_steps or not decodes:
            chunks = self.schedule_chunks(budget)
            budget -= sum(seq.num_scheduled_tokens for seq in chunks)
            if self.num_preemptions == preemptions or not (decodes or chunks):
                new = self.schedule_prefill(budget)
        for seq in new:  # what the output reports: the prompt's cache hits at its first admission
            if seq.num_prompt_cached_tokens is None:
                seq.num_prompt_cached_tokens = seq.num_cached_tokens
        for seq in [s for s in decodes + chunks + new if s.samples_this_step] if self.num_lookahead_tokens else []:
            # chapter 13: blocks, as many as are free, for the keys and values a draft model writes past the step
            self.block_manager.append_free(seq, len(seq) + len(seq.spec_token_ids) + self.num_lookahead_tokens)
        return SchedulerOutput(new, decodes + chunks, self.block_manager.take_copies())

    def has_prompt_work(self) -> bool:
        """Whether a prompt chunk could run now (with mixed_steps=False such a step comes before any decode)."""
        fits = self.waiting and len(self.running) < self.max_num_seqs and self.can_admit(self.waiting[0])
        return bool(fits) or not all(seq.is_decoding for seq in self.running)

    def preempt_for_priority(self) -> None:
        """Under the priority policy, a waiting request that cannot be admitted (no seat or no blocks) preempts
        running requests of lower priority, lowest first, until it can."""
        while self.waiting and self.running:
            head, victim = self.waiting[0], max(self.running, key=self.queue_key)
            if (len(self.running) < self.max_num_seqs and self.can_admit(head)) or victim.priority >= head.priority:
                return
            self.preempt(victim)

    def can_admit(self, seq: Sequence) -> bool:
        """Whether a new (or preempted) seq may take blocks for its tokens now: they fit with room for
        new_token_ratio of its remaining max_tokens and of every running sequence's, so that admitting seq does
        not force a preemption (a recomputation from scratch) some steps later."""
        bm, ratio = self.block_manager, self.new_token_ratio
        growth = sum(
            max(0, bm.num_blocks(len(s) + int(ratio * s.remaining_tokens)) - len(s.block_table))
            for s in (*self.running, *self.held)
        )
        return bm.num_free_blocks >= bm.num_blocks(len(seq) + int(ratio * seq.remaining_tokens)) + growth

    def chunk_size(self, seq: Sequence, budget: int) -> int:
        """How many of seq's uncomputed tokens a step may take: all, but at most `budget` and, if it is above 0,
        long_prefill_token_threshold (vLLM's cap on one prompt's chunk, which keeps every step short)."""
        cap = self.long_prefill_token_threshold or budget
        return min(len(seq) - seq.num_computed_tokens, budget, cap)

    def schedule_prefill(self, budget: int) -> list[Sequence]:
        """Admit waiting sequences into the step, in order, each with `num_scheduled_tokens` set ([] if none), in at
        most `budget` tokens (what the running requests left of max_num_batched_tokens).

        Loop while `self.waiting` is not empty, fewer than `self.max_num_seqs` sequences are in `self.running`
        (a free seat), and `budget` is above 0. Always look at the head, `seq = self.waiting[0]`; never skip it, so
        nobody overtakes a request that waits. A waiting sequence holds no blocks (new, or preempted).
        1. Stop the loop if `self.can_admit(seq)` is False (the cache is full, or would be once the running
           sequences grow: seq stays first in waiting). Otherwise `self.block_manager.allocate(seq)` (this sets
           `seq.num_cached_tokens`, the prefix-cache hit) and start `seq.num_computed_tokens` there, but at most
           `len(seq) - 1`: the last token is always computed, as its logits give the next token.
        2. Schedule `seq.num_scheduled_tokens = self.chunk_size(seq, budget)` (its uncomputed tokens, at most the
           budget and the per-prompt cap) and take them off the budget. Make the blocks this step fills findable
           by their hash: `self.block_manager.cache_blocks(seq, seq.num_computed_tokens + seq.num_scheduled_tokens)`.
        3. Move seq from `waiting` (popleft) to the end of `running`, set `seq.status` to SequenceStatus.RUNNING, and
           add it to the returned list: it runs from now on, even if this step computes only a first chunk of its
           prompt (`update_from_output` advances num_computed_tokens; `schedule_chunks` gives it the next chunks).

        Examples (blocks of 4 tokens, new_token_ratio 0, so can_admit asks only that the prompt fit): max_num_seqs=2
        and prompts of 10, 11 and 12 tokens: the first two are admitted, the third waits. A budget of 8 and prompts
        of 20 and 5 tokens: the first is RUNNING with a chunk of 8, the second waits. 3 free blocks and prompts of
        8 and 8 tokens: the first takes 2 blocks; the second waits, with an empty block_table.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 06.2: prefill selection — admit waiting sequences under the sequence, token and block budgets
        scheduled = []
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not self.can_admit(seq):
                break
            self.block_manager.allocate(seq)
            seq.num_computed_tokens = min(seq.num_cached_tokens, len(seq) - 1)  # always compute one token
            seq.num_scheduled_tokens = self.chunk_size(seq, budget)
            budget -= seq.num_scheduled_tokens
            self.block_manager.cache_blocks(seq, seq.num_computed_tokens + seq.num_scheduled_tokens)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(seq)
        return scheduled
        # END EXERCISE

    def schedule_decode(self) -> list[Sequence]:
        """The first pass: the next token of each running sequence whose prompt is computed, each with a cache slot
        (make_room preempts when there is none; a victim already scheduled drops out of the step)."""
        scheduled = []
        for seq in [seq for seq in self.running if seq.is_decoding]:
            if seq.status == SequenceStatus.RUNNING and self.make_room(seq):
                self.block_manager.may_append(seq)
                seq.num_scheduled_tokens = 1
                self.block_manager.cache_blocks(seq, len(seq))
                scheduled.append(seq)
        return [seq for seq in scheduled if seq.status == SequenceStatus.RUNNING]

    def make_room(self, seq: Sequence) -> bool:
        """Preempt running sequences until seq's next token has a cache slot. Returns True if seq can run this
        step, False if seq itself was preempted.

        seq is a RUNNING sequence about to decode one token (`schedule_decode` calls this for each in turn). Loop while
        `self.block_manager.can_append(seq)` is False: pick the victim, the running sequence that the waiting
        order puts last, `max(self.running, key=self.queue_key)`: the latest arrival under FCFS; the lowest
        priority, then the latest arrival, under the priority policy. Every sequence in `self.running` is a
        candidate: one already scheduled in this step, one part-way through its prompt, and seq itself. Call
        `self.preempt(victim)`: it frees the victim's blocks (its block_table becomes []), sets its status to
        SequenceStatus.WAITING and puts it back in `self.waiting` in queue order, to be recomputed later. If
        the victim is seq (compare with `is`), return False at once; otherwise check again. Return True once
        can_append says yes (at once if a block is free or seq's last block has room).

        Example (priority policy, 3 blocks of 2 tokens): `low` (priority 0) and `high` (priority 5) hold 3 tokens and
        1 block each; both need a second block, 1 is free: `high` gets it; for `low`, the victim is `low` itself:
        make_room(low) returns False, low is WAITING, first in waiting, with an empty block_table.
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

    def schedule_drafts(self, seqs: list[Sequence], budget: int) -> int:
        """The second pass (chapter 13), once every running sequence has its own slot: the drafts each of `seqs` is to
        verify, from its `draft_token_ids` as far as `budget` and the free blocks allow; returns how many."""
        bm, total = self.block_manager, 0
        for seq in filter(lambda seq: seq.draft_token_ids, seqs):
            n = max(0, min(len(seq.draft_token_ids), budget - total, bm.num_free_slots(seq)))
            seq.spec_token_ids, seq.draft_token_ids = seq.draft_token_ids[:n], []  # taken into the plan
            bm.may_append(seq)
            seq.num_scheduled_tokens += n
            total += n
        return total

    def schedule_chunks(self, budget: int) -> list[Sequence]:
        """The next chunk of each running sequence part-way through its prompt, in order, in `budget` tokens."""
        scheduled = []
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.is_decoding:
                seq.num_scheduled_tokens = self.chunk_size(seq, budget)
                budget -= seq.num_scheduled_tokens
                self.block_manager.cache_blocks(seq, seq.num_computed_tokens + seq.num_scheduled_tokens)
                scheduled.append(seq)
        return scheduled

    def update_from_output(self, output: SchedulerOutput, sampled: list[list[int]]) -> list[Sequence]:
        """Record a step that ran (vLLM's name). `sampled[i]` are the tokens the step produced for
        `output.scheduled[i]`: [] for a prompt chunk that did not reach its prompt's end, [t] for one that did and
        for a decode, and in a verify step (chapter 13) the drafts the sampler kept, then the target's own token.
        Returns the sequences that got tokens, in order. For each sequence and its tokens, in order:
        1. advance `seq.num_computed_tokens` by `seq.num_scheduled_tokens` (those keys and values are now in the
           cache), chunks included; if it verified drafts (`seq.spec_token_ids` is not empty), then call
           `self.drop_rejected_drafts(seq, len(tokens) - 1)` (chapter 13: it uncounts the rejected ones);
        2. if tokens is empty, nothing more: the chunk keeps its blocks and stays running;
        3. otherwise add seq to the returned list and append its tokens to `seq.token_ids` one by one; after each,
           set `seq.finish_reason = finish_reason(seq, self.eos_token_ids)`: "stop" (an EOS token unless
           sampling_params.ignore_eos, or one of stop_token_ids), "length" (max_tokens reached), or None. At the
           first that is not None, drop the tokens after it;
        4. if seq finished: status SequenceStatus.FINISHED, its blocks given back with
           `self.block_manager.deallocate(seq)` (its block_table becomes []), and out of `self.running`. That free
           seat is what the next step refills.

        Example, EOS id 0: prompts [1, 2], [3] (max_tokens=1) and [5, 6, 7] cut to a 2-token chunk, scheduled
        together, sampled [[0], [9], []]: the first finishes with "stop", completion_token_ids [0], block_table [];
        the second with "length" and [9]; the third has num_computed_tokens 2 and stays running. Returns the first
        two.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 06.4: update_from_output — append each step's tokens, finish on EOS / stop token / max_tokens, free
        updated = []
        for seq, tokens in zip(output.scheduled, sampled):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            if seq.spec_token_ids:
                self.drop_rejected_drafts(seq, len(tokens) - 1)
            if not tokens:  # a prefill chunk that did not reach the end of the prompt
                continue
            updated.append(seq)
            for token in tokens:
                seq.token_ids.append(token)
                seq.finish_reason = finish_reason(seq, self.eos_token_ids)
                if seq.finish_reason:
                    break
            if seq.finish_reason:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
        return updated
        # END EXERCISE

    def drop_rejected_drafts(self, seq: Sequence, num_accepted: int) -> None:
        """Roll back the drafts a verify step rejected (chapter 13): their keys and values are in the cache, but they
        are not seq's tokens. The step ran seq over its newest token and its k drafts `seq.spec_token_ids`, and
        `update_from_output` has advanced `seq.num_computed_tokens` past all k + 1; the sampler kept the first
        `num_accepted` drafts (0 to k), which update_from_output appends next, with one token of the target's own.
        1. uncount the rejected drafts: subtract k - num_accepted from `seq.num_computed_tokens` (their slots are
           then free to be written again);
        2. give back the blocks past what seq will hold once its new tokens are appended (its len(seq) tokens, the
           kept drafts and the target's token; num_free_blocks grows by as many):
           `self.block_manager.free_tail(seq, len(seq) + num_accepted + 1)`;
        3. empty `seq.spec_token_ids`.

        Example, blocks of 4: a sequence of 6 tokens verified 3 drafts (3 blocks, for 9 tokens); num_computed_tokens
        was advanced from 5 to 9; 1 draft was kept. Then num_computed_tokens is 7 (the newest token and the kept
        draft), the block_table 2 blocks (for the 8 tokens seq will hold), spec_token_ids [].
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 13.4: KV rollback — uncount the rejected drafts and free the blocks only they used
        seq.num_computed_tokens -= len(seq.spec_token_ids) - num_accepted
        self.block_manager.free_tail(seq, len(seq) + num_accepted + 1)
        seq.spec_token_ids = []
        # END EXERCISE
