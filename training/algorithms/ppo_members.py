"""A population of PPO (or A2C) runs trained side by side in one process, over a member dim.

`trainer.population` (training.population.members): N members, each the solo run
(training.algorithms.ppo) of its seed and settings, their networks stacked
(training.population.stacked: one batched product per layer), their Adam one with a
member dim (training.speed.descent), their minibatches cut from each member's own
share of the replicas (ppo_members_units.py). Read as the solo PPO: the rollout,
then per policy the rollout's values, GAE and epochs of minibatches, every member at
once; a member whose loss or parameters stop being finite is put back and frozen.
How it runs is chosen once (ppo_members_build.py). A population is
feed-forward and without a league (both refused in one line).
"""
from __future__ import annotations

import torch

from .. import losses
from ..league.pools import make_league
from ..models import make_model
from ..noise_scale import NoiseScale
from ..population.members import Members
from .base import Algorithm
from .ppo_config import (CPU_COMPILE_MIN_STEPS, A2CConfig, PPOConfig, check_for_env,
                         run_config, sequence_length)
from .ppo_members_build import (Policy, check_buffers_fit, choose_speed, coefficients,
                                critic_input, make_actors, make_policies, probe, recurrence)
from .ppo_members_units import EVERYONE, Units, learners, make_units, minibatches
from .rollout import TruncationBootstrap, mask_width


