"""An exploitability proxy: how much a fresh learner gains against a run's final policy.

A fresh learner for one side (the run's own config: networks, learning settings,
replicas, seed) trains for `budget` env steps against the other side's final network,
frozen (`trainer.league: true`, `trainer.league_frozen: [the other side]`, that network
loaded with `League.load_frozen`). Then it and the run's own final network of that
side each play the frozen network in cross-play (the same protocol, the same starts),
and the margin is the best response's mean return minus the run's own side's, over
episodes paired by their start. A lower margin: the frozen side is harder to exploit.
"""
from __future__ import annotations

import time

from gpusim.errors import GpusimError

from ..loop import Trainer
from ..run_config import load_run_dir_config
from ..signals import Stopped
from .crossplay import cross_play, mean_ci, paired
from .players import Player, Run, acting_copy


def train_best_response(run: Run, side: str, budget: int, log=print, warm: bool = False):
    """(the best response's acting network, training figures) for `side` of `run`;
    `warm`: the learner starts from the run's own `side` network (actor and critic; a
    fresh optimizer), not from a fresh one."""
    other = next(name for name in run.sides if name != side)
    check_budget(run, budget)
    if run.config.trainer.population != 1:
        raise GpusimError(f"{run.path} is a population run: keep one member as a plain run "
                          "(python -m gpusim.evaluate RUN_DIR --population_best) and give "
                          "its directory")
    models = run.state.get("algorithm", {}).get("models", {})
    cls, config = load_run_dir_config(run.path, {
        "trainer.league": True, "trainer.league_frozen": [other],
        "trainer.total_steps": budget, "trainer.final_eval_episodes": 0,
        "trainer.target_return": None})
    trainer = Trainer(config, cls)
    trainer.algorithm.league.load_frozen({other: models[other]})
    if warm:
        trainer.algorithm.models()[side].load_state_dict(models[side])
    start = time.perf_counter()
    try:
        summary = trainer.train()
    except Stopped:
        raise KeyboardInterrupt from None
    seconds = time.perf_counter() - start
    figures = {"budget": budget, "env_steps": summary["env_steps"],
               "iterations": summary["iterations"], "seconds": round(seconds, 2),
               "env_steps_per_s": round(summary["env_steps"] / seconds, 1),
               "training_return": summary["episode_return"].get(side), "warm": warm}
    log(f"best response for {side}: {summary['env_steps']:,} env steps against {other}'s "
        f"final network in {seconds:.1f} s ({figures['env_steps_per_s']:,.0f} steps/s); "
        f"its mean training return {_fmt(figures['training_return'])}")
    network = trainer.algorithm.models()[side]
    return acting_copy(run.finals[side], network.state_dict()), figures


def check_budget(run: Run, budget: int):
    steps = run.config.trainer.steps_per_iteration
    if budget < steps:
        raise GpusimError(f"--budget {budget:,} is less than one iteration of {run.path.name} "
                          f"({steps:,} env steps: num_envs x rollout_len)")


def margin(run: Run, side: str, response, make_env, episodes: int, per_cell: int,
           max_replicas: int, seed: int, deterministic: bool = False) -> dict:
    """The best response `response` and the run's own `side` each against the other
    side's final network: their returns, and the margin (paired by start)."""
    sides = run.sides
    other = next(name for name in sides if name != side)
    name = run.path.name
    players = {side: [Player("best response", name, None, False, response),
                      Player("own final", name, None, True, run.finals[side])],
               other: [Player("final", name, None, True, run.finals[other])]}
    cells = cross_play(make_env, sides, players, episodes, per_cell, max_replicas, seed,
                       deterministic)
    mine = (lambda k: cells[(k, 0)]) if side == sides[0] else (lambda k: cells[(0, k)])
    best, own = mine(0), mine(1)
    out = {}
    for label, cell in (("best_response", best), ("own", own)):
        out[label] = {n: dict(zip(("mean", "ci95"), mean_ci(cell[n]))) for n in sides}
    m, ci = paired(best[side], own[side])
    out["margin"] = {"mean": m, "ci95": ci}
    return out


def report(side: str, other: str, result: dict, log=print):
    b, o, m = result["best_response"], result["own"], result["margin"]
    log(f"  against {other}'s final network, {side}'s mean return:")
    log(f"    best response        {_pm(b[side])}   ({other}: {_pm(b[other])})")
    log(f"    the run's own {side:<6} {_pm(o[side])}   ({other}: {_pm(o[other])})")
    log(f"    margin               {_pm(m)}   (paired by start; lower: {other} is harder "
        "to exploit)")


def _pm(value: dict) -> str:
    ci = value["ci95"]
    return f"{value['mean']:10.3f} +- " + ("inf" if ci is None else f"{ci:.3f}")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
