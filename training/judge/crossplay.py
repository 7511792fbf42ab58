"""Cross-play: every player of one side against every player of the other, in parallel.

Each cell (an X player against a Y player) plays `episodes` full episodes on `per_cell`
replicas of one env; all cells of a rectangle of the matrix step together (tiles of at
most `max_replicas` replicas), each policy's players stacked (league_players'
`StackedPlayers`), so a step is one batched product per policy.

Which episodes count is fixed before any ends, as in training.trained.evaluation: replica k of a
cell counts its first `quota[k]` episodes (the cell's episodes dealt round-robin), so
short episodes are not favoured. Every cell's replicas draw from the same RNG streams
(those of replicas 0 .. per_cell - 1 of `seed`): the same starts and, for discrete
actions, the same draws in every cell (common random numbers). So a cell plays exactly
what `evaluate.play` plays with the same two networks on `per_cell` replicas, and two
cells differ only by their players.

Where the env declares an episode outcome (gpusim.outcome), each cell also holds every
counted episode's value of it, under OUTCOME, in the same order as the returns.
"""
from __future__ import annotations

import math

import torch

from gpusim import rng

from ..trained.evaluation import mean_ci as evaluate_mean_ci, play_counted
from .players import StackedPlayers

OUTCOME = "outcome"  # a cell's key for its episodes' outcome values (no policy's name)


def quotas(episodes: int, per_cell: int) -> list:
    """Episodes counted per replica of a cell: `episodes` dealt round-robin."""
    return [episodes // per_cell + (k < episodes % per_cell) for k in range(per_cell)]


def groups(side: list) -> list:
    """Players of one side that can step together: the networks (stacked), then each panel
    player alone (a scripted policy is no network to stack)."""
    networks = [k for k, p in enumerate(side) if not p.panel]
    return ([networks] if networks else []) + [[k] for k, p in enumerate(side) if p.panel]


def batches(xs: list, ys: list, per_cell: int, max_replicas: int) -> list:
    """(X players, Y players) of each batch that steps together: the tiles of each pair of
    groups (see `groups`)."""
    return [([gx[i] for i in rows], [gy[j] for j in cols])
            for gx in groups(xs) for gy in groups(ys)
            for rows, cols in tiles(len(gx), len(gy), per_cell, max_replicas)]


def tiles(nx: int, ny: int, per_cell: int, max_replicas: int) -> list:
    """Rectangles (X players, Y players) of the matrix, each at most `max_replicas`
    replicas (at least one cell)."""
    cols = max(1, min(ny, max_replicas // per_cell))
    rows = max(1, min(nx, max_replicas // (cols * per_cell)))
    return [(range(a, min(a + rows, nx)), range(c, min(c + cols, ny)))
            for a in range(0, nx, rows) for c in range(0, ny, cols)]


@torch.no_grad()
def cross_play(make_env, sides: list, players: dict, episodes: int, per_cell: int,
               max_replicas: int, seed: int, deterministic: bool = False) -> dict:
    """{(i, j): {side: [episode returns]}} for X player i against Y player j: each
    episode's return of a side is the mean over its agents; a cell's episodes in a fixed
    order (replica, then episode), so two cells' k-th episodes started alike; and, where
    the env declares an outcome, {OUTCOME: [its value per episode]}.
    `make_env(num_envs)` builds the env (seeded `seed`)."""
    x, y = sides
    cells = {}
    for xs, ys in batches(players[x], players[y], per_cell, max_replicas):
        count = len(xs) * len(ys)
        env = make_env(count * per_cell)
        streams = rng.seed_streams(per_cell, env.num_agents, seed, device=env.device)
        env.arrays["rng_state"].copy_(streams.repeat(count, 1, 1))
        cell = torch.arange(count * per_cell, device=env.device) // per_cell
        slots = {x: cell // len(ys), y: cell % len(ys)}
        acting = {x: _acting(env, x, [players[x][i] for i in xs], slots[x]),
                  y: _acting(env, y, [players[y][j] for j in ys], slots[y])}
        played = _play(env, acting, quotas(episodes, per_cell), deterministic)
        for k, (i, j) in enumerate((i, j) for i in xs for j in ys):
            cells[(i, j)] = {name: played[name][k] for name in played}
    return cells


def _acting(env, name: str, chosen: list, slots: torch.Tensor):
    """How policy `name` acts in a tile: its networks stacked, or its one panel player
    (None: uniformly random actions)."""
    if chosen[0].panel:
        return chosen[0].scripted(env, name) if chosen[0].scripted is not None else None
    return StackedPlayers([p.model for p in chosen], slots, env.device)


def _play(env, acting: dict, quota: list, deterministic: bool) -> dict:
    """Per policy, per cell: its counted episodes' returns, ordered (replica, episode)."""
    per_cell = len(quota)
    quota_t = torch.tensor(quota, device=env.device).repeat(env.num_envs // per_cell)
    declared = getattr(env, "outcome", None)
    values = None if declared is None else OutcomeValues(env, declared)
    returns, where, kept = play_counted(env, acting, quota_t, deterministic, values)
    if values is not None:
        returns = {**returns, OUTCOME: [v for v, k in zip(values.values, kept) if k]}
    out = {}
    for name in returns:
        cells = [[] for _ in range(env.num_envs // per_cell)]
        for (e, _), v in sorted(zip(where, returns[name])):
            cells[e // per_cell].append(v)
        out[name] = cells
    return out


class OutcomeValues:
    """The env's outcome per ended episode, read to the host (as evaluate's measures)."""

    def __init__(self, env, declared):
        self.tracker = declared.tracker(env)
        self.values = []

    def after_step(self, done: torch.Tensor):
        value = self.tracker.after_step(done)
        if bool(done.any()):
            self.values += value[done].tolist()


def mean_ci(values) -> tuple:
    """(mean, half-width of its 95% interval) of per-episode values (as evaluate's)."""
    mean, half = evaluate_mean_ci(values)
    return mean, (half if math.isfinite(half) else None)


def paired(a: list, b: list) -> tuple:
    """(mean of a - b, its 95% interval) over episodes paired by their start (same
    replica, same episode number): common random numbers make the pairs alike but for
    the players."""
    return mean_ci([p - q for p, q in zip(a, b)])
