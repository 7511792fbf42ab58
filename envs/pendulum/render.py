"""A frame of pendulum: the rod from the fixed pivot (theta = 0 points straight up)."""
import numpy as np


def draw(ax, frame, config):
    theta, l = float(frame["theta"]), config.l
    # gymnasium draws the rod at angle theta + pi/2 from the x axis: counter-clockwise
    tip = (-l * np.sin(theta), l * np.cos(theta))
    reach = 1.1 * l + 0.1
    ax.plot([0, 0], [0, l], color="gray", lw=1, ls=":")  # the goal: upright
    ax.plot([0, tip[0]], [0, tip[1]], color="tab:red", lw=8, solid_capstyle="round")
    ax.plot([0], [0], "o", color="black", ms=6)
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
