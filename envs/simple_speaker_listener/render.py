"""A frame of simple_speaker_listener: the speaker's word, and the listener in the goal's
colour lightened, as mpe2 draws it."""
import numpy as np

from .._mpe.render import draw as draw_world
from .env import LANDMARK_COLORS, LISTENER

LISTENER_TINT = 0.45  # mpe2: the goal's colour + 0.45


def draw(ax, frame, env):
    agent_colors = env.per_agent("color")
    agent_colors[LISTENER] = np.array(LANDMARK_COLORS[int(frame["goal"])]) + LISTENER_TINT
    draw_world(ax, frame, env, agent_colors=agent_colors)
