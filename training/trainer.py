"""PPO (and A2C, its one-step special case) on device-resident rollouts.

Read top to bottom: `Trainer.train` alternates `collect` (a rollout of
`rollout_len` steps over all replicas, under no_grad, actions sampled on the
device, no host sync per step) and `update` (per policy: GAE, then epochs of
shuffled minibatches of the clipped PPO loss). Each policy in `env.policies`
has its own model and optimizer, shared by all of its agents, and runs on
all of them across all replicas in one call.

The learner runs at the device's speed (see `acceleration`): bf16 autocast
and torch.compile where they work, and minibatches split into chunks of at
most `max_minibatch_rows` rows whose gradients are accumulated, so the
update never holds more activations than that, with the same gradient.

With several processes (a DeviceContext with world_size > 1) each rank
steps its own replicas (replica ids offset by rank, so their RNG streams
differ), the models are wrapped in DistributedDataParallel so gradients are
averaged, and finished episodes and loss statistics are shared once per
iteration, so every rank logs the same metrics and stops at the same
iteration.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass

import torch

from gpusim.errors import GpusimError, describe
from gpusim.sampler import ActionSampler
from gpusim.scale import distributed as dist
from gpusim.scale.device import DeviceContext

from . import losses
from .acceleration import MaybeCompiled, compile_enabled, resolve_precision
from .config import RunConfig
from .models import ActorCritic
from .timing import SectionTimer

RECENT_EPISODES = 100


class Diverged(GpusimError):
    """A loss or a parameter became NaN or infinite: the run stops before logging it."""
    exit_code = 1  # not bad input: the run itself failed


class Stopped(Exception):
    """SIGINT or SIGTERM: the run stopped after an iteration, with a checkpoint of it."""

    def __init__(self, iteration: int):
        super().__init__(f"interrupted after iteration {iteration}")
        self.iteration = iteration


@contextlib.contextmanager
def stop_requests(announce: bool = True):
    """A flag that the first SIGINT or SIGTERM sets; the second stops at once.

    The trainer checks it after each iteration, so Ctrl-C leaves a checkpoint
    of a whole iteration behind (only from the main thread: elsewhere signals
    keep their handlers).
    """
    flag = {"requested": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handle(signum, frame):
        if flag["requested"]:
            raise KeyboardInterrupt
        flag["requested"] = True
        if announce:
            print("\nstopping after this iteration, with a checkpoint "
                  "(Ctrl-C again to stop now)", file=sys.stderr, flush=True)
    for sig in signals:
        signal.signal(sig, handle)
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


LOSS_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
CHECKPOINT_KEYS = ("iteration", "env_steps", "elapsed_s", "episodes", "models", "optimizers",
                   "recent_returns", "shuffle_rng", "torch_rng", "ranks")


@dataclass
class PolicyGroup:
    """One policy: its agents, model and optimizer, and its compiled forward passes."""
    name: str
    agents: object           # a slice when the ids are contiguous (a view), else an index tensor
    agent_ids: torch.Tensor  # the ids as a tensor, for gathering minibatch rows
    model: ActorCritic
    optimizer: torch.optim.Optimizer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    act: MaybeCompiled            # obs -> (log-probs side by side, value), for rollouts
    evaluate: MaybeCompiled       # (obs, actions) -> (log-prob, entropy, value), for updates

    @property
    def num_agents(self) -> int:
        return len(self.agent_ids)


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
        rows = rollout_len * env.num_envs * env.num_agents  # refuse before allocating:
        env.backend.check_fits(  # obs, actions, log-prob, value, reward (4 bytes each)
            f"the rollout buffer ({rollout_len} steps x {env.num_envs:,} replicas x "
            f"{env.num_agents} agents)", rows * 4 * (env.obs_dim + len(env.action_nvec) + 3))
        self.obs = torch.zeros(shape + (env.obs_dim,), device=device)
        self.actions = torch.zeros(shape + (len(env.action_nvec),), dtype=torch.int32,
                                   device=device)
        self.log_probs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape[:2], dtype=torch.bool, device=device)
        # per policy, the mean return of its agents in episodes that ended at step t
        self.episode_returns = torch.zeros((rollout_len, num_groups, env.num_envs), device=device)

    def rows(self, group: PolicyGroup, index: torch.Tensor):
        """(obs, actions, log_probs, values) of a policy's flat rows `index`.

        Row i is step-and-replica i // n, agent agent_ids[i % n] (n agents in
        the policy): only these rows are gathered, never a copy of the policy's
        whole slice of the buffer.
        """
        steps_envs = self.obs.shape[0] * self.obs.shape[1]
        n = group.num_agents
        where = (index // n, group.agent_ids[index % n])
        return tuple(x.view((steps_envs,) + x.shape[2:])[where]
                     for x in (self.obs, self.actions, self.log_probs, self.values))


class TruncationBootstrap:
    """Adds gamma * V(final_obs) to the reward of truncated replicas, without a host sync.

    Truncation is not failure, so the value of the final observation is
    bootstrapped. Rather than running the critic on every replica's final
    observation at every step, a truncated replica's final observation waits
    in its slot, and the critic evaluates the slots every `interval` steps and
    at the end of the rollout. No replica truncates twice within the env's
    `time_limit` (so `interval` = time_limit; 1 when the env declares none),
    so no slot is overwritten before it is read.
    """

    def __init__(self, env, rollout_len: int, gamma: float):
        self.gamma = gamma
        self.interval = max(1, getattr(env, "time_limit", None) or 1)
        self.final_obs = torch.zeros_like(env.arrays["final_obs"])
        self.pending = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        self.step = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.rows = torch.arange(env.num_envs, device=env.device)
        self.rollout_len = rollout_len

    def record(self, t: int, truncated: torch.Tensor, final_obs: torch.Tensor):
        torch.where(truncated[:, None, None], final_obs, self.final_obs, out=self.final_obs)
        self.step.masked_fill_(truncated, t)
        self.pending |= truncated

    def due(self, t: int) -> bool:
        return (t + 1) % self.interval == 0 or t == self.rollout_len - 1

    def flush(self, groups, rewards: torch.Tensor, autocast):
        """Add the bootstrap of every pending slot to the reward of the step it truncated."""
        bonus = torch.zeros_like(rewards[0])
        with autocast:
            for g in groups:
                _, value = g.act(self.final_obs[:, g.agents])
                bonus[:, g.agents] = value
        bonus *= self.gamma * self.pending[:, None]
        flat = rewards.view((-1,) + rewards.shape[2:])
        flat.index_add_(0, self.step * rewards.shape[1] + self.rows, bonus)
        self.pending.zero_()


class Trainer:
    def __init__(self, config: RunConfig, env_class, context: DeviceContext | None = None,
                 logger=None):
        """`context` gives the device, backend and rank (default: a lone process on
        `trainer.backend`); `logger` (rank 0's RunLogger, or None) receives metrics
        and checkpoints."""
        self.config = config
        t = config.trainer
        torch.manual_seed(t.seed)
        if context is None:
            context = DeviceContext()
            context.bind(t.backend, quiet=True, torch_threads=t.torch_threads)
        self.distributed = context.world_size > 1
        self.rank = context.rank
        self.world_size = context.world_size
        self.env = env_class(num_envs=t.num_envs, backend=context.backend, seed=t.seed,
                             config=config.env, env_offset=context.replica_offset(t.num_envs))
        env = self.env
        self.precision = resolve_precision(t.precision, env.device)
        use_compile = compile_enabled(t.compile, env.device)
        self.sampler = ActionSampler(env)
        self.groups = [self._policy_group(name, ids, use_compile)
                       for name, ids in env.policies.items()]
        self.buffer = RolloutBuffer(env, t.rollout_len, len(self.groups))
        # every agent's log-probabilities over its choices, side by side, for the sampler
        self.choice_log_probs = torch.zeros(
            (env.num_envs, env.num_agents, sum(env.action_nvec)), device=env.device)
        self.bootstrap = TruncationBootstrap(env, t.rollout_len, t.gamma)
        self.shuffle = torch.Generator().manual_seed(t.seed)
        self.timer = SectionTimer(env.device)
        self.logger = logger
        self.steps_per_iteration = t.steps_per_iteration * self.world_size  # all ranks
        self.num_iterations = t.num_iterations(self.world_size)
        # running state, all saved in checkpoints; the next observation is the env's own
        # `obs` buffer, written by its last step
        self.iteration = 0
        self.env_steps = 0
        self.elapsed_s = 0.0
        self.lr_anchor = (0, t.lr)  # see learning_rate
        self.last_lr = t.lr
        env.reset()
        self.episode_return = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self.recent = {g.name: collections.deque(maxlen=RECENT_EPISODES) for g in self.groups}
        self.episodes = 0
        self.finished = {}

    def _policy_group(self, name, ids, use_compile) -> PolicyGroup:
        env, config = self.env, self.config
        model = ActorCritic(env.obs_dim, env.action_nvec, config.policy.hidden_sizes,
                            config.policy.activation).to(env.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.trainer.lr, eps=1e-5)
        train_model = self._wrap(model)
        group = PolicyGroup(name, agent_index(ids, env.device),
                            torch.tensor(sorted(ids), dtype=torch.long, device=env.device),
                            model, optimizer, train_model,
                            MaybeCompiled(model.act, f"policy {name!r} (rollout)", use_compile),
                            MaybeCompiled(train_model, f"policy {name!r} (update)", use_compile))
        if group.evaluate.active:
            self._probe(group)
        return group

    def _probe(self, group: PolicyGroup):
        """Compile the update's forward and backward now, so a compiler failure falls
        back before training (a backward compiled lazily could not fall back later)."""
        rows = 8
        obs = torch.zeros((rows, self.env.obs_dim), device=self.env.device)
        actions = torch.zeros((rows, len(self.env.action_nvec)), dtype=torch.int32,
                              device=self.env.device)
        no_sync = group.train_model.no_sync() if self.distributed else contextlib.nullcontext()
        try:
            with no_sync, self.precision.autocast():
                out = group.evaluate.compiled(obs, actions)
            with no_sync:
                sum(o.float().sum() for o in out).backward()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: run eagerly
            group.evaluate.fall_back(exc)
        group.optimizer.zero_grad(set_to_none=True)

    def _wrap(self, model):
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel
        device = self.env.device
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)  # copies rank 0's weights

    @property
    def next_obs(self) -> torch.Tensor:
        """The observation the next rollout step acts on: the env's own buffer."""
        return self.env.arrays["obs"]

    # ---- rollout -------------------------------------------------------------------
    @torch.no_grad()
    def collect(self):
        t_cfg, buf, env = self.config.trainer, self.buffer, self.env
        autocast = self.precision.autocast()
        for t in range(t_cfg.rollout_len):
            with self.timer("forward"):
                obs = buf.obs[t]
                obs.copy_(self.next_obs)
                with autocast:
                    for g in self.groups:
                        log_probs, buf.values[t][:, g.agents] = g.act(obs[:, g.agents])
                        self.choice_log_probs[:, g.agents] = log_probs
                # one launch draws every agent's actions and their log-probability
                actions = self.sampler.sample(self.choice_log_probs, log_space=True)
                buf.actions[t].copy_(actions)
                buf.log_probs[t].copy_(self.sampler.log_prob)
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step(actions)
            with self.timer("forward"):
                buf.rewards[t].copy_(reward)
                self.bootstrap.record(t, truncated, info["final_obs"])
                if self.bootstrap.due(t):
                    self.bootstrap.flush(self.groups, buf.rewards, autocast)
                done = info["reset_mask"]
                buf.dones[t] = done
                self.episode_return += reward
                for k, g in enumerate(self.groups):
                    buf.episode_returns[t, k] = self.episode_return[:, g.agents].mean(1)
                self.episode_return *= (~done).unsqueeze(1).to(reward.dtype)
        self.finished = self._finished_episodes()

    def _finished_episodes(self) -> dict:
        """One host read per iteration: per policy, returns of the episodes that just ended."""
        dones = self.buffer.dones.cpu()
        returns = self.buffer.episode_returns.cpu()
        return {g.name: returns[:, k][dones].tolist() for k, g in enumerate(self.groups)}

    def _share(self, group_stats: dict, stop: bool = False) -> tuple[dict, bool]:
        """Pool every rank's finished episodes (in rank order), average the loss stats, and
        agree to stop if any rank was asked to (so every rank stops after the same
        iteration)."""
        parts = dist.all_gather((self.finished, group_stats, stop)) if self.distributed \
            else [(self.finished, group_stats, stop)]
        for finished, _, _ in parts:
            for name, returns in finished.items():
                self.recent[name].extend(returns)
            self.episodes += len(next(iter(finished.values()), []))
        return ({name: {key: sum(p[1][name][key] for p in parts) / len(parts) for key in stats}
                 for name, stats in group_stats.items()}, any(p[2] for p in parts))

    # ---- update --------------------------------------------------------------------
    def update(self, group: PolicyGroup, lr: float) -> dict:
        t_cfg, buf = self.config.trainer, self.buffer
        for param_group in group.optimizer.param_groups:
            param_group["lr"] = lr
        with torch.no_grad():
            with self.precision.autocast():
                _, next_value = group.act(self.next_obs[:, group.agents])
            dones = buf.dones.unsqueeze(-1).expand(-1, -1, group.num_agents)
            advantages, returns = losses.gae(buf.rewards[:, :, group.agents],
                                             buf.values[:, :, group.agents], dones,
                                             next_value.float(), t_cfg.gamma, t_cfg.gae_lambda)
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        batch = advantages.numel()
        minibatch = batch // t_cfg.num_minibatches
        stats = torch.zeros(len(LOSS_STATS), device=advantages.device)
        for _ in range(t_cfg.update_epochs):
            order = torch.randperm(batch, generator=self.shuffle).to(advantages.device)
            for start in range(0, minibatch * t_cfg.num_minibatches, minibatch):
                stats += self._minibatch_step(group, order[start:start + minibatch],
                                              advantages, returns)
        stats /= t_cfg.update_epochs * t_cfg.num_minibatches
        return dict(zip(LOSS_STATS, stats.tolist()))

    def _minibatch_step(self, group: PolicyGroup, index, advantages, returns):
        """One gradient step on the rows `index`, in chunks of at most max_minibatch_rows.

        Each chunk's loss is weighted by its share of the minibatch, so the
        accumulated gradient is that of the whole minibatch's mean loss.
        Returns the minibatch's loss statistics (LOSS_STATS order).
        """
        t_cfg = self.config.trainer
        adv = advantages[index]
        if t_cfg.norm_adv and adv.numel() > 1:  # over the whole minibatch, as unchunked
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        size = index.numel()
        chunk = min(size, t_cfg.max_minibatch_rows)
        stats = torch.zeros(len(LOSS_STATS), device=adv.device)
        group.optimizer.zero_grad(set_to_none=True)
        for start in range(0, size, chunk):
            rows = index[start:start + chunk]
            last = start + chunk >= size
            sync = contextlib.nullcontext() if last or not self.distributed \
                else group.train_model.no_sync()  # DDP all-reduces once, after the last chunk
            with sync:
                chunk_stats, loss = self._loss(group, rows, adv[start:start + chunk],
                                               returns[rows])
                weight = rows.numel() / size
                (loss * weight).backward()
            stats += chunk_stats * weight
        torch.nn.utils.clip_grad_norm_(group.model.parameters(), t_cfg.max_grad_norm)
        group.optimizer.step()
        return stats

    def _loss(self, group: PolicyGroup, rows, adv, returns):
        """(detached LOSS_STATS, loss) of the PPO objective on buffer rows `rows`."""
        t_cfg = self.config.trainer
        obs, actions, old_log_prob, old_value = self.buffer.rows(group, rows)
        with self.precision.autocast():
            new_log_prob, entropy, new_value = group.evaluate(obs, actions)
        pg_loss, clip_fraction = losses.policy_loss(new_log_prob, old_log_prob, adv,
                                                    t_cfg.clip_coef)
        v_loss = losses.value_loss(new_value, old_value, returns,
                                   t_cfg.clip_coef if t_cfg.clip_vloss else None)
        entropy = entropy.mean()
        loss = pg_loss - t_cfg.ent_coef * entropy + t_cfg.vf_coef * v_loss
        with torch.no_grad():
            stats = torch.stack([pg_loss, v_loss, entropy,
                                 losses.approx_kl(new_log_prob, old_log_prob), clip_fraction])
        return stats, loss

    # ---- the loop --------------------------------------------------------------------
    def iterate(self, lr: float) -> dict:
        """One iteration: a rollout, then an update of every policy; their loss stats."""
        self.collect()
        with self.timer("update"):
            return {g.name: self.update(g, lr) for g in self.groups}

    def train(self):
        """Iterate to the end (or the target return); raises Stopped on SIGINT/SIGTERM."""
        # launched ranks leave the announcement to the launcher; rank 0 makes it otherwise
        with stop_requests(announce=self.rank == 0 and not dist.launched_here()) as stop:
            while self.iteration < self.num_iterations:
                stopping = self._train_one(stop["requested"])
                if stopping:
                    raise Stopped(self.iteration)
                if self.solved():
                    break
        return self.summary()

    def _train_one(self, stop_requested: bool) -> bool:
        """One iteration, logged and (when due) checkpointed; whether the run must stop."""
        t_cfg = self.config.trainer
        start = time.perf_counter()
        self.timer.reset()
        lr = self.last_lr = self.learning_rate()
        group_stats, stopping = self._share(self.iterate(lr), stop_requested)
        self._check_finite(group_stats)  # before anything of this iteration is kept
        seconds = time.perf_counter() - start
        self.iteration += 1
        self.env_steps += self.steps_per_iteration
        self.elapsed_s += seconds
        metrics = self.metrics(group_stats, seconds, lr)
        if self.logger is not None:
            self.logger.log(metrics)
        if self.iteration % t_cfg.checkpoint_every == 0 or stopping or self.solved() \
                or self.iteration == self.num_iterations:
            state = self.state_dict()  # collective: every rank takes part
            if self.logger is not None:
                self.logger.checkpoint(self.iteration, state)
        return stopping

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

    def _check_finite(self, group_stats: dict):
        """Raise Diverged at the first non-finite loss statistic or parameter."""
        problem = None
        for g in self.groups:
            bad = [k for k, v in group_stats[g.name].items() if not math.isfinite(v)]
            if bad:
                problem = f"policy '{g.name}' has a non-finite {bad[0]} " \
                          f"({group_stats[g.name][bad[0]]})"
                break
        if problem is None:
            finite = torch.stack([p.isfinite().all() for g in self.groups
                                  for p in g.model.parameters()])
            if not bool(finite.all()):  # one host read per iteration
                index = int((~finite).nonzero()[0])
                sizes = [len(list(g.model.parameters())) for g in self.groups]
                owner = next(g for g, end in zip(self.groups, itertools.accumulate(sizes))
                             if index < end)
                problem = f"policy '{owner.name}' has non-finite parameters"
        if problem is not None:
            raise Diverged(f"training diverged at iteration {self.iteration + 1}: {problem}; "
                           "it was neither logged nor checkpointed; lower trainer.lr or "
                           "check the env's rewards")

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
            "lr": self.last_lr, "lr_anchor": list(self.lr_anchor),
            "num_iterations": self.num_iterations,
            "ranks": ranks,
        }

    def load_state_dict(self, state: dict):
        """Continue from a checkpoint; one that does not fit this run is a GpusimError."""
        missing = [k for k in CHECKPOINT_KEYS if k not in state]
        if missing:
            raise GpusimError(f"the checkpoint lacks {', '.join(missing)}: it was not written "
                              "by this version of gpusim's trainer")
        if len(state["ranks"]) != self.world_size:
            raise GpusimError(f"the checkpoint holds {len(state['ranks'])} processes' "
                              f"replicas; resume it with {len(state['ranks'])} processes, "
                              f"not {self.world_size}")
        for part in ("models", "optimizers", "recent_returns"):
            absent = [g.name for g in self.groups if g.name not in state[part]]
            if absent:
                raise GpusimError(f"the checkpoint's {part} have no policy {absent[0]!r} "
                                  f"(it holds {', '.join(map(repr, state[part])) or 'none'})")
        try:
            self._load(state, state["ranks"][self.rank])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            raise GpusimError(f"the checkpoint does not fit this run ({describe(exc)[:160]}); "
                              "was the env, policy or trainer config changed?") from None

    def _load(self, state: dict, own: dict):
        for g in self.groups:
            g.model.load_state_dict(state["models"][g.name])
            g.optimizer.load_state_dict(state["optimizers"][g.name])
        self.env.set_state(own["env_state"])
        self.next_obs.copy_(own["next_obs"])
        self.episode_return.copy_(own["episode_return"])
        self.shuffle.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.iteration = state["iteration"]
        self.env_steps = state["env_steps"]
        self.elapsed_s = state["elapsed_s"]
        self.episodes = state["episodes"]
        for g in self.groups:
            self.recent[g.name].extend(state["recent_returns"][g.name])
        self.lr_anchor = tuple(state.get("lr_anchor", self.lr_anchor))
        if state.get("num_iterations", self.num_iterations) != self.num_iterations:
            # extended (or shortened) with --total_steps: anneal on from the rate its
            # last iteration used
            self.lr_anchor = (self.iteration, state["lr"])
