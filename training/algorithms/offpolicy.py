"""The off-policy core that DDPG, TD3 and SAC share: replay on the device, the rollout, the
gradient-step loop, target networks and checkpoints.

Read top to bottom: the config; a policy's group (its networks, from
offpolicy_networks.py, its optimizers and replay shard); the `OffPolicy`
algorithm: `collect` (a rollout of `rollout_len` steps over every replica:
uniformly random actions for the first `learning_starts` env steps, then the
actor's, with exploration; every agent-step in play goes into its policy's
replay ring, on the device) and `update` (`replay_ratio` x this
process's env steps gradient steps per policy, each: sample a batch, step
the critics towards the algorithm's target, and when due the actor). The
gradient step is written once, over the networks' parameters, and run by a
training.fused executor: one compiled call (`trainer.compile`), or eagerly; on
a CUDA device the rollout and the gradient step are replayed as CUDA graphs
where their sample is static (`graphs_supported`).
What differs between the algorithms is a few methods: `next_action` (the
action and entropy term the target is taken at), `actor_due`, `actor_loss`
and SAC's `alpha_loss` (ddpg.py, td3.py, sac.py).

Actions live in [-1, 1] per dimension here (the actor's tanh); the env gets
them scaled into its Box. Transitions keep the true final observation of a
finished replica and bootstrap across truncations but not terminations
(nor across an agent's own finish, with per-agent done).

With several processes each keeps its own replay shard and its own
replicas; one gradient step draws `batch_size` transitions from the union of
the shards (training.replay: each shard supplies its share, so sampling is
that of one global buffer), each loss is a sum over the rank's samples
divided by `batch_size`, and gradients are summed across ranks, so every
rank takes the same step and the models stay identical.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from gpusim.config import require
from gpusim.errors import GpusimError

from ..acceleration import MaybeCompiled, adam, load_keeping_lr, plain_lr
from ..actors import Actors
from ..fused import EagerDescent, FusedStep
from ..replay import LOCAL, ReplayBuffer, TorchCollectives
from .base import Algorithm
from .offpolicy_graphs import OffPolicyGraphs
from .offpolicy_networks import NetsOn, OffPolicyModel

# On the CPU a compiled gradient step saves about 5 ms (12.7 -> 7.9 ms, SAC 256x256, one
# thread) and a first compile costs about 25 s: `compile: auto` compiles from this many
# gradient steps in a run (docs/benchmarks.md, "compiled learner").
CPU_COMPILE_MIN_STEPS = 5000


@dataclass(frozen=True)
class OffPolicyConfig:
    replay_size: int = 1_000_000   # transitions each process keeps per policy (a ring)
    batch_size: int = 256          # transitions per gradient step, all processes together
    replay_ratio: float = 1.0      # gradient steps per env step of one process
    learning_starts: int = 5000    # env steps of uniformly random actions before learning
    tau: float = 0.005             # target networks move this far towards the online ones
    max_grad_norm: float = 0.5     # gradient-norm clipping of each network (0: none)
    prioritized_replay: bool = False  # sample in proportion to |TD error|^priority_alpha
    priority_alpha: float = 0.6    # how much priorities count (0: uniform, at most 2)
    priority_beta: float = 0.4     # importance-weight correction (1: full)
    checkpoint_replay: bool = True  # checkpoints hold the replay buffers, so a resumed run
                                    # continues exactly (false: smaller checkpoints, and a
                                    # resumed run refills its buffers)
    policy_keys: ClassVar[frozenset] = frozenset(("hidden_sizes", "activation"))
    # what a population's members may differ in (training.population)
    sweepable: ClassVar[tuple] = ("lr", "max_grad_norm", "tau")

    def check(self):
        for key in ("replay_size", "batch_size"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(self.replay_ratio > 0, "trainer.replay_ratio", "must be positive")
        require(self.learning_starts >= 0, "trainer.learning_starts", "must be >= 0")
        require(self.max_grad_norm >= 0, "trainer.max_grad_norm", "must be >= 0")
        require(0 < self.tau <= 1, "trainer.tau", "must lie in (0, 1]")
        require(0 <= self.priority_alpha <= 2, "trainer.priority_alpha", "must lie in [0, 2]")
        require(0 <= self.priority_beta <= 1, "trainer.priority_beta", "must lie in [0, 1]")
        require(self.replay_size >= self.batch_size, "trainer.replay_size",
                f"must be at least batch_size ({self.batch_size})")

    def check_run(self, trainer):
        require(self.learning_starts < trainer.total_steps, "trainer.learning_starts",
                f"must be below total_steps ({trainer.total_steps}): the run would end "
                "before its first gradient step")


class Optimizers:
    """A policy's optimizers under one name, so checkpoints treat them as one."""

    def __init__(self, **optimizers):
        self.by_name = {k: v for k, v in optimizers.items() if v is not None}

    def __getitem__(self, name):
        return self.by_name[name]

    def state_dict(self) -> dict:
        return {name: plain_lr(opt.state_dict()) for name, opt in self.by_name.items()}

    def load_state_dict(self, state: dict):
        for name, opt in self.by_name.items():
            load_keeping_lr(opt, state[name])


