"""simple_reference's oracle is mpe2's own simple_reference_v3, stepped from gpusim's
states; each agent's goal (the other agent and its goal landmark) is injected too."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleReference


def inject_goals(world, state, e):
    first, second = world.agents
    first.goal_a, second.goal_a = second, first
    for i, agent in enumerate(world.agents):
        agent.goal_b = world.landmarks[int(state["goal"][e, i])]


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleReference, config, inject=inject_goals)
