"""Tensor-parallel state: this process's rank and how many ranks share each weight matrix.

Layers ask here when they are built, so the same model code runs whole in one process (rank 0 of 1, when
torch.distributed is not initialised) and split across ranks in chapter 10.
"""
import torch
import torch.distributed as dist


def get_tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def divide(total: int, parts: int, what: str) -> int:
    """total / parts, or an error naming what does not split evenly across the ranks."""
    if total % parts:
        raise ValueError(f"{what} ({total}) does not split evenly across tensor_parallel_size={parts}: "
                         f"choose a size that divides it")
    return total // parts


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks, in place (nothing to do on one rank)."""
    if get_tp_size() > 1:
        dist.all_reduce(x)
    return x
