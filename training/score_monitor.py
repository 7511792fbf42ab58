"""The env's score while training: a few evaluation replicas stepped beside the run.

An env that names a score (gpusim.score.Score: tag_continuous's runner survival
against the trained taggers) is measured here, on `trainer.score_envs` replicas of
its own, seeded apart from the training replicas: the scored side acts with its
training network (sampled, as it trains), every other policy uniformly at random or,
with `trainer.score_opponents: scripted`, as the env's scripted policy (a fleer for
the runners), so the number moves only when that side learns. Nothing is read on
the host per step: each ended episode's value goes into a device buffer, read once
when the loop asks (`finished`, once per iteration).

Its pace is counted, not timed: every `trainer.score_every` iterations the replicas
step one chunk of `rollout_len` steps. So a seed gives the same run, and stops at the
same iteration, on a quiet machine and a busy one; a run resumed from a checkpoint
(which holds the replicas' state) logs the rows of one never stopped. Its cost is
bounded by what it steps: score_envs / (num_envs x score_every) of the training's
env steps, acting for one side. An env without a score (cooperative and
single-agent ones) is scored by its training return, which costs nothing: no
monitor is built.
"""
from __future__ import annotations

import collections
import time

import torch

from gpusim.errors import GpusimError
from gpusim.scripted import scripted_policies

from .actors import Actors

SEED_OFFSET = 1 << 40  # the evaluation replicas' streams: far from every training replica's
SCORE_KEY = "__score__"  # the score's episodes, passed between ranks beside the returns


class RunScore:
    """A run's score: a monitor per measured side (`trainer.target_score`'s sides, else the
    env's first), and each side's last `score_window` episodes of every rank."""

    def __init__(self, monitors: dict, targets: dict, window: int):
        self.monitors, self.targets = monitors, targets  # side -> its monitor, its target
        any_monitor = next(iter(monitors.values()))
        self.score = any_monitor.score
        self.recent = {side: collections.deque(maxlen=window) for side in monitors}
        self.episodes = {side: 0 for side in monitors}

    @classmethod
    def build(cls, config, env_class, algorithm, context):
        """The run's score, where the env names one and the run can measure it: a solo run
        of an algorithm whose networks act (a population's members are judged by their
        returns, `python -m gpusim.evaluate` scores each); None else."""
        t, score = config.trainer, env_class.score
        if score is None:
            if t.score_opponents != type(t)().score_opponents or isinstance(t.target_score, dict):
                key = "score_opponents" if not isinstance(t.target_score, dict) else "target_score"
                raise GpusimError(f"config key 'trainer.{key}' sets up an env's score, and "
                                  f"{config.env_name} names none (its score is the training "
                                  "return: trainer.target_score takes a number)")
            return None
        if isinstance(t.target_score, (int, float)):
            raise GpusimError(f"config key 'trainer.target_score' names the sides of "
                              f"{config.env_name}'s score and their targets, e.g. "
                              f"{{{next(iter(score.sides))}: {t.target_score:g}}}; got a number")
        targets = dict(t.target_score or {next(iter(score.sides)): None})
        wanted = [side for side, target in targets.items() if target is not None]
        if wanted and (t.score_envs == 0 or t.population != 1):
            why = "trainer.score_envs is 0" if t.score_envs == 0 else \
                "a population's members are judged by their returns"
            raise GpusimError(f"config key 'trainer.target_score' is measured on "
                              f"{config.env_name}'s score, which this run never measures "
                              f"({why}): drop the target or measure the score")
        if t.score_envs == 0 or t.population != 1:
            return None
        models = algorithm.models()
        monitors = {side: ScoreMonitor(config, env_class, models, context,
                                       algorithm.precision.autocast, side, k)
                    for k, side in enumerate(targets)}
        return cls(monitors, targets, t.score_window)

    def play(self, iteration: int) -> dict:
        """This rank's chunks of evaluation steps, where `iteration` is due: per side, the
        values of its episodes that ended."""
        out = {}
        for side, monitor in self.monitors.items():
            if iteration % monitor.every == 0:
                monitor.advance()
            out[side] = monitor.finished()
        return out

    def extend(self, values: dict):
        for side, ended in values.items():
            self.recent[side].extend(ended)
            self.episodes[side] += len(ended)

    def value(self, side: str) -> float | None:
        recent = self.recent[side]
        return sum(recent) / len(recent) if recent else None

    def reached(self) -> bool:
        """Over a full window of episodes of each side, every target reached."""
        return all(len(self.recent[side]) == self.recent[side].maxlen
                   and self.score.reached(side, self.value(side), target)
                   for side, target in self.targets.items() if target is not None)

    def has_targets(self) -> bool:
        return any(target is not None for target in self.targets.values())

    def metrics(self, run_s: float) -> dict:
        out = {f"score/{self.score.name}/{side}": self.value(side) for side in self.monitors}
        out["score_episodes"] = min(self.episodes.values())
        out["time_share/score"] = sum(m.spent_s for m in self.monitors.values()) \
            / max(run_s, 1e-9)
        return out

    def summary(self) -> dict:
        return {"name": self.score.name,
                "sides": {side: {"value": self.value(side), "episodes": self.episodes[side],
                                 "target": self.targets[side],
                                 "better": self.score.sides[side]}
                          for side in self.monitors}}

    def state_dict(self) -> dict:
        return {"sides": {side: {"recent": list(self.recent[side]),
                                 "episodes": self.episodes[side],
                                 "monitor": monitor.state_dict()}
                          for side, monitor in self.monitors.items()}}

    def load_state_dict(self, state: dict):
        """A checkpoint's last episodes of each side, and the replicas where they were (one
        of run format 3 held its one side's under "": this run's one side; one of format 1
        kept no replicas: they restart)."""
        held = dict(state["sides"])
        if "" in held and len(self.monitors) == 1:
            held = {next(iter(self.monitors)): held.pop("")}
        for side, monitor in self.monitors.items():
            mine = held.get(side)
            if mine is None:  # (a side the checkpoint never measured: it starts now)
                continue
            self.recent[side].extend(mine["recent"])
            self.episodes[side] = mine["episodes"]
            if mine["monitor"] is not None:
                monitor.load_state_dict(mine["monitor"])


