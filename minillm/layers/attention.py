"""Attention: each token's query looks at the keys of itself and the tokens before it (causal)."""

import functools
import itertools
import weakref

import torch
from torch import nn

from minillm.layers.activation import SiluAndMul
from minillm.layers.cpu_kernels import (
    cpu_kernels,
    embed_packed,
    linear_packed,
    norm_cpu,
    pack_weights,
    paged_decode_attention_cpu,
    release_freed_memory,
    rotary_cpu,
    silu_and_mul_cpu,
    store_kvcache_cpu,
)
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.linear import LinearBase, RowParallelLinear
from minillm.layers.paged_attention import (
    gather_context,
    paged_decode_attention,
    prefill_attention,
    store_decode_kvcache,
    store_kvcache,
)
from minillm.layers.rms_norm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.utils.context import Context, get_context


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention over one sequence.

    q is [tokens, num_heads, head_dim]; k and v are [tokens, num_kv_heads, head_dim], where num_heads is a
    multiple of num_kv_heads and each KV head is shared by group = num_heads / num_kv_heads consecutive query
    heads: query head h reads KV head h // group (with 8 query heads and 2 KV heads, heads 0-3 read KV head 0
    and heads 4-7 read KV head 1). scale is a float, usually head_dim ** -0.5. For every query head h and
    query position t, over the key positions s:

        score(t, s) = scale · (q[t, h] · k[s, h // group])     and −inf where s > t (a future token)
        p(t, s)     = softmax over s of score(t, s)             (each row sums to 1)
        out[t, h]   = Σ_s p(t, s) · v[s, h // group]

    Returns [tokens, num_heads, head_dim] in q's dtype; compute in float32. Output t must not depend on any
    later token (a test changes the last keys and values and checks that earlier outputs stay the same). The
    tests compare with torch's scaled_dot_product_attention(is_causal=True) for one token, num_kv_heads ==
    num_heads (MHA), GQA, and a single KV head (MQA).

    Example: one head, head_dim 1, scale 1, q = k = [[[1]], [[1]]], v = [[[2]], [[4]]]: token 0 sees only
    itself, out 2; token 1 weighs both keys equally (scores 1 and 1), out 3.
    """
    # BEGIN EXERCISE 03.3: causal GQA attention — share KV heads, scale scores, mask the future, softmax, weight V
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    n = q.shape[0]
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
    # END EXERCISE


class TorchAttentionBackend:
    """Attention over the paged cache in plain torch ops, on any device: the reference every other backend
    (the CPU kernel below, chapter 09's Triton kernels) is checked against, and the one the exercises plug into.

    On a CPU, decode attention runs in chunks of `decode_rows` sequences, each gathering and masking only up to
    its own longest context: torch's CPU attention kernel slows down far more than linearly with the batch
    (measured: 128 sequences of 32-512 tokens take 3.8x longer in one call than in chunks of 16). The model
    runner orders a decode batch by length, so the sequences of a chunk have similar lengths.
    """

    name = "torch"
    decode_rows = 16

    def prepare_model(self, model: nn.Module) -> None:
        """After loading: give the layers the kernels this backend runs instead of their torch functions (each
        layer's `kernel`), and the weights the layout those read. Here: none; the torch functions and F.linear."""

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context) -> None:
        if ctx.is_prefill:  # slot -1: a token whose key is in a cached prefix block already, skipped
            store_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)
        else:  # one token per row, padded rows to the spare slot: no mask, so a CUDA graph can record it
            store_decode_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)

    def prefill(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if ctx.block_tables is not None:  # some keys were computed in earlier steps: read them all from the cache
            k = gather_context(k_cache, ctx.block_tables, ctx.cu_seqlens_k_cpu)
            v = gather_context(v_cache, ctx.block_tables, ctx.cu_seqlens_k_cpu)
        return prefill_attention(q, k, v, ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu, scale)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor | None:
        """A decode step's store and attention as one op a compiled step calls directly (no Python in between),
        reading the step's tensors from the graph's inputs; None where the backend has none (then the compiled
        step calls the opaque attention_op)."""
        return None

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if not q.is_cpu:
            return paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)
        out, block_size = [], k_cache.shape[1]
        for a in range(0, len(q), self.decode_rows):
            b = a + self.decode_rows
            width = -(-max(ctx.context_lens_cpu[a:b]) // block_size)
            out.append(
                paged_decode_attention(
                    q[a:b], k_cache, v_cache, ctx.block_tables[a:b, :width], ctx.context_lens[a:b], scale
                )
            )
        return torch.cat(out)


class CPUAttentionBackend(TorchAttentionBackend):
    """The torch backend, plus minillm's C++ kernels for a CPU (minillm.layers.cpu_kernels, compiled on first
    use), as vLLM's CPU backend has its own: float32 decode attention that reads each sequence's keys and values
    in place through its block table instead of copying them out first (2-9x faster than the chunked torch
    path), the store of each step's keys and values (one copy per token instead of indexed writes), and the
    linear layers' matmuls on weights packed once at load (the packed layout replaces the plain one), which
    BLAS would repack on every call: a matrix-vector product for one or two rows that streams them at the memory's
    speed, a register-tiled product for more. Where the kernels cannot be built it is the torch backend."""

    name = "cpu"

    def __init__(self):
        self.built = cpu_kernels()

    def prepare_model(self, model: nn.Module) -> None:
        """Every float32 weight a layer's forward multiplies by its kernel is replaced by its packed layout (one
        copy: the plain one is freed), the tied embedding table included, which then looks rows up in it; the
        norms, the activation and the rotary embedding get their C++ kernels."""
        tables = {id(m.weight): m for m in model.modules() if type(m) is VocabParallelEmbedding}
        layers = [
            m
            for m in model.modules()
            if runs_kernel(m)
            and m.weight.is_cpu
            and m.weight.dtype == torch.float32
            and (id(m.weight) not in tables or tables[id(m.weight)].tp_size == 1)
        ]
        if not self.built or not layers:
            return
        for layer, packed in zip(layers, pack_weights([m.weight for m in layers])):
            weight, layer.weight = layer.weight, nn.Parameter(packed, requires_grad=False)
            layer.kernel = functools.partial(linear_packed, out_features=weight.shape[0])
            if id(weight) in tables:  # tied: the embedding reads its rows out of the packed table
                tables[id(weight)].weight, tables[id(weight)].kernel = layer.weight, embed_packed
        del weight
        release_freed_memory()
        native = {RMSNorm: norm_cpu, SiluAndMul: silu_and_mul_cpu, RotaryEmbedding: rotary_cpu}
        for layer in model.modules():  # the elementwise layers: one C++ call each instead of 5-10 torch ops
            if type(layer) in native:
                layer.kernel = native[type(layer)]

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context) -> None:
        if k.is_cpu and self.built:
            store_kvcache_cpu(k, v, k_cache, v_cache, ctx.slot_mapping, ctx.is_prefill)
        else:
            super().store_kvcache(k, v, k_cache, v_cache, ctx)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        if q.is_cpu and q.dtype == torch.float32 and self.built:
            return paged_decode_attention_cpu(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)
        return super().decode(q, k_cache, v_cache, ctx, scale)

    def decode_in_graph(self, q, k, v, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor | None:
        if q.is_cpu and q.dtype == torch.float32 and self.built:
            return torch.ops.minillm_cpu.decode_attention(
                q, k, v, k_cache, v_cache, ctx.slot_mapping, ctx.block_tables, ctx.context_lens, scale
            )
        return None


class TritonAttentionBackend(TorchAttentionBackend):
    """Chapter 09's Triton kernels (minillm.kernels) for the two per-step pieces of attention that have no good
    framework kernel: storing the new keys and values into their scattered slots (one program per token,
    slot -1 skipped, no mask and no host sync) and decode attention read through the block tables (one
    program per sequence and KV head, an online softmax over its blocks). Prefill attention stays on the torch
    path (the inherited `prefill`): it is one fused SDPA call per sequence already.

    On CUDA the kernels are compiled. On a CPU they run only in Triton's interpreter, which needs
    TRITON_INTERPRET=1 in the environment before minillm.kernels is first imported; without it the first step
    raises an error that says so. Slow, but the same kernel source: the tests prove the wiring that way.
    """

    name = "triton"

    def __init__(self):
        from minillm import kernels  # here, not at the top: Triton reads TRITON_INTERPRET when kernels are defined

        self.kernels = kernels

    def store_kvcache(self, k, v, k_cache, v_cache, ctx: Context) -> None:
        self.kernels.store_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)

    def decode(self, q, k_cache, v_cache, ctx: Context, scale: float) -> torch.Tensor:
        return self.kernels.paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)


def runs_kernel(layer: nn.Module) -> bool:
    """Whether the layer's forward multiplies by its `kernel`: a linear layer or the LM head, but not a
    row-parallel layer split across ranks (row_parallel_linear takes the plain weight)."""
    if isinstance(layer, RowParallelLinear):
        return layer.tp_size == 1
    return isinstance(layer, (LinearBase, ParallelLMHead))


ATTENTION_BACKENDS = {"torch": TorchAttentionBackend, "cpu": CPUAttentionBackend, "triton": TritonAttentionBackend}


def triton_compiles() -> bool:
    """Whether Triton kernels would be compiled here: Triton imports (CUDA builds of torch ship it) and
    TRITON_INTERPRET is off (the interpreter copies every tensor to the host on each launch)."""
    try:
        import triton
    except ImportError:
        return False
    return not triton.knobs.runtime.interpret


def select_attention_backend(name: str = "auto", device: str | torch.device = "cpu"):
    """The one place an attention backend is chosen: "auto" takes the fastest one for `device` (the Triton
    kernels on CUDA when they compile, the C++ decode kernel on a CPU, the torch reference otherwise), or name
    one of ATTENTION_BACKENDS."""
    if name == "auto":
        cuda = torch.device(device).type == "cuda"
        name = ("triton" if triton_compiles() else "torch") if cuda else "cpu"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention_backend {name!r}: choose 'auto' or one of {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()


class Attention(nn.Module):
    """The attention step of a layer, given already-projected and rotated q, k, v.

    With no step context (chapter 03) it attends over the given tokens as one sequence. With a context and a
    KV cache (chapters 04+), it first stores the new keys/values in their cache slots, then runs prefill
    attention over packed sequences, or decode attention of one query per sequence over the paged cache,
    with the backend the model runner chose.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])  # views into the engine's cache, set by the runner
        self.backend = TorchAttentionBackend()
        self.layer_id = next(_layer_ids)
        _LAYERS[self.layer_id] = self

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # inside torch.compile: the backend's decode op, or one opaque op
            ctx = get_context()
            if ctx is not None and not ctx.is_prefill and self.k_cache.numel():
                out = self.backend.decode_in_graph(q, k, v, self.k_cache, self.v_cache, ctx, self.scale)
                if out is not None:
                    return out
            return attention_op(q, k, v, self.layer_id)
        return self.attend(q, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if ctx is None:
            return causal_attention(q, k, v, self.scale)
        if self.k_cache.numel():
            self.backend.store_kvcache(k, v, self.k_cache, self.v_cache, ctx)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, self.k_cache, self.v_cache, ctx, self.scale)
        return self.backend.decode(q, self.k_cache, self.v_cache, ctx, self.scale)


_layer_ids = itertools.count()
_LAYERS: "weakref.WeakValueDictionary[int, Attention]" = weakref.WeakValueDictionary()


@torch.library.custom_op("minillm::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """A layer's whole attention (store the new keys and values, then attend) as one operator that
    torch.compile does not look into, as vLLM's `unified_attention`: its work depends on the step's host-side
    lists (sequence lengths), which a compiled graph would otherwise freeze in, and it writes the KV cache,
    which the graph would otherwise copy. The layer is found by its id, so only tensors cross the boundary."""
    return _LAYERS[layer_id].attend(q, k, v)


@attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    return torch.empty_like(q)  # what the compiler needs to know: the output's shape, dtype and device
