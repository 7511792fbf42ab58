"""A frame of simple_push: the good agent coloured by its goal, as mpe2 draws it."""
from .._mpe.render import draw as draw_world
from .env import AGENT_BASE, AGENT_LIT, lit_color


def draw(ax, frame, env):
    agent_colors = env.per_agent("color")
    agent_colors[1] = lit_color(int(frame["goal"]) + 1, AGENT_BASE, AGENT_LIT)
    draw_world(ax, frame, env, agent_colors=agent_colors)
