"""simple_crypto's oracle is mpe2's own simple_crypto_v3, stepped from gpusim's states; the
message (goal landmark) and the key are injected too."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleCrypto


def inject_secrets(world, state, e):
    goal = world.landmarks[int(state["goal"][e])]
    for agent in world.agents:
        agent.goal_a = goal
    world.agents[2].key = world.landmarks[int(state["key"][e])].color


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleCrypto, config, inject=inject_secrets)
