"""The players of `python -m gpusim.league`: networks of a two-policy env, per side.

A league run's players are, per policy, the snapshots its checkpoint's pool holds
(training.league.self_play's `Pool`: each labelled by the update it was taken at, `u30`) and
its final network (`final`). Several runs' players are their final networks, one per
run and side (labelled A, B, ...): run A's taggers against run B's runners, and so on.
Only the acting part of each network is kept (training.trained.policies.acting_part).

`StackedPlayers` acts for one policy with its players stacked (training.population.stacked): each
replica plays the player its slot names, and a step is one batched product over the
players (`StackedPolicy.lead`), every player on the replicas that play it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from gpusim.config import to_dict
from gpusim.errors import GpusimError
from gpusim.scripted import scripted_policies

from ..population.stacked import StackedPolicy, flat_name
from ..records import checkpoint, snapshots
from ..run_config import load_run_dir_config
from ..trained import policies as trained

STACKABLE = ("ppo", "a2c")  # their actor-critics take a leading player dim (members_lead)


@dataclass
class Player:
    """One network of one side: its label, the run it comes from, the update it was
    taken at (None: a run's final network of unknown update count) and its weights."""
    label: str
    run: str
    update: int | None
    final: bool
    model: torch.nn.Module | None  # the acting part, on the CPU, no gradients
    scripted: type | None = None   # or a panel player: cls(env, policy) (gpusim.scripted;
                                   # None for the policy: uniformly random actions)

    @property
    def panel(self) -> bool:
        return self.model is None

    def describe(self) -> dict:
        return {"label": self.label, "run": self.run, "update": self.update,
                "final": self.final, "panel": self.panel}


@dataclass
class Run:
    """A run directory as the league tools read it."""
    path: Path
    cls: type
    config: object
    state: dict      # its latest checkpoint
    finals: dict     # policy name -> its final acting network

    @property
    def sides(self) -> list:
        return list(self.finals)

    @property
    def league(self) -> dict | None:
        """Its league state (pools, updates), or None for a run without a league."""
        algorithm = self.state.get("algorithm")
        league = algorithm.get("league") if isinstance(algorithm, dict) else None
        return league if isinstance(league, dict) and league.get("pools") else None


def open_run(run_dir) -> Run:
    """A run directory with two policies of stackable networks, or one `error:` line."""
    path = Path(run_dir)
    if not path.is_dir():
        raise GpusimError(f"{path} is not a directory (give a run directory written by "
                          "python -m gpusim.train)")
    cls, config = load_run_dir_config(path)
    specs = cls.declared(config.env).policy_specs
    if len(specs) != 2:
        raise GpusimError(f"{path}: {config.env_name} has {len(specs)} "
                          f"polic{'y' if len(specs) == 1 else 'ies'} "
                          f"({', '.join(specs)}); cross-play and best responses need two "
                          "sides")
    if config.trainer.algorithm not in STACKABLE:
        raise GpusimError(f"{path} trained {config.trainer.algorithm}: the league tools play "
                          f"{' and '.join(STACKABLE)} policies")
    if config.policy.recurrent != "none":
        raise GpusimError(f"{path} has recurrent policies ({config.policy.recurrent}): the "
                          "league tools play feed-forward ones")
    state = checkpoint.load_latest(path / "checkpoints")
    finals = {name: p.model for name, p in trained.load_policies(path, "cpu").items()}
    return Run(path, cls, config, state, finals)


def check_alike(runs: list):
    """Runs whose players meet must share the env, its config and the networks' shapes."""
    first = runs[0]
    for run in runs[1:]:
        if run.config.env_name != first.config.env_name:
            raise GpusimError(f"{run.path} is a run of {run.config.env_name} and {first.path} "
                              f"of {first.config.env_name}: cross-play needs runs of one env")
        mine, theirs = to_dict(run.config.env), to_dict(first.config.env)
        differ = [k for k in theirs if mine.get(k) != theirs[k]]
        if differ:
            raise GpusimError(f"{run.path} and {first.path} differ in env.{differ[0]} "
                              f"({mine.get(differ[0])!r} against {theirs[differ[0]]!r}): "
                              "cross-play needs runs of one env config")
        for name, model in first.finals.items():
            shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            other = {k: tuple(v.shape) for k, v in run.finals[name].state_dict().items()}
            if shapes != other:
                raise GpusimError(f"{run.path} and {first.path}: policy {name!r} has networks "
                                  "of different shapes (policy.hidden_sizes, activation or "
                                  "std settings differ): they cannot be stacked")


def league_players(run: Run) -> dict:
    """Per side: the league run's snapshots, oldest first (duplicates of the final network
    left out), then its final network."""
    league = run.league
    if league is None and snapshots.listed(run.path):
        return snapshot_players(run)
    if league is None:
        raise GpusimError(f"{run.path} is not a league run and kept no snapshots (train "
                          "with trainer.keep_snapshots=16 to cross-play a plain run's past "
                          "selves); cross-play its final policies against another run's: "
                          "python -m gpusim.league RUN_A RUN_B")
    updates = int(league.get("updates", 0))
    players = {}
    for name, final in run.finals.items():
        pool = league["pools"].get(name)
        if not isinstance(pool, dict):
            raise GpusimError(f"{run.path}: its checkpoint holds no pool of policy {name!r}")
        stacked, filled, born = pool["nets"], pool["filled"], list(pool["born"])
        side = []
        for slot in sorted((k for k in range(len(born)) if bool(filled[k])),
                           key=lambda k: born[k]):
            model = copy.deepcopy(final)
            try:
                model.load_state_dict({key: stacked[flat_name(key)][slot]
                                       for key in final.state_dict()})
            except (KeyError, RuntimeError) as exc:
                raise GpusimError(f"{run.path}: the pool of policy {name!r} does not fit its "
                                  f"network ({str(exc).splitlines()[0][:100]})") from None
            if not same_weights(model, final):
                side.append(Player(f"u{born[slot]}", run.path.name, born[slot], False, model))
        side.append(Player("final", run.path.name, updates, True, final))
        players[name] = side
    return players


def snapshot_players(run: Run) -> dict:
    """Per side: a plain run's kept snapshots (trainer.keep_snapshots), oldest first, each
    labelled by its iteration (`u120`: one update each), then its final network (a
    snapshot equal to it left out)."""
    players = {name: [] for name in run.finals}
    for iteration, path in snapshots.listed(run.path):
        models = snapshots.load(path)
        for name, final in run.finals.items():
            if name not in models:
                raise GpusimError(f"{path} holds no policy {name!r}")
            try:
                model = acting_copy(final, models[name])
            except (KeyError, RuntimeError) as exc:
                raise GpusimError(f"{path}: policy {name!r} does not fit the run's network "
                                  f"({str(exc).splitlines()[0][:100]})") from None
            if not same_weights(model, final):
                players[name].append(Player(f"u{iteration}", run.path.name, iteration, False,
                                            model))
    for name, final in run.finals.items():
        players[name].append(Player("final", run.path.name, _updates(run), True, final))
    return players


def run_players(runs: list) -> dict:
    """Per side: each run's final network, labelled A, B, ... in the order given."""
    labels = [chr(ord("A") + k) if k < 26 else f"R{k}" for k in range(len(runs))]
    return {name: [Player(label, run.path.name, _updates(run), True, run.finals[name])
                   for label, run in zip(labels, runs)]
            for name in runs[0].sides}


def panel_players(run: Run) -> dict:
    """Per side: fixed opponents, never networks: uniformly random actions and the env's
    scripted policies (gpusim.scripted), labelled `random`, `chaser`, ..."""
    shipped = scripted_policies(run.cls)
    return {name: [Player("random", "panel", None, False, None)]
            + [Player(label, "panel", None, False, None, cls)
               for label, cls in shipped.get(name, {}).items()]
            for name in run.sides}


def _updates(run: Run) -> int | None:
    iteration = run.state.get("iteration")
    return int(iteration) if isinstance(iteration, int) else None


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def acting_copy(template: torch.nn.Module, state: dict) -> torch.nn.Module:
    """A copy of acting network `template` with the acting weights of full state dict
    `state` (a checkpoint's model: its critic's entries are left out)."""
    model = copy.deepcopy(template)
    model.load_state_dict({key: state[key] for key in model.state_dict()})
    return model


class StackedPlayers:
    """How one policy acts in cross-play: its players stacked, replica e playing player
    `slots[e]`. Every player must have the same number of replicas (a rectangle of the
    matrix): the rows are grouped by player (a permutation, none where the slots are
    already in blocks), run as one batched product, and put back in replica order."""
    state_size = 0

    def __init__(self, models: list, slots: torch.Tensor, device):
        self.nets = StackedPolicy(models).to(device)
        self.nets.requires_grad_(False)
        self.size = len(models)
        counts = torch.bincount(slots, minlength=self.size)
        if not bool((counts == counts[0]).all()):
            raise ValueError("every player needs the same number of replicas")
        order = torch.argsort(slots, stable=True)
        blocks = bool((order == torch.arange(len(slots), device=slots.device)).all())
        self.order = None if blocks else order.to(device)
        self.inverse = None if blocks else torch.argsort(order).to(device)

    def log_probs(self, obs, mask=None):
        return self._run("log_probs", obs, mask)

    def sample(self, obs, deterministic: bool = False):
        return self._run("sample", obs, deterministic)

    def _run(self, method: str, obs, extra):
        def grouped(x):
            x = x if self.order is None else x[self.order]
            return x.reshape((self.size, -1) + x.shape[1:])

        def back(y):
            y = y.reshape((-1,) + y.shape[2:])
            return y if self.inverse is None else y[self.inverse]
        extra = grouped(extra) if isinstance(extra, torch.Tensor) else extra
        out = self.nets.lead(method, grouped(obs), extra)
        return tuple(back(y) for y in out) if isinstance(out, tuple) else back(out)
