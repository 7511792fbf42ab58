"""A population of SAC, TD3 or DDPG runs trained as one (`trainer.population`,
training.population).

`populated(SAC)` is SAC with every member's networks stacked and its replicas
side by side in one env (member k's are the k-th share). What changes against
a solo run, and only that, is written here:
- networks made from each member's seed and settings, stacked
  (`StackedOffPolicy`: online, targets, log-alpha); per member one Adam per
  network with its rate and clipping norm (StackedAdam's state, stepped by
  `_adam` under vmap);
- one replay ring per member (`MemberReplays`: its solo run's, same seed);
- every number a solo run draws from torch's generator (uniform actions
  before `learning_starts`, SAC's Gaussian samples, TD3's and DDPG's noise)
  drawn in the same order from the member's own generator, which starts where
  torch's stands once its networks are made;
- every member's gradient step at once: the solo step
  (OffPolicy._gradient_step) under torch.func.vmap over the members' slices,
  its draws made beforehand and passed in (`MemberNets`);
- statistics and episode returns per member ("agent/m3");
- a member whose loss or parameters stop being finite goes back to its state
  before that update and is frozen (rate and tau 0), with one line; the
  others go on (the run stops only when every member has diverged);
- with `trainer.target_return`, a member that reaches it stops learning there.
Members run uncompiled.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import replace
from types import SimpleNamespace

import torch

from gpusim.errors import GpusimError

from ..actors import Actors, UniformPolicy
from ..episodes import EpisodeTracker
from ..members import member_config
from ..population import MemberLives, StackedAdam, StackedPolicy, noise_generator
from ..replay import Batch, ReplayBuffer
from .offpolicy import OffPolicyGroup, Optimizers
from .offpolicy_networks import NetsOn

ADAM_EPS = 1e-8  # training.acceleration.adam's, a solo run's


def _draws(generators: list, shape: tuple, uniform: bool = False) -> torch.Tensor:
    """Each member's draws of `shape` from its own generator, side by side on dim 0."""
    draw = torch.rand if uniform else torch.randn
    return torch.cat([draw(shape, generator=g, device=g.device) for g in generators])


