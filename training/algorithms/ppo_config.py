"""PPO's and A2C's own `trainer` keys (ppo.py), with their defaults and checks."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from gpusim.config import require
from gpusim.errors import ConfigError, GpusimError
from gpusim.scripted import scripted_policies

# On the CPU a fused (compiled) minibatch step saves 0.9-2 ms against an eager one in
# cartpole's recipe (80 to 4,096 rows) and about 7 ms in tag_continuous's, while a first
# compile costs 14-17 s (cartpole) to about 50 s (tag_continuous) more per process: it pays
# from 7,000-20,000 steps in a run, so `compile: auto` compiles from this many
# (docs/benchmarks.md, "compile: auto for PPO").
CPU_COMPILE_MIN_STEPS = 20_000
OUT_OF_PLAY = ("skip", "weigh")
EVICTIONS = ("oldest", "lowest")
OPPONENTS = ("uniform", "latest", "pfsp")


@dataclass(frozen=True)
class PPOConfig:
    update_epochs: int = 4         # passes over each rollout
    num_minibatches: int = 4       # gradient steps per pass
    gae_lambda: float = 0.95       # GAE lambda
    clip_coef: float = 0.2         # PPO ratio clipping (and value clipping)
    clip_vloss: bool = True        # clip the value loss as PPO does
    vf_coef: float = 0.5           # weight of the value loss
    ent_coef: float = 0.01         # weight of the entropy bonus
    max_grad_norm: float = 0.5     # gradient-norm clipping (0: none)
    norm_adv: bool = True          # normalise advantages per minibatch
    max_minibatch_rows: int = 65536  # rows per forward/backward chunk of a minibatch: bounds
                                     # activation memory; chunk gradients are accumulated
    out_of_play: str = "skip"      # envs with per-agent done: rows of agents out of play are
                                   # left out of the update (skip: one host read per update;
                                   # on a CUDA device the update's fixed-size parts are
                                   # graphs) or trained with weight 0 (weigh: on a CUDA
                                   # device the whole update one graph)
    noise_scale_every: int = 0     # measure the gradient noise scale every this many
                                   # iterations, before the update (training.noise_scale);
                                   # 0: never
    league: bool = False           # self-play against pools of each policy's past selves (envs
                                   # with two or more policies: training.league.self_play)
    league_snapshot_every: int = 10  # league: updates between snapshots into each pool
    league_capacity: int = 8       # league: snapshots each policy's pool holds
    league_eviction: str = "oldest"  # league: what a full pool drops: oldest | lowest (the
                                     # snapshot the learners beat most often)
    league_opponents: str = "pfsp"  # league: how a frozen replica's opponent is drawn as its
                                    # episode starts: uniform | latest (the newest most) |
                                    # pfsp (the ones the learners beat least, most)
    league_learner_share: float = 0.5  # league: the replicas where every policy learns; the
                                       # rest split evenly among matchups where one policy
                                       # learns against the others' snapshots
    league_frozen: tuple[str, ...] = ()  # league: policies that never learn, playing their
                                         # pools' snapshots in every replica (python -m
                                         # gpusim.league --best_response loads those)
    league_scripted: bool = False  # league: each pool also holds the env's scripted policies
                                   # of its side (gpusim.scripted), drawn as snapshots are; a
                                   # frozen side then plays those alone
    # every policy key applies (training.run_config.check_policy_keys)
    policy_keys: ClassVar[frozenset] = frozenset(
        ("hidden_sizes", "activation", "state_dependent_std", "log_std_init", "recurrent",
         "recurrent_size", "bptt_len", "critic"))

    def check(self):
        for key in ("update_epochs", "num_minibatches", "max_minibatch_rows"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(0 <= self.gae_lambda <= 1, "trainer.gae_lambda", "must lie in [0, 1]")
        require(self.clip_coef > 0, "trainer.clip_coef", "must be positive")
        require(self.out_of_play in OUT_OF_PLAY, "trainer.out_of_play",
                f"must be one of {OUT_OF_PLAY}"
                + (" (auto, which meant skip, is gone)" if self.out_of_play == "auto" else ""))
        for key in ("vf_coef", "ent_coef", "max_grad_norm", "noise_scale_every"):
            require(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")
        self.check_league()

    def check_league(self):
        for key in ("league_snapshot_every", "league_capacity"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(self.league_eviction in EVICTIONS, "trainer.league_eviction",
                f"must be one of {EVICTIONS}")
        require(self.league_opponents in OPPONENTS, "trainer.league_opponents",
                f"must be one of {OPPONENTS}")
        require(0 <= self.league_learner_share < 1, "trainer.league_learner_share",
                "must lie in [0, 1)")
        if not self.league:  # a league key given without a league: it would do nothing
            for field in fields(self):
                if field.name.startswith("league_") and \
                        getattr(self, field.name) != field.default:
                    raise ConfigError(f"config key 'trainer.{field.name}' applies with "
                                      "trainer.league: true")

    def check_run(self, trainer):
        require(self.num_minibatches <= trainer.num_envs * trainer.rollout_len,
                "trainer.num_minibatches", "must not exceed num_envs x rollout_len")


@dataclass(frozen=True)
class A2CConfig(PPOConfig):
    update_epochs: int = 1         # a2c: 1 (one gradient step per rollout)
    num_minibatches: int = 1       # a2c: 1

    def check(self):
        super().check()
        require(self.update_epochs == 1 and self.num_minibatches == 1, "trainer.algorithm",
                "a2c takes one gradient step per rollout: update_epochs and num_minibatches "
                "must be 1")


def check_for_env(config, env, population: bool):
    """What the config asks that this env, or a population, cannot do: one line each."""
    policy = config.policy
    if policy.recurrent != "none" and (policy.critic == "central"
                                       or config.trainer.rollout_len % policy.bptt_len):
        raise GpusimError("policy.recurrent needs policy.critic local and a rollout_len "
                          f"that is a multiple of policy.bptt_len ({policy.bptt_len})")
    if not any(spec.continuous for spec in env.policy_specs.values()):
        for key in ("state_dependent_std", "log_std_init"):  # the Gaussian head's keys
            if getattr(policy, key) != getattr(type(policy)(), key):
                raise GpusimError(f"config key 'policy.{key}' applies to continuous "
                                  f"actions, and every policy of {env.name} acts discretely")
    if env.agent_active_array is None and config.algo.out_of_play != "skip":
        raise GpusimError(f"config key 'trainer.out_of_play' applies to envs with per-agent "
                          f"done, and {env.name} has none (every agent plays to the end)")
    if config.algo.league:
        if len(env.policy_specs) < 2:
            raise GpusimError(f"config key 'trainer.league' pits policies against each "
                              f"other's past selves; {env.name} has one policy")
        unknown = [n for n in config.algo.league_frozen if n not in env.policy_specs]
        if unknown or len(config.algo.league_frozen) >= len(env.policy_specs):
            raise GpusimError(f"config key 'trainer.league_frozen' must name some of "
                              f"{env.name}'s policies ({', '.join(env.policy_specs)}), not "
                              f"all: {', '.join(unknown) or 'every one'} cannot be frozen")
        if config.algo.league_scripted and not any(
                name in env.policy_specs for name in scripted_policies(type(env))):
            raise GpusimError(f"config key 'trainer.league_scripted' puts the env's scripted "
                              f"policies in the pools, and {env.name} ships none")
        if policy.recurrent != "none" or population:
            raise GpusimError("config key 'trainer.league' with " + (
                "policy.recurrent" if policy.recurrent != "none" else "trainer.population")
                + ": not supported yet (run it without)")
    if not population:
        return
    if policy.recurrent != "none":
        raise GpusimError("config key 'trainer.population' with policy.recurrent: a "
                          "population of recurrent policies is not batched yet (run its "
                          "members as separate runs)")
    if config.trainer.compile == "on":
        raise ConfigError("config key 'trainer.compile' on: a population runs uncompiled (its "
                          "members' one batched call is what compiling would buy); use auto "
                          "or off")


def run_config(config, population: bool):
    """The config a run goes by: a population's members run uncompiled (their one batched
    call is what compiling would buy)."""
    if not population:
        return config
    return replace(config, trainer=replace(config.trainer, compile="off"))


def sequence_length(config) -> int:
    """The steps a recurrent policy trains on at once (`policy.bptt_len`); 0: feed-forward."""
    return config.policy.bptt_len if config.policy.recurrent != "none" else 0
