"""PPO (and A2C, its one-step special case) on device-resident rollouts.

Read top to bottom: `Trainer.train` alternates `collect` (a rollout of
`rollout_len` steps over all replicas, under no_grad, actions sampled on the
device, no host sync per step) and `update` (per policy: GAE, then epochs of
shuffled minibatches of the clipped PPO loss). Each policy in `env.policies`
has its own model and optimizer, shared by all of its agents.

With several processes (`distributed=True`) each rank steps its own
replicas (replica ids offset by rank, so their RNG streams differ), the
models are wrapped in DistributedDataParallel so gradients are averaged,
and finished episodes and loss statistics are shared once per iteration,
so every rank logs the same metrics and stops at the same iteration.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import torch

from gpusim import ActionSampler
from gpusim import distributed as dist
from gpusim.errors import GpusimError

from . import losses
from .config import RunConfig
from .models import ActorCritic
from .timing import SectionTimer

RECENT_EPISODES = 100


@dataclass
class PolicyGroup:
    """One policy: its agents (a slice when contiguous, else an index tensor), model, optimizer."""
    name: str
    agents: object
    num_agents: int
    model: ActorCritic
    optimizer: torch.optim.Optimizer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper


def agent_index(ids, device):
    ids = sorted(ids)
    if ids == list(range(ids[0], ids[-1] + 1)):
        return slice(ids[0], ids[-1] + 1)  # a view, no copy
    return torch.tensor(ids, dtype=torch.long, device=device)


class RolloutBuffer:
    """(rollout_len, num_envs, num_agents, ...) tensors on the env's device."""

    def __init__(self, env, rollout_len: int, num_groups: int):
        shape = (rollout_len, env.num_envs, env.num_agents)
        device = env.device
        self.obs = torch.zeros(shape + (env.obs_dim,), device=device)
        self.actions = torch.zeros(shape + (len(env.action_nvec),), dtype=torch.int32,
                                   device=device)
        self.log_probs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape[:2], dtype=torch.bool, device=device)
        # per policy, the mean return of its agents in episodes that ended at step t
        self.episode_returns = torch.zeros((rollout_len, num_groups, env.num_envs), device=device)


