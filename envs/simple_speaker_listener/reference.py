"""simple_speaker_listener's oracle is mpe2's own simple_speaker_listener_v4, stepped from
gpusim's states; the speaker's goal landmark is injected too."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleSpeakerListener


def inject_goal(world, state, e):
    world.agents[0].goal_b = world.landmarks[int(state["goal"][e])]


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleSpeakerListener, config, inject=inject_goal)
