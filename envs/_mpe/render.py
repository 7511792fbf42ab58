"""A frame of an MPE scenario, as mpe2 draws it: agents and landmarks as discs of their
size and colour, and what each agent that speaks says."""
import numpy as np

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def utterance(comm: np.ndarray, continuous: bool) -> str:
    if not comm.any():
        return "_"
    if continuous:
        return "[" + ",".join(f"{c:.2f}" for c in comm) + "]"
    return LETTERS[int(np.argmax(comm))]


def draw(ax, frame: dict, env, agent_colors=None, landmark_colors=None):
    """Draw a frame (`render_arrays` of one replica) in the scenario's colours (its roles'
    and landmark groups'), or in the colours given (a scenario whose colours follow its
    goals)."""
    from matplotlib.patches import Circle
    agent_colors = env.per_agent("color") if agent_colors is None else agent_colors
    landmark_colors = env.per_landmark("color") if landmark_colors is None else landmark_colors
    agent_colors, landmark_colors = (np.clip(c, 0, 1) for c in (agent_colors, landmark_colors))
    sizes = env.per_landmark("size")
    for j, (x, y) in enumerate(frame["landmark_pos"]):
        ax.add_patch(Circle((x, y), sizes[j], facecolor=landmark_colors[j], edgecolor="black",
                            linewidth=0.5, alpha=0.8))
    sizes = env.per_agent("size")
    for i, (x, y) in enumerate(frame["pos"]):
        ax.add_patch(Circle((x, y), sizes[i], facecolor=agent_colors[i], edgecolor="black",
                            linewidth=0.5))
    extent = 1.1 * max([1.0, float(np.abs(frame["pos"]).max())]
                       + [float(np.abs(frame["landmark_pos"]).max())] * bool(frame["landmark_pos"].size))
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    speakers = [i for i, silent in enumerate(env.per_agent("silent")) if not silent]
    for line, i in enumerate(speakers):
        said = utterance(frame["comm"][i][:env.dim_c], env.config.continuous_actions)
        ax.text(0.02, 0.03 + 0.05 * line, f"{env.agent_names[i]} sends {said}",
                transform=ax.transAxes, fontsize=8, va="bottom",
                bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