class Trainer:
    def __init__(self, config: RunConfig, env_class, logger=None, backend=None,
                 distributed: bool = False):
        self.config = config
        t = config.trainer
        if t.torch_threads:
            torch.set_num_threads(t.torch_threads)
        torch.manual_seed(t.seed)
        self.distributed = distributed and dist.world_size() > 1
        self.rank = dist.rank() if self.distributed else 0
        self.world_size = dist.world_size() if self.distributed else 1
        self.env = env_class(num_envs=t.num_envs, backend=backend or t.backend, seed=t.seed,
                             config=config.env, env_offset=self.rank * t.num_envs)
        env = self.env
        self.sampler = ActionSampler(env)
        self.groups = []
        for name, ids in env.policies.items():
            model = ActorCritic(env.obs_dim, env.action_nvec, config.policy.hidden_sizes,
                                config.policy.activation).to(env.device)
            optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, eps=1e-5)
            self.groups.append(PolicyGroup(name, agent_index(ids, env.device), len(ids),
                                           model, optimizer, self._wrap(model)))
        self.buffer = RolloutBuffer(env, t.rollout_len, len(self.groups))
        self.probs = torch.zeros((env.num_envs, env.num_agents, sum(env.action_nvec)),
                                 device=env.device)
        self.bootstrap = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self.shuffle = torch.Generator().manual_seed(t.seed)
        self.timer = SectionTimer(env.device)
        self.logger = logger
        self.steps_per_iteration = t.steps_per_iteration * self.world_size  # all ranks
        self.num_iterations = max(1, t.total_steps // self.steps_per_iteration)
        # running state, all saved in checkpoints
        self.iteration = 0
        self.env_steps = 0
        self.elapsed_s = 0.0
        self.next_obs = env.reset().clone()
        self.episode_return = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self.recent = {g.name: collections.deque(maxlen=RECENT_EPISODES) for g in self.groups}
        self.episodes = 0
        self.finished = {}

    def _wrap(self, model):
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel
        device = self.env.device
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)  # copies rank 0's weights

    # ---- rollout -------------------------------------------------------------------
    @torch.no_grad()
    def collect(self):
        t_cfg, buf, env = self.config.trainer, self.buffer, self.env
        for t in range(t_cfg.rollout_len):
            with self.timer("forward"):
                buf.obs[t].copy_(self.next_obs)
                log_probs = {}
                for g in self.groups:
                    obs = self.next_obs[:, g.agents]
                    log_probs[g.name] = g.model.log_probs(obs)
                    self.probs[:, g.agents] = torch.cat(log_probs[g.name], -1).exp()
                    buf.values[t][:, g.agents] = g.model.value(obs)
                actions = self.sampler.sample(self.probs)
                buf.actions[t].copy_(actions)
                for g in self.groups:
                    chosen = actions[:, g.agents].long()
                    buf.log_probs[t][:, g.agents] = sum(
                        lp.gather(-1, chosen[..., c:c + 1]).squeeze(-1)
                        for c, lp in enumerate(log_probs[g.name]))
            with self.timer("env"):
                obs, reward, terminated, truncated, info = env.step(actions)
            with self.timer("forward"):
                # Truncation is not failure: bootstrap the value of the final observation.
                for g in self.groups:
                    self.bootstrap[:, g.agents] = g.model.value(info["final_obs"][:, g.agents])
                keep = truncated.unsqueeze(1).to(reward.dtype)
                buf.rewards[t] = reward + t_cfg.gamma * self.bootstrap * keep
                done = terminated | truncated
                buf.dones[t] = done
                self.episode_return += reward
                for k, g in enumerate(self.groups):
                    buf.episode_returns[t, k] = self.episode_return[:, g.agents].mean(1)
                self.episode_return *= (~done).unsqueeze(1).to(reward.dtype)
                self.next_obs.copy_(obs)
        self.finished = self._finished_episodes()

    def _finished_episodes(self) -> dict:
        """One host read per iteration: per policy, returns of the episodes that just ended."""
        dones = self.buffer.dones.cpu()
        returns = self.buffer.episode_returns.cpu()
        return {g.name: returns[:, k][dones].tolist() for k, g in enumerate(self.groups)}

    def _share(self, group_stats: dict) -> dict:
        """Pool every rank's finished episodes (in rank order) and average the loss stats."""
        parts = dist.all_gather((self.finished, group_stats)) if self.distributed \
            else [(self.finished, group_stats)]
        for finished, _ in parts:
            for name, returns in finished.items():
                self.recent[name].extend(returns)
            self.episodes += len(next(iter(finished.values()), []))
        return {name: {key: sum(p[1][name][key] for p in parts) / len(parts) for key in stats}
                for name, stats in group_stats.items()}

    # ---- update --------------------------------------------------------------------
    def update(self, group: PolicyGroup, lr: float) -> dict:
        t_cfg, buf = self.config.trainer, self.buffer
        for param_group in group.optimizer.param_groups:
            param_group["lr"] = lr
        model = group.model
        with torch.no_grad():
            next_value = model.value(self.next_obs[:, group.agents])
            dones = buf.dones.unsqueeze(-1).expand(-1, -1, group.num_agents)
            advantages, returns = losses.gae(buf.rewards[:, :, group.agents],
                                             buf.values[:, :, group.agents], dones, next_value,
                                             t_cfg.gamma, t_cfg.gae_lambda)
        def flat(x):  # (T, E, n, ...) -> (T * E * n, ...)
            return x.reshape((-1,) + x.shape[3:])
        b_obs = flat(buf.obs[:, :, group.agents])
        b_actions = flat(buf.actions[:, :, group.agents])
        b_log_probs = flat(buf.log_probs[:, :, group.agents])
        b_values = flat(buf.values[:, :, group.agents])
        b_adv, b_returns = flat(advantages), flat(returns)
        batch = b_obs.shape[0]
        minibatch = batch // t_cfg.num_minibatches
        stats = collections.defaultdict(list)
        for _ in range(t_cfg.update_epochs):
            order = torch.randperm(batch, generator=self.shuffle).to(b_obs.device)
            for start in range(0, minibatch * t_cfg.num_minibatches, minibatch):
                idx = order[start:start + minibatch]
                new_log_prob, entropy, new_value = group.train_model(b_obs[idx], b_actions[idx])
                adv = b_adv[idx]
                if t_cfg.norm_adv and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss, clip_fraction = losses.policy_loss(new_log_prob, b_log_probs[idx], adv,
                                                            t_cfg.clip_coef)
                v_loss = losses.value_loss(new_value, b_values[idx], b_returns[idx],
                                           t_cfg.clip_coef if t_cfg.clip_vloss else None)
                loss = pg_loss - t_cfg.ent_coef * entropy.mean() + t_cfg.vf_coef * v_loss
                group.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), t_cfg.max_grad_norm)
                group.optimizer.step()
                with torch.no_grad():
                    stats["policy_loss"].append(pg_loss)
                    stats["value_loss"].append(v_loss)
                    stats["entropy"].append(entropy.mean())
                    stats["approx_kl"].append(losses.approx_kl(new_log_prob, b_log_probs[idx]))
                    stats["clip_fraction"].append(clip_fraction)
        return {k: torch.stack(v).mean().item() for k, v in stats.items()}

    # ---- the loop --------------------------------------------------------------------
    def train(self):
        t_cfg = self.config.trainer
        total = self.num_iterations
        while self.iteration < total:
            start = time.perf_counter()
            self.timer.reset()
            self.collect()
            lr = t_cfg.lr * (1 - self.iteration / total) if t_cfg.anneal_lr else t_cfg.lr
            with self.timer("update"):
                group_stats = {g.name: self.update(g, lr) for g in self.groups}
            group_stats = self._share(group_stats)
            seconds = time.perf_counter() - start
            self.iteration += 1
            self.env_steps += self.steps_per_iteration
            self.elapsed_s += seconds
            metrics = self.metrics(group_stats, seconds, lr)
            solved = self.solved()  # the same on every rank: episodes are pooled
            if self.logger is not None:
                self.logger.log(metrics)
            if self.iteration % t_cfg.checkpoint_every == 0 or self.iteration == total or solved:
                state = self.state_dict()  # collective: every rank takes part
                if self.logger is not None:
                    self.logger.checkpoint(self.iteration, state)
            if solved:
                break
        return self.summary()

    def solved(self) -> bool:
        """Whether every policy reached `target_return` over the last 100 finished episodes."""
        target = self.config.trainer.target_return
        return target is not None and all(
            len(self.recent[g.name]) == RECENT_EPISODES and self.recent_return(g.name) >= target
            for g in self.groups)

    def metrics(self, group_stats: dict, seconds: float, lr: float) -> dict:
        steps = self.steps_per_iteration
        times = self.timer.totals()
        m = {"iteration": self.iteration, "env_steps": self.env_steps,
             "time_s": round(self.elapsed_s, 4), "env_steps_per_s": steps / seconds,
             "episodes": self.episodes, "lr": lr, "num_processes": self.world_size}
        for name, stats in group_stats.items():
            m[f"episode_return/{name}"] = self.recent_return(name)
            for key, value in stats.items():
                m[f"{key}/{name}"] = value
        for section in ("env", "forward", "update"):
            m[f"time_share/{section}"] = times.get(section, 0.0) / seconds
        return m

    def recent_return(self, name):
        recent = self.recent[name]
        return sum(recent) / len(recent) if recent else None

    def summary(self) -> dict:
        return {"iterations": self.iteration, "env_steps": self.env_steps,
                "time_s": self.elapsed_s, "episodes": self.episodes, "solved": self.solved(),
                "episode_return": {g.name: self.recent_return(g.name) for g in self.groups}}

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict | None:
        """The whole run's state on rank 0 (each rank's replicas included); None elsewhere.

        With several ranks this is a collective: every rank must call it.
        """
        own = {"env_state": {k: v.cpu() for k, v in self.env.get_state(include_rng=True).items()},
               "next_obs": self.next_obs.cpu(), "episode_return": self.episode_return.cpu()}
        ranks = dist.gather_to_main(own) if self.distributed else [own]
        if self.rank != 0:
            return None
        return {
            "iteration": self.iteration, "env_steps": self.env_steps,
            "elapsed_s": self.elapsed_s, "episodes": self.episodes,
            "models": {g.name: g.model.state_dict() for g in self.groups},
            "optimizers": {g.name: g.optimizer.state_dict() for g in self.groups},
            "recent_returns": {k: list(v) for k, v in self.recent.items()},
            "shuffle_rng": self.shuffle.get_state(),
            "torch_rng": torch.get_rng_state(),
            "ranks": ranks,
        }

    def load_state_dict(self, state: dict):
        if len(state["ranks"]) != self.world_size:
            raise GpusimError(f"the checkpoint holds {len(state['ranks'])} processes' "
                              f"replicas; resume it with {len(state['ranks'])} processes, "
                              f"not {self.world_size}")
        own = state["ranks"][self.rank]
        self.iteration = state["iteration"]
        self.env_steps = state["env_steps"]
        self.elapsed_s = state["elapsed_s"]
        self.episodes = state["episodes"]
        for g in self.groups:
            g.model.load_state_dict(state["models"][g.name])
            g.optimizer.load_state_dict(state["optimizers"][g.name])
            self.recent[g.name].extend(state["recent_returns"][g.name])
        self.shuffle.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.env.set_state(own["env_state"])
        self.next_obs.copy_(own["next_obs"])
        self.episode_return.copy_(own["episode_return"])
