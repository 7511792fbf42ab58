"""Evaluate a run on full episodes: every pairing of trained and uniform-random policies.

    python -m gpusim.evaluate RUN_DIR --episodes 64

For each subset of the run's policies, those policies act with the trained
models of the run's latest checkpoint and the others uniformly at random
(for tag_continuous: trained vs trained, trained taggers vs random runners,
random taggers vs trained runners, random vs random). Per pairing it prints
each policy's mean episode return with a 95% confidence interval, and the
env's own measures where it has them (tag_continuous: how long runners
survive and how many are still free at the end). The figures also go to
RUN_DIR/eval.json (with --opponents scripted: RUN_DIR/eval_scripted.json).

A population run (`trainer.population`) is evaluated member by member, every
policy trained, with each setting's mean over its seeds (a 95% bootstrap
interval) and interquartile mean; --population_best keeps the best member as
a plain run directory, RUN_DIR/best_member, for render, evaluate and export.

With --deterministic the trained policies act deterministically (the most
likely choice, the Gaussian's mean; random ones stay random), as
`gpusim.load_policies(...)[name].act(obs, deterministic=True)` acts in other
clients. With --trained_only only the first pairing is played, every policy
trained: a cooperative env's policies on their own, with no random partner.
With --opponents scripted the policies not trained play the env's scripted policy
where it ships one (gpusim.scripted: simple_tag's and tag_continuous's chaser and
fleer), uniformly random ones elsewhere: a fixed yardstick that is not as weak as random.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import torch

from gpusim.arguments import ArgumentParser, int_in
from gpusim.errors import GpusimError, writing
from gpusim.scripted import scripted_policies

from ..actors import Actors
from ..run_config import load_run_dir_config
from . import member_runs as members
from . import policies as trained

Z95 = 1.96  # normal quantile of a two-sided 95% interval


def mean_ci(values) -> tuple[float, float]:
    """(mean, half-width of its 95% confidence interval) of per-episode values."""
    values = list(values)
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("inf")
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, Z95 * math.sqrt(variance / n)


def load_policies(run_dir, env, member=None) -> dict:
    """The trained policies of a run's latest checkpoint (a population's: member `member`,
    default its best), one per policy, on the env's device: their acting networks, as
    training.actors acts with them."""
    return {name: policy.model for name, policy in
            trained.load_policies(run_dir, env.device, member).items()}


class Greedy:
    """A policy acting deterministically whatever the actors ask: its most likely choice
    (every other choice at log-probability -inf, so the sampler can draw only that one),
    or its deterministic action. Random policies in the same step keep drawing."""

    def __init__(self, model, spec):
        self.model, self.state_size = model, getattr(model, "state_size", 0)
        self.nvec = None if spec.continuous else tuple(spec.actions)

    def sample(self, obs, deterministic=False, *state):
        return self.model.sample(obs, True, *state)

    def log_probs(self, obs, mask=None, *state):
        out = self.model.log_probs(obs, mask, *state)
        log_probs = out[0] if state else out
        parts = [torch.full_like(p, float("-inf")).scatter_(-1, p.argmax(-1, keepdim=True), 0.0)
                 for p in torch.split(log_probs, self.nvec, -1)]
        one_hot = torch.cat(parts, -1)
        return (one_hot, out[-1]) if state else one_hot


@torch.no_grad()
def play(env, policies: dict, num_episodes: int, argmax: bool = False) -> dict:
    """Full episodes with `policies` (policy name -> trained policy; a policy without one
    acts uniformly at random): per policy the list of episode returns (the mean over its
    agents), and the env's own measures (`env.episode_measures()`), per episode.

    Which episodes count is fixed before any ends: replica e's first `quota[e]`, dealt
    round-robin. Counting the first `num_episodes` to end instead would favour short
    episodes (a replica would add a second short one before another ends a long one)."""
    measures = env.episode_measures()
    quota = torch.full((env.num_envs,), num_episodes // env.num_envs, device=env.device)
    quota[:num_episodes % env.num_envs] += 1
    returns, _, kept = play_counted(env, policies, quota, argmax, measures)
    out = {f"return/{name}": values for name, values in returns.items()}
    if measures is not None:
        out.update({key: [v for v, k in zip(values, kept) if k]
                    for key, values in measures.per_episode().items()})
    return out


def play_counted(env, policies: dict, quota: torch.Tensor, argmax: bool = False,
                 measures=None) -> tuple:
    """Replica e's first `quota[e]` episodes played to their ends: per policy the counted
    episodes' returns in the order they ended, the (replica, episode number) of each, and
    per episode ended (the order `measures` records them) whether it counts."""
    actors = Actors(env, policies)
    index = actors.agents
    obs = env.reset()
    running = torch.zeros((env.num_envs, env.num_agents), device=env.device)
    ended = torch.zeros_like(quota)
    returns = {name: [] for name in env.policies}
    where, kept = [], []
    left = int(quota.sum())
    while left > 0:
        actors.act(obs, deterministic=argmax)
        obs, reward, terminated, truncated, _ = env.step()
        running += reward
        done = terminated | truncated
        actors.episode_ended(done, env.agent_active())
        if measures is not None:
            measures.after_step(done)
        if bool(done.any()):  # evaluation may sync; the training rollout never does
            ids = done.nonzero()[:, 0]
            keep = ended[ids] < quota[ids]
            counted = ids[keep]
            kept += keep.tolist()
            where += zip(counted.tolist(), ended[counted].tolist())
            for name in env.policies:
                returns[name] += running[counted][:, index[name]].mean(1).tolist()
            left -= len(counted)
            ended[ids] += 1
            running[ids] = 0
    return returns, where, kept


def episode_returns(env, models=None, num_episodes: int = 64, argmax: bool = False) -> dict:
    """Mean per-agent episode return of each policy (all random with `models=None`)."""
    played = play(env, models or {}, num_episodes, argmax)
    return {name: sum(played[f"return/{name}"]) / num_episodes for name in env.policies}


def pairings(policies) -> list:
    """Every subset of `policies` that acts trained (the rest random), all-trained first."""
    names = list(policies)
    subsets = [c for k in range(len(names), -1, -1) for c in itertools.combinations(names, k)]
    return [tuple(s) for s in subsets]


def label(trained: tuple, policies, others: dict | None = None) -> str:
    """`others`: policy name -> the label of what the untrained one plays (default random)."""
    others = others or {}
    return ", ".join(f"{name} {'trained' if name in trained else others.get(name, 'random')}"
                     for name in policies)


def opponents_of(cls, env, which: str) -> dict:
    """Policy name -> (label, acting policy) of what an untrained policy plays instead of
    uniformly random actions: with `which` "scripted", the env's first scripted policy."""
    if which == "random":
        return {}
    shipped = scripted_policies(cls)
    if not shipped:
        raise GpusimError(f"--opponents scripted: {env.name} ships no scripted policies "
                          "(simple_tag and tag_continuous do)")
    return {name: (f"scripted {label}", make(env, name))
            for name, options in shipped.items() if name in env.policies
            for label, make in list(options.items())[:1]}


