"""How an `Env` is built from what it declares: `EnvBuild`, a base class of gpusim.env.Env.

- Declaring: the config checked, the env's `setup` run, its policies and agent
  names resolved; a mistake in the env's own code is one line naming it.
- Kernels: the reset, step and observe `KernelSpec`s. Around the env's step
  phases the step kernel runs gpusim's own: continuous actions clipped into
  their bounds first, and last a section guarded by `replica_done` that saves
  the final observation (and activity, and global state) and runs the reset
  phases (the auto-reset).
- Arrays: those every env has beside its own (obs, reward, done flags, RNG
  streams, action arrays and bounds), checked against the env's own.

The methods read what `Env` declares and `setup` sets.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numba
import numpy as np
import torch

from gpusim import spaces
from gpusim.arrays import ArraySpec
from gpusim.errors import ArrayError, ConfigError, GpusimError, debug, env_code_failed
from gpusim.kernels import KernelSpec, Section, agent_phase, env_phase


@numba.jit(nopython=True)
def replica_done(env, s, p):
    return s.terminated[env] or s.truncated[env]


@numba.jit(nopython=True)
def clip_continuous_actions(env, agent, s, p):
    """Each continuous action into its agent's bounds (NaN, which compares false, to low)."""
    for k in range(s.continuous_actions.shape[2]):
        value = s.continuous_actions[env, agent, k]
        if not value >= s.action_low[agent, k]:
            value = s.action_low[agent, k]
        elif value > s.action_high[agent, k]:
            value = s.action_high[agent, k]
        s.continuous_actions[env, agent, k] = value


@numba.jit(nopython=True)
def save_final_obs(env, agent, s, p):
    for k in range(s.obs.shape[2]):
        s.final_obs[env, agent, k] = s.obs[env, agent, k]


@numba.jit(nopython=True)
def save_final_active(env, agent, s, p):
    s.final_active[env, agent] = s.agent_active[env, agent]


@numba.jit(nopython=True)
def save_final_state(env, s, p):
    for k in range(s.state.shape[1]):
        s.final_state[env, k] = s.state[env, k]


