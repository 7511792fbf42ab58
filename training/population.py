"""Populations: many seeds or settings of one run, trained side by side in one process.

`trainer.population: N` trains N members, seeds `seed` .. `seed + N - 1`; a
mapping of learning settings to lists of values (`{lr: [3e-4, 1e-3],
ent_coef: [0.0, 0.01]}`) trains every combination, each with
`trainer.seeds_per_setting` seeds (the same seeds for every setting).
Member k is the run it stands for: its replicas' RNG streams are those of a
solo run with its seed, its networks are made from that seed, its minibatch
shuffles come from a generator of its own.

Here: who the members are (`members`), their networks as one batched
computation (`StackedPolicy`: the parameters of N copies of a network
stacked on a leading member dim, run through torch.func.vmap), their Adam
(`StackedAdam`: one per member, with a learning rate and a clipping norm
each), and the statistics a researcher reads across seeds (`summary`: the
mean with a 95% bootstrap interval, and the interquartile mean).
"""
from __future__ import annotations

import copy
import itertools
import math
import sys
from dataclasses import dataclass, replace

import torch
from torch import nn

from gpusim.errors import ConfigError, GpusimError

# What may differ between members: settings the batched update takes per member. The
# rest shapes the batched computation (networks, sizes) or the env, the same for all.
# An algorithm's config names its own (`sweepable`); these are PPO's and A2C's.
SWEEPABLE = ("lr", "ent_coef", "vf_coef", "clip_coef", "max_grad_norm", "gae_lambda")


def sweepable(algo) -> tuple:
    """The settings the members of a run of `algo` (its config) may differ in."""
    return tuple(getattr(algo, "sweepable", SWEEPABLE))


@dataclass(frozen=True)
class Member:
    index: int
    seed: int
    settings: dict  # sweep key -> this member's value (empty: seeds only)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in self.settings.items()) or "seeds"

    @property
    def name(self) -> str:
        return f"m{self.index}"


def size(trainer) -> int:
    """How many members `trainer.population` makes (1: a solo run)."""
    spec = trainer.population
    if isinstance(spec, dict):
        return math.prod(len(v) for v in spec.values()) * trainer.seeds_per_setting
    return spec


def members(trainer) -> list:
    """The members: each setting of the sweep (in the order given) times the seeds."""
    spec = trainer.population
    if isinstance(spec, dict):
        settings = [dict(zip(spec, map(float, values)))
                    for values in itertools.product(*spec.values())]
        seeds = trainer.seeds_per_setting
    else:
        settings, seeds = [{}], spec
    return [Member(k, trainer.seed + s, setting)
            for k, (setting, s) in enumerate(itertools.product(settings, range(seeds)))]


def check(trainer, algo):
    """Refuse, in one line naming the key, a population no batched run can train."""
    spec = trainer.population
    if isinstance(spec, int):
        if spec < 1:
            raise ConfigError("config key 'trainer.population' must be at least 1 (members), "
                              f"got {spec}")
        return
    if not isinstance(spec, dict) or not spec:
        raise ConfigError("config key 'trainer.population' must be a number of seeds or a "
                          "mapping of settings to lists of values")
    keys = sweepable(algo)
    for key, values in spec.items():
        where = f"trainer.population.{key}"
        if key not in keys:
            raise ConfigError(f"config key '{where}' cannot differ between members: it must "
                              "be the same for every member (the networks, the sizes and the "
                              f"env are shared); members may differ in {', '.join(keys)}")
        if not isinstance(values, (list, tuple)) or not values or not all(
                _number(v) for v in values):
            raise ConfigError(f"config key '{where}' must be a non-empty list of numbers, "
                              f"got {values!r}")
        for value in values:  # each member's setting passes the checks a solo run's does
            target = trainer if key == "lr" else algo
            try:
                replace(target, **{key: float(value)}).check()
            except ConfigError as exc:
                raise ConfigError(f"config key '{where}' holds {value!r}, which a run "
                                  f"refuses: {exc}") from None


def _number(value) -> bool:
    """A number, or text that reads as one (YAML reads 3e-4, without a dot, as text)."""
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def setting(member: Member, key: str, trainer, algo) -> float:
    """The member's value of a sweepable setting: its own, else the config's."""
    if key in member.settings:
        return float(member.settings[key])
    return float(getattr(trainer if key == "lr" else algo, key))


