"""A frame of acrobot: the two links from the fixed pivot, and the target height."""
import numpy as np


def draw(ax, frame, config):
    theta1, theta2 = float(frame["theta1"]), float(frame["theta2"])
    l1, l2 = config.link_length_1, config.link_length_2
    # theta1 = 0 hangs straight down; theta2 is relative to link 1 (gymnasium's convention)
    elbow = (l1 * np.sin(theta1), -l1 * np.cos(theta1))
    tip = (elbow[0] + l2 * np.sin(theta1 + theta2), elbow[1] - l2 * np.cos(theta1 + theta2))
    reach = l1 + l2 + 0.2
    ax.plot([-reach, reach], [1.0, 1.0], color="gray", lw=1)  # the tip must rise above this
    ax.plot([0, elbow[0], tip[0]], [0, elbow[1], tip[1]], color="tab:cyan", lw=6,
            solid_capstyle="round")
    ax.plot([0, elbow[0]], [0, elbow[1]], "o", color="tab:olive", ms=8)
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
