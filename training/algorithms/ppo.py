"""PPO, and A2C (its one-step special case), on device-resident rollouts.

Read top to bottom: the config; a policy's rollout buffer; `PPO.collect` (a
rollout of `rollout_len` steps over every replica, under no_grad, actions
drawn on the device by training.actors, no host sync per step); `PPO.update`
(per policy: GAE, then epochs of shuffled minibatches of the clipped
surrogate, value loss and entropy bonus); checkpoints.

Each policy of the env has its own model, optimizer and buffer, sized by its
own observation and action space; its model runs on all of its agents in
every replica in one call. The critic sees the agent's own observation
(`policy.critic: local`, IPPO) or the replica's global state (`central`,
MAPPO: the env's `state` array, else every agent's observation). In envs
with per-agent done, an agent's steps after it finished are neither
bootstrapped across nor trained on. Truncation is not failure: gamma *
V(final state) is added to a truncated replica's reward (batched: see
`TruncationBootstrap`).

The learner runs at the device's speed (training.acceleration): bf16
autocast and torch.compile where they work, and minibatches split into
chunks of at most `max_minibatch_rows` rows whose gradients accumulate (the
same gradient, bounded memory). Under DDP gradients are averaged across
ranks, once per minibatch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from gpusim.config import require
from gpusim.errors import GpusimError

from .. import losses
from ..acceleration import MaybeCompiled, adam, load_keeping_lr, plain_lr
from ..actors import Actors
from ..fused import FusedStep
from ..graphs import StepGraph
from ..losses import normalized
from ..models import make_model
from .base import Algorithm
from .chunks import ChunkedUpdate
from .rollout import (PolicyBuffer, PolicyGroup, Rollout, TruncationBootstrap, buffer_bytes,
                      take)

# On the CPU a fused (compiled) minibatch step saves 0.9-2 ms against an eager one in
# cartpole's recipe (80 to 4,096 rows) and about 7 ms in tag_continuous's, while a first
# compile costs 14-17 s (cartpole) to about 50 s (tag_continuous) more per process: it pays from
# 7,000-20,000 steps in a run, so `compile: auto` compiles from this many
# (docs/benchmarks.md, "compile: auto for PPO").
CPU_COMPILE_MIN_STEPS = 20_000
OUT_OF_PLAY = ("auto", "skip", "weigh")


@dataclass(frozen=True)
class PPOConfig:
    update_epochs: int = 4         # passes over each rollout
    num_minibatches: int = 4       # gradient steps per pass
    gae_lambda: float = 0.95       # GAE lambda
    clip_coef: float = 0.2         # PPO ratio clipping (and value clipping)
    clip_vloss: bool = True        # clip the value loss as PPO does
    vf_coef: float = 0.5           # weight of the value loss
    ent_coef: float = 0.01         # weight of the entropy bonus
    max_grad_norm: float = 0.5     # gradient-norm clipping
    norm_adv: bool = True          # normalise advantages per minibatch
    max_minibatch_rows: int = 65536  # rows per forward/backward chunk of a minibatch: bounds
                                     # activation memory; chunk gradients are accumulated
    out_of_play: str = "auto"      # per-agent done: rows of agents out of play are left out
                                   # of the update (skip: one host read per update; on a CUDA
                                   # device each minibatch chunk a replayed graph) or trained
                                   # with weight 0 (weigh: on a CUDA device the whole update
                                   # one graph); auto: skip
    # every policy key applies (training.config.check_policy_keys)
    policy_keys: ClassVar[frozenset] = frozenset(
        ("hidden_sizes", "activation", "state_dependent_std", "log_std_init", "recurrent",
         "recurrent_size", "bptt_len", "critic"))

    def check(self):
        for key in ("update_epochs", "num_minibatches", "max_minibatch_rows"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(0 <= self.gae_lambda <= 1, "trainer.gae_lambda", "must lie in [0, 1]")
        require(self.clip_coef > 0, "trainer.clip_coef", "must be positive")
        require(self.out_of_play in OUT_OF_PLAY, "trainer.out_of_play",
                f"must be one of {OUT_OF_PLAY}")
        for key in ("vf_coef", "ent_coef", "max_grad_norm"):
            require(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")

    def check_run(self, trainer):
        require(self.num_minibatches <= trainer.num_envs * trainer.rollout_len,
                "trainer.num_minibatches", "must not exceed num_envs x rollout_len")

    def for_batch(self, rows: int, config_rows: int, max_rows: int) -> "PPOConfig":
        """This config for `rows` rows per rollout where it was written for `config_rows`
        (auto-scale's pick): the recipe's gradient steps per iteration, each on a larger
        minibatch, up to `max_rows` rows (or the config's own, if more), beyond which the
        minibatches grow in number; a minibatch stays one chunk (`max_minibatch_rows`)."""
        per_minibatch = max(max_rows, -(-config_rows // self.num_minibatches))
        minibatches = max(self.num_minibatches, -(-rows // per_minibatch))
        chunk = max(self.max_minibatch_rows, min(-(-rows // minibatches), max_rows))
        return replace(self, num_minibatches=minibatches, max_minibatch_rows=chunk)


@dataclass(frozen=True)
class A2CConfig(PPOConfig):
    update_epochs: int = 1         # a2c: 1 (one gradient step per rollout)
    num_minibatches: int = 1       # a2c: 1

    def for_batch(self, rows: int, config_rows: int, max_rows: int) -> "A2CConfig":
        return self  # one gradient step per rollout, whatever its size

    def check(self):
        super().check()
        require(self.update_epochs == 1 and self.num_minibatches == 1, "trainer.algorithm",
                "a2c takes one gradient step per rollout: update_epochs and num_minibatches "
                "must be 1")


class PPO(Rollout, Algorithm):
    Config = PPOConfig
    stats = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
    auto_scales = True
    captures_graphs = True
    populates = True  # trainer.population (training.algorithms.population)
    chunks_graphs = True  # a population batches its members' steps its own way

    def __init__(self, config, env, context, timer):
        super().__init__(config, env, context, timer)
        t = config.trainer
        self.central = config.policy.critic == "central"
        self.bptt_len = config.policy.bptt_len if config.policy.recurrent != "none" else 0
        if self.bptt_len and (self.central or t.rollout_len % self.bptt_len):
            raise GpusimError("policy.recurrent needs policy.critic local and a rollout_len "
                              f"that is a multiple of policy.bptt_len ({self.bptt_len})")
        if not any(spec.continuous for spec in env.policy_specs.values()):
            for key in ("state_dependent_std", "log_std_init"):  # the Gaussian head's keys
                if getattr(config.policy, key) != getattr(type(config.policy)(), key):
                    raise GpusimError(f"config key 'policy.{key}' applies to continuous "
                                      f"actions, and every policy of {env.name} acts "
                                      "discretely")
        mask = env.action_mask()
        self.mask_width = 0 if mask is None else mask.shape[-1]
        self.state_dim = env.global_state().shape[-1] if self.central else 0
        env.backend.check_fits(
            f"the rollout buffers ({t.rollout_len} steps x {env.num_envs:,} replicas x "
            f"{env.num_agents} agents)",
            sum(buffer_bytes(spec, t.rollout_len, env.num_envs, self.state_dim, self.mask_width)
                for spec in env.policy_specs.values()))
        self.check_models_fit(networks=2)  # an actor and a critic
        self.groups = [self._policy_group(name, spec)
                       for name, spec in env.policy_specs.items()]
        self.chunked = False
        if self._chunks_in_graphs():
            self.chunk_minibatches()
        if self.distributed:  # the update runs eagerly under DDP (it all-reduces between
            self.static_steps = False  # chunks), so it can leave rows out of play out
        self.actors = Actors(env, {g.name: g.model for g in self.groups},
                             wrap=lambda fn, what: MaybeCompiled(fn, what, self.compile_acting))
        self.bootstrap = TruncationBootstrap(env, t.rollout_len, t.gamma, self.central,
                                             self.actors.memory)
        self.shuffle = torch.Generator(device=env.device).manual_seed(t.seed)  # on the device
        # On a CUDA device the rollout and the update are each one CUDA graph, replayed (the
        # update's parts instead where it is chunked); what the update returns comes out
        # through `update_stats` (training.graphs)
        self.rollout_graph = StepGraph(self._collect, "the rollout", self.use_graphs, timer)
        self.update_graph = StepGraph(self._update_all, "the update", self.use_graphs
                                      and not self.distributed and not self.chunked, timer)
        self.update_stats = torch.zeros((len(self.groups), len(self.stats)), device=env.device)
        self.orders = {}  # policy name -> (update_epochs, units) minibatch orders, drawn ahead

    def _chunks_in_graphs(self) -> bool:
        """Whether minibatches go through graphed fixed-size chunks (training.algorithms.
        chunks): with CUDA graphs, per-agent done and rows out of play left out, outside
        DDP (which all-reduces inside the step) and recurrent sequences."""
        return (self.use_graphs and self.chunks_graphs and not self.distributed
                and self.env.agent_active_array is not None and not self.bptt_len
                and self.cfg.out_of_play != "weigh")

    def chunk_minibatches(self):
        """Per-agent done on a CUDA device: the update leaves rows out of play out (a host
        read per update), so it runs eagerly around replayed graphs of fixed shapes (the
        value pass's chunks, GAE, each minibatch's chunks and its optimizer step:
        training.algorithms.chunks)."""
        self.chunked, self.static_steps = True, False
        gamma = self.config.trainer.gamma

        def gae(rewards, values, dones, next_value):
            return losses.gae(rewards, values, dones, next_value, gamma, self._gae_lambda())
        for g in self.groups:
            g.chunked = ChunkedUpdate(g, self.cfg.max_minibatch_rows, self._loss,
                                      lambda g, obs: self._critic(g, obs, None), gae,
                                      self.cfg.max_grad_norm, len(self.stats),
                                      self.use_graphs, self.timer)

    def steps_fuse(self) -> bool:
        """Whether a compiled minibatch step is one fused call (training.fused): not under
        DDP, which all-reduces between backward and step, nor for recurrent sequences."""
        return not self.distributed and self.config.policy.recurrent == "none"

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS minibatch steps, where they fuse."""
        t = self.config.trainer
        steps = t.num_iterations(self.world_size) * self.cfg.update_epochs \
            * self.cfg.num_minibatches
        return self.steps_fuse() and steps >= CPU_COMPILE_MIN_STEPS

    def _policy_group(self, name, spec) -> PolicyGroup:
        env, config = self.env, self.config
        model = make_model(spec, config.policy, self.state_dim or None).to(env.device)
        optimizer = adam(model.parameters(), config.trainer.lr, eps=1e-5,
                         capturable_on=env.device if self.use_graphs else None)
        train_model = self._wrap(model)
        # Compiled, a minibatch is one fused step where steps fuse; else the update's forward.
        fused = self.use_compile and self.steps_fuse()
        group = PolicyGroup(
            name, spec, self.agents[name], model, optimizer, train_model,
            MaybeCompiled(model.value, f"policy {name!r} (value)", self.compile_acting),
            MaybeCompiled(train_model, f"policy {name!r} (update)",
                          self.use_compile and not fused),
            PolicyBuffer(spec, config.trainer.rollout_len, env.num_envs, env.device,
                         self.state_dim, self.mask_width, model.state_size,
                         max(1, self.bptt_len)))
        if fused:
            group.fused = FusedStep(
                {"model": (dict(model.named_parameters()), optimizer)},
                lambda descent, *batch: descent.step("model", self._fused_loss, group, *batch),
                self.cfg.max_grad_norm, f"policy {name!r} (update)",
                dynamic=env.agent_active_array is not None)  # rows in play vary
        if group.forward.active:
            self._probe(group)
        return group

    def _wrap(self, model):
        """DDP under several ranks (gradients averaged); its constant buffers (a Gaussian's
        bounds) need no broadcast on every forward."""
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel
        device = self.env.device
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **no_buffer_sync())

    def _probe(self, group: PolicyGroup):
        """Compile the update's forward and backward now, so a compiler failure falls
        back before training (a backward compiled lazily could not fall back later)."""
        rows = torch.arange(min(8, group.buffer.rewards.numel()), device=self.env.device)
        inputs = self._forward_inputs(group, rows[:, None] if self.bptt_len else rows)
        no_sync = group.train_model.no_sync() if self.distributed else contextlib.nullcontext()
        try:
            with no_sync, self.precision.autocast():
                out = group.forward.compiled(*inputs)
            with no_sync:
                sum(o.float().sum() for o in out).backward()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: run eagerly
            group.forward.fall_back(exc)
        group.optimizer.zero_grad(set_to_none=True)

    def values(self, g: PolicyGroup, obs: torch.Tensor, state: torch.Tensor | None,
               memory: torch.Tensor | None = None):
        """(envs, the policy's agents) values of an env's (envs, agents, obs) array."""
        return self._critic(g, self.observe(g.name, obs), state, memory)

    def _critic(self, g: PolicyGroup, own: torch.Tensor, state: torch.Tensor | None,
                memory: torch.Tensor | None = None):
        """(..., the policy's agents) values of its own observations `own` (..., agents,
        obs) after the recurrent states `memory`, or of the replicas' global `state`
        (..., state) with a central critic."""
        with self.precision.autocast():
            if state is not None:
                value = g.value(state)
                return value[..., None].expand(*value.shape, g.spec.num_agents)
            return g.value(own) if memory is None else g.value(own, memory)

    def warming_up(self) -> bool:
        return self.rollout_graph.warming_up() or self.update_graph.warming_up() or any(
            g.chunked.warming_up() for g in self.groups if g.chunked is not None)

    # ---- update --------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """Every policy's update (eagerly, or its CUDA graph replayed): statistics per policy,
        read from the device once."""
        for g in self.groups:
            self.set_lr(g.optimizer, lr)
            if self.static_steps:
                self._draw_orders(g)
        return self._statistics()

    def _statistics(self) -> dict:
        """The update run (eagerly, or its graph replayed), and its statistics per policy."""
        self.update_graph()
        return {g.name: dict(zip(self.stats, values))
                for g, values in zip(self.groups, self.update_stats.tolist())}

    def _update_all(self):
        for k, g in enumerate(self.groups):
            self.update_stats[k].copy_(self._update_policy(g))

    def _update_policy(self, g: PolicyGroup) -> torch.Tensor:
        """The rollout's values and GAE, then `update_epochs` passes of shuffled
        minibatches: of rows, or of agent sequences (`bptt_len` steps) for a recurrent
        policy. With per-agent done, rows out of play are left out, or weigh 0 (`_units`).
        Returns the mean statistics (`stats` order)."""
        cfg, buf = self.cfg, g.buffer
        units, weights = self._units(buf)
        with torch.no_grad():
            if not self.bptt_len:  # else the rollout stored each step's value
                # `_units` left the rows out of play out (rather than weighing them 0)
                only_in_play = self.env.agent_active_array is not None and weights is None \
                    and not self.central
                self._rollout_values(g, units[:, 0] if only_in_play else None)
            state = self.env.global_state() if self.central else None
            next_value = self.values(g, self.next_obs, state, self.actors.memory.get(g.name))
            if g.chunked is not None:
                advantages, returns = g.chunked.advantages_and_returns(next_value)
            else:
                advantages, returns = losses.gae(buf.rewards, buf.values, buf.dones,
                                                 next_value.float(), self.config.trainer.gamma,
                                                 self._gae_lambda())
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        minibatch = units.shape[0] // cfg.num_minibatches
        if minibatch == 0:  # fewer sequences than minibatches: nothing to split
            raise GpusimError(f"policy {g.name!r} has {units.shape[0]} sequences per rollout, "
                              f"fewer than trainer.num_minibatches ({cfg.num_minibatches})")
        stats = 0.0
        for epoch in range(cfg.update_epochs):
            order = self.orders[g.name][epoch] if self.static_steps \
                else self._shuffled(units.shape[0])
            for first in range(0, minibatch * cfg.num_minibatches, minibatch):
                rows = self._minibatch_rows(units, order[first:first + minibatch])
                stats = stats + self._minibatch_step(g, rows, advantages, returns, weights)
        return stats / (cfg.update_epochs * cfg.num_minibatches)

    def _gae_lambda(self):
        return self.cfg.gae_lambda

    def _minibatch_step(self, g: PolicyGroup, rows, advantages, returns, active=None):
        """One gradient step on buffer rows `rows` (flat, or (sequences, steps)): fused into
        one compiled call where it can be, else eagerly in chunks of at most
        max_minibatch_rows rows.

        Each chunk's loss is weighted by its share of the minibatch's rows (those in play,
        with per-agent done), so the accumulated gradient is that of the whole
        minibatch's mean loss. Returns the minibatch's statistics (`stats` order).
        """
        if g.chunked is not None:
            adv, weights, total = self._advantages(rows, advantages, active)
            return g.chunked(rows, adv, take(returns, rows), weights, total)
        cfg = self.cfg
        steps = rows.shape[1] if rows.dim() == 2 else 1
        chunk = max(1, min(rows.shape[0], cfg.max_minibatch_rows // steps))
        if g.fused is not None and chunk == rows.shape[0]:
            stats = g.fused(rows, advantages, returns, active)
            if stats is not None:
                return stats
        adv, weights, total = self._advantages(rows, advantages, active)
        stats = torch.zeros(len(self.stats), device=adv.device)
        g.optimizer.zero_grad(set_to_none=True)
        for start in range(0, rows.shape[0], chunk):
            part = slice(start, start + chunk)
            last = start + chunk >= rows.shape[0]
            sync = contextlib.nullcontext() if last or not self.distributed \
                else g.train_model.no_sync()  # DDP all-reduces once, after the last chunk
            part_weights = None if weights is None else weights[part]
            with sync:
                chunk_stats, loss = self._loss(g, g.buffer.rows(rows[part]), adv[part],
                                               take(returns, rows[part]), part_weights)
                share = (rows[part].numel() if weights is None else part_weights.sum()) / total
                (loss * share).backward()
            stats += chunk_stats * share
        torch.nn.utils.clip_grad_norm_(g.model.parameters(), cfg.max_grad_norm)
        g.optimizer.step()
        return stats

    def _advantages(self, rows, advantages, active):
        """The minibatch's advantages (normalised over the whole minibatch, as unchunked),
        its rows' weights (None: all count) and their total."""
        adv = take(advantages, rows)
        weights = None if active is None else take(active, rows)
        total = rows.numel() if weights is None else weights.sum().clamp_min(1.0)
        if self.cfg.norm_adv and adv.numel() > 1:
            adv = normalized(adv, weights, total)
        return adv, weights, total

    def _fused_loss(self, params: dict, g: PolicyGroup, rows, advantages, returns, active):
        """The minibatch's (loss, statistics) as a function of the model's parameters
        (`g.fused` differentiates and compiles it)."""
        adv, weights, _ = self._advantages(rows, advantages, active)

        def forward(*inputs):
            return torch.func.functional_call(g.model, params, inputs)
        stats, loss = self._loss(g, g.buffer.rows(rows), adv, take(returns, rows), weights,
                                 forward)
        return loss, stats

    def _forward_inputs(self, g: PolicyGroup, rows, batch: dict | None = None) -> tuple:
        """The training pass's inputs for buffer rows `rows`: flat rows, or (sequences,
        steps) of a recurrent policy with its states and restarts; `batch`: those rows
        already gathered (`PolicyBuffer.rows`)."""
        batch = g.buffer.rows(rows) if batch is None else batch
        inputs = (batch["obs"], batch["actions"], batch["mask"], batch["critic_obs"])
        if not self.bptt_len:
            return inputs
        buf, steps = g.buffer, rows.shape[1]
        per_step = buf.rewards.shape[1] * buf.rewards.shape[2]  # rows between steps
        first = rows[:, 0]  # the sequence's start: its recurrent state, stored per sequence
        start_state = buf.memory.view(-1, buf.memory.shape[-1])[
            (first // (per_step * self.bptt_len)) * per_step + first % per_step]
        dones = buf.dones.reshape(-1)
        resets = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        if steps > 1:  # an episode that ended with step l-1 restarts the state at l
            resets[:, 1:] = take(dones, rows[:, :-1])
        return inputs + (start_state, resets)

    def _loss(self, g: PolicyGroup, batch: dict, adv, returns, weights=None, forward=None):
        """(detached statistics, loss) of the PPO objective on buffer rows `batch` (from
        `PolicyBuffer.rows`); `weights` counts only rows in play (recurrent sequences);
        `forward`: the training pass (default: the policy's own)."""
        cfg = self.cfg
        with self.precision.autocast():
            new = (forward or g.forward)(*self._forward_inputs(g, batch["index"], batch))
        return losses.ppo_objective(new, batch["log_probs"], batch["values"], adv, returns,
                                    weights, cfg.clip_coef, cfg.clip_vloss, cfg.ent_coef,
                                    cfg.vf_coef)

    # ---- checkpoints -----------------------------------------------------------------
    def models(self) -> dict:
        return {g.name: g.model for g in self.groups}

    def state_dict(self) -> dict:
        return {"models": {g.name: g.model.state_dict() for g in self.groups},
                "optimizers": {g.name: plain_lr(g.optimizer.state_dict()) for g in self.groups},
                "shuffle_rng": self.shuffle.get_state()}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers")
        for g in self.groups:
            g.model.load_state_dict(state["models"][g.name])
            load_keeping_lr(g.optimizer, state["optimizers"][g.name])
        self.shuffle.set_state(state["shuffle_rng"])
        self.rollout_graph.drop()  # the optimizers' state tensors are new: capture again
        self.update_graph.drop()
        for g in self.groups:
            if g.chunked is not None:
                g.chunked.drop()

    @classmethod
    def acting_model(cls, config, env, spec):
        state_dim = env.global_state().shape[-1] if config.policy.critic == "central" else None
        return make_model(spec, config.policy, state_dim)


def no_buffer_sync() -> dict:
    """DDP's keyword for "no buffer broadcast on every forward" (the models' buffers are
    constants, the same on every rank): `forward_sync_buffers` where torch has it (it
    deprecates `broadcast_buffers` with a warning), else `broadcast_buffers`."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class A2C(PPO):
    """PPO with one epoch of one minibatch: the ratio is exactly 1 at that single step, so
    the clipped loss's gradient is the plain policy gradient."""
    Config = A2CConfig
