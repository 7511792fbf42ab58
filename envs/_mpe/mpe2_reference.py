"""Step mpe2 itself from gpusim states: the oracle of the MPE tests and of `check_env`.

`Mpe2Reference(env_class, config, inject)` holds one of mpe2's own parallel
envs, built with the config's keys as mpe2's arguments (the MPE config keys
are mpe2's argument names). Called as `check_env`'s reference protocol,
`reference(state, actions)`, it loads each replica's state into mpe2's world
objects (agents' positions and velocities, landmarks' positions, the step
counter; `inject(world, state, e)` sets what the scenario adds, such as its
goals), steps mpe2's env with the same actions, and returns mpe2's next
state, observations (zero padded to gpusim's row width), rewards and flags.
mpe2 computes in float64 from the float32 state it is given.

mpe2 is imported only when a reference is built: it is a test dependency.
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np


class Mpe2Reference:
    def __init__(self, env_class, config, inject=None, kwargs=None):
        roles = env_class.roles(config)
        self.spaces = [r.action_space(env_class.dim_c, config.continuous_actions)
                       for r in roles for _ in range(r.count)]
        self.policy_ids = {}
        first = 0
        for r in roles:
            self.policy_ids[r.name] = range(first, first + r.count)
            first += r.count
        self.obs_dim = max(r.obs_dim for r in roles)
        self.continuous = config.continuous_actions
        self.inject = inject
        if kwargs is None:
            kwargs = dataclasses.asdict(config)
        module = importlib.import_module(f"mpe2.{env_class.mpe2_module}")
        self.env = module.parallel_env(**kwargs)
        self.env.reset(seed=0)
        self.names = list(self.env.possible_agents)

    @property
    def world(self):
        return self.env.unwrapped.world

    def load(self, state: dict, e: int):
        """Replica e of `state` into mpe2's world (reset first if its episode ended)."""
        if not self.env.agents:
            self.env.reset()
        world = self.world
        for i, agent in enumerate(world.agents):
            agent.state.p_pos = np.array(state["pos"][e, i], dtype=np.float64)
            agent.state.p_vel = np.array(state["vel"][e, i], dtype=np.float64)
        for j, landmark in enumerate(world.landmarks):
            landmark.state.p_pos = np.array(state["landmark_pos"][e, j], dtype=np.float64)
            landmark.state.p_vel = np.zeros(2)
        self.env.unwrapped.steps = int(state["timestep"][e])
        if self.inject is not None:
            self.inject(world, state, e)

    def agent_actions(self, actions, e: int) -> dict:
        """{mpe2 name: action} from gpusim's actions of replica e (one array, or a dict per
        policy in the order of its agent ids)."""
        if isinstance(actions, dict):
            rows = {}
            for policy, ids in self.policy_ids.items():
                for k, i in enumerate(ids):
                    rows[i] = np.asarray(actions[policy])[e, k]
        else:
            rows = {i: np.asarray(actions)[e, i] for i in range(len(self.names))}
        out = {}
        for i, name in enumerate(self.names):
            if self.continuous:  # clipped here as mpe2's ClipOutOfBoundsWrapper would, quietly
                out[name] = np.clip(np.asarray(rows[i][:self.spaces[i].dim], dtype=np.float32),
                                    np.float32(0), np.float32(1))
            else:
                out[name] = int(rows[i][0])
        return out

    def __call__(self, state: dict, actions):
        state = {k: np.asarray(v) for k, v in state.items()}
        num_envs, num_agents = state["pos"].shape[:2]
        next_state = {k: v.copy() for k, v in state.items()}
        obs = np.zeros((num_envs, num_agents, self.obs_dim), np.float32)
        reward = np.zeros((num_envs, num_agents), np.float32)
        terminated = np.zeros(num_envs, bool)
        truncated = np.zeros(num_envs, bool)
        for e in range(num_envs):
            self.load(state, e)
            got_obs, got_reward, got_term, got_trunc, _ = self.env.step(
                self.agent_actions(actions, e))
            world = self.world
            for i, name in enumerate(self.names):
                row = got_obs[name]
                obs[e, i, :len(row)] = row
                reward[e, i] = got_reward[name]
                next_state["pos"][e, i] = world.agents[i].state.p_pos
                next_state["vel"][e, i] = world.agents[i].state.p_vel
            terminated[e] = got_term[self.names[0]]
            truncated[e] = got_trunc[self.names[0]]
            next_state["timestep"][e] = self.env.unwrapped.steps
        return next_state, obs, reward, terminated, truncated

