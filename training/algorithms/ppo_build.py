"""What a PPO run is made of, and how it runs, chosen once when it is built (ppo.py).

`build`: the rollout buffers' size checked, then `make_policies`: each policy's model
(made from the run's seed; a population's from each member's seed, as its solo run
makes them, then stacked), its Adam and rollout buffer; the league, if any. `choose_speed`: the device's speed wrapped around PPO's plain methods, in one
place: on a CUDA device the rollout (`PPO.rollout`) and the whole update
(`PPO.update_all`) are replayed as CUDA graphs where their shapes are fixed; where rows
out of play are left out, the update runs eagerly around graphs of its fixed-size
parts (the value pass's chunks, GAE, each minibatch's chunks and its optimizer step);
a minibatch step runs in chunks of `max_minibatch_rows` rows, or compiled whole
(`trainer.compile`); under DDP its chunks before the last skip the all-reduce.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .. import losses
from ..losses import take
from ..acceleration import MaybeCompiled
from ..actors import Actors
from ..descent import Adam, CompiledDescent, MinibatchStep
from ..graphs import FixedChunks, StepGraph
from ..league import League, NoLeague
from ..models import make_model
from ..noise_scale import NoiseScale
from ..population import noise_generator
from ..stacked import StackedPolicy
from .rollout import PolicyBuffer, TruncationBootstrap, buffer_bytes


@dataclass
class Policy:
    """One policy: its space, agents, model (stacked for a population), Adam, buffer, and
    how its passes run."""
    name: str
    spec: object             # its gpusim.spaces.PolicySpec
    agents: object           # a slice when the ids are contiguous (a view), else an index tensor
    model: torch.nn.Module
    adam: Adam
    buffer: PolicyBuffer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    value: object = None     # critic input -> value, for rollouts
    forward: object = None   # the training pass: (obs, actions, mask, critic_obs) -> (log-prob,
                             # entropy, value)
    step: object = None      # one minibatch step (training.descent)
    value_rows: object = None  # the critic on flat buffer rows, in fixed-size chunks
    gae: object = None       # losses.gae with this run's gamma and lambda

    @property
    def continuous(self) -> bool:
        return self.spec.continuous

    def graphs(self) -> list:
        """Its parts' StepGraphs (their graphs captured on a CUDA device only)."""
        return [self.gae, self.value_rows.graph, self.step.chunk_step,
                self.step.optimizer_step]


def build(ppo):
    """A PPO's parts (see the module)."""
    env, t, members = ppo.env, ppo.config.trainer, ppo.members
    mask = env.action_mask()
    ppo.mask_width = 0 if mask is None else mask.shape[-1]
    ppo.state_dim = env.global_state().shape[-1] if ppo.central else 0
    env.backend.check_fits(
        f"the rollout buffers ({t.rollout_len} steps x {env.num_envs:,} replicas x "
        f"{env.num_agents} agents)",
        sum(buffer_bytes(spec, t.rollout_len, env.num_envs, ppo.state_dim, ppo.mask_width)
            for spec in env.policy_specs.values()))
    ppo.check_models_fit(networks=2 * members.count)  # an actor and a critic each
    ppo.policies = make_policies(ppo)
    ppo.league = League(ppo) if ppo.cfg.league else NoLeague()
    ppo.actors = Actors(env, {p.name: ppo.league.acting(p.name, p.model) for p in ppo.policies},
                        wrap=lambda fn, what: MaybeCompiled(fn, what, ppo.compile_acting))
    for p in ppo.policies:
        counted = ppo.league.counted(p.name, env.num_envs, env.device)
        if counted is not None:
            ppo.episodes.counted[p.name] = counted
    ppo.bootstrap = TruncationBootstrap(env, t.rollout_len, t.gamma, ppo.central,
                                        ppo.actors.memory)
    ppo.shuffles = members.shuffles()
    ppo.episodes.members = members.count
    # a number each (solo), or one per member: what the loss and GAE take
    ppo.coefs = tuple(members.setting(k) for k in ("clip_coef", "ent_coef", "vf_coef"))
    lam = members.setting("gae_lambda")
    ppo.lam = lam if members.solo else lam.repeat_interleave(t.num_envs)[None, :, None]
    per_member = () if members.solo else (members.count,)
    ppo.update_stats = torch.zeros((len(ppo.policies),) + per_member + (len(ppo.stats),),
                                   device=env.device)
    ppo.noise = NoiseScale.for_run(ppo)  # the gradient noise scale, where asked for
    choose_speed(ppo)


def make_policies(ppo) -> list:
    env, config, t, members = ppo.env, ppo.config, ppo.config.trainer, ppo.members
    nets, noise = [], []
    for member in members.list if not members.solo else ():
        torch.manual_seed(member.seed)
        nets.append({name: make_model(spec, config.policy, ppo.state_dim or None)
                     for name, spec in env.policy_specs.items()})
        noise.append(noise_generator(member.seed, env.device))
    policies = []
    for name, spec in env.policy_specs.items():
        if members.solo:
            model = make_model(spec, config.policy, ppo.state_dim or None).to(env.device)
        else:
            model = StackedPolicy([n[name] for n in nets]).to(env.device)
            model.generators = noise  # each member's exploration from its own generator
        adam = Adam(model.parameters(), members.rates(t.lr), eps=1e-5,
                    max_grad_norm=members.setting("max_grad_norm"),
                    members=0 if members.solo else members.count, device_lr=ppo.use_graphs)
        buffer = PolicyBuffer(spec, t.rollout_len, env.num_envs, env.device, ppo.state_dim,
                              ppo.mask_width, getattr(model, "state_size", 0),
                              max(1, ppo.bptt_len))
        policies.append(Policy(name, spec, ppo.agents[name], model, adam, buffer,
                               wrap(model, ppo.distributed, env.device)))
    return policies


