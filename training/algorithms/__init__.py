"""The algorithms by name: `ALGORITHMS`, the one table from `trainer.algorithm` to an `Algorithm` (algorithm.py) with its own config dataclass (`Config`: its `trainer` keys)."""
from __future__ import annotations

from .algorithm import Algorithm
from .ddpg import DDPG
from .ppo import A2C, PPO
from .sac import SAC
from .td3 import TD3

ALGORITHMS = {"ppo": PPO, "a2c": A2C, "ddpg": DDPG, "td3": TD3, "sac": SAC}


def algorithm_class(name: str, population: bool = False) -> type:
    """The algorithm `name`; with `population`, what trains a population of it (PPO and
    A2C: ppo_members.py; the off-policy learners batch their members themselves)."""
    if population and name in ("ppo", "a2c"):
        from .ppo_members import PopulationA2C, PopulationPPO
        return {"ppo": PopulationPPO, "a2c": PopulationA2C}[name]
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "algorithm_class"]
