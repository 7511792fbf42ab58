"""The env wrapper: device-resident arrays, reset, step and auto-reset.

An environment subclasses `Env` and declares (see envs/tag_continuous/env.py):
- `name`, `config_class` (a config dataclass with a `load` classmethod);
- `setup(config)`: sets `num_agents`, `obs_dim`, `action_nvec`, `policies`,
  and `time_limit` when episodes are truncated only on reaching that many
  steps (trainers then bootstrap truncations in batches instead of every step);
- `array_specs()`: its named arrays (state and scratch);
- `params()`: its scalar parameters, as numpy scalars;
- `initial_values()`: constant tables and other arrays to fill once;
- `reset_phases` and `step_phases`: portable phases (see gpusim.kernels).
Step phases write `obs`, `reward`, `terminated` and `truncated`; reset
phases draw one replica's initial state from its RNG streams and write `obs`.

The wrapper adds the arrays every env has, compiles one reset kernel and one
step kernel (step phases, then a guarded section that saves `final_obs` and
runs the reset phases in replicas that just finished), and launches them on
the backend with no host round trip.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numba
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec, DeviceArrays, namedtuple_type
from gpusim.backends import Backend, get_backend
from gpusim.errors import ArrayError, ConfigError, GpusimError
from gpusim.kernels import KernelSpec, Section, agent_phase


def _gymnasium_spaces():
    try:
        from gymnasium import spaces
    except ImportError:
        raise GpusimError("env spaces are gymnasium spaces: pip install 'gpusim[interop]'") \
            from None
    return spaces


def checked_seed(seed) -> int:
    """`seed` as an int in [0, 2**64): the RNG streams are keyed by it."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= int(seed) < 2**64:
        raise ConfigError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


@numba.jit(nopython=True)
def replica_done(env, s, p):
    return s.terminated[env] or s.truncated[env]


@numba.jit(nopython=True)
def save_final_obs(env, agent, s, p):
    for k in range(s.obs.shape[2]):
        s.final_obs[env, agent, k] = s.obs[env, agent, k]


