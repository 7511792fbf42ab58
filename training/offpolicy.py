"""DDPG, TD3 and SAC on device-resident replay, for policies with continuous actions.

Read top to bottom: `OffPolicyTrainer.iterate` alternates `collect` (a
rollout of `rollout_len` steps over all replicas: uniformly random actions
for the first `learning_starts` env steps, then the actor's, with Gaussian
noise for DDPG/TD3 and sampled for SAC; every agent-step in play goes into
its policy's replay ring, on the device) and `replay_ratio` x (env steps of
this process) gradient steps per policy. It reuses the PPO trainer's run
loop, metrics, stop handling and checkpoints (`training.trainer`).

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

import torch
from torch import nn

from gpusim.errors import GpusimError
from gpusim.spaces import agent_index

from .models import LOG_STD_RANGE, mlp, tanh_gaussian_log_prob
from .replay import LOCAL, ReplayBuffer, TorchCollectives
from .trainer import Trainer

OFF_POLICY_STATS = ("policy_loss", "value_loss", "entropy", "alpha")


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
    """One policy's networks: the actor, its critics (two for TD3 and SAC) and the target
    copies, and SAC's log-alpha; one state_dict for checkpoints."""

    def __init__(self, spec, policy_config, algorithm: str, alpha: float | None):
        super().__init__()
        hidden, activation = list(policy_config.hidden_sizes), policy_config.activation
        dims = spec.action_width
        self.actor = Actor(spec.obs_dim, dims, hidden, activation, algorithm == "sac")
        self.critics = nn.ModuleList(
            mlp([spec.obs_dim + dims] + hidden + [1], activation, 1.0)
            for _ in range(1 if algorithm == "ddpg" else 2))
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha) if alpha else 0.0),
                                      requires_grad=algorithm == "sac" and alpha is None)
        low, high = torch.tensor(spec.actions.low), torch.tensor(spec.actions.high)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def q(self, critics, obs, action):
        """Each critic's Q(obs, action), stacked: (critics, rows)."""
        pair = torch.cat([obs, action], -1)
        return torch.stack([c(pair).squeeze(-1) for c in critics])

    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp() if self.actor.stochastic else torch.zeros(())

    def to_env(self, action):
        """[-1, 1] -> the env's Box."""
        return self.center + self.half_range * action

    # what evaluation and rendering call (training.evaluate.Actors), as on a Gaussian head
    def act(self, obs, deterministic: bool = False):
        action, log_prob = self.actor(obs, deterministic)
        return action, log_prob, None

    squash = to_env


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
    updates: int = 0  # gradient steps taken (TD3 delays its actor by this count)

    def observe(self, obs):
        return obs[:, self.agents, :self.spec.obs_dim]


