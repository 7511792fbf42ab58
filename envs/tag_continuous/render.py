"""A frame of tag_continuous: taggers (red) and runners still in the game (blue), headings."""
import numpy as np


def draw(ax, frame, config):
    length = config.grid_length
    in_game = frame["still_in_game"] == 1
    tagger = frame["agent_type"] == 1
    for who, color, size in ((tagger, "tab:red", 30), (~tagger & in_game, "tab:blue", 12)):
        x, y = frame["loc_x"][who], frame["loc_y"][who]
        heading = frame["direction"][who]
        ax.scatter(x, y, s=size, c=color, zorder=2)
        ax.quiver(x, y, np.cos(heading), np.sin(heading), color=color, scale=25, width=0.004)
    ax.set_xlim(0, length)
    ax.set_ylim(0, length)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.01 * length, 0.96 * length, f"runners left {int((~tagger & in_game).sum())}",
            fontsize=8, bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
