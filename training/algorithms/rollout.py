"""What a PPO rollout keeps, per policy, and the truncation bootstrap it adds to it.

`PolicyBuffer`: a policy's (rollout_len, replicas, agents, ...) tensors on
the env's device (observations, actions, log-probabilities, values, rewards,
done and in-play marks, masks, a central critic's states, recurrent states);
`PolicyGroup`: a policy's model, optimizer, buffer and compiled passes;
`TruncationBootstrap`: gamma * V(final state) added to the rewards of
truncated replicas, in batches, with no host sync; `Rollout`: PPO's
`collect`, which fills the buffers step by step; `take`, the gather every
reader of a buffer uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..acceleration import MaybeCompiled
from ..fused import FusedStep


def buffer_bytes(spec, rollout_len: int, num_envs: int, critic_dim: int = 0,
                 mask_width: int = 0) -> int:
    """What one policy's rollout buffer takes: obs, actions, log-prob, value, reward
    (4 bytes each), done, active and mask entries (1 byte each), a central critic's states."""
    rows = rollout_len * num_envs * spec.num_agents
    return rows * (4 * (spec.obs_dim + spec.action_width + 3) + 2 + mask_width) \
        + 4 * rollout_len * num_envs * critic_dim


class PolicyBuffer:
    """(rollout_len, num_envs, the policy's agents, ...) tensors on the env's device.

    `actions` holds what the model's forward takes back: choice indices, or
    the Gaussian's raw samples. `dones[t]` marks an agent whose episode ended
    with step t (its replica's, or its own); `active[t]` whether it was still
    playing at step t (always, without per-agent done). With action masks,
    `masks[t]` the legal choices at step t; with a central critic, `states[t]`
    the replica's global state (one per replica, not per agent).
    """

    def __init__(self, spec, rollout_len: int, num_envs: int, device, state_dim: int = 0,
                 mask_width: int = 0, memory_size: int = 0, bptt_len: int = 1):
        shape = (rollout_len, num_envs, spec.num_agents)
        self.obs = torch.zeros(shape + (spec.obs_dim,), device=device)
        self.actions = torch.zeros(shape + (spec.action_width,), device=device,
                                   dtype=torch.float32 if spec.continuous else torch.int32)
        self.log_probs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        self.active = torch.ones(shape, dtype=torch.bool, device=device)
        self.masks = torch.ones(shape + (mask_width,), dtype=torch.bool, device=device) \
            if mask_width else None
        self.states = torch.zeros((rollout_len, num_envs, state_dim), device=device) \
            if state_dim else None
        self.memory = torch.zeros((rollout_len // bptt_len, num_envs, spec.num_agents,
                                   memory_size), device=device) if memory_size else None

    def rows(self, index: torch.Tensor) -> dict:
        """The flat rows `index` (step, replica, agent) of every field the loss reads; `index`
        may have a sequence dim: (sequences, steps)."""
        def flat(x):
            return take(x.view((-1,) + x.shape[3:]), index)
        out = {"index": index, "obs": flat(self.obs), "actions": flat(self.actions),
               "log_probs": flat(self.log_probs), "values": flat(self.values),
               "mask": None if self.masks is None else flat(self.masks), "critic_obs": None}
        if self.states is not None:  # a row's replica state: its (step, replica) row
            agents = self.obs.shape[2]
            out["critic_obs"] = take(self.states.view(-1, self.states.shape[-1]), index // agents)
        return out


@dataclass
class PolicyGroup:
    """One policy: its space, agents, model, optimizer, buffer and compiled passes."""
    name: str
    spec: object             # its gpusim.spaces.PolicySpec
    agents: object           # a slice when the ids are contiguous (a view), else an index tensor
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    value: MaybeCompiled          # critic input -> value, for rollouts
    forward: MaybeCompiled        # the training pass: (obs, actions, mask, critic_obs) ->
                                  # (log-prob, entropy, value)
    buffer: PolicyBuffer
    fused: FusedStep | None = None  # the whole minibatch step compiled (training.fused)
    chunked: object = None  # the minibatch step as graphed chunks (algorithms.chunks)

    @property
    def continuous(self) -> bool:
        return self.spec.continuous


class TruncationBootstrap:
    """Adds gamma * V(final state) to the reward of truncated replicas, without a host sync.

    Rather than running the critic on every replica's final observation at
    every step, a truncated replica's final observation (and global state)
    waits in its slot, and the critic evaluates the slots every `interval`
    steps and at the end of the rollout. No replica truncates twice within
    the env's `time_limit` (so `interval` = time_limit; 1 when the env
    declares none), so no slot is overwritten before it is read. An agent
    that left play on the truncating step itself (per-agent done) ended its
    own episode: it gets no bootstrap.
    """

    def __init__(self, env, rollout_len: int, gamma: float, central: bool, memory: dict):
        self.env = env
        self.memory = memory  # recurrent policies: the actors' states, each step's latest
        self.final_memory = {name: torch.zeros_like(m) for name, m in memory.items()}
        self.gamma = gamma
        self.interval = max(1, getattr(env, "time_limit", None) or 1)
        self.final_obs = torch.zeros_like(env.arrays["final_obs"])
        self.final_state = torch.zeros_like(env.global_state()) if central else None
        self.playing = torch.ones((env.num_envs, env.num_agents), device=env.device)
        self.pending = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        self.step = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.rows = torch.arange(env.num_envs, device=env.device)
        self.rollout_len = rollout_len

    def record(self, t: int, truncated: torch.Tensor):
        env = self.env
        torch.where(truncated[:, None, None], env.arrays["final_obs"], self.final_obs,
                     out=self.final_obs)
        if self.final_state is not None:
            torch.where(truncated[:, None], env.global_state(final=True), self.final_state,
                        out=self.final_state)
        final_active = env.final_active()
        if final_active is not None:
            torch.where(truncated[:, None], final_active.float(), self.playing,
                        out=self.playing)
        for name, memory in self.memory.items():
            torch.where(truncated[:, None, None], memory, self.final_memory[name],
                        out=self.final_memory[name])
        self.step.masked_fill_(truncated, t)
        self.pending |= truncated

    def due(self, t: int) -> bool:
        return (t + 1) % self.interval == 0 or t == self.rollout_len - 1

    def flush(self, algorithm, groups):
        """Add the bootstrap of every pending slot to the reward of the step it truncated."""
        for g in groups:
            value = algorithm.values(g, self.final_obs, self.final_state,
                                     self.final_memory.get(g.name))
            rewards = g.buffer.rewards
            flat = rewards.view((-1,) + rewards.shape[2:])
            bonus = value.float() * (self.gamma * self.pending[:, None]) \
                * self.playing[:, g.agents]
            flat.index_add_(0, self.step * rewards.shape[1] + self.rows, bonus)
        self.pending.zero_()


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along dim 0, for an index of any shape: index_select, which on the CPU runs
    about 3x faster than advanced indexing (a minibatch's gather was 14% of an update)."""
    return x.index_select(0, index.reshape(-1)).view(index.shape + x.shape[1:])


class Rollout:
    """PPO's rollout (mixed into PPO, which owns the groups, actors, bootstrap, episode
    tracker and graphs it uses): `rollout_len` steps over every replica under no_grad,
    actions drawn on the device by training.actors, no host sync per step; the critic
    runs once over the stored rollout, at the start of the update. And what the update's
    minibatches are made of: the rollout's rows (or agent sequences), in their shuffles."""

    def collect(self, env_steps: int):
        """A rollout: eagerly, or its CUDA graph replayed (one section, "rollout")."""
        if self.rollout_graph.graph is None:
            self.rollout_graph()
            return
        with self.timer("rollout"):
            self.rollout_graph()

    @torch.no_grad()
    def _collect(self):
        env = self.env
        for t in range(self.config.trainer.rollout_len):
            with self.timer("forward"):
                active = env.agent_active()
                self._store_inputs(t, active)
                with self.precision.autocast():
                    acted = self.actors.act(self.next_obs)  # written into the env's arrays
                for g in self.groups:
                    g.buffer.actions[t].copy_(acted.stored[g.name])
                    g.buffer.log_probs[t].copy_(acted.log_prob[g.name])
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step()
            with self.timer("forward"):
                self._store_outcome(t, reward, info["reset_mask"], truncated, active)

    def _store_inputs(self, t: int, active):
        """Step t's observation, activity, legal choices, critic input and value, per policy."""
        state = self.env.global_state() if self.central else None
        mask = self.env.action_mask()
        for g in self.groups:
            buf = g.buffer
            buf.obs[t].copy_(self.observe(g.name, self.next_obs))
            if active is not None:
                buf.active[t].copy_(active[:, g.agents])
            if buf.masks is not None:
                buf.masks[t] = mask[:, g.agents, :self.mask_width]
            if buf.states is not None:
                buf.states[t].copy_(state)
            memory = self.actors.memory.get(g.name)
            if memory is not None and t % self.bptt_len == 0:  # a sequence starts
                buf.memory[t // self.bptt_len].copy_(memory)
            if memory is not None:  # else, after the rollout, in one batch
                buf.values[t] = self.values(g, self.next_obs, state, memory)

    def _rollout_values(self, g: PolicyGroup, in_play: torch.Tensor | None):
        """Every step's value, in one critic call over the stored rollout (the critic does
        not act, so it need not run per step), at the start of the update; with `in_play`
        (flat row indices, a local critic), the values of those rows only.

        The others' are never read: an agent in play and not done at step t is in play at
        t + 1 (`_store_outcome` marks it done on the step it leaves), so GAE reaches a
        row out of play only from rows out of play, which the update leaves out. In tag,
        where most runners are caught early, that skips most of the critic's rows."""
        buf = g.buffer
        if in_play is None:  # every step's, a few steps at a time (bounded memory)
            steps = max(1, self.cfg.max_minibatch_rows // buf.values[0].numel())
            for t in range(0, buf.values.shape[0], steps):
                part = slice(t, t + steps)
                states = None if buf.states is None else buf.states[part]
                buf.values[part] = self._critic(g, buf.obs[part], states)
            return
        if g.chunked is not None:  # its fixed-size chunks replayed as graphs
            g.chunked.values(in_play)
            return
        obs = buf.obs.view(-1, buf.obs.shape[-1])
        values = buf.values.view(-1).zero_()
        for first in range(0, in_play.shape[0], self.cfg.max_minibatch_rows):
            rows = in_play[first:first + self.cfg.max_minibatch_rows]
            values.index_copy_(0, rows, self._critic(g, take(obs, rows), None))

    def _store_outcome(self, t: int, reward, done, truncated, active):
        """Step t's rewards and done marks; the truncation bootstrap; episode returns."""
        still = self.env.agent_active()
        for g in self.groups:
            buf = g.buffer
            torch.mul(reward[:, g.agents], self.config.trainer.reward_scale, out=buf.rewards[t])
            # an agent's episode ends with its replica's, or when it stops playing
            dones = buf.dones[t]
            dones.copy_(done[:, None])  # copy_ into the view: half a setitem's cost
            if active is not None:
                dones |= buf.active[t] & ~still[:, g.agents]
        self.bootstrap.record(t, truncated)
        if self.bootstrap.due(t):
            self.bootstrap.flush(self, self.groups)
        self.actors.episode_ended(done, still)
        self.episodes.record(t, reward, done, active)

    # ---- the rollout's rows as minibatches -----------------------------------------
    def _draw_orders(self, g: PolicyGroup):
        """Each epoch's shuffle of a static update, drawn before it runs (a captured update
        replays the shuffle it captured; the eager one draws the same ones as it goes)."""
        units = self._units(g.buffer)[0].shape[0]
        orders = self.orders.get(g.name)
        if orders is None:
            orders = self.orders[g.name] = torch.empty((self.cfg.update_epochs, units),
                                                       dtype=torch.long, device=self.env.device)
        for epoch in range(self.cfg.update_epochs):
            orders[epoch].copy_(self._shuffled(units))

    def _shuffled(self, units: int) -> torch.Tensor:
        return torch.randperm(units, generator=self.shuffle, device=self.shuffle.device)

    def _minibatch_rows(self, units: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """The buffer rows of the units `picked` (positions in `units`): flat, or (sequences,
        steps) of a recurrent policy."""
        rows = units[picked]
        return rows if self.bptt_len else rows[:, 0]

    def _leaves_out_of_play(self) -> bool:
        """Whether the update leaves rows out of play out (`out_of_play`), where it can: not in
        a static update (one CUDA graph), which weighs them 0."""
        return not self.static_steps and self.cfg.out_of_play != "weigh"

    def _units(self, buf: PolicyBuffer) -> tuple:
        """What minibatches are made of, as (units, steps) flat row indices: every row
        (steps 1), or every agent sequence of `bptt_len` steps; and the rows' weights
        (None: every row counts).

        With per-agent done, rows out of play are left out (one host read: where most
        agents finish early, as in tag, that halves the update on the CPU), or weigh 0
        inside sequences, where fewer rows are in play than minibatches, and in static
        steps (CUDA graphs: every step the same shapes)."""
        steps, envs, agents = buf.rewards.shape
        device = buf.rewards.device
        active = None if self.env.agent_active_array is None else buf.active.reshape(-1)
        weights = None if active is None else active.float()
        if not self.bptt_len:
            if active is not None and self._leaves_out_of_play():
                in_play = active.nonzero()
                if in_play.shape[0] >= self.cfg.num_minibatches:
                    return in_play, None
            return torch.arange(steps * envs * agents, device=device)[:, None], weights
        per_step, length = envs * agents, self.bptt_len
        seq = torch.arange((steps // length) * per_step, device=device)
        starts = (seq // per_step) * length * per_step + seq % per_step
        return starts[:, None] + torch.arange(length, device=device) * per_step, weights