@dataclass
class OffPolicyGroup:
    """One policy: its space, agents, networks, optimizers and replay shard."""
    name: str
    spec: object
    agents: object
    model: OffPolicyModel
    optimizer: Optimizers
    replay: ReplayBuffer
    updates: int = 0  # gradient steps taken (TD3 delays its actor by this count)
    fused: FusedStep | None = None  # the whole gradient step compiled (training.fused)
    graphs: dict = field(default_factory=dict)  # static steps: actor due -> its StepGraph
    step_stats: torch.Tensor | None = None      # what a static step's statistics go into

    @functools.cached_property
    def optimized(self) -> dict:
        """Optimizer name -> (its parameters by name, the optimizer)."""
        model, opts = self.model, self.optimizer.by_name
        params = {"actor": dict(model.actor.named_parameters()),
                  "critic": dict(model.critics.named_parameters()),
                  "alpha": {"log_alpha": model.log_alpha}}
        return {name: (params[name], opt) for name, opt in opts.items()}


class OffPolicy(OffPolicyGraphs, Algorithm):
    """The shared core; a subclass sets its networks and its three methods."""
    Config = OffPolicyConfig
    stats = ("policy_loss", "value_loss", "entropy", "alpha")
    num_critics = 1
    stochastic = False  # a Gaussian actor (SAC) rather than a deterministic one
    populates = True  # trainer.population (training.algorithms.population_offpolicy)

    def __init__(self, config, env, context, timer):
        super().__init__(config, env, context, timer)
        cfg = self.cfg
        for name, spec in env.policy_specs.items():
            if not spec.continuous:
                raise GpusimError(f"trainer.algorithm {config.trainer.algorithm} needs "
                                  f"continuous actions, and policy {name!r} acts discretely "
                                  "(use ppo or a2c)")
        row = sum(4 * (2 * s.obs_dim + s.action_width + 3) for s in env.policy_specs.values())
        env.backend.check_fits(f"the replay buffers ({cfg.replay_size:,} transitions per "
                               "policy)", cfg.replay_size * row)
        self.collectives = TorchCollectives() if self.distributed else LOCAL
        self.check_models_fit(networks=2 * (1 + self.num_critics))  # online and target
        self.groups = [self._policy_group(name, spec)
                       for name, spec in env.policy_specs.items()]
        self.actors = Actors(env, {g.name: g.model for g in self.groups},
                             wrap=lambda fn, what: MaybeCompiled(fn, what, self.compile_acting))
        self.explorers = Actors(env, {})  # uniformly random, before learning starts
        self.env_steps = 0
        self.rollout_graphs = {}  # static steps: each step's way of acting -> its StepGraph

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS gradient steps (after learning_starts)."""
        t = self.config.trainer
        per_iteration = t.steps_per_iteration * self.world_size
        learning = t.num_iterations(self.world_size) - self.cfg.learning_starts // per_iteration
        return learning * self.gradient_steps_per_iteration() >= CPU_COMPILE_MIN_STEPS

    def gradient_steps_per_iteration(self) -> int:
        return max(1, round(self.cfg.replay_ratio * self.config.trainer.steps_per_iteration))

    @classmethod
    def model_for(cls, config, spec, exploring: bool = True) -> OffPolicyModel:
        """A policy's networks for this algorithm (`exploring`: with its exploration noise,
        for training rollouts)."""
        return OffPolicyModel(spec, config.policy, cls.num_critics, cls.stochastic)

    def _policy_group(self, name, spec) -> OffPolicyGroup:
        cfg, env = self.cfg, self.env
        model = self.model_for(self.config, spec).to(env.device)
        if self.distributed:  # every rank starts from rank 0's weights
            for tensor in model.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
        lr = self.config.trainer.lr
        device = env.device if self.use_graphs else None  # a captured step: capturable Adams
        optimizers = Optimizers(actor=adam(model.actor.parameters(), lr, capturable_on=device),
                                critic=adam(model.critics.parameters(), lr,
                                            capturable_on=device),
                                alpha=adam([model.log_alpha], lr, capturable_on=device)
                                if model.log_alpha.requires_grad else None)
        replay = ReplayBuffer(cfg.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                              env.device, prioritized=cfg.prioritized_replay,
                              alpha=cfg.priority_alpha, collectives=self.collectives,
                              seed=self.config.trainer.seed * 1000
                              + list(env.policy_specs).index(name))
        group = OffPolicyGroup(name, spec, self.agents[name], model, optimizers, replay)
        if self.use_compile and not self.distributed:  # (DDP sums gradients between steps)
            group.fused = FusedStep(group.optimized,
                                    lambda descent, *batch: self._gradient_step(descent, group,
                                                                                *batch),
                                    cfg.max_grad_norm, f"policy {name!r} (gradient step)")
        return group

    # ---- rollout -------------------------------------------------------------------
    @torch.no_grad()
    def _collect(self, explore: tuple):
        t_cfg, env = self.config.trainer, self.env
        for t in range(t_cfg.rollout_len):
            active = env.agent_active()
            with self.timer("forward"):
                obs = {g.name: self.observe(g.name, self.next_obs).clone() for g in self.groups}
                with self.precision.autocast():
                    acted = (self.explorers if explore[t] else self.actors).act(self.next_obs)
            with self.timer("env"):
                next_obs, reward, terminated, _truncated, info = env.step()
            with self.timer("forward"):
                done = info["reset_mask"]
                # a finished replica's true next observation is its final one
                true_next = torch.where(done[:, None, None], info["final_obs"], next_obs)
                still = env.agent_active()
                if still is not None:  # in finished replicas: who was in play at the end
                    still = torch.where(done[:, None], env.final_active(), still)
                for g in self.groups:
                    ended = terminated[:, None].expand(-1, g.spec.num_agents)
                    if active is not None:  # an agent that left play terminated too
                        ended = ended | ~still[:, g.agents]
                    rows = None if active is None else active[:, g.agents].reshape(-1)
                    self._store(g, rows, obs[g.name], acted.stored[g.name],
                                reward[:, g.agents] * t_cfg.reward_scale,
                                self.observe(g.name, true_next), ended)
                self.episodes.record(t, reward, done, active)

    def _store(self, group, rows, obs, action, reward, next_obs, ended):
        """Flatten (replica, agent) into rows; with per-agent done, rows of agents out of
        play are kept but flagged, never drawn (no data-dependent shape: no host sync). In
        static steps only the device side (`collect` advances the counters)."""
        flat = [x.reshape((-1,) + x.shape[2:]) for x in (obs, action, reward, next_obs, ended)]
        if self.static_steps:
            group.replay.write(*flat, valid=rows)
        else:
            group.replay.add(*flat, valid=rows)

    # ---- update --------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        t_cfg = self.config.trainer
        steps_taken = self.env_steps + t_cfg.steps_per_iteration * self.world_size
        learning = steps_taken > self.cfg.learning_starts
        gradient_steps = self.gradient_steps_per_iteration()
        stats = {}
        for g in self.groups:
            for opt in g.optimizer.by_name.values():
                self.set_lr(opt, lr)
            total = torch.zeros(len(self.stats), device=self.env.device)
            for _ in range(gradient_steps if learning else 0):
                total += self.gradient_step(g)
            stats[g.name] = dict(zip(self.stats,
                                     (total / max(1, gradient_steps * learning)).tolist()))
        return stats

    def gradient_step(self, g: OffPolicyGroup) -> torch.Tensor:
        """One step of the critics towards r + gamma * (1 - terminated) * Q'(s', a'), and
        when due one step of the actor (and of SAC's alpha) and of the targets: one
        compiled call where enabled, or replayed as a CUDA graph (static steps), else eagerly.
        Returns the step's statistics."""
        cfg = self.cfg
        if self.static_steps:
            return self._static_gradient_step(g)
        batch = g.replay.sample(cfg.batch_size, beta=cfg.priority_beta)
        g.updates += 1
        inputs = (batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.terminated,
                  batch.weights, self.actor_due(g))
        out = g.fused(*inputs) if g.fused is not None else None
        if out is None:
            reduce = self._sum_across_ranks if self.distributed else None
            out = self._gradient_step(EagerDescent(g.optimized, cfg.max_grad_norm, reduce),
                                      g, *inputs)
        stats, td = out
        if cfg.prioritized_replay:
            g.replay.update_priorities(batch.index, td.abs().max(0).values)
        return stats

    def _gradient_step(self, descent, g: OffPolicyGroup, obs, actions, rewards, next_obs,
                       terminated, weights, actor_due: bool, nets: NetsOn | None = None):
        """The gradient step on a sampled batch, its networks and steps taken through
        `descent` (training.fused: compiled, or eager), its networks run through `nets`
        (default: the group's own; a population member's: population_offpolicy.py).
        Returns (statistics, TD errors)."""
        cfg, model = self.cfg, g.model
        autocast = self.precision.autocast  # forwards in bf16 where asked; losses in fp32
        critic_params = descent.params("critic")
        log_alpha = descent.params("alpha")["log_alpha"] if "alpha" in g.optimizer.by_name \
            else None
        if nets is None:
            nets = NetsOn(g, descent.params("actor"), critic_params, cfg.tau)
        alpha = nets.alpha(log_alpha).detach()
        with torch.no_grad(), autocast():
            next_action, next_log_prob = self.next_action(nets, next_obs)
            next_q = nets.q(model.target_critics, next_obs, next_action).float().min(0).values
            if next_log_prob is not None:
                next_q = next_q - alpha * next_log_prob.float()
            target = rewards + self.config.trainer.gamma * (~terminated) * next_q

        def critic_loss(params):
            with autocast():
                td = model.q(model.critics, obs, actions, params).float() - target
            loss = (weights * td.pow(2).sum(0)).sum() / cfg.batch_size
            return loss, (loss.detach(), td.detach())
        loss, td = descent.step("critic", critic_loss)
        stats = torch.stack([torch.zeros_like(loss), loss, torch.zeros_like(loss), alpha])
        if not actor_due:
            return stats, td

        def actor_loss(params):
            with autocast():
                loss, log_prob = self.actor_loss(nets.with_actor(params), obs, alpha)
            aux = {"loss": loss.float().detach()}  # (no None: grad's aux holds tensors only)
            if log_prob is not None:
                aux["log_prob"] = log_prob.float().detach()
            return loss.float(), aux
        aux = descent.step("actor", actor_loss)
        loss, log_prob = aux["loss"], aux.get("log_prob")
        entropy = torch.zeros_like(loss) if log_prob is None \
            else -log_prob.sum() / max(1, log_prob.numel())
        if log_alpha is not None:
            def alpha_loss(params):
                loss = self.alpha_loss(g, params["log_alpha"], log_prob)
                return loss, loss.detach()
            descent.step("alpha", alpha_loss)
        nets.soft_update()
        return torch.stack([loss, stats[1], entropy, alpha]), td

    # what the algorithms define
    def next_action(self, g, next_obs):
        """(the action the target critics are evaluated at, its log-prob or None); `g` runs
        the networks as the step sees them (NetsOn)."""
        raise NotImplementedError

    def actor_due(self, g: OffPolicyGroup) -> bool:
        return True

    def step_draws(self, actor_due: bool) -> int:
        """How many standard normal (batch, action dims) draws one gradient step takes from
        torch's generator, in order (a population member's come from its own)."""
        return 0

    def actor_loss(self, g, obs, alpha):
        """(the actor's loss, summed over the rank's rows / batch_size; log-prob or None)."""
        raise NotImplementedError

    def alpha_loss(self, g, log_alpha, log_prob):
        """The loss a tuned entropy weight descends (SAC)."""
        raise NotImplementedError

    @staticmethod
    def _sum_across_ranks(grads):
        """Sum gradients over ranks (losses are already divided by the global batch)."""
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    # ---- checkpoints -----------------------------------------------------------------
    def models(self) -> dict:
        return {g.name: g.model for g in self.groups}

    def state_dict(self) -> dict:
        return {"models": {g.name: g.model.state_dict() for g in self.groups},
                "optimizers": {g.name: g.optimizer.state_dict() for g in self.groups},
                "updates": {g.name: g.updates for g in self.groups}}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers", "updates")
        for g in self.groups:
            g.model.load_state_dict(state["models"][g.name])
            g.optimizer.load_state_dict(state["optimizers"][g.name])
            g.updates = state["updates"][g.name]
            for graph in g.graphs.values():  # the optimizers' state tensors are new
                graph.drop()
        for graph in self.rollout_graphs.values():  # (the actors' weights: the same tensors)
            graph.drop()

    def rank_state_dict(self) -> dict:
        if not self.cfg.checkpoint_replay:
            return {}
        return {"replay": {g.name: g.replay.state_dict() for g in self.groups}}

    def load_rank_state_dict(self, state: dict):
        if "replay" not in state:
            print("gpusim: this checkpoint holds no replay buffers (trainer.checkpoint_replay "
                  "was false): the resumed run refills them and will not reproduce an "
                  "uninterrupted one", flush=True)
            return
        for g in self.groups:
            g.replay.load_state_dict(state["replay"][g.name])

    @classmethod
    def acting_model(cls, config, env, spec):
        return cls.model_for(config, spec, exploring=False)
