"""A frame of simple_adversary: the goal landmark green, as mpe2 draws it."""
from .._mpe.render import draw as draw_world

GOAL_COLOR = (0.15, 0.65, 0.15)


def draw(ax, frame, env):
    landmark_colors = env.per_landmark("color")
    landmark_colors[int(frame["goal"])] = GOAL_COLOR
    draw_world(ax, frame, env, landmark_colors=landmark_colors)
