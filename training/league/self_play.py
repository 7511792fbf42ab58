"""Self-play against opponent pools, on the device (`trainer.league`, PPO and A2C).

Each policy keeps a pool of its past selves: every `league_snapshot_every`
updates its acting network is copied, in place, into one slot of a fixed
number (`league_capacity`), stacked as a population's members are
(training.population.stacked); a full pool evicts its oldest snapshot, or its weakest
(`league_eviction: lowest`, the one the learners beat most often). The pools
start with each policy's initial network.

The replicas are split, once, among matchups (`Matchups`): a share
(`league_learner_share`) where every policy is the learner, as in plain
training, and for each policy an equal part of the rest where it learns
against snapshots of the others. In a replica where a policy is frozen, its
agents act as one snapshot, drawn when the replica's episode starts
(`league_opponents`: uniform, the latest more often, or prioritized fictitious
self-play: `pfsp`, the snapshots the learners beat least more often) and played
until it ends: a snapshot added or evicted meanwhile changes no episode under way
(training.league.acting). A policy trains only on the rows of replicas where it learns.

What runs per step is static: the snapshots of every frozen replica run as one
batched product, each replica on its own copy of its opponent's weights (taken
where its episode ends); the draws, the pool's fill and its
win rates are device tensors. So a rollout stays one CUDA graph and reads
nothing on the host. A win, for the learner of a replica, is an episode the env's
declared outcome says it won (gpusim.outcome); without one, an episode whose return
beats that learner's running mean return in its league games: a scale-free outcome
every env has (training.league.wins).
"""
from __future__ import annotations

import copy

import torch

from gpusim.errors import GpusimError
from gpusim.scripted import scripted_policies

from ..population.stacked import check_stack_fits
from .acting import LeagueActor
from .opponents import Pool
from .wins import LeagueOutcome

DECAY = 0.98  # per update: how fast a snapshot's win statistics forget older games


