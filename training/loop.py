"""The run loop: iterations, metrics, checkpoints, signals and finite checks, for any algorithm.

Read top to bottom: `Trainer` builds this rank's env and the algorithm
`trainer.algorithm` names (training.algorithms), then `train` runs
iterations until the step budget or the target return: each iteration the
algorithm collects a rollout and updates its policies; the loop pools
finished episodes and loss statistics across ranks (so every rank logs the
same metrics and stops at the same iteration), stops on a non-finite loss
or parameter before anything of that iteration is kept, logs, and writes
checkpoints. SIGINT/SIGTERM stop it after the current iteration, with a
checkpoint.

With several processes (a DeviceContext with world_size > 1) each rank
steps its own replicas (replica ids offset by rank, so their RNG streams
differ); the algorithm keeps the ranks' models identical.
"""
from __future__ import annotations

import collections
import itertools
import math
import time

import torch

from gpusim.check.nonfinite import env_nonfinite_message
from gpusim.errors import GpusimError, NotEnoughMemory, describe
from gpusim.scale import distributed as dist
from gpusim.scale.device import DeviceContext

from .algorithms import algorithm_class
from .population import members as population
from .records import checkpoint, migrations
from .run_config import RunConfig
from .score_monitor import SCORE_KEY, RunScore
from .signals import Stopped, stop_requests
from .timing import SectionTimer
from .work import run_work

RECENT_EPISODES = 100
CHECKPOINT_KEYS = ("format", "iteration", "env_steps", "elapsed_s", "episodes",
                   "recent_returns", "score", "torch_rng", "lr", "lr_anchor", "num_iterations",
                   "algorithm", "ranks")


class Diverged(GpusimError):
    """A loss or a parameter became NaN or infinite: the run stops before logging it."""
    exit_code = 1  # not bad input: the run itself failed


