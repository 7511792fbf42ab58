"""Two small envs that test what a learner can do, each with a known best policy.

`Recall` (memory): one agent sees a cue (0 or 1) at the first step only, then
zeros and a clock; at the last step (`episode_length` - 1) it is paid +1 for
naming the cue and -1 otherwise (0 before). A feed-forward policy cannot beat
a mean return of 0 (chance); a recurrent one can reach 1.

`Legal` (action masks): one agent picks one of `num_choices` each step; a
random half of them (at least one, always including the target) are legal,
and the observation shows the target and the legal set. The target pays +1;
another legal choice 0; an illegal one -`penalty` and ends the episode. With
`masked` the env declares the legal set as its action mask (the sampler then
never draws an illegal choice); without, the policy must learn to avoid them.
"""
import numba
import numpy as np
import torch
from dataclasses import dataclass

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.config import EnvConfig, require
from gpusim.env import Env
from gpusim.kernels import agent_phase, env_phase


@dataclass(frozen=True)
class RecallConfig(EnvConfig):
    episode_length: int = 4   # steps; the cue shows at the first, the answer counts at the last

    def check(self):
        require(self.episode_length >= 2, "episode_length", "must be at least 2")


@numba.jit(nopython=True)
def recall_spawn(env, agent, s, p):
    s.cue[env, agent] = 1 if rng.uniform(s.rng_state, env, agent) < 0.5 else 0
    s.timestep[env] = 0


@numba.jit(nopython=True)
def recall_observe(env, agent, s, p):
    first = s.timestep[env] == 0
    s.obs[env, agent, 0] = numba.float32(1.0) if first and s.cue[env, agent] == 0 else 0.0
    s.obs[env, agent, 1] = numba.float32(1.0) if first and s.cue[env, agent] == 1 else 0.0
    s.obs[env, agent, 2] = numba.float32(s.timestep[env]) / p.episode_length


@numba.jit(nopython=True)
def recall_answer(env, agent, s, p):
    reward = numba.float32(0.0)
    if s.timestep[env] == p.episode_length - 1:
        reward = numba.float32(1.0) if s.actions[env, agent, 0] == s.cue[env, agent] \
            else numba.float32(-1.0)
    s.reward[env, agent] = reward


@numba.jit(nopython=True)
def recall_tick(env, s, p):
    s.timestep[env] += 1
    s.terminated[env] = s.timestep[env] >= p.episode_length
    s.truncated[env] = False


class Recall(Env):
    name = "recall"
    config_class = RecallConfig
    reset_phases = (agent_phase(recall_spawn), agent_phase(recall_observe))
    step_phases = (agent_phase(recall_answer), env_phase(recall_tick),
                   agent_phase(recall_observe))

    def setup(self, config):
        self.num_agents = 1
        self.obs_dim = 3
        self.action_nvec = (2,)
        self.policies = {"agent": (0,)}

    def array_specs(self):
        return {"cue": ArraySpec(torch.int32, state=True),
                "timestep": ArraySpec(torch.int32, scope="env", state=True)}

    def params(self):
        return dict(episode_length=np.int32(self.config.episode_length))


@dataclass(frozen=True)
class LegalConfig(EnvConfig):
    num_choices: int = 8      # actions; about half are legal at each step
    episode_length: int = 16  # steps before truncation
    penalty: float = 5.0      # paid for an illegal choice, which ends the episode
    masked: bool = True       # declare the legal set as the action mask

    def check(self):
        require(2 <= self.num_choices <= 32, "num_choices", "must lie in 2..32")
        require(self.episode_length >= 1, "episode_length", "must be at least 1")


@numba.jit(nopython=True)
def legal_draw(env, agent, s, p):
    """A new target and legal set: each choice legal with probability 1/2, the target too."""
    n = s.legal.shape[2]
    target = min(int(rng.uniform(s.rng_state, env, agent) * n), n - 1)
    s.target[env, agent] = target
    for k in range(n):
        s.legal[env, agent, k] = 1 if k == target or rng.uniform(s.rng_state, env, agent) < 0.5 \
            else 0
    for k in range(n):
        s.obs[env, agent, k] = numba.float32(1.0) if k == target else numba.float32(0.0)
        s.obs[env, agent, n + k] = numba.float32(s.legal[env, agent, k])


@numba.jit(nopython=True)
def legal_start(env, s, p):
    s.timestep[env] = 0


@numba.jit(nopython=True)
def legal_choose(env, agent, s, p):
    choice = s.actions[env, agent, 0]
    if s.legal[env, agent, choice] == 0:
        s.reward[env, agent] = -p.penalty
        s.terminated[env] = True
    else:
        s.reward[env, agent] = numba.float32(1.0) if choice == s.target[env, agent] \
            else numba.float32(0.0)
        s.terminated[env] = False


@numba.jit(nopython=True)
def legal_tick(env, s, p):
    s.timestep[env] += 1
    s.truncated[env] = (not s.terminated[env]) and s.timestep[env] >= p.episode_length


class Legal(Env):
    name = "legal"
    config_class = LegalConfig
    reset_phases = (env_phase(legal_start), agent_phase(legal_draw))
    step_phases = (agent_phase(legal_choose), env_phase(legal_tick), agent_phase(legal_draw))

    def setup(self, config):
        self.num_agents = 1
        self.obs_dim = 2 * config.num_choices
        self.action_nvec = (config.num_choices,)
        self.policies = {"agent": (0,)}
        self.time_limit = config.episode_length
        self.action_mask_array = "legal" if config.masked else None

    def array_specs(self):
        return {"legal": ArraySpec(torch.int32, (self.config.num_choices,), state=True),
                "target": ArraySpec(torch.int32, state=True),
                "timestep": ArraySpec(torch.int32, scope="env", state=True)}

    def params(self):
        return dict(penalty=np.float32(self.config.penalty),
                    episode_length=np.int32(self.config.episode_length))
