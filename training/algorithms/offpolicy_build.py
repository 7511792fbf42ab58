"""What an off-policy run is made of, and how its steps run, chosen once when it is built.

`build`: each policy's group (its networks, one Adam per network, its replay shard;
a population's from offpolicy_members.py), the actors, and `choose_speed`: how the
gradient step (`OffPolicy.gradient_step`) and the rollout (`OffPolicy.rollout`) run.
A gradient step runs eagerly (`EagerStep`), compiled whole (`trainer.compile`), as a
CUDA graph replayed (`GraphedStep`, where its sample is static: its rows drawn into a
fixed tensor first and sampled against the replay's held count on the device), or
every population member's at once (offpolicy_members.MembersStep). Where the step is
graphed, so is the rollout, one graph per way of acting (random before
`learning_starts`, the actor's after); the replay rings are then written on the device
and their host counters advance after it.
"""
from __future__ import annotations

import functools

import torch

from ..actors import Actors
from ..collectives import LOCAL, TorchCollectives
from ..replay_buffer import ReplayBuffer
from ..speed.acceleration import MaybeCompiled
from ..speed.descent import Adam, CompiledDescent, EagerDescent
from ..speed.graphs import StepGraph
from .offpolicy_members import MembersStep, build_members
from .offpolicy_networks import OffPolicyGroup, Optimizers


def build(algo):
    env, members = algo.env, algo.members
    algo.collectives = TorchCollectives() if algo.distributed else LOCAL
    if members.solo:
        algo.policies = [solo_group(algo, name, spec) for name, spec in env.policy_specs.items()]
    else:
        build_members(algo)  # the groups, each member's generators, explorers and tau
    algo.actors = Actors(env, {g.name: g.model for g in algo.policies},
                         wrap=lambda fn, what: MaybeCompiled(fn, what, algo.compile_acting))
    if members.solo:
        algo.explorers = Actors(env, {})  # uniformly random, before learning starts
    algo.episodes.members = members.count
    algo.stats_shape = ((members.count,) if not members.solo else ()) + (len(algo.stats),)
    choose_speed(algo)


def solo_group(algo, name, spec) -> OffPolicyGroup:
    cfg, env = algo.cfg, algo.env
    model = algo.model_for(algo.config, spec).to(env.device)
    if algo.distributed:  # every rank starts from rank 0's weights
        for tensor in model.state_dict().values():
            torch.distributed.broadcast(tensor, src=0)
    lr = algo.config.trainer.lr

    def adam(params):  # (a captured step reads device learning rates)
        return Adam(params, lr, max_grad_norm=cfg.max_grad_norm, device_lr=algo.use_graphs)
    optimizers = Optimizers(actor=adam(list(model.actor.parameters())),
                            critic=adam(list(model.critics.parameters())),
                            alpha=adam([model.log_alpha]) if model.log_alpha.requires_grad
                            else None)
    replay = ReplayBuffer(cfg.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                          env.device, prioritized=cfg.prioritized_replay,
                          alpha=cfg.priority_alpha, collectives=algo.collectives,
                          seed=algo.config.trainer.seed * 1000 + list(env.policy_specs).index(name))
    return OffPolicyGroup(name, spec, algo.agents[name], model, optimizers, replay)


def choose_speed(algo):
    """How each gradient step and the rollout run (see the module), once."""
    static = algo.static  # (graphs_supported: only where the sample is static)
    algo.rollout_graphs = {}
    algo.run_rollout = functools.partial(graphed_rollout, algo) if static else algo.rollout
    for g in algo.policies:
        g.store = g.replay.write if static else g.replay.add
        if not algo.members.solo:
            g.step = MembersStep(algo, g)
        elif static:
            g.step = GraphedStep(algo, g)
        else:
            compiled = None
            if algo.use_compile and not algo.distributed:  # (DDP sums gradients between)
                compiled = CompiledDescent(
                    g.optimized, lambda descent, *batch, g=g: algo.gradient_step(descent, g,
                                                                                 *batch),
                    f"policy {g.name!r} (gradient step)")
            g.step = EagerStep(algo, g, compiled)


class EagerStep:
    """A gradient step on a sampled batch: compiled where it can be, else eagerly (under
    DDP its gradients summed across ranks)."""

    def __init__(self, algo, g: OffPolicyGroup, compiled=None):
        self.algo, self.g, self.compiled = algo, g, compiled
        reduce = sum_across_ranks if algo.distributed else None
        self.eager = EagerDescent(g.optimized, reduce)

    def __call__(self) -> torch.Tensor:
        algo, g, cfg = self.algo, self.g, self.algo.cfg
        batch = g.replay.sample(cfg.batch_size, beta=cfg.priority_beta)
        g.updates += 1
        due = algo.actor_due(g)
        inputs = (batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.terminated,
                  batch.weights, due, draws(algo, g, batch.obs.shape[0], due))
        out = self.compiled(*inputs) if self.compiled is not None else None
        if out is None:
            out = algo.gradient_step(self.eager, g, *inputs)
        stats, td = out
        if cfg.prioritized_replay:
            g.replay.update_priorities(batch.index, td.abs().max(0).values)
        return stats


class GraphedStep:
    """The gradient step as a StepGraph, one per actor-due value (TD3 alternates): its
    batch's rows and its standard normal draws drawn first, eagerly, into the tensors the
    graph reads; then sampled, stepped and its statistics returned inside the graph."""

    def __init__(self, algo, g: OffPolicyGroup):
        self.algo, self.g = algo, g
        self.eager = EagerDescent(g.optimized)

    def __call__(self) -> torch.Tensor:
        algo, g = self.algo, self.g
        g.updates += 1
        due = algo.actor_due(g)
        graph = g.graphs.get(due)
        if graph is None:
            graph = g.graphs[due] = StepGraph(functools.partial(self._step, due),
                                              f"policy {g.name!r}'s gradient step",
                                              algo.use_graphs, algo.timer)
        g.replay.draw_static(algo.cfg.batch_size)
        return graph(*draws(algo, g, algo.cfg.batch_size, due))

    def _step(self, due: bool, *noise) -> torch.Tensor:
        batch = self.g.replay.sample_static()
        stats, _ = self.algo.gradient_step(self.eager, self.g, batch.obs, batch.actions,
                                           batch.rewards, batch.next_obs, batch.terminated,
                                           batch.weights, due, noise)
        return stats


def draws(algo, g: OffPolicyGroup, rows: int, due: bool) -> list:
    """The gradient step's standard normal draws, from torch's generator, in its order."""
    return [torch.randn((rows, g.spec.action_width), device=algo.env.device)
            for _ in range(algo.step_draws(due))]


def graphed_rollout(algo, explore: tuple):
    """A rollout replayed as a CUDA graph, one per way of acting (a rollout that crosses
    `learning_starts` runs eagerly); the replay rings' host counters advance after it."""
    graph = algo.rollout_graphs.get(explore)
    if graph is None and len(set(explore)) == 1:
        graph = algo.rollout_graphs[explore] = StepGraph(
            functools.partial(algo.rollout, explore),
            "the rollout" + (" (random actions)" if explore[0] else ""), algo.use_graphs,
            algo.timer)
    if graph is None:
        algo.rollout(explore)
    elif graph.graph is None:
        graph()
    else:
        with algo.timer("rollout"):  # (a replay runs no Python: no inner sections)
            graph()
    for g in algo.policies:
        for _ in range(algo.config.trainer.rollout_len):
            g.replay.advance(algo.env.num_envs * g.spec.num_agents)


def sum_across_ranks(grads):
    """Sum gradients over ranks (losses are already divided by the global batch)."""
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