def noise_generator(seed: int, device) -> torch.Generator:
    """The generator a solo run of `seed` draws its noise from: torch's own, as it stands
    after the run made its networks (on the CPU, where making them draws from it) or as
    seeded (on a GPU)."""
    generator = torch.Generator(device=device)
    if device.type == "cpu":
        generator.set_state(torch.get_rng_state())
    else:
        generator.manual_seed(seed)
    return generator


# ---- the members' lives: learning, finished, or frozen after diverging ---------------------
class MemberLives:
    """Mixed into a population algorithm that has `members`, `alive`, `finished`, `groups`
    and `_tensors(group)` (every tensor of a policy's training state, members leading)."""

    def _take_members(self, config, env, context) -> int:
        """Set `members` from the config; refuse several processes and an env that does not
        hold every member's replicas. Returns the population's size."""
        t = config.trainer
        self.members = members(t)
        size = len(self.members)
        if context.world_size > 1:
            raise GpusimError("config key 'trainer.population' with several processes: a "
                              "population trains in one process (drop --num_gpus)")
        if env.num_envs != size * t.num_envs:
            raise GpusimError(f"a population of {size} needs {size} x {t.num_envs} replicas, "
                              f"got {env.num_envs}")
        return size

    def _group_state(self, g) -> list:
        return [t.detach().clone() for t in self._tensors(g)]

    def _freeze_diverged(self, values: list, before: list):
        """A member whose statistics (`values`: policies x members x statistics) or
        parameters stopped being finite goes back to its state `before` this update and is
        frozen, with one line; the others go on. Raises once every member has diverged."""
        checks = [p.reshape(p.shape[0], -1).isfinite().all(1)
                  for g in self.groups for p in g.model.parameters()]
        finite = torch.stack(checks).all(0).tolist()  # one host read
        for k, member in enumerate(self.members):
            stats_finite = all(math.isfinite(v) for policy in values for v in policy[k])
            if self.alive[k] and not (finite[k] and stats_finite):
                with torch.no_grad():
                    for g, saved in zip(self.groups, before):
                        for current, old in zip(self._tensors(g), saved):
                            current[k].copy_(old[k])
                self.alive[k] = False
                alive = sum(self.alive)
                print(f"gpusim: population member {member.name} (seed {member.seed}, "
                      f"{member.label}) diverged (a loss or parameter not finite): frozen at "
                      f"its weights before this update; {alive} member"
                      f"{'s' if alive != 1 else ''} go on", file=sys.stderr, flush=True)
        if not any(self.alive) and not any(self.finished):
            raise GpusimError("every member of the population diverged: lower trainer.lr (or "
                              "the swept lr values) or check the env's rewards")

    def finish(self, k: int, iteration: int):
        """Member k reached the target return: it stops learning there (frozen), as its
        solo run would have stopped; its policy keeps acting, so its returns go on."""
        if self.alive[k]:
            self.alive[k], self.finished[k] = False, True
            member = self.members[k]
            print(f"population member {member.name} (seed {member.seed}, {member.label}) "
                  f"reached the target return at iteration {iteration}: it stops learning "
                  f"there; {sum(self.alive)} still learning", flush=True)


# ---- the members' networks as one computation ----------------------------------------------
class _Call(nn.Module):
    """Calls one method of the network it holds (functional_call runs `forward` only)."""

    def __init__(self, net: nn.Module, method: str):
        super().__init__()
        self.net, self.method = net, method

    def forward(self, *inputs):
        return getattr(self.net, self.method)(*inputs)