class Matchups:
    """Which replicas each policy learns in. Groups in this order: the first policy's
    own (it learns, the others are snapshots), every policy learning, then each other
    policy's own; so with two policies each one's learner and frozen replicas are
    contiguous. Policies `frozen` never learn: in every replica the others learn against
    their snapshots (`group` -1 there: no policy's own game)."""

    def __init__(self, names: list, num_envs: int, learner_share: float, device,
                 frozen: tuple = ()):
        if frozen:  # every replica: the others learn against the frozen ones' snapshots
            self.names = names
            every = list(range(num_envs))
            self.learners = {n: [] if n in frozen else every for n in names}
            self.frozen = {n: every if n in frozen else [] for n in names}
            self.group = torch.full((num_envs,), -1, dtype=torch.long, device=device)
            return
        solo_groups = len(names)
        together = round(num_envs * learner_share)
        rest = num_envs - together
        if rest < solo_groups or (learner_share > 0 and together == 0):
            raise GpusimError(f"trainer.league splits {num_envs} replicas among {solo_groups} "
                              "matchups of one learner and one where all learn: give "
                              "trainer.num_envs at least "
                              f"{solo_groups + (learner_share > 0)}")
        sizes = [rest // solo_groups + (k < rest % solo_groups) for k in range(solo_groups)]
        order = [("one", names[0]), ("all", None)] + [("one", n) for n in names[1:]]
        self.group = torch.empty(num_envs, dtype=torch.long)  # the learning policy, -1: all
        start = 0
        self.learners, self.frozen = {n: [] for n in names}, {n: [] for n in names}
        for kind, name in order:
            size = together if kind == "all" else sizes[names.index(name)]
            ids = list(range(start, start + size))
            self.group[start:start + size] = -1 if kind == "all" else names.index(name)
            for other in names:
                (self.learners if kind == "all" or other == name else self.frozen)[other] += ids
            start += size
        self.group = self.group.to(device)
        self.names = names

    def learner_ids(self, name: str) -> list:
        return self.learners[name]

    def frozen_ids(self, name: str) -> list:
        return self.frozen[name]


class League:
    """A PPO run's league (see the module): its matchups, each policy's pool and acting,
    the learners' win statistics, the snapshots."""

    def __init__(self, ppo):
        cfg, env, t = ppo.cfg, ppo.env, ppo.config.trainer
        self.cfg, self.distributed = cfg, ppo.distributed
        names = [p.name for p in ppo.policies]
        self.frozen = tuple(cfg.league_frozen)
        self.matchups = Matchups(names, env.num_envs, cfg.league_learner_share, env.device,
                                 self.frozen)
        self.pools, self.actors = {}, {}
        check_stack_fits(env.backend, f"trainer.league_capacity={cfg.league_capacity:,}: "
                         f"{len(names)} pools of that many snapshots",
                         [p.model for p in ppo.policies], cfg.league_capacity)
        shipped = scripted_policies(type(env)) if cfg.league_scripted else {}
        for p in ppo.policies:
            scripted = [cls(env, p.name) for cls in shipped.get(p.name, {}).values()]
            pool = self.pools[p.name] = Pool(p.model, cfg.league_capacity, env.device,
                                             scripted)
            if not (scripted and p.name in self.frozen):  # (a frozen side with scripted
                pool.add(p.model, 0, cfg.league_eviction)  # policies plays those alone)
            self.actors[p.name] = LeagueActor(p.model, pool, self.matchups.learner_ids(p.name),
                                              self.matchups.frozen_ids(p.name),
                                              cfg.league_opponents, t.rollout_len, env.device,
                                              ppo.static)
        # what a league game is won by (the env's outcome, else the return), and each
        # learner's running mean of it in its league games
        self.outcome = LeagueOutcome(env, names, t.rollout_len)
        self.baseline = torch.zeros(len(names), device=env.device)
        self.seen = torch.zeros(len(names), dtype=torch.bool, device=env.device)
        self.updates = 0

    def acting(self, name: str, model):
        return self.actors[name]

    def learns(self, name: str) -> bool:
        return name not in self.frozen

    def load_frozen(self, networks: dict):
        """Each frozen policy's pool: the network whose state dict `networks` holds under
        its name (its only snapshot: every frozen replica plays it)."""
        for name, state in networks.items():
            pool, actor = self.pools[name], self.actors[name]
            network = copy.deepcopy(actor.model)
            network.load_state_dict(state)
            pool.filled[:pool.capacity] = False
            pool.born = [-1] * pool.capacity
            pool.add(network, 0, "oldest")
            actor.opponent.zero_()
            actor.restart()

    def trains_on(self, name: str) -> list:
        """The replicas policy `name` learns in (its rows alone train it)."""
        return self.matchups.learner_ids(name)

    def learners(self, policies: list) -> list:
        """(index, policy) of the policies that learn (the frozen ones never do)."""
        return [(k, p) for k, p in enumerate(policies) if self.learns(p.name)]

    def counted(self, names: list, num_envs: int, device) -> dict:
        """Per policy, which replicas' episodes count as its own returns (where it learns)."""
        masks = {}
        for name in names:
            masks[name] = torch.zeros(num_envs, dtype=torch.bool, device=device)
            masks[name][self.matchups.learner_ids(name)] = True
        return masks

    def episode_ended(self, t: int, done: torch.Tensor):
        self.outcome.after_step(t, done)
        for actor in self.actors.values():
            actor.episode_ended(t, done)

    def record(self, episodes):
        """The rollout's league games (episodes that ended in a frozen replica): each
        snapshot's games and the learners' wins against it, and the learners' baselines;
        device operations only (under DDP, summed across ranks)."""
        if self.frozen:  # a best response: its one opponent needs no statistics
            return
        dones, returns = episodes.dones, episodes.returns  # (T, envs), (T, policies, envs)
        # (one bin more than slots: episodes whose snapshot was evicted under them, dropped)
        games = {n: p.games.new_zeros(p.size + 1) for n, p in self.pools.items()}
        wins = {n: p.wins.new_zeros(p.size + 1) for n, p in self.pools.items()}
        sums, counts = torch.zeros_like(self.baseline), torch.zeros_like(self.baseline)
        for name, actor in self.actors.items():
            if actor.frozen is None:
                continue
            done = dones[:, actor.frozen].float()
            learner = self.matchups.group[actor.frozen]  # each frozen replica's learner
            ret = self.outcome.value(returns, actor.frozen, learner)  # (T, replicas)
            win = self.outcome.wins(ret, learner, self.baseline) * done
            games[name].scatter_add_(0, actor.faced.reshape(-1), done.reshape(-1))
            wins[name].scatter_add_(0, actor.faced.reshape(-1), win.reshape(-1))
            sums.index_add_(0, learner, (ret * done).sum(0))
            counts.index_add_(0, learner, done.sum(0))
        if self.distributed:
            shared = [*games.values(), *wins.values(), sums, counts]
            flat = torch.cat(shared)
            torch.distributed.all_reduce(flat)
            for target, part in zip(shared, flat.split([len(t) for t in shared])):
                target.copy_(part)
        for name, pool in self.pools.items():
            pool.games.mul_(DECAY).add_(games[name][:-1])
            pool.wins.mul_(DECAY).add_(wins[name][:-1])
        mean = sums / counts.clamp_min(1.0)
        blended = torch.where(self.seen, 0.9 * self.baseline + 0.1 * mean, mean)
        self.baseline.copy_(torch.where(counts > 0, blended, self.baseline))
        self.seen |= counts > 0

    def after_update(self, policies):
        """Every `league_snapshot_every` updates, each policy's network into its pool."""
        self.updates += 1
        if self.updates % self.cfg.league_snapshot_every == 0:
            for p in policies:
                if self.learns(p.name):
                    self.pools[p.name].add(p.model, self.updates, self.cfg.league_eviction)
                    self.actors[p.name].recheck()  # (its replicas play on what they drew)

    def state_dict(self) -> dict:
        return {"pools": {n: p.state_dict() for n, p in self.pools.items()},
                "baseline": self.baseline.clone(), "seen": self.seen.clone(),
                "updates": self.updates}

    def load_state_dict(self, state: dict):
        for name, pool in self.pools.items():
            pool.load_state_dict(state["pools"][name])
        self.baseline.copy_(state["baseline"])
        self.seen.copy_(state["seen"])
        self.updates = state["updates"]
        for actor in self.actors.values():
            actor.restart()

    def rank_state_dict(self) -> dict:
        return {"acting": {n: a.state_dict() for n, a in self.actors.items()},
                "outcome": self.outcome.state_dict()}

    def load_rank_state_dict(self, state: dict):
        self.outcome.load_state_dict(state["outcome"])
        for name, actor in self.actors.items():
            actor.load_state_dict(state["acting"][name])
