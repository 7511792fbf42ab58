"""What a PPO rollout keeps, per policy, and the truncation bootstrap it adds to it.

`PolicyBuffer`: a policy's (rollout_len, replicas, agents, ...) tensors on
the env's device (observations, actions, log-probabilities, values, rewards,
done and in-play marks, masks, a central critic's states, recurrent states);
`TruncationBootstrap`: gamma * V(final state) added to the rewards of
truncated replicas, in batches, with no host sync. PPO (ppo.py) fills and reads
them (ppo_members.py too).
"""
from __future__ import annotations

import torch

from ..losses import take


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

    def flat(self, field: str) -> torch.Tensor:
        """A (step, replica, agent, ...) field as flat rows (step, replica, agent), a view."""
        x = getattr(self, field)
        return x.view((-1,) + x.shape[3:])

    def take(self, field: str, rows: torch.Tensor):
        """A field's flat rows `rows` (any shape); None for a field this buffer lacks."""
        x = getattr(self, field)
        return None if x is None else take(x.view((-1,) + x.shape[3:]), rows)

    def store_inputs(self, t: int, own, active, agents, mask, state):
        """Step t's inputs: the agents' own observations `own`, and those of the env's
        arrays this buffer keeps (in-play marks `active` and legal choices `mask`, of every
        agent, None without them; the critic's global `state`)."""
        self.obs[t].copy_(own)
        if active is not None:
            self.active[t].copy_(active[:, agents])
        if self.masks is not None:
            self.masks[t] = mask[:, agents, :self.masks.shape[-1]]
        if self.states is not None:
            self.states[t].copy_(state)

    def store_outcome(self, t: int, reward, scale: float, done, active, still, agents):
        """Step t's rewards (of every agent: its agents', times `scale`) and done marks: an
        agent's episode ends with its replica's (`done`), or when it stops playing
        (`active` then, not `still` after)."""
        torch.mul(reward[:, agents], scale, out=self.rewards[t])
        dones = self.dones[t]
        dones.copy_(done[:, None])  # copy_ into the view: half a setitem's cost
        if active is not None:
            dones |= self.active[t] & ~still[:, agents]


def mask_width(env) -> int:
    """How many legal-choice entries a step stores per agent (0: the env has no masks)."""
    mask = env.action_mask()
    return 0 if mask is None else mask.shape[-1]


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

    def after_step(self, t: int, values, policies):
        """The pending slots' bootstrap, where step t is due to add it (every `interval`
        steps, and the rollout's last)."""
        if (t + 1) % self.interval == 0 or t == self.rollout_len - 1:
            self.flush(values, policies)

    def flush(self, values, policies):
        """Add the bootstrap of every pending slot to the reward of the step it truncated;
        `values(policy, obs, state, *memory)`: a policy's critic on an env's arrays."""
        for g in policies:
            memory = [m for name, m in self.final_memory.items() if name == g.name]
            value = values(g, self.final_obs, self.final_state, *memory)
            rewards = g.buffer.rewards
            flat = rewards.view((-1,) + rewards.shape[2:])
            bonus = value.float() * (self.gamma * self.pending[:, None]) \
                * self.playing[:, g.agents]
            flat.index_add_(0, self.step * rewards.shape[1] + self.rows, bonus)
        self.pending.zero_()
