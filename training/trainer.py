"""PPO (and A2C, its one-step special case) on device-resident rollouts.

Read top to bottom: `Trainer.train` alternates `collect` (a rollout of
`rollout_len` steps over all replicas, under no_grad, actions sampled on the
device, no host sync per step) and `update` (per policy: GAE, then epochs of
shuffled minibatches of the clipped PPO loss). Each policy in `env.policies`
has its own model, optimizer and rollout buffer, sized by its own
observation and action space (policies may differ: see gpusim.spaces); its
model is shared by all of its agents and runs on all of them across all
replicas in one call. Discrete actions are drawn by gpusim's sampler kernel
(one launch for every agent), continuous ones by the Gaussian head itself.
In envs with per-agent done, an agent's steps after it finished (before its
replica resets) are neither bootstrapped across nor trained on.

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
from gpusim.spaces import agent_index
from gpusim.scale import distributed as dist
from gpusim.scale.device import DeviceContext

from . import losses
from .acceleration import MaybeCompiled, compile_enabled, resolve_precision
from .config import RunConfig
from .models import make_model
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
    """One policy: its space, agents, model, optimizer, buffer and compiled forward passes."""
    name: str
    spec: object             # its gpusim.spaces.PolicySpec
    agents: object           # a slice when the ids are contiguous (a view), else an index tensor
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    act: MaybeCompiled            # obs -> (.., value): see training.models, for rollouts
    evaluate: MaybeCompiled       # (obs, actions) -> (log-prob, entropy, value), for updates
    buffer: "PolicyBuffer" = None

    @property
    def num_agents(self) -> int:
        return self.spec.num_agents

    @property
    def continuous(self) -> bool:
        return self.spec.continuous

    def observe(self, obs: torch.Tensor) -> torch.Tensor:
        """This policy's view of the env's obs array: its agents, its entries."""
        return obs[:, self.agents, :self.spec.obs_dim]


def buffer_bytes(spec, rollout_len: int, num_envs: int) -> int:
    """What one policy's rollout buffer takes: obs, actions, log-prob, value, reward
    (4 bytes each), done and active (1 byte each)."""
    rows = rollout_len * num_envs * spec.num_agents
    return rows * (4 * (spec.obs_dim + spec.action_width + 3) + 2)


class PolicyBuffer:
    """(rollout_len, num_envs, the policy's agents, ...) tensors on the env's device.

    `actions` holds what the model's `evaluate` takes back: choice indices, or
    the Gaussian's raw samples. `dones[t]` marks an agent whose episode ended
    with step t (its replica's, or its own); `active[t]` whether it was still
    playing at step t (always, without per-agent done).
    """

    def __init__(self, spec, rollout_len: int, num_envs: int, device):
        shape = (rollout_len, num_envs, spec.num_agents)
        self.obs = torch.zeros(shape + (spec.obs_dim,), device=device)
        self.actions = torch.zeros(shape + (spec.action_width,), device=device,
                                   dtype=torch.float32 if spec.continuous else torch.int32)
        self.log_probs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        self.active = torch.ones(shape, dtype=torch.bool, device=device)

    def rows(self, index: torch.Tensor):
        """(obs, actions, log_probs, values) of the flat rows `index` (step, replica, agent)."""
        return tuple(x.view((-1,) + x.shape[3:])[index]
                     for x in (self.obs, self.actions, self.log_probs, self.values))


class EpisodeLog:
    """Per step, which replicas finished and each policy's mean return in them."""

    def __init__(self, env, rollout_len: int, num_groups: int):
        self.dones = torch.zeros((rollout_len, env.num_envs), dtype=torch.bool, device=env.device)
        self.returns = torch.zeros((rollout_len, num_groups, env.num_envs), device=env.device)


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

    def flush(self, groups, autocast):
        """Add the bootstrap of every pending slot to the reward of the step it truncated."""
        for g in groups:
            with autocast:
                value = g.act(g.observe(self.final_obs))[-1]
            rewards = g.buffer.rewards
            flat = rewards.view((-1,) + rewards.shape[2:])
            bonus = value.float() * (self.gamma * self.pending[:, None])
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
        self._check_memory()
        self.groups = [self._policy_group(name, spec, use_compile)
                       for name, spec in env.policy_specs.items()]
        self.episode_log = EpisodeLog(env, t.rollout_len, len(self.groups))
        # discrete policies: every agent's log-probabilities over its choices, side by
        # side, for the sampler, which draws them all in one launch
        self.sampler = ActionSampler(env) if env.discrete_width else None
        if self.sampler is not None:
            self.choice_log_probs = torch.zeros(
                (env.num_envs, env.num_agents, self.sampler.width), device=env.device)
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

    def _check_memory(self):
        """Refuse, before allocating, buffers that cannot fit."""
        t, env = self.config.trainer, self.env
        env.backend.check_fits(
            f"the rollout buffers ({t.rollout_len} steps x {env.num_envs:,} replicas x "
            f"{env.num_agents} agents)", sum(buffer_bytes(spec, t.rollout_len, env.num_envs)
                                             for spec in env.policy_specs.values()))

    def _policy_group(self, name, spec, use_compile) -> PolicyGroup:
        env, config = self.env, self.config
        model = make_model(spec, config.policy).to(env.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.trainer.lr, eps=1e-5)
        train_model = self._wrap(model)
        group = PolicyGroup(name, spec, agent_index(spec.agent_ids, env.device),
                            model, optimizer, train_model,
                            MaybeCompiled(model.act, f"policy {name!r} (rollout)", use_compile),
                            MaybeCompiled(train_model, f"policy {name!r} (update)", use_compile),
                            PolicyBuffer(spec, config.trainer.rollout_len, env.num_envs,
                                         env.device))
        if group.evaluate.active:
            self._probe(group)
        return group

    def _probe(self, group: PolicyGroup):
        """Compile the update's forward and backward now, so a compiler failure falls
        back before training (a backward compiled lazily could not fall back later)."""
        rows = min(8, group.buffer.rewards.numel())
        obs, actions, _, _ = group.buffer.rows(torch.arange(rows, device=self.env.device))
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
        t_cfg, env = self.config.trainer, self.env
        autocast = self.precision.autocast()
        for t in range(t_cfg.rollout_len):
            with self.timer("forward"):
                active = env.agent_active()
                actions = self._act(t, active, autocast)
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step(actions)
            with self.timer("forward"):
                done = info["reset_mask"]
                still = env.agent_active()
                for g in self.groups:
                    buf = g.buffer
                    torch.mul(reward[:, g.agents], t_cfg.reward_scale, out=buf.rewards[t])
                    # an agent's episode ends with its replica's, or when it stops playing
                    buf.dones[t] = done[:, None]
                    if active is not None:
                        buf.dones[t] |= buf.active[t] & ~still[:, g.agents]
                self.bootstrap.record(t, truncated, info["final_obs"])
                if self.bootstrap.due(t):
                    self.bootstrap.flush(self.groups, autocast)
                self._record_episodes(t, reward, done, active)
        self.finished = self._finished_episodes()

    def _record_episodes(self, t: int, reward, done, active):
        """Add step t's rewards (of agents in play) to the running returns; log and restart
        those of replicas that just finished."""
        log = self.episode_log
        log.dones[t] = done
        self.episode_return += reward if active is None else reward * active
        for k, g in enumerate(self.groups):
            log.returns[t, k] = self.episode_return[:, g.agents].mean(1)
        self.episode_return *= (~done).unsqueeze(1).to(reward.dtype)

    def _act(self, t: int, active, autocast):
        """Every policy's actions at step t, recorded in its buffer; what env.step takes."""
        policy_actions = {}
        with autocast:
            for g in self.groups:
                buf = g.buffer
                obs = buf.obs[t]
                obs.copy_(g.observe(self.next_obs))
                if active is not None:
                    buf.active[t] = active[:, g.agents]
                if g.continuous:
                    raw, buf.log_probs[t], buf.values[t] = g.act(obs)
                    buf.actions[t].copy_(raw)
                    policy_actions[g.name] = g.model.squash(buf.actions[t])
                else:
                    self.choice_log_probs[:, g.agents, :sum(g.spec.actions)], buf.values[t] = \
                        g.act(obs)
        if self.sampler is None:
            return policy_actions
        # one launch draws every agent's discrete actions and their log-probability
        actions = self.sampler.sample(self.choice_log_probs, log_space=True)
        for g in self.groups:
            if not g.continuous:
                g.buffer.actions[t].copy_(actions[:, g.agents, :g.spec.action_width])
                g.buffer.log_probs[t].copy_(self.sampler.log_prob[:, g.agents])
                policy_actions[g.name] = g.buffer.actions[t]
        return policy_actions if self.env.mixed_actions or self.env.continuous_dim else actions

    def _finished_episodes(self) -> dict:
        """One host read per iteration: per policy, returns of the episodes that just ended."""
        dones = self.episode_log.dones.cpu()
        returns = self.episode_log.returns.cpu()
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
        t_cfg, buf = self.config.trainer, group.buffer
        for param_group in group.optimizer.param_groups:
            param_group["lr"] = lr
        with torch.no_grad():
            with self.precision.autocast():
                next_value = group.act(group.observe(self.next_obs))[-1]
            advantages, returns = losses.gae(buf.rewards, buf.values, buf.dones,
                                             next_value.float(), t_cfg.gamma, t_cfg.gae_lambda)
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        # the rows it trains on: every row, or with per-agent done the agents still playing
        played = None if self.env.agent_active_array is None \
            else buf.active.reshape(-1).nonzero().squeeze(1)  # one host sync per update
        batch = advantages.numel() if played is None else played.numel()
        minibatch = batch // t_cfg.num_minibatches
        if played is not None and self.distributed:  # ranks skip together, or none does
            minibatch = minibatch if dist.min_across(minibatch) > 0 else 0
        stats = torch.zeros(len(LOSS_STATS), device=advantages.device)
        if minibatch == 0:  # (nearly) nobody played: nothing to learn from
            return dict(zip(LOSS_STATS, stats.tolist()))
        for _ in range(t_cfg.update_epochs):
            order = torch.randperm(batch, generator=self.shuffle).to(advantages.device)
            if played is not None:
                order = played[order]
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
        obs, actions, old_log_prob, old_value = group.buffer.rows(rows)
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
        own = self._rank_state()
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

    def _rank_state(self) -> dict:
        """What is this process's own: its replicas' state (gathered on rank 0)."""
        return {"env_state": {k: v.cpu() for k, v in self.env.get_state(include_rng=True).items()},
                "next_obs": self.next_obs.cpu(), "episode_return": self.episode_return.cpu()}

    def _load_rank_state(self, own: dict):
        self.env.set_state(own["env_state"])
        self.next_obs.copy_(own["next_obs"])
        self.episode_return.copy_(own["episode_return"])

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
        self._load_rank_state(own)
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