def choose_speed(ppo):
    """Wrap PPO's methods in the speed this device allows (see the module)."""
    env, cfg, t = ppo.env, ppo.cfg, ppo.config.trainer
    static, graphs, timer = ppo.static, ppo.use_graphs, ppo.timer
    fixed = env.agent_active_array is None or cfg.out_of_play == "weigh" or ppo.bptt_len
    # the whole update one graph where its shapes are fixed (DDP all-reduces inside it)
    ppo.whole_update = static and fixed and not ppo.distributed
    ppo.rollout_graph = StepGraph(ppo.rollout, "the rollout", graphs, timer)
    ppo.update_graph = StepGraph(ppo.update_all, "the update", graphs and ppo.whole_update,
                                 timer)
    parts = static and not ppo.whole_update and not ppo.distributed  # else its parts
    chunk = max(1, cfg.max_minibatch_rows // max(1, ppo.bptt_len))  # units per chunk
    fused = ppo.use_compile and not ppo.distributed and not ppo.bptt_len
    for p in ppo.policies:
        what = f"policy {p.name!r}"
        p.value = MaybeCompiled(p.model.value, f"{what} (value)", ppo.compile_acting)
        p.forward = MaybeCompiled(p.train_model, f"{what} (update)", ppo.use_compile and not fused)
        p.gae = StepGraph(lambda r, v, d, n: losses.gae(r, v, d, n, t.gamma, ppo.lam),
                          f"{what}'s GAE", graphs and parts, timer)
        p.value_rows = FixedChunks(
            lambda rows, p=p: ppo.critic(p, take(p.buffer.flat("obs"), rows), None),
            cfg.max_minibatch_rows, f"{what}'s value chunk", parts, graphs, timer)
        chunked = MinibatchStep(lambda *batch, p=p: ppo.loss(p, *batch), p.adam, chunk,
                                unit_dim=0 if ppo.members.solo else 1,
                                no_sync=p.train_model.no_sync if ppo.distributed else None,
                                pad=parts, graphs=graphs and parts,
                                what=f"{what}'s minibatch", timer=timer)
        p.step = chunked if not fused else CompiledFirst(compiled_step(ppo, p), chunked, chunk)
        if p.forward.active:
            probe(ppo, p)


def compiled_step(ppo, p: Policy) -> CompiledDescent:
    """A minibatch step as one compiled call: PPO's loss on the parameters, differentiated
    and stepped inside (training.descent)."""
    def loss(params, rows, adv, returns, weights):
        def forward(*inputs):
            return torch.func.functional_call(p.model, params, inputs)
        stats, value = ppo.loss(p, rows, adv, returns, weights, forward=forward)
        return value, stats
    return CompiledDescent({"model": (dict(p.model.named_parameters()), p.adam)},
                           lambda descent, *batch: descent.step("model", loss, *batch),
                           f"policy {p.name!r} (update)",
                           dynamic=ppo.env.agent_active_array is not None)  # rows vary


class CompiledFirst:
    """A minibatch step compiled whole where it is one chunk and compiling worked, else
    the chunked eager step."""

    def __init__(self, compiled: CompiledDescent, chunked: MinibatchStep, chunk: int):
        self.compiled, self.chunked, self.chunk = compiled, chunked, chunk
        self.chunk_step, self.optimizer_step = chunked.chunk_step, chunked.optimizer_step
        self.pad = chunked.pad

    def __call__(self, rows, adv, returns, weights, total, members=None):
        if rows.shape[0] <= self.chunk:
            out = self.compiled(rows, adv, returns, weights)
            if out is not None:
                return out
        return self.chunked(rows, adv, returns, weights, total, members)


def probe(ppo, p: Policy):
    """Compile the update's forward and backward now, so a compiler failure falls back
    before training (a backward compiled lazily could not fall back later)."""
    rows = torch.arange(min(8, p.buffer.rewards.numel()), device=ppo.env.device)
    inputs = ppo.gather(p.buffer, rows[:, None] if ppo.bptt_len else rows)["inputs"]
    no_sync = p.train_model.no_sync() if ppo.distributed else contextlib.nullcontext()
    try:
        with no_sync, ppo.precision.autocast():
            out = p.forward.compiled(*inputs)
        with no_sync:
            sum(o.float().sum() for o in out).backward()
    except Exception as exc:  # noqa: BLE001 - any compiler failure: run eagerly
        p.forward.fall_back(exc)
    p.adam.zero_grad()


def wrap(model, distributed: bool, device):
    """DDP under several ranks (gradients averaged); its constant buffers (a Gaussian's
    bounds) need no broadcast on every forward."""
    if not distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **no_buffer_sync())


def no_buffer_sync() -> dict:
    """DDP's keyword for "no buffer broadcast on every forward" (the models' buffers are
    constants, the same on every rank): `forward_sync_buffers` where torch has it (it
    deprecates `broadcast_buffers` with a warning), else `broadcast_buffers`."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}
