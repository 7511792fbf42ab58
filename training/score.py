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
    """A run's score: its monitor, and the last `score_window` episodes of every rank."""

    def __init__(self, monitor, window: int):
        self.monitor, self.name = monitor, f"{monitor.score.name}/{monitor.side}"
        self.recent = collections.deque(maxlen=window)
        self.episodes = 0

    @classmethod
    def build(cls, config, env_class, algorithm, context):
        monitor = ScoreMonitor.build(config, env_class, algorithm, context)
        return None if monitor is None else cls(monitor, config.trainer.score_window)

    def play(self, iteration: int) -> list:
        """This rank's chunk of evaluation steps, where `iteration` is due: the values of
        its episodes that ended."""
        if iteration % self.monitor.every == 0:
            self.monitor.advance()
        return self.monitor.finished()

    def extend(self, values: list):
        self.recent.extend(values)
        self.episodes += len(values)

    def value(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def reached(self, target: float) -> bool:
        """Over a full window of episodes, the score at `target` or beyond it."""
        return len(self.recent) == self.recent.maxlen and \
            self.monitor.score.reached(self.monitor.side, self.value(), target)

    def metrics(self, run_s: float) -> dict:
        return {f"score/{self.name}": self.value(), "score_episodes": self.episodes,
                "time_share/score": self.monitor.spent_s / max(run_s, 1e-9)}

    def summary(self) -> dict:
        score, side = self.monitor.score, self.monitor.side
        return {"name": score.name, "side": side, "value": self.value(),
                "episodes": self.episodes, "better": score.sides[side]}

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "episodes": self.episodes,
                "monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: dict):
        """A checkpoint's last episodes and the replicas where they were (a checkpoint of
        run format 1 kept no replicas: they restart)."""
        self.recent.extend(state["recent"])
        self.episodes = state["episodes"]
        if state["monitor"] is not None:
            self.monitor.load_state_dict(state["monitor"])


class ScoreMonitor:
    """Evaluation replicas of the training env, their scored side acting trained."""

    def __init__(self, config, env_class, models: dict, context, autocast):
        t, score = config.trainer, env_class.score
        self.score = score
        self.env = env_class(num_envs=t.score_envs, backend=context.backend, seed=t.seed,
                             config=config.env,
                             env_offset=SEED_OFFSET + context.rank * t.score_envs)
        self.side = score.side(self.env, t.score_policy)
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

    @classmethod
    def build(cls, config, env_class, algorithm, context):
        """A monitor where the env names a score and the run can measure it: a solo run
        of an algorithm whose networks act (a population's members are judged by their
        returns, `python -m gpusim.evaluate` scores each)."""
        t = config.trainer
        if env_class.score is None:
            for key in ("score_policy", "score_opponents"):
                if getattr(t, key) != getattr(type(t)(), key):
                    raise GpusimError(f"config key 'trainer.{key}' sets up an env's score, and "
                                      f"{config.env_name} names none (its score is the "
                                      "training return)")
            return None
        if t.target_score is not None and (t.score_envs == 0 or t.population != 1):
            why = "trainer.score_envs is 0" if t.score_envs == 0 else \
                "a population's members are judged by their returns"
            raise GpusimError(f"config key 'trainer.target_score' is measured on "
                              f"{config.env_name}'s score, which this run never measures "
                              f"({why}): drop the target or measure the score")
        if t.score_envs == 0 or t.population != 1:
            return None
        return cls(config, env_class, algorithm.models(), context,
                   algorithm.precision.autocast)

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
                          f"scripted {missing[0]} (trainer.score_policy {side} plays against "
                          "it); use random")
    return {name: next(iter(shipped[name].values()))(env, name) for name in others}