class PopulationPPO(Algorithm):
    Config = PPOConfig
    stats = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
    auto_scales = True
    captures_graphs = True

    def __init__(self, config, env, context, timer):
        self.members = Members(config, env, context)
        check_for_env(config, env, population=not self.members.solo)
        super().__init__(run_config(config, not self.members.solo), env, context, timer)
        t, members = self.config.trainer, self.members
        # what each concern decides once: the critic's input, recurrent sequences, masks
        self.central = config.policy.critic == "central"
        self.critic_input = critic_input(config, env)
        self.bptt_len = sequence_length(config)
        self.mask_width = mask_width(env)
        self.state_dim = self.critic_input.state_dim
        self.speed = choose_speed(self)  # how it runs (ppo_members_build), before what it runs
        check_buffers_fit(self)
        self.policies = make_policies(self)  # each whole, its passes as the speed chose
        self.league = make_league(self)
        self.learners = self.league.learners(self.policies)  # (index, policy) that learn
        self.actors = make_actors(self)
        self.recurrence = recurrence(self.bptt_len, self.actors.memory)
        # (in a league: the replicas where each policy learns)
        self.episodes.counted.update(self.league.counted([p.name for p in self.policies],
                                                         env.num_envs, env.device))
        self.episodes.members = members.count
        self.bootstrap = TruncationBootstrap(env, t.rollout_len, t.gamma, self.central,
                                             self.actors.memory)
        self.shuffles = members.shuffles()
        self.coefs, self.lam = coefficients(members, t.num_envs)  # what the loss and GAE take
        self.update_stats = torch.zeros((len(self.policies), members.count, len(self.stats)),
                                        device=env.device)
        self.noise = NoiseScale.for_run(self)  # the gradient noise scale, where asked for
        probe(self)  # a compiled training pass tried now, before training

    # ---- the rollout ------------------------------------------------------------------
    def collect(self, env_steps: int):
        """A rollout (its CUDA graph replayed, once captured: one section, "rollout")."""
        self.speed.collect(self.timer)

    @torch.no_grad()
    def rollout(self):
        """`rollout_len` steps: each policy's inputs stored, every agent's action drawn into
        the env's arrays, the env stepped, its rewards and done marks stored."""
        env = self.env
        for t in range(self.config.trainer.rollout_len):
            with self.timer("forward"):
                active = env.agent_active()
                self._store_inputs(t, active)
                with self.precision.autocast():
                    acted = self.actors.act(self.next_obs)  # written into the env's arrays
                for p in self.policies:
                    p.buffer.actions[t].copy_(acted.stored[p.name])
                    p.buffer.log_probs[t].copy_(acted.log_prob[p.name])
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step()
            with self.timer("forward"):
                self._store_outcome(t, reward, info["reset_mask"], truncated, active)

    def _store_inputs(self, t: int, active):
        """Step t's observation, activity, legal choices, critic input, and a recurrent
        policy's state and value (a feed-forward critic runs after the rollout)."""
        state, mask = self.critic_input.state(), self.env.action_mask()
        for p in self.policies:
            p.buffer.store_inputs(t, self.observe(p.name, self.next_obs), active, p.agents,
                                  mask, state)
            self.recurrence.store(t, p, self.values, self.next_obs, state)

    def _store_outcome(self, t: int, reward, done, truncated, active):
        """Step t's rewards and done marks; the truncation bootstrap; episode returns."""
        still = self.env.agent_active()
        for p in self.policies:
            p.buffer.store_outcome(t, reward, self.config.trainer.reward_scale, done, active,
                                   still, p.agents)
        self.bootstrap.record(t, truncated)
        self.bootstrap.after_step(t, self.values, self.policies)
        self.actors.episode_ended(done, still)
        self.league.episode_ended(t, done)
        self.episodes.record(t, reward, done, active)

    def values(self, p: Policy, obs, state, *memory):
        """(envs, the policy's agents) values of an env's (envs, agents, obs) array (after
        a recurrent policy's states `memory`)."""
        return self.critic(p, self.observe(p.name, obs), state, *memory)

    def critic(self, p: Policy, own, state, *memory):
        """(..., agents) values of the agents' own observations `own` (..., agents, obs)
        after the recurrent states `memory`, or of the replicas' global `state`."""
        with self.precision.autocast():
            return self.critic_input.value(p, own, state, *memory)

    # ---- the update -------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """Every policy's update: what minibatches are made of and their shuffles, drawn
        first; then the update (its graph replayed, once captured)."""
        members = self.members
        self.league.record(self.episodes)  # (the rollout's league games)
        for p in self.policies:
            p.adam.set_lr(members.rates(lr))
        orders = self.orders()
        if not any(members.alive):  # (the loop ends after this iteration)
            self.update_stats.zero_()
            return self.reported(self.update_stats, None)
        noise = self.noise.measure(self)  # at the rollout's parameters, where due
        before = self.saved()
        stats = self.speed.update_all(orders, learners(members.alive, self.env.device,
                                                       self.speed.whole))
        self.league.after_update(self.policies)
        return self.noise.added(self.reported(stats, before), noise)

    def orders(self) -> dict:
        """Each learning policy's units and every epoch's shuffle of each member's units
        (from the member's own generator)."""
        orders = {}
        for _, p in self.learners:
            units = self.units(p)
            orders[p.name] = (units, [[torch.randperm(u.shape[0], generator=g, device=g.device)
                                       for u, g in zip(units.rows, self.shuffles)]
                                      for _ in range(self.cfg.update_epochs)])
        return orders

    def update_all(self, orders: dict, learning=EVERYONE) -> torch.Tensor:
        """Each learning policy's update on its units and shuffles `orders[name]`, of the
        members `learning` (ppo_members_units.learners); the statistics, policies
        x members."""
        for k, p in self.learners:
            self.update_stats[k].copy_(self.update_policy(p, *orders[p.name], learning))
        return self.update_stats

    def update_policy(self, p: Policy, units, orders: list, learning) -> torch.Tensor:
        """The rollout's values and GAE, then `update_epochs` passes of shuffled minibatches
        (of rows, or of agent sequences for a recurrent policy); the mean statistics."""
        cfg, buf = self.cfg, p.buffer
        with torch.no_grad():
            self.rollout_values(p, units.value_rows)
            next_value = self.values(p, self.next_obs, self.critic_input.state(),
                                     *self.recurrence.memory(p.name))
            advantages, returns = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        stats = 0.0
        for epoch in range(cfg.update_epochs):
            for rows, weights in minibatches(units, orders[epoch], cfg.num_minibatches, p.name):
                stats = stats + self.minibatch_step(p, rows, weights, advantages, returns,
                                                    learning)
        return stats / (cfg.update_epochs * cfg.num_minibatches)

    def rollout_values(self, p: Policy, in_play=None):
        """Every step's value, in critic calls over the stored rollout (the critic does not
        act, so it need not run per step; a recurrent one's were stored as it acted); with
        `in_play` (flat rows, a lone critic on its own observations) the values of those
        rows only: GAE never reads the others from them."""
        p.rollout_values(in_play)

    def values_by_steps(self, p: Policy):
        """A network's values of the stored rollout, a few steps at a time (bounded memory)."""
        buf = p.buffer
        steps = max(1, self.cfg.max_minibatch_rows // buf.values[0].numel())
        for t in range(0, buf.values.shape[0], steps):
            part = slice(t, t + steps)
            buf.values[part] = self.critic(p, *self.critic_input.stored(buf, part))

    def values_by_members(self, p: Policy):
        """Stacked networks' values of the stored rollout: the members' replicas leading
        (the stacked networks split dim 0)."""
        buf = p.buffer
        buf.values.copy_(self.critic(p, *self.critic_input.by_members(buf)).transpose(0, 1))

    def minibatch_step(self, p: Policy, rows, weights, advantages, returns, learning=EVERYONE):
        """One gradient step on buffer rows `rows` ((members, rows), or (members, sequences,
        steps)) weighing `weights` (None: all count), of the members `learning`: the
        advantages normalised over each member's minibatch, then the step."""
        rows, weights = learning.pick(rows), learning.pick(weights)
        adv = losses.take(advantages, rows)
        total = rows[0].numel() if weights is None \
            else weights.flatten(1).sum(-1, keepdim=True).clamp_min(1.0)
        if self.cfg.norm_adv and rows[0].numel() > 1:
            adv = losses.normalized(adv.flatten(1), None if weights is None else
                                    weights.flatten(1), total, -1).view(rows.shape)
        stats = p.step(rows, adv, losses.take(returns, rows), weights, total, learning)
        return learning.put(stats)

    def loss(self, p: Policy, rows, adv, returns, weights, learning=EVERYONE, *, forward):
        """(detached statistics, loss) per member of PPO's objective on buffer rows `rows`
        (a chunk of a minibatch, of the members `learning`); `forward`: the training pass
        (the policy's own, or the compiled step's)."""
        batch = self.gather(p.buffer, rows)
        clip, ent, vf = (learning.pick(c) for c in self.coefs)
        with self.precision.autocast():
            new = forward(*batch["inputs"], members=learning.index)
        flat = [None if x is None else x.reshape(x.shape[0], -1) for x in (
            *new, batch["log_probs"], batch["values"], adv, returns, weights)]
        return losses.ppo_objective(flat[:3], *flat[3:], clip, self.cfg.clip_vloss, ent, vf,
                                    dim=-1)

    def loss_of(self, p: Policy):
        """Policy `p`'s loss as a minibatch step takes it, on its own training pass
        (`self.loss` looked up at each call: a test may wrap it)."""
        return lambda *batch: self.loss(p, *batch, forward=p.forward)

    def gather(self, buf, rows) -> dict:
        """The fields the loss reads of flat buffer rows `rows` (any shape: (..., steps)
        sequences carry a recurrent policy's start states and restarts)."""
        inputs = (buf.take("obs", rows), buf.take("actions", rows), buf.take("masks", rows),
                  self.critic_input.rows(buf, rows), *self.recurrence.inputs(buf, rows))
        return {"inputs": inputs, "log_probs": buf.take("log_probs", rows),
                "values": buf.take("values", rows)}

    def units(self, p: Policy) -> Units:
        """What policy `p`'s minibatches are made of (ppo_members_units.py)."""
        return make_units(p.buffer, self.members.count, self.league.trains_on(p.name),
                          self.env.agent_active_array is not None, self.bptt_len,
                          self.cfg.out_of_play, self.cfg.num_minibatches, p.rows_valued)

    def warming_up(self) -> bool:
        return any(graph.warming_up() for graph in self.speed.graphs(self.policies))

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS minibatch steps, where they fuse."""
        t, cfg = self.config.trainer, self.cfg
        steps = t.num_iterations(self.world_size) * cfg.update_epochs * cfg.num_minibatches
        fuse = not self.distributed and self.config.policy.recurrent == "none"
        return fuse and steps >= CPU_COMPILE_MIN_STEPS

    # ---- checkpoints ---------------------------------------------------------------------
    def models(self) -> dict:
        return {p.name: p.model for p in self.policies}

    @staticmethod
    def tensors(p: Policy) -> list:
        return list(p.model.parameters()) + p.adam.exp_avg + p.adam.exp_avg_sq \
            + [p.adam.step_count]

    def state_dict(self) -> dict:
        return {"models": {p.name: p.model.state_dict() for p in self.policies},
                "optimizers": {p.name: p.adam.state_dict() for p in self.policies},
                "shuffle_rngs": [g.get_state() for g in self.shuffles],
                "league": self.league.state_dict(), **self.members.state_dict()}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers")
        if not self.members.solo or "alive" in state:
            self.members.load_state_dict(state)
        self.league.load_state_dict(state.get("league") or {})
        for p in self.policies:
            p.model.load_state_dict(state["models"][p.name])
            p.adam.load_state_dict(state["optimizers"][p.name])
        rngs = state["shuffle_rngs"] if "shuffle_rngs" in state else [state["shuffle_rng"]]
        for generator, saved in zip(self.shuffles, rngs):
            generator.set_state(saved)
        for graph in self.speed.graphs(self.policies):
            graph.drop()  # capture again, after the loaded state

    def rollout_outputs(self) -> tuple:
        arrays = {f"{p.name} {name}": getattr(p.buffer, field) for p in self.policies
                  for name, field in (("reward", "rewards"), ("obs", "obs"))}
        return arrays, {key: ("step", "replica", key.split()[0]) for key in arrays}

    def rank_state_dict(self) -> dict:
        return {"league": self.league.rank_state_dict()}

    def load_rank_state_dict(self, state: dict):
        self.league.load_rank_state_dict(state.get("league") or {})

    @classmethod
    def acting_model(cls, config, env, spec):
        return make_model(spec, config.policy, critic_input(config, env).model_state_dim)


class PopulationA2C(PopulationPPO):
    """PPO with one epoch of one minibatch: the ratio is exactly 1 at that single step, so
    the clipped loss's gradient is the plain policy gradient."""
    Config = A2CConfig
