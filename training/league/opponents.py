"""One policy's opponents in a league (training.league.self_play): its snapshots, stacked, and
the env's scripted policies for that side where the run asks (`league_scripted`).

Slots 0..capacity-1 hold copies of the policy's network, frozen, stacked as a
population's members are (training.population.stacked), filled as snapshots are taken;
slots capacity.. hold the env's scripted policies (gpusim.scripted: a chaser, a fleer),
always filled, never evicted. A frozen replica draws a slot of either kind (uniformly,
the latest most, or by PFSP over both: the ones the learners beat least most often)
and plays it to its episode's end. Acting stays static: the snapshots' batched product
runs for every frozen replica, the scripted policies for every replica, and each
replica keeps the one it drew (no host read).
"""
from __future__ import annotations

import copy

import torch

from ..population.stacked import StackedPolicy


class Pool:
    """One policy's opponents: `capacity` copies of its network, stacked, frozen, then the
    `scripted` policies (objects of gpusim.scripted, acting on the training env)."""

    def __init__(self, model, capacity: int, device, scripted: tuple = ()):
        self.nets = StackedPolicy([copy.deepcopy(model) for _ in range(capacity)]).to(device)
        self.nets.requires_grad_(False)
        self.capacity = capacity
        self.scripted = tuple(scripted)
        self.size = capacity + len(self.scripted)  # every slot, either kind
        self.filled = torch.zeros(self.size, dtype=torch.bool, device=device)
        self.filled[capacity:] = True
        self.born = [-1] * capacity  # the update each network slot was taken at (-1: empty)
        self.recency = torch.ones(self.size, device=device)  # 1 + its rank by age: newest most
        self.games = torch.zeros(self.size, device=device)  # decayed counts of league games
        self.wins = torch.zeros(self.size, device=device)   # ... the learners won against it
        # which snapshot each slot holds: new at every add (a replica playing a slot since
        # overwritten plays on what it drew, credited to none: training.league.acting)
        self.stamp = torch.zeros(self.size, dtype=torch.long, device=device)
        self.stamp[capacity:] = -1 - torch.arange(len(self.scripted), device=device)
        self.adds = 0

    def add(self, model, update: int, eviction: str) -> int:
        """Copy `model` into a free slot, else into the one `eviction` names."""
        if -1 in self.born:
            slot = self.born.index(-1)
        elif eviction == "lowest":  # the weakest: the learners' best win rate against it
            slot = int(torch.argmax(self.win_rate()[:self.capacity]))  # one host read
        else:
            slot = min(range(self.capacity), key=lambda k: self.born[k])
        params, buffers = self.nets.stacked()
        own = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for name, stacked in {**params, **buffers}.items():
                stacked[slot].copy_(own[name])
        self.filled[slot] = True
        self.born[slot] = update
        order = sorted(range(self.capacity), key=lambda k: self.born[k])
        self.recency[:self.capacity] = torch.tensor([1.0 + order.index(k)
                                                     for k in range(self.capacity)])
        self.games[slot] = 0.0
        self.wins[slot] = 0.0
        self.adds += 1
        self.stamp[slot] = self.adds
        return slot

    def win_rate(self) -> torch.Tensor:
        """The learners' win rate against each snapshot (Laplace-smoothed: 1/2 unplayed)."""
        return (self.wins + 1.0) / (self.games + 2.0)

    def weights(self, opponents: str) -> torch.Tensor:
        """How often each filled slot is drawn (unnormalised)."""
        filled = self.filled.float()
        if opponents == "uniform":
            return filled
        if opponents == "latest":  # by recency rank: the newest weighs most
            return filled * self.recency
        return filled * ((1.0 - self.win_rate()) ** 2 + 1e-3)  # pfsp: the hardest most

    def networks(self, slots: torch.Tensor) -> torch.Tensor:
        """`slots` with a scripted slot read as network slot 0 (its weights go unused)."""
        return slots if not self.scripted else torch.where(slots < self.capacity, slots, 0)

    def gather(self, slots: torch.Tensor, out: list | None = None) -> list:
        """Every stacked tensor of the snapshots `slots` names (one per replica); into the
        tensors `out` where given (fixed: a captured rollout reads them)."""
        params, buffers = self.nets.stacked()
        stacked = list(params.values()) + list(buffers.values())
        slots = self.networks(slots)
        if out is None:
            return [t[slots] for t in stacked]
        for mine, t in zip(out, stacked):
            torch.index_select(t, 0, slots, out=mine)
        return out

    def act(self, method: str, slots: torch.Tensor, *inputs, tensors: list | None = None,
            replicas=slice(None)):
        """`method` of every replica's opponent (`slots`, one per replica of `replicas`) on
        its inputs (replicas, ...): the snapshots in one batched product (on `tensors`,
        their weights gathered already, where given), then each scripted policy where a
        replica drew it."""
        out = self.nets.lead(method, *inputs,
                             tensors=self.gather(slots) if tensors is None else tensors)
        for k, script in enumerate(self.scripted):
            mine = script.log_probs(None)[replicas]  # (scripted: discrete actions only)
            drew = (slots == self.capacity + k).view(-1, *([1] * (out.dim() - 1)))
            out = torch.where(drew, mine, out)
        return out

    def state_dict(self) -> dict:
        return {"nets": self.nets.state_dict(), "filled": self.filled.clone(),
                "born": list(self.born), "recency": self.recency.clone(),
                "games": self.games.clone(), "wins": self.wins.clone(),
                "stamp": self.stamp.clone(), "adds": self.adds}

    def load_state_dict(self, state: dict):
        self.nets.load_state_dict(state["nets"])
        self.born = list(state["born"])
        for name in ("filled", "recency", "games", "wins"):
            getattr(self, name).copy_(state[name])
        self.stamp.copy_(state["stamp"])
        self.adds = state["adds"]
