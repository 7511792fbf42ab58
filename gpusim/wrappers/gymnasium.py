"""A one-agent gpusim env as a gymnasium `VectorEnv`, and as a Stable-Baselines3 `VecEnv`.

Each replica is one sub-environment. gpusim resets a finished replica inside
the step that ends it, which is gymnasium's `AutoresetMode.SAME_STEP`: the
returned observation of that replica is already the first one of its next
episode, and the last one of the ended episode is in `infos["final_obs"]`
(an object array, None where `infos["_final_obs"]` is False), exactly as
gymnasium's own `SyncVectorEnv` gives it in that mode.

gymnasium's vector API is numpy, so each step copies its results to the
host once (observations, rewards and the two flags, plus the final
observations of the replicas that ended); every returned array is new, never
a view of the env's buffers, which the next step overwrites.
"""
from __future__ import annotations

import functools

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from gpusim.env import Env, checked_seed
from gpusim.errors import ArrayError, GpusimError
from gpusim.wrappers import check_is_env


def action_space_of(space: spaces.Space) -> spaces.Space:
    """`Discrete(n)` for a one-component MultiDiscrete (the standard space that SB3
    and most libraries expect, e.g. CartPole's), else the space itself."""
    if isinstance(space, spaces.MultiDiscrete) and space.shape == (1,):
        return spaces.Discrete(int(space.nvec[0]))
    return space


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """A new numpy array with the tensor's values: one copy, from any device."""
    return tensor.detach().to("cpu", copy=True).numpy()


class GymnasiumVectorEnv(gymnasium.vector.VectorEnv):
    """`gymnasium.vector.VectorEnv` over the `num_envs` replicas of a one-agent gpusim env.

    Spaces: `single_observation_space` is the env's float32 Box; the
    `single_action_space` is `Discrete(n)` when the env's action has one
    component, else its MultiDiscrete, or its Box for continuous actions
    (clipped into the bounds by the env). Rewards are the env's float32.
    `reset` returns the agent's name (`env.agent_names`, also `.agent_name`) in
    `infos["agent_name"]`, one entry per sub-environment.
    `reset(seed=s)` re-seeds every replica's RNG stream from s (replica e
    draws from stream (s, e)), so one integer seeds the whole batch. Reset
    options are ignored, except `reset_mask`: all replicas reset together.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: Env):
        check_is_env(env, "to_gymnasium")
        if env.num_agents != 1:
            raise GpusimError(
                f"to_gymnasium takes a one-agent env, and {env.name} has {env.num_agents} "
                "agents: use to_pettingzoo (one replica) or to_torchrl (all replicas)")
        if env.agent_active_array is not None:
            raise GpusimError(
                f"to_gymnasium takes envs whose agent plays until its replica's episode ends; "
                f"{env.name}'s agent can leave play earlier (agent_active_array): use "
                "to_pettingzoo or to_torchrl, which report per-agent done")
        self.env = env
        self.agent_name = env.agent_names[0]
        self.metadata = dict(self.metadata)  # the instance's own, as in gymnasium's vector envs
        self.num_envs = env.num_envs
        policy = next(iter(env.policies))
        self.single_observation_space = env.observation_space[policy]
        self.single_action_space = action_space_of(env.action_space[policy])
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._action_shape = (self.num_envs, 1, env.policy_specs[policy].action_width)
        self._needs_reset = True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a new episode in every replica; returns (obs, {})."""
        if options and "reset_mask" in options:
            raise GpusimError("gpusim resets all replicas at once (finished ones reset "
                              "themselves in step): leave out options['reset_mask']")
        if seed is not None:
            seed = checked_seed(seed)
        super().reset(seed=seed)  # seeds self.np_random, as gymnasium expects
        obs = self.env.reset(seed=seed)
        self._needs_reset = False
        return to_host(obs[:, 0]), self._name_info()

    def _name_info(self) -> dict:
        """The agent's name per sub-environment, as a vector env's infos hold values."""
        return {"agent_name": np.full(self.num_envs, self.agent_name, dtype=object),
                "_agent_name": np.ones(self.num_envs, dtype=bool)}

    def step(self, actions):
        """One step of every replica; finished replicas restart in the same step."""
        if self._needs_reset:
            raise GpusimError("call reset() before the first step()")
        obs, reward, terminated, truncated, info = self.env.step(self._actions_tensor(actions))
        terminations, truncations = to_host(terminated), to_host(truncated)
        infos = self._final_infos(info["final_obs"], terminations | truncations)
        return to_host(obs[:, 0]), to_host(reward[:, 0]), terminations, truncations, infos

    def _actions_tensor(self, actions) -> torch.Tensor:
        actions = np.asarray(actions)
        if actions.shape != self.action_space.shape:
            raise ArrayError(f"actions must have shape {self.action_space.shape} "
                             f"(the action_space's), got {actions.shape}")
        return torch.from_numpy(np.ascontiguousarray(actions)).reshape(self._action_shape) \
            .to(self.env.device)

    def _final_infos(self, final_obs: torch.Tensor, done: np.ndarray) -> dict:
        """SAME_STEP's infos: the ended replicas' last observations, as SyncVectorEnv has them."""
        if not done.any():
            return {}
        ended = np.flatnonzero(done)
        rows = to_host(final_obs[torch.from_numpy(ended).to(final_obs.device), 0])
        objects = np.full(self.num_envs, None, dtype=object)
        for i, row in zip(ended, rows):
            objects[i] = row
        return {"final_obs": objects, "_final_obs": done.copy(),
                "final_info": {}, "_final_info": done.copy()}

    def __repr__(self):
        return f"GymnasiumVectorEnv({self.env.name}, num_envs={self.num_envs})"