class StackedOffPolicy(StackedPolicy):
    """The members' OffPolicyModels as one (StackedPolicy): acting draws each member's
    Gaussian or exploration noise from its own generator (`generators`)."""

    def __init__(self, nets: list):
        super().__init__(nets)
        self.width = nets[0].half_range.shape[-1]
        self.draws_noise = nets[0].actor.stochastic or bool(nets[0].exploration_noise)
        self.generators = None
        self.calls["sample_actions"] = _SampleActions(self.template)

    def sample(self, obs, deterministic: bool = False):
        noise = None
        if not deterministic and self.draws_noise:
            share = (obs.shape[0] // self.size,) + obs.shape[1:-1] + (self.width,)
            noise = _draws(self.generators, share)
        action, env_action = self.run("sample_actions", obs, deterministic, noise)
        return action, None, env_action

    def parts(self) -> dict:
        """The stacked tensors as the gradient step takes them: per network ("actor",
        "critic", "target_actor", "target_critics") its parameters by their names in it,
        and "log_alpha"; detached aliases (loading a checkpoint copies into them)."""
        params, _ = self.stacked()
        out = {"actor": {}, "critic": {}, "target_actor": {}, "target_critics": {}}
        for name, tensor in params.items():
            if name == "log_alpha":
                out["log_alpha"] = tensor.detach()
                continue
            net, rest = name.split(".", 1)
            out["critic" if net == "critics" else net][rest] = tensor.detach()
        return out


class _SampleActions(torch.nn.Module):
    """OffPolicyModel.sample without its None (vmap returns tensors only)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, obs, deterministic, noise):
        action, _, env_action = self.net.sample(obs, deterministic, noise)
        return action, env_action


class MemberUniform(UniformPolicy):
    """Uniformly random actions, each member's from its own generator."""

    def __init__(self, spec, device, generators: list):
        super().__init__(spec, device)
        self.generators = generators

    def sample(self, obs, deterministic: bool = False):
        share = (obs.shape[0] // len(self.generators),) + obs.shape[1:-1] + (self.width,)
        unit = _draws(self.generators, share, uniform=True) * 2 - 1
        return unit, None, self.center + self.half_range * unit


class MemberReplays:
    """One replay ring per member (its solo run's, with its seed). Rows added are every
    member's side by side (member k's: the k-th of N equal parts); a batch is every
    member's own, stacked (members, batch, ...)."""

    def __init__(self, rings: list):
        self.rings = rings

    def __len__(self) -> int:
        return sum(len(r) for r in self.rings)

    def add(self, *fields, valid=None):
        size = len(self.rings)
        parts = [f.chunk(size) for f in fields]
        valids = [None] * size if valid is None else valid.chunk(size)
        for k, ring in enumerate(self.rings):
            ring.add(*(p[k] for p in parts), valid=valids[k])

    def sample(self, batch: int, beta: float) -> Batch:
        drawn = [ring.sample(batch, beta=beta) for ring in self.rings]
        return Batch(*(torch.stack(field) for field in zip(*drawn)))

    def update_priorities(self, index, priorities):
        for k, ring in enumerate(self.rings):
            ring.update_priorities(index[k], priorities[k])

    def state_dict(self) -> dict:
        return {"members": [ring.state_dict() for ring in self.rings]}

    def load_state_dict(self, state: dict):
        held = state.get("members") if isinstance(state, dict) else None
        if not isinstance(held, list) or len(held) != len(self.rings):
            raise ValueError(f"the replay state holds {len(held or ())} members' rings; this "
                             f"run has {len(self.rings)}")
        for ring, saved in zip(self.rings, held):
            ring.load_state_dict(saved)


class MemberNets(NetsOn):
    """One member's networks inside the vmapped step: its slices of the stacked weights,
    its alpha, tau and standard normal draws (made beforehand from its generator, taken
    in the order a solo run draws them)."""

    def __init__(self, g, actor, critics, tau, targets: dict, log_alpha, bonus, draws):
        super().__init__(g, actor, critics, tau)
        self.targets, self.log_alpha, self.bonus = targets, log_alpha, bonus
        self.draws = iter(draws)  # shared with the copies `with_actor` makes

    def with_actor(self, params: dict) -> MemberNets:
        nets = copy.copy(self)
        nets.actor_params = params
        return nets

    def actor(self, obs, deterministic: bool = False):
        noise = None if deterministic or not self.model.actor.stochastic else next(self.draws)
        return torch.func.functional_call(self.model.actor, self.actor_params,
                                          (obs, deterministic, noise))

    def target_actor(self, obs):
        return torch.func.functional_call(self.model.target_actor, self.targets["target_actor"],
                                          (obs,))

    def q(self, critics, obs, action):
        online = critics is self.model.critics
        return self.model.q(critics, obs, action, self.critic_params if online
                            else self.targets["target_critics"])

    def randn_like(self, like):
        return next(self.draws)

    def alpha(self, log_alpha=None):
        # bonus 0: no entropy term (DDPG, TD3, sac_alpha 0), as OffPolicyModel.alpha
        return (self.log_alpha if log_alpha is None else log_alpha).exp() * self.bonus

    def soft_update(self):
        with torch.no_grad():
            for online, target in ((self.critic_params, self.targets["target_critics"]),
                                   (self.actor_params, self.targets["target_actor"])):
                for name, param in online.items():
                    target[name].copy_(torch.lerp(target[name], param, self.tau))


class MemberDescent:
    """training.fused's descent interface for one member inside vmap: `torch.func.grad`,
    then its clipped Adam in place on its slices."""

    def __init__(self, params: dict, state: dict):
        self.tensors, self.state = params, state

    def params(self, name: str) -> dict:
        return self.tensors[name]

    def step(self, name: str, loss_fn, *args):
        params = self.tensors[name]
        grads, aux = torch.func.grad(loss_fn, has_aux=True)(params, *args)
        _adam(list(params.values()), [grads[n] for n in params], *self.state[name])
        return aux


def _adam(params, grads, step, exp_avg, exp_avg_sq, lr, max_grad_norm, betas=(0.9, 0.999)):
    """clip_grad_norm_ (unless the member's norm is 0), then torch's Adam step (StackedAdam's
    arithmetic, on one member's slices); a member at rate 0 stands still."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.where(max_grad_norm > 0, (max_grad_norm / (total + 1e-6)).clamp(max=1.0),
                        torch.ones_like(total))
    beta1, beta2 = betas
    step.add_(1)
    bias1, bias2_sqrt = 1 - beta1 ** step, (1 - beta2 ** step).sqrt()
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
        g = g * scale
        # out of place, then copied: vmap has no batching rule for lerp_ and addcmul_
        m.copy_(torch.lerp(m, g, 1 - beta1))
        v.copy_(v.mul(beta2).addcmul(g, g, value=1 - beta2))
        change = (lr / bias1) * m / (v.sqrt() / bias2_sqrt + ADAM_EPS)
        p.sub_(torch.where(lr > 0, change, torch.zeros_like(change)))


class OffPolicyPopulation(MemberLives):
    """Mixed in before SAC, TD3 or DDPG: see the module."""
    graphs_gradient_step = False  # each member samples its own ring, under vmap

    def __init__(self, config, env, context, timer):
        t = config.trainer
        size = self._take_members(config, env, context)
        row = sum(4 * (2 * s.obs_dim + s.action_width + 3) for s in env.policy_specs.values())
        env.backend.check_fits(f"the population's replay buffers ({size} x "
                               f"{config.algo.replay_size:,} transitions per policy)",
                               size * config.algo.replay_size * row)
        self.settings = [member_config(config, m) for m in self.members]  # solo configs
        self.member_nets, self.noise = [], []
        for member, own in zip(self.members, self.settings):  # made as its solo run does
            torch.manual_seed(member.seed)
            self.member_nets.append({name: self.model_for(own, spec)
                                     for name, spec in env.policy_specs.items()})
            self.noise.append(noise_generator(member.seed, env.device))
        # members run uncompiled: one batched call each is what compiling would buy
        super().__init__(replace(config, trainer=replace(t, compile="off")), env, context,
                         timer)
        device = env.device
        self.episodes = EpisodeTracker(env, t.rollout_len, self.agents, members=size)
        self.explorers = Actors(env, {name: MemberUniform(spec, device, self.noise)
                                      for name, spec in env.policy_specs.items()})
        self.alive = [True] * size     # still learning
        self.finished = [False] * size  # reached trainer.target_return
        self.member_lr = torch.tensor([c.trainer.lr for c in self.settings], device=device)
        self.tau_base = torch.tensor([c.algo.tau for c in self.settings], device=device)
        self.tau = self.tau_base.clone()
        first = next(iter(env.policy_specs))
        self.bonus = torch.tensor([float(nets[first].entropy_bonus)
                                   for nets in self.member_nets], device=device)
        del self.member_nets  # (stacked now)

    def reported_names(self) -> list:
        return [f"{name}/{m.name}" for name in self.env.policy_specs for m in self.members]

    def _policy_group(self, name, spec) -> OffPolicyGroup:
        env, cfg = self.env, self.cfg
        nets = [nets[name] for nets in self.member_nets]
        model = StackedOffPolicy(nets).to(env.device)
        model.generators = self.noise
        parts = model.parts()
        norms = torch.tensor([c.algo.max_grad_norm for c in self.settings], device=env.device)

        def adam(params: dict):
            return StackedAdam(list(params.values()), torch.zeros(len(self.members),
                                                                  device=env.device),
                               norms, eps=ADAM_EPS)
        tuned = nets[0].log_alpha.requires_grad
        optimizers = Optimizers(actor=adam(parts["actor"]), critic=adam(parts["critic"]),
                                alpha=adam({"log_alpha": parts["log_alpha"]}) if tuned
                                else None)
        index = list(env.policy_specs).index(name)
        replay = MemberReplays([
            ReplayBuffer(cfg.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                         env.device, prioritized=cfg.prioritized_replay,
                         alpha=cfg.priority_alpha, seed=m.seed * 1000 + index)
            for m in self.members])
        return OffPolicyGroup(name, spec, self.agents[name], model, optimizers, replay)

    # ---- the update: every member's gradient step as one ----------------------------
    def update(self, lr: float) -> dict:
        t = self.config.trainer
        learning = self.env_steps + t.steps_per_iteration > self.cfg.learning_starts
        steps = self.gradient_steps_per_iteration() if learning else 0
        alive = torch.tensor(self.alive, dtype=torch.float32, device=self.env.device)
        rates = self.member_lr * (lr / t.lr) * alive  # the loop's schedule, scaled per member
        self.tau.copy_(self.tau_base * alive)  # a frozen member's targets stay too
        before = [self._group_state(g) for g in self.groups] if steps else None
        totals = []
        for g in self.groups:
            for opt in g.optimizer.by_name.values():
                opt.lr.copy_(rates)
            total = torch.zeros((len(self.members), len(self.stats)), device=self.env.device)
            for _ in range(steps):
                total += self.gradient_step(g)
            totals.append(total / max(1, steps))
        values = torch.stack(totals).tolist()  # (policies, members, statistics): one read
        if steps:
            self._freeze_diverged(values, before)
        return {f"{g.name}/{m.name}": dict(zip(self.stats, values[i][k]))
                for i, g in enumerate(self.groups) for k, m in enumerate(self.members)
                if self.alive[k]}

    def gradient_step(self, g: OffPolicyGroup) -> torch.Tensor:
        """Every member's gradient step on its own batch: (members, statistics)."""
        cfg = self.cfg
        batch = g.replay.sample(cfg.batch_size, beta=cfg.priority_beta)
        g.updates += 1
        due = self.actor_due(g)
        shape = (cfg.batch_size, g.spec.action_width)
        draws = [_draws(self.noise, shape).view((len(self.members),) + shape)
                 for _ in range(self.step_draws(due))]  # in a solo step's order, per member
        opts = {name: (opt.step_count, opt.exp_avg, opt.exp_avg_sq, opt.lr, opt.max_grad_norm)
                for name, opt in g.optimizer.by_name.items()}
        view = SimpleNamespace(model=g.model.template, spec=g.spec, updates=g.updates,
                               optimizer=g.optimizer)
        step = functools.partial(self._member_step, view, due)
        stats, td = torch.func.vmap(step)(
            g.model.parts(), opts, self.tau, self.bonus, draws, batch.obs, batch.actions,
            batch.rewards, batch.next_obs, batch.terminated, batch.weights)
        if cfg.prioritized_replay:
            g.replay.update_priorities(batch.index, td.abs().max(1).values)
        return stats

    def _member_step(self, view, due, parts, opts, tau, bonus, draws, *batch):
        """One member's solo gradient step (under vmap: its slices, its draws)."""
        descent = MemberDescent({"actor": parts["actor"], "critic": parts["critic"],
                                 "alpha": {"log_alpha": parts["log_alpha"]}}, opts)
        nets = MemberNets(view, parts["actor"], parts["critic"], tau, parts,
                          parts["log_alpha"], bonus, draws)
        return self._gradient_step(descent, view, *batch, due, nets=nets)

    # ---- divergence, the target return and checkpoints ------------------------------
    @staticmethod
    def _tensors(g: OffPolicyGroup) -> list:
        out = list(g.model.parameters())
        for opt in g.optimizer.by_name.values():
            out += opt.exp_avg + opt.exp_avg_sq + [opt.step_count]
        return out

    def state_dict(self) -> dict:
        return dict(super().state_dict(), noise_rngs=[g.get_state() for g in self.noise],
                    alive=list(self.alive), finished=list(self.finished))

    def load_state_dict(self, state: dict):
        if len(state.get("alive", ())) != len(self.members):
            raise GpusimError(f"the checkpoint holds {len(state.get('alive', ()))} population "
                              f"members; this run has {len(self.members)}")
        super().load_state_dict(state)
        for generator, saved in zip(self.noise, state["noise_rngs"]):
            generator.set_state(saved)
        self.alive = list(state["alive"])
        self.finished = list(state.get("finished", [False] * len(self.members)))
