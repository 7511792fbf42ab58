"""Evaluate a run on full episodes: every pairing of trained and uniform-random policies.

    python -m gpusim.evaluate RUN_DIR --episodes 64

For each subset of the run's policies, those policies act with the trained
models of the run's latest checkpoint and the others uniformly at random
(for tag_continuous: trained vs trained, trained taggers vs random runners,
random taggers vs trained runners, random vs random). Per pairing it prints
each policy's mean episode return with a 95% confidence interval, and the
env's own measures where it has them (tag_continuous: how long runners
survive and how many are still free at the end). The figures also go to
RUN_DIR/eval.json.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import torch

from gpusim.errors import GpusimError, writing
from gpusim.sampler import ActionSampler

from . import checkpoint
from .arguments import ArgumentParser, int_in
from .config import OFF_POLICY, load_run_dir_config
from .models import make_model
from .offpolicy import OffPolicyModel

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


def load_policies(run_dir, env) -> dict:
    """The models of a run's latest checkpoint, one per policy, on the env's device."""
    state = checkpoint.load_latest(Path(run_dir) / "checkpoints")
    _, config = load_run_dir_config(run_dir)
    models = {}
    for name, spec in env.policy_specs.items():
        t = config.trainer
        model = OffPolicyModel(spec, config.policy, t.algorithm, t.sac_alpha) \
            if t.algorithm in OFF_POLICY else make_model(spec, config.policy)
        model.to(env.device).load_state_dict(state["models"][name])
        models[name] = model.eval()
    return models


class Actors:
    """Every agent's actions: drawn from its policy's model, or uniformly at random where
    the policy has none. Discrete actions come from one sampler launch for all agents;
    with `argmax`, trained policies act greedily (the most likely choice, the Gaussian's
    mean). Returns what env.step takes."""

    def __init__(self, env, models: dict):
        self.env = env
        self.models = models
        self.specs = env.policy_specs
        self.sampler = ActionSampler(env) if env.discrete_width else None
        if self.sampler is not None:
            self.probs = torch.ones((env.num_envs, env.num_agents, self.sampler.width),
                                    device=env.device)
        self.index = {name: torch.tensor(spec.agent_ids, device=env.device)
                      for name, spec in self.specs.items()}

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, argmax: bool = False):
        actions = {}
        for name, spec in self.specs.items():
            rows, model = self.index[name], self.models.get(name)
            own = obs[:, rows, :spec.obs_dim]
            if spec.continuous:
                actions[name] = self._continuous(spec, model, own, argmax)
            elif model is not None:
                self.probs[:, rows, :sum(spec.actions)] = torch.cat(model.log_probs(own), -1).exp()
        if self.sampler is None:
            return actions
        chosen = self.sampler.sample(self.probs, argmax=argmax)
        if not (self.env.mixed_actions or self.env.continuous_dim):
            return chosen
        actions.update({name: chosen[:, self.index[name], :spec.action_width]
                        for name, spec in self.specs.items() if not spec.continuous})
        return actions

    def _continuous(self, spec, model, obs, argmax):
        if model is None:  # uniform within the bounds
            low = torch.tensor(spec.actions.low, device=obs.device)
            high = torch.tensor(spec.actions.high, device=obs.device)
            return low + torch.rand(obs.shape[:2] + (spec.action_width,),
                                    device=obs.device) * (high - low)
        raw, _, _ = model.act(obs, deterministic=argmax)
        return model.squash(raw)


@torch.no_grad()
def play(env, models: dict, num_episodes: int, argmax: bool = False) -> dict:
    """Full episodes with `models` (policy name -> model; a policy without one acts
    uniformly at random): per policy the list of episode returns (the mean over its
    agents), and the env's own measures (`env.episode_measures()`), per episode."""
    actors = Actors(env, models)
    index = actors.index
    measures = env.episode_measures()
    obs = env.reset()
    running = torch.zeros((env.num_envs, env.num_agents), device=env.device)
    returns = {name: [] for name in env.policies}
    while len(next(iter(returns.values()))) < num_episodes:
        obs, reward, terminated, truncated, _ = env.step(actors(obs, argmax))
        running += reward
        done = terminated | truncated
        if measures is not None:
            measures.after_step(done)
        if bool(done.any()):  # evaluation may sync; the training rollout never does
            rows = running[done]
            for name in env.policies:
                returns[name] += rows[:, index[name]].mean(1).tolist()
            running[done] = 0
    out = {f"return/{name}": values[:num_episodes] for name, values in returns.items()}
    if measures is not None:
        out.update({key: values[:num_episodes] for key, values in measures.per_episode().items()})
    return out


def episode_returns(env, models=None, num_episodes: int = 64, argmax: bool = False) -> dict:
    """Mean per-agent episode return of each policy (all random with `models=None`)."""
    played = play(env, models or {}, num_episodes, argmax)
    return {name: sum(played[f"return/{name}"]) / num_episodes for name in env.policies}


def pairings(policies) -> list:
    """Every subset of `policies` that acts trained (the rest random), all-trained first."""
    names = list(policies)
    subsets = [c for k in range(len(names), -1, -1) for c in itertools.combinations(names, k)]
    return [tuple(s) for s in subsets]


def label(trained: tuple, policies) -> str:
    return ", ".join(f"{name} {'trained' if name in trained else 'random'}" for name in policies)


def evaluate(run_dir, num_episodes: int = 64, num_envs: int | None = None, seed: int = 12345,
             log=print) -> dict:
    """Every pairing of the run, summarised (mean, 95% CI) and written to RUN_DIR/eval.json."""
    run_dir = Path(run_dir)
    cls, config = load_run_dir_config(run_dir)
    backend = "cpu" if config.trainer.backend == "auto" and not torch.cuda.is_available() \
        else config.trainer.backend
    env = cls(num_envs=num_envs or min(config.trainer.num_envs, num_episodes), backend=backend,
              seed=seed, config=config.env)
    models = load_policies(run_dir, env)
    results = {}
    log(f"{run_dir.name}: {num_episodes} episodes per pairing, {env.num_envs} replicas, "
        f"seed {seed}; mean and 95% confidence interval")
    for trained in pairings(env.policies):
        played = play(env, {name: models[name] for name in trained}, num_episodes)
        summary = {key: dict(zip(("mean", "ci95"), mean_ci(values)))
                   for key, values in played.items()}
        name = label(trained, env.policies)
        results[name] = summary
        log(f"  {name}:")
        for key, value in summary.items():
            log(f"    {key:<28} {value['mean']:10.3f} +- {value['ci95']:.3f}")
    with writing(run_dir / "eval.json"):
        (run_dir / "eval.json").write_text(json.dumps(
            {"episodes": num_episodes, "seed": seed, "pairings": results}, indent=1))
    return results


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run directory written by python -m gpusim.train")
    parser.add_argument("--episodes", type=int_in(2), default=64,
                        help="episodes per pairing (a confidence interval needs two)")
    parser.add_argument("--num_envs", type=int_in(1), help="replicas stepped at once")
    parser.add_argument("--seed", type=int_in(0, 2**64 - 1), default=12345)
    args = parser.parse_args(argv)
    try:
        evaluate(args.run_dir, args.episodes, args.num_envs, args.seed)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
