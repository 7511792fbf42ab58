"""A frame of simple_reference: each agent in the colour of the landmark the other must
lead it to, as mpe2 draws it; what each says."""
import numpy as np

from .._mpe.render import draw as draw_world
from .env import LANDMARK_COLORS


def draw(ax, frame, env):
    goals = frame["goal"]
    agent_colors = np.array([LANDMARK_COLORS[goals[1]], LANDMARK_COLORS[goals[0]]])
    draw_world(ax, frame, env, agent_colors=agent_colors)
