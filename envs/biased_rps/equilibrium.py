"""biased_rps as a matrix game: its payoff matrix, its Nash equilibrium and the
exploitability of a pair of mixed strategies, exact (NumPy only).

The row player's payoff matrix A (rows: row's action, columns: column's; the
column player gets -A) with wins a (rock), b (paper), c (scissors):

        R    P    S
    R   0   -b   +a
    P  +b    0   -c
    S  -a   +c    0

A = -A^T, so the game is symmetric with value 0. A y = 0 has the one solution
y = (c, a, b) / (a + b + c) on the simplex, and x^T A = 0 the same x: the unique
equilibrium, each side playing it. With the defaults (1, 2, 3): (1/2, 1/6, 1/3),
rock most, though rock wins least.

Exploitability of (x, y): max_i (A y)_i + max_j (-x^T A)_j, what the two best pure
responses win against the other's mixture; >= 0, and 0 exactly at the equilibrium.
"""
from __future__ import annotations

import numpy as np


def payoff_matrix(config) -> np.ndarray:
    """(3, 3) float64: the row player's payoff for (row's action, column's action)."""
    a, b, c = config.rock_win, config.paper_win, config.scissors_win
    return np.array([[0.0, -b, a], [b, 0.0, -c], [-a, c, 0.0]])


def nash(config) -> np.ndarray:
    """(3,) the equilibrium mixture of either player: (c, a, b) / (a + b + c)."""
    a, b, c = config.rock_win, config.paper_win, config.scissors_win
    return np.array([c, a, b]) / (a + b + c)


def exploitability(config, row, column) -> float:
    """What best responses win against the mixtures `row` and `column` (each (3,),
    non-negative, summing to 1), summed over both sides."""
    matrix = payoff_matrix(config)
    row, column = (_mixture(v, name) for v, name in ((row, "row"), (column, "column")))
    return float(np.max(matrix @ column) + np.max(-(row @ matrix)))


def _mixture(value, name: str) -> np.ndarray:
    v = np.asarray(value, dtype=np.float64)
    if v.shape != (3,) or np.any(v < -1e-6) or abs(v.sum() - 1.0) > 1e-4:
        raise ValueError(f"the {name} strategy must be 3 probabilities summing to 1, got {v}")
    return v
