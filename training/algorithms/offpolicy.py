"""The off-policy core that DDPG, TD3 and SAC share: replay on the device, the rollout, the
gradient-step loop, target networks and checkpoints.

Read top to bottom: the config; the networks (`Actor`, `OffPolicyModel`); the
`OffPolicy` algorithm: `collect` (a rollout of `rollout_len` steps over every
replica: uniformly random actions for the first `learning_starts` env steps,
then the actor's, with exploration; every agent-step in play goes into its
policy's replay ring, on the device) and `update` (`replay_ratio` x this
process's env steps gradient steps per policy, each: sample a batch, step
the critics towards the algorithm's target, and when due the actor).
What differs between the algorithms is three methods: `next_action` (the
action and entropy term the target is taken at), `actor_due` and
`actor_loss` (ddpg.py, td3.py, sac.py).

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

import copy
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from gpusim.config import require
from gpusim.errors import GpusimError

from ..acceleration import MaybeCompiled
from ..actors import Actors
from ..models import LOG_STD_RANGE, mlp, tanh_gaussian_log_prob
from ..replay import LOCAL, ReplayBuffer, TorchCollectives
from .base import Algorithm


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


class Actor(nn.Module):
    """obs -> an action in [-1, 1]^dims: deterministic (DDPG, TD3) or a squashed Gaussian
    sample with its log-probability (SAC)."""

    def __init__(self, obs_dim, dims, hidden, activation, stochastic: bool):
        super().__init__()
        self.stochastic = stochastic
        self.net = mlp([obs_dim] + hidden + [2 * dims if stochastic else dims], activation, 0.01)

    def forward(self, obs, deterministic: bool = False):
        out = self.net(obs)
        if not self.stochastic:
            return torch.tanh(out), None
        mean, log_std = out.chunk(2, dim=-1)
        log_std = log_std.clamp(*LOG_STD_RANGE)
        raw = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(raw), tanh_gaussian_log_prob(mean, log_std, raw)


class OffPolicyModel(nn.Module):
    """One policy's networks: the actor, its critics and their target copies, and SAC's
    log-alpha; one state_dict for checkpoints."""

    def __init__(self, spec, policy_config, num_critics: int, stochastic: bool,
                 alpha: float | None = None, tune_alpha: bool = False,
                 exploration_noise: float = 0.0):
        super().__init__()
        hidden, activation = list(policy_config.hidden_sizes), policy_config.activation
        dims = spec.action_width
        self.actor = Actor(spec.obs_dim, dims, hidden, activation, stochastic)
        self.critics = nn.ModuleList(mlp([spec.obs_dim + dims] + hidden + [1], activation, 1.0)
                                     for _ in range(num_critics))
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha) if alpha else 0.0),
                                      requires_grad=tune_alpha)
        self.entropy_bonus = stochastic and alpha != 0  # sac_alpha 0: none at all
        low, high = torch.tensor(spec.actions.low), torch.tensor(spec.actions.high)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.exploration_noise = exploration_noise  # deterministic actors: Gaussian, in
                                                    # half-ranges (not saved: it is config)

    def q(self, critics, obs, action):
        """Each critic's Q(obs, action), stacked: (critics, rows)."""
        pair = torch.cat([obs, action], -1)
        return torch.stack([c(pair).squeeze(-1) for c in critics])

    def alpha(self) -> torch.Tensor:
        if self.entropy_bonus:
            return self.log_alpha.exp()
        return torch.zeros((), device=self.center.device)

    def to_env(self, action):
        """[-1, 1] -> the env's Box."""
        return self.center + self.half_range * action

    def sample(self, obs, deterministic: bool = False):
        """Acting (training.actors): (action in [-1, 1], None, the env's action); with
        exploration noise on a deterministic actor unless `deterministic`."""
        action, _ = self.actor(obs, deterministic)
        if not self.actor.stochastic and not deterministic and self.exploration_noise:
            noise = torch.randn_like(action) * self.exploration_noise
            action = (action + noise).clamp(-1, 1)
        return action, None, self.to_env(action)


class Optimizers:
    """A policy's optimizers under one name, so checkpoints treat them as one."""

    def __init__(self, **optimizers):
        self.by_name = {k: v for k, v in optimizers.items() if v is not None}

    def __getitem__(self, name):
        return self.by_name[name]

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.by_name.items()}

    def load_state_dict(self, state: dict):
        for name, opt in self.by_name.items():
            opt.load_state_dict(state[name])


@dataclass
class OffPolicyGroup:
    """One policy: its space, agents, networks, optimizers and replay shard."""
    name: str
    spec: object
    agents: object
    model: OffPolicyModel
    optimizer: Optimizers
    replay: ReplayBuffer
    actor: MaybeCompiled = None  # the actor's forward and ...
    q: MaybeCompiled = None      # ... the critics', through torch.compile where enabled
    updates: int = 0  # gradient steps taken (TD3 delays its actor by this count)


