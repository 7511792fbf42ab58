"""PPO, and A2C (its one-step special case), on device-resident rollouts: a solo run.

Read top to bottom, as CleanRL's ppo.py reads:

- the rollout: `rollout_len` steps of every replica under no_grad, each policy's
  inputs stored, actions drawn on the device, the env stepped, rewards and done marks
  stored (no host sync per step);
- the update, per policy: the critic over the stored rollout, GAE, then epochs of
  shuffled minibatches: advantages normalised, PPO's loss (losses.py), backward,
  Adam's clipped step.

Each policy has its own model, Adam and buffer, and its model runs on all of its agents
in every replica in one call. A feature that needs code shows as an `if` on what the
run has: a central critic (`self.central`: the critic sees the replica's global state,
MAPPO), recurrent policies (`self.bptt_len`: sequences of that many steps), action masks
(`buffer.masks`), per-agent done (`self.per_agent_done`: rows out of play weigh 0 or are
left out), a league (`self.league`: training.league.self_play). A truncated replica's reward
gets gamma * V(final state) (rollout.TruncationBootstrap).

How fast it runs is chosen once, in training.speed.wrap, around these same methods: on
a CUDA device the rollout and the update replayed as CUDA graphs, minibatches chunked
where they exceed `max_minibatch_rows`, a minibatch step compiled whole. Nothing here
asks how it is run. A population of such runs is ppo_members.py.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from gpusim.errors import GpusimError

from .. import losses
from ..actors import Actors
from ..league.self_play import League
from ..losses import take
from ..models import make_model
from ..noise_scale import NoiseScale
from ..speed.descent import Adam
from ..speed.wrap import chunked_step, ddp, wrap_ppo
from .algorithm import Algorithm
from .ppo_config import (CPU_COMPILE_MIN_STEPS, A2CConfig, PPOConfig, check_for_env,
                         sequence_length)
from .ppo_buffer import PolicyBuffer, TruncationBootstrap, buffer_bytes, mask_width


class Policy:
    """One policy: its space, agents, model, Adam and rollout buffer; training.speed.wrap
    adds how its passes run (`value`, `train_pass`, `gae`, ...)."""

    def __init__(self, name, spec, agents, model, adam, buffer, train_model):
        self.name, self.spec, self.agents = name, spec, agents
        self.model, self.adam, self.buffer = model, adam, buffer
        self.train_model = train_model  # the model, or its DistributedDataParallel wrapper


class PPO(Algorithm):
    Config = PPOConfig
    stats = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
    auto_scales = True
    captures_graphs = True
    alive = finished = None  # who still learns: plain lists here, set in __init__

    def __init__(self, config, env, context, timer):
        check_for_env(config, env, population=False)
        super().__init__(config, env, context, timer)
        t, cfg = config.trainer, self.cfg
        self.alive, self.finished = [True], [False]  # still learning; reached the target
        self.central = config.policy.critic == "central"
        self.bptt_len = sequence_length(config)  # 0: feed-forward
        self.per_agent_done = env.agent_active_array is not None
        self.state_dim = env.global_state().shape[-1] if self.central else 0
        self.mask_width = mask_width(env)
        env.backend.check_fits(
            f"the rollout buffers ({t.rollout_len} steps x {self.replicas_named()} replicas x "
            f"{env.num_agents} agents)",
            sum(buffer_bytes(spec, t.rollout_len, env.num_envs, self.state_dim, self.mask_width)
                for spec in env.policy_specs.values()))
        self.check_models_fit(networks=2)  # an actor and a critic each
        self.policies = self.make_policies()
        self.league = None
        if cfg.league:
            self.league = League(self)
            self.episodes.counted.update(self.league.counted(
                [p.name for p in self.policies], env.num_envs, env.device))
        self.learners = [(k, p) for k, p in enumerate(self.policies)
                         if self.league is None or self.league.learns(p.name)]
        self.speed = wrap_ppo(self)  # how the steps run, chosen once
        self.actors = Actors(env, {p.name: p.model if self.league is None
                                   else self.league.actors[p.name] for p in self.policies},
                             wrap=self.speed.acting)
        self.memory = self.actors.memory  # recurrent policies: each agent's latest state
        self.bootstrap = TruncationBootstrap(env, t.rollout_len, t.gamma, self.central,
                                             self.memory)
        self.shuffle = torch.Generator(device=env.device).manual_seed(t.seed)
        self.update_stats = torch.zeros((len(self.policies), len(self.stats)),
                                        device=env.device)
        self.noise = None
        if cfg.noise_scale_every and not self.bptt_len and env.num_envs >= 2:
            self.noise = NoiseScale(cfg.noise_scale_every, env.num_envs)
        self.speed.probe(self)  # a compiled training pass tried now, before training

    def replicas_named(self) -> str:
        return f"{self.env.num_envs:,}"

    def make_policies(self) -> list:
        return [self.make_policy(name, spec) for name, spec in self.env.policy_specs.items()]

    def make_policy(self, name, spec) -> Policy:
        """Policy `name`: its model made from torch's generator (seeded with the run's
        seed), its Adam, its rollout buffer."""
        env, t = self.env, self.config.trainer
        model = make_model(spec, self.config.policy, self.state_dim or None).to(env.device)
        adam = Adam(model.parameters(), t.lr, eps=1e-5, max_grad_norm=self.cfg.max_grad_norm,
                    device_lr=self.use_graphs)
        buffer = PolicyBuffer(spec, t.rollout_len, env.num_envs, env.device, self.state_dim,
                              self.mask_width, getattr(model, "state_size", 0),
                              max(1, self.bptt_len))
        train_model = model
        if self.distributed:  # gradients averaged across ranks
            train_model = ddp(model, env.device)
        return Policy(name, spec, self.agents[name], model, adam, buffer, train_model)

    # ---- the rollout ------------------------------------------------------------------
    def collect(self, env_steps: int):
        self.speed.collect(self.timer)

    @torch.no_grad()
    def rollout(self):
        """`rollout_len` steps: each policy's inputs stored, every agent's action drawn into
        the env's arrays, the env stepped, its rewards and done marks stored."""
        env, t_cfg = self.env, self.config.trainer
        for t in range(t_cfg.rollout_len):
            with self.timer("forward"):
                active = env.agent_active()
                # (the replicas' global state: what a central critic sees)
                state = env.global_state() if self.central else None
                mask = env.action_mask()
                for p in self.policies:
                    p.buffer.store_inputs(t, self.observe(p.name, self.next_obs), active,
                                          p.agents, mask, state)
                    if self.bptt_len:  # a sequence's start state; values as the policy acts
                        memory = self.memory[p.name]
                        if t % self.bptt_len == 0:
                            p.buffer.memory[t // self.bptt_len].copy_(memory)
                        p.buffer.values[t] = self.values(p, self.next_obs, state, memory)
                with self.precision.autocast():
                    acted = self.actors.act(self.next_obs)  # written into the env's arrays
                for p in self.policies:
                    p.buffer.actions[t].copy_(acted.stored[p.name])
                    p.buffer.log_probs[t].copy_(acted.log_prob[p.name])
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step()
            with self.timer("forward"):
                done, still = info["reset_mask"], env.agent_active()
                for p in self.policies:
                    p.buffer.store_outcome(t, reward, t_cfg.reward_scale, done, active, still,
                                           p.agents)
                self.bootstrap.record(t, truncated)
                self.bootstrap.after_step(t, self.values, self.policies)
                self.actors.episode_ended(done, still)
                if self.league is not None:
                    self.league.episode_ended(t, done)
                self.episodes.record(t, reward, done, active)

    def values(self, p: Policy, obs, state, *memory):
        """(envs, the policy's agents) values of an env's (envs, agents, obs) array (of the
        global `state` for a central critic; after recurrent states `memory`)."""
        return self.critic(p, self.observe(p.name, obs), state, *memory)

    def critic(self, p: Policy, own, state, *memory):
        """(..., agents) values of the agents' own observations `own` (..., agents, obs)
        after the recurrent states `memory`; a central critic's, of the replicas' `state`,
        every agent's alike."""
        with self.precision.autocast():
            if self.central:
                value = p.value(state)
                return value[..., None].expand(*value.shape, p.spec.num_agents)
            return p.value(own, *memory)

    # ---- the update -------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """Every learning policy's update: the shuffles of its minibatches drawn first, then
        the update (its graph replayed, once captured); the statistics by policy name."""
        if self.league is not None:
            self.league.record(self.episodes)  # (the rollout's league games)
        for p in self.policies:
            p.adam.set_lr(lr)
        orders = self.orders()
        if not self.alive[0]:  # (reached its target: the loop ends after this iteration)
            self.update_stats.zero_()
            return self.reported(self.update_stats)
        noise = self.noise.measure(self) if self.noise is not None else {}
        stats = self.reported(self.speed.update(orders))
        if self.league is not None:
            self.league.after_update(self.policies)
        for name, values in noise.items():
            stats[name].update(values)
        return stats

    def orders(self) -> dict:
        """Each learning policy's rows and every epoch's shuffle of them."""
        orders = {}
        for _, p in self.learners:
            rows = self.rows(p)
            orders[p.name] = (rows, [torch.randperm(rows.units.shape[0], generator=self.shuffle,
                                                    device=self.shuffle.device)
                                     for _ in range(self.cfg.update_epochs)])
        return orders

    def update_all(self, orders: dict) -> torch.Tensor:
        """Each learning policy's update on its rows and shuffles `orders[name]`; the
        statistics, policies x statistics (a policy that does not learn: zeros)."""
        for k, p in self.learners:
            self.update_stats[k].copy_(self.update_policy(p, *orders[p.name]))
        return self.update_stats

    def update_policy(self, p: Policy, rows: "Rows", orders: list) -> torch.Tensor:
        """The rollout's values and GAE, then `update_epochs` passes of shuffled minibatches
        (of rows, or of agent sequences for a recurrent policy); the mean statistics."""
        cfg, buf = self.cfg, p.buffer
        with torch.no_grad():
            self.rollout_values(p, rows.valued)
            memory = (self.memory[p.name],) if self.bptt_len else ()
            state = self.env.global_state() if self.central else None
            next_value = self.values(p, self.next_obs, state, *memory)
            advantages, returns = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        stats = 0.0
        for epoch in range(cfg.update_epochs):
            shuffled = rows.units[orders[epoch]]
            size = shuffled.shape[0] // cfg.num_minibatches
            for j in range(cfg.num_minibatches):
                mb = shuffled[j * size:(j + 1) * size]
                weights = None if rows.weights is None else take(rows.weights, mb)
                total = mb.numel() if weights is None else weights.sum().clamp_min(1.0)
                adv = take(advantages, mb)
                if cfg.norm_adv and mb.numel() > 1:
                    adv = losses.normalized(adv, weights, total)
                ret = take(returns, mb)
                out = p.fused(mb, adv, ret, weights) \
                    if p.fused is not None and mb.shape[0] <= self.speed.chunk else None
                if out is None and (self.speed.padded or mb.shape[0] > self.speed.chunk):
                    out = chunked_step(self, p, mb, adv, ret, weights, total)
                if out is None:  # the minibatch in one pass
                    out, loss = self.loss(p, mb, adv, ret, weights)
                    loss.backward()
                    p.adam.step()
                    p.adam.zero_grad()
                stats = stats + out
        return stats / (cfg.update_epochs * cfg.num_minibatches)

    def gae(self, rewards, values, dones, next_value) -> tuple:
        """(advantages, returns) of a stored rollout (losses.gae with the run's gamma and
        lambda); `p.gae` runs it, or its graph."""
        return losses.gae(rewards, values, dones, next_value, self.config.trainer.gamma,
                          self.cfg.gae_lambda)

    def loss(self, p: Policy, rows, adv, returns, weights, forward=None, coefs=None):
        """(detached statistics, loss) of PPO's objective on buffer rows `rows` (any shape:
        (sequences, steps) for a recurrent policy); `forward`: the training pass (default
        the policy's own); `coefs`: the clip, entropy and value coefficients (default the
        config's)."""
        buf = p.buffer
        clip, ent, vf = coefs or (self.cfg.clip_coef, self.cfg.ent_coef, self.cfg.vf_coef)
        with self.precision.autocast():
            new = (forward or p.train_pass)(*self.inputs(p, rows))
        flat = [None if x is None else x.reshape(-1) for x in (
            *new, buf.take("log_probs", rows), buf.take("values", rows), adv, returns, weights)]
        return losses.ppo_objective(flat[:3], *flat[3:], clip, self.cfg.clip_vloss, ent, vf)

    def inputs(self, p: Policy, rows) -> tuple:
        """The training pass's inputs for buffer rows `rows`: observations, actions, legal
        choices, a central critic's states (their (step, replica) rows), and for a
        recurrent policy each sequence's start state and where an episode restarts it."""
        buf = p.buffer
        states = None if not self.central else \
            take(buf.states.view(-1, buf.states.shape[-1]), rows // buf.obs.shape[2])
        inputs = (buf.take("obs", rows), buf.take("actions", rows), buf.take("masks", rows),
                  states)
        if not self.bptt_len:
            return inputs
        per_step = buf.rewards.shape[1] * buf.rewards.shape[2]  # rows between steps
        first = rows[..., 0]
        start = buf.memory.view(-1, buf.memory.shape[-1])[
            (first // (per_step * self.bptt_len)) * per_step + first % per_step]
        resets = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        if rows.shape[-1] > 1:  # an episode that ended with step l-1 restarts it at l
            resets[..., 1:] = take(buf.dones.reshape(-1), rows[..., :-1])
        return inputs + (start, resets)

    def row_values(self, p: Policy, rows):
        """The values of flat buffer rows `rows` (a lone critic, on its own observations)."""
        return self.critic(p, take(p.buffer.flat("obs"), rows), None)

    def rollout_values(self, p: Policy, valued=None):
        """Every step's value, in critic calls over the stored rollout (the critic does not
        act, so it need not run per step; a recurrent one's were stored as it acted); with
        `valued` (flat rows) the values of those rows only: GAE never reads the others."""
        buf = p.buffer
        if self.bptt_len:
            return
        if valued is not None:
            buf.values.view(-1).zero_().index_copy_(0, valued, p.value_rows(valued))
            return
        steps = max(1, self.cfg.max_minibatch_rows // buf.values[0].numel())
        for t in range(0, buf.values.shape[0], steps):
            part = slice(t, t + steps)
            buf.values[part] = self.critic(p, buf.obs[part],
                                           buf.states[part] if self.central else None)

    def rows(self, p: Policy) -> "Rows":
        """What policy `p`'s minibatches are made of, decided once per update (`Rows`)."""
        shape = tuple(p.buffer.rewards.shape)  # (steps, envs, agents)
        device = p.buffer.rewards.device
        active = p.buffer.active.reshape(-1) if self.per_agent_done else None
        weights = None if active is None else active.float()
        if self.bptt_len:  # (a league of recurrent policies is refused)
            units = sequences(shape, self.bptt_len, device)
            if units.shape[0] < self.cfg.num_minibatches:
                raise GpusimError(f"policy {p.name!r} has {units.shape[0]} sequences per "
                                  "rollout, fewer than trainer.num_minibatches "
                                  f"({self.cfg.num_minibatches})")
            return Rows(units, weights, None)
        replicas = None if self.league is None else self.league.trains_on(p.name)
        units = rows_of(shape, torch.arange(shape[1], device=device) if replicas is None
                        else torch.tensor(replicas, device=device))
        chosen = replicas is not None  # fewer rows than the rollout's
        if active is not None and self.cfg.out_of_play == "skip":
            kept = units[active[units]]  # (a host read)
            if kept.shape[0] >= self.cfg.num_minibatches:
                units, weights, chosen = kept, None, True
        # a lone critic's values of the rows trained only, where they are all that counts
        # (GAE never reads the others: a row in play and not done at t is in play at t + 1)
        valued = units if chosen and weights is None and not self.central else None
        return Rows(units, weights, valued)

    # ---- what the loop reads ----------------------------------------------------------
    def finish(self, k: int, iteration: int):
        self.alive[k], self.finished[k] = False, True

    def reported_names(self) -> list:
        return list(self.env.policy_specs)

    def reported(self, stats: torch.Tensor) -> dict:
        """An update's statistics (policies x statistics), read once, by policy name."""
        values = stats.tolist()  # one host read
        return {p.name: dict(zip(self.stats, v)) for p, v in zip(self.policies, values)}

    def warming_up(self) -> bool:
        return self.speed.warming_up(self.policies)

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS minibatch steps, where they fuse."""
        t, cfg = self.config.trainer, self.cfg
        steps = t.num_iterations(self.world_size) * cfg.update_epochs * cfg.num_minibatches
        fuse = not self.distributed and self.config.policy.recurrent == "none"
        return fuse and steps >= CPU_COMPILE_MIN_STEPS

    def models(self) -> dict:
        return {p.name: p.model for p in self.policies}

    def rollout_outputs(self) -> tuple:
        arrays = {f"{p.name} {name}": getattr(p.buffer, field) for p in self.policies
                  for name, field in (("reward", "rewards"), ("obs", "obs"))}
        return arrays, {key: ("step", "replica", key.split()[0]) for key in arrays}

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"models": {p.name: p.model.state_dict() for p in self.policies},
                "optimizers": {p.name: p.adam.state_dict() for p in self.policies},
                "shuffle_rngs": [self.shuffle.get_state()],
                "league": {} if self.league is None else self.league.state_dict(),
                "alive": list(self.alive), "finished": list(self.finished)}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers")
        self.alive[:], self.finished[:] = state["alive"], state["finished"]
        if self.league is not None:
            self.league.load_state_dict(state["league"])
        for p in self.policies:
            p.model.load_state_dict(state["models"][p.name])
            p.adam.load_state_dict(state["optimizers"][p.name])
        self.shuffle.set_state(state["shuffle_rngs"][0])
        self.speed.drop(self.policies)  # graphs captured again, after the loaded state

    def rank_state_dict(self) -> dict:
        return {"league": {} if self.league is None else self.league.rank_state_dict()}

    def load_rank_state_dict(self, state: dict):
        if self.league is not None:
            self.league.load_rank_state_dict(state["league"])

    @classmethod
    def acting_model(cls, config, env, spec):
        state_dim = env.global_state().shape[-1] if config.policy.critic == "central" else None
        return make_model(spec, config.policy, state_dim)


class A2C(PPO):
    """PPO with one epoch of one minibatch: the ratio is exactly 1 at that single step, so
    the clipped loss's gradient is the plain policy gradient."""
    Config = A2CConfig


class Rows(NamedTuple):
    """One policy's minibatch material for an update: `units` (flat buffer rows (step,
    replica, agent), or a recurrent policy's (sequences, bptt_len)), every flat row's
    `weights` (None: all count), and `valued`, the flat rows whose values GAE reads
    (None: all). (A tuple: a captured update copies its tensors in.)"""
    units: torch.Tensor
    weights: torch.Tensor | None
    valued: torch.Tensor | None


def rows_of(shape: tuple, replicas: torch.Tensor) -> torch.Tensor:
    """The flat rows of replicas `replicas`, in (step, replica, agent) order."""
    steps, envs, agents = shape
    device = replicas.device
    return ((torch.arange(steps, device=device)[:, None, None] * envs + replicas[:, None])
            * agents + torch.arange(agents, device=device)).reshape(-1)


def sequences(shape: tuple, length: int, device) -> torch.Tensor:
    """(sequences, length) flat rows: every agent's runs of `length` steps."""
    steps, envs, agents = shape
    per_step = envs * agents
    seq = torch.arange((steps // length) * per_step, device=device)
    starts = (seq // per_step) * length * per_step + seq % per_step
    return starts[:, None] + torch.arange(length, device=device) * per_step
