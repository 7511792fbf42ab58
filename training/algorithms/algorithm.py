"""What every algorithm shares: the interface the run loop drives, and its plumbing.

The loop (training.loop) calls, once per iteration, `collect(env_steps)` (a
rollout of `rollout_len` steps over every replica) then `update(lr)` (every
policy learns; per reported name, a dict of statistics), and for checkpoints
`state_dict` / `load_state_dict` (the same on every rank: models,
optimizers, generators) and `rank_state_dict` / `load_rank_state_dict`
(this rank's own, such as a replay shard). Every algorithm says who still learns:
`alive` and `finished` (one entry per population member; one for a solo run) and
`finish(k, iteration)`, the target reached. The loop never asks which algorithm it
drives.
"""
from __future__ import annotations

import torch

from gpusim.errors import GpusimError
from gpusim.spaces import agent_index

from ..episodes import EpisodeTracker
from ..speed.acceleration import compile_enabled, resolve_precision, use_disk_cache
from ..speed.graphs import graphs_enabled
from ..population.members import (finite_members, restore_member, size as population_size,
                                  stacked_state)


class Algorithm:
    Config = None           # its config dataclass: its own `trainer` keys and their defaults
    stats: tuple = ()       # the statistics `update` returns per policy
    auto_scales = False     # whether --auto_scale can size its runs (rollout sizes set its pace)
    captures_graphs = False  # whether its steps are static, to be replayed as CUDA graphs

    def __init__(self, config, env, context, timer):
        """`config`: the RunConfig; `env`: this rank's replicas; `context`: the rank
        (`rank`, `world_size`); `timer`: the loop's section timer."""
        self.config = config
        self.cfg = config.algo
        self.env = env
        self.timer = timer
        self.rank, self.world_size = context.rank, context.world_size
        self.distributed = self.world_size > 1
        # `static`: the steps take the form a CUDA graph can replay (fixed shapes, no host
        # read); `use_graphs`: they are captured and replayed (training.speed.graphs), on a CUDA
        # device. (Tests build the static form on the CPU, where it runs eagerly.)
        self.static = graphs_enabled(config.trainer.cuda_graphs, env.device) \
            and self.graphs_supported(config.trainer)
        self.use_graphs = self.static and env.device.type == "cuda"
        self.precision = resolve_precision(config.trainer.precision, env.device,
                                           self.use_graphs)
        self.use_compile = compile_enabled(config.trainer.compile, env.device,
                                           self.compiling_pays_on_cpu(), self.use_graphs)
        if self.use_compile:
            use_disk_cache()
        # Rollout-sized forwards compile only on a GPU: on the CPU a compiled call costs
        # more than the few eager operators it replaces (docs/benchmarks.md, "compiled").
        self.compile_acting = self.use_compile and env.device.type == "cuda"
        self.agents = {name: agent_index(spec.agent_ids, env.device)
                       for name, spec in env.policy_specs.items()}
        rollout_len = config.trainer.rollout_len
        env.backend.check_fits(f"the rollout's episode log ({rollout_len} steps x {env.num_envs:,} "
                               "replicas)", 4 * rollout_len * env.num_envs * (len(self.agents) + 1))
        self.episodes = EpisodeTracker(env, rollout_len, self.agents)

    def graphs_supported(self, trainer) -> bool:
        """Whether this algorithm captures its steps; `cuda_graphs: on` where it does not is
        refused in one line (auto runs it eagerly)."""
        if not self.captures_graphs and trainer.cuda_graphs == "on":
            raise GpusimError(f"config key 'trainer.cuda_graphs' on: {trainer.algorithm} does "
                              "not capture its steps as CUDA graphs yet (use auto or off)")
        return self.captures_graphs

    # ---- who still learns (the off-policy learners and populations: their `members`) -----
    @property
    def alive(self) -> list:
        return self.members.alive

    @property
    def finished(self) -> list:
        return self.members.finished

    def finish(self, k: int, iteration: int):
        """Member k (of a solo run: the run) reached the target: it stops learning."""
        self.members.finish(k, iteration)

    def compiling_pays_on_cpu(self) -> bool:
        """Whether `trainer.compile: auto` compiles this run's learner on the CPU too, where
        a first compile takes tens of seconds (later runs load it from the disk cache in a
        few). Default: no (PPO's recipes run a few thousand short minibatch steps)."""
        return False

    def check_models_fit(self, networks: int):
        """Refuse, before allocating, policy networks that cannot fit the device."""
        from ..models import training_bytes
        need = sum(training_bytes(spec, self.config.policy, networks)
                   for spec in self.env.policy_specs.values())
        count = population_size(self.config.trainer)
        members = f" of a population of {count} (trainer.population)" if count > 1 else ""
        self.env.backend.check_fits(f"training the policy networks{members} (policy.hidden_sizes "
                                    f"{list(self.config.policy.hidden_sizes)})", need)

    @property
    def next_obs(self) -> torch.Tensor:
        """The observation the next rollout step acts on: the env's own buffer."""
        return self.env.arrays["obs"]

    def observe(self, name: str, obs: torch.Tensor) -> torch.Tensor:
        """Policy `name`'s view of an (envs, agents, obs) array: its agents, its entries."""
        return obs[:, self.agents[name], :self.env.policy_specs[name].obs_dim]

    # ---- what the loop drives ------------------------------------------------------
    def collect(self, env_steps: int):
        raise NotImplementedError

    def update(self, lr: float) -> dict:
        raise NotImplementedError

    def guarded(self, update, learning: bool = True) -> dict:
        """`update()` (every policy's update; their statistics as one tensor, policies x
        members x statistics, a solo run's member dim optional), `members_reported`."""
        before = self.saved(learning)
        return self.members_reported(update(), before)

    def saved(self, learning: bool = True):
        """A population's training state before an update that learns (None: a solo run's,
        or nothing learns), for `members_reported` to put a diverged member back."""
        if learning and not self.members.solo:
            return [stacked_state(self.tensors(p)) for p in self.policies]
        return None

    def members_reported(self, stats: torch.Tensor, before) -> dict:
        """An update's statistics (policies x members x statistics), read once; a
        population's member whose statistics or parameters stopped being finite put back
        to its state `before` and frozen. The statistics by reported name (of the members
        still learning)."""
        members, policies = self.members, self.policies
        values = stats.reshape(len(policies), members.count, -1).tolist()  # one host read
        if before is not None:
            finite = finite_members([q for p in policies for q in p.model.parameters()],
                                    members.count)
            members.freeze_diverged(values, finite, lambda k: [
                restore_member(self.tensors(p), saved, k) for p, saved in zip(policies, before)])
        return members.report([p.name for p in policies],
                              [[dict(zip(self.stats, m)) for m in v] for v in values])

    @staticmethod
    def tensors(p) -> list:
        """Every tensor of a policy's training state (a population's: members leading)."""
        raise NotImplementedError

    def reported_names(self) -> list:
        """The names the loop keeps episode returns and statistics under: the policies (a
        population: each policy of each member)."""
        return self.members.names(self.env.policy_specs)

    def warming_up(self) -> bool:
        """Whether the next iteration still prepares the steady one (captures a CUDA graph):
        timing starts after it."""
        return False

    def models(self) -> dict:
        """Policy name -> its module (every trained parameter: the finite check reads them)."""
        raise NotImplementedError

    def rollout_outputs(self) -> tuple:
        """(name -> tensor, name -> its axes' names): what the env returned in the last
        rollout as the algorithm keeps it, where a diverged run looks for a non-finite
        source before blaming the learning."""
        return {}, {}

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict):
        raise NotImplementedError

    def check_policies(self, state: dict, *parts: str):
        """Refuse a checkpoint state whose `parts` (per-policy dicts) miss a policy."""
        for part in parts:
            held = state.get(part) if isinstance(state, dict) else None
            held = held if isinstance(held, dict) else {}
            absent = [name for name in self.env.policy_specs if name not in held]
            if absent:
                raise GpusimError(f"the checkpoint's {part} have no policy {absent[0]!r} "
                                  f"(it holds {', '.join(map(repr, held)) or 'none'})")

    def rank_state_dict(self) -> dict:
        return {}

    def load_rank_state_dict(self, state: dict):
        pass

    @classmethod
    def acting_model(cls, config, env, spec):
        """A fresh policy model of this algorithm for `spec`, as evaluation acts with it."""
        raise NotImplementedError

