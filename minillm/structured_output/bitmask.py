"""Token bitmasks: which tokens a grammar allows next, 32 tokens to an int32 word, applied to a batch of logits.

A grammar matcher fills one bitmask row per structured request before the step samples; the sampler then sets
the logits of every token whose bit is 0 to -inf, so no sampling method can pick it. The layout is xgrammar's:
bit j of word w (bit 0 the least significant) speaks for token 32 * w + j, 1 = allowed.
"""

import torch


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A bitmask of `rows` rows that allows every token: int32 [rows, ceil(vocab_size / 32)], all bits set (-1)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """The logits with every token the bitmask forbids set to -inf; a new tensor, the input left as it was.

    Inputs: `logits`, a float tensor [B, V] (any float dtype, any device); `bitmask`, an int32 tensor
    [B, ceil(V / 32)] on the same device. Bit j of word bitmask[b, w], counting from the least significant bit
    (j = 0) to the sign bit (j = 31), says whether token 32 * w + j may come next in row b: 1 allowed, 0 not.
    Bits past the last token (when V is not a multiple of 32) are ignored.

    Output: a tensor of the logits' shape, dtype and device: logits[b, t] where token t is allowed in row b,
    float("-inf") where it is not. `logits` itself must not change.

    Edge cases the tests check: a word of -1 (all 32 bits set) allows all 32 of its tokens and a word of 0 none;
    the sign bit is token 31 of its word (-2**31 allows token 31 alone: shifting a negative int32 right fills
    with ones, so keep only the bit you shifted down); V = 1000 (bitmask width 32, the last 24 bits unused);
    bfloat16 logits; the result equals xgrammar's kernel (xgr.apply_token_bitmask_inplace) exactly.

    Example: logits [[1., 2., 3., 4.]] (V = 4) and bitmask [[0b0101]] (= 5: tokens 0 and 2) give
    [[1., -inf, 3., -inf]].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 16.1: apply a token bitmask — unpack 32 tokens per int32 word, -inf where the bit is 0
    vocab_size = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [B, W, 32]: bit j of word w is token 32 * w + j
    allowed = bits.flatten(-2)[..., :vocab_size].bool()
    return logits.masked_fill(~allowed, float("-inf"))
    # END EXERCISE


def apply_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None = None) -> None:
    """Mask the logits in place, the engine's fast path: logits[r] gets bitmask[r] for each r in `rows` (every row
    when None); the other rows, unconstrained requests, stay as they are.

    float32 logits on a CPU or a CUDA device go to xgrammar's kernel (its C++ loop on a CPU, Triton on CUDA);
    anything else to apply_token_bitmask, the pure-torch reference (exercise 16.1)."""
    if logits.dtype == torch.float32 and logits.device.type in ("cpu", "cuda"):
        import xgrammar as xgr  # only structured requests pay xgrammar's import (it imports transformers)

        bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
        return
    index = slice(None) if rows is None else torch.tensor(rows, device=logits.device)
    logits[index] = apply_token_bitmask(logits[index], bitmask.to(logits.device)[index])
