"""A PPO update whose rows vary in number, its fixed-size parts replayed as CUDA graphs.

With per-agent done, most rows of a rollout can be out of play (in tag, about
two thirds of the runners' rows at rollout 100: they were caught). The update
leaves them out (`trainer.out_of_play: skip`), so its minibatches change size
from one rollout to the next, which one captured graph of the whole update
cannot follow. Here the update runs eagerly around graphs of fixed shapes:

- the value pass over the rows in play, in chunks of `max_minibatch_rows` rows
  (a graph: the critic on the chunk's rows);
- GAE over the rollout's buffers (a graph: its per-step recursion is one launch);

and each minibatch's rows go through a static chunk of `max_minibatch_rows`
rows, the last chunk padded with rows that weigh 0:

- the chunk step (a graph): the chunk's loss, its gradient (`autograd.grad`)
  added into gradient buffers that stay the parameters' `.grad`, and its
  statistics added into a running sum, each scaled by the chunk's share of the
  minibatch's rows;
- the optimizer step (a graph): clipping, Adam (capturable, its learning rate a
  device tensor), and the gradient buffers zeroed for the next minibatch.

Between them the host only copies each chunk's rows (advantages, returns)
into the chunk's inputs: a few copies per chunk, where the chunk runs hundreds
of kernels. The accumulated gradient is the minibatch's mean loss's, as the
eager chunks' (`PPO._minibatch_step`). On the CPU every part runs eagerly.
"""
from __future__ import annotations

import torch

from ..graphs import StepGraph
from .rollout import take


class ChunkedUpdate:
    """One policy's update in chunks of `rows` rows (see the module).

    `loss(group, batch, adv, returns, weights)` -> (statistics, loss): PPO's `_loss`;
    `critic(group, obs)` -> values: PPO's `_critic`; `gae(rewards, values, dones,
    next_value)` -> (advantages, returns).
    """

    def __init__(self, group, rows: int, loss, critic, gae, max_grad_norm: float,
                 num_stats: int, graphs: bool, timer=None):
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
        buf = group.buffer
        self.critic, self.gae = critic, gae
        self.chunk_values = torch.zeros(rows, device=device)
        self.next_value = torch.zeros(buf.values.shape[1:], device=device)
        self.advantages = torch.zeros_like(buf.values)
        self.returns_all = torch.zeros_like(buf.values)
        what = f"policy {group.name!r}'s"
        self.graphs = {
            "values": StepGraph(self._values, f"{what} value chunk", graphs, timer),
            "gae": StepGraph(self._gae, f"{what} GAE", graphs, timer),
            "chunk": StepGraph(self._chunk, f"{what} minibatch chunk", graphs, timer),
            "step": StepGraph(self._optimizer_step, f"{what} optimizer step", graphs, timer)}

    # ---- the rollout's values and advantages ---------------------------------------------
    def values(self, in_play: torch.Tensor):
        """The buffer's values of the flat rows `in_play` (the others 0, never read)."""
        values = self.group.buffer.values.view(-1).zero_()
        for start in range(0, in_play.shape[0], self.size):
            n = min(self.size, in_play.shape[0] - start)
            self.rows[:n].copy_(in_play[start:start + n])
            if n < self.size:
                self.rows[n:].copy_(in_play[start:start + 1].expand(self.size - n))
            self.graphs["values"]()
            values.index_copy_(0, in_play[start:start + n], self.chunk_values[:n])

    def _values(self):
        obs = self.group.buffer.obs
        self.chunk_values.copy_(self.critic(self.group, take(obs.view(-1, obs.shape[-1]),
                                                             self.rows)))

    def advantages_and_returns(self, next_value: torch.Tensor) -> tuple:
        """GAE over the buffer, after the last step's `next_value`: flat (advantages,
        returns), fixed tensors the next update overwrites."""
        self.next_value.copy_(next_value)
        self.graphs["gae"]()
        return self.advantages.view(-1), self.returns_all.view(-1)

    def _gae(self):
        buf = self.group.buffer
        advantages, returns = self.gae(buf.rewards, buf.values, buf.dones, self.next_value)
        self.advantages.copy_(advantages)
        self.returns_all.copy_(returns)

    # ---- a minibatch's gradient step -------------------------------------------------------

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
            self.graphs["chunk"]()
        self.graphs["step"]()
        return self.stats.clone()

    def warming_up(self) -> bool:
        return any(graph.warming_up() for graph in self.graphs.values())

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
        """Forget the graphs (the optimizer's state tensors were replaced)."""
        for graph in self.graphs.values():
            graph.drop()
