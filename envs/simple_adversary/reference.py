"""simple_adversary's oracle is mpe2's own simple_adversary_v3, stepped from gpusim's
states; the goal landmark is injected too."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleAdversary


def inject_goal(world, state, e):
    goal = world.landmarks[int(state["goal"][e])]
    for agent in world.agents:
        agent.goal_a = goal


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleAdversary, config, inject=inject_goal)