class ScoreMonitor:
    """Evaluation replicas of the training env, their scored side acting trained."""

    def __init__(self, config, env_class, models: dict, context, autocast, side: str,
                 index: int = 0):
        """Side `side`, the `index`-th measured: its replicas' streams apart from every
        other side's and rank's."""
        t, score = config.trainer, env_class.score
        self.score = score
        offset = SEED_OFFSET + (index * context.world_size + context.rank) * t.score_envs
        self.env = env_class(num_envs=t.score_envs, backend=context.backend, seed=t.seed,
                             config=config.env, env_offset=offset)
        self.side = score.side(self.env, side)
        self.tracker = score.tracker(self.env)
        self.opponents = opponents(env_class, self.env, self.side, t.score_opponents)
        self.actors = Actors(self.env, {self.side: models[self.side], **self.opponents})
        self.autocast = autocast
        self.every = t.score_every
        self.chunk = t.rollout_len
        capacity = t.score_envs * self.chunk  # at most one episode per replica per step
        self.values = torch.zeros(capacity + 1, device=self.env.device)  # the last: a bin
        self.count = torch.zeros((), dtype=torch.long, device=self.env.device)
        self.spent_s = 0.0
        self.obs = self.env.reset()

    @torch.no_grad()
    def advance(self):
        """One chunk of evaluation steps."""
        start = time.perf_counter()
        for _ in range(self.chunk):
            with self.autocast():
                self.actors.act(self.obs)
            self.obs, _, terminated, truncated, _ = self.env.step()
            done = terminated | truncated
            self.actors.episode_ended(done, self.env.agent_active())
            self._keep(self.tracker.after_step(done), done)
        self.env.backend.synchronize()
        self.spent_s += time.perf_counter() - start

    def _keep(self, value: torch.Tensor, done: torch.Tensor):
        """Append the values of the episodes that ended (`done`) to the device buffer: each
        to the next free place, the others to the bin at the end; no host read."""
        ended = done.long()
        place = self.count + torch.cumsum(ended, 0) - 1
        bin_ = self.values.shape[0] - 1
        place = torch.where(done & (place < bin_), place, bin_)
        self.values.scatter_(0, place, value.to(self.values.dtype))
        self.count += ended.sum()

    def state_dict(self) -> dict:
        """Where the evaluation replicas are: their state and streams, what each agent last
        observed, its episode so far and a recurrent policy's memory (on the CPU)."""
        tracker = getattr(self.tracker, "state_dict", dict)()
        return {"env": {k: v.cpu() for k, v in self.env.get_state(include_rng=True).items()},
                "obs": self.env.arrays["obs"].cpu(),
                "tracker": {k: v.cpu() for k, v in tracker.items()},
                "memory": {k: v.cpu() for k, v in self.actors.memory.items()}}

    def load_state_dict(self, state: dict):
        self.env.set_state(state["env"])
        self.env.arrays["obs"].copy_(state["obs"])
        if state["tracker"]:
            self.tracker.load_state_dict(state["tracker"])
        for name, memory in self.actors.memory.items():
            memory.copy_(state["memory"][name])

    def finished(self) -> list:
        """The values of the episodes that ended since the last call (one host read)."""
        count = min(int(self.count), self.values.shape[0] - 1)
        self.count.zero_()
        return self.values[:count].tolist()


def opponents(env_class, env, side: str, which: str) -> dict:
    """What the sides other than the scored one play: nothing given (uniformly random), or
    with `which` "scripted" the env's scripted policy of each (gpusim.scripted)."""
    if which == "random":
        return {}
    shipped = scripted_policies(env_class)
    others = [name for name in env.policy_specs if name != side]
    missing = [name for name in others if not shipped.get(name)]
    if missing:
        raise GpusimError(f"config key 'trainer.score_opponents' scripted: {env.name} ships no "
                          f"scripted {missing[0]} (the score's {side} plays against it); use "
                          "random")
    return {name: next(iter(shipped[name].values()))(env, name) for name in others}
