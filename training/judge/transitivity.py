"""Does training climb, cycle or forget? The cross-play of one run's snapshots, summarised.

A league can only help where plain training is intransitive (a later self loses to an
earlier one) or forgets (a later self does worse than an earlier one against some
opponent): in a transitive game each new self already beats every old one, and no pool
has anything to fix. The players are one run's snapshots of both sides, oldest first
(training.records.snapshots, or a league's pools), and every measure is taken over episodes
paired by their start (cross-play's common random numbers), with 95% intervals:

- per side, against a fixed opponent of the other side: each pair (earlier, later) of
  its snapshots, whether the later one's return is above the earlier one's (climbing)
  or below (forgetting); and the opponents against which the final snapshot does worse
  than some earlier one;
- both sides together: snapshot times k and l met as in a symmetric game, k playing X
  against l's Y and Y against l's X; k's share of the two games, per episode, is
  (X wins of (k, l) + 1 - X wins of (l, k)) / 2 (a win under the ratings' rule, the
  env's outcome or the median return: training.judge.ratings). Later beating earlier is the transitive case; a triple of times
  a > b > c > a is an intransitive cycle.

With 95% intervals about 2.5% of the pairs in each direction are flagged by chance
alone where nothing changed: compare the counts with that.
"""
from __future__ import annotations

from itertools import combinations

from gpusim.errors import writing

from .crossplay import mean_ci, paired
from .ratings import episode_wins


def _compare(a: list, b: list) -> int:
    """+1 where a's mean is above b's beyond its 95% interval (paired), -1 below, 0 not."""
    mean, ci = paired(a, b)
    ci = float("inf") if ci is None else ci
    return 1 if mean - ci > 0 else -1 if mean + ci < 0 else 0


def per_side(cells: dict, sides: list, players: dict, side: str) -> dict:
    """Climbing and forgetting of `side` against each fixed opponent."""
    x, y = sides
    mine, theirs = (players[x], players[y]) if side == x else (players[y], players[x])
    own = [k for k, p in enumerate(mine) if not p.panel]  # snapshots; panel players are
                                                          # opponents only

    def returns(me: int, opponent: int) -> list:
        return cells[(me, opponent) if side == x else (opponent, me)][side]
    pairs = list(combinations(own, 2))
    up = down = 0
    final_worse = []
    for o in range(len(theirs)):
        for early, late in pairs:
            verdict = _compare(returns(late, o), returns(early, o))
            up += verdict > 0
            down += verdict < 0
        last = own[-1]
        if any(_compare(returns(last, o), returns(e, o)) < 0 for e in own[:-1]):
            final_worse.append(theirs[o].label)
    return {"comparisons": len(pairs) * len(theirs), "later_better": up, "later_worse": down,
            "opponents": len(theirs), "final_worse_against": final_worse}


def symmetric(cells: dict, sides: list, players: dict, declared=None) -> dict:
    """The game of snapshot times (see the module): its tournament and its 3-cycles."""
    x, y = sides
    index = {side: {p.update: k for k, p in enumerate(players[side])} for side in sides}
    times = sorted(t for t in index[x] if t is not None and t in index[y])
    won, _, _ = episode_wins(cells, x, declared, sides)

    def wins(k, l) -> list:  # X of time k against Y of time l, per episode
        return won[(index[x][k], index[y][l])]
    beats, strongly = {}, {}  # (a, b): a beat b (point estimate / beyond its interval)
    share = {}
    for a, b in combinations(times, 2):
        per_episode = [(p + 1.0 - q) / 2 for p, q in zip(wins(a, b), wins(b, a))]
        mean, ci = mean_ci(per_episode)
        ci = float("inf") if ci is None else ci
        share[(a, b)] = (mean, ci)
        if mean != 0.5:
            winner, loser = (a, b) if mean > 0.5 else (b, a)
            beats[(winner, loser)] = True
            if abs(mean - 0.5) > ci:
                strongly[(winner, loser)] = True

    def cycles(edges: dict) -> int:
        return sum(1 for a, b, c in combinations(times, 3)
                   if ((a, b) in edges and (b, c) in edges and (c, a) in edges)
                   or ((a, c) in edges and (c, b) in edges and (b, a) in edges))
    pairs = len(times) * (len(times) - 1) // 2
    later = sum((b, a) in beats for a, b in combinations(times, 2))
    earlier = sum((a, b) in beats for a, b in combinations(times, 2))
    return {"times": times, "pairs": pairs, "triples": len(list(combinations(times, 3))),
            "later_beats_earlier": later, "earlier_beats_later": earlier,
            "later_beats_earlier_sig": sum((b, a) in strongly
                                           for a, b in combinations(times, 2)),
            "earlier_beats_later_sig": sum((a, b) in strongly
                                           for a, b in combinations(times, 2)),
            "cycles": cycles(beats), "cycles_sig": cycles(strongly),
            "share": {f"{a},{b}": {"mean": m, "ci95": c} for (a, b), (m, c) in share.items()}}


