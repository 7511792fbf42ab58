"""A frame of tag_gridworld: the grid, taggers (red) and the runner (blue, the last agent)."""
import numpy as np


def draw(ax, frame, config):
    size = config.grid_size
    x, y = frame["pos_x"], frame["pos_y"]
    ax.set_xticks(np.arange(-0.5, size, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, size, 1), minor=True)
    ax.grid(which="minor", color="lightgray")
    ax.scatter(x[:-1], y[:-1], s=120, c="tab:red", marker="s", alpha=0.7)
    ax.scatter(x[-1:], y[-1:], s=120, c="tab:blue", marker="o")
    ax.set_xlim(-0.5, size - 0.5)
    ax.set_ylim(-0.5, size - 0.5)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
