"""Run configuration: the `env`, `trainer`, `policy` and `scale` sections.

Defaults are written once, in the dataclasses (an env's in its config
dataclass). An env's `config.yaml`, its training recipe, holds only what
differs from them; `recipe_path` is the one rule that finds it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpusim.backends import BACKEND_NAMES
from gpusim.cache import atomic_write
from gpusim.config import field_help, from_dict, load_yaml, require, to_dict
from gpusim.errors import ConfigError
from gpusim.scale.scale_config import ScaleConfig

from .population import members as population
from .records import migrations
from .speed.acceleration import COMPILE_MODES, PRECISIONS
from .speed.graphs import MODES as GRAPH_MODES

ACTIVATIONS = ("tanh", "relu")
RECURRENT = ("none", "gru", "lstm")
CRITICS = ("local", "central")
SCORE_OPPONENTS = ("random", "scripted")


@dataclass(frozen=True)
class TrainerConfig:
    """What every algorithm shares; each algorithm's own keys are its config dataclass
    (training.algorithms), written in the same `trainer` section."""
    algorithm: str = "ppo"         # ppo | a2c | ddpg | td3 | sac (--help lists each one's keys)
    backend: str = "auto"          # auto (numba on a CUDA GPU, else cpu) | cpu | numba | cudasim
                                   # | cuda_c (alias pycuda)
    num_envs: int = 64             # env replicas per process
    rollout_len: int = 32          # steps per replica per iteration
    total_steps: int = 1_000_000   # env steps: iterations x num_envs x rollout_len
    seed: int = 0                  # seeds the env streams, the models and the shuffling
    lr: float = 3e-4               # Adam learning rate
    anneal_lr: bool = False        # fall linearly to 0 at the last iteration
    gamma: float = 0.99            # discount
    reward_scale: float = 1.0      # rewards are multiplied by this for learning (returns are
                                   # logged unscaled): keeps value targets near 1 in size
    precision: str = "auto"        # auto (bf16 on a CUDA GPU, fp32 on the CPU) | fp32 | tf32 | bf16
    compile: str = "auto"          # the fused, compiled learner step: on | off | auto (on CUDA
                                   # GPUs; on the CPU, off-policy runs of 5,000+ gradient steps
                                   # and feed-forward PPO runs of 20,000+ minibatch steps)
    cuda_graphs: str = "auto"      # auto (on CUDA devices) | on | off: the rollout and the
                                   # update (or their fixed-size parts) recorded once as CUDA
                                   # graphs and replayed; off-policy steps where their sample
                                   # is static
    checkpoint_every: int = 10     # iterations between checkpoints
    keep_snapshots: int = 0        # evenly spaced snapshots of every policy's network kept
                                   # over the run (RUN_DIR/snapshots; league tools play
                                   # them, training.records.snapshots); 0: none
    final_eval_episodes: int = 0   # after training: episodes per pairing of trained and random
                                   # policies (python -m gpusim.evaluate); 0: none
    target_return: float | None = None  # stop once every policy's mean return over the
                                        # last 100 finished episodes reaches this
    target_score: float | dict | None = None  # an env whose score has sides (gpusim.score):
                                        # the sides measured and their targets,
                                        # {tagger: 200, runner: 334}: each side trained
                                        # against the others' fixed opponents on its own
                                        # score_envs replicas, the run stopping once every
                                        # target is reached over the last score_window
                                        # episodes (a null target: measured, no stop;
                                        # None: the env's first side, no stop); an env
                                        # that names no score: a number, every policy's
                                        # mean return as for target_return
    score_envs: int = 8            # evaluation replicas for an env's score (gpusim.score),
                                   # stepped beside training; 0: no score measured (the
                                   # replica rule grows them with num_envs: training.replicas)
    score_every: int = 1           # iterations between their chunks of rollout_len steps
                                   # (counted, not timed: a seed gives the same run anywhere)
    score_opponents: str = "random"  # what the sides the score does not train play there:
                                     # random | scripted (the env's scripted policies)
    score_window: int = 32         # the score: the mean of its last this many episodes
    torch_threads: int = 0         # CPU: the learner's threads (0: chosen from the work,
                                   # gpusim.scale.threads)
    population: int | dict = 1     # members trained side by side in one process: a number
                                   # of seeds (seed, seed + 1, ...), or a sweep
                                   # {lr: [3e-4, 1e-3], ent_coef: [0.0, 0.01]} (training.population.members)
    seeds_per_setting: int = 1     # with a sweep: seeds per combination of its values

    def check(self):
        require(self.algorithm in algorithm_names(), "trainer.algorithm",
                f"must be one of {algorithm_names()}")
        require(self.backend in BACKEND_NAMES, "trainer.backend", f"must be one of {BACKEND_NAMES}")
        require(self.precision in PRECISIONS, "trainer.precision", f"must be one of {PRECISIONS}")
        require(self.compile in COMPILE_MODES, "trainer.compile",
                f"must be one of {COMPILE_MODES}")
        require(self.cuda_graphs in GRAPH_MODES, "trainer.cuda_graphs",
                f"must be one of {GRAPH_MODES}")
        for key in ("num_envs", "rollout_len", "total_steps", "checkpoint_every"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(self.seed >= 0, "trainer.seed", "must be >= 0")
        require(isinstance(self.keep_snapshots, int) and self.keep_snapshots >= 0,
                "trainer.keep_snapshots", "must be 0 (none) or a count of snapshots")
        require(self.final_eval_episodes == 0 or self.final_eval_episodes >= 2,
                "trainer.final_eval_episodes", "must be 0 (none) or at least 2")
        require(self.lr > 0, "trainer.lr", "must be positive")
        require(self.reward_scale > 0, "trainer.reward_scale", "must be positive")
        require(0 <= self.gamma <= 1, "trainer.gamma", "must lie in [0, 1]")
        require(self.torch_threads >= 0, "trainer.torch_threads", "must be >= 0")
        require(self.score_envs >= 0, "trainer.score_envs", "must be >= 0")
        require(self.score_every >= 1, "trainer.score_every", "must be at least 1")
        require(self.score_opponents in SCORE_OPPONENTS, "trainer.score_opponents",
                f"must be one of {SCORE_OPPONENTS}")
        require(self.score_window >= 1, "trainer.score_window", "must be at least 1")
        if isinstance(self.target_score, dict):
            bad = next((f"{side}: {value!r}" for side, value in self.target_score.items()
                        if not isinstance(side, str) or (value is not None and (
                            isinstance(value, bool) or not isinstance(value, (int, float))
                            or not math.isfinite(value)))), None)
            require(self.target_score and bad is None, "trainer.target_score",
                    "must map the score's sides to targets (numbers, or null: measured "
                    f"without a target), e.g. {{tagger: 200, runner: 334}}; got {bad or '{}'}")
        require(self.seeds_per_setting >= 1, "trainer.seeds_per_setting", "must be at least 1")
        require(isinstance(self.population, dict) or self.seeds_per_setting == 1,
                "trainer.seeds_per_setting", "applies to a sweep (trainer.population: a "
                "mapping of settings to lists); for seeds alone give trainer.population: N")

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.rollout_len

    def num_iterations(self, world_size: int = 1) -> int:
        """Iterations in the run: total_steps counts the steps of every process."""
        return max(1, self.total_steps // (self.steps_per_iteration * world_size))


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)  # the actor's and the critic's hidden layers
    activation: str = "tanh"                  # tanh | relu
    state_dependent_std: bool = False         # ppo/a2c, continuous actions: the log-std is an
                                              # output of the actor (else one learned parameter)
    log_std_init: float = 0.0                 # ppo/a2c, continuous actions: the initial log-std
    recurrent: str = "none"                   # ppo/a2c: none | gru | lstm, a recurrent layer
                                              # after the hidden layers, one state per agent
    recurrent_size: int = 64                  # its state size
    bptt_len: int = 16                        # ppo/a2c recurrent: backpropagation through
                                              # time over sequences of this many steps
    critic: str = "local"                     # ppo/a2c: local (each agent's own observation;
                                              # IPPO) | central (the replica's global state:
                                              # the env's `state_array`, else every agent's
                                              # observation in agent order; MAPPO)

    def check(self):
        require(len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes),
                "policy.hidden_sizes", "must be a non-empty list of positive sizes")
        require(self.activation in ACTIVATIONS, "policy.activation",
                f"must be one of {ACTIVATIONS}")
        require(-5.0 <= self.log_std_init <= 2.0, "policy.log_std_init", "must lie in [-5, 2]")
        require(self.recurrent in RECURRENT, "policy.recurrent", f"must be one of {RECURRENT}")
        require(self.recurrent_size >= 1, "policy.recurrent_size", "must be at least 1")
        require(self.bptt_len >= 1, "policy.bptt_len", "must be at least 1")
        require(self.critic in CRITICS, "policy.critic", f"must be one of {CRITICS}")
        require(self.recurrent == "none" or self.critic == "local", "policy.critic",
                "must be local with a recurrent policy")


@dataclass(frozen=True)
class RunConfig:
    env_name: str
    env: object
    trainer: TrainerConfig
    policy: PolicyConfig
    algo: object = None  # the algorithm's own config (its dataclass: training.algorithms)
    scale: ScaleConfig = ScaleConfig()
    # what --auto_scale found (picks, trials, throughput): saved, never read back
    auto_scale_report: dict | None = None
    # what followed --num_envs (training.replicas): saved, never read back
    replica_rule: dict | None = None

    def __post_init__(self):
        if self.algo is None:  # built in code: the algorithm's defaults
            object.__setattr__(self, "algo", algorithm_config_class(self.trainer.algorithm)())

    def to_dict(self) -> dict:
        out = {"env_name": self.env_name, "env": to_dict(self.env),
               "trainer": {**to_dict(self.trainer), **to_dict(self.algo)},
               "policy": to_dict(self.policy), "scale": to_dict(self.scale)}
        for record in ("replica_rule", "auto_scale_report"):
            if getattr(self, record) is not None:
                out[record] = getattr(self, record)
        return out

    def dump(self, path: Path):
        """config.yaml: its writer's run format and version (training.records.migrations),
        then every key."""
        atomic_write(path, yaml.safe_dump(_plain({**migrations.record(), **self.to_dict()}),
                                          sort_keys=False))


SECTIONS = ("env", "trainer", "policy", "scale")


def algorithm_names() -> tuple:
    from .algorithms import ALGORITHMS
    return tuple(ALGORITHMS)


def algorithm_config_class(name: str):
    """The config dataclass of algorithm `name` (its own `trainer` keys)."""
    from .algorithms import ALGORITHMS
    return ALGORITHMS[name].Config


def config_reference() -> str:
    """Every config key with its default and description, for `python -m gpusim.train --help`."""
    from gpusim.envs import env_class, env_names
    classes = [("trainer", TrainerConfig)]
    classes += [(f"trainer, --algorithm {name}", algorithm_config_class(name))
                for name in algorithm_names()]
    classes += [("policy", PolicyConfig), ("scale", ScaleConfig),
                ("scale, advanced: the search's own constants, rarely changed", ScaleConfig)]
    classes += [(f"env ({name})", env_class(name).config_class) for name in env_names()]
    lines = ["config keys (--set section.key=value, or a YAML file with these sections);",
             "each with its default:"]
    for section, cls in classes:
        lines.append(f"  {section}:")
        defaults = to_dict(cls())
        advanced = getattr(cls, "ADVANCED", ())
        for key, text in field_help(cls).items():
            if (key in advanced) != section.startswith("scale, advanced"):
                continue
            lines.append(f"    {key} = {defaults[key]!r}" + (f"  ({text})" if text else ""))
    return "\n".join(lines)


def split_trainer_section(data: dict) -> tuple:
    """(TrainerConfig, the algorithm's config) from the `trainer` mapping; a key of another
    algorithm is refused, naming the key and the algorithm."""
    algorithm = data.get("algorithm", TrainerConfig.algorithm)
    if not isinstance(algorithm, str) or algorithm not in algorithm_names():
        raise ConfigError(f"config key 'trainer.algorithm' must be one of {algorithm_names()}, "
                          f"got {algorithm!r}")
    own = algorithm_config_class(algorithm)
    common_keys = {f.name for f in dataclasses.fields(TrainerConfig)}
    own_keys = {f.name for f in dataclasses.fields(own)}
    for key in data:
        if key in common_keys or key in own_keys:
            continue
        owners = [name for name in algorithm_names()
                  if key in {f.name for f in dataclasses.fields(algorithm_config_class(name))}]
        if owners:
            raise ConfigError(f"config key 'trainer.{key}' does not apply to algorithm "
                              f"{algorithm} (it is a key of {', '.join(owners)})")
        raise ConfigError(f"unknown config key 'trainer.{key}' "
                          f"(known for {algorithm}: {', '.join(sorted(common_keys | own_keys))})")
    trainer = from_dict(TrainerConfig, {k: v for k, v in data.items() if k in common_keys},
                        section="trainer")
    algo = from_dict(own, {k: v for k, v in data.items() if k in own_keys}, section="trainer")
    algo.check_run(trainer)
    population.check(trainer, algo)
    return trainer, algo


def check_policy_keys(policy: PolicyConfig, algorithm: str):
    """Refuse policy keys, set away from their defaults, that the algorithm does not use."""
    used = algorithm_config_class(algorithm).policy_keys
    defaults = PolicyConfig()
    for field in dataclasses.fields(PolicyConfig):
        if field.name not in used and getattr(policy, field.name) != getattr(defaults, field.name):
            raise ConfigError(f"config key 'policy.{field.name}' does not apply to algorithm "
                              f"{algorithm}")


def recipe_path(env_class, algorithm: str | None = None) -> Path | None:
    """The env's training recipe, beside the module defining its class: `<algorithm>.yaml`
    where the env has one for that algorithm, else `config.yaml`; None if neither exists."""
    folder = Path(inspect.getfile(env_class)).parent
    for name in ((f"{algorithm}.yaml",) if algorithm else ()) + ("config.yaml",):
        if (folder / name).is_file():
            return folder / name
    return None


def load_run_config(env_name: str, env_class, path=None, overrides: dict | None = None,
                    sets: list | None = None, data: dict | None = None) -> RunConfig:
    """Resolve a run's config: defaults, the file (default: the env's recipe), flags, --set.

    `overrides` maps "section.key" to values from the CLI flags; `sets` are
    "section.key=value" strings. Unknown sections and keys are errors. `data`: the
    file's mapping, already read (a run directory's, upgraded to today's format).
    """
    path = path or recipe_path(env_class)
    if data is None:
        data = {} if path is None else _read_config_file(path)  # no recipe: all defaults
    data = dict(data)
    data.pop("env_name", None)
    data.pop("auto_scale_report", None)  # records of a past search and resizing, not
    data.pop("replica_rule", None)       # settings
    for section in data:
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '{section}' (known: {', '.join(SECTIONS)})")
    for section in SECTIONS:
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise ConfigError(f"config section '{section}' must be a mapping of keys to values, "
                              f"got {data[section]!r}")
    data = {s: dict(data.get(s) or {}) for s in SECTIONS}
    recipe_keys, recipe_env = dict(data["trainer"]), dict(data["env"])
    for dotted, value in (overrides or {}).items():
        _assign(data, dotted, value)
    given = set(overrides or {})
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set expects section.key=value, got '{item}'")
        _assign(data, key.strip(), parse_value(raw.strip()))
        given.add(key.strip())
    _drop_other_algorithms_keys(data["trainer"], recipe_keys, path)
    _drop_score_for_other_env(data, recipe_keys, recipe_env, given)
    trainer, algo = split_trainer_section(data["trainer"])
    policy = from_dict(PolicyConfig, data["policy"], section="policy")
    check_policy_keys(policy, trainer.algorithm)
    return RunConfig(env_name=env_name,
                     env=from_dict(env_class.config_class, data["env"], section="env"),
                     trainer=trainer, algo=algo, policy=policy,
                     scale=from_dict(ScaleConfig, data["scale"], section="scale"))


def _drop_score_for_other_env(data: dict, recipe_keys: dict, recipe_env: dict, given: set):
    """A recipe's score settings hold for the env settings it was written for (a shorter
    episode or fewer runners moves tag_continuous's survival; continuous actions leave
    its scripted policies nothing to play): with env keys changed on the command line,
    its `target_score` and `score_opponents`, unless given there too, fall back to the
    defaults (no target, random opponents; the saved config says so)."""
    if data["env"] == recipe_env:
        return
    for key, default in (("target_score", None), ("score_opponents", "random")):
        if key in recipe_keys and f"trainer.{key}" not in given:
            data["trainer"][key] = default


def _drop_other_algorithms_keys(trainer: dict, recipe_keys: dict, path):
    """A recipe written for one algorithm, run with another (`--algorithm`): its keys that
    only the recipe's algorithm has are left out, with one line; everything else (and any
    key given on the command line) is checked as usual."""
    names = algorithm_names()
    written = recipe_keys.get("algorithm", TrainerConfig.algorithm)
    chosen = trainer.get("algorithm", TrainerConfig.algorithm)
    if written == chosen or written not in names or chosen not in names:
        return
    own = {f.name for f in dataclasses.fields(algorithm_config_class(chosen))}
    theirs = {f.name for f in dataclasses.fields(algorithm_config_class(written))}
    dropped = [k for k in recipe_keys if k in theirs - own and trainer.get(k) == recipe_keys[k]]
    for key in dropped:
        del trainer[key]
    if dropped:
        print(f"gpusim: {path} is a {written} recipe; running {chosen}, its "
              f"{', '.join(dropped)} do not apply", file=sys.stderr)


def _read_config_file(path) -> dict:
    """A config file's mapping: a run's saved config.yaml of an older format upgraded (with
    one line), a file without a format (a recipe, one's own) as written."""
    data = load_yaml(path)
    if "format" not in data:
        migrations.refuse_removed(data, path)
        return data
    data, fmt, changes = migrations.upgrade_config(data, path)
    migrations.tell(path, fmt, changes)
    return data


def load_run_dir_config(run_dir, overrides: dict | None = None):
    """(env class, RunConfig) of a run directory, from the config.yaml it saved: one
    written by an older gpusim is read as today's (training.records.migrations)."""
    from gpusim.envs import env_class
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    saved, fmt, changes = migrations.upgrade_config(load_yaml(path), path)
    name = saved.get("env_name")
    if not name:
        raise ConfigError(f"{path} names no env (env_name)")
    cls = env_class(name)
    migrations.tell(run_dir, fmt, changes)
    config = load_run_config(name, cls, path=path, overrides=overrides, data=saved)
    check_complete(saved, config, path)
    return cls, config


def check_complete(saved: dict, config: RunConfig, path):
    """A run's saved config.yaml (upgraded to today's format) holds every key it ran with:
    a damaged one (truncated, a line lost) is refused rather than filled in with defaults,
    which would change the run."""
    for section, values in config.to_dict().items():
        if section in ("auto_scale_report", "replica_rule"):
            continue
        if not isinstance(values, dict):
            continue
        held = saved.get(section)
        held = held if isinstance(held, dict) else {}
        missing = [key for key in values if key not in held]
        if missing:
            raise ConfigError(f"{path} is damaged: it lacks {section}.{missing[0]}"
                              + (f" and {len(missing) - 1} more keys" if len(missing) > 1
                                 else "") + "; restore it, or start a new run")


def parse_value(raw: str):
    """A --set value: int, float (3e-4 too), or any YAML scalar or list."""
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"cannot parse value '{raw}'") from None


def _assign(data: dict, dotted: str, value):
    section, _, key = dotted.partition(".")
    if section not in SECTIONS or not key:
        raise ConfigError(f"unknown config key '{dotted}' (sections: {', '.join(SECTIONS)})")
    data[section][key] = value


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

