"""tag_continuous's scripted policies (gpusim.scripted): a chaser for the taggers, each
heading for its nearest runner still in the game, and a fleer for the runners, each
heading away from its nearest tagger and back from the walls. The observation lacks an
agent's own position and heading, so they read the env's state arrays.

An action is a pair of discrete levels (spec: acceleration change, turn): the largest
acceleration level (top speed is reached in a few steps and kept), and the turn level
nearest the wanted change of heading.
"""
import math

import torch

from gpusim.scripted import ScriptedPolicy, nearest

WALL = 0.15  # the share of grid_length from a wall within which the fleer turns back


class _Tag(ScriptedPolicy):
    def __init__(self, env, policy):
        super().__init__(env, policy)
        self.taggers = torch.tensor(env.policies["tagger"], device=env.device)
        self.runners = torch.tensor(env.policies["runner"], device=env.device)
        self.faster = env.arrays["acc_table"].argmax()
        self.turns = env.arrays["turn_table"]
        self.grid = float(env.config.grid_length)

    def positions(self, agents):
        a = self.env.arrays
        return torch.stack((a["loc_x"][:, agents], a["loc_y"][:, agents]), -1)

    def head_for(self, direction: torch.Tensor) -> torch.Tensor:
        """(R, A, 2) wanted directions of this policy's agents -> (R, A, 2) levels."""
        wanted = torch.atan2(direction[..., 1], direction[..., 0])
        heading = self.env.arrays["direction"][:, self.agents]
        turn = torch.remainder(wanted - heading + math.pi, 2 * math.pi) - math.pi
        level = (self.turns - turn[..., None]).abs().argmin(-1)
        return torch.stack((self.faster.expand_as(level), level), -1)


class Chaser(_Tag):
    def choose(self):
        present = self.env.arrays["still_in_game"][:, self.runners] > 0
        return self.head_for(nearest(self.positions(self.taggers),
                                     self.positions(self.runners), present))


class Fleer(_Tag):
    def choose(self):
        mine = self.positions(self.runners)
        away = -nearest(mine, self.positions(self.taggers))
        away = away / away.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        margin = WALL * self.grid
        back = ((margin - mine).clamp_min(0.0) - (mine - (self.grid - margin)).clamp_min(0.0))
        return self.head_for(away + 2.0 * back / margin)


SCRIPTED = {"tagger": {"chaser": Chaser}, "runner": {"fleer": Fleer}}
