"""A frame of mountain_car_continuous: the hill, the car at its position and the goal flag."""
import numpy as np
from matplotlib.patches import Circle


def _height(xs):
    return np.sin(3 * xs) * 0.45 + 0.55  # the hill as gymnasium draws it


def draw(ax, frame, config):
    x = float(frame["position"])
    xs = np.linspace(config.min_position, config.max_position, 200)
    ax.plot(xs, _height(xs), color="black")
    # the car: a body along the slope and two wheels
    angle = np.arctan(np.cos(3 * x) * 0.45 * 3)
    along = np.array([np.cos(angle), np.sin(angle)])
    normal = np.array([-np.sin(angle), np.cos(angle)])
    base = np.array([x, _height(x)])
    half, lift, tall = 0.08, 0.03, 0.05
    corners = [base + s * half * along + (lift + h) * normal
               for s, h in ((-1, 0), (1, 0), (1, tall), (-1, tall))]
    ax.fill(*np.array(corners).T, color="tab:green")
    for s in (-0.6, 0.6):
        ax.add_patch(Circle(tuple(base + s * half * along + 0.02 * normal), 0.02,
                            color="dimgray"))
    # the flag at the goal
    gx, gy = config.goal_position, _height(config.goal_position)
    ax.plot([gx, gx], [gy, gy + 0.15], color="black")
    ax.fill([gx, gx, gx + 0.08], [gy + 0.15, gy + 0.11, gy + 0.13], color="gold")
    ax.set_xlim(config.min_position, config.max_position)
    ax.set_ylim(0.0, 1.25)
    ax.set_aspect("equal")
    ax.set_yticks([])
