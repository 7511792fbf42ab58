"""simple as portable phases over the particle base: one agent, one landmark, no contact.
Rules: README.md in this folder."""
from gpusim.kernels import agent_phase, env_phase

from .._mpe.compile import jit
from .._mpe.observe import put_landmarks, put_velocity
from .._mpe.physics import tick
from .._mpe.world import MOVE, SPAWN, Landmarks, ParticleEnv, Role
from .config import SimpleConfig


@jit
def score(env, agent, s, p):
    """Minus the squared distance to the landmark."""
    dx = s.pos[env, agent, 0] - s.landmark_pos[env, 0, 0]
    dy = s.pos[env, agent, 1] - s.landmark_pos[env, 0, 1]
    s.reward[env, agent] = -(dx * dx + dy * dy)


@jit
def observe(env, agent, s, p):
    """[self_vel, landmark_rel_position]."""
    k = put_velocity(s, env, agent, 0, agent)
    put_landmarks(s, env, agent, k, 0, 1)


class Simple(ParticleEnv):
    name = "simple"
    config_class = SimpleConfig
    mpe2_module = "simple_v3"
    reset_phases = (*SPAWN, agent_phase(observe))
    step_phases = (*MOVE, env_phase(tick), agent_phase(score), agent_phase(observe))
    observe_phases = (agent_phase(observe),)

    @classmethod
    def roles(cls, config):
        return (Role("agent", 1, obs_dim=4, collide=False),)

    @classmethod
    def landmark_groups(cls, config):
        return (Landmarks(1, collide=False, color=(0.75, 0.25, 0.25)),)