class Trainer:
    def __init__(self, config: RunConfig, env_class, context: DeviceContext | None = None,
                 logger=None):
        """`context` gives the device, backend and rank (default: a lone process on
        `trainer.backend`); `logger` (rank 0's RunLogger, or None) receives metrics
        and checkpoints, and may be attached later (`attach_logger`)."""
        self.config = config
        t = config.trainer
        torch.manual_seed(t.seed)
        if context is None:
            context = DeviceContext()
            context.bind(t.backend, quiet=True, torch_threads=t.torch_threads)
        self.context = context
        self.distributed = context.world_size > 1
        self.rank = context.rank
        self.world_size = context.world_size
        members = population.members(t) if t.population != 1 else None  # a population's
        try:
            self.env = env_class(num_envs=t.num_envs * len(members or [1]),
                                 backend=context.backend, seed=t.seed, config=config.env,
                                 env_offset=context.replica_offset(t.num_envs))
        except NotEnoughMemory as exc:  # a population's replicas: name what made them many
            if members is None:
                raise
            raise NotEnoughMemory(f"{exc} (a population of {len(members)} (trainer.population) "
                                  f"x {t.num_envs} replicas): lower trainer.population "
                                  "or trainer.num_envs") from None
        if members is not None:
            population.seed_members(self.env, members, t.num_envs)
        self.timer = SectionTimer(self.env.device)
        self.algorithm = algorithm_class(t.algorithm, population=members is not None)(
            config, self.env, context, self.timer)
        context.fit_threads(run_work(config, self.env))
        self.logger = logger
        self.steps_per_iteration = t.steps_per_iteration * self.world_size  # all ranks
        self.num_iterations = t.num_iterations(self.world_size)
        # running state, all saved in checkpoints
        self.iteration = 0
        self.env_steps = 0
        self.elapsed_s = 0.0
        self.lr_anchor = (0, t.lr)  # see learning_rate
        self.last_lr = t.lr
        self.env.reset()
        self.recent = {name: collections.deque(maxlen=RECENT_EPISODES)
                       for name in self.algorithm.reported_names()}
        self.episodes = 0
        # the env's score against fixed opponents, where it names one (training.score_monitor)
        self.score = RunScore.build(config, env_class, self.algorithm, context)

    def attach_logger(self, logger):
        self.logger = logger

    # ---- one iteration ---------------------------------------------------------------
    def iterate(self, lr: float) -> dict:
        """A rollout, then an update of every policy: their statistics."""
        self.context.use_threads("rollout")
        self.algorithm.collect(self.env_steps)
        self.context.use_threads("update")
        with self.timer("update"):
            return self.algorithm.update(lr)

    def train(self):
        """Iterate to the end (or the target return); raises Stopped on SIGINT/SIGTERM."""
        # launched ranks leave the announcement to the launcher; rank 0 makes it otherwise
        with stop_requests(announce=self.rank == 0 and not dist.launched_here()) as stop:
            while self.iteration < self.num_iterations:
                stopping = self._train_one(stop["requested"])
                if stopping:
                    raise Stopped(self.iteration)
                if self.solved() or self.none_learning():
                    break
        return self.summary()

    def _train_one(self, stop_requested: bool) -> bool:
        """One iteration, logged and (when due) checkpointed; whether the run must stop."""
        start = time.perf_counter()
        self.timer.reset()
        lr = self.last_lr = self.learning_rate()
        stats = self.iterate(lr)
        finished = self.algorithm.episodes.finished()  # one host read per iteration
        if self.score is not None:
            finished[SCORE_KEY] = self.score.play(self.iteration)
        stats, stopping = self._share(finished, stats, stop_requested)
        self._check_finite(stats)  # before anything of this iteration is kept
        seconds = time.perf_counter() - start
        self.iteration += 1
        self.env_steps += self.steps_per_iteration
        self.elapsed_s += seconds
        self._finish_members()
        if self.logger is not None:  # (the line of a run's last iteration is always shown)
            self.logger.log(self.metrics(stats, seconds, lr),
                            last=self.solved() or self.none_learning() or stopping)
        if self.iteration % self.config.trainer.checkpoint_every == 0 or stopping \
                or self.solved() or self.none_learning() \
                or self.iteration == self.num_iterations:
            state = self.state_dict()  # collective: every rank takes part
            if self.logger is not None:
                self.logger.checkpoint(self.iteration, state)
        if self.logger is not None:  # trainer.keep_snapshots: networks kept over the run
            self.logger.snapshot(self.iteration, self.num_iterations,
                                 self.config.trainer.keep_snapshots, self.env_steps, self.algorithm)
        return stopping

    def _share(self, finished: dict, stats: dict, stop: bool = False) -> tuple[dict, bool]:
        """Pool every rank's finished episodes (in rank order), average the statistics, and
        agree to stop if any rank was asked to (so every rank stops after the same
        iteration)."""
        parts = dist.all_gather((finished, stats, stop)) if self.distributed \
            else [(finished, stats, stop)]
        for rank_finished, _, _ in parts:
            scored = rank_finished.pop(SCORE_KEY, None)
            if scored is not None:
                self.score.extend(scored)
            for name, returns in rank_finished.items():
                self.recent[name].extend(returns)
            self.episodes += len(next(iter(rank_finished.values()), []))
        return ({name: {key: sum(p[1][name][key] for p in parts) / len(parts) for key in values}
                 for name, values in stats.items()}, any(p[2] for p in parts))

    def learning_rate(self) -> float:
        """trainer.lr, or with anneal_lr falling linearly to 0 at the last iteration.

        The line starts at `lr_anchor` (iteration, lr): (0, lr) for a new run.
        A resumed run that was extended starts from the rate of its last
        iteration and anneals from there to the new end: the rate never goes
        back up.
        """
        t_cfg = self.config.trainer
        if not t_cfg.anneal_lr:
            return t_cfg.lr
        start, lr = self.lr_anchor
        return lr * max(0.0, 1 - (self.iteration - start) / max(1, self.num_iterations - start))

    def _check_finite(self, stats: dict):
        """Raise Diverged at the first non-finite statistic or parameter."""
        problem = None
        for name, values in stats.items():
            bad = [k for k, v in values.items() if not math.isfinite(v)]
            if bad:
                problem = f"policy '{name}' has a non-finite {bad[0]} ({values[bad[0]]})"
                break
        models = self.algorithm.models()
        if problem is None:
            params = {name: list(m.parameters()) for name, m in models.items()}
            finite = torch.stack([p.isfinite().all() for ps in params.values() for p in ps])
            if not bool(finite.all()):  # one host read per iteration
                index = int((~finite).nonzero()[0])
                ends = itertools.accumulate(len(ps) for ps in params.values())
                owner = next(name for name, end in zip(params, ends) if index < end)
                problem = f"policy '{owner}' has non-finite parameters"
        if problem is not None:
            source = env_nonfinite_message(self.env.name, *self.algorithm.rollout_outputs())
            if source is not None:  # the env's outputs, not the learning: say that first
                raise Diverged(f"training stopped at iteration {self.iteration + 1}: {source} "
                               f"(then {problem}); nothing of it was logged or checkpointed")
            raise Diverged(f"training diverged at iteration {self.iteration + 1}: {problem}; "
                           "it was neither logged nor checkpointed (the env's rewards and "
                           "observations were finite); lower trainer.lr")

    def solved(self) -> bool:
        """Whether every policy reached `target_return` over the last 100 finished episodes
        (a population: whether every member did, each stopping where it did)."""
        return all(self.algorithm.finished)

    def none_learning(self) -> bool:
        """Whether every member stopped learning (each reached the target, or a population's
        diverged): nothing is left to train."""
        return not any(self.algorithm.alive)

    def _reached(self, names) -> bool:
        """Whether every target set is reached: target_return by every policy's return,
        target_score by the env's score (an env without one: by every policy's return)."""
        t = self.config.trainer
        targets = [x for x in (t.target_return, t.target_score)
                   if x is not None and not isinstance(x, dict)]  # (a number: by the returns)
        scored = self.score is not None and self.score.has_targets()
        if not targets and not scored:
            return False
        returns = all(len(self.recent[name]) == RECENT_EPISODES
                      and self.recent_return(name) >= target
                      for target in targets for name in names)
        return returns and (not scored or self.score.reached())

    def _finish_members(self):
        """Members that reached the target stop learning (a solo run: it ends; a
        population's member stops as its solo run would), one by one."""
        names, count = self.algorithm.reported_names(), len(self.algorithm.alive)
        for k in range(count):  # (names: policy-major, members inside)
            if self._reached(names[k::count]):
                self.algorithm.finish(k, self.iteration)

    def metrics(self, stats: dict, seconds: float, lr: float) -> dict:
        steps = self.steps_per_iteration
        times = self.timer.totals()
        m = {"iteration": self.iteration, "env_steps": self.env_steps,
             "time_s": round(self.elapsed_s, 4), "env_steps_per_s": steps / seconds,
             "episodes": self.episodes, "lr": lr, "num_processes": self.world_size}
        for name, values in stats.items():
            m[f"episode_return/{name}"] = self.recent_return(name)
            for key, value in values.items():
                m[f"{key}/{name}"] = value
        if self.score is not None:
            m.update(self.score.metrics(self.elapsed_s))
        for section in ("env", "forward", "update"):
            m[f"time_share/{section}"] = times.get(section, 0.0) / seconds
        if "rollout" in times:  # a rollout replayed as one CUDA graph: env and forward in one
            m["time_share/rollout"] = times["rollout"] / seconds
        return m

    def recent_return(self, name):
        recent = self.recent[name]
        return sum(recent) / len(recent) if recent else None

    def summary(self) -> dict:
        out = {"iterations": self.iteration, "env_steps": self.env_steps,
               "time_s": self.elapsed_s, "episodes": self.episodes, "solved": self.solved(),
               "episode_return": {name: self.recent_return(name) for name in self.recent}}
        if self.score is not None:
            out["score"] = self.score.summary()
        if self.config.trainer.population != 1:  # per policy: each setting across its seeds
            members = population.members(self.config.trainer)
            out["population"] = {name: population.summary(members, {
                m.name: self.recent_return(f"{name}/{m.name}") for m in members})
                for name in self.env.policy_specs}
        return out

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict | None:
        """The whole run's state on rank 0 (each rank's replicas included); None elsewhere.

        With several ranks this is a collective: every rank must call it.
        """
        own = self._rank_state()
        ranks = dist.gather_to_main(own) if self.distributed else [own]
        if self.rank != 0:
            return None
        return {
            **migrations.record(),
            "iteration": self.iteration, "env_steps": self.env_steps,
            "elapsed_s": self.elapsed_s, "episodes": self.episodes,
            "recent_returns": {k: list(v) for k, v in self.recent.items()},
            "score": None if self.score is None else self.score.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "lr": self.last_lr, "lr_anchor": list(self.lr_anchor),
            "num_iterations": self.num_iterations,
            "algorithm": self.algorithm.state_dict(),
            "ranks": ranks,
        }

    def _rank_state(self) -> dict:
        """What is this process's own: its replicas' state and the algorithm's own part."""
        env = self.env
        return {"env_state": {k: v.cpu() for k, v in env.get_state(include_rng=True).items()},
                "next_obs": env.arrays["obs"].cpu(),
                "episode_return": self.algorithm.episodes.running.cpu(),
                "algorithm": checkpoint.to_cpu(self.algorithm.rank_state_dict())}

    def _load_rank_state(self, own: dict):
        self.env.set_state(own["env_state"])
        self.env.arrays["obs"].copy_(own["next_obs"])
        self.algorithm.episodes.running.copy_(own["episode_return"])
        self.algorithm.load_rank_state_dict(own["algorithm"])

    def load_state_dict(self, state: dict):
        """Continue from a checkpoint; one that does not fit this run is a GpusimError."""
        if isinstance(state, dict) and "population_member" in state:
            held = state["population_member"]
            raise GpusimError(f"this run directory holds population member {held.get('member')}"
                              f"'s trained networks only (written by evaluate for "
                              f"{held.get('run')}), no training state: it cannot resume; "
                              "start a new run with its config")
        if not isinstance(state, dict) or state.get("format") != migrations.FORMAT:
            raise GpusimError("the checkpoint is not in this gpusim's run format (read it with "
                              "training.records.checkpoint.load_latest, which upgrades it)")
        missing = [k for k in CHECKPOINT_KEYS if k not in state]
        if missing:
            raise GpusimError(f"the checkpoint lacks {', '.join(missing)}: it is damaged")
        ranks = state["ranks"]
        if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
            raise GpusimError("the checkpoint's per-process state is damaged (not a list)")
        if len(ranks) != self.world_size:
            raise GpusimError(f"the checkpoint holds {len(ranks)} processes' replicas; "
                              f"resume it with {len(ranks)} processes, not {self.world_size}")
        algorithm = state["algorithm"] if isinstance(state["algorithm"], dict) else {}
        held, count = len(algorithm.get("alive", [None])), len(self.algorithm.alive)
        if held != count:
            raise GpusimError(f"the checkpoint holds a population of {held} member"
                              f"{'s' if held != 1 else ''}; this run's trainer.population "
                              f"makes {count}: resume it with the population it was written "
                              "with")
        held = state["recent_returns"]
        absent = [name for name in self.recent if name not in held]
        if absent:
            raise GpusimError(f"the checkpoint's recent_returns have no policy {absent[0]!r} "
                              f"(it holds {', '.join(map(repr, held)) or 'none'})")
        try:
            self.algorithm.load_state_dict(state["algorithm"])
            self._load_rank_state(ranks[self.rank])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            raise GpusimError(f"the checkpoint does not fit this run ({describe(exc)[:160]}); "
                              "was the env, policy or trainer config changed?") from None
        torch.set_rng_state(state["torch_rng"])
        self.iteration = state["iteration"]
        self.env_steps = state["env_steps"]
        self.elapsed_s = state["elapsed_s"]
        self.episodes = state["episodes"]
        for name in self.recent:
            self.recent[name].extend(state["recent_returns"][name])
        if self.score is not None:
            self.score.load_state_dict(state["score"])
        self.lr_anchor = tuple(state["lr_anchor"])
        if state["num_iterations"] != self.num_iterations:
            # extended (or shortened) with --total_steps: anneal on from the rate its
            # last iteration used
            self.lr_anchor = (self.iteration, state["lr"])
