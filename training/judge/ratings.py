"""Ratings of cross-play's players: a Bradley-Terry fit, in Elo points, and its plot.

The outcome of an episode: the env's own where it declares one (gpusim.outcome:
tag_continuous's runner survival, biased_rps's payoff sign), X winning where the value
is beyond the outcome's threshold in X's direction, or, without a threshold, beyond the
median of the values over the whole matrix. Without a declaration, scale-free for any
env: side X wins when X's return is above the median of X's returns over the whole
matrix. At the threshold or the median an episode is half a win (`episode_wins`). Y
wins what X loses.

Bradley-Terry: every player (of either side) has a strength theta, and X player i
beats Y player j with probability sigmoid(theta_i - theta_j). `bradley_terry` fits the
thetas to every cell's wins by Newton's method on the log-likelihood, with a Gaussian
prior of standard deviation PRIOR_SD on each theta (it keeps a player that won or lost
every game finite, and barely moves the others: 16 games of one cell weigh 4 against
its 1/16), and centres them on 0 (only differences are identified). Ratings are
reported in Elo points, 400 log10(e) theta: 400 points is odds of 10 to 1; their 95%
intervals come from the fit's curvature (the inverse Fisher information).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from gpusim.errors import GpusimError, writing
from gpusim.outcome import win

from .crossplay import OUTCOME

PRIOR_SD = 4.0  # of theta (natural log-odds): 695 Elo points
ELO = 400.0 / math.log(10.0)


def episode_wins(cells: dict, x: str, declared=None, policies=()) -> tuple:
    """({cell: X's win per episode, 1, 1/2 or 0}, the threshold, the rule in words):
    by the env's outcome `declared` where the cells hold its values, else by X's return
    against the median (see the module). `policies`: the env's (the outcome's sides)."""
    if declared is not None and all(OUTCOME in cell for cell in cells.values()):
        key, direction = OUTCOME, declared.direction(x, policies)
        threshold = declared.threshold
        what = f"the episode's {declared.name}"
        if threshold is None:
            threshold = statistics.median(v for cell in cells.values() for v in cell[key])
            where = f"{threshold:.4g}, its median over the matrix"
        else:
            where = f"{threshold:.4g}"
        rule = (f"{x} wins an episode when {what} is {'above' if direction > 0 else 'below'} "
                f"{where} (ties half)")
    else:
        key, direction = x, 1.0
        threshold = statistics.median(v for cell in cells.values() for v in cell[x])
        rule = (f"{x} wins an episode when its return is above {threshold:.4g}, the median "
                f"of {x}'s returns over the matrix (ties half)")
    wins = {k: [win(v, threshold, direction) for v in cell[key]] for k, cell in cells.items()}
    return wins, threshold, rule


def outcomes(cells: dict, x: str, declared=None, policies=()) -> tuple:
    """(wins of X per cell, games per cell, the threshold): `cells` {(i, j): {side:
    returns}} (and the outcome's values), by `episode_wins`."""
    wins, threshold, _ = episode_wins(cells, x, declared, policies)
    return ({k: sum(w) for k, w in wins.items()}, {k: len(w) for k, w in wins.items()},
            threshold)


def bradley_terry(wins: dict, games: dict, nx: int, ny: int, prior_sd: float | None = PRIOR_SD,
                  iterations: int = 100) -> tuple:
    """(theta, its standard errors) of nx X players then ny Y players, from X's `wins`
    and the `games` of every cell (i, j); `prior_sd` None: the plain maximum likelihood
    (finite only where every player both won and lost)."""
    n = nx + ny
    pairs = [(i, nx + j, wins[(i, j)], games[(i, j)]) for (i, j) in games if games[(i, j)]]
    theta = np.zeros(n)
    precision = 0.0 if prior_sd is None else 1.0 / prior_sd ** 2
    for _ in range(iterations):
        grad, hess = -precision * theta, -precision * np.eye(n)
        for a, b, w, g in pairs:
            p = 1.0 / (1.0 + math.exp(-(theta[a] - theta[b])))
            grad[a] += w - g * p
            grad[b] -= w - g * p
            c = g * p * (1 - p)
            hess[a, a] -= c
            hess[b, b] -= c
            hess[a, b] += c
            hess[b, a] += c
        step = np.linalg.lstsq(-hess, grad, rcond=None)[0]  # (singular along the mean
        theta = theta + step                                #  without a prior)
        if np.max(np.abs(step)) < 1e-10:
            break
    theta -= theta.mean()
    if not np.all(np.isfinite(theta)):
        raise GpusimError("the ratings' fit did not converge")
    # the covariance of the centred thetas: the fit's, projected off the common shift
    centre = np.eye(n) - 1.0 / n
    cov = centre @ np.linalg.pinv(-hess) @ centre
    return theta, np.sqrt(np.clip(np.diag(cov), 0.0, None))


def ratings(cells: dict, sides: list, players: dict, declared=None) -> dict:
    """Every player's Elo rating and 95% interval, per side, from the cross-play cells
    (their episodes won by the env's outcome `declared`, where given)."""
    x, y = sides
    per_episode, median, rule = episode_wins(cells, x, declared, sides)
    wins = {k: sum(w) for k, w in per_episode.items()}
    games = {k: len(w) for k, w in per_episode.items()}
    nx, ny = len(players[x]), len(players[y])
    theta, se = bradley_terry(wins, games, nx, ny)
    rows = {x: [], y: []}
    for k, (side, player) in enumerate([(x, p) for p in players[x]] + [(y, p) for p in players[y]]):
        rows[side].append({**player.describe(), "elo": float(ELO * theta[k]),
                           "ci95": float(1.96 * ELO * se[k])})
    return {"outcome": rule, "median": median, "x_wins": {f"{i},{j}": w for (i, j), w in wins.items()},
            "players": rows}


def plot(rated: dict, sides: list, title: str, path, over_training: bool) -> str | None:
    """league.png: each side's ratings against the update its players were taken at (a
    league run), or per player (runs' finals); None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for side in sides:
        rows = [r for r in rated["players"][side]  # (panel players were taken at no update)
                if not over_training or r["update"] is not None]
        xs = [r["update"] for r in rows] if over_training else list(range(len(rows)))
        ax.errorbar(xs, [r["elo"] for r in rows], yerr=[r["ci95"] for r in rows],
                    marker="o", capsize=3, label=side)
        finals = [(x, r["elo"]) for x, r in zip(xs, rows) if r["final"]]
        if over_training and finals:
            ax.plot(*zip(*finals), "k*", markersize=12)
    if over_training:
        ax.set_xlabel("update the snapshot was taken at (star: the final network)")
    else:
        # one tick per position; where the sides' players differ (a panel's chaser and
        # fleer), both names
        per_side = [[r["label"] for r in rated["players"][side]] for side in sides]
        labels = [" / ".join(dict.fromkeys(names)) for names in zip(*per_side)]
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("run (or panel player: " + " / ".join(sides) + ")")
    ax.set(ylabel="Bradley-Terry rating (Elo points, 95% interval)", title=title)
    ax.axhline(0.0, color="gray", linewidth=0.5)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
