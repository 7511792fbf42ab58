"""One replica of a gpusim env as a PettingZoo `ParallelEnv`.

A ParallelEnv is one environment instance: agents are names, and every value
is a per-agent dict with no batch dimension. So this adapter presents one
replica (`replica=`); build the env with `num_envs=1` for it. With more
replicas, the others step in lockstep with action 0 and their results are
not read. For batched use of all replicas, use `to_torchrl`.

Agents are named `f"{policy}_{agent_id}"` ("tagger_0", "runner_10"), in
agent id order. All agents of a gpusim replica end together, so `agents`
stays complete until the episode ends, then is empty until `reset()`. gpusim
has already restarted the replica inside that last step; the adapter returns
the ended episode's final observations (the env's `final_obs`), never the
restarted state, and the next `reset()` starts anew.

Each step copies the replica's observations and rewards to the host (one
replica: this is an API for inspection, tests and turn-by-turn tools, not for
throughput).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from pettingzoo import ParallelEnv

from gpusim.env import Env
from gpusim.errors import ArrayError, ConfigError, GpusimError
from gpusim.wrappers.gymnasium import action_space_of, check_is_env, to_host


class GpusimParallelEnv(ParallelEnv):
    """`pettingzoo.ParallelEnv` over replica `replica` of a gpusim env.

    Spaces per agent: the env's float32 Box observation space of the agent's
    policy, and its action space (`Discrete(n)` for a one-component action,
    else MultiDiscrete); each agent has its own space objects, so seeding one
    agent's space leaves the others alone. `reset(seed=s)` re-seeds the
    whole env (gpusim's `env.reset(seed=s)`); `options` are accepted and
    ignored. `render()` returns None.
    """

    metadata = {"name": "gpusim", "render_modes": [], "is_parallelizable": True}
    render_mode = None

    def __init__(self, env: Env, replica: int = 0):
        check_is_env(env, "to_pettingzoo", continuous=False)
        if isinstance(replica, bool) or not isinstance(replica, (int, np.integer)) \
                or not 0 <= replica < env.num_envs:
            raise ConfigError(f"replica must be an integer in 0..{env.num_envs - 1}, "
                              f"got {replica!r}")
        self.env = env
        self.replica = int(replica)
        self.metadata = {**self.metadata, "name": env.name}
        policy_of = {i: policy for policy, ids in env.policies.items() for i in ids}
        self.possible_agents = [f"{policy_of[i]}_{i}" for i in range(env.num_agents)]
        self._agent_ids = {agent: i for i, agent in enumerate(self.possible_agents)}
        obs_spaces, act_spaces = env.observation_space, env.action_space
        self.observation_spaces = {agent: copy.deepcopy(obs_spaces[policy_of[i]])
                                   for agent, i in self._agent_ids.items()}
        self.action_spaces = {agent: action_space_of(copy.deepcopy(act_spaces[policy_of[i]]))
                              for agent, i in self._agent_ids.items()}
        self.agents = []
        # every replica's actions: the others keep action 0
        self._actions = torch.zeros((env.num_envs, env.num_agents, len(env.action_nvec)),
                                    dtype=torch.int64)

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs = self.env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        return self._per_agent(to_host(obs[self.replica])), {a: {} for a in self.agents}

    def step(self, actions: dict):
        if not self.agents:
            raise GpusimError("the episode has ended (or never started): call reset() first")
        self._write_actions(actions)
        obs, reward, terminated, truncated, info = self.env.step(self._actions.to(self.env.device))
        r = self.replica
        ended_by = {"terminated": bool(terminated[r]), "truncated": bool(truncated[r])}
        ended = any(ended_by.values())
        # An ended replica has already restarted: its last observation is final_obs.
        observations = self._per_agent(to_host((info["final_obs"] if ended else obs)[r]))
        rewards = dict(zip(self.agents, reward[r].tolist()))
        terminations = dict.fromkeys(self.agents, ended_by["terminated"])
        truncations = dict.fromkeys(self.agents, ended_by["truncated"])
        infos = {agent: {} for agent in self.agents}
        if ended:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def _write_actions(self, actions: dict):
        """Every live agent acts each step: gpusim has no idle agents."""
        missing = [a for a in self.agents if a not in actions]
        unknown = [a for a in actions if a not in self._agent_ids]
        if missing or unknown:
            raise ArrayError(f"actions must name every agent once: missing {missing[:5]}, "
                             f"unknown {unknown[:5]}")
        width = self._actions.shape[2]
        rows = [np.ravel(actions[a]) for a in self.possible_agents]
        for agent, row in zip(self.possible_agents, rows):
            if row.shape != (width,) or not np.issubdtype(row.dtype, np.integer):
                raise ArrayError(f"action of {agent} must be {width} integer(s), as its "
                                 f"action_space samples, got {actions[agent]!r}")
        self._actions[self.replica] = torch.from_numpy(np.stack(rows).astype(np.int64))

    def _per_agent(self, rows: np.ndarray) -> dict:
        return {agent: rows[i] for agent, i in self._agent_ids.items()}

    def render(self):
        return None

    def close(self):
        pass

    def __repr__(self):
        return f"GpusimParallelEnv({self.env.name}, replica={self.replica})"
