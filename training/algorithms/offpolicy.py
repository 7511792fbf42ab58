"""The off-policy core that DDPG, TD3 and SAC share: replay on the device, the rollout, the
gradient-step loop, target networks and checkpoints.

Read top to bottom: the config; the `OffPolicy` algorithm: `rollout` (`rollout_len`
steps over every replica: uniformly random actions for the first `learning_starts`
env steps, then the actor's, with exploration; every agent-step in play goes into its
policy's replay ring, on the device); `update` (`replay_ratio` x this process's env
steps gradient steps per policy); `gradient_step`, the step itself, written once
over the networks' parameters: the critics towards the algorithm's target, and when
due the actor, SAC's alpha and the targets. What differs between the algorithms is a
few methods: `next_action` (the action and entropy term the target is taken at),
`actor_due`, `actor_loss` and SAC's `alpha_loss` (ddpg.py, td3.py, sac.py).

How a step runs is picked once, when the algorithm is built (offpolicy_build.py):
eagerly, compiled (`trainer.compile`), replayed as CUDA graphs where its sample is
static, or every population member's at once under torch.func.vmap
(offpolicy_members.py); each runs this same `gradient_step`.

Actions live in [-1, 1] per dimension here (the actor's tanh); the env gets
them scaled into its Box. Transitions keep the true final observation of a
finished replica and bootstrap across truncations but not terminations
(nor across an agent's own finish, with per-agent done).

With several processes each keeps its own replay shard and its own
replicas; one gradient step draws `batch_size` transitions from the union of
the shards (training.replay_buffer: each shard supplies its share, so sampling is
that of one global buffer), each loss is a sum over the rank's samples
divided by `batch_size`, and gradients are summed across ranks, so every
rank takes the same step and the models stay identical.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from gpusim.config import require
from gpusim.errors import ConfigError, GpusimError

from ..population.members import Members
from .algorithm import Algorithm
from .offpolicy_build import build
from .offpolicy_networks import NetsOn, OffPolicyModel

# On the CPU a compiled gradient step saves about 5 ms (12.7 -> 7.9 ms, SAC 256x256, one
# thread) and a first compile costs about 25 s: `compile: auto` compiles from this many
# gradient steps in a run (docs/benchmarks.md, "compiled learner").
CPU_COMPILE_MIN_STEPS = 5000


@dataclass(frozen=True)
class OffPolicyConfig:
    replay_size: int = 1_000_000   # transitions each process keeps per policy (a ring)
    batch_size: int = 256          # transitions per gradient step, all processes together
    replay_ratio: float = 1.0      # gradient steps per env step of one process
    learning_starts: int = 5000    # env steps of uniformly random actions before learning
    tau: float = 0.005             # target networks move this far towards the online ones
    max_grad_norm: float = 0.5     # gradient-norm clipping of each network (0: none)
    prioritized_replay: bool = False  # sample in proportion to |TD error|^priority_alpha
    priority_alpha: float = 0.6    # how much priorities count (0: uniform, at most 2)
    priority_beta: float = 0.4     # importance-weight correction (1: full)
    checkpoint_replay: bool = True  # checkpoints hold the replay buffers, so a resumed run
                                    # continues exactly (false: smaller checkpoints, and a
                                    # resumed run refills its buffers)
    policy_keys: ClassVar[frozenset] = frozenset(("hidden_sizes", "activation"))
    # what a population's members may differ in (training.population.members)
    sweepable: ClassVar[tuple] = ("lr", "max_grad_norm", "tau")

    def check(self):
        for key in ("replay_size", "batch_size"):
            require(getattr(self, key) >= 1, f"trainer.{key}", "must be at least 1")
        require(self.replay_ratio > 0, "trainer.replay_ratio", "must be positive")
        require(self.learning_starts >= 0, "trainer.learning_starts", "must be >= 0")
        require(self.max_grad_norm >= 0, "trainer.max_grad_norm", "must be >= 0")
        require(0 < self.tau <= 1, "trainer.tau", "must lie in (0, 1]")
        require(0 <= self.priority_alpha <= 2, "trainer.priority_alpha", "must lie in [0, 2]")
        require(0 <= self.priority_beta <= 1, "trainer.priority_beta", "must lie in [0, 1]")
        require(self.replay_size >= self.batch_size, "trainer.replay_size",
                f"must be at least batch_size ({self.batch_size})")

    def check_run(self, trainer):
        require(self.learning_starts < trainer.total_steps, "trainer.learning_starts",
                f"must be below total_steps ({trainer.total_steps}): the run would end "
                "before its first gradient step")


class OffPolicy(Algorithm):
    """The shared core; a subclass sets its networks and its three methods."""
    Config = OffPolicyConfig
    stats = ("policy_loss", "value_loss", "entropy", "alpha")
    num_critics = 1
    stochastic = False  # a Gaussian actor (SAC) rather than a deterministic one

    def __init__(self, config, env, context, timer):
        self.members = Members(config, env, context)
        if not self.members.solo:
            if config.trainer.compile == "on":
                raise ConfigError("config key 'trainer.compile' on: a population runs "
                                  "uncompiled (its members' one batched call is what compiling "
                                  "would buy); use auto or off")
            config = replace(config, trainer=replace(config.trainer, compile="off"))
        super().__init__(config, env, context, timer)
        cfg = self.cfg
        for name, spec in env.policy_specs.items():
            if not spec.continuous:
                raise GpusimError(f"trainer.algorithm {config.trainer.algorithm} needs "
                                  f"continuous actions, and policy {name!r} acts discretely "
                                  "(use ppo or a2c)")
        row = sum(4 * (2 * s.obs_dim + s.action_width + 3) for s in env.policy_specs.values())
        size = self.members.count
        env.backend.check_fits(
            f"the replay buffers ({f'{size} x ' if size > 1 else ''}{cfg.replay_size:,} "
            "transitions per policy)", size * cfg.replay_size * row)
        self.check_models_fit(networks=2 * (1 + self.num_critics) * size)  # online and target
        self.env_steps = 0
        build(self)  # groups (networks, Adams, replay), actors; how a step and a rollout run

    def graphs_supported(self, trainer) -> bool:
        """The gradient step is static (a CUDA graph replays it) where its sample is: a lone
        process's uniform replay, every row valid, one member. Elsewhere it runs eagerly,
        and `cuda_graphs: on` is refused in one line."""
        why = None
        if not self.members.solo:
            why = "a population samples each member's own ring"
        elif self.cfg.prioritized_replay:
            why = "prioritized replay samples in proportion to priorities over the held rows"
        elif self.env.agent_active_array is not None:
            why = "with per-agent done, the replay draws only rows in play"
        elif self.distributed:
            why = "several processes sample across their shards"
        if why and trainer.cuda_graphs == "on":
            raise GpusimError(f"config key 'trainer.cuda_graphs' on: {why}, so its gradient "
                              "step is not captured (use auto or off)")
        return why is None

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS gradient steps (after learning_starts)."""
        t = self.config.trainer
        per_iteration = t.steps_per_iteration * self.world_size
        learning = t.num_iterations(self.world_size) - self.cfg.learning_starts // per_iteration
        return learning * self.gradient_steps_per_iteration() >= CPU_COMPILE_MIN_STEPS

    def gradient_steps_per_iteration(self) -> int:
        return max(1, round(self.cfg.replay_ratio * self.config.trainer.steps_per_iteration))

    @classmethod
    def model_for(cls, config, spec, exploring: bool = True) -> OffPolicyModel:
        """A policy's networks for this algorithm (`exploring`: with its exploration noise,
        for training rollouts)."""
        return OffPolicyModel(spec, config.policy, cls.num_critics, cls.stochastic)

    # ---- rollout -------------------------------------------------------------------
    def collect(self, env_steps: int):
        """A rollout: random actions for the steps before `learning_starts`, the actor's
        after (run as `build` chose: eagerly, or a CUDA graph per way of acting)."""
        t_cfg = self.config.trainer
        self.env_steps = env_steps
        # (trainer.num_envs: a population's env holds every member's replicas)
        explore = tuple(env_steps + t * t_cfg.num_envs * self.world_size
                        < self.cfg.learning_starts for t in range(t_cfg.rollout_len))
        self.run_rollout(explore)

    @torch.no_grad()
    def rollout(self, explore: tuple):
        t_cfg, env = self.config.trainer, self.env
        for t in range(t_cfg.rollout_len):
            active = env.agent_active()
            with self.timer("forward"):
                obs = {g.name: self.observe(g.name, self.next_obs).clone() for g in self.policies}
                with self.precision.autocast():
                    acted = (self.explorers if explore[t] else self.actors).act(self.next_obs)
            with self.timer("env"):
                next_obs, reward, terminated, _truncated, info = env.step()
            with self.timer("forward"):
                done = info["reset_mask"]
                # a finished replica's true next observation is its final one
                true_next = torch.where(done[:, None, None], info["final_obs"], next_obs)
                still = env.agent_active()
                if still is not None:  # in finished replicas: who was in play at the end
                    still = torch.where(done[:, None], env.final_active(), still)
                for g in self.policies:
                    ended = terminated[:, None].expand(-1, g.spec.num_agents)
                    if active is not None:  # an agent that left play terminated too
                        ended = ended | ~still[:, g.agents]
                    # (replica, agent) flattened into rows; with per-agent done, rows of
                    # agents out of play are kept but flagged, never drawn (no host sync)
                    rows = None if active is None else active[:, g.agents].reshape(-1)
                    fields = (obs[g.name], acted.stored[g.name],
                              reward[:, g.agents] * t_cfg.reward_scale,
                              self.observe(g.name, true_next), ended)
                    g.store(*(x.reshape((-1,) + x.shape[2:]) for x in fields), valid=rows)
                self.episodes.record(t, reward, done, active)

    # ---- update --------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """Each policy's gradient steps (none before `learning_starts`): their mean
        statistics."""
        t_cfg = self.config.trainer
        steps_taken = self.env_steps + t_cfg.steps_per_iteration * self.world_size
        steps = self.gradient_steps_per_iteration() if steps_taken > self.cfg.learning_starts \
            else 0
        self.set_rates(lr)

        def run():
            totals = []
            for g in self.policies:
                total = torch.zeros(self.stats_shape, device=self.env.device)
                for _ in range(steps):
                    total += g.step()
                totals.append(total / max(1, steps))
            return torch.stack(totals)
        return self.guarded(run, learning=steps > 0)

    def set_rates(self, lr: float):
        """Every Adam at the loop's rate (a population: each member's, 0 where it stopped
        learning, whose targets stop moving too)."""
        rates = self.members.rates(lr)
        for g in self.policies:
            for adam in g.optimizer.by_name.values():
                adam.set_lr(rates)
        if not self.members.solo:
            alive = torch.tensor(self.members.alive, dtype=torch.float32, device=self.env.device)
            self.tau.copy_(self.tau_base * alive)

    def gradient_step(self, descent, g, obs, actions, rewards, next_obs, terminated, weights,
                      actor_due: bool, draws=(), nets: NetsOn | None = None):
        """One step of the critics towards r + gamma * (1 - terminated) * Q'(s', a'), and
        when due one step of the actor (and of SAC's alpha) and of the targets, on a sampled
        batch and the step's standard normal `draws` (`step_draws` of them): its steps taken
        through `descent` (training.speed.descent: eager, or compiled), its networks run through
        `nets` (default: the group's own; a population member's: offpolicy_members.py).
        Returns (statistics, TD errors)."""
        cfg, model = self.cfg, g.model
        autocast = self.precision.autocast  # forwards in bf16 where asked; losses in fp32
        critic_params = descent.params("critic")
        log_alpha = descent.params("alpha")["log_alpha"] if "alpha" in g.optimizer.by_name \
            else None
        if nets is None:
            nets = NetsOn(g, descent.params("actor"), critic_params, cfg.tau, draws)
        alpha = nets.alpha(log_alpha).detach()
        with torch.no_grad(), autocast():
            next_action, next_log_prob = self.next_action(nets, next_obs)
            next_q = nets.q(model.target_critics, next_obs, next_action).float().min(0).values
            if next_log_prob is not None:
                next_q = next_q - alpha * next_log_prob.float()
            target = rewards + self.config.trainer.gamma * (~terminated) * next_q

        def critic_loss(params):
            with autocast():
                td = model.q(model.critics, obs, actions, params).float() - target
            loss = (weights * td.pow(2).sum(0)).sum() / cfg.batch_size
            return loss, (loss.detach(), td.detach())
        loss, td = descent.step("critic", critic_loss)
        stats = torch.stack([torch.zeros_like(loss), loss, torch.zeros_like(loss), alpha])
        if not actor_due:
            return stats, td

        def actor_loss(params):
            with autocast():
                loss, log_prob = self.actor_loss(nets.with_actor(params), obs, alpha)
            aux = {"loss": loss.float().detach()}  # (no None: grad's aux holds tensors only)
            if log_prob is not None:
                aux["log_prob"] = log_prob.float().detach()
            return loss.float(), aux
        aux = descent.step("actor", actor_loss)
        loss, log_prob = aux["loss"], aux.get("log_prob")
        entropy = torch.zeros_like(loss) if log_prob is None \
            else -log_prob.sum() / max(1, log_prob.numel())
        if log_alpha is not None:
            def alpha_loss(params):
                loss = self.alpha_loss(g, params["log_alpha"], log_prob)
                return loss, loss.detach()
            descent.step("alpha", alpha_loss)
        nets.soft_update()
        return torch.stack([loss, stats[1], entropy, alpha]), td

    # what the algorithms define
    def next_action(self, g, next_obs):
        """(the action the target critics are evaluated at, its log-prob or None); `g` runs
        the networks as the step sees them (NetsOn)."""
        raise NotImplementedError

    def actor_due(self, g) -> bool:
        return True

    def step_draws(self, actor_due: bool) -> int:
        """How many standard normal (batch rows, action dims) draws one gradient step takes,
        in order: drawn before the step (from torch's generator; a population member's from
        its own), so the step itself draws nothing."""
        return 0

    def actor_loss(self, g, obs, alpha):
        """(the actor's loss, summed over the rank's rows / batch_size; log-prob or None)."""
        raise NotImplementedError

    def alpha_loss(self, g, log_alpha, log_prob):
        """The loss a tuned entropy weight descends (SAC)."""
        raise NotImplementedError

    # ---- checkpoints -----------------------------------------------------------------
    def models(self) -> dict:
        return {g.name: g.model for g in self.policies}

    @staticmethod
    def tensors(g) -> list:
        out = list(g.model.parameters())
        for adam in g.optimizer.by_name.values():
            out += adam.exp_avg + adam.exp_avg_sq + [adam.step_count]
        return out

    def state_dict(self) -> dict:
        state = {"models": {g.name: g.model.state_dict() for g in self.policies},
                 "optimizers": {g.name: g.optimizer.state_dict() for g in self.policies},
                 "updates": {g.name: g.updates for g in self.policies}}
        if not self.members.solo:
            state.update(self.members.state_dict(),
                         noise_rngs=[n.get_state() for n in self.noise])
        return state

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers", "updates")
        if not self.members.solo:
            self.members.load_state_dict(state)
        for g in self.policies:
            g.model.load_state_dict(state["models"][g.name])
            g.optimizer.load_state_dict(state["optimizers"][g.name])
            g.updates = state["updates"][g.name]
            for graph in g.graphs.values():  # capture again, after the loaded state
                graph.drop()
        for graph in self.rollout_graphs.values():
            graph.drop()
        for generator, saved in zip(getattr(self, "noise", ()), state.get("noise_rngs", ())):
            generator.set_state(saved)

    def rank_state_dict(self) -> dict:
        if not self.cfg.checkpoint_replay:
            return {}
        return {"replay": {g.name: g.replay.state_dict() for g in self.policies}}

    def load_rank_state_dict(self, state: dict):
        if "replay" not in state:
            print("gpusim: this checkpoint holds no replay buffers (trainer.checkpoint_replay "
                  "was false): the resumed run refills them and will not reproduce an "
                  "uninterrupted one", flush=True)
            return
        for g in self.policies:
            g.replay.load_state_dict(state["replay"][g.name])

    def warming_up(self) -> bool:
        """Whether a graph is still to be captured (the gradient steps' after learning
        starts)."""
        graphs = [*self.rollout_graphs.values(),
                  *(graph for g in self.policies for graph in g.graphs.values())]
        return any(graph.warming_up() for graph in graphs)

    @classmethod
    def acting_model(cls, config, env, spec):
        return cls.model_for(config, spec, exploring=False)
