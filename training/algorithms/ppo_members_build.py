"""What a PPO run is made of, and how it runs, chosen once when it is built (ppo.py).

First `choose_speed`: the device's speed, in one record (`Speed`): on a CUDA device the
rollout (`PPO.rollout`) and the whole update (`PPO.update_all`) are replayed as CUDA
graphs where their shapes are fixed; where rows out of play are left out, the update
runs eagerly around graphs of its fixed-size parts (the value pass's chunks, GAE, each
minibatch's chunks and its optimizer step); elsewhere these are plain functions. A
minibatch step runs in chunks of `max_minibatch_rows` rows, or compiled whole
(`trainer.compile`); under DDP its chunks before the last skip the all-reduce. Then the
rollout buffers' size checked, and `make_policies`: each `Policy` built whole: its model
(made from the run's seed; a population's from each member's seed, as its solo run
makes them, then stacked), its Adam and rollout buffer, and its passes as the speed
chose them around PPO's plain methods. Last, `probe`: a compiled training pass tried
before training.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import InitVar, dataclass, field

import torch

from .. import losses
from ..actors import Actors
from ..losses import take
from ..models import make_model
from ..population.members import noise_generator
from ..population.stacked import StackedPolicy, one_member
from ..speed.acceleration import MaybeCompiled
from ..speed.descent import Adam, CompiledDescent, MinibatchStep
from ..speed.graphs import FixedChunks, StepGraph, graphs_of, step_graph
from .ppo_members_units import EVERYONE
from .rollout import PolicyBuffer, buffer_bytes


@dataclass
class Speed:
    """How a PPO run runs, chosen once, before its policies are built (`choose_speed`): its
    rollout (a `StepGraph`, replayed where captured), its whole update (`PPO.update_all`, a
    `StepGraph` where it is one captured graph: every member runs in it, those no longer
    learning at rate 0), and what each policy's passes are (`Policy`)."""
    rollout: StepGraph
    update_all: object
    whole: bool       # the whole update one graph
    parts: bool       # else its fixed-size parts static (`StepGraph`s), the chunks padded
    capture: bool     # static steps captured as CUDA graphs (a CUDA device)
    chunk: int        # units (rows, or a recurrent policy's sequences) per minibatch chunk
    fused: bool       # a minibatch step compiled whole (training.speed.descent)
    timer: object

    def collect(self, timer):
        """A rollout (its CUDA graph replayed, once captured: one section, "rollout")."""
        with timer("rollout") if self.rollout.graph is not None else contextlib.nullcontext():
            self.rollout()

    def graphs(self, policies: list) -> list:
        return graphs_of([self.rollout, self.update_all]) \
            + [g for p in policies for g in p.graphs()]


