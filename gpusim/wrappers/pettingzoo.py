"""One replica of a gpusim env as a PettingZoo `ParallelEnv`.

A ParallelEnv is one environment instance: agents are names, and every value
is a per-agent dict with no batch dimension. So this adapter presents one
replica (`replica=`); build the env with `num_envs=1` for it. With more
replicas, the others step in lockstep with action 0 and their results are
not read. For batched use of all replicas, use `to_torchrl`.

Agents are the env's `agent_names` (declared by the env, else
`f"{policy}_{agent_id}"`), in agent id order. An agent leaves `agents` on
the step its own episode ends: when its replica's episode ends (every agent
still playing), or earlier, in an env with per-agent done
(`env.agent_active()`), on the step it leaves play (a tagged runner). On
that step it still gets its observation, reward and info, with
`terminations` True (or `truncations`, at a time limit); afterwards it is
absent from every dict. gpusim has already restarted a finished replica
inside its last step; the adapter returns the ended episode's final
observations (the env's `final_obs`), never the restarted state, and the
next `reset()` starts anew.

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
from gpusim.wrappers.gymnasium import action_space_of, to_host
from gpusim.wrappers import check_is_env


class GpusimParallelEnv(ParallelEnv):
    """`pettingzoo.ParallelEnv` over replica `replica` of a gpusim env.

    Spaces per agent: the env's float32 Box observation space of the agent's
    policy, and its action space (`Discrete(n)` for a one-component action,
    else MultiDiscrete, or a float32 Box for continuous actions, clipped into
    the bounds by the env); each agent has its own space objects, so seeding
    one agent's space leaves the others alone. `reset(seed=s)` re-seeds the
    whole env (gpusim's `env.reset(seed=s)`); `options` are accepted and
    ignored. `render()` returns None.
    """

    metadata = {"name": "gpusim", "render_modes": [], "is_parallelizable": True}
    render_mode = None

    def __init__(self, env: Env, replica: int = 0):
        check_is_env(env, "to_pettingzoo")
        if isinstance(replica, bool) or not isinstance(replica, (int, np.integer)) \
                or not 0 <= replica < env.num_envs:
            raise ConfigError(f"replica must be an integer in 0..{env.num_envs - 1}, "
                              f"got {replica!r}")
        self.env = env
        self.replica = int(replica)
        self.metadata = {**self.metadata, "name": env.name}
        self.possible_agents = list(env.agent_names)
        self._agent_ids = {agent: i for i, agent in enumerate(self.possible_agents)}
        policy_of = {i: name for name, spec in env.policy_specs.items() for i in spec.agent_ids}
        obs_spaces, act_spaces = env.observation_space, env.action_space
        self.observation_spaces = {agent: copy.deepcopy(obs_spaces[policy_of[i]])
                                   for agent, i in self._agent_ids.items()}
        self.action_spaces = {agent: action_space_of(copy.deepcopy(act_spaces[policy_of[i]]))
                              for agent, i in self._agent_ids.items()}
        self.agents = []
        # each policy's actions for every replica, in the order of its agent ids; agents
        # out of play and the other replicas keep 0 (the env clips it into a Box's bounds)
        self._actions = {name: torch.zeros(
            (env.num_envs, spec.num_agents, spec.action_width),
            dtype=torch.float32 if spec.continuous else torch.int64)
            for name, spec in env.policy_specs.items()}
        self._slot = {agent: (policy_of[i], env.policy_specs[policy_of[i]].agent_ids.index(i))
                      for agent, i in self._agent_ids.items()}

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs = self.env.reset(seed=seed)
        playing = self._playing()
        self.agents = [a for a in self.possible_agents if playing[self._agent_ids[a]]]
        return self._per_agent(to_host(obs[self.replica])), {a: {} for a in self.agents}

    def step(self, actions: dict):
        if not self.agents:
            raise GpusimError("the episode has ended (or never started): call reset() first")
        self._write_actions(actions)
        obs, reward, terminated, truncated, info = self.env.step(
            {name: a.to(self.env.device) for name, a in self._actions.items()})
        r, live = self.replica, self.agents
        ended = bool(info["reset_mask"][r])
        # An ended replica has already restarted: its last observation is final_obs.
        observations = self._per_agent(to_host((info["final_obs"] if ended else obs)[r]))
        rewards = to_host(reward[r])
        ids = [self._agent_ids[a] for a in live]
        if ended:  # every agent still playing ends with its replica
            terminations = dict.fromkeys(live, bool(terminated[r]))
            truncations = dict.fromkeys(live, bool(truncated[r]))
            self.agents = []
        else:  # an agent that left play this step has terminated
            playing = self._playing()
            terminations = {a: not playing[i] for a, i in zip(live, ids)}
            truncations = dict.fromkeys(live, False)
            self.agents = [a for a, i in zip(live, ids) if playing[i]]
        return ({a: observations[a] for a in live},
                {a: float(rewards[i]) for a, i in zip(live, ids)},
                terminations, truncations, {a: {} for a in live})

    def _playing(self) -> np.ndarray:
        """Per agent, whether it is in its episode in this replica (all, without per-agent done)."""
        active = self.env.agent_active()
        if active is None:
            return np.ones(self.env.num_agents, dtype=bool)
        return to_host(active[self.replica])

    def _write_actions(self, actions: dict):
        """Every agent in play acts each step, and only those."""
        if not isinstance(actions, dict):
            raise ArrayError(f"actions must be a dict agent name -> action, "
                             f"got {type(actions).__name__}")
        missing = [a for a in self.agents if a not in actions]
        unknown = [a for a in actions if a not in self.agents]
        if missing or unknown:
            raise ArrayError(f"actions must name every agent in play once: missing "
                             f"{missing[:5]}, unknown or out of play {unknown[:5]}")
        for name, buffer in self._actions.items():
            buffer[self.replica] = 0
        for agent in self.agents:
            policy, slot = self._slot[agent]
            spec = self.env.policy_specs[policy]
            row = np.ravel(np.asarray(actions[agent]))
            kind = np.number if spec.continuous else np.integer
            if row.shape != (spec.action_width,) or not np.issubdtype(row.dtype, kind) \
                    or np.issubdtype(row.dtype, np.complexfloating):
                what = "number(s)" if spec.continuous else "integer(s)"
                raise ArrayError(f"action of {agent} must be {spec.action_width} {what}, as its "
                                 f"action_space samples, got {actions[agent]!r}")
            self._actions[policy][self.replica, slot] = torch.from_numpy(
                row.astype(np.float32 if spec.continuous else np.int64))

    def _per_agent(self, rows: np.ndarray) -> dict:
        """Each agent's observation: its policy's first obs_dim entries of its row."""
        return {agent: rows[i, :self.observation_spaces[agent].shape[0]]
                for agent, i in self._agent_ids.items()}

    def render(self):
        return None

    def close(self):
        pass

    def __repr__(self):
        return f"GpusimParallelEnv({self.env.name}, replica={self.replica})"
