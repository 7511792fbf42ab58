"""PPO, and A2C (its one-step special case), on device-resident rollouts.

Read top to bottom: the rollout (`rollout_len` steps of every replica under no_grad,
actions drawn on the device, no host sync per step); the update (what minibatches are
made of and their shuffles, drawn first; per policy the rollout's values, GAE, then
epochs of shuffled minibatches); one minibatch step (advantages normalised over the
minibatch; the clipped surrogate, value loss and entropy bonus of losses.py; a clipped
Adam step); checkpoints. Its config is ppo_config.py. How fast it runs is chosen once,
when it is built (ppo_build.py: CUDA graphs, chunks, torch.compile), and wrapped around
these same methods: nothing here asks how it is run.

Each policy has its own model, Adam and buffer; its model runs on all of its agents in
every replica in one call. The critic sees the agent's own observation (IPPO) or the
replica's global state (`policy.critic: central`, MAPPO). With per-agent done, an
agent's steps after it finished are neither bootstrapped across nor trained on; a
truncated replica's reward gets gamma * V(final state) (rollout.TruncationBootstrap). A
population runs the same methods over a member dim (training.population: a solo run
is a population of one); a league (training.league), against pools of past selves.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch

from gpusim.errors import GpusimError

from .. import losses
from ..models import make_model
from ..population import Members
from .base import Algorithm
from .ppo_build import Policy, build
from .ppo_config import CPU_COMPILE_MIN_STEPS, A2CConfig, PPOConfig, check_for_env


class PPO(Algorithm):
    Config = PPOConfig
    stats = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
    auto_scales = True
    captures_graphs = True

    def __init__(self, config, env, context, timer):
        self.members = Members(config, env, context)
        check_for_env(config, env, population=not self.members.solo)
        if not self.members.solo:  # members run uncompiled
            config = replace(config, trainer=replace(config.trainer, compile="off"))
        super().__init__(config, env, context, timer)
        self.central = config.policy.critic == "central"
        self.bptt_len = config.policy.bptt_len if config.policy.recurrent != "none" else 0
        self.orders = {}  # policy name -> its units, weights and shuffles, drawn before an update
        self.learning = None  # the members an update trains (None: all)
        build(self)  # policies, actors, bootstrap, shuffles, settings; how it runs

    # ---- the rollout ------------------------------------------------------------------
    def collect(self, env_steps: int):
        """A rollout (its CUDA graph replayed, once captured: one section, "rollout")."""
        with self.timer("rollout") if self.rollout_graph.graph is not None else nullcontext():
            self.rollout_graph()

    @torch.no_grad()
    def rollout(self):
        """`rollout_len` steps: each policy's inputs stored, every agent's action drawn into
        the env's arrays, the env stepped, its rewards and done marks stored."""
        env = self.env
        for t in range(self.config.trainer.rollout_len):
            with self.timer("forward"):
                active = env.agent_active()
                self._store_inputs(t, active)
                with self.precision.autocast():
                    acted = self.actors.act(self.next_obs)  # written into the env's arrays
                for p in self.policies:
                    p.buffer.actions[t].copy_(acted.stored[p.name])
                    p.buffer.log_probs[t].copy_(acted.log_prob[p.name])
            with self.timer("env"):
                _, reward, terminated, truncated, info = env.step()
            with self.timer("forward"):
                self._store_outcome(t, reward, info["reset_mask"], truncated, active)

    def _store_inputs(self, t: int, active):
        """Step t's observation, activity, legal choices, critic input, and a recurrent
        policy's state and value (a feed-forward critic runs after the rollout)."""
        state = self.env.global_state() if self.central else None
        mask = self.env.action_mask()
        for p in self.policies:
            buf = p.buffer
            buf.obs[t].copy_(self.observe(p.name, self.next_obs))
            if active is not None:
                buf.active[t].copy_(active[:, p.agents])
            if buf.masks is not None:
                buf.masks[t] = mask[:, p.agents, :self.mask_width]
            if buf.states is not None:
                buf.states[t].copy_(state)
            memory = self.actors.memory.get(p.name)
            if memory is not None and t % self.bptt_len == 0:  # a sequence starts
                buf.memory[t // self.bptt_len].copy_(memory)
            if memory is not None:
                buf.values[t] = self.values(p, self.next_obs, state, memory)

    def _store_outcome(self, t: int, reward, done, truncated, active):
        """Step t's rewards and done marks; the truncation bootstrap; episode returns."""
        still = self.env.agent_active()
        for p in self.policies:
            buf = p.buffer
            torch.mul(reward[:, p.agents], self.config.trainer.reward_scale, out=buf.rewards[t])
            # an agent's episode ends with its replica's, or when it stops playing
            dones = buf.dones[t]
            dones.copy_(done[:, None])  # copy_ into the view: half a setitem's cost
            if active is not None:
                dones |= buf.active[t] & ~still[:, p.agents]
        self.bootstrap.record(t, truncated)
        if self.bootstrap.due(t):
            self.bootstrap.flush(self.values, self.policies)
        self.actors.episode_ended(done, still)
        self.league.episode_ended(t, done)
        self.episodes.record(t, reward, done, active)

    def values(self, p: Policy, obs, state, memory=None):
        """(envs, the policy's agents) values of an env's (envs, agents, obs) array."""
        return self.critic(p, self.observe(p.name, obs), state, memory)

    def critic(self, p: Policy, own, state, memory=None):
        """(..., agents) values of the agents' own observations `own` (..., agents, obs)
        after the recurrent states `memory`, or of the replicas' global `state`."""
        with self.precision.autocast():
            if state is not None:
                value = p.value(state)
                return value[..., None].expand(*value.shape, p.spec.num_agents)
            return p.value(own) if memory is None else p.value(own, memory)

    # ---- the update -------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """Every policy's update: what minibatches are made of and their shuffles, drawn
        first; then the update (its graph replayed, once captured)."""
        members = self.members
        # the members still learning (in a whole-update graph every member runs, those at
        # rate 0 standing still)
        self.learning = None if self.whole_update else members.learning()
        self.league.record(self.episodes)  # (the rollout's league games)
        for p in (p for p in self.policies if self.league.learns(p.name)):
            p.adam.set_lr(members.rates(lr))
            self._store_orders(p.name, *self.units(p))
        if not any(members.alive):  # (the loop ends after this iteration)
            self.update_stats.zero_()
            return self.guarded(lambda: self.update_stats, learning=False)
        noise = self.noise.measure(self)  # at the rollout's parameters, where due
        stats = self.guarded(lambda: self.update_graph() or self.update_stats)
        self.league.after_update(self.policies)
        return self.noise.added(stats, noise)

    def update_all(self):
        for k, p in enumerate(self.policies):
            if self.league.learns(p.name):
                self.update_stats[k].copy_(self.update_policy(p, *self.orders[p.name]))

    def update_policy(self, p: Policy, units: list, weights, orders: list) -> torch.Tensor:
        """The rollout's values and GAE, then `update_epochs` passes of shuffled minibatches
        (of rows, or of agent sequences for a recurrent policy); the mean statistics."""
        cfg, buf = self.cfg, p.buffer
        with torch.no_grad():
            if not self.bptt_len:  # (else stored per step); the units' rows' only, where
                some = self.env.agent_active_array is not None or self.league.trains_on(p.name)
                rows = units[0][:, 0] if self.members.solo and weights is None and some \
                    and not self.central else None
                self.rollout_values(p, rows)
            state = self.env.global_state() if self.central else None
            next_value = self.values(p, self.next_obs, state, self.actors.memory.get(p.name))
            advantages, returns = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        stats = 0.0
        for epoch in range(cfg.update_epochs):
            for rows, row_weights in minibatches(units, orders[epoch], weights,
                                                 cfg.num_minibatches, p.name):
                stats = stats + self.minibatch_step(p, rows, row_weights, advantages, returns)
        return stats / (cfg.update_epochs * cfg.num_minibatches)

    def rollout_values(self, p: Policy, in_play):
        """Every step's value, in one critic call over the stored rollout (the critic does
        not act, so it need not run per step); with `in_play` (flat rows, a local critic)
        the values of those rows only: GAE never reads the others from them (a row in play
        and not done at t is in play at t + 1; a league's replicas are fixed)."""
        buf = p.buffer
        if not self.members.solo:  # the members' replicas leading (the stacked nets split
            states = None if buf.states is None else buf.states.transpose(0, 1)  # dim 0)
            buf.values.copy_(self.critic(p, buf.obs.transpose(0, 1), states).transpose(0, 1))
        elif in_play is None:  # a few steps at a time (bounded memory)
            steps = max(1, self.cfg.max_minibatch_rows // buf.values[0].numel())
            for t in range(0, buf.values.shape[0], steps):
                part = slice(t, t + steps)
                states = None if buf.states is None else buf.states[part]
                buf.values[part] = self.critic(p, buf.obs[part], states)
        else:
            buf.values.view(-1).zero_().index_copy_(0, in_play, p.value_rows(in_play))

    def minibatch_step(self, p: Policy, rows, weights, advantages, returns) -> torch.Tensor:
        """One gradient step on buffer rows `rows` (flat, (sequences, steps), or a
        population's (members, rows)), weighing `weights` (None: all count): the
        advantages normalised over the whole minibatch, then the step."""
        learning, dim = self.learning, (None if self.members.solo else -1)
        if learning is not None:
            rows = rows[learning]
            weights = None if weights is None else weights[learning]
        adv = losses.take(advantages, rows)
        if weights is None:
            total = rows.shape[-1] if dim else rows.numel()
        else:
            total = weights.sum(dim, keepdim=dim is not None).clamp_min(1.0)
        if self.cfg.norm_adv and (rows.shape[-1] if dim else adv.numel()) > 1:
            adv = losses.normalized(adv, weights, total, dim)
        stats = p.step(rows, adv, losses.take(returns, rows), weights, total, learning)
        if learning is None:
            return stats
        return stats.new_zeros((self.members.count,) + stats.shape[1:]).index_copy_(
            0, learning, stats)

    def loss(self, p: Policy, rows, adv, returns, weights, forward=None):
        """(detached statistics, loss) of PPO's objective on buffer rows `rows` (a chunk of
        a minibatch; a population's: of its members still learning); `forward`: the
        training pass (default: the policy's own)."""
        batch = self.gather(p.buffer, rows)
        clip, ent, vf, learning = *self.coefs, self.learning
        if not self.members.solo:  # each member's own coefficients, its rows leading
            clip, ent, vf = (c if learning is None else c[learning] for c in self.coefs)
            forward = forward or (lambda *x: p.model.training_pass(*x, members=learning))
        with self.precision.autocast():
            new = (forward or p.forward)(*batch["inputs"])
        return losses.ppo_objective(new, batch["log_probs"], batch["values"], adv, returns,
                                    weights, clip, self.cfg.clip_vloss, ent, vf,
                                    dim=None if self.members.solo else -1)

    def gather(self, buf, rows) -> dict:
        """The fields the loss reads of flat buffer rows `rows` (any shape: (sequences,
        steps) carry a recurrent policy's start states and restarts, (members, rows) lead
        with a population's members)."""
        def flat(field):
            x = getattr(buf, field)
            return losses.take(x.view((-1,) + x.shape[3:]), rows)
        critic_obs = None if buf.states is None else losses.take(  # its (step, replica) row
            buf.states.view(-1, buf.states.shape[-1]), rows // buf.obs.shape[2])
        inputs = (flat("obs"), flat("actions"), None if buf.masks is None else flat("masks"),
                  critic_obs)
        if self.bptt_len:
            per_step = buf.rewards.shape[1] * buf.rewards.shape[2]  # rows between steps
            first = rows[:, 0]  # the sequence's start: its recurrent state, stored per sequence
            start_state = buf.memory.view(-1, buf.memory.shape[-1])[
                (first // (per_step * self.bptt_len)) * per_step + first % per_step]
            resets = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
            if rows.shape[1] > 1:  # an episode that ended with step l-1 restarts the state at l
                resets[:, 1:] = losses.take(buf.dones.reshape(-1), rows[:, :-1])
            inputs = inputs + (start_state, resets)
        return {"inputs": inputs, "log_probs": flat("log_probs"), "values": flat("values")}

    # ---- what minibatches are made of ---------------------------------------------------
    def units(self, p: Policy) -> tuple:
        """What minibatches are made of, per member: the flat rows (units, 1) it trains on
        (a league's: of the replicas where the policy learns), in the order of its solo
        run's (step, replica, agent) rows, or a recurrent policy's agent sequences (units,
        bptt_len); and every row's weight (None: every row counts). With per-agent done,
        rows out of play weigh 0 (`out_of_play: weigh`, and in sequences), or are left
        out (`skip`: the update's host reads), except for a member with fewer rows in play
        than minibatches."""
        buf = p.buffer
        steps, envs, agents = buf.rewards.shape
        device = buf.rewards.device
        active = None if self.env.agent_active_array is None else buf.active.reshape(-1)
        if self.bptt_len:  # (solo: a population or league of recurrent policies is refused)
            per_step, length = envs * agents, self.bptt_len
            seq = torch.arange((steps // length) * per_step, device=device)
            starts = (seq // per_step) * length * per_step + seq % per_step
            units = starts[:, None] + torch.arange(length, device=device) * per_step
            return [units], None if active is None else active.float()
        league, share = self.league.trains_on(p.name), envs // self.members.count
        replicas = [torch.arange(k * share, (k + 1) * share, device=device)
                    for k in range(self.members.count)] if league is None \
            else [torch.tensor(league, device=device)]
        own = [((torch.arange(steps, device=device)[:, None, None] * envs + r[:, None])
                * agents + torch.arange(agents, device=device)).reshape(-1) for r in replicas]
        if active is None or self.cfg.out_of_play == "weigh":
            return [rows[:, None] for rows in own], None if active is None else active.float()
        in_play = [rows[active[rows]] for rows in own]
        units = [(kept if kept.shape[0] >= self.cfg.num_minibatches else rows)[:, None]
                 for kept, rows in zip(in_play, own)]
        compacted = all(u.shape[0] == k.shape[0] for u, k in zip(units, in_play))
        return units, None if compacted and self.members.solo else active.float()

    def _store_orders(self, name: str, units: list, weights):
        """Each epoch's shuffle of every member's units, from the member's own generator,
        kept in place where their sizes are unchanged (a captured update reads them)."""
        drawn = [[torch.randperm(u.shape[0], generator=g, device=g.device)
                  for u, g in zip(units, self.shuffles)] for _ in range(self.cfg.update_epochs)]
        held = self.orders.get(name)
        if held is not None and [u.shape for u in held[0]] == [u.shape for u in units] \
                and (held[1] is None) == (weights is None):
            for mine, new in zip(held[0] + [o for e in held[2] for o in e] +
                                 ([held[1]] if weights is not None else []),
                                 units + [o for e in drawn for o in e] +
                                 ([weights] if weights is not None else [])):
                mine.copy_(new)
            return
        self.orders[name] = (units, weights, drawn)

    def warming_up(self) -> bool:
        return self.rollout_graph.warming_up() or self.update_graph.warming_up() or any(
            graph.warming_up() for p in self.policies for graph in p.graphs())

    def compiling_pays_on_cpu(self) -> bool:
        """A run of at least CPU_COMPILE_MIN_STEPS minibatch steps, where they fuse."""
        t, cfg = self.config.trainer, self.cfg
        steps = t.num_iterations(self.world_size) * cfg.update_epochs * cfg.num_minibatches
        fuse = not self.distributed and self.config.policy.recurrent == "none"
        return fuse and steps >= CPU_COMPILE_MIN_STEPS

    # ---- checkpoints ---------------------------------------------------------------------
    def models(self) -> dict:
        return {p.name: p.model for p in self.policies}

    @staticmethod
    def tensors(p: Policy) -> list:
        return list(p.model.parameters()) + p.adam.exp_avg + p.adam.exp_avg_sq \
            + [p.adam.step_count]

    def state_dict(self) -> dict:
        return {"models": {p.name: p.model.state_dict() for p in self.policies},
                "optimizers": {p.name: p.adam.state_dict() for p in self.policies},
                "shuffle_rngs": [g.get_state() for g in self.shuffles],
                "league": self.league.state_dict(), **self.members.state_dict()}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers")
        if not self.members.solo or "alive" in state:
            self.members.load_state_dict(state)
        self.league.load_state_dict(state.get("league") or {})
        for p in self.policies:
            p.model.load_state_dict(state["models"][p.name])
            p.adam.load_state_dict(state["optimizers"][p.name])
        rngs = state["shuffle_rngs"] if "shuffle_rngs" in state else [state["shuffle_rng"]]
        for generator, saved in zip(self.shuffles, rngs):
            generator.set_state(saved)
        for graph in (self.rollout_graph, self.update_graph,
                      *(graph for p in self.policies for graph in p.graphs())):
            graph.drop()  # capture again, after the loaded state

    def rollout_outputs(self) -> tuple:
        arrays = {f"{p.name} {name}": getattr(p.buffer, field) for p in self.policies
                  for name, field in (("reward", "rewards"), ("obs", "obs"))}
        return arrays, {key: ("step", "replica", key.split()[0]) for key in arrays}

    def rank_state_dict(self) -> dict:
        return {"league": self.league.rank_state_dict()}

    def load_rank_state_dict(self, state: dict):
        self.league.load_rank_state_dict(state.get("league") or {})

    @classmethod
    def acting_model(cls, config, env, spec):
        state_dim = env.global_state().shape[-1] if config.policy.critic == "central" else None
        return make_model(spec, config.policy, state_dim)


def minibatches(units: list, orders: list, weights, num_minibatches: int, name: str):
    """One epoch's minibatches, each (rows, their weights or None): member k's units in the
    order `orders[k]`, cut into `num_minibatches` parts of `len // num_minibatches`.
    Several members' rows come as (members, rows); where their parts differ in size
    (rows in play), the shorter are padded with rows of their own weighing 0."""
    picked = [u[o] for u, o in zip(units, orders)]
    sizes = [len(p) // num_minibatches for p in picked]
    if min(sizes) == 0:  # fewer sequences than minibatches: nothing to split
        raise GpusimError(f"policy {name!r} has {min(len(p) for p in picked)} sequences per "
                          f"rollout, fewer than trainer.num_minibatches ({num_minibatches})")
    if len(picked) == 1:
        rows, size = picked[0], sizes[0]
        for j in range(num_minibatches):
            part = rows[j * size:(j + 1) * size]
            part = part if part.shape[1] > 1 else part[:, 0]
            yield part, None if weights is None else losses.take(weights, part)
        return
    size = max(sizes)
    rows = torch.empty((num_minibatches, len(picked), size), dtype=torch.long,
                       device=picked[0].device)
    valid = None
    for k, (p, n) in enumerate(zip(picked, sizes)):
        part = p[:num_minibatches * n, 0].view(num_minibatches, n)
        rows[:, k, :n] = part
        if n < size:
            rows[:, k, n:] = part[:, :1]
            valid = torch.ones(rows.shape, device=rows.device) if valid is None else valid
            valid[:, k, n:] = 0.0
    for j in range(num_minibatches):
        if weights is None and valid is None:
            yield rows[j], None
        else:
            held = torch.ones(rows[j].shape, device=rows.device) if weights is None \
                else losses.take(weights, rows[j])
            yield rows[j], held if valid is None else held * valid[j]


class A2C(PPO):
    """PPO with one epoch of one minibatch: the ratio is exactly 1 at that single step, so
    the clipped loss's gradient is the plain policy gradient."""
    Config = A2CConfig
