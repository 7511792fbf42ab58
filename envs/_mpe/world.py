"""`ParticleEnv`: the base class of the MPE scenarios, mpe2's `World` + `SimpleEnv`.

A scenario says which agents it has (`roles`: a `Role` per kind of agent, in
mpe2's agent order), which landmarks (`landmark_groups`), its channel width
`dim_c`, its own arrays, parameters and tables, and its phases; the base
class derives everything mpe2 derives from the same facts:

- agent ids in mpe2's order, names `f"{role}_{k}"` numbered within the role
  (`agent_names`), one policy per role;
- each role's action space, as mpe2's SimpleEnv builds it: discrete
  `Discrete((5 if movable else 1) * (dim_c if it speaks else 1))`, continuous
  `Box(0, 1, (5 if movable else 0) + (dim_c if it speaks else 0))`;
- each role's observation size (`policy_obs_dim`; the obs array is as wide as
  the widest, the rest of a narrower row is zeros);
- the physics arrays and tables (see `physics`), and the swap of the
  discrete action phase for the continuous one.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.env import Env
from gpusim.errors import ArrayError
from gpusim.kernels import KernelSpec, agent_phase, env_phase
from gpusim.spaces import Box

from .physics import (AGENT_BODY, AGENT_FLAGS, LANDMARK_BODY, MOVES, continuous_forces,
                      discrete_forces, integrate, spawn, start_clock)

# mpe2's World defaults (core.py)
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3
CONTACT_REACH = 40 * CONTACT_MARGIN  # beyond it the softplus contact force is below 1e-16
SENSITIVITY = 5.0  # SimpleEnv's action scale for an agent whose accel is None

# What every scenario's reset starts with, and its step: a scenario adds its clock
# (physics.tick, or its own when episodes may end early), rewards and observation.
SPAWN = (agent_phase(spawn), env_phase(start_clock))
MOVE = (agent_phase(discrete_forces), agent_phase(integrate))


@dataclass(frozen=True)
class Role:
    """One kind of agent, as mpe2's make_world sets it up (its Entity/Agent defaults)."""
    name: str                       # policy name and prefix of the agents' names
    count: int
    obs_dim: int
    size: float = 0.05
    accel: float = SENSITIVITY
    max_speed: float = math.inf     # mpe2's None
    mass: float = 1.0               # mpe2's initial_mass (no scenario changes it)
    movable: bool = True
    silent: bool = True
    collide: bool = True
    color: tuple = (0.25, 0.25, 0.25)  # mpe2's colour, for drawing

    def action_space(self, dim_c: int, continuous: bool):
        speaks = not self.silent
        if continuous:
            width = (MOVES if self.movable else 0) + (dim_c if speaks else 0)
            return Box(low=(0.0,) * width, high=(1.0,) * width)
        return ((MOVES if self.movable else 1) * (dim_c if speaks else 1),)


@dataclass(frozen=True)
class Landmarks:
    """A group of landmarks (immovable), placed uniformly in [-spawn, spawn)^2 at reset."""
    count: int
    size: float = 0.05
    collide: bool = True
    spawn: float = 1.0
    color: tuple = (0.25, 0.25, 0.25)


def neighbor_arrays(config) -> dict:
    """The scratch rows of `observe.nearest`, for a scenario with mpe2's partial observation
    (config keys num_agent_neighbors, num_landmark_neighbors)."""
    width = max(config.num_agent_neighbors or 1, config.num_landmark_neighbors or 1)
    return {"near": ArraySpec(torch.int32, (width,)),
            "near_dist": ArraySpec(torch.float32, (width,))}


def neighbor_params(config) -> dict:
    """How many agents and landmarks an observation holds at most (0: all of them)."""
    return dict(agent_neighbors=np.int32(config.num_agent_neighbors or 0),
                landmark_neighbors=np.int32(config.num_landmark_neighbors or 0))


def replace_phase(spec: KernelSpec, old, new) -> KernelSpec:
    """`spec` with phase function `old` replaced by `new` wherever it occurs."""
    sections = tuple(dataclasses.replace(section, phases=tuple(
        dataclasses.replace(phase, fn=new) if phase.fn is old else phase
        for phase in section.phases)) for section in spec.sections)
    return dataclasses.replace(spec, sections=sections)


