"""Populations: many seeds or settings of one run, trained side by side in one process.

`trainer.population: N` trains N members, seeds `seed` .. `seed + N - 1`; a
mapping of learning settings to lists of values (`{lr: [3e-4, 1e-3],
ent_coef: [0.0, 0.01]}`) trains every combination, each with
`trainer.seeds_per_setting` seeds (the same seeds for every setting).
Member k is the run it stands for: its replicas' RNG streams are those of a
solo run with its seed, its networks are made from that seed, its minibatch
shuffles come from a generator of its own.

Here: who the members are (`members`, and `check` of a sweep), what an
algorithm keeps of them while it runs (`Members`: settings, generators, which
still learn; a solo run is a population of one), and the statistics a
researcher reads across seeds (`summary`: the mean with a 95% bootstrap
interval, and the interquartile mean). Their networks run as one batched
computation (training.population.stacked), their optimizer is the learners' one Adam with
a member dim (training.speed.descent).
"""
from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, replace

import torch

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
        numbers = [float(v) for v in values]
        if len(numbers) == 1:
            raise ConfigError(f"config key '{where}' holds one value: set trainer.{key} "
                              "instead (a sweep takes two or more)")
        repeated = next((v for v in numbers if numbers.count(v) > 1), None)
        if repeated is not None:
            raise ConfigError(f"config key '{where}' holds {repeated:g} twice: its members "
                              "would train alike; for more seeds of a setting use "
                              "trainer.seeds_per_setting")
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


def member_config(config, member):
    """The config of the solo run member `member` stands for."""
    t = replace(config.trainer, population=1, seeds_per_setting=1, seed=member.seed,
                lr=setting(member, "lr", config.trainer, config.algo))
    algo = replace(config.algo, **{k: float(v) for k, v in member.settings.items()
                                   if k != "lr"})
    return replace(config, trainer=t, algo=algo, auto_scale_report=None)


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


# ---- the members at run time: their settings, generators and lives -----------------------
class Members:
    """The members an algorithm trains: one for a solo run, N for a population (member k's
    replicas the k-th share of the env's). Per member: its settings, its minibatch
    shuffles' generator, whether it is still learning (`alive`) and whether it reached
    the target return (`finished`). The run loop and the algorithms talk to this one
    object whether the run is solo or a population."""

    def __init__(self, config, env, context=None):
        t = self.trainer = config.trainer
        self.algo = config.algo
        self.list = members(t)
        self.count = len(self.list)
        self.device = env.device
        if self.count > 1 and context is not None and context.world_size > 1:
            raise GpusimError("config key 'trainer.population' with several processes: a "
                              "population trains in one process (drop --num_gpus)")
        if env.num_envs != self.count * t.num_envs:
            raise GpusimError(f"a population of {self.count} needs {self.count} x "
                              f"{t.num_envs} replicas, got {env.num_envs}")
        self.alive = [True] * self.count     # still learning
        self.finished = [False] * self.count  # reached trainer.target_return: stopped there

    @property
    def solo(self) -> bool:
        return self.count == 1

    def names(self, policies) -> list:
        """The names the loop reports under: each policy (a population: of each member,
        "agent/m3")."""
        if self.solo:
            return list(policies)
        return [f"{name}/{m.name}" for name in policies for m in self.list]

    def report(self, policies, values: list) -> dict:
        """`values` (policies x members x statistics) as {reported name: values}, for the
        members still learning (a solo run's always)."""
        if self.solo:
            return {name: v[0] for name, v in zip(policies, values)}
        return {f"{name}/{m.name}": values[i][k] for i, name in enumerate(policies)
                for k, m in enumerate(self.list) if self.alive[k]}

    def setting(self, key: str):
        """A sweepable setting: the config's number for a solo run, else one per member (a
        device tensor)."""
        if self.solo:
            return getattr(self.trainer if key == "lr" else self.algo, key)
        return torch.tensor([setting(m, key, self.trainer, self.algo) for m in self.list],
                            device=self.device)

    def rates(self, lr: float):
        """Each member's learning rate as the loop's schedule scales trainer.lr; 0 for one
        no longer learning."""
        if self.solo:
            return lr
        scale = lr / self.trainer.lr
        return [setting(m, "lr", self.trainer, self.algo) * scale * alive
                for m, alive in zip(self.list, self.alive)]

    def shuffles(self) -> list:
        """Each member's minibatch generator, on the device, seeded as its solo run's."""
        return [torch.Generator(device=self.device).manual_seed(m.seed) for m in self.list]

    def learning(self):
        """The members still learning, as an index tensor (None: every member)."""
        if all(self.alive):
            return None
        return torch.tensor([k for k, alive in enumerate(self.alive) if alive],
                            device=self.device)

    def freeze_diverged(self, values: list, finite: list, restore):
        """A member whose statistics (`values`: policies x members x statistics) or
        parameters (`finite[k]`) stopped being finite is put back (`restore(k)`: to its
        state before this update) and frozen, with one line; the others go on. Raises once
        every member has diverged."""
        for k, member in enumerate(self.list):
            stats_finite = all(math.isfinite(v) for policy in values for v in policy[k])
            if self.alive[k] and not (finite[k] and stats_finite):
                restore(k)
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
            if not self.solo:
                member = self.list[k]
                print(f"population member {member.name} (seed {member.seed}, {member.label}) "
                      f"reached the target return at iteration {iteration}: it stops learning "
                      f"there; {sum(self.alive)} still learning", flush=True)

    def state_dict(self) -> dict:
        return {"alive": list(self.alive), "finished": list(self.finished)}

    def load_state_dict(self, state: dict):
        held = len(state.get("alive", ()))
        if held != self.count:
            raise GpusimError(f"the checkpoint holds {held} population member"
                              f"{'s' if held != 1 else ''}; this run has {self.count} (config "
                              "key 'trainer.population')")
        self.alive[:] = state["alive"]  # (in place: an algorithm may hold these lists)
        self.finished[:] = state["finished"]


def stacked_state(tensors: list) -> list:
    """Copies of a population's training tensors (members leading), to put a member back."""
    return [t.detach().clone() for t in tensors]


def restore_member(tensors: list, saved: list, k: int):
    with torch.no_grad():
        for current, old in zip(tensors, saved):
            current[k].copy_(old[k])


def finite_members(params: list, count: int) -> list:
    """Per member, whether all of its parameters (members leading) are finite: one host
    read."""
    checks = [p.reshape(count, -1).isfinite().all(1) for p in params]
    return torch.stack(checks).all(0).tolist()


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


def seed_members(env, members: list, per_member: int):
    """Each population member's replicas get the RNG streams a solo run of its seed has."""
    from gpusim import rng
    streams = env.arrays["rng_state"]
    for k, member in enumerate(members):
        streams[k * per_member:(k + 1) * per_member].copy_(
            rng.seed_streams(per_member, env.num_agents, member.seed, device=streams.device))