def evaluate(run_dir, num_episodes: int = 64, num_envs: int | None = None, seed: int = 12345,
             log=print, deterministic: bool = False, trained_only: bool = False,
             opponents: str = "random") -> dict:
    """Every pairing of the run (`trained_only`: the all-trained one), summarised (mean, 95%
    CI) and written to RUN_DIR/eval.json; `deterministic`: trained policies act so;
    `opponents` "scripted": untrained policies play the env's scripted ones."""
    run_dir = Path(run_dir)
    cls, config = load_run_dir_config(run_dir)
    backend = "cpu" if config.trainer.backend == "auto" and not torch.cuda.is_available() \
        else config.trainer.backend
    env = cls(num_envs=num_envs or min(config.trainer.num_envs, num_episodes), backend=backend,
              seed=seed, config=config.env)
    models = load_policies(run_dir, env)
    others = opponents_of(cls, env, opponents)
    if deterministic:
        models = {name: Greedy(model, env.policy_specs[name]) for name, model in models.items()}
    results = {}
    acting = "deterministic" if deterministic else "sampled"
    log(f"{run_dir.name}: {num_episodes} episodes per pairing, {env.num_envs} replicas, "
        f"seed {seed}, {acting} actions; mean and 95% confidence interval")
    for trained in pairings(env.policies)[:1 if trained_only else None]:
        acting = {name: models[name] if name in trained else others[name][1]
                  for name in env.policies if name in trained or name in others}
        played = play(env, acting, num_episodes)
        summary = {key: dict(zip(("mean", "ci95"), mean_ci(values)))
                   for key, values in played.items()}
        name = label(trained, env.policies, {n: others[n][0] for n in others})
        results[name] = summary
        log(f"  {name}:")
        for key, value in summary.items():
            log(f"    {key:<28} {value['mean']:10.3f} +- {value['ci95']:.3f}")
    out = run_dir / ("eval.json" if opponents == "random" else f"eval_{opponents}.json")
    with writing(out):
        out.write_text(json.dumps(
            {"episodes": num_episodes, "seed": seed, "deterministic": deterministic,
             "opponents": opponents, "pairings": results}, indent=1))
    return results


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run directory written by python -m gpusim.train")
    parser.add_argument("--episodes", type=int_in(2), default=64,
                        help="episodes per pairing (a confidence interval needs two)")
    parser.add_argument("--num_envs", type=int_in(1), help="replicas stepped at once")
    parser.add_argument("--seed", type=int_in(0, 2**64 - 1), default=12345)
    parser.add_argument("--deterministic", action="store_true",
                        help="trained policies take their most likely action (random ones "
                             "stay random)")
    parser.add_argument("--trained_only", action="store_true",
                        help="only every policy trained, no random partner or opponent")
    parser.add_argument("--opponents", choices=("random", "scripted"), default="random",
                        help="what the policies not trained play: uniformly random actions, "
                             "or the env's scripted policies (a chaser, a fleer)")
    parser.add_argument("--population_best", action="store_true",
                        help="a population run: also keep its best member as a plain run "
                             "directory, RUN_DIR/best_member")
    args = parser.parse_args(argv)
    try:
        if members.is_population(args.run_dir):
            members.evaluate_members(args.run_dir, evaluate, best=args.population_best,
                                     num_episodes=args.episodes, num_envs=args.num_envs,
                                     seed=args.seed, deterministic=args.deterministic)
            return 0
        if args.population_best:
            raise GpusimError(f"--population_best: {args.run_dir} is not a population run")
        evaluate(args.run_dir, args.episodes, args.num_envs, args.seed,
                 deterministic=args.deterministic, trained_only=args.trained_only,
                 opponents=args.opponents)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
