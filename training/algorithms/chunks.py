"""A PPO minibatch step whose rows vary in number, as fixed-size chunks replayed as CUDA graphs.

With per-agent done, most rows of a rollout can be out of play (in tag, about
two thirds of the runners' rows at rollout 100: they were caught). The update
leaves them out (`trainer.out_of_play: skip`), so its minibatches change size
from one rollout to the next, which one captured graph of the whole update
cannot follow. Here a minibatch's rows go through a static chunk of
`max_minibatch_rows` rows, the last chunk padded with rows that weigh 0:

- the chunk step (a graph): the chunk's loss, its gradient (`autograd.grad`)
  added into gradient buffers that stay the parameters' `.grad`, and its
  statistics added into a running sum, each scaled by the chunk's share of the
  minibatch's rows;
- the optimizer step (a graph): clipping, Adam (capturable, its learning rate a
  device tensor), and the gradient buffers zeroed for the next minibatch.

Between them the host only copies each chunk's rows, advantages and returns
into the chunk's inputs: a few copies per chunk, where the chunk runs hundreds
of kernels. The accumulated gradient is the minibatch's mean loss's, as the
eager chunks' (`PPO._minibatch_step`). On the CPU both steps run eagerly.
"""
from __future__ import annotations

import torch

from ..graphs import StepGraph


class ChunkedStep:
    """One policy's minibatch step in chunks of `rows` rows (see the module).

    `loss(group, batch, adv, returns, weights)` -> (statistics, loss): PPO's `_loss`.
    """

    def __init__(self, group, rows: int, loss, max_grad_norm: float, num_stats: int,
                 graphs: bool, timer=None):
        device = group.buffer.rewards.device
        self.group, self.loss, self.max_grad_norm = group, loss, max_grad_norm
        self.size = rows
        # the chunk's inputs, filled in place before each replay
        self.rows = torch.zeros(rows, dtype=torch.long, device=device)
        self.weights = torch.zeros(rows, device=device)  # 1: a row of the minibatch, 0: padding
        self.adv = torch.zeros(rows, device=device)
        self.returns = torch.zeros(rows, device=device)
        self.total = torch.ones((), device=device)       # the minibatch's rows
        self.stats = torch.zeros(num_stats, device=device)
        self.params = [p for p in group.model.parameters() if p.requires_grad]
        self.grads = [torch.zeros_like(p) for p in self.params]
        self.filled = 0  # rows of `weights` now 1, the rest 0 (-1: other weights)
        what = f"policy {group.name!r}'s minibatch"
        self.chunk_graph = StepGraph(self._chunk, f"{what} chunk", graphs, timer)
        self.step_graph = StepGraph(self._optimizer_step, f"{what} optimizer step", graphs,
                                    timer)

    def __call__(self, rows: torch.Tensor, adv: torch.Tensor, returns: torch.Tensor,
                 weights: torch.Tensor | None, total):
        """One gradient step on buffer rows `rows` (flat) with their normalised advantages,
        returns and weights (None: every row counts), `total` the weights' sum; returns the
        minibatch's statistics."""
        for p, grad in zip(self.params, self.grads):
            p.grad = grad  # (an eager zero_grad elsewhere may have set it to None)
        count = rows.shape[0]
        self.total.fill_(total)
        self.stats.zero_()
        for start in range(0, count, self.size):
            n = min(self.size, count - start)
            part = slice(start, start + n)
            self.rows[:n].copy_(rows[part])
            self.adv[:n].copy_(adv[part])
            self.returns[:n].copy_(returns[part])
            self._pad(n, rows[start:start + 1], None if weights is None else weights[part])
            self.chunk_graph()
        self.step_graph()
        return self.stats.clone()

    def warming_up(self) -> bool:
        return self.chunk_graph.warming_up() or self.step_graph.warming_up()

    def _pad(self, n: int, first: torch.Tensor, weights: torch.Tensor | None):
        """The chunk's weights (its rows' own, else 1) and, from row n on, padding: weight
        0, each a copy of the chunk's first row (finite terms, so 0 times them is 0)."""
        if weights is not None:
            self.weights[:n].copy_(weights)
            self.weights[n:].zero_()
            self.filled = -1
        elif n != self.filled:
            self.weights[:n].fill_(1.0)
            self.weights[n:].zero_()
            self.filled = n
        if n < self.size:
            self.rows[n:].copy_(first.expand(self.size - n))

    def _chunk(self):
        g = self.group
        stats, loss = self.loss(g, g.buffer.rows(self.rows), self.adv, self.returns,
                                self.weights)
        share = self.weights.sum() / self.total  # the chunk's part of the minibatch's weight
        grads = torch.autograd.grad(loss * share, self.params, allow_unused=True,
                                    materialize_grads=True)
        torch._foreach_add_(self.grads, grads)
        self.stats.add_(stats * share)

    def _optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.group.optimizer.step()
        torch._foreach_zero_(self.grads)

    def drop(self):
        """Forget both graphs (the optimizer's state tensors were replaced)."""
        self.chunk_graph.drop()
        self.step_graph.drop()
