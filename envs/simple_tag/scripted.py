"""simple_tag's scripted policies (gpusim.scripted): a chaser for the adversaries, each
moving toward its nearest good agent, and a fleer for the good agents, each moving away
from its nearest adversary and back from the edge (where mpe2's bound penalty starts).

A move is mpe2's discrete choice: 1 -x, 2 +x, 3 -y, 4 +y, along the larger component of
the wanted direction. Obstacles are ignored.
"""
import torch

from gpusim.scripted import ScriptedPolicy, nearest

EDGE = 0.8  # |x| beyond which the fleer turns back (the bound penalty starts at 0.9)
EDGE_PULL = 10.0


def move_toward(direction: torch.Tensor) -> torch.Tensor:
    """(R, A, 2) wanted directions -> (R, A, 1) mpe2 move choices."""
    x, y = direction.unbind(-1)
    along_x = x.abs() >= y.abs()
    choice = torch.where(along_x, torch.where(x > 0, 2, 1), torch.where(y > 0, 4, 3))
    return choice[..., None]


class _Tag(ScriptedPolicy):
    def __init__(self, env, policy):
        super().__init__(env, policy)
        adversaries = env.config.num_adversaries
        self.adversaries = slice(0, adversaries)
        self.good = slice(adversaries, env.num_agents)


class Chaser(_Tag):
    def choose(self):
        pos = self.env.arrays["pos"]
        return move_toward(nearest(pos[:, self.adversaries], pos[:, self.good]))


class Fleer(_Tag):
    def choose(self):
        pos = self.env.arrays["pos"]
        mine = pos[:, self.good]
        away = -nearest(mine, pos[:, self.adversaries])
        away = away / away.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        back = (mine.abs() - EDGE).clamp_min(0.0) * mine.sign() * EDGE_PULL
        return move_toward(away - back)


SCRIPTED = {"adversary": {"chaser": Chaser}, "agent": {"fleer": Fleer}}