def choose_speed(ppo) -> Speed:
    """The speed this device allows (see the module)."""
    env, cfg, static, graphs, timer = ppo.env, ppo.cfg, ppo.static, ppo.use_graphs, ppo.timer
    fixed = env.agent_active_array is None or cfg.out_of_play == "weigh" or ppo.bptt_len
    # the whole update one graph where its shapes are fixed (DDP all-reduces inside it)
    whole = static and fixed and not ppo.distributed
    captured = graphs and whole
    return Speed(StepGraph(ppo.rollout, "the rollout", graphs, timer),
                 step_graph(ppo.update_all, "the update", captured, captured, timer), whole,
                 parts=static and not whole and not ppo.distributed, capture=graphs,
                 chunk=max(1, cfg.max_minibatch_rows // max(1, ppo.bptt_len)),
                 fused=ppo.use_compile and not ppo.distributed and not ppo.bptt_len,
                 timer=timer)


@dataclass
class Policy:
    """One policy: its space, agents, model (stacked for a population), Adam, buffer, and
    how its passes run: made whole from the PPO run `ppo` it belongs to, as its speed
    (`ppo.speed`, chosen first) says."""
    name: str
    spec: object             # its gpusim.spaces.PolicySpec
    agents: object           # a slice when the ids are contiguous (a view), else an index tensor
    model: torch.nn.Module
    adam: Adam
    buffer: PolicyBuffer
    train_model: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    ppo: InitVar[object]
    value: object = field(init=False)  # critic input -> value, for rollouts
    train_pass: MaybeCompiled = field(init=False)  # the train model, compiled where asked
    forward: object = field(init=False)  # the training pass: (obs, actions, mask,
    #   critic_obs, members=) -> (log-prob, entropy, value), each leading with the members
    rows_valued: bool = field(init=False)  # whether the critic runs on flat buffer rows
    rollout_values: object = field(init=False)  # the critic over the stored rollout
    gae: object = field(init=False)  # losses.gae with this run's gamma and lambda
    value_rows: FixedChunks = field(init=False)  # the critic on flat buffer rows, in chunks
    step: MinibatchStep = field(init=False)  # one minibatch step (training.speed.descent)

    def __post_init__(self, ppo):
        speed, solo, what = ppo.speed, ppo.members.solo, f"policy {self.name!r}"
        self.value = MaybeCompiled(self.model.value, f"{what} (value)", ppo.compile_acting)
        self.train_pass = MaybeCompiled(self.train_model, f"{what} (update)",
                                        ppo.use_compile and not speed.fused)
        # a lone network is a population of one; stacked ones take the member dim
        self.forward = one_member(self.train_pass) if solo else self.model.training_pass
        self.rows_valued = solo and not ppo.central  # the critic runs on flat buffer rows
        self.rollout_values = rollout_values(self, functools.partial(
            ppo.values_by_members if not solo else
            ppo.values_by_steps if not ppo.bptt_len else no_values, self))
        gamma = ppo.config.trainer.gamma
        self.gae = step_graph(lambda r, v, d, n: losses.gae(r, v, d, n, gamma, ppo.lam),
                              f"{what}'s GAE", speed.parts, speed.capture and speed.parts,
                              speed.timer)
        self.value_rows = FixedChunks(
            lambda rows: ppo.critic(self, take(self.buffer.flat("obs"), rows), None),
            ppo.cfg.max_minibatch_rows, f"{what}'s value chunk", speed.parts, speed.capture,
            speed.timer)
        self.step = MinibatchStep(ppo.loss_of(self), self.adam, speed.chunk,
                                  no_sync=self.train_model.no_sync if ppo.distributed else None,
                                  pad=speed.parts, graphs=speed.capture and speed.parts,
                                  what=f"{what}'s minibatch", timer=speed.timer,
                                  whole=compiled_step(ppo, self) if speed.fused else None)

    @property
    def continuous(self) -> bool:
        return self.spec.continuous

    def graphs(self) -> list:
        """Its static parts' StepGraphs (their graphs captured on a CUDA device only)."""
        return graphs_of([self.gae, self.value_rows.graph, self.step.chunk_step,
                          self.step.optimizer_step])


def check_buffers_fit(ppo):
    """Refuse, before allocating, rollout buffers or networks the device cannot hold."""
    env, t, count = ppo.env, ppo.config.trainer, ppo.members.count
    members = f"a population of {count} (trainer.population) x {t.num_envs:,}" \
        if count > 1 else f"{env.num_envs:,}"
    env.backend.check_fits(
        f"the rollout buffers ({t.rollout_len} steps x {members} replicas x "
        f"{env.num_agents} agents)",
        sum(buffer_bytes(spec, t.rollout_len, env.num_envs, ppo.state_dim, ppo.mask_width)
            for spec in env.policy_specs.values()))
    ppo.check_models_fit(networks=2 * ppo.members.count)  # an actor and a critic each


def make_actors(ppo) -> Actors:
    """Every agent's actor: a policy's model, or in a league its replicas' snapshots too."""
    return Actors(ppo.env, {p.name: ppo.league.acting(p.name, p.model) for p in ppo.policies},
                  wrap=lambda fn, what: MaybeCompiled(fn, what, ppo.compile_acting))


def coefficients(members, num_envs: int) -> tuple:
    """(clip, entropy and value coefficients; GAE's lambda): a number each (one member), or
    one per member shaped to broadcast over its rows."""
    clip, ent, vf, lam = (members.setting(k) for k in ("clip_coef", "ent_coef", "vf_coef",
                                                       "gae_lambda"))
    if members.solo:
        return (clip, ent, vf), lam
    return (clip[:, None], ent, vf), lam.repeat_interleave(num_envs)[None, :, None]


def make_policies(ppo) -> list:
    """Each policy, built whole (`Policy`): a population's networks stacked."""
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
                               wrap(model, ppo.distributed, env.device), ppo))
    return policies


def rollout_values(p: Policy, whole):
    """Policy `p`'s critic over its stored rollout, into its values (`whole()`); with
    `in_play` (flat rows; a lone critic on its own observations) of those rows only: GAE
    never reads the others from them."""
    def run(in_play=None):
        if in_play is None:
            return whole()
        p.buffer.values.view(-1).zero_().index_copy_(0, in_play, p.value_rows(in_play))
    return run


def no_values(p: Policy):
    """A recurrent policy's values: stored per step as it acted."""


def compiled_step(ppo, p: Policy) -> CompiledDescent:
    """A minibatch step as one compiled call: PPO's loss on the parameters, differentiated
    and stepped inside (training.speed.descent); of a lone network (compiling is solo)."""
    def loss(params, rows, adv, returns, weights):
        def forward(*inputs):
            return torch.func.functional_call(p.model, params, inputs)
        stats, value = ppo.loss(p, rows, adv, returns, weights, EVERYONE,
                                forward=one_member(forward))
        return value.sum(), stats
    return CompiledDescent({"model": (dict(p.model.named_parameters()), p.adam)},
                           lambda descent, *batch: descent.step("model", loss, *batch),
                           f"policy {p.name!r} (update)",
                           dynamic=ppo.env.agent_active_array is not None)  # rows vary


