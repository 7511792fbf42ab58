"""The cross-rank sums and minima the replay buffer's sampling needs (training.replay_buffer):
torch.distributed's all-reduce over a process group, or a lone process's own values."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Collectives(Protocol):
    """What the buffer needs from its process group."""
    rank: int
    world_size: int

    def sum(self, t: torch.Tensor) -> torch.Tensor: ...  # all-reduce SUM, on t's device

    def min(self, t: torch.Tensor) -> torch.Tensor: ...  # all-reduce MIN, on t's device


class LocalCollectives:
    """A lone process: every reduction is the identity."""
    rank = 0
    world_size = 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def min(self, t: torch.Tensor) -> torch.Tensor:
        return t


LOCAL = LocalCollectives()


class TorchCollectives:
    """torch.distributed's all-reduce (gloo for CPU tensors, NCCL for CUDA tensors)."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def _all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        reduced = t.clone()  # the caller's tensor stays its own contribution
        dist.all_reduce(reduced, op=op, group=self.group)
        return reduced

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(t, dist.ReduceOp.SUM)

    def min(self, t: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(t, dist.ReduceOp.MIN)
