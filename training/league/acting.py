"""How a policy acts in a league (training.league.self_play): its learner network in the replicas
where it learns, and in each frozen replica the snapshot drawn when that replica's
episode started, kept until the episode ends.

A pool change never lands mid-episode. Each frozen replica acts on its own copy of its
snapshot's weights (`weights`, one row per replica, one batched product for all), taken
when its opponent is drawn and only then: a snapshot added to the pool, or one evicted
from the slot a replica drew, changes nothing for the episodes already under way. Each
pool slot carries a stamp (`Pool.stamp`, new at every add); a replica remembers the
stamp it drew (`drawn`). Its episode is credited to the slot it drew while the slot
still holds that snapshot, and to no snapshot (`credit` = the pool's size: a bin
`League.record` drops) once the slot was overwritten under it.

What runs per step is static and on the device (no host read): on the CPU the weights
are copied only at a step where an episode ended (asking costs no sync there), and
only the ended replicas' rows; on a GPU (a captured rollout) every step gathers every
frozen replica's drawn snapshot and keeps it only where that replica's episode ended.
"""
from __future__ import annotations

import torch


def spread(ids: list, device):
    """Replica ids as a slice where they are contiguous (views, no copies), else a tensor."""
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return slice(ids[0], ids[0] + len(ids))
    return torch.tensor(ids, device=device)


class LeagueActor:
    """One policy's acting in a league (see the module): `opponent` (a slot per frozen
    replica), the stamp it `drawn`, the slot its episode is credited to (`credit`) and
    whom each step faced (`faced`, for the rollout's statistics)."""
    state_size = 0

    def __init__(self, model, pool, learners: list, frozen: list, opponents: str,
                 rollout_len: int, device, static: bool = False):
        self.model, self.pool, self.opponents = model, pool, opponents
        self.lazy = not static and torch.device(device).type == "cpu"
        self.learn = spread(learners, device) if learners else None
        self.frozen = spread(frozen, device) if frozen else None
        first = int(pool.filled.nonzero()[0])  # (a snapshot; for a scripted side, its first)
        self.opponent = torch.full((len(frozen),), first, dtype=torch.long, device=device)
        self.drawn = torch.zeros(len(frozen), dtype=torch.long, device=device)
        self.credit = torch.zeros(len(frozen), dtype=torch.long, device=device)
        self.faced = torch.zeros((rollout_len, len(frozen)), dtype=torch.long, device=device)
        self.weights = pool.gather(self.opponent) if frozen else None
        self.restart()

    def restart(self):
        """Every frozen replica takes its slot's snapshot now (at the start, after a load):
        the weights gathered again, the stamps and credit taken from the pool."""
        if self.frozen is not None:
            self.pool.gather(self.opponent, out=self.weights)
            self.drawn.copy_(self.pool.stamp[self.opponent])
            self.recheck()

    def recheck(self):
        """The slot each replica's episode is credited to, after the pool changed: the one
        it drew where that slot still holds what it drew, else none (the pool's size)."""
        if self.frozen is not None:
            current = self.pool.stamp[self.opponent] == self.drawn
            torch.where(current, self.opponent, torch.full_like(self.opponent,
                                                                self.pool.size),
                        out=self.credit)

    def log_probs(self, obs, mask=None):
        return self._joined("log_probs", obs, mask)

    def sample(self, obs, deterministic: bool = False):
        return self._joined("sample", obs, deterministic)

    def _joined(self, method: str, obs, extra):
        """`method` of the learner on its replicas and of the snapshots on theirs, joined
        in replica order (each output: log-probabilities; or raw action, log-prob and the
        env's action)."""
        def part(where):
            mine = extra[where] if isinstance(extra, torch.Tensor) else extra
            if where is self.learn:
                return getattr(self.model, method)(obs[where], mine)
            return self.pool.act(method, self.opponent, obs[where], mine, tensors=self.weights,
                                 replicas=where)
        if self.frozen is None or self.learn is None:
            return part(self.learn if self.frozen is None else self.frozen)
        own, theirs = part(self.learn), part(self.frozen)
        single = isinstance(own, torch.Tensor)
        out = []
        for mine, other in zip((own,) if single else own, (theirs,) if single else theirs):
            whole = mine.new_empty(obs.shape[:-1] + mine.shape[obs.dim() - 1:])
            whole[self.learn] = mine
            whole[self.frozen] = other
            out.append(whole)
        return out[0] if single else tuple(out)

    def episode_ended(self, t: int, done: torch.Tensor):
        """Note whom the frozen replicas faced at step t; where their episode ended, draw
        their next opponent and take its weights (torch's generator; no host read)."""
        if self.frozen is None:
            return
        self.faced[t].copy_(self.credit)
        ended = done[self.frozen]
        if self.lazy and not bool(ended.any()):
            return
        drawn = torch.multinomial(self.pool.weights(self.opponents), self.opponent.shape[0],
                                  replacement=True)
        self.opponent.copy_(torch.where(ended, drawn, self.opponent))
        self.drawn.copy_(torch.where(ended, self.pool.stamp[drawn], self.drawn))
        self.credit.copy_(torch.where(ended, drawn, self.credit))
        self._take(ended)

    def _take(self, ended: torch.Tensor):
        """The drawn snapshots' weights into the rows of the replicas whose episode ended."""
        params, buffers = self.pool.nets.stacked()
        stacked = list(params.values()) + list(buffers.values())
        if self.lazy:  # (the CPU: the ended rows alone, read without a sync)
            rows = ended.nonzero()[:, 0]
            slots = self.pool.networks(self.opponent[rows])
            for mine, t in zip(self.weights, stacked):
                mine.index_copy_(0, rows, t[slots])
            return
        for mine, t in zip(self.weights, stacked):
            keep = ended.view(-1, *([1] * (mine.dim() - 1)))
            mine.copy_(torch.where(keep, t.index_select(0, self.pool.networks(self.opponent)),
                                   mine))

    def state_dict(self) -> dict:
        """Each frozen replica's draw, and the weights of the snapshots still played that
        the pool no longer holds (one copy per snapshot): a resumed episode plays on."""
        if self.frozen is None:
            return {"opponent": self.opponent.clone()}
        gone = (self.pool.stamp[self.opponent] != self.drawn).nonzero()[:, 0].tolist()
        first = {}
        for row in gone:
            first.setdefault(int(self.drawn[row]), row)
        rows = torch.tensor([first[int(self.drawn[r])] for r in gone], dtype=torch.long)
        keep = sorted(first.values())
        return {"opponent": self.opponent.clone(), "drawn": self.drawn.clone(),
                "gone": torch.tensor(gone, dtype=torch.long),
                "source": torch.tensor([keep.index(int(r)) for r in rows], dtype=torch.long),
                "kept": [w[torch.tensor(keep, dtype=torch.long, device=w.device)].clone()
                         for w in self.weights]}

    def load_state_dict(self, state: dict):
        self.opponent.copy_(state["opponent"])
        self.restart()
        if self.frozen is None or "drawn" not in state:
            return
        self.drawn.copy_(state["drawn"])
        gone = state["gone"].to(self.opponent.device)
        source = state["source"].to(self.opponent.device)
        for mine, kept in zip(self.weights, state["kept"]):
            if len(gone):
                mine[gone] = kept.to(mine.device)[source]
        self.recheck()
