"""Mixed strategies of trained networks, for games where a policy's observation before it
acts is always the same (matrix games such as biased_rps): a network's strategy is its
action distribution on that observation, a league pool's the mixture of its snapshots'.

What a pair of strategies is worth is the game's own business (biased_rps: its
`equilibrium.exploitability`); this module only reads networks: a run's final ones
(training.trained.policies), its kept snapshots (training.records.snapshots) and its league pools
(training.league.self_play's `Pool`, loaded from the checkpoint and weighted as the league drew).
"""
from __future__ import annotations

import numpy as np
import torch

from gpusim.envs import make
from gpusim.errors import GpusimError

from ..league.opponents import Pool
from ..records import snapshots
from .players import Run, acting_copy

OPPONENT_RULES = ("uniform", "pfsp", "latest")  # as trainer.league_opponents draws


def first_observations(run: Run) -> dict:
    """Per policy: its first agent's observation at the start of an episode ((1, obs_dim))."""
    env = make(run.config.env_name, num_envs=1, backend="cpu", config=run.config.env)
    obs = env.reset(seed=0)
    return {name: obs[0, ids[0]][None].clone() for name, ids in env.policies.items()}


@torch.no_grad()
def strategy(model, obs: torch.Tensor) -> np.ndarray:
    """The action distribution of a one-component discrete policy on `obs` (1, obs_dim)."""
    return model.log_probs(obs).exp()[0].double().numpy()


def snapshot_strategies(run: Run, obs: dict) -> list:
    """[(iteration, {policy: strategy})] of a run's kept snapshots, oldest first."""
    out = []
    for iteration, path in snapshots.listed(run.path):
        models = snapshots.load(path)
        out.append((iteration, {name: strategy(acting_copy(final, models[name]), obs[name])
                                for name, final in run.finals.items()}))
    return out


@torch.no_grad()
def pool_mixture(run: Run, name: str, obs: torch.Tensor, opponents: str = "pfsp") -> tuple:
    """(the mixture, each filled slot's strategy, each one's weight) of policy `name`'s
    league pool: its snapshots' strategies weighted as `opponents` draws them."""
    if opponents not in OPPONENT_RULES:
        raise GpusimError(f"opponents must be one of {OPPONENT_RULES}, got {opponents!r}")
    league = run.league
    if league is None or name not in league["pools"]:
        raise GpusimError(f"{run.path} holds no league pool of policy {name!r} (train with "
                          "trainer.league=true)")
    saved = league["pools"][name]
    pool = Pool(run.finals[name], len(saved["born"]), "cpu")
    wanted = pool.nets.state_dict()  # the acting part: the critics' entries are left out
    pool.load_state_dict({**saved, "nets": {k: saved["nets"][k] for k in wanted}})
    slots = torch.arange(pool.capacity)
    every = pool.act("log_probs", slots, obs.expand(pool.capacity, -1)).exp().double()
    weights = pool.weights(opponents).double()
    filled = pool.filled.numpy()
    weights = (weights / weights.sum()).numpy()
    mixture = (weights[:, None] * every.numpy()).sum(0)
    return mixture, every.numpy()[filled], weights[filled]