class StackedPolicy(nn.Module):
    """N networks of one shape as one: their parameters and buffers stacked on a leading
    member dim. Each method of the network it stacks (`log_probs`, `sample`, `value`,
    `forward`) takes inputs whose leading dim holds the members' rows side by side
    (member k's are the k-th of N equal parts) and runs every member at once.

    A network whose class says `members_lead = True` (training.models' actor-critics) is
    run directly: its methods take inputs with a leading member dim, its MLPs multiply
    stacked weights as one batched product, and its other parameters are swapped in shaped
    to broadcast over the members. Any other runs under torch.func.vmap over
    functional_call, which costs tens of microseconds per operation on a CPU."""

    def __init__(self, nets: list):
        super().__init__()
        self.size = len(nets)
        # the network's structure; its own weights are never used (the members' are swapped
        # in), so it is no submodule: neither in state_dict nor moved by .to()
        template = copy.deepcopy(nets[0]).to("meta")
        object.__setattr__(self, "template", template)
        self.state_size = getattr(nets[0], "state_size", 0)
        self.direct = getattr(type(nets[0]), "members_lead", False)
        params, buffers = torch.func.stack_module_state(nets)
        self.param_names, self.buffer_names = list(params), list(buffers)
        for name, value in params.items():
            self.register_parameter(_flat(name), nn.Parameter(value))
        for name, value in buffers.items():
            self.register_buffer(_flat(name), value)
        object.__setattr__(self, "calls", {m: _Call(template, m) for m in (
            "log_probs", "sample", "value", "forward")})
        # where each stacked tensor goes in the template: (its owner's dict, its key,
        # whether it is a linear layer's, which the MLPs take stacked as they are)
        slots = []
        for name in self.param_names + self.buffer_names:
            *path, key = name.split(".")
            owner = template.get_submodule(".".join(path))
            table = owner._parameters if key in owner._parameters else owner._buffers
            slots.append((table, key, isinstance(owner, nn.Linear)))
        object.__setattr__(self, "slots", slots)

    def stacked(self) -> tuple:
        """(parameters, buffers) by the stacked network's names, each (N, ...)."""
        return ({n: getattr(self, _flat(n)) for n in self.param_names},
                {n: getattr(self, _flat(n)) for n in self.buffer_names})

    def member(self, k: int) -> dict:
        """Member k's state dict, as its own network would have it."""
        params, buffers = self.stacked()
        return {n: t[k].detach().clone() for n, t in {**params, **buffers}.items()}

    def run(self, method: str, *inputs, randomness: str = "error"):
        """`method` of every member on its share of `inputs` (None: not batched)."""
        split = tuple(None if x is None or not isinstance(x, torch.Tensor)
                      else x.reshape((self.size, -1) + x.shape[1:]) for x in inputs)
        if self.direct:
            return _merge(self.lead(method, *(x if x is not None else raw
                                              for x, raw in zip(split, inputs))))
        params, buffers = self.stacked()
        prefixed = ({f"net.{n}": t for n, t in params.items()},
                    {f"net.{n}": t for n, t in buffers.items()})
        dims = tuple(None if x is None else 0 for x in split)
        batched = [x if x is not None else raw for x, raw in zip(split, inputs)]

        def one(p, b, *xs):
            return torch.func.functional_call(self.calls[method], (p, b), xs)
        out = torch.func.vmap(one, in_dims=(0, 0) + dims, randomness=randomness)(
            prefixed[0], prefixed[1], *batched)
        return _merge(out)

    def lead(self, method: str, *inputs, tensors: list | None = None):
        """`method` of a `members_lead` network on inputs (N, ...) of every member at once,
        its outputs (N, ...); on `tensors` (the stacked parameters and buffers in
        `param_names + buffer_names` order, e.g. a subset of the members') where given."""
        if tensors is None:
            params, buffers = self.stacked()
            tensors = list(params.values()) + list(buffers.values())
        rank = next(x.dim() for x in inputs if isinstance(x, torch.Tensor))
        saved = [table[key] for table, key, _ in self.slots]
        try:
            for (table, key, linear), value in zip(self.slots, tensors):
                if not linear:  # (N, 1, .., *shape): broadcasts as shape does for one
                    ones = max(0, rank - value.dim())
                    value = value.reshape(value.shape[:1] + (1,) * ones + value.shape[1:])
                table[key] = value
            return getattr(self.template, method)(*inputs)
        finally:
            for (table, key, _), value in zip(self.slots, saved):
                table[key] = value

    def log_probs(self, obs, mask=None):
        return self.run("log_probs", obs, mask)

    def sample(self, obs, deterministic: bool = False):
        """With `generators` (one per member), member k's exploration noise comes from
        its own, in the order a solo run of it draws; else from torch's."""
        generators = getattr(self, "generators", None)
        if deterministic or generators is None:
            return self.run("sample", obs, deterministic, randomness="different")
        share = (obs.shape[0] // self.size,) + obs.shape[1:-1] + (self.template.dim,)
        noise = torch.cat([torch.randn(share, generator=g, device=obs.device)
                           for g in generators])
        return self.run("sample", obs, False, noise)

    def value(self, critic_obs):
        return self.run("value", critic_obs)

    def forward(self, obs, actions, mask=None, critic_obs=None):
        return self.run("forward", obs, actions, mask, critic_obs)


def _flat(name: str) -> str:
    return name.replace(".", "__")


def _merge(out):
    """vmap's (N, R, ...) outputs as (N * R, ...), the members' rows side by side."""
    if isinstance(out, tuple):
        return tuple(_merge(o) for o in out)
    if isinstance(out, torch.Tensor) and out.dim() >= 2:
        return out.reshape((-1,) + out.shape[2:])
    return out


class StackedAdam:
    """One Adam per member over stacked parameters, each with its own learning rate and
    gradient-norm clip: torch's Adam arithmetic (no weight decay), elementwise, so a
    member's step depends on its own slice alone. `lr` and `max_grad_norm` are (N,)
    tensors changed in place; a member with learning rate 0 stands still."""

    def __init__(self, params: list, lr: torch.Tensor, max_grad_norm: torch.Tensor,
                 betas=(0.9, 0.999), eps: float = 1e-5):
        self.params, self.lr, self.max_grad_norm = params, lr, max_grad_norm
        self.betas, self.eps = betas, eps
        self.step_count = torch.zeros(params[0].shape[0], device=params[0].device)
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        """One step of every member: torch's clip_grad_norm_ then Adam, with each member's
        norm, clip and rate, as list-wide (foreach) operations."""
        params = self.params
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        members = self.step_count.shape[0]
        shapes = [(members,) + (1,) * (p.dim() - 1) for p in params]
        norms = torch.cat([g.reshape(members, -1) for g in grads], 1).norm(dim=1)
        scale = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        scale = torch.where(self.max_grad_norm > 0, scale, torch.ones_like(scale))
        beta1, beta2 = self.betas
        self.step_count.add_(1)
        bias1 = 1 - beta1 ** self.step_count
        bias2_sqrt = (1 - beta2 ** self.step_count).sqrt()
        rate = self.lr / bias1
        with torch.no_grad():
            grads = torch._foreach_mul(grads, [scale.view(s) for s in shapes])
            torch._foreach_lerp_(self.exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(self.exp_avg_sq, beta2)
            torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1 - beta2)
            denom = torch._foreach_sqrt(self.exp_avg_sq)
            torch._foreach_div_(denom, [bias2_sqrt.view(s) for s in shapes])
            torch._foreach_add_(denom, self.eps)
            change = torch._foreach_div(self.exp_avg, denom)
            torch._foreach_mul_(change, [rate.view(s) for s in shapes])
            moving = self.lr > 0
            if moving.device.type == "cpu" and bool(moving.all()):
                torch._foreach_sub_(params, change)
            else:  # a member at rate 0 stands still even where its moments are not finite
                torch._foreach_sub_(params, [torch.where(moving.view(s), c, 0.0)
                                             for c, s in zip(change, shapes)])

    def state_dict(self) -> dict:
        return {"step": self.step_count.clone(), "exp_avg": [m.clone() for m in self.exp_avg],
                "exp_avg_sq": [v.clone() for v in self.exp_avg_sq]}

    def load_state_dict(self, state: dict):
        self.step_count.copy_(state["step"])
        for mine, saved in zip(self.exp_avg + self.exp_avg_sq,
                               state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved)


# ---- what a researcher reads across seeds -------------------------------------------------
def interquartile_mean(values: list) -> float:
    """The mean of the middle half (rliable's IQM): robust to a few outlying seeds."""
    ordered = sorted(values)
    n = len(ordered)
    cut = n // 4
    middle = ordered[cut:n - cut] if n - 2 * cut > 0 else ordered
    return sum(middle) / len(middle)


def bootstrap_interval(values: list, resamples: int = 2000, seed: int = 0) -> tuple:
    """The 95% percentile-bootstrap interval of the mean across `values` (seeds)."""
    data = torch.tensor(values, dtype=torch.float64)
    if len(values) < 2:
        return (float(data.mean()), float(data.mean()))
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(values), (resamples, len(values)), generator=generator)
    means = data[picks].mean(1)
    return (float(means.quantile(0.025)), float(means.quantile(0.975)))


def summary(members: list, returns: dict) -> list:
    """Per setting: the members' mean return, its 95% bootstrap interval across seeds and
    the interquartile mean. `returns`: member name -> its mean return (None: none yet)."""
    rows = []
    for label, group in itertools.groupby(members, key=lambda m: m.label):
        values = [returns[m.name] for m in group if returns.get(m.name) is not None]
        if not values:
            continue
        low, high = bootstrap_interval(values)
        rows.append({"setting": label, "seeds": len(values), "mean": sum(values) / len(values),
                     "ci95": [low, high], "iqm": interquartile_mean(values)})
    return rows
