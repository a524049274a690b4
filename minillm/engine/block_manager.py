"""BlockManager: the KV cache as a pool of fixed-size blocks, shared between sequences by prefix hash.

Each full block is named by a hash of its tokens chained with the hash of the block before it, so equal
hashes mean equal prefixes. A new sequence whose leading blocks hash to blocks already in the cache
reuses them (reference counted) instead of recomputing them. A freed block keeps its contents and hash on
the free list, so a later identical prefix can revive it, until the block is taken for new tokens.
"""

import hashlib
from collections import OrderedDict

import numpy as np

from minillm.engine.sequence import Sequence


def compute_block_hash(token_ids: list[int], prefix_hash: int) -> int:
    """A 64-bit hash of one full block's tokens, chained with the previous block's hash (-1 for the first).

    token_ids: list[int], the block_size tokens of one full block.
    prefix_hash: int, what this function returned for the block before it in the sequence, or -1 for a
    sequence's first block.
    Returns a Python int within 64 bits, signed (-2**63 <= h < 2**63), so that it goes back in as the next
    block's prefix_hash the same way as -1 does. It must be deterministic: the same tokens after the same
    prefix_hash give the same value in every process and every run, so use hashlib (Python's own hash() of
    str and bytes is salted per process). It must differ when the tokens, their order or the prefix_hash
    differ (up to a negligible chance of collision, which `allocate` guards against): since the
    prefix_hash goes in, equal hashes mean equal whole prefixes, not only equal blocks.

    Example: h1 = compute_block_hash([1, 2, 3, 4], -1) names that block at the start of a sequence;
    compute_block_hash([5, 6, 7, 8], h1), the block [5, 6, 7, 8] right after it, differs from
    compute_block_hash([5, 6, 7, 8], -1); and compute_block_hash([1, 2, 4, 3], -1) != h1.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 05.3: chained block hash — hash the previous block's hash together with this block's tokens
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=True))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)
    # END EXERCISE


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1  # -1: not (yet) a full, computed block that others may reuse
        self.token_ids: list[int] = []


class FreeBlockQueue:
    """The free blocks, least recently freed first, with O(1) append, pop of the oldest and removal from the
    middle (a cached block revived by a prefix hit leaves from wherever it is). vLLM keeps a linked list of
    the same name; an OrderedDict is one."""

    def __init__(self, block_ids):
        self._ids = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self):
        return iter(self._ids)

    def append(self, block_id: int) -> None:
        self._ids[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._ids[block_id]

    def oldest(self) -> int:
        return next(iter(self._ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, hash_fn=None):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn or compute_block_hash  # tests may pass a colliding one
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids = FreeBlockQueue(range(num_blocks))  # oldest freed first: evicted first
        self.used_block_ids: set[int] = set()
        self.copies: list[tuple[int, int]] = []  # copy_on_write's, for the next step (take_copies)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _take(self, block_id: int) -> Block:
        """Move a block from the free list to use, keeping its contents (a revived cached block)."""
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        block = self.blocks[block_id]
        block.ref_count = 1
        return block

    def _take_new(self) -> Block:
        """The least recently freed block, emptied: its old contents stop being findable by hash."""
        block = self._take(self.free_block_ids.oldest())
        self._forget(block)
        return block

    def _forget(self, block: Block) -> None:
        """Make a block's old contents unfindable by hash."""
        if self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids = -1, []

    def num_blocks(self, num_tokens: int) -> int:
        """Blocks needed to hold num_tokens tokens."""
        return (num_tokens + self.block_size - 1) // self.block_size

    def block_tokens(self, seq: Sequence, i: int) -> list[int]:
        """The token ids that fill block i of seq (the last block may be partial)."""
        return seq.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free_blocks >= self.num_blocks(len(seq))

    def allocate(self, seq: Sequence) -> None:
        """Give seq a block for every token, reusing the cached blocks of its longest cached prefix.

        Walk seq's blocks in order (`self.block_tokens(seq, i)` are block i's tokens; the last may be partial).
        While prefix caching is on and every block so far was a hit, hash each *full* block chained with the
        previous one (`h = self.hash_fn(token_ids, h)`, starting from h = -1) and look it up in
        `hash_to_block_id`; it is a hit only if that block's `token_ids` equal these tokens (equal hashes of
        other tokens are a collision, a miss). A hit in use (in `used_block_ids`) gets `ref_count += 1`; a hit
        on the free list is revived with `self._take(block_id)`. A miss, a partial block, and every block after
        the first miss (it can no longer be a cached *prefix*) get a fresh block from `self._take_new()`.
        Append each block id to `seq.block_table`; set `seq.num_cached_tokens` to the tokens the hits cover
        (block_size per hit; 0 without prefix caching).
        Example, block_size 4: a computed sequence of tokens 0..8 holds blocks [a, b, c]; allocating tokens
        0..7, 99, 98 gives the table [a, b, new block], ref counts 2 on a and b, num_cached_tokens 8.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 05.4: allocate with prefix reuse — walk the full blocks, reuse hash hits (checking tokens), else take new
        assert not seq.block_table, "sequence already has blocks"
        seq.num_cached_tokens = 0
        h, hit = -1, self.enable_prefix_caching
        for i in range(self.num_blocks(len(seq))):
            token_ids = self.block_tokens(seq, i)
            block_id = -1
            if hit and len(token_ids) == self.block_size:
                h = self.hash_fn(token_ids, h)
                block_id = self.hash_to_block_id.get(h, -1)
                if block_id != -1 and self.blocks[block_id].token_ids != token_ids:
                    block_id = -1  # a hash collision: same hash, other tokens
            if block_id == -1:
                hit = False  # after the first miss nothing further can be a cached prefix
                block = self._take_new()
            elif block_id in self.used_block_ids:
                block = self.blocks[block_id]
                block.ref_count += 1
            else:
                block = self._take(block_id)
            if hit:
                seq.num_cached_tokens += self.block_size
            seq.block_table.append(block.block_id)
        # END EXERCISE

    def deallocate(self, seq: Sequence) -> None:
        """Release seq's blocks: it finished, or was preempted (chapter 06).

        For each block id in `seq.block_table`, from the table's last block to its first, the block's
        `ref_count` drops by one. A block nobody uses any more (0) leaves `used_block_ids` and is appended to
        `free_block_ids` (so `num_free_blocks` grows by one), keeping its `hash` and `token_ids`: a later
        identical prefix can then revive it in `allocate` and count it in its `num_cached_tokens`. A block
        another sequence still uses (ref_count above 0) stays in use. Why last to first: free blocks are
        reused oldest first, so a prefix's early blocks, the most shared, stay cached longest. Afterwards
        `seq.block_table` is empty and `seq.num_computed_tokens` is 0 (none of its tokens are in the cache).

        Example, a pool of 6 blocks of 4: a (tokens 0..7) holds blocks [0, 1]; b (tokens 0..7, then 1)
        shares them: [0, 1, 2], ref counts 2, 2, 1. Freeing a leaves blocks 0 and 1 in use with ref_count 1,
        and num_free_blocks at 3. Freeing b then frees blocks 2, 1, 0 in that order: num_free_blocks 6,
        used_block_ids empty. A new sequence of tokens 0..7, then 3, revives blocks [0, 1]: its
        num_cached_tokens is 8."""
        # Not part of the exercise: hashed => written. A sequence released before its step ran (preempted by a later
        # sequence of the same step, aborted, rolled back) leaves no block that step was to fill findable by hash.
        self.uncache_blocks(seq, max(seq.num_computed_tokens, seq.num_cached_tokens))
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 05.5: free with reference counts — decrement, and free blocks nobody uses
        for block_id in reversed(seq.block_table):  # tail first, so shared prefixes stay cached longest
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
        # END EXERCISE

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        """Give seq fresh blocks for num_tokens tokens up front, with no prefix reuse: a request's worst case
        reserved the way a contiguous cache does (the static-batching baseline)."""
        if self.num_blocks(num_tokens) > self.num_free_blocks:
            raise ValueError(
                f"reserving {num_tokens} tokens needs {self.num_blocks(num_tokens)} blocks, only "
                f"{self.num_free_blocks} are free: lower the batch size or max_tokens"
            )
        seq.block_table = [self._take_new().block_id for _ in range(self.num_blocks(num_tokens))]

    def can_append(self, seq: Sequence) -> bool:
        """Are there blocks for seq's newest token (and the drafts after it), should they start new blocks, or
        should the block they go into be shared (a copy of it, chapter 16)?"""
        new, i = self.num_blocks(len(seq) + len(seq.spec_token_ids)) - len(seq.block_table), seq.num_computed_tokens
        shared = i // self.block_size < len(seq.block_table) and self.blocks[seq.block_table[i // self.block_size]]
        return self.num_free_blocks >= new + bool(shared and shared.ref_count > 1)

    def may_append(self, seq: Sequence) -> None:
        """Add blocks while seq's newest token (and the drafts after it) do not fit in the blocks it has; first copy
        the block they are written into, if another sequence shares it (`copy_on_write`)."""
        self.copy_on_write(seq, seq.num_computed_tokens)
        while len(seq) + len(seq.spec_token_ids) > len(seq.block_table) * self.block_size:
            seq.block_table.append(self._take_new().block_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Parallel sampling (n > 1, chapter 16): child shares all of parent's blocks (its prompt's keys and values,
        computed once); each is used by one more sequence."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) copies copy_on_write decided since the last call, for the next step to make."""
        copies, self.copies = self.copies, []
        return copies

    def copy_on_write(self, seq: Sequence, position: int) -> None:
        """Before a step writes seq's keys and values from `position` on: if the block holding `position` is shared
        with another sequence (a fork's prompt, partly filled), give seq a copy of its own.

        The block `i = position // self.block_size` of `seq.block_table` (if seq has one there) is shared when its
        `ref_count` is above 1. Then: take a fresh block (`self._take_new()`, ref_count 1), give the shared one up
        (`ref_count -= 1`: the others keep it; it is never freed here, as someone still uses it), put the new block's
        id at place i of seq.block_table (num_free_blocks drops by one), and record the copy `(old_id, new_id)` in
        `self.copies` (take_copies hands them to the step): the model runner copies the keys and values before the step
        runs. A block used by seq alone is written in place: nothing. (The tests then run n = 4 answers in an engine:
        each answer's `outputs[i].token_ids` as the greedy one's alone, every block back in `llm.block_manager`.)

        Example, blocks of 4: a prompt of 6 tokens, blocks [3, 7], forked into two sequences (ref counts 2 and 2).
        The first to decode writes position 6, in block 7 (shared): it gets block 0 (say), table [3, 0], copies
        [(7, 0)], ref counts of 3 and 7 now 2 and 1. The second then writes in block 7 in place: nothing more.
        """
        # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
        # BEGIN EXERCISE 16.3: copy-on-write — before writing into a shared block, give the sequence a copy of its own
        i = position // self.block_size
        if i < len(seq.block_table) and self.blocks[seq.block_table[i]].ref_count > 1:
            old, new = self.blocks[seq.block_table[i]], self._take_new()
            old.ref_count -= 1
            seq.block_table[i] = new.block_id
            self.copies.append((old.block_id, new.block_id))
        # END EXERCISE

    def num_free_slots(self, seq: Sequence) -> int:
        """How many tokens seq could add: the free slots of its own blocks, and those of every free block."""
        return (len(seq.block_table) + self.num_free_blocks) * self.block_size - len(seq)

    def append_free(self, seq: Sequence, num_tokens: int) -> None:
        """Add free blocks to seq's table, while there are any, until it holds num_tokens tokens."""
        while self.free_block_ids and len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_new().block_id)

    def free_tail(self, seq: Sequence, num_tokens: int) -> None:
        """Give back seq's blocks past the first num_tokens tokens (they held drafts that were rejected). They are
        its own, never shared: prefix hits are blocks of a prompt, and drafts come after it."""
        for block_id in reversed(seq.block_table[self.num_blocks(num_tokens) :]):
            block = self.blocks[block_id]
            self._forget(block)
            block.ref_count = 0
            self.used_block_ids.remove(block_id)
            self.free_block_ids.append(block_id)
        del seq.block_table[self.num_blocks(num_tokens) :]

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Make seq's full blocks among its first num_tokens tokens findable by later prefixes.

        Called when a step that computes those tokens is scheduled: a sequence admitted in the same step may
        share them, because every layer stores the step's keys/values before any attention reads them. A
        sequence released before the step ran for it (preempted, aborted, rolled back) forgets them again in
        `deallocate`. Incremental: it walks back from the last full block
        to the newest block already hashed, so a decode step hashes at most the one block it fills.
        """
        if not self.enable_prefix_caching:
            return
        i = num_tokens // self.block_size  # blocks[:i] are full and computed
        while i > 0 and self.blocks[seq.block_table[i - 1]].hash == -1:
            i -= 1
        h = self.blocks[seq.block_table[i - 1]].hash if i > 0 else -1
        for i in range(i, num_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            token_ids = self.block_tokens(seq, i)
            block.hash, block.token_ids = self.hash_fn(token_ids, h), token_ids
            self.hash_to_block_id.setdefault(block.hash, block.block_id)
            h = block.hash

    def uncache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Forget the hashes of seq's blocks past its first num_tokens tokens (a failed step did not fill them)."""
        for block_id in seq.block_table[num_tokens // self.block_size :]:
            self._forget(self.blocks[block_id])
