"""A frame of simple_crypto: what each agent says, Bob in the message's colour (as mpe2
draws him)."""
from .._mpe.render import draw as draw_world
from .env import BOB


def draw(ax, frame, env):
    agent_colors = env.per_agent("color")
    agent_colors[BOB] = env.per_landmark("color")[int(frame["goal"])]
    draw_world(ax, frame, env, agent_colors=agent_colors)
