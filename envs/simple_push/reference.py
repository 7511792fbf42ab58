"""simple_push's oracle is mpe2's own simple_push_v3, stepped from gpusim's states; the
goal landmark and the good agent's colour that follows from it are injected too."""
import numpy as np

from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimplePush


def inject_goal(world, state, e):
    goal = world.landmarks[int(state["goal"][e])]
    for agent in world.agents:
        agent.goal_a = goal
    good = world.agents[1]
    good.color = np.array([0.25, 0.25, 0.25])
    good.color[goal.index + 1] += 0.5  # as mpe2's reset_world colours it


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimplePush, config, inject=inject_goal)
