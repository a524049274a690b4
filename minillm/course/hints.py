"""Three hints per exercise, from a nudge to the pitfalls: `python -m minillm.course hint 05.4 [--level 2]`.

Level 1 names the approach, level 2 the key operation, level 3 the shapes and the pitfalls the tests check.
None of them is code: they name functions, attributes and shapes, and leave the writing to you.
"""

import html
import re
import textwrap
from pathlib import Path

from minillm.course.chapters import exercise_file
from minillm.course.markers import canonical_id, find_exercises

LEVELS = ("approach", "key operation", "shapes and pitfalls")
WIDTH = 100  # columns of a printed hint

HINTS: dict[str, tuple[str, str, str]] = {
    "00.1": (
        "For every row of scores you want one number: the entry in the column that the row's id names. Think "
        "of it as a lookup along the last dimension, the same for any number of leading dimensions.",
        "`torch.gather` (or the tensor method `gather`) along dim=-1 picks, in each row, the columns an index "
        "tensor names. Its index must have as many dimensions as scores, so give ids a trailing axis of size 1 "
        "with `unsqueeze(-1)`, and remove that axis again from the result with `squeeze(-1)`.",
        "scores [..., V] and ids [...] give [...]; gather's output has the index's shape [..., 1]. ids must be "
        "a long tensor. A 0-dimensional id with scores [V] must give a 0-dimensional result; `scores[ids]` "
        "would take whole rows of a 2-D table instead of one entry per row. Keep the scores' dtype.",
    ),
    "00.2": (
        "Two steps, neither of which copies a number: first reinterpret each row of H*D numbers as H rows of D "
        "(a view), then swap the token axis and the head axis so that heads come first.",
        "`view(T, H, -1)` (the -1 lets torch work D out) turns [T, H*D] into [T, H, D]; `transpose(0, 1)` then "
        "gives [H, T, D]. Both return views that share x's memory.",
        "Splitting into [H, T, D] directly with view would read the numbers in the wrong order: a view keeps "
        "the memory order, so the head axis must come right after T first, then move. Do not call "
        "`contiguous()`, `clone()` or `reshape` after the transpose: the test checks that the result still "
        "shares x's storage.",
    ),
    "00.3": (
        "Build a boolean matrix [Tq, Tk] that says which keys each query may see, set the scores of the others "
        "to -inf, and take the softmax over the last dimension: exp(-inf) is 0, so they get exactly 0.",
        "`torch.ones(Tq, Tk, dtype=torch.bool)` with `tril(diagonal)` keeps the lower triangle; the diagonal "
        "offset Tk - Tq shifts it right so the last query sees every key. `masked_fill` (not `masked_fill_`) "
        "with float('-inf') where a key is not allowed, then `softmax(dim=-1)`.",
        "The mask [Tq, Tk] broadcasts over leading batch and head dimensions. masked_fill fills where the mask "
        "is True, so pass the forbidden positions (`~allowed`, or build them with `triu`). Make the mask on "
        "scores.device. The in-place masked_fill_ would change the caller's scores: the test checks they are "
        "untouched. Every row keeps at least one key, so no row is all -inf (that would give NaN).",
    ),
    "00.4": (
        "Sort each row from largest to smallest and note where each entry came from. The entry that lands at "
        "sorted position r has rank r: write r back at its original position. That undoes the sort.",
        "`argsort(dim=-1, descending=True)` gives, for each sorted position, the original index. "
        "`scatter(-1, order, src)` writes src[..., r] to position order[..., r]; with src holding 0..N-1 "
        "(`torch.arange`, expanded to the order's shape), the output holds each entry's rank.",
        "The result is long, shaped like x, on x's device; use `empty_like` or `zeros_like` of the order "
        "(already long) as the tensor to scatter into. The argsort alone is not the answer: it says which "
        "entry is at rank r, not which rank entry i has ([0.1, 0.9, 0.5] sorts to [1, 2, 0], but the ranks "
        "are [2, 0, 1]). Applying argsort twice also works; ties may come out in any order.",
    ),
    "00.5": (
        "The scores of all queries against all keys form one matrix product: queries [Tq, D] times keys "
        "transposed [D, Tk]. Matrix multiplication works on the last two dimensions and broadcasts the rest.",
        "Swap the last two dimensions of k with `transpose(-2, -1)` (or `.mT`), then multiply with `@` "
        "(torch.matmul), which broadcasts the leading dimensions of its two operands.",
        "Transpose k, not q, and use -2 and -1 rather than 1 and 2 so that any number of leading dimensions "
        "works: k [Tk, D] against q [B, Tq, D] must give [B, Tq, Tk], and [B, 1, Tq, D] with [1, H, Tk, D] "
        "gives [B, H, Tq, Tk]. `torch.mm` and `torch.bmm` do not broadcast; `torch.einsum` works too.",
    ),
    "01.1": (
        "Keep a list of pieces that starts as one piece per character, and merge one adjacent pair per round "
        "until no adjacent pair is a learned merge. Each round picks its pair across the whole word.",
        "In each round, look up the rank of every adjacent pair in `ranks` (a pair that is not there ranks as "
        "infinity, e.g. with `ranks.get` and a default) and take the smallest, the leftmost on a tie; replace "
        "those two pieces by their concatenation.",
        "Rank order decides, not position: with ranks {('b','c'): 0, ('a','b'): 1}, 'abc' gives ['a', 'bc']. "
        "Stop when the best rank is infinity or one piece is left; 'aaa' with {('a','a'): 0} gives ['aa', 'a'] "
        "(no overlap). Never modify `ranks`.",
    ),
    "01.2": (
        "Decode two windows that both start at prefix_offset: one up to read_offset (the text already shown) "
        "and one up to the end. The new text is what the longer decoding adds after the shorter one.",
        "Compare the two strings: only if the longer one is longer and does not end in the replacement "
        "character '\\ufffd' is its tail (past the shorter one's length) new text. Then the window moves on: "
        "prefix_offset becomes the old read_offset, read_offset becomes len(ids).",
        "Return a triple (new_text, prefix_offset, read_offset). While a character is unfinished return '' "
        "with both offsets unchanged, so its bytes are decoded again with the next token (the test expects "
        "('', 0, 1)). Subtract rather than decode the new ids alone: a window's first token loses its leading "
        "space when decoded on its own.",
    ),
    "02.1": (
        "An embedding is a table lookup: token id t picks row t of weight, which is [vocab, hidden]. No "
        "matmul and no Python loop are needed.",
        "Index the table with the id tensor itself (advanced indexing): torch gathers one row per id, for ids "
        "of any shape. `F.embedding` does the same.",
        "The output is the ids' shape plus hidden: a scalar id gives [hidden], [n] gives [n, hidden], [b, n] "
        "gives [b, n, hidden]. Keep the table's dtype (bf16 stays bf16); `one_hot` @ weight is only the slow "
        "formula the test compares with.",
    ),
    "02.2": (
        "Each logit is the dot product of the hidden vector with one row of the (tied) embedding table, so "
        "all of them together are one matrix product.",
        "Multiply hidden [..., hidden] by the transpose of weight [vocab, hidden]; the `@` operator "
        "(torch.matmul) broadcasts over any leading dimensions. `F.linear(hidden, weight)` is the same product.",
        "The result is [..., vocab]: hidden's leading dimensions stay, the last becomes the vocabulary size. "
        "Transpose the table, not hidden; with a [vocab, hidden] table, multiplying by it untransposed is a "
        "shape error.",
    ),
    "03.1": (
        "Divide each vector (the last dimension) by its root mean square, then multiply elementwise by weight. "
        "Do the arithmetic in float32 and cast back at the end.",
        "Square x, take the mean over dim=-1 with keepdim=True, add eps, and multiply x by `torch.rsqrt` of "
        "that (or divide by `torch.sqrt`). Cast to the input dtype, then scale by weight.",
        "eps goes inside the root (a test uses eps=0.5 to tell), and a zero vector must come out zero, not NaN. "
        "Remember x's dtype before upcasting: fp16 values in the hundreds overflow when squared in fp16 (its "
        "maximum is 65504), and the result must be fp16 again. keepdim gives [..., 1], which broadcasts against x.",
    ),
    "03.2": (
        "Split the last dimension of x into a first half x1 and a second half x2: pair i is the 2-D point "
        "(x1[i], x2[i]), rotated by the token's angle i. Rotating (a, b) by θ gives (a·cosθ − b·sinθ, "
        "b·cosθ + a·sinθ).",
        "`chunk(2, dim=-1)` gives the halves; compute the two rotated halves with cos and sin and join them "
        "again with `torch.cat` along the last dimension.",
        "x is [tokens, heads, head_dim] while cos and sin are [tokens, head_dim/2]: add a heads axis with "
        "`unsqueeze(-2)` so they broadcast over heads. The halves are the first and second half, not even and "
        "odd elements; compute in float32 and return x's dtype (a bf16 test checks).",
    ),
    "03.3": (
        "Give each query head its shared KV head, score every query against every key (scaled), hide the "
        "future keys, softmax over the keys, and take the weighted sum of the values.",
        "Repeat k and v along the head dimension with `repeat_interleave(group, dim=1)`, group = heads // "
        "kv_heads, so query head h meets KV head h // group. Scores per head are q·k over head_dim "
        "(`torch.einsum`, or transpose and `@`) times scale; `masked_fill` the future with -inf using a "
        "`triu(1)` boolean matrix, then `softmax(dim=-1)`.",
        "q is [T, H, D], k and v are [T, Hkv, D]; scores are [H, T, T] (query × key) and the output must be "
        "[T, H, D] again. `repeat` instead of `repeat_interleave` pairs the wrong heads (the GQA case "
        "catches it). Compute in float32 and cast to q's dtype.",
    ),
    "03.4": (
        "The input's last dimension is [gate | up]: split it in half, apply SiLU to the gate half only, and "
        "multiply by the up half.",
        "`chunk(2, dim=-1)` gives the two halves; `F.silu` is the activation (g · sigmoid(g)).",
        "The output's last dimension is half the input's (14 gives 7). The gate is the first half, not the "
        "second; and keep the dtype: bf16 in, bf16 out.",
    ),
    "04.1": (
        "For each token, every layer stores one key vector and one value vector per KV head. Count those "
        "numbers and multiply by the size of one number in `dtype`.",
        "The count is 2 × num_hidden_layers × num_key_value_heads × head_dim, all read from the config; the "
        "bytes per element come from torch (`dtype.itemsize`, or `element_size()` of an empty tensor of that "
        "dtype).",
        "Use num_key_value_heads, not num_attention_heads: under GQA only the KV heads are cached. Check: "
        "Qwen3-0.6B (28 layers, 8 KV heads, head_dim 128) in bf16 is 114,688 bytes. Return an int.",
    ),
    "04.2": (
        "See each cache [num_blocks, block_size, kv_heads, head_dim] as one long column of slots "
        "[num_blocks·block_size, kv_heads, head_dim]: token t's key and value go to row slot_mapping[t], "
        "unless that slot is -1.",
        "Build a boolean mask of the valid slots (slot ≥ 0), select those tokens of k and v and those slots, "
        "and write them with one indexed assignment into a `view` of each cache.",
        "Leave the -1 entries out rather than index with them: -1 is a valid index, the last slot, and would "
        "be overwritten. The write must land in the cache itself: assign into the view directly, as indexing "
        "first and assigning into the result writes into a temporary copy. Slots come in any order; no Python "
        "loop is needed.",
    ),
    "05.1": (
        "Position pos of a sequence sits in its logical block pos // block_size, at offset pos % block_size "
        "inside it; the block table says which physical block that logical block is.",
        "For every position from start to end − 1, the slot is the physical block's number times block_size "
        "plus the offset.",
        "end is exclusive, so the list has end − start entries, plain ints. Check: table [7, 2, 5] with "
        "block_size 4 puts position 4 in slot 2·4 + 0 = 8 and position 0 in slot 28.",
    ),
    "05.2": (
        "Rebuild each sequence's keys and values from its blocks, in block-table order, so position j of "
        "sequence i is its key j. Then run ordinary, non-causal attention of its one query over them, hiding "
        "the positions at or past its context length.",
        "`gather_kv(cache, block_tables)` (same module) gives [num_seqs, max_len, kv_heads, head_dim]. Make a "
        "boolean mask [num_seqs, max_len], True where the position is below context_lens (compare an "
        "`arange` with context_lens), and pass it as attn_mask to `F.scaled_dot_product_attention` with "
        "scale=scale.",
        "SDPA wants [batch, heads, length, head_dim], so transpose k and v. For GQA either repeat_interleave "
        "k and v up to the query heads, or view q as [num_seqs, kv_heads, heads/kv_heads, head_dim]; the mask "
        "then broadcasts as [num_seqs, 1, 1, max_len]. The -1 padding in a block table reads block 0: only the "
        "mask keeps it out. Return [num_seqs, heads, head_dim].",
    ),
    "05.3": (
        "Feed the previous block's hash and this block's token ids into one stable hash and turn its digest "
        "into a Python int. Chaining makes equal hashes mean equal whole prefixes, not just equal blocks.",
        "`hashlib.blake2b` with an 8-byte digest gives 64 bits: update it with prefix_hash as 8 bytes "
        "(`int.to_bytes`) and with the tokens as bytes (numpy int64 and `tobytes`, say), then read the digest "
        "back with `int.from_bytes`.",
        "prefix_hash is -1 for the first block, so convert it as a signed number (without signed=True, "
        "to_bytes raises OverflowError). The result must be an int within 64 bits, the same for the same "
        "input, and different when the token order or the prefix changes.",
    ),
    "05.4": (
        "Walk the sequence block by block (`self.num_blocks(len(seq))` of them, tokens from "
        "`self.block_tokens(seq, i)`). While every block so far was a cache hit, look the next full block up "
        "by its chained hash; from the first miss on, take fresh blocks.",
        "A block's hash is `self.hash_fn(tokens, previous hash)`, starting from -1; `self.hash_to_block_id` "
        "finds a cached block, whose token_ids must equal yours (else it is a collision: a miss). A hit in "
        "`self.used_block_ids` is shared (raise its ref_count); a hit on a free block is revived with "
        "`self._take(block_id)`; a miss takes `self._take_new()`.",
        "Set `seq.num_cached_tokens` to 0 first and add block_size per hit (a 10-token sequence sharing two "
        "4-token blocks gets 8). Only full blocks can hit, nothing hits after a miss or with "
        "enable_prefix_caching off. Append every block id to `seq.block_table` in order; don't register hashes "
        "here, `cache_blocks` does that later.",
    ),
    "05.5": (
        "Give back each of seq's blocks. A block may be shared with other sequences, so only lower its "
        "reference count, and return it to the free list when the count reaches zero. Afterwards seq owns "
        "nothing.",
        "For each id in `seq.block_table`, decrement `self.blocks[id].ref_count`; at zero, move the id from "
        "`self.used_block_ids` to `self.free_block_ids` (its `append`).",
        "Go from the last block to the first, so prefix blocks, the likeliest to be reused, are evicted last. "
        "Keep a freed block's hash and token_ids: a later identical prefix revives it (a test allocates again "
        "after freeing and expects num_cached_tokens 8). Finally empty `seq.block_table` and set "
        "`seq.num_computed_tokens` to 0.",
    ),
    "06.1": (
        "Work on each row sorted from most to least likely: there, top-k drops ranks ≥ k; then, on what is "
        "left, top-p drops a token once the tokens ranked above it already hold probability p. Set those to "
        "-inf, then put the row back in its original order.",
        "`sort(dim=-1, descending=True)` gives the sorted logits and the permutation; `masked_fill` ranks ≥ k "
        "with -inf first, so that the softmax of the sorted row is renormalised over the survivors; take its "
        "`cumsum`, mask again, and undo the sort with `scatter` along the last dimension using the permutation.",
        "top_k and top_p are [B]: index them with [:, None] to broadcast over the vocabulary, and read k = 0 "
        "as 'keep all' (`torch.where`). Use the probability strictly above each token (cumsum minus its own), "
        "so the token that crosses p stays and the top token always survives. Kept logits come back "
        "unchanged.",
    ),
    "06.2": (
        "Admit sequences from the front of `self.waiting`, in order, while there is a seat "
        "(`self.max_num_seqs` running) and token budget left (the `budget` argument: what this step's running "
        "requests left of max_num_batched_tokens). Stop at the first one that `self.can_admit` refuses, so "
        "nobody overtakes it; return the admitted sequences.",
        "Allocate its blocks with the block manager; num_computed_tokens starts at "
        "num_cached_tokens, capped at len(seq) − 1. `self.chunk_size(seq, budget)` is num_scheduled_tokens (it "
        "applies the budget and long_prefill_token_threshold); take it off the budget and call "
        "`self.block_manager.cache_blocks(seq, computed + scheduled)`.",
        "Every admitted sequence leaves waiting (popleft), becomes SequenceStatus.RUNNING and joins "
        "`self.running`, even one whose chunk does not reach the end of its prompt: it holds blocks, and "
        "`schedule_chunks` gives it the rest (20 tokens under a budget of 8 run as 8, 8, 4). The cap of "
        "len(seq) − 1 keeps one token to compute, for its logits.",
    ),
    "06.3": (
        "Loop: while seq's next token has no cache slot (`self.block_manager.can_append(seq)` is false), "
        "preempt one running sequence and check again. Return True once it fits, False if seq itself had to "
        "go.",
        "The victim is the running sequence that the waiting order puts last: the maximum of `self.running` "
        "under the key `self.queue_key`. Preempting it (`self.preempt`) frees its blocks and sends it back to "
        "waiting.",
        "Use queue_key rather than arrival alone, so the priority policy preempts the lowest priority first "
        "(the test expects the priority-0 sequence back in waiting). The victim may be already scheduled this "
        "step, or seq itself: compare with `is`, and stop as soon as seq is preempted.",
    ),
    "06.4": (
        "Go through the step's sequences (`output.scheduled`) with their tokens, in order: record the work done; "
        "append the tokens, deciding after each whether the sequence is finished. A finished one frees its "
        "blocks and leaves `self.running`. Return those that got tokens.",
        "Add num_scheduled_tokens to num_computed_tokens for every sequence; if it verified drafts "
        "(spec_token_ids not empty) let drop_rejected_drafts uncount the rejected ones: all but len(tokens) − 1 "
        "of them. An empty list means a "
        "prefill chunk that did not reach the end of the prompt: nothing more to do for it. Otherwise append "
        "each token to `seq.token_ids` and set `seq.finish_reason` with the module's "
        "`finish_reason(seq, self.eos_token_ids)`.",
        "Stop appending at the first token whose finish_reason is not None ('stop' or 'length'): the rest are "
        "dropped. Then status SequenceStatus.FINISHED, its blocks freed with the block manager's `deallocate`, "
        "and out of `self.running`. Let the helper judge EOS: it also handles stop_token_ids, ignore_eos and "
        "max_tokens.",
    ),
    "07.1": (
        "Two parts joined end to end: the small powers of two, kept only while they fit, then a regular run of "
        "multiples of 16 that stops at the largest one that fits.",
        "A filter over the tuple (1, 2, 4, 8) with `b <= max_batch`, then `range` with a start of 16 and a "
        "step of 16. Remember that range's stop is exclusive.",
        "The result is a plain list of ints in increasing order and never contains a value above max_batch: "
        "max_batch 20 gives [1, 2, 4, 8, 16], 3 gives [1, 2], 1 gives [1], and 16 must include 16 itself.",
    ),
    "07.2": (
        "Walk the buckets from the smallest up and stop at the first one big enough for the batch; if none "
        "is, say so with None.",
        "The buckets are sorted, so the first `b` with `b >= batch` is the answer. `next(...)` over a "
        "generator with a default, or a loop with an early return, both do it.",
        "A batch equal to a bucket gets that bucket (≥, not >). A batch larger than the last bucket returns "
        "None (not the last bucket, not an exception): the engine then runs that step eagerly.",
    ),
    "07.3": (
        "The rows from `batch` up to (not including) `bucket` are the padding: give each of the five buffers "
        "a harmless value there, and leave every other row alone.",
        "One slice, `batch:bucket`, used to assign in place into each buffer: token 0, position 0, slot "
        "PAD_SLOT_ID, context length 1, and block 0 in every column of the padded rows of block_tables.",
        "Assign into the buffers themselves (`buf[rows] = value`), never rebind the names: the engine reads "
        "the same tensors afterwards. The slot must be -1 (PAD_SLOT_ID), which lands in the spare block; a "
        "real slot would overwrite a sequence's key. batch == bucket pads nothing, batch 0 pads all rows. "
        "Return None.",
    ),
    "08.1": (
        "Two results from one pass: first the sum of the sublayer's output and the residual stream, then the "
        "RMSNorm of that sum. The sum is also returned, since the next sublayer adds to it.",
        "Add x and residual with `+` (a new tensor, so neither input changes), then call the chapter 03 "
        "`rms_norm` on the sum with the given weight and eps. Return the pair (normalised, sum).",
        "Order matters: the normalised tensor first, the new residual second. Do not use in-place `+=` or "
        "`add_`: the tests check the inputs are unchanged. Keep the dtype (bf16 in, bf16 out). Anything "
        "that breaks the graph (`.item()`, printing, a Python loop over tokens) would stop inductor from "
        "fusing it into one kernel.",
    ),
    "08.2": (
        "Go through the arguments; for each tensor that has a token (row) dimension, tell dynamo that its "
        "first size changes from call to call. Then hand the same arguments back.",
        "`isinstance` against torch.Tensor and the tensor's `dim()` pick the tensors to mark; "
        "dynamo's `maybe_mark_dynamic(tensor, dim)` (in torch._dynamo) marks one dimension of one tensor.",
        "Leave 1-D weights alone: their size is fixed by the model, and a static size lets inductor unroll "
        "and vectorise for it. Floats and ints pass through untouched. Return the tuple you were given, not "
        "a copy or a list. Use maybe_mark_dynamic rather than mark_dynamic: where the traced code needs the "
        "size as a constant (a branch on it, a size of 0 or 1), the maybe lets dynamo specialise quietly, "
        "where mark_dynamic insists the size stays symbolic and can raise a ConstraintViolationError.",
    ),
    "09.1": (
        "One program, one token: find out which token you are, read where it goes, and give up at once when "
        "that is nowhere. Otherwise copy one row of D numbers from the keys and one from the values into the "
        "caches, as two loads and two stores of a whole row each.",
        "`tl.program_id(0)` is the token; `tl.load` of the slot-mapping pointer plus it gives the slot, and an "
        "`if` on the slot with a bare `return` skips the token. `tl.arange(0, BLOCK_D)` gives the lanes of a "
        "row; compare it with D for the mask. A row of the input starts at the token times its stride, a row "
        "of the cache at the slot times D.",
        "Pass the same mask to every `tl.load` and `tl.store`: BLOCK_D is D rounded up to a power of two, so "
        "the lanes past D belong to the next token (or past the end of the tensor). Use the key stride for "
        "the keys and the value stride for the values, never D: k is a view into qkv, with rows further "
        "apart than D. Test the slot for being negative (PAD_SLOT_ID is -1), and skip the whole program then.",
    ),
    "09.2": (
        "The running sums were built relative to the largest score seen so far. When a block brings a larger "
        "one, shrink what you have by exp(old maximum - new maximum), then add this block's exponentials and "
        "its exponential-weighted values, both taken relative to the new maximum.",
        "`tl.max(scores, axis=1)` is each head's block maximum and `tl.maximum` takes the larger of two "
        "tensors elementwise. `tl.exp` of the difference of maxima is the rescale factor; `tl.sum` over axis 1 "
        "adds a block's weights. For the values, broadcast the weights [GROUP, BLOCK_SIZE] against v "
        "[BLOCK_SIZE, HEAD_DIM] with `[:, :, None]` and `[None, :, :]` and sum over the block axis.",
        "Return three tensors in the order (m, l, acc), shaped [GROUP], [GROUP] and [GROUP, HEAD_DIM]. Index "
        "the per-head factors with `[:, None]` to scale the rows of acc and of the scores. Subtract the new "
        "maximum, not the old one, inside the exponential. The first block has m_i = -inf: exp(-inf) is 0, "
        "so nothing is lost, but never subtract -inf from -inf (a NaN): that cannot happen as long as every "
        "block you are given has one valid key. Masked keys arrive as -inf and must weigh exactly 0.",
    ),
    "09.3": (
        "One program per row: load the row of x and the row of the residual once, add them, write the sum "
        "out as the new residual, then normalise the sum in float32 and write it times the weight. Nothing "
        "is read twice, and no intermediate goes back to memory.",
        "`tl.program_id(0)` is the row, `tl.arange(0, BLOCK_N)` the columns and comparing it with N the mask. "
        "`tl.sum(..., axis=0)` of the squares divided by N is the mean square; `tl.rsqrt` of it plus eps is "
        "the factor. `.to(tl.float32)` and `.to(out_ptr.dtype.element_ty)` convert between the row's dtype "
        "and float32.",
        "Load masked lanes as 0 (the `other` argument of `tl.load`) so that they add nothing to the sum of "
        "squares, and divide by N, not BLOCK_N. Store the sum in the inputs' dtype before converting it. Cast "
        "the normalised row to the output dtype before the weight multiplies it, as the torch version does. "
        "Write into the two output pointers only: the inputs must stay unchanged.",
    ),
    "10.1": (
        "The tensor is cut into tp_size equal pieces along one dimension; work out how long one piece is, "
        "where piece number `rank` starts, and take that stretch of the dimension, leaving the others whole.",
        "`weight.shape[dim] // tp_size` is the piece length; `weight.narrow(dim, start, length)` takes a "
        "stretch of one dimension as a view, without copying.",
        "Start at rank times the piece length, not at rank. `weight.chunk(tp_size, dim)[rank]` works too, since "
        "its pieces are views; what fails is a copy (`.clone()`, `.contiguous()` on a column piece, indexing with "
        "a list of positions): the tests check that writing into the piece changes the original. With tp_size 1 "
        "the piece is the whole tensor.",
    ),
    "10.2": (
        "Each rank holds the same number of heads of each kind: its share of the query heads, then its "
        "share of the key heads, then as many value heads. Count the rows each part takes on one rank, and "
        "each part starts where the previous one ends.",
        "Per rank: num_heads // tp_size query heads and num_kv_heads // tp_size key/value heads, each "
        "head_dim rows. q starts at 0; k at the size of q; v at the size of q plus the size of k.",
        "Return a tuple (offset, size) of plain ints for the one shard_id asked for (\"q\", \"k\" or "
        "\"v\"). k and v have the same size. Divide the head counts by tp_size before multiplying by "
        "head_dim. The offsets do not depend on the rank: every rank packs its own heads the same way.",
    ),
    "10.3": (
        "Each rank multiplies its slice of the input by its slice of the weight: a partial result of the full "
        "output size. The ranks' partials add up to the whole product; an all-reduce does the adding. The "
        "bias belongs to the sum, not to every partial.",
        "`linear(x, weight, bias)` is x @ weightᵀ + bias by the layer's own kernel (F.linear unless the "
        "platform gave it another); `all_reduce(partial, group)` from "
        "minillm.utils.parallel sums over the ranks and returns the sum (and does nothing for group None).",
        "Pass the bias only on rank 0 (None elsewhere), or the sum holds it tp_size times. Call all_reduce "
        "exactly once, on the partial with the bias in it, and return what it gives back. Do not cut x: it "
        "arrives already split.",
    ),
    "10.4": (
        "Turn each id into this rank's local row number by subtracting where the rank's range starts. Ids "
        "that land outside 0..n-1 belong to other ranks: look up something harmless for them and zero their "
        "rows. The all-reduce then adds the one rank that had the row to the zeros of all the others.",
        "`input_ids - vocab_start` gives local ids; `(local >= 0) & (local < n)` marks the ones this rank "
        "holds; `local.clamp(0, n - 1)` makes every id safe to index; `embed(ids, weight)` (chapter 02) looks "
        "them up; `masked_fill` or a multiplication by the mask zeroes the rows of the others.",
        "The mask has the ids' shape; add a trailing dimension (`mask[..., None]`) to broadcast it over the "
        "hidden size. Never index with an unclamped local id: a negative one would silently pick a row from "
        "the end. Finish with `all_reduce(rows, group)` and return its result.",
    ),
    "12.1": (
        "An async generator: `async for out in stream`, and `yield` one string per event. An event is the text "
        "'data: ', the JSON of a chunk, and two newlines; the last event of every stream is 'data: [DONE]'.",
        "Keep a token count (every output, sent or not) and a flag for the first event. The first chunk also "
        "carries `stream.prompt_token_ids`. After the loop, the usage chunk is `chunk(None, usage(stream, n), "
        "False)`, only if include_usage.",
        "Wrap the loop in try / except EngineError / finally: the except yields the error event "
        "(`APIError(500, str(e)).body()` after 'data: '), the finally aborts the stream (its abort method); the [DONE] "
        "event comes after the whole try statement, so a client that left (the generator closed) gets no "
        "more events but its request is still aborted.",
    ),
    "12.2": (
        "The counts are cumulative: the last one is the total. The quantile's rank is q times it; walk the "
        "buckets in order to the first whose count reaches the rank, and place the answer inside that bucket.",
        "Keep two running values as you walk: the previous bucket's le (the current bucket's lower bound, 0 at "
        "the start) and its count. Inside the bucket, the answer sits at the fraction (rank − previous count) / "
        "(count − previous count) of the way from the lower bound to le.",
        "Check the +Inf bucket before you interpolate (inf times anything is no answer): return the lower "
        "bound. A total of 0 returns None. A bucket with count == previous count can only be reached at rank "
        "0: return its le rather than dividing by zero.",
    ),
    "13.1": (
        "Work from the longest n down. The suffix is the last n tokens; an earlier occurrence is a start i with "
        "the same n tokens there and at least one token after them (i + n < len). Scan i from the end backwards "
        "and the first hit is the most recent.",
        "Guard the range of n: a suffix as long as the whole list has nothing before it, so n goes up to "
        "len(token_ids) - 1 at most (and the loop may not run at all). Slicing past the end of a list is safe: "
        "token_ids[j : j + k] just returns fewer tokens.",
        "For speed (this runs for every sequence every step) numpy helps: the positions where the newest token "
        "occurred before are np.flatnonzero(ids[:-1] == ids[-1]); keep those whose earlier tokens also match, "
        "one offset at a time. A pure-Python double loop is correct too.",
    ),
    "13.2": (
        "Compare every draft with the target's pick at its row, all rows at once, then count per row how many agree "
        "from the start, before the first disagreement.",
        "draft_ids == target_ids[:, :k], and-ed with arange(k) < num_drafts[:, None] so that padding never agrees; "
        "the running product along a row (cumprod of the mask as ints), summed, is n, the drafts kept.",
        "The answer is target_ids itself in columns 0..n (the kept drafts equal the target's picks there; column n "
        "is its own token) and PLACEHOLDER_TOKEN_ID after: torch.where(arange(k + 1) <= n[:, None], target_ids, "
        "-1). A row with no drafts gets one token.",
    ),
    "13.3": (
        "Three stages, every row at once: which drafts are accepted, the kept prefix n of each row, then one token "
        "at column n from that row's residual. Read p(d) and q(d) with gather on the last dimension; for looked-up "
        "drafts (draft_probs None) q(d) is 1.",
        "Accept where uniform * q(d) < p(d), in float64 (u.double() against p.double()), and-ed with arange(k) < "
        "num_drafts[:, None]; cumprod along the row, summed, gives n. Take p at row n of each sequence "
        "(target_probs[arange(B), n]); q there is the rejected draft's distribution (a one-hot made with scatter_ "
        "when draft_probs is None), or all zeros on the bonus row (n == num_drafts).",
        "Residual (p - q).clamp_min(0); where its sum is 0 use p; the token is (residual / exponential).argmax(-1), "
        "no normalising. Clamp n to k - 1 before indexing drafts with it; the output is the drafts where column < n, "
        "-1 elsewhere, one more column of -1, and the token scattered into column n (scatter_).",
    ),
    "13.4": (
        "Three statements. The step counted the newest token and all k = len(seq.spec_token_ids) drafts as "
        "computed; only the newest and the num_accepted kept drafts really belong to the sequence.",
        "Subtract the rejected ones, k − num_accepted, from num_computed_tokens. Their slots need no clearing: no "
        "longer counted, they will be overwritten by the next tokens.",
        "Blocks: the sequence will hold len(seq) + num_accepted + 1 tokens once update_from_output appends the "
        "kept drafts and the target's token: the block manager's free_tail keeps the blocks for that many; "
        "then empty spec_token_ids (read its length first).",
    ),
    "14.1": (
        "One scale per row: the largest magnitude of the row, weight.abs().amax(dim=1), over 127, so that the "
        "largest weight lands on ±127 exactly.",
        "A row of zeros has amax 0: torch.where(amax > 0, amax / 127, torch.ones_like(amax)) keeps the division "
        "safe. Divide each row by its own scale with scale[:, None] (broadcast over the columns).",
        "torch.round rounds halves to even (63.5 to 64, 62.5 to 62), which is what the tests expect. Clamp to "
        "-127..127 before .to(torch.int8): a cast does not saturate, it wraps.",
    ),
    "14.2": (
        "View the bytes as blocks first: raw.view(*raw.shape[:-1], -1, 20) gives [rows, blocks, 20]; then bytes "
        "0-1 are d, 2-3 are m and 4-19 the 16 packed bytes of every block at once.",
        "For the values, packed & 0x0F gives the 16 low nibbles (weights 0-15) and packed >> 4 the 16 high ones "
        "(weights 16-31): concatenate them in that order along the last dimension, then .float().",
        "Multiply first and add after, d[..., None] * q + m[..., None], in float32: the gguf package computes (d * q) "
        "+ m and the tests compare bit for bit. flatten(-2) turns [rows, blocks, 32] into [rows, blocks · 32].",
    ),
    "14.3": (
        "Get the exact integer sums of every block first: block_sums(qx, qw) in the same file gives [rows, out, "
        "blocks] in int64, each the dot product of 32 int8 values with 32 others.",
        "Each block's sum is worth dx[r, b] of its row: multiply the sums by dx[:, None, :] (broadcast over the "
        "outputs), then sum over the blocks.",
        "The weight's scale belongs to the whole output row: multiply by scale[None, :] last. Do the float work in "
        "float64 (.double()) and return .float().",
    ),
    "15.1": (
        "Work out every stage's size first, then turn sizes into ranges: a stage starts where the stages before it "
        "end, so its start is the sum of their sizes and its end is its start plus its own size.",
        "Everyone gets the floor num_layers // pp_size; the remainder num_layers % pp_size (always fewer than "
        "pp_size) hands out one more layer each, starting with the stage at index pp_size - 2 and going down "
        "towards stage 0. A list of sizes that you add to, then `sum` over a slice of it, does both steps.",
        "The last stage (index pp_size - 1) never gets an extra layer, and neither does any stage below "
        "pp_size - 1 - remainder. With pp_size 1 the remainder is 0 and the one stage is (0, num_layers). The "
        "tests check every split of 1 to 40 layers on up to 8 stages, then build the default model's 4 layers "
        "as 2 and as 3 stages with your ranges and compare the logits.",
    ),
    "15.2": (
        "Give every serving engine one number, its score, and pick the smallest; an engine whose entry is None "
        "takes no part at all.",
        "The score is `WAITING_WEIGHT` times the waiting count plus the running count. Pairs (score, index) "
        "compare by score first and by index on a tie, so the smallest pair names the engine you want; `enumerate` "
        "gives the indices.",
        "Skip the None entries before comparing (None cannot be multiplied), but keep each engine's original "
        "index: the answer is a position in `loads`, not in a filtered list. If nothing is left, raise "
        "`EngineDeadError` with a message saying that no engine core is serving; `min` of an empty list would "
        "raise ValueError instead.",
    ),
    "15.3": (
        "Two numbers make the share: how long the timeline lasts from its first start to its last end (the span), "
        "and how many seconds the stages spent inside forward passes in all (the busy time). The stages together "
        "could have been busy num_stages times the span.",
        "The span is the largest `end` minus the smallest `start` over all the records; the busy time adds up "
        "`end - start` of every record. The bubble is what is left of num_stages x span once the busy time is "
        "taken out, as a share of num_stages x span.",
        "Return 0.0 for an empty list before taking a max or a min, and 0.0 when the span is 0 (no division by "
        "zero). Do not assume the records come sorted or that every stage appears: a stage that ran nothing is "
        "idle the whole span, which num_stages accounts for.",
    ),
    "16.1": (
        "Unpack first, mask second: turn the [B, W] words into one boolean per token, a mask as wide as the "
        "logits, then put -inf wherever it says no. Token 32 * w + j lives in bit j of word w, lowest bit first, "
        "so the tokens of one word come out in order if you read its bits from bit 0 up to bit 31.",
        "Shift every word right by all of 0..31 at once: give the bitmask a trailing axis of size 1 and shift it "
        "by `torch.arange(32)` (broadcasting gives [B, W, 32]), then keep only the lowest bit with `& 1`. Merging "
        "the last two axes (`flatten(-2)` or `reshape`) numbers the bits 0..32·W − 1, the token ids. "
        "`masked_fill`, the out-of-place one, then writes -inf and leaves the input alone.",
        "32·W can exceed V (V = 1000 gives 1024 bits): cut the unpacked mask to the logits' last dimension. Make "
        "the shift amounts int32 on the bitmask's device. Bit 31 is the sign bit and shifting a negative word "
        "right fills with ones, so test the lowest bit after the shift, never the sign of the word. Turn the bits "
        "into a bool mask before inverting it (`~` on integers flips every bit), and keep the logits' dtype: "
        "bfloat16 in, bfloat16 out.",
    ),
    "16.2": (
        "Three rules in a fixed order, each one tensor operation over the whole [R, V] batch: no loop over rows or "
        "tokens. Work out which tokens each row has seen first: in its prompt (prompt_mask) or in its output "
        "(output_counts > 0).",
        "Repetition: where a token was seen, divide a positive logit by r and multiply a negative (or zero) one by "
        "r; `torch.where` twice does it, with r as repetition[:, None] so that it broadcasts over the vocabulary. "
        "Unseen tokens keep their logits.",
        "Then subtract frequency[:, None] * output_counts, and presence[:, None] where output_counts > 0 (a bool "
        "tensor times a float is 0 or the value). Out-of-place operations leave the input alone; with 0, 0 and 1 "
        "nothing changes, which the tests check too.",
    ),
    "16.3": (
        "Only one block can be written: the one at index position // block_size of seq.block_table. If seq has no "
        "block there yet (a step that starts a new block), there is nothing to copy.",
        "It is shared when its ref_count is above 1. Then take a fresh block with self._take_new() (it comes with "
        "ref_count 1), give the shared one up with ref_count -= 1 (never to the free list: others still read it), "
        "and put the new block's id in seq.block_table at that index.",
        "Record (old id, new id) in self.copies: the model runner copies the keys and values before the step "
        "writes, so the copy starts with everything the shared block held. The next sequence to write into the old "
        "block may find it used by it alone, and then it writes in place: no copy.",
    ),
}


