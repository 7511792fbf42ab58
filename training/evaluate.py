"""Evaluate policies on full episodes: a trained run's, or the uniform-random baseline."""
from __future__ import annotations

from pathlib import Path

import torch

from gpusim.sampler import ActionSampler

from . import checkpoint
from .config import load_run_dir_config
from .models import ActorCritic


def load_policies(run_dir, env):
    """The models of a run's latest checkpoint, one per policy, on the env's device."""
    state = checkpoint.load_latest(Path(run_dir) / "checkpoints")
    _, config = load_run_dir_config(run_dir)
    models = {}
    for name in env.policies:
        model = ActorCritic(env.obs_dim, env.action_nvec, config.policy.hidden_sizes,
                            config.policy.activation).to(env.device)
        model.load_state_dict(state["models"][name])
        models[name] = model.eval()
    return models


@torch.no_grad()
def episode_returns(env, models=None, num_episodes: int = 64, argmax: bool = False) -> dict:
    """Mean per-agent episode return of each policy over `num_episodes` finished episodes.

    With `models=None` every agent acts uniformly at random.
    """
    sampler = ActionSampler(env)
    probs = torch.ones((env.num_envs, env.num_agents, sum(env.action_nvec)), device=env.device)
    index = {name: torch.tensor(ids, device=env.device) for name, ids in env.policies.items()}
    obs = env.reset()
    running = torch.zeros((env.num_envs, env.num_agents), device=env.device)
    finished = {name: [] for name in env.policies}
    while len(next(iter(finished.values()))) < num_episodes:
        if models is not None:
            for name, model in models.items():
                probs[:, index[name]] = torch.cat(model.log_probs(obs[:, index[name]]), -1).exp()
        obs, reward, terminated, truncated, _ = env.step(sampler.sample(probs, argmax=argmax))
        running += reward
        done = terminated | truncated
        if bool(done.any()):  # evaluation may sync; the training rollout never does
            rows = running[done]
            for name in env.policies:
                finished[name] += rows[:, index[name]].mean(1).tolist()
            running[done] = 0
    return {name: sum(v[:num_episodes]) / num_episodes for name, v in finished.items()}
