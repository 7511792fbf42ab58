"""What a PPO policy's minibatches are made of (`Units`), decided once per update.

A unit is a flat row of the rollout buffer (its (step, replica, agent) index), or for a
recurrent policy an agent's sequence of `bptt_len` rows. Every run has a member dim (a
solo run is a population of one), and each concept decides its own part once, here:

- members and a league: which replicas' rows each member trains on (`replicas`: member
  k's share of the replicas, or the replicas where a league's policy learns), in the
  order of its solo run's (step, replica, agent) rows;
- recurrent sequences: units of `bptt_len` rows from the stored sequence starts;
- rows out of play (per-agent done): weighing 0 (`out_of_play: weigh`, and in
  sequences), or left out (`skip`: a host read), except for a member with fewer rows in
  play than minibatches.

`minibatches` cuts one epoch's shuffled units into (members, units[, bptt_len]) rows and
their weights; members whose counts differ are padded with rows of their own weighing 0.
Which members a minibatch step trains is one object too (`learners`): every member
(`Everyone`), or the members still learning (`Learning`: their rows picked, their
statistics put back in place).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusim.errors import GpusimError

from ..losses import take


@dataclass
class Units:
    """One policy's units for an update."""
    rows: list                     # per member: (units, length) flat buffer rows
    weights: torch.Tensor | None   # every flat row's weight (None: every row counts)
    value_rows: torch.Tensor | None  # the flat rows whose values GAE reads (None: all)


torch.utils._pytree.register_dataclass(Units)  # (a captured update copies its tensors in)


@dataclass
class Everyone:
    """A minibatch step of every member (each member's rows as they are; a whole update's
    graph runs the members no longer learning too, at rate 0)."""
    index = None  # (the training pass and Adam: every member)

    def pick(self, x):
        return x

    def put(self, stats: torch.Tensor) -> torch.Tensor:
        return stats


@dataclass
class Learning:
    """A minibatch step of the members still learning, `index` (of `count`)."""
    index: torch.Tensor
    count: int

    def pick(self, x):
        """The learning members' part of `x` (members leading; None stays None)."""
        return x if x is None else x[self.index]

    def put(self, stats: torch.Tensor) -> torch.Tensor:
        """Statistics of the learning members in place among every member's (0 else)."""
        return stats.new_zeros((self.count,) + stats.shape[1:]).index_copy_(0, self.index,
                                                                            stats)


EVERYONE = Everyone()
# (a captured chunk copies the index in; its class is part of the graph's layout)
torch.utils._pytree.register_dataclass(Everyone)
torch.utils._pytree.register_dataclass(Learning)


def learners(alive: list, device, whole: bool):
    """Who a minibatch steps: everyone where the update is one graph (fixed) or where all
    members learn, else the members `alive` marks."""
    if whole or all(alive):
        return EVERYONE
    return Learning(torch.tensor([k for k, a in enumerate(alive) if a], device=device),
                    len(alive))


def replicas(count: int, envs: int, league_ids, device) -> list:
    """Each member's replicas: its share (member k's the k-th), or a league's learner's."""
    if league_ids is not None:
        return [torch.tensor(league_ids, device=device)]
    share = envs // count
    return [torch.arange(k * share, (k + 1) * share, device=device) for k in range(count)]


def make_units(buf, members: int, league_ids, per_agent_done: bool, bptt_len: int,
               out_of_play: str, num_minibatches: int, rows_valued: bool) -> Units:
    """Units of the rollout buffer `buf`: of `members` members' shares of the replicas, or
    of the replicas `league_ids` where a league's policy learns (None: no league);
    `rows_valued`: the critic can run on flat rows (one network, its own observations)."""
    shape = tuple(buf.rewards.shape)  # (steps, envs, agents)
    replicas_of = replicas(members, shape[1], league_ids, buf.rewards.device)
    active = buf.active.reshape(-1) if per_agent_done else None
    chosen = league_ids is not None  # a league picks the rows (fewer than the rollout's)
    weights = None if active is None else active.float()
    if bptt_len:  # (a population or league of recurrent policies is refused)
        return Units([sequences(shape, bptt_len, replicas_of[0].device)], weights, None)
    own = [member_rows(shape, r) for r in replicas_of]
    if active is not None and out_of_play == "skip":
        own, weights = in_play(own, active, num_minibatches)
        chosen = True
    # a lone critic's values of the rows trained only, where they are all that counts
    # (GAE never reads the others: a row in play and not done at t is in play at t + 1)
    valued = own[0] if rows_valued and chosen and weights is None else None
    return Units([rows[:, None] for rows in own], weights, valued)


def sequences(shape: tuple, length: int, device) -> torch.Tensor:
    """(sequences, length) flat rows: every agent's runs of `length` steps."""
    steps, envs, agents = shape
    per_step = envs * agents
    seq = torch.arange((steps // length) * per_step, device=device)
    starts = (seq // per_step) * length * per_step + seq % per_step
    return starts[:, None] + torch.arange(length, device=device) * per_step


def member_rows(shape: tuple, replicas_of: torch.Tensor) -> torch.Tensor:
    """The flat rows of replicas `replicas_of`, in (step, replica, agent) order."""
    steps, envs, agents = shape
    device = replicas_of.device
    return ((torch.arange(steps, device=device)[:, None, None] * envs + replicas_of[:, None])
            * agents + torch.arange(agents, device=device)).reshape(-1)


def in_play(own: list, active, num_minibatches: int) -> tuple:
    """Each member's rows in play (all of its rows where fewer than `num_minibatches` are),
    and the weights: None where one member's rows are all in play, else every row's."""
    kept = [rows[active[rows]] for rows in own]
    chosen = [k if k.shape[0] >= num_minibatches else rows for k, rows in zip(kept, own)]
    compacted = all(c.shape[0] == k.shape[0] for c, k in zip(chosen, kept))
    return chosen, None if compacted and len(own) == 1 else active.float()


def minibatches(units: Units, orders: list, num_minibatches: int, name: str):
    """One epoch's minibatches, each (rows (members, units[, length]), their weights or
    None): member k's units in the order `orders[k]`, cut into `num_minibatches` parts of
    `len // num_minibatches`; where members' parts differ in size (rows in play), the
    shorter are padded with rows of their own weighing 0."""
    picked = [u[o] for u, o in zip(units.rows, orders)]
    sizes = [len(p) // num_minibatches for p in picked]
    if min(sizes) == 0:  # fewer sequences than minibatches: nothing to split
        raise GpusimError(f"policy {name!r} has {min(len(p) for p in picked)} sequences per "
                          f"rollout, fewer than trainer.num_minibatches ({num_minibatches})")
    size, length = max(sizes), picked[0].shape[1]
    rows = torch.empty((num_minibatches, len(picked), size, length), dtype=torch.long,
                       device=picked[0].device)
    valid = None
    for k, (p, n) in enumerate(zip(picked, sizes)):
        part = p[:num_minibatches * n].view(num_minibatches, n, length)
        rows[:, k, :n] = part
        if n < size:
            rows[:, k, n:] = part[:, :1]
            valid = torch.ones(rows.shape[:3], device=rows.device) if valid is None else valid
            valid[:, k, n:] = 0.0
    rows = rows if length > 1 else rows[..., 0]
    for j in range(num_minibatches):
        if units.weights is None and valid is None:
            yield rows[j], None
        else:
            held = torch.ones(rows[j].shape, device=rows.device) if units.weights is None \
                else take(units.weights, rows[j])
            yield rows[j], held if valid is None else held * valid[j]
