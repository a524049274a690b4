"""The scheduler's two queues (vLLM V1's request queues): `waiting`, in queue order (arrival, or priority then
arrival), and `running`, the admitted requests holding blocks; and how a request moves between them: admitted,
preempted or rolled back to be recomputed, aborted."""

from bisect import insort
from collections import deque

from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence, SequenceStatus


class RequestQueues:
    waiting: deque[Sequence]  # in queue order (queue_key); none of them holds blocks
    running: deque[Sequence]  # admitted: holding blocks, decoding or part-way through a prompt
    block_manager: BlockManager
    policy: str  # "fcfs" or "priority"
    num_preemptions: int  # how many times a running sequence was sent back to be recomputed

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def queue_key(self, seq: Sequence):
        """Waiting order: by arrival (FCFS), or by priority (higher first) and then arrival."""
        return (-seq.priority, seq.seq_id) if self.policy == "priority" else (seq.seq_id,)

    def add(self, seq: Sequence) -> None:
        insort(self.waiting, seq, key=self.queue_key)

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
        seq.status, seq.spec_token_ids, seq.draft_token_ids, seq.spec_probs = SequenceStatus.WAITING, [], [], None
        self.add(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop an unfinished request: out of its queue, its blocks freed."""
        self.release(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"

    def rollback(self, seqs: list[Sequence]) -> None:
        """Undo a step that failed: its sequences go back to waiting, to be recomputed; freeing their blocks forgets
        the hashes scheduling gave the blocks the step was to fill (`deallocate`). A sequence the step had already
        finished is released completely (the fault may have come half-way)."""
        for seq in seqs:
            if seq.is_finished:
                if seq.block_table:
                    self.block_manager.deallocate(seq)
                if seq in self.running:
                    self.running.remove(seq)
            else:
                self.requeue(seq)  # not a preemption: nothing chose to evict it
