"""Custom envs with one mistake each, for tests/training/test_bad_inputs.py (`--env bad_envs:Name`).

`Good` is a tiny correct env (agents count up to 5, then the replica is
truncated); every other class changes one thing. All share `Good`'s phases
where they can, so few kernels compile.
"""
from dataclasses import dataclass

import numba
import numpy as np
import torch

from gpusim.arrays import ArraySpec
from gpusim.config import EnvConfig
from gpusim.env import Env
from gpusim.kernels import agent_phase, env_phase


@dataclass(frozen=True)
class GoodConfig(EnvConfig):
    num_agents: int = 2


@numba.jit(nopython=True)
def spawn(env, agent, s, p):
    s.x[env, agent] = 0.0
    s.obs[env, agent, 0] = 0.0


@numba.jit(nopython=True)
def count(env, agent, s, p):
    s.x[env, agent] += 1.0
    s.obs[env, agent, 0] = s.x[env, agent]
    s.reward[env, agent] = 0.0


@numba.jit(nopython=True)
def end(env, s, p):
    s.terminated[env] = False
    s.truncated[env] = s.x[env, 0] >= 5


@numba.jit(nopython=True)
def count_and_raise(env, agent, s, p):
    s.x[env, agent] += 1.0
    if s.x[env, agent] > 2:
        raise ValueError("x ran past 2")


@numba.jit(nopython=True)
def read_a_missing_array(env, agent, s, p):
    s.x[env, agent] = s.speed[env, agent]


class Good(Env):
    name = "good"
    config_class = GoodConfig
    reset_phases = (agent_phase(spawn),)
    step_phases = (agent_phase(count), env_phase(end))

    def setup(self, config):
        self.num_agents = config.num_agents
        self.obs_dim = 1
        self.action_nvec = (2,)
        self.policies = {"agent": tuple(range(config.num_agents))}

    def array_specs(self):
        return {"x": ArraySpec(torch.float32, state=True)}


class NoConfigClass(Good):
    config_class = None


class NoObsDim(Good):
    def setup(self, config):
        super().setup(config)
        del self.obs_dim


class SetupRaises(Good):
    def setup(self, config):
        raise KeyError("speed")


class PhaseRaises(Good):
    step_phases = (agent_phase(count_and_raise), env_phase(end))


class TypingError(Good):
    step_phases = (agent_phase(read_a_missing_array), env_phase(end))


@numba.jit(nopython=True)
def read_a_missing_parameter(env, agent, s, p):
    s.x[env, agent] = p.speed


class UnknownParameter(Good):
    step_phases = (agent_phase(read_a_missing_parameter), env_phase(end))


class AgentInNoPolicy(Good):
    def setup(self, config):
        super().setup(config)
        self.policies = {"agent": (0,)}


class AgentInTwoPolicies(Good):
    def setup(self, config):
        super().setup(config)
        self.policies = {"agent": (0, 1), "other": (1,)}


class RepeatedNames(Good):
    def setup(self, config):
        super().setup(config)
        self.agent_names = ("player", "player")


@numba.jit(nopython=True)
def mask_all_but_the_last_agent(env, agent, s, p):
    """Agent 0 keeps both choices legal; the last agent, none once x reaches `dead_from`."""
    dead = agent == s.legal.shape[1] - 1 and s.x[env, agent] >= p.dead_from
    s.legal[env, agent, 0] = 0 if dead else 1
    s.legal[env, agent, 1] = 0 if dead else 1


class DeadMask(Good):
    """An action mask that leaves the last agent no legal choice from the start."""
    name = "dead_mask"
    reset_phases = (agent_phase(spawn), agent_phase(mask_all_but_the_last_agent))
    step_phases = (agent_phase(count), agent_phase(mask_all_but_the_last_agent),
                   env_phase(end))
    dead_from = 0.0

    def setup(self, config):
        super().setup(config)
        self.action_mask_array = "legal"

    def array_specs(self):
        return {**super().array_specs(), "legal": ArraySpec(torch.int32, (2,))}

    def params(self):
        return {"dead_from": np.float32(self.dead_from)}


class MaskDiesLater(DeadMask):
    """The same mistake, from the third step on (after reset the mask is fine)."""
    dead_from = 3.0
