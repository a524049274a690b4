"""The Qwen3 decoder; Qwen2 and Llama are the same network with a few switches (see minillm.config).

Tokens arrive flat: input_ids and positions are 1-D, hidden states are [tokens, hidden_size]. Under pipeline
parallelism (chapter 15) a rank builds one stage: its own layers, the embedding on the first stage, the final norm
and the LM head on the last (see minillm.utils.pipeline).
"""

from itertools import islice

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.layers.activation import SiluAndMul
from minillm.layers.attention import Attention
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minillm.layers.rms_norm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.utils.parallel import divide, get_tp_size
from minillm.utils.pipeline import IntermediateTensors, PPMissingLayer, get_pp_rank, get_pp_size, make_layers


class Qwen3Attention(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding):
        super().__init__()
        c = config
        tp_size = get_tp_size()  # each tensor-parallel rank computes its share of the heads
        self.num_heads = divide(c.num_attention_heads, tp_size, "attention heads")
        self.num_kv_heads = divide(c.num_key_value_heads, tp_size, "key/value heads")
        self.head_dim = c.head_dim
        self.qkv_proj = QKVParallelLinear(
            c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, bias=c.qkv_bias
        )
        self.o_proj = RowParallelLinear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.rotary_emb = rotary_emb  # one cos/sin table, shared by every layer
        self.attn = Attention(self.num_heads, c.head_dim, c.head_dim**-0.5, self.num_kv_heads)
        if c.qk_norm:  # Qwen3 normalises each query and key head before the rotation
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.qk_norm = c.qk_norm

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v).flatten(1))


class Qwen3MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up packed in one matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, [c.intermediate_size] * 2, bias=c.mlp_bias)
        self.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)); the residual add is fused into the norms."""

    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = Qwen3Attention(config, rotary_emb)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.is_first_stage, self.is_last_stage = get_pp_rank() == 0, get_pp_rank() == get_pp_size() - 1
        # a tied LM head is the embedding table: the last stage holds it too (unused for lookups)
        has_table = self.is_first_stage or (c.tie_word_embeddings and self.is_last_stage)
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size) if has_table else PPMissingLayer()
        rotary_emb = RotaryEmbedding(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling)
        self.start_layer, self.end_layer, self.layers = make_layers(
            c.num_hidden_layers, lambda: Qwen3DecoderLayer(c, rotary_emb)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps) if self.is_last_stage else PPMissingLayer()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: IntermediateTensors | None = None
    ) -> torch.Tensor | IntermediateTensors:
        """The final hidden states; under pipeline parallelism a stage's part: the first embeds input_ids, a later
        one starts from what the stage before handed on (`intermediate`), and every stage but the last hands its
        hidden states and residual on in turn."""
        hidden, residual = (self.embed_tokens(input_ids), None) if intermediate is None else intermediate
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden, residual = layer(positions, hidden, residual)
        if not self.is_last_stage:
            return IntermediateTensors(hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3ForCausalLM(nn.Module):
    """Decoder plus LM head. `packed_modules_mapping` tells the loader which checkpoint tensors share a matmul."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = PPMissingLayer()  # the last stage's
        if self.model.is_last_stage:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
            if config.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: IntermediateTensors | None = None
    ) -> torch.Tensor | IntermediateTensors:
        """Hidden states [tokens, hidden_size] for flat input_ids and positions (a stage's, see Qwen3Model)."""
        return self.model(input_ids, positions, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