class OffPolicy(Algorithm):
    """The shared core; a subclass sets its networks and its three methods."""
    Config = OffPolicyConfig
    stats = ("policy_loss", "value_loss", "entropy", "alpha")
    num_critics = 1
    stochastic = False  # a Gaussian actor (SAC) rather than a deterministic one

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
        adam = lambda params: torch.optim.Adam(params, lr=lr, foreach=True)  # noqa: E731
        optimizers = Optimizers(actor=adam(model.actor.parameters()),
                                critic=adam(model.critics.parameters()),
                                alpha=adam([model.log_alpha]) if model.log_alpha.requires_grad
                                else None)
        replay = ReplayBuffer(cfg.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                              env.device, prioritized=cfg.prioritized_replay,
                              alpha=cfg.priority_alpha, collectives=self.collectives,
                              seed=self.config.trainer.seed * 1000
                              + list(env.policy_specs).index(name))
        compiled = self.use_compile
        return OffPolicyGroup(name, spec, self.agents[name], model, optimizers, replay,
                              MaybeCompiled(model.actor, f"policy {name!r} (actor)", compiled),
                              MaybeCompiled(model.q, f"policy {name!r} (critics)", compiled))

    # ---- rollout -------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, env_steps: int):
        t_cfg, env = self.config.trainer, self.env
        self.env_steps = env_steps
        for t in range(t_cfg.rollout_len):
            active = env.agent_active()
            explore = env_steps + t * env.num_envs * self.world_size < self.cfg.learning_starts
            with self.timer("forward"):
                obs = {g.name: self.observe(g.name, self.next_obs).clone() for g in self.groups}
                with self.precision.autocast():
                    acted = (self.explorers if explore else self.actors).act(self.next_obs)
            with self.timer("env"):
                next_obs, reward, terminated, truncated, info = env.step()
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

    @staticmethod
    def _store(group, rows, obs, action, reward, next_obs, ended):
        """Flatten (replica, agent) into rows; with per-agent done, rows of agents out of
        play are kept but flagged, never drawn (no data-dependent shape: no host sync)."""
        flat = [x.reshape((-1,) + x.shape[2:]) for x in (obs, action, reward, next_obs, ended)]
        group.replay.add(*flat, valid=rows)

    # ---- update --------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        t_cfg = self.config.trainer
        steps_taken = self.env_steps + t_cfg.steps_per_iteration * self.world_size
        learning = steps_taken > self.cfg.learning_starts
        gradient_steps = max(1, round(self.cfg.replay_ratio * t_cfg.steps_per_iteration))
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
        when due one step of the actor; returns the step's statistics."""
        cfg, model = self.cfg, g.model
        batch = g.replay.sample(cfg.batch_size, beta=cfg.priority_beta)
        alpha = model.alpha().detach()
        autocast = self.precision.autocast  # forwards in bf16 where asked; losses in fp32
        with torch.no_grad(), autocast():
            next_action, next_log_prob = self.next_action(g, batch.next_obs)
            next_q = g.q(model.target_critics, batch.next_obs, next_action).float().min(0).values
            if next_log_prob is not None:
                next_q = next_q - alpha * next_log_prob.float()
            target = batch.rewards + self.config.trainer.gamma * (~batch.terminated) * next_q
        with autocast():
            q = g.q(model.critics, batch.obs, batch.actions)
        td = q.float() - target
        critic_loss = (batch.weights * td.pow(2).sum(0)).sum() / cfg.batch_size
        self._step(g, "critic", critic_loss, model.critics)
        if cfg.prioritized_replay:
            g.replay.update_priorities(batch.index, td.detach().abs().max(0).values)
        g.updates += 1
        stats = torch.zeros(len(self.stats), device=td.device)
        stats[1], stats[3] = critic_loss.detach(), alpha
        if not self.actor_due(g):
            return stats
        model.critics.requires_grad_(False)  # the actor's loss needs no critic weight grads
        with autocast():
            actor_loss, log_prob = self.actor_loss(g, batch.obs, alpha)
        actor_loss = actor_loss.float()
        log_prob = None if log_prob is None else log_prob.float()
        model.critics.requires_grad_(True)
        self._step(g, "actor", actor_loss, model.actor)
        self.after_actor_step(g, log_prob)
        self._soft_update(model)
        stats[0] = actor_loss.detach()
        if log_prob is not None:
            stats[2] = -log_prob.detach().sum() / max(1, log_prob.numel())
        return stats

    # what the algorithms define
    def next_action(self, g: OffPolicyGroup, next_obs):
        """(the action the target critics are evaluated at, its log-prob or None)."""
        raise NotImplementedError

    def actor_due(self, g: OffPolicyGroup) -> bool:
        return True

    def actor_loss(self, g: OffPolicyGroup, obs, alpha):
        """(the actor's loss, summed over the rank's rows / batch_size; log-prob or None)."""
        raise NotImplementedError

    def after_actor_step(self, g: OffPolicyGroup, log_prob):
        pass

    def _step(self, g, name: str, loss, params):
        """Backward, sum gradients over ranks (losses are already divided by the global
        batch), clip, and step one optimizer."""
        optimizer = g.optimizer[name]
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        params = [p for p in (params.parameters() if isinstance(params, nn.Module) else params)]
        if self.distributed:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            torch.distributed.all_reduce(flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        optimizer.step()

    def _soft_update(self, model: OffPolicyModel):
        tau = self.cfg.tau
        with torch.no_grad():
            for online, target in ((model.critics, model.target_critics),
                                   (model.actor, model.target_actor)):
                torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)

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
