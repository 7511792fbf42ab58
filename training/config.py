"""Run configuration: the `env`, `trainer`, `policy` and `scale` sections.

Defaults are written once, in the dataclasses (an env's in its config
dataclass). An env's `config.yaml`, its training recipe, holds only what
differs from them; `recipe_path` is the one rule that finds it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpusim.backends import BACKEND_NAMES
from gpusim.cache import atomic_write
from gpusim.config import field_help, from_dict, load_yaml, require, to_dict
from gpusim.errors import ConfigError
from gpusim.scale.config import ScaleConfig

from .acceleration import COMPILE_MODES, PRECISIONS

ON_POLICY = ("ppo", "a2c")
OFF_POLICY = ("ddpg", "td3", "sac")
ALGORITHMS = ON_POLICY + OFF_POLICY
ACTIVATIONS = ("tanh", "relu")


@dataclass(frozen=True)
class TrainerConfig:
    algorithm: str = "ppo"         # ppo | a2c (one epoch, one minibatch: plain policy gradient)
                                   # | ddpg | td3 | sac (off-policy, continuous actions)
    backend: str = "auto"          # auto (numba on a CUDA GPU, else cpu) | cpu | numba | cudasim
                                   # | cuda_c (alias pycuda)
    num_envs: int = 64             # env replicas per process
    rollout_len: int = 32          # steps per replica per iteration
    total_steps: int = 1_000_000   # env steps: iterations x num_envs x rollout_len
    seed: int = 0                  # seeds the env streams, the models and the shuffling
    lr: float = 3e-4               # Adam learning rate
    anneal_lr: bool = False        # fall linearly to 0 at the last iteration
    gamma: float = 0.99            # discount
    gae_lambda: float = 0.95       # GAE lambda
    update_epochs: int = 4         # passes over each rollout
    num_minibatches: int = 4       # gradient steps per pass
    clip_coef: float = 0.2         # PPO ratio clipping (and value clipping)
    clip_vloss: bool = True        # clip the value loss as PPO does
    vf_coef: float = 0.5           # weight of the value loss
    ent_coef: float = 0.01         # weight of the entropy bonus
    max_grad_norm: float = 0.5     # gradient-norm clipping
    norm_adv: bool = True          # normalise advantages per minibatch
    reward_scale: float = 1.0      # rewards are multiplied by this for learning (returns are
                                   # logged unscaled): keeps value targets near 1 in size
    max_minibatch_rows: int = 65536  # rows per forward/backward chunk of a minibatch: bounds
                                     # activation memory; chunk gradients are accumulated
    precision: str = "auto"        # auto (bf16 on a CUDA GPU, fp32 on the CPU) | fp32 | tf32 | bf16
    compile: str = "auto"          # torch.compile: auto (on CUDA GPUs) | on | off
    checkpoint_every: int = 10     # iterations between checkpoints
    final_eval_episodes: int = 0   # after training: episodes per pairing of trained and random
                                   # policies (python -m gpusim.evaluate); 0: none
    target_return: float | None = None  # stop once every policy's mean return over the
                                        # last 100 finished episodes reaches this
    torch_threads: int = 0         # CPU: the learner's threads (0: all the process's cores);
                                   # numba's env kernels get the rest (gpusim.scale.device)
    # off-policy (ddpg, td3, sac); the PPO keys above (epochs, minibatches, clipping, GAE)
    # do not apply to them
    replay_size: int = 1_000_000   # transitions each process keeps per policy (a ring)
    batch_size: int = 256          # transitions per gradient step, all processes together
    replay_ratio: float = 1.0      # gradient steps per env step of one process
    learning_starts: int = 5000    # env steps of uniformly random actions before learning
    tau: float = 0.005             # target networks move this far towards the online ones
    policy_delay: int = 2          # td3: critic steps per actor step (ddpg, sac: 1)
    exploration_noise: float = 0.1  # ddpg, td3: Gaussian action noise, in half-ranges
    target_noise: float = 0.2      # td3: noise on the target action, in half-ranges ...
    noise_clip: float = 0.5        # ... clipped to +-this
    sac_alpha: float | None = None  # sac: the entropy weight; null tunes it towards an
                                    # entropy of -(action dims)
    prioritized_replay: bool = False  # sample in proportion to |TD error|^priority_alpha
    priority_alpha: float = 0.6    # how much priorities count (0: uniform)
    priority_beta: float = 0.4     # importance-weight correction (1: full)
    checkpoint_replay: bool = False  # checkpoints hold the replay buffers too (can be large)

    def check(self):
        require(self.algorithm in ALGORITHMS, "trainer.algorithm", f"must be one of {ALGORITHMS}")
        require(self.backend in BACKEND_NAMES, "trainer.backend", f"must be one of {BACKEND_NAMES}")
        require(self.precision in PRECISIONS, "trainer.precision", f"must be one of {PRECISIONS}")
        require(self.compile in COMPILE_MODES, "trainer.compile",
                f"must be one of {COMPILE_MODES}")
        for key in ("num_envs", "rollout_len", "total_steps", "update_epochs",
                    "num_minibatches", "checkpoint_every", "max_minibatch_rows"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(self.seed >= 0, "trainer.seed", "must be >= 0")
        require(self.final_eval_episodes == 0 or self.final_eval_episodes >= 2,
                "trainer.final_eval_episodes", "must be 0 (none) or at least 2")
        require(self.lr > 0, "trainer.lr", "must be positive")
        require(self.reward_scale > 0, "trainer.reward_scale", "must be positive")
        for key in ("replay_size", "batch_size", "policy_delay"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        for key in ("replay_ratio", "learning_starts", "exploration_noise", "target_noise",
                    "noise_clip", "priority_alpha", "priority_beta"):
            require(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")
        require(0 < self.tau <= 1, "trainer.tau", "must lie in (0, 1]")
        require(self.priority_beta <= 1, "trainer.priority_beta", "must lie in [0, 1]")
        require(self.sac_alpha is None or self.sac_alpha >= 0, "trainer.sac_alpha",
                "must be >= 0, or null (tuned)")
        require(0 <= self.gamma <= 1, "trainer.gamma", "must lie in [0, 1]")
        require(0 <= self.gae_lambda <= 1, "trainer.gae_lambda", "must lie in [0, 1]")
        require(self.clip_coef > 0, "trainer.clip_coef", "must be positive")
        for key in ("vf_coef", "ent_coef", "max_grad_norm", "torch_threads"):
            require(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")
        require(self.algorithm in OFF_POLICY
                or self.num_minibatches <= self.num_envs * self.rollout_len,
                "trainer.num_minibatches", "must not exceed num_envs x rollout_len")
        if self.algorithm == "a2c":
            require(self.update_epochs == 1 and self.num_minibatches == 1, "trainer.algorithm",
                    "a2c takes one gradient step per rollout: set update_epochs and "
                    "num_minibatches to 1")

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
    state_dependent_std: bool = False         # continuous actions: the log-std is an output
                                              # of the actor (else one learned parameter)
    log_std_init: float = 0.0                 # continuous actions: the initial log-std

    def check(self):
        require(len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes),
                "policy.hidden_sizes", "must be a non-empty list of positive sizes")
        require(self.activation in ACTIVATIONS, "policy.activation",
                f"must be one of {ACTIVATIONS}")
        require(-5.0 <= self.log_std_init <= 2.0, "policy.log_std_init", "must lie in [-5, 2]")


@dataclass(frozen=True)
class RunConfig:
    env_name: str
    env: object
    trainer: TrainerConfig
    policy: PolicyConfig
    scale: ScaleConfig = ScaleConfig()
    # what --auto_scale found (picks, trials, throughput): saved, never read back
    auto_scale_report: dict | None = None

    def to_dict(self) -> dict:
        out = {"env_name": self.env_name, "env": to_dict(self.env),
               "trainer": to_dict(self.trainer), "policy": to_dict(self.policy),
               "scale": to_dict(self.scale)}
        if self.auto_scale_report is not None:
            out["auto_scale_report"] = self.auto_scale_report
        return out

    def dump(self, path: Path):
        atomic_write(path, yaml.safe_dump(_plain(self.to_dict()), sort_keys=False))


SECTIONS = ("env", "trainer", "policy", "scale")


def config_reference() -> str:
    """Every config key with its default and description, for `python -m gpusim.train --help`."""
    from gpusim.envs import env_class, env_names
    classes = [("trainer", TrainerConfig), ("policy", PolicyConfig), ("scale", ScaleConfig)]
    classes += [(f"env ({name})", env_class(name).config_class) for name in env_names()]
    lines = ["config keys (--set section.key=value, or a YAML file with these sections);",
             "each with its default:"]
    for section, cls in classes:
        lines.append(f"  {section}:")
        defaults = to_dict(cls())
        for key, text in field_help(cls).items():
            lines.append(f"    {key} = {defaults[key]!r}" + (f"  ({text})" if text else ""))
    return "\n".join(lines)


def recipe_path(env_class, algorithm: str | None = None) -> Path | None:
    """The env's training recipe, beside the module defining its class: `<algorithm>.yaml`
    where the env has one for that algorithm, else `config.yaml`; None if neither exists."""
    folder = Path(inspect.getfile(env_class)).parent
    for name in ((f"{algorithm}.yaml",) if algorithm else ()) + ("config.yaml",):
        if (folder / name).is_file():
            return folder / name
    return None


def load_run_config(env_name: str, env_class, path=None, overrides: dict | None = None,
                    sets: list | None = None) -> RunConfig:
    """Resolve a run's config: defaults, the file (default: the env's recipe), flags, --set.

    `overrides` maps "section.key" to values from the CLI flags; `sets` are
    "section.key=value" strings. Unknown sections and keys are errors.
    """
    path = path or recipe_path(env_class)
    data = {} if path is None else load_yaml(path)  # no recipe: all defaults
    data.pop("env_name", None)
    data.pop("auto_scale_report", None)  # a record of a past search, not a setting
    for section in data:
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '{section}' (known: {', '.join(SECTIONS)})")
    for section in SECTIONS:
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise ConfigError(f"config section '{section}' must be a mapping of keys to values, "
                              f"got {data[section]!r}")
    data = {s: dict(data.get(s) or {}) for s in SECTIONS}
    for dotted, value in (overrides or {}).items():
        _assign(data, dotted, value)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set expects section.key=value, got '{item}'")
        _assign(data, key.strip(), parse_value(raw.strip()))
    return RunConfig(env_name=env_name,
                     env=from_dict(env_class.config_class, data["env"], section="env"),
                     trainer=from_dict(TrainerConfig, data["trainer"], section="trainer"),
                     policy=from_dict(PolicyConfig, data["policy"], section="policy"),
                     scale=from_dict(ScaleConfig, data["scale"], section="scale"))


def load_run_dir_config(run_dir, overrides: dict | None = None):
    """(env class, RunConfig) of a run directory, from the config.yaml it saved."""
    from gpusim.envs import env_class
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    name = load_yaml(path).get("env_name")
    if not name:
        raise ConfigError(f"{path} names no env (env_name)")
    cls = env_class(name)
    return cls, load_run_config(name, cls, path=path, overrides=overrides)


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