def probe(ppo):
    """Compile each policy's update forward and backward now, so a compiler failure falls
    back before training (a backward compiled lazily could not fall back later)."""
    for p in ppo.policies:
        if p.train_pass.active:
            probe_policy(ppo, p)


def probe_policy(ppo, p: Policy):
    """`probe` of policy `p`."""
    train = p.train_pass
    rows = torch.arange(min(8, p.buffer.rewards.numel()), device=ppo.env.device)
    inputs = ppo.gather(p.buffer, rows[:, None] if ppo.bptt_len else rows)["inputs"]
    no_sync = p.train_model.no_sync() if ppo.distributed else contextlib.nullcontext()
    try:
        with no_sync, ppo.precision.autocast():
            out = train.compiled(*inputs)
        with no_sync:
            sum(o.float().sum() for o in out).backward()
    except Exception as exc:  # noqa: BLE001 - any compiler failure: run eagerly
        train.fall_back(exc)
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


class OwnCritic:
    """The critic on each agent's own observation (IPPO): no global state kept."""
    state_dim = 0
    model_state_dim = None  # (what training.models.make_model takes)

    def __init__(self, env):
        self.env = env

    def state(self, final: bool = False):
        return None

    def value(self, p, own, state, *memory):
        """(..., agents) values of the agents' observations `own` (after `memory`)."""
        return p.value(own, *memory)

    def stored(self, buf: PolicyBuffer, part) -> tuple:
        """The critic's inputs (own, state) of the stored steps `part`."""
        return buf.obs[part], None

    def by_members(self, buf: PolicyBuffer) -> tuple:
        """The critic's inputs of the whole stored rollout, the replicas leading."""
        return buf.obs.transpose(0, 1), None

    def rows(self, buf: PolicyBuffer, rows):
        """The critic's input of flat buffer rows `rows` in a training pass (its own)."""
        return None


class CentralCritic(OwnCritic):
    """The critic on the replica's global state (`policy.critic: central`, MAPPO): one
    value per replica, every agent's."""

    def __init__(self, env):
        self.env = env
        self.state_dim = self.model_state_dim = env.global_state().shape[-1]

    def state(self, final: bool = False):
        return self.env.global_state(final=final)

    def value(self, p, own, state, *memory):
        value = p.value(state)
        return value[..., None].expand(*value.shape, p.spec.num_agents)

    def stored(self, buf: PolicyBuffer, part) -> tuple:
        return buf.obs[part], buf.states[part]

    def by_members(self, buf: PolicyBuffer) -> tuple:
        return buf.obs.transpose(0, 1), buf.states.transpose(0, 1)

    def rows(self, buf: PolicyBuffer, rows):  # its (step, replica) row
        return take(buf.states.view(-1, buf.states.shape[-1]), rows // buf.obs.shape[2])


def critic_input(config, env) -> OwnCritic:
    return (CentralCritic if config.policy.critic == "central" else OwnCritic)(env)


class NoRecurrence:
    """Feed-forward policies: no state carried between steps."""
    length = 0

    def memory(self, name: str) -> tuple:
        """Policy `name`'s recurrent state as the critic's extra input (none)."""
        return ()

    def store(self, t: int, p, values, obs, state):
        """What a recurrent policy keeps of step t (nothing here)."""

    def inputs(self, buf: PolicyBuffer, rows) -> tuple:
        """A training pass's extra inputs for flat rows `rows` (none)."""
        return ()


class Recurrence(NoRecurrence):
    """Recurrent policies (`policy.recurrent`, trained on sequences of `length` steps): the
    actors' states `memory` (policy name -> its latest), stored at every sequence's
    start; the values stored per step as the policy acts (its critic needs the state)."""

    def __init__(self, length: int, memory: dict):
        self.length, self.states = length, memory

    def memory(self, name: str) -> tuple:
        return (self.states[name],)

    def store(self, t: int, p, values, obs, state):
        memory = self.states[p.name]
        if t % self.length == 0:  # a sequence starts
            p.buffer.memory[t // self.length].copy_(memory)
        p.buffer.values[t] = values(p, obs, state, memory)

    def inputs(self, buf: PolicyBuffer, rows) -> tuple:
        """(each sequence's start state, where an episode restarts it): `rows` (..., steps)."""
        per_step = buf.rewards.shape[1] * buf.rewards.shape[2]  # rows between steps
        first = rows[..., 0]
        start_state = buf.memory.view(-1, buf.memory.shape[-1])[
            (first // (per_step * self.length)) * per_step + first % per_step]
        resets = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        if rows.shape[-1] > 1:  # an episode that ended with step l-1 restarts it at l
            resets[..., 1:] = take(buf.dones.reshape(-1), rows[..., :-1])
        return start_state, resets


def recurrence(length: int, memory: dict) -> NoRecurrence:
    return Recurrence(length, memory) if length else NoRecurrence()