def summary(cells: dict, sides: list, players: dict, declared=None) -> dict:
    """`declared`: the env's outcome (gpusim.outcome), which the symmetric game's wins use."""
    return {"sides": {side: per_side(cells, sides, players, side) for side in sides},
            "symmetric": symmetric(cells, sides, players, declared)}


def report(result: dict, sides: list, log=print):
    """The verdict in one table (markdown, so it can be pasted as is)."""
    x, y = sides
    sx, sy, sym = result["sides"][x], result["sides"][y], result["symmetric"]

    def frac(n, total):
        return f"{n}/{total} ({100 * n / max(1, total):.0f}%)"
    log("transitivity: snapshots oldest first, 95% intervals over episodes paired by start "
        "(about 2.5% of pairs per direction flagged by chance alone)")
    log(f"| measure | {x} | {y} |")
    log("|---|---|---|")
    log(f"| against a fixed opponent: a later snapshot scores more than an earlier one "
        f"| {frac(sx['later_better'], sx['comparisons'])} "
        f"| {frac(sy['later_better'], sy['comparisons'])} |")
    log(f"| against a fixed opponent: a later snapshot scores less (forgetting) "
        f"| {frac(sx['later_worse'], sx['comparisons'])} "
        f"| {frac(sy['later_worse'], sy['comparisons'])} |")
    log(f"| opponents the final snapshot does worse against than some earlier one "
        f"| {frac(len(sx['final_worse_against']), sx['opponents'])} "
        f"| {frac(len(sy['final_worse_against']), sy['opponents'])} |")
    n = sym["pairs"]
    log(f"| both sides, {len(sym['times'])} times: the later beats the earlier "
        f"(beyond its interval) | {frac(sym['later_beats_earlier'], n)} "
        f"({sym['later_beats_earlier_sig']}) | |")
    log(f"| both sides: the earlier beats the later (beyond its interval) "
        f"| {frac(sym['earlier_beats_later'], n)} ({sym['earlier_beats_later_sig']}) | |")
    log(f"| both sides: intransitive triples, a > b > c > a (beyond their intervals) "
        f"| {frac(sym['cycles'], sym['triples'])} ({sym['cycles_sig']}) | |")


def plot(cells: dict, sides: list, players: dict, title: str, path) -> str | None:
    """transitivity.png: each side's mean return per cell, rows X's snapshots and columns
    Y's, oldest first; None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    x, y = sides
    nx, ny = len(players[x]), len(players[y])
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    for ax, side in zip(axes, sides):
        grid = [[mean_ci(cells[(i, j)][side])[0] for j in range(ny)] for i in range(nx)]
        image = ax.imshow(grid, cmap="viridis", origin="upper")
        ax.set_xticks(range(ny), [p.label for p in players[y]], rotation=90, fontsize=7)
        ax.set_yticks(range(nx), [p.label for p in players[x]], fontsize=7)
        ax.set(xlabel=f"{y} snapshot", ylabel=f"{x} snapshot", title=f"{side}'s mean return")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