class OffPolicyTrainer(Trainer):
    """`Trainer` with an off-policy learner: same CLI, run directory, metrics, checkpoints."""

    def _check_memory(self):
        t, env = self.config.trainer, self.env
        for name, spec in env.policy_specs.items():
            if not spec.continuous:
                raise GpusimError(f"trainer.algorithm {t.algorithm} needs continuous actions, "
                                  f"and policy {name!r} acts discretely (use ppo or a2c)")
        row = sum(4 * (2 * s.obs_dim + s.action_width + 3) for s in env.policy_specs.values())
        env.backend.check_fits(f"the replay buffers ({t.replay_size:,} transitions per policy)",
                               t.replay_size * row)
        # what the replay shards all-reduce over (set here: the groups are built next)
        self.collectives = TorchCollectives() if self.distributed else LOCAL

    def _policy_group(self, name, spec, use_compile) -> OffPolicyGroup:
        t, env = self.config.trainer, self.env
        model = OffPolicyModel(spec, self.config.policy, t.algorithm, t.sac_alpha).to(env.device)
        if self.distributed:  # every rank starts from rank 0's weights
            for tensor in model.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
        adam = lambda params: torch.optim.Adam(params, lr=t.lr, foreach=True)  # noqa: E731
        optimizers = Optimizers(actor=adam(model.actor.parameters()),
                                critic=adam(model.critics.parameters()),
                                alpha=adam([model.log_alpha]) if model.log_alpha.requires_grad
                                else None)
        replay = ReplayBuffer(t.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                              env.device, prioritized=t.prioritized_replay,
                              alpha=t.priority_alpha, collectives=self.collectives,
                              seed=t.seed * 1000 + list(env.policy_specs).index(name))
        return OffPolicyGroup(name, spec, agent_index(spec.agent_ids, env.device), model,
                              optimizers, replay)

    # ---- rollout -------------------------------------------------------------------
    @torch.no_grad()
    def collect(self):
        t_cfg, env = self.config.trainer, self.env
        for t in range(t_cfg.rollout_len):
            active = env.agent_active()
            explore = self.env_steps + t * env.num_envs * self.world_size < t_cfg.learning_starts
            with self.timer("forward"):
                obs = {g.name: g.observe(self.next_obs).clone() for g in self.groups}
                actions = {g.name: self._action(g, obs[g.name], explore) for g in self.groups}
            with self.timer("env"):
                next_obs, reward, terminated, truncated, info = env.step(
                    {g.name: g.model.to_env(actions[g.name]) for g in self.groups})
            with self.timer("forward"):
                done = info["reset_mask"]
                # a finished replica's true next observation is its final one
                true_next = torch.where(done[:, None, None], info["final_obs"], next_obs)
                still = env.agent_active()
                for g in self.groups:
                    ended = terminated[:, None].expand(-1, g.spec.num_agents)
                    if active is not None:  # an agent that left play terminated too
                        ended = ended | ~still[:, g.agents]
                    rows = None if active is None else active[:, g.agents].reshape(-1)
                    self._store(g, rows, obs[g.name], actions[g.name],
                                reward[:, g.agents] * t_cfg.reward_scale,
                                g.observe(true_next), ended)
                self._record_episodes(t, reward, done, active)
        self.finished = self._finished_episodes()

    def _action(self, group, obs, explore: bool):
        """An action in [-1, 1]: uniform while exploring, else the actor's (noisy for
        DDPG and TD3, sampled for SAC)."""
        if explore:
            return torch.rand(obs.shape[:2] + (group.spec.action_width,),
                              device=obs.device) * 2 - 1
        action, _ = group.model.actor(obs)
        if not group.model.actor.stochastic:
            noise = torch.randn_like(action) * self.config.trainer.exploration_noise
            action = (action + noise).clamp(-1, 1)
        return action

    @staticmethod
    def _store(group, rows, obs, action, reward, next_obs, ended):
        """Flatten (replica, agent) into rows; with per-agent done only agents in play."""
        flat = [x.reshape((-1,) + x.shape[2:]) for x in (obs, action, reward, next_obs, ended)]
        if rows is not None:
            flat = [x[rows] for x in flat]
        group.replay.add(*flat)

    # ---- update --------------------------------------------------------------------
    def iterate(self, lr: float) -> dict:
        self.collect()
        t_cfg = self.config.trainer
        steps_taken = self.env_steps + self.steps_per_iteration
        learning = steps_taken > t_cfg.learning_starts
        gradient_steps = max(1, round(t_cfg.replay_ratio * t_cfg.steps_per_iteration))
        stats = {}
        with self.timer("update"):
            for g in self.groups:
                for opt in g.optimizer.by_name.values():
                    for param_group in opt.param_groups:
                        param_group["lr"] = lr
                total = torch.zeros(len(OFF_POLICY_STATS), device=self.env.device)
                for _ in range(gradient_steps if learning else 0):
                    total += self.update_step(g)
                stats[g.name] = dict(zip(OFF_POLICY_STATS,
                                         (total / max(1, gradient_steps * learning)).tolist()))
        return stats

    def update_step(self, g: OffPolicyGroup) -> torch.Tensor:
        """One gradient step of the critics and (TD3: every policy_delay steps) the actor."""
        t = self.config.trainer
        model, batch_size = g.model, t.batch_size
        batch = g.replay.sample(batch_size, beta=t.priority_beta)
        obs, action, reward, next_obs = batch.obs, batch.actions, batch.rewards, batch.next_obs
        alpha = model.alpha().detach()
        with torch.no_grad():
            next_action, next_log_prob = model.actor(next_obs) if model.actor.stochastic \
                else model.target_actor(next_obs)
            if t.algorithm == "td3":  # target policy smoothing
                noise = (torch.randn_like(next_action) * t.target_noise).clamp(-t.noise_clip,
                                                                              t.noise_clip)
                next_action = (next_action + noise).clamp(-1, 1)
            next_q = model.q(model.target_critics, next_obs, next_action).min(0).values
            if next_log_prob is not None:
                next_q = next_q - alpha * next_log_prob
            target = reward + t.gamma * (~batch.terminated) * next_q
        q = model.q(model.critics, obs, action)
        td = q - target
        critic_loss = (batch.weights * td.pow(2).sum(0)).sum() / batch_size
        self._step(g, "critic", critic_loss, model.critics)
        if t.prioritized_replay:
            g.replay.update_priorities(batch.index, td.detach().abs().max(0).values)
        g.updates += 1
        stats = torch.zeros(len(OFF_POLICY_STATS), device=q.device)
        stats[1], stats[3] = critic_loss.detach(), alpha
        if t.algorithm == "td3" and g.updates % t.policy_delay:
            return stats
        new_action, log_prob = model.actor(obs)
        model.critics.requires_grad_(False)  # the actor's loss needs no critic weight grads
        q_new = model.q(model.critics, obs, new_action)
        model.critics.requires_grad_(True)
        q_new = q_new.min(0).values if model.actor.stochastic else q_new[0]
        actor_loss = -q_new if log_prob is None else alpha * log_prob - q_new
        actor_loss = actor_loss.sum() / batch_size
        self._step(g, "actor", actor_loss, model.actor)
        if model.log_alpha.requires_grad:  # towards an entropy of -dims
            target_entropy = -g.spec.action_width
            alpha_loss = -(model.log_alpha * (log_prob.detach() + target_entropy)).sum() \
                / batch_size
            self._step(g, "alpha", alpha_loss, [model.log_alpha])
        self._soft_update(model)
        stats[0] = actor_loss.detach()
        if log_prob is not None:
            entropy = -log_prob.detach().sum() / max(1, log_prob.numel())
            stats[2] = entropy
        return stats

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
        torch.nn.utils.clip_grad_norm_(params, self.config.trainer.max_grad_norm)
        optimizer.step()

    def _soft_update(self, model: OffPolicyModel):
        tau = self.config.trainer.tau
        with torch.no_grad():
            for online, target in ((model.critics, model.target_critics),
                                   (model.actor, model.target_actor)):
                torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)

    # ---- checkpoints: the replay shards, when asked ------------------------------------
    def _rank_state(self) -> dict:
        own = super()._rank_state()
        own["updates"] = {g.name: g.updates for g in self.groups}
        if self.config.trainer.checkpoint_replay:
            own["replay"] = {g.name: g.replay.state_dict() for g in self.groups}
        return own

    def _load_rank_state(self, own: dict):
        super()._load_rank_state(own)
        for g in self.groups:
            g.updates = own.get("updates", {}).get(g.name, 0)
            if "replay" in own:
                g.replay.load_state_dict(own["replay"][g.name])