class ParticleEnv(Env):
    dim_c = 0             # mpe2's world.dim_c: the width of an utterance
    mpe2_module = ""      # the mpe2 module of this scenario, e.g. "simple_tag_v3"
    render_arrays = ("pos", "landmark_pos", "comm")

    # ---- what a scenario provides ------------------------------------------------------
    @classmethod
    def roles(cls, config) -> tuple:
        """The agents, role by role in mpe2's order (`Role`s)."""
        raise NotImplementedError

    @classmethod
    def landmark_groups(cls, config) -> tuple:
        """The landmarks, group by group in mpe2's order (`Landmarks`)."""
        return ()

    def scenario_arrays(self) -> dict:
        return {}

    def scenario_params(self) -> dict:
        return {}

    def scenario_initial_values(self) -> dict:
        return {}

    def index_ranges(self) -> dict:
        """State arrays of indices (goals) -> how many values they take, for set_state."""
        return {}

    # ---- Env -----------------------------------------------------------------------------
    def setup(self, config):
        roles = self.roles(config)
        self.num_agents = sum(r.count for r in roles)
        self.num_landmarks = sum(g.count for g in self.landmark_groups(config))
        self.agent_names = tuple(f"{r.name}_{k}" for r in roles for k in range(r.count))
        self.policies, first = {}, 0
        for r in roles:
            self.policies[r.name] = tuple(range(first, first + r.count))
            first += r.count
        self.obs_dim = max(r.obs_dim for r in roles)
        self.policy_obs_dim = {r.name: r.obs_dim for r in roles}
        spaces = {r.name: r.action_space(self.dim_c, config.continuous_actions) for r in roles}
        if len(set(spaces.values())) > 1:
            self.policy_actions = spaces
        elif config.continuous_actions:
            self.action_box = next(iter(spaces.values()))
        else:
            self.action_nvec = next(iter(spaces.values()))
        self.time_limit = config.max_cycles

    def per_agent(self, field: str) -> np.ndarray:
        """A Role field, one row per agent id."""
        return _rows(self.roles(self.config), field)

    def per_landmark(self, field: str) -> np.ndarray:
        """A Landmarks field, one row per landmark."""
        return _rows(self.landmark_groups(self.config), field)

    def array_specs(self):
        f32, i32 = torch.float32, torch.int32
        n, landmarks = self.num_agents, self.num_landmarks
        specs = {
            "pos": ArraySpec(f32, (2,), state=True),
            "vel": ArraySpec(f32, (2,), state=True),
            "landmark_pos": ArraySpec(f32, (landmarks, 2), scope="env", state=True),
            "timestep": ArraySpec(i32, scope="env", state=True),
            "force": ArraySpec(f32, (2,)),
            "comm": ArraySpec(f32, (max(self.dim_c, 1),)),
        }
        specs["agent_body"] = ArraySpec(f32, (n, len(AGENT_BODY)), scope="global")
        specs["agent_flags"] = ArraySpec(i32, (n, len(AGENT_FLAGS)), scope="global")
        specs["landmark_body"] = ArraySpec(f32, (landmarks, len(LANDMARK_BODY)), scope="global")
        specs.update(self.scenario_arrays())
        return specs

    def initial_values(self):
        def table(rows, fields, dtype):
            return np.stack([rows(f) for f in fields], axis=-1).astype(dtype).reshape(-1, len(fields))
        values = {"agent_body": table(self.per_agent, AGENT_BODY, np.float32),
                  "agent_flags": table(self.per_agent, AGENT_FLAGS, np.int32),
                  "landmark_body": table(self.per_landmark, LANDMARK_BODY, np.float32)}
        values.update(self.scenario_initial_values())
        return values

    def derived(self):
        """The physics' constants, the communication width, and the scenario's own."""
        f32 = np.float32
        base = dict(dt=f32(DT), keep_velocity=f32(1 - DAMPING), contact_force=f32(CONTACT_FORCE),
                    contact_margin=f32(CONTACT_MARGIN), contact_reach=f32(CONTACT_REACH),
                    dim_c=np.int32(self.dim_c))
        return {**base, **self.scenario_params()}

    def step_kernel_spec(self) -> KernelSpec:
        """The class's phases; in continuous mode, the continuous action phase in place of
        the discrete one (numba compiles for the arrays that exist, and only one of
        `actions` and `continuous_actions` does)."""
        spec = super().step_kernel_spec()
        if self.config.continuous_actions:
            spec = replace_phase(spec, discrete_forces, continuous_forces)
        return spec

    def check_state(self, state):
        for name, count in self.index_ranges().items():
            if name in state:
                value = state[name]
                if bool(((value < 0) | (value >= count)).any()):
                    raise ArrayError(f"set_state: {name} must lie in 0..{count - 1}")

    def draw(self, ax, frame):
        """The scenario's own render.py (beside its env.py) draws the frame."""
        package = type(self).__module__.rpartition(".")[0]
        importlib.import_module(f"{package}.render").draw(ax, frame, self)


def _rows(groups, field: str) -> np.ndarray:
    return np.array([getattr(g, field) for g in groups for _ in range(g.count)], dtype=float)
