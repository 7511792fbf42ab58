"""The env wrapper: device-resident arrays, reset, step and auto-reset.

An environment subclasses `Env` and declares (see envs/tag_continuous/env.py):
- `name`, `config_class` (a config dataclass with a `load` classmethod);
- `setup(config)`: sets `num_agents`, `obs_dim`, `action_nvec` (discrete
  actions) or `action_box` (continuous ones, a `gpusim.spaces.Box`),
  `policies` (name -> agent ids), optionally `policy_obs_dim` and
  `policy_actions` for policies that observe or act differently (see
  gpusim.spaces), `time_limit` when episodes are truncated only on
  reaching that many steps (trainers then bootstrap truncations in batches
  instead of every step), and `agent_names` when its agents have names of
  their own (one per agent in agent-id order; `spaces.per_role_names`);
- `array_specs()`: its named arrays (state and scratch);
- the scalar parameters its phases read (`p`): every int, float and bool field of its
  config under its own name (`float_type` says the floats' dtype), and what `derived()`
  computes from them;
- `initial_values()`: constant tables and other arrays to fill once;
- `reset_phases` and `step_phases`: portable phases (see gpusim.kernels);
  optionally `observe_phases`, those that write the observation from the
  state arrays alone (`observe()`, e.g. after `set_state`).
Step phases read `actions` (int32) or `continuous_actions` (float32, already
clipped to the bounds) and write `obs`, `reward`, `terminated` and
`truncated`; reset phases draw one replica's initial state from its RNG
streams and write `obs`. An env whose agents can finish before their replica
does (per-agent done) names, in `agent_active_array`, an agent-scope state
array that its phases keep nonzero while the agent is in its episode.

The wrapper adds the arrays every env has, compiles one reset kernel and one
step kernel (step phases, then a guarded section that saves `final_obs` and
runs the reset phases in replicas that just finished), and launches them on
the backend with no host round trip.

Here: what an env declares, building it, and the API (spaces, reset, step,
observe, state). How it is built from its declaration (config and setup
checks, kernel and array specs) is in gpusim.env_build; how `step`'s actions
are written and checked, in gpusim.env_actions.
"""
from __future__ import annotations

import numpy as np
import torch

from gpusim import masks, rng, spaces
from gpusim.arrays import DeviceArrays, namedtuple_type
from gpusim.config import scalar_params
from gpusim.backends import Backend, get_backend
from gpusim.env_actions import ActionWriter, with_data
# the phases gpusim's step kernel adds, importable from here (docs/custom_env.md)
from gpusim.env_build import (EnvBuild, clip_continuous_actions, replica_done,  # noqa: F401
                              save_final_active, save_final_obs, save_final_state)
from gpusim.errors import ArrayError, ConfigError, GpusimError, debug, phase_failed


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


