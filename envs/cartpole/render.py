"""A frame of cartpole: the track, the cart at x and the pole at angle theta."""
import numpy as np
from matplotlib.patches import Rectangle


def draw(ax, frame, config):
    x, theta = float(frame["x"]), float(frame["theta"])
    pole = 2 * config.pole_half_length
    ax.plot([-config.x_threshold, config.x_threshold], [0, 0], color="gray")
    ax.add_patch(Rectangle((x - 0.25, -0.1), 0.5, 0.2, color="tab:blue"))
    ax.plot([x, x + pole * np.sin(theta)], [0, pole * np.cos(theta)], color="tab:brown", lw=4)
    ax.set_xlim(-config.x_threshold - 0.5, config.x_threshold + 0.5)
    ax.set_ylim(-0.5, pole + 0.5)
    ax.set_aspect("equal")
    ax.set_yticks([])