def to_sb3(env):
    """A Stable-Baselines3 `VecEnv` over a gpusim env or a SAME_STEP gymnasium VectorEnv.

    SB3 2.x takes only its own VecEnv (a gymnasium VectorEnv would be wrapped
    as if it were a single env), so this adapts one to the other: SB3 gets
    each ended replica's last observation as `infos[i]["terminal_observation"]`
    and `infos[i]["TimeLimit.truncated"]`, as from its DummyVecEnv. Wrap it in
    `VecMonitor` for episode statistics.
    """
    vector_env = GymnasiumVectorEnv(env) if isinstance(env, Env) else env
    if not isinstance(vector_env, gymnasium.vector.VectorEnv):
        raise GpusimError(f"to_sb3 takes a gpusim env (gpusim.make(...)) or a gymnasium "
                          f"VectorEnv, got {type(env).__name__}")
    if vector_env.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
        raise GpusimError("to_sb3 needs a vector env that resets in the same step "
                          "(metadata['autoreset_mode'] = AutoresetMode.SAME_STEP)")
    return _sb3_vec_env_class()(vector_env)


@functools.cache
def _sb3_vec_env_class():
    """The adapter class, built on first use: its base class is SB3's, an optional library."""
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        """SB3's VecEnv API over a gymnasium VectorEnv with SAME_STEP autoreset."""

        def __init__(self, vector_env):
            self.vector_env = vector_env
            super().__init__(vector_env.num_envs, vector_env.single_observation_space,
                             vector_env.single_action_space)

        def reset(self):
            # SB3 keeps seed + i per env; a gpusim env seeds all replicas from one seed.
            obs, _ = self.vector_env.reset(seed=self._seeds[0], options=self._options[0] or None)
            self._reset_seeds()
            self._reset_options()
            return obs

        def step_async(self, actions):
            self._actions = actions

        def step_wait(self):
            obs, rewards, terminations, truncations, infos = self.vector_env.step(self._actions)
            dones = terminations | truncations
            env_infos = [{"TimeLimit.truncated": bool(truncations[i] and not terminations[i])}
                         for i in range(self.num_envs)]
            for i in np.flatnonzero(dones):
                env_infos[i]["terminal_observation"] = infos["final_obs"][i]
            return obs, rewards.astype(np.float32, copy=False), dones, env_infos

        def close(self):
            self.vector_env.close()

        # The replicas are one env: an attribute or method is the same for every index.
        def get_attr(self, attr_name, indices=None):
            return [getattr(self.vector_env, attr_name)] * len(self._get_indices(indices))

        def set_attr(self, attr_name, value, indices=None):
            setattr(self.vector_env, attr_name, value)

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            result = getattr(self.vector_env, method_name)(*method_args, **method_kwargs)
            return [result] * len(self._get_indices(indices))

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._get_indices(indices))

    return SB3VecEnv
