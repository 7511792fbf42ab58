"""A population of SAC, TD3 or DDPG runs trained as one (`trainer.population`): its parts.

The off-policy algorithm (offpolicy.py) is the same; a population builds these parts in
place of a solo run's (`build_members`), and steps through `MembersStep`:
- networks made from each member's seed and settings, stacked
  (`StackedOffPolicy`: online, targets, log-alpha); per network one Adam with a member
  dim, each member's rate and clipping norm (training.speed.descent);
- one replay ring per member (`MemberReplays`: its solo run's, same seed);
- every number a solo run draws from torch's generator (uniform actions before
  `learning_starts`, SAC's Gaussian samples, TD3's and DDPG's noise) drawn in the same
  order from the member's own generator, which starts where torch's stands once its
  networks are made;
- every member's gradient step at once: the solo step (`OffPolicy.gradient_step`)
  under torch.func.vmap over the members' slices, its draws made beforehand and passed
  in (`MemberNets`), its Adam as tensor operations (`MemberDescent`).
A member that stopped learning (diverged, or reached the target) has rate and tau 0.
"""
from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import torch

from ..actors import Actors, UniformPolicy
from ..population.members import member_config, noise_generator
from ..population.stacked import StackedPolicy
from ..replay_buffer import Batch, ReplayBuffer
from ..speed.descent import Adam, adam_update
from .offpolicy_networks import NetsOn, OffPolicyGroup, Optimizers

ADAM_EPS = 1e-8  # training.speed.descent.Adam's default, a solo run's


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
        super().__init__(g, actor, critics, tau, draws)
        self.targets, self.log_alpha, self.bonus = targets, log_alpha, bonus

    def with_actor(self, params: dict) -> MemberNets:
        nets = copy.copy(self)
        nets.actor_params = params
        return nets

    def target_actor(self, obs):
        return torch.func.functional_call(self.model.target_actor, self.targets["target_actor"],
                                          (obs,))

    def q(self, critics, obs, action):
        online = critics is self.model.critics
        return self.model.q(critics, obs, action, self.critic_params if online
                            else self.targets["target_critics"])

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
    """training.speed.descent's interface for one member inside vmap: `torch.func.grad`, then its
    clipped Adam (`adam_update`) in place on its slices."""

    def __init__(self, params: dict, state: dict):
        self.tensors, self.state = params, state

    def params(self, name: str) -> dict:
        return self.tensors[name]

    def step(self, name: str, loss_fn, *args):
        params = self.tensors[name]
        grads, aux = torch.func.grad(loss_fn, has_aux=True)(params, *args)
        exp_avg, exp_avg_sq, step, lr, max_grad_norm = self.state[name]
        adam_update(list(params.values()), [grads[n] for n in params], exp_avg, exp_avg_sq,
                    step, lr, max_grad_norm, ADAM_EPS)
        return aux


def build_members(algo):
    """The population's groups, each member's noise generator, explorers and tau (made as
    each member's solo run makes them)."""
    env, config, members = algo.env, algo.config, algo.members
    settings = [member_config(config, m) for m in members.list]  # each member's solo config
    nets, algo.noise = [], []
    for member, own in zip(members.list, settings):  # made as its solo run does
        torch.manual_seed(member.seed)
        nets.append({name: algo.model_for(own, spec) for name, spec in env.policy_specs.items()})
        algo.noise.append(noise_generator(member.seed, env.device))
    device = env.device
    norms = torch.tensor([c.algo.max_grad_norm for c in settings], device=device)
    algo.policies = []
    for index, (name, spec) in enumerate(env.policy_specs.items()):
        model = StackedOffPolicy([n[name] for n in nets]).to(env.device)
        model.generators = algo.noise
        parts = model.parts()

        def adam(params: dict):  # (vmapped steps read its rates on the device)
            return Adam(list(params.values()), 0.0, eps=ADAM_EPS, max_grad_norm=norms,
                        members=members.count, device_lr=True)
        tuned = nets[0][name].log_alpha.requires_grad
        optimizers = Optimizers(actor=adam(parts["actor"]), critic=adam(parts["critic"]),
                                alpha=adam({"log_alpha": parts["log_alpha"]}) if tuned else None)
        cfg = algo.cfg
        replay = MemberReplays([
            ReplayBuffer(cfg.replay_size, spec.obs_dim, (spec.action_width,), torch.float32,
                         env.device, prioritized=cfg.prioritized_replay,
                         alpha=cfg.priority_alpha, seed=m.seed * 1000 + index)
            for m in members.list])
        algo.policies.append(OffPolicyGroup(name, spec, algo.agents[name], model, optimizers,
                                          replay))
    algo.explorers = Actors(env, {name: MemberUniform(spec, device, algo.noise)
                                  for name, spec in env.policy_specs.items()})
    algo.tau_base = torch.tensor([c.algo.tau for c in settings], device=device)
    algo.tau = algo.tau_base.clone()
    first = next(iter(env.policy_specs))
    algo.bonus = torch.tensor([float(n[first].entropy_bonus) for n in nets], device=device)


class MembersStep:
    """Every member's gradient step on its own batch, at once: (members, statistics)."""

    def __init__(self, algo, g: OffPolicyGroup):
        self.algo, self.g = algo, g

    def __call__(self) -> torch.Tensor:
        algo, g, cfg = self.algo, self.g, self.algo.cfg
        batch = g.replay.sample(cfg.batch_size, beta=cfg.priority_beta)
        g.updates += 1
        due = algo.actor_due(g)
        shape = (cfg.batch_size, g.spec.action_width)
        draws = [_draws(algo.noise, shape).view((len(algo.noise),) + shape)
                 for _ in range(algo.step_draws(due))]  # in a solo step's order, per member
        opts = {name: (adam.exp_avg, adam.exp_avg_sq, adam.step_count, adam.lr,
                       adam.max_grad_norm) for name, adam in g.optimizer.by_name.items()}
        view = SimpleNamespace(model=g.model.template, spec=g.spec,
                               optimizer=g.optimizer)
        step = functools.partial(self._member_step, view, due)
        stats, td = torch.func.vmap(step)(
            g.model.parts(), opts, algo.tau, algo.bonus, draws, batch.obs, batch.actions,
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
        return self.algo.gradient_step(descent, view, *batch, due, nets=nets)