def hint(which: str, level: int = 1) -> str:
    """Hints 1..level of exercise `which` ("05.4"), then how to get the next one.

    Raises ValueError naming the valid exercises or levels when `which` or `level` is not one of them.
    """
    id = canonical_id(which)
    exercises = {e.id: e for e in find_exercises()}
    if id not in exercises:
        raise ValueError(f"There is no exercise {which}; the exercises are {', '.join(exercises)}.")
    if id not in HINTS:
        raise ValueError(
            f"Exercise {id} has no hints yet; its docstring in "
            f"{exercise_file('exercises', id[:2], Path()).as_posix()} is the spec."
        )
    if level not in range(1, len(LEVELS) + 1):
        raise ValueError(
            f"There are hint levels 1, 2 and 3 (approach, key operation, shapes and pitfalls); "
            f"{level} is not one of them."
        )
    e = exercises[id]
    lines = [f"Exercise {id}: {e.qualname} ({e.task})", ""]
    for n in range(1, level + 1):
        text = f"Hint {n} of {len(LEVELS)} ({LEVELS[n - 1]}): {HINTS[id][n - 1]}"
        lines += [textwrap.fill(text, WIDTH, break_on_hyphens=False), ""]  # "all-reduce" stays one word
    if level < len(LEVELS):
        lines.append(f"More: python -m minillm.course hint {id} --level {level + 1}")
    else:
        lines.append(
            f"That was the last hint. The spec is the docstring in "
            f"{exercise_file('exercises', id[:2], Path()).as_posix()}; "
            f"`python -m minillm.course grade {id}` names the first failing test."
        )
    return "\n".join(lines)


class Hints:
    """The three hints of one exercise as folded sections (HTML <details>) for a notebook: open one at a time."""

    def __init__(self, which: str):
        self.id = canonical_id(which)
        hint(self.id)  # the same checks and errors as the command line
        self.texts = HINTS[self.id]

    def __repr__(self) -> str:
        return f"Hints for exercise {self.id}: python -m minillm.course hint {self.id} --level 1 (then 2, 3)"

    def _repr_html_(self) -> str:
        folds = "".join(
            f"<details><summary>Hint {n} of {len(LEVELS)} for {self.id}: {LEVELS[n - 1]}</summary>"
            f"<p>{_code(text)}</p></details>"
            for n, text in enumerate(self.texts, 1)
        )
        return f"<div>{folds}</div>"


def _code(text: str) -> str:
    """Hint text as HTML: `names` in backticks become <code>names</code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
