"""Token embedding and the LM head that turns the last hidden state into next-token logits."""
import torch
from torch import nn

from minillm.layers.linear import copy_checked


def embed(input_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row lookup: token id t becomes weight[t] (the same as one_hot(t) @ weight, without the matmul)."""
    # BEGIN EXERCISE 02.1: embedding lookup — token id t becomes row t of the table, for ids of any shape
    return weight[input_ids]
    # END EXERCISE


def lm_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Score every vocabulary entry: hidden @ weight.T, one logit per token id."""
    # BEGIN EXERCISE 02.2: LM head — one logit per vocabulary entry: hidden dotted with each row of the table
    return hidden @ weight.T
    # END EXERCISE


class VocabParallelEmbedding(nn.Module):
    """The embedding table, [vocab_size, hidden_size] (split by vocabulary across ranks in chapter 10)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None):
        copy_checked(param.data, loaded_weight, "embedding")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; with tied embeddings it shares the embedding table's weight."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return lm_logits(hidden, self.weight)