class EnvBuild:
    """The building half of `gpusim.env.Env`: declaring, kernel specs, array specs."""
    REQUIRED = ("num_agents", "obs_dim", "policies")  # what setup() must set

    # ---- declaring: a mistake in the env's own code is one line naming it ------------
    def _declare(self, config):
        self.config = self._checked_config(config)
        self._run_setup()
        self.policy_specs = spaces.resolve(self)
        self.agent_names = spaces.agent_names(self)

    @classmethod
    def check_config_class(cls):
        """Refuse, naming the env, a config_class that is not a config dataclass."""
        config_class = cls.config_class
        if not (dataclasses.is_dataclass(config_class) and isinstance(config_class, type)
                and callable(getattr(config_class, "load", None))):
            raise GpusimError(f"env {cls.name}: config_class must be a config dataclass with "
                              f"a load() classmethod (subclass gpusim.config.EnvConfig), "
                              f"got {config_class!r}")

    def _checked_config(self, config):
        self.check_config_class()
        cls = self.config_class
        if config is None:
            return cls.load()
        if not isinstance(config, cls):
            raise ConfigError(f"config= takes a {cls.__name__} (e.g. {cls.__name__}.load(...)), "
                              f"got {type(config).__name__}; pass config keys as keywords "
                              f"instead: gpusim.make(name, key=value)")
        return config

    def _run_setup(self):
        try:
            self.setup(self.config)
        except GpusimError:
            raise
        except Exception as exc:
            if debug():
                raise
            raise env_code_failed(self.name, "setup()", exc) from None
        missing = [name for name in self.REQUIRED if not hasattr(self, name)]
        if missing:
            raise GpusimError(f"env {self.name}: setup() does not set {', '.join(missing)} "
                              "(docs/env_phases.md lists what setup declares)")

    # ---- kernels -------------------------------------------------------------
    @classmethod
    def reset_kernel_spec(cls) -> KernelSpec:
        return KernelSpec.of(f"{cls.name}.reset", *cls.reset_phases, cuda_c=cls.cuda_c_reset,
                             cuda_c_dir=cls._kernel_dir("cuda_c_reset"))

    def step_kernel_spec(self) -> KernelSpec:
        cls = type(self)
        save = (agent_phase(save_final_obs),) + \
            ((agent_phase(save_final_active),) if self.agent_active_array else ()) + \
            ((env_phase(save_final_state),) if self.state_dim else ())
        auto_reset = Section(save + tuple(cls.reset_phases),
                             guard=replica_done)
        clip = (agent_phase(clip_continuous_actions),) \
            if self.continuous_dim and not self.raw_continuous_actions else ()
        return KernelSpec.of(f"{cls.name}.step", *clip, *cls.step_phases, auto_reset,
                             cuda_c=cls.cuda_c_step, cuda_c_dir=cls._kernel_dir("cuda_c_step"))

    @classmethod
    def observe_kernel_spec(cls) -> KernelSpec:
        return KernelSpec.of(f"{cls.name}.observe", *cls.observe_phases)

    @classmethod
    def _kernel_dir(cls, attribute: str) -> str | None:
        """The folder of the module of the class that names the kernel (`attribute`): its
        CUDA C file is found beside it, also from a subclass defined elsewhere."""
        owner = next((c for c in cls.__mro__ if attribute in vars(c)), cls)
        try:
            return str(Path(inspect.getfile(owner)).resolve().parent)
        except (TypeError, OSError):  # defined interactively
            return None

    def _all_specs(self) -> dict:
        common = {
            "obs": ArraySpec(torch.float32, (self.obs_dim,)),
            "final_obs": ArraySpec(torch.float32, (self.obs_dim,)),
            "reward": ArraySpec(torch.float32),
            "terminated": ArraySpec(torch.bool, scope="env"),
            "truncated": ArraySpec(torch.bool, scope="env"),
            "reset_mask": ArraySpec(torch.bool, scope="env"),
            "rng_state": ArraySpec(torch.uint64, (2,)),
        }
        if self.discrete_width:
            common["actions"] = ArraySpec(torch.int32, (self.discrete_width,))
        if self.state_dim:
            common["state"] = ArraySpec(torch.float32, (self.state_dim,), scope="env")
            common["final_state"] = ArraySpec(torch.float32, (self.state_dim,), scope="env")
        if self.continuous_dim:  # bounds per agent, as policies may differ
            bounds = ArraySpec(torch.float32, (self.num_agents, self.continuous_dim),
                               scope="global")
            common.update(continuous_actions=ArraySpec(torch.float32, (self.continuous_dim,)),
                          action_low=bounds, action_high=bounds)
        own = self.array_specs()
        clash = set(common) & set(own)
        if clash:
            raise ArrayError(f"env arrays {sorted(clash)} clash with gpusim's own names")
        active = self.agent_active_array
        if active is not None and (active not in own or own[active].scope != "agent"
                                   or not own[active].state):
            raise ArrayError(f"agent_active_array {active!r} must name an agent-scope state "
                             "array of the env")
        if active is not None:  # its value when the replica ended, kept as final_obs is
            common["final_active"] = ArraySpec(own[active].dtype)
        mask = self.action_mask_array
        width = max((sum(p.actions) for p in self.policy_specs.values() if not p.continuous),
                    default=0)
        if mask is not None and (mask not in own or own[mask].scope != "agent"
                                 or tuple(own[mask].shape) != (width,)):
            raise ArrayError(f"action_mask_array {mask!r} must name an agent-scope array of "
                             f"the env, {width} wide (the largest sum of a discrete policy's "
                             "choices)")
        return {**common, **own}

    def _action_bounds(self) -> dict:
        """action_low / action_high per agent (zeros where an agent acts discretely)."""
        if not self.continuous_dim:
            return {}
        low = np.zeros((self.num_agents, self.continuous_dim), dtype=np.float32)
        high = np.zeros_like(low)
        for p in self.policy_specs.values():
            if p.continuous:
                low[list(p.agent_ids), :p.action_width] = p.actions.low
                high[list(p.agent_ids), :p.action_width] = p.actions.high
        return {"action_low": low, "action_high": high}