class Env:
    name = ""
    config_class = None
    reset_phases: tuple = ()
    step_phases: tuple = ()
    # Optional CUDA C kernels for the cuda_c backend, as "file.cu:function", a path
    # relative to the env's own module (see docs/custom_env.md); the step kernel
    # includes the auto-reset.
    cuda_c_reset: str | None = None
    cuda_c_step: str | None = None

    # set by setup()
    num_agents: int
    obs_dim: int
    action_nvec: tuple
    policies: dict
    time_limit: int | None = None  # None: an episode may be truncated at any step
    nonnegative_state: tuple = ("timestep",)  # state arrays set_state refuses below 0
    render_arrays: tuple = ()  # the arrays a rendered frame needs (gpusim.render); see draw

    def __init__(self, num_envs: int, backend: str | Backend = "auto", seed: int = 0,
                 config=None, check_actions: bool | None = None, env_offset: int = 0):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self.config = config if config is not None else self.config_class.load()
        self.setup(self.config)
        self.backend = backend if isinstance(backend, Backend) else get_backend(backend)
        self.backend.check_num_agents(self.num_agents)
        self.num_envs = num_envs
        self.seed = checked_seed(seed)
        # Replica e draws from stream (seed, env_offset + e): ranks of a multi-process
        # run pass disjoint offsets, so no two replicas anywhere start alike.
        self.env_offset = int(env_offset)
        self.check_actions = self.device.type == "cpu" if check_actions is None else check_actions
        specs = self._all_specs()
        self.backend.check_fits(f"the arrays of {num_envs:,} {self.name} replicas",
                                DeviceArrays.nbytes(specs, num_envs, self.num_agents))
        self.arrays = DeviceArrays(specs, num_envs, self.num_agents, self.backend)
        for name, value in self.initial_values().items():
            self.arrays.write(name, value)
        self.arrays["rng_state"].copy_(rng.seed_streams(num_envs, self.num_agents, self.seed,
                                                         self.env_offset))
        params = self.params()
        self._params = namedtuple_type("Params", tuple(params))(**params)
        self._nvec = torch.tensor(self.action_nvec, dtype=torch.int32, device=self.device)
        self._max_action = self._nvec - 1
        views = self.arrays.views
        self._reset_kernel = self.backend.compile(self.reset_kernel_spec(), views, self._params)
        self._step_kernel = self.backend.compile(self.step_kernel_spec(), views, self._params)

    # ---- what a subclass provides --------------------------------------------
    def setup(self, config):
        raise NotImplementedError

    def array_specs(self) -> dict:
        raise NotImplementedError

    def params(self) -> dict:
        return {}

    def initial_values(self) -> dict:
        return {}

    def check_state(self, state: dict):
        """Reject injected values the env cannot honour (raise ArrayError); default: none."""

    def draw(self, ax, frame: dict):
        """Draw one frame (render_arrays of one replica, numpy) on a matplotlib axis."""
        raise GpusimError(f"env {self.name} cannot be rendered")

    def episode_measures(self):
        """Env-specific measures of finished episodes for evaluation, or None (default).

        An object with `after_step(done)` (called after every step) and
        `per_episode()` -> {name: [one value per finished episode]}.
        """
        return None

    # ---- kernels -------------------------------------------------------------
    @classmethod
    def reset_kernel_spec(cls) -> KernelSpec:
        return KernelSpec.of(f"{cls.name}.reset", *cls.reset_phases, cuda_c=cls.cuda_c_reset,
                             cuda_c_dir=cls._kernel_dir("cuda_c_reset"))

    @classmethod
    def step_kernel_spec(cls) -> KernelSpec:
        auto_reset = Section((agent_phase(save_final_obs),) + tuple(cls.reset_phases),
                             guard=replica_done)
        return KernelSpec.of(f"{cls.name}.step", *cls.step_phases, auto_reset,
                             cuda_c=cls.cuda_c_step, cuda_c_dir=cls._kernel_dir("cuda_c_step"))

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
        n_act = len(self.action_nvec)
        common = {
            "obs": ArraySpec(torch.float32, (self.obs_dim,)),
            "final_obs": ArraySpec(torch.float32, (self.obs_dim,)),
            "reward": ArraySpec(torch.float32),
            "terminated": ArraySpec(torch.bool, scope="env"),
            "truncated": ArraySpec(torch.bool, scope="env"),
            "reset_mask": ArraySpec(torch.bool, scope="env"),
            "actions": ArraySpec(torch.int32, (n_act,)),
            "rng_state": ArraySpec(torch.uint64, (2,)),
        }
        own = self.array_specs()
        clash = set(common) & set(own)
        if clash:
            raise ArrayError(f"env arrays {sorted(clash)} clash with gpusim's own names")
        return {**common, **own}

    # ---- the API ---------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def observation_space(self) -> dict:
        """Per policy, the gymnasium space of one agent's observation (float32 Box)."""
        spaces = _gymnasium_spaces()
        box = spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        return {name: box for name in self.policies}

    @property
    def action_space(self) -> dict:
        """Per policy, the gymnasium space of one agent's action (MultiDiscrete)."""
        spaces = _gymnasium_spaces()
        return {name: spaces.MultiDiscrete(np.asarray(self.action_nvec, dtype=np.int64))
                for name in self.policies}

    @property
    def rng_state(self) -> torch.Tensor:
        """The (num_envs, num_agents, 2) uint64 RNG streams, shared with the action sampler."""
        return self.arrays["rng_state"]

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Draw a fresh initial state in every replica; returns `obs`.

        With `seed`, the RNG streams are re-seeded first.
        """
        if seed is not None:
            self.seed = checked_seed(seed)
            self.arrays["rng_state"].copy_(rng.seed_streams(self.num_envs, self.num_agents,
                                                            self.seed, self.env_offset))
        for name in ("terminated", "truncated", "reset_mask"):
            self.arrays[name].zero_()
        self._launch(self._reset_kernel)
        return self.arrays["obs"]

    def step(self, actions: torch.Tensor):
        """Advance every replica one step; finished replicas are reset automatically.

        Returns (obs, reward, terminated, truncated, info), all tensors on
        `env.device`. They are the env's own buffers, overwritten by the next
        step: clone what you keep. `info["final_obs"][e]` holds the last
        observation of replica e where `info["reset_mask"][e]` is true.
        """
        self._write_actions(actions)
        self._launch(self._step_kernel)
        a = self.arrays
        torch.logical_or(a["terminated"], a["truncated"], out=a["reset_mask"])
        info = {"final_obs": a["final_obs"], "reset_mask": a["reset_mask"]}
        return a["obs"], a["reward"], a["terminated"], a["truncated"], info

    def get_state(self, include_rng: bool = False) -> dict:
        """Copies of the state arrays (and the RNG streams if asked)."""
        names = self.arrays.state_names() + (("rng_state",) if include_rng else ())
        return {name: self.arrays[name].clone() for name in names}

    def set_state(self, state: dict):
        """Inject state arrays (any subset of `get_state()`'s keys), checked by name."""
        allowed = set(self.arrays.state_names()) | {"rng_state"}
        for name in state:
            if name not in allowed:
                raise ArrayError(f"'{name}' is not a state array of {self.name} "
                                 f"(state arrays: {', '.join(sorted(allowed))})")
        values = {name: self.arrays.checked(name, value) for name, value in state.items()}
        for name, value in values.items():
            self._check_values(name, value)
        self.check_state(values)
        for name, value in values.items():  # nothing is written unless everything passed
            self.arrays[name].copy_(value)

    def _check_values(self, name: str, value: torch.Tensor):
        """What no env can honour: NaN or infinities, a stuck RNG stream, negative counters."""
        bad = None
        if value.dtype.is_floating_point:
            bad, why = ~torch.isfinite(value), "is NaN or infinite"
        elif name == "rng_state":
            bad, why = (value == 0).all(-1), "is all zero (a xoroshiro128+ stream stays zero)"
        elif name in self.nonnegative_state:
            bad, why = value < 0, "is negative"
        if bad is not None and bool(bad.any()):
            index = ", ".join(str(int(i)) for i in bad.nonzero()[0])
            raise ArrayError(f"set_state: {name}[{index}] {why}")

    # ---- internals -----------------------------------------------------------------
    def _launch(self, kernel):
        kernel(self.num_envs, self.num_agents, self.arrays.views, self._params)

    def _write_actions(self, actions):
        expected = (self.num_envs, self.num_agents, len(self.action_nvec))
        if not isinstance(actions, torch.Tensor):
            if isinstance(actions, np.ndarray):
                actions = torch.from_numpy(actions)
            else:
                raise ArrayError(f"actions must be a torch tensor, got {type(actions).__name__}")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ArrayError(f"actions must have an integer dtype, got {actions.dtype}")
        if tuple(actions.shape) != expected:
            raise ArrayError(f"actions must have shape {expected} "
                             f"(num_envs, num_agents, len(action_nvec)), got {tuple(actions.shape)}")
        buffer = self.arrays["actions"]
        if self.check_actions:  # in the given dtype: an int64 2**32 + 1 must not wrap to 1
            nvec = self._nvec.to(actions.device)
            bad = (actions < 0) | (actions >= nvec)
            if bool(bad.any()):
                e, i, c = (int(v) for v in bad.nonzero()[0])
                raise ArrayError(
                    f"action out of range: actions[{e}, {i}, {c}] = {int(actions[e, i, c])}, "
                    f"component {c} takes 0..{self.action_nvec[c] - 1}")
            buffer.copy_(actions)
            return
        if actions.dtype != buffer.dtype:  # clamp before the narrowing copy, not after
            actions = torch.minimum(actions.clamp(min=0), self._max_action.to(actions.device))
        buffer.copy_(actions)
        torch.clamp_(buffer, min=0)
        torch.minimum(buffer, self._max_action, out=buffer)

    def __repr__(self):
        return (f"<{type(self).__name__} num_envs={self.num_envs} num_agents={self.num_agents} "
                f"backend={self.backend.name} device={self.device}>")