class Env(EnvBuild, ActionWriter):
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
    action_nvec: tuple = ()  # discrete actions: choices per component
    action_box: spaces.Box | None = None  # or continuous ones
    policies: dict
    policy_obs_dim: dict | None = None  # policies that observe fewer entries (gpusim.spaces)
    policy_actions: dict | None = None  # policies that act differently
    agent_active_array: str | None = None  # per-agent done: nonzero while the agent plays
    # action masks: an agent-scope array, (sum of the choices of the agent's discrete
    # components) wide, nonzero where a choice is legal now; the env's phases keep it
    # current (written with the observation, for the next step)
    action_mask_array: str | None = None
    # the replica's global state for a centralized critic (policy.critic: central): with
    # `state_dim` set in setup, gpusim adds an env-scope float32 array `state` of that
    # width that the env's phases write with the observation (and keeps `final_state` as
    # it keeps `final_obs`); without it, every agent's observation in agent order
    state_dim: int | None = None
    # the agents' names, one per agent in agent-id order (gpusim.spaces.per_role_names makes
    # "tagger_0", "runner_0", ...); None: f"{policy}_{agent_id}". Resolved in __init__.
    agent_names: tuple | None = None
    # True: the step kernel leaves continuous actions as given and the env's phases clip
    # them (an env whose reward charges the raw action, as MountainCarContinuous does)
    raw_continuous_actions: bool = False
    time_limit: int | None = None  # None: an episode may be truncated at any step
    # phases that write the observation (and what is written with it: an action mask, the
    # global state) from the state arrays alone: `observe()` runs them. Without them the
    # observation changes only in reset() and step().
    observe_phases: tuple = ()
    nonnegative_state: tuple = ("timestep",)  # state arrays set_state refuses below 0
    render_arrays: tuple = ()  # the arrays a rendered frame needs (gpusim.render); see draw
    # what a user watches rise while training (gpusim.score.Score, measured against
    # random opponents beside training); None: the training return is the score
    score = None
    # who won an episode, in the game's own terms (gpusim.outcome.Outcome: a league's
    # win statistics and python -m gpusim.league's ratings); None: relative to returns
    outcome = None

    def __init__(self, num_envs: int, backend: str | Backend = "auto", seed: int = 0,
                 config=None, check_actions: bool | None = None, env_offset: int = 0):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self._declare(config)
        discrete = {p.actions for p in self.policy_specs.values() if not p.continuous}
        # the action set every discrete policy shares; () if none, or if they differ
        self.action_nvec = next(iter(discrete)) if len(discrete) == 1 else ()
        self.discrete_width = max((len(nvec) for nvec in discrete), default=0)
        self.continuous_dim = max((p.action_width for p in self.policy_specs.values()
                                   if p.continuous), default=0)
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
        # gpusim's own phases read the env's activity array as `agent_active`
        aliases = {"agent_active": self.agent_active_array} if self.agent_active_array else {}
        self.arrays = DeviceArrays(specs, num_envs, self.num_agents, self.backend, aliases)
        for name, value in {**self._action_bounds(), **self.initial_values()}.items():
            self.arrays.write(name, value)
        self.arrays["rng_state"].copy_(rng.seed_streams(num_envs, self.num_agents, self.seed,
                                                         self.env_offset))
        params = self.params()
        self._params = namedtuple_type("Params", tuple(params))(**params)
        self._nvec = torch.tensor(self.action_nvec, dtype=torch.int32, device=self.device)
        self._policy_index = {name: spaces.agent_index(p.agent_ids, self.device)
                              for name, p in self.policy_specs.items()}
        self._policy_nvec = {name: torch.tensor(p.actions, dtype=torch.int32, device=self.device)
                             for name, p in self.policy_specs.items() if not p.continuous}
        views = self.arrays.views
        self._reset_kernel = self.backend.compile(self.reset_kernel_spec(), views, self._params)
        self._step_kernel = self.backend.compile(self.step_kernel_spec(), views, self._params)

    @classmethod
    def declared(cls, config=None) -> "Env":
        """What the env declares, without building it: an instance that has run `setup`
        only (its config, `policy_specs`, `agent_names`, `observation_space` and
        `action_space`), with no arrays, kernels or backend: what a trained policy needs
        to act elsewhere (gpusim.load_policies). It cannot be stepped."""
        env = cls.__new__(cls)
        env._declare(config)
        return env

    # ---- what a subclass provides --------------------------------------------
    def setup(self, config):
        raise NotImplementedError

    def array_specs(self) -> dict:
        raise NotImplementedError

    float_type = np.float32  # the dtype of the config's float fields in `params()`
    episode_ends = ("termination", "truncation")  # how its episodes end (check_env checks)

    def params(self) -> dict:
        """The kernels' scalar parameters (`p` in a phase): the config's int, float and bool
        fields by their own names (int32, `float_type`, bool), then `derived()`'s values."""
        return {**scalar_params(self.config, self.float_type), **self.derived()}

    def derived(self) -> dict:
        """Parameters computed from the config's fields (numpy scalars), beside them."""
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

    # ---- the API ---------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def observation_space(self) -> dict:
        """Per policy, the gymnasium space of one agent's observation (float32 Box)."""
        gym = _gymnasium_spaces()
        return {name: gym.Box(-np.inf, np.inf, (p.obs_dim,), np.float32)
                for name, p in self.policy_specs.items()}

    @property
    def action_space(self) -> dict:
        """Per policy, the gymnasium space of one agent's action (MultiDiscrete or Box)."""
        gym = _gymnasium_spaces()
        return {name: gym.Box(np.float32(p.actions.low), np.float32(p.actions.high),
                              dtype=np.float32) if p.continuous
                else gym.MultiDiscrete(np.asarray(p.actions, dtype=np.int64))
                for name, p in self.policy_specs.items()}

    @property
    def mixed_actions(self) -> bool:
        """Whether one tensor cannot hold every agent's actions: some policies act
        discretely and others continuously, or discrete policies have different sets."""
        return bool(self.discrete_width) and (bool(self.continuous_dim) or not self.action_nvec)

    def agent_active(self) -> torch.Tensor | None:
        """(num_envs, num_agents) bool: which agents are still in their episode, or None
        when the env has no per-agent done (every agent plays until its replica ends)."""
        if self.agent_active_array is None:
            return None
        return self.arrays[self.agent_active_array] != 0

    def final_active(self) -> torch.Tensor | None:
        """(num_envs, num_agents) bool: in the replicas that just finished
        (info["reset_mask"]), which agents were still in play when they ended; None
        without per-agent done."""
        if self.agent_active_array is None:
            return None
        return self.arrays["final_active"] != 0

    def action_mask(self) -> torch.Tensor | None:
        """(num_envs, num_agents, width) bool: which discrete choices are legal now (each
        agent's components side by side), or None when the env declares no mask."""
        if self.action_mask_array is None:
            return None
        return self.arrays[self.action_mask_array] != 0

    def global_state(self, final: bool = False) -> torch.Tensor:
        """(num_envs, state size) float32, a centralized critic's input: the env's `state`
        array, or every agent's observation in agent order; `final`: the state in which
        the replicas that just finished ended (final_state, final_obs)."""
        if self.state_dim:
            return self.arrays["final_state" if final else "state"]
        obs = self.arrays["final_obs" if final else "obs"]
        return obs.reshape(obs.shape[0], -1)

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
        self._launch(self._reset_kernel, self.reset_kernel_spec)
        if self.action_mask_array is not None:  # one host read per reset, never per step
            masks.check(self, "after reset (step 0)")
        return self.arrays["obs"]

    def observe(self) -> torch.Tensor:
        """Recompute the observation from the state arrays (the env's `observe_phases`, a
        kernel compiled on first use) and return `obs`: after `set_state`, or after writing
        state arrays directly. A replica's RNG streams and state are left as they were."""
        if not self.observe_phases:
            raise GpusimError(f"env {self.name} declares no observe_phases: its observation "
                              "is written by reset() and step() only")
        spec = self.observe_kernel_spec()
        self._launch(self.backend.compile(spec, self.arrays.views, self._params), lambda: spec)
        return self.arrays["obs"]

    def step(self, actions=None):
        """Advance every replica one step; finished replicas are reset automatically.

        `actions`: a tensor (num_envs, num_agents, width) of every agent's
        actions, integers for discrete envs and floats for continuous ones;
        or a dict policy name -> (num_envs, that policy's agents, its width),
        in the order of its `agent_ids` (needed when policies act differently);
        or None: the actions were already written into `arrays["actions"]` /
        `arrays["continuous_actions"]` (as gpusim's actors and a sampler made with
        `into_env=True` do), and are used as they are.

        Returns (obs, reward, terminated, truncated, info), all tensors on
        `env.device`. They are the env's own buffers, overwritten by the next
        step: clone what you keep. `info["final_obs"][e]` holds the last
        observation of replica e where `info["reset_mask"][e]` is true.
        """
        if actions is not None:
            self._write_actions(actions)
        self._launch(self._step_kernel, self.step_kernel_spec)
        a = self.arrays
        torch.logical_or(a["terminated"], a["truncated"], out=a["reset_mask"])
        info = {"final_obs": a["final_obs"], "reset_mask": a["reset_mask"]}
        return a["obs"], a["reward"], a["terminated"], a["truncated"], info

    def get_state(self, include_rng: bool = False) -> dict:
        """Copies of the state arrays (and the RNG streams if asked)."""
        names = self.arrays.state_names() + (("rng_state",) if include_rng else ())
        return {name: self.arrays[name].clone() for name in names}

    def set_state(self, state: dict):
        """Inject state arrays (any subset of `get_state()`'s keys), checked by name.

        The observation is left as it was (a resumed run restores its own): `observe()`
        recomputes it from the injected state, else the next step does."""
        if not isinstance(state, dict):
            raise ArrayError(f"set_state takes a dict of state arrays (as get_state() returns), "
                             f"got {type(state).__name__}")
        allowed = set(self.arrays.state_names()) | {"rng_state"}
        for name in state:
            if name not in allowed:
                raise ArrayError(f"'{name}' is not a state array of {self.name} "
                                 f"(state arrays: {', '.join(sorted(allowed))})")
        values = {name: self.arrays.checked(name, with_data(value, f"state[{name!r}]"))
                  for name, value in state.items()}
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
    def _launch(self, kernel, spec):
        """Run `kernel`; an exception a phase raises (numba: a SystemError caused by it) is
        one line naming the env and the phase. `spec` makes the KernelSpec, only then."""
        try:
            kernel(self.num_envs, self.num_agents, self.arrays.views, self._params)
        except SystemError as exc:
            if debug():
                raise
            raise phase_failed(self.name, spec(), exc) from None

    def __repr__(self):
        if not hasattr(self, "arrays"):  # Env.declared(): setup only
            return f"<{type(self).__name__} declared, num_agents={self.num_agents}>"
        return (f"<{type(self).__name__} num_envs={self.num_envs} num_agents={self.num_agents} "
                f"backend={self.backend.name} device={self.device}>")
