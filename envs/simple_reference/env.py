"""simple_reference as portable phases over the particle base. Rules: README.md here.

Each agent has its own goal landmark (`goal`, agent scope) that only it
sees, by colour; it is rewarded for the *other* agent reaching it, so each
must tell the other where to go (10-word channel). Each agent writes its own
reward term, then both read both for the shared mean.
"""
import numpy as np
import torch

from gpusim import rng
from gpusim.arrays import ArraySpec
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.observe import put_comm, put_landmark_color, put_landmarks, put_velocity
from .._mpe.physics import landmark_distance, tick
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimpleReferenceConfig

LANDMARK_COLORS = ((0.75, 0.25, 0.25), (0.25, 0.75, 0.25), (0.25, 0.25, 0.75))


@jit
def choose_goal(env, agent, s, p):
    s.goal[env, agent] = rng.randint(s.rng_state, env, agent, s.landmark_pos.shape[1])


@jit
def judge(env, agent, s, p):
    """Minus the other agent's distance to this agent's goal landmark."""
    s.own_reward[env, agent] = -landmark_distance(s, env, 1 - agent, s.goal[env, agent])


@jit
def score(env, agent, s, p):
    """The mean of both agents' own rewards * (1 - local_ratio) + own * local_ratio."""
    shared = (s.own_reward[env, 0] + s.own_reward[env, 1]) / np.float32(2.0)
    s.reward[env, agent] = shared * p.global_ratio + s.own_reward[env, agent] * p.local_ratio


@jit
def observe(env, agent, s, p):
    """[self_vel, landmark_rel_positions, own goal's colour, the other's utterance]."""
    k = put_velocity(s, env, agent, 0, agent)
    k = put_landmarks(s, env, agent, k, 0, s.landmark_pos.shape[1])
    k = put_landmark_color(s, env, agent, k, s.goal[env, agent])
    put_comm(s, env, agent, k, 1 - agent, p.dim_c)


class SimpleReference(ParticleEnv):
    name = "simple_reference"
    config_class = SimpleReferenceConfig
    mpe2_module = "simple_reference_v3"
    dim_c = 10
    reset_phases = (*SPAWN, agent_phase(choose_goal), agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(judge), agent_phase(score),
                   agent_phase(observe))
    observe_phases = (agent_phase(observe),)
    render_arrays = ParticleEnv.render_arrays + ("goal",)

    @classmethod
    def roles(cls, config):
        return (Role("agent", 2, 21, silent=False, collide=False),)

    @classmethod
    def landmark_groups(cls, config):
        return tuple(Landmarks(1, collide=False, color=c) for c in LANDMARK_COLORS)

    def scenario_arrays(self):
        return {"goal": ArraySpec(torch.int32, state=True),
                "own_reward": ArraySpec(torch.float32),
                "landmark_color": ArraySpec(torch.float32, (len(LANDMARK_COLORS), 3),
                                            scope="global")}

    def scenario_initial_values(self):
        return {"landmark_color": np.array(LANDMARK_COLORS, np.float32)}

    def scenario_params(self):
        c, f32 = self.config, np.float32
        return dict(global_ratio=f32(1 - c.local_ratio))

    def index_ranges(self):
        return {"goal": len(LANDMARK_COLORS)}
