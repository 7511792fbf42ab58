"""A population of PPO (or A2C) runs trained side by side in one process: the solo run's
steps under torch.func.vmap, as PureJaxRL vectorises its train step.

`trainer.population` (training.population.members) makes N members, each the solo run
(ppo.py) of its seed and settings. The env holds every member's replicas side by side
(member k's the k-th share, seeded as its solo run), so the rollout is the solo one:
each policy's network is the members' networks stacked (population.stacked), whose
acting and critic passes run each member on its share under vmap. The update is the
solo one per member: GAE over the whole buffer (each replica's own), each member's
minibatches from its own rows and generator, and the solo loss (`PPO.loss`) of every
member under vmap, their sum backpropagated (each member's gradient its own loss's),
then one Adam with a member dim (each member's rate and clip). What differs from ppo.py is written here; nothing in ppo.py knows it. A
population is feed-forward and without a league (both refused in one line); a member
whose loss or parameters stop being finite is put back and frozen.
"""
from __future__ import annotations

import torch

from .. import losses
from ..losses import take
from ..models import make_model
from ..population.members import Members, noise_generator
from ..population.stacked import StackedPolicy, check_stack_fits
from ..speed.descent import Adam
from .ppo import PPO, Policy, rows_of
from .ppo_buffer import PolicyBuffer
from .ppo_config import A2CConfig, check_for_env, run_config


class PopulationPPO(PPO):
    def __init__(self, config, env, context, timer):
        self.members = Members(config, env, context)
        check_for_env(config, env, population=True)
        super().__init__(run_config(config, True), env, context, timer)
        members = self.members
        self.alive, self.finished = members.alive, members.finished  # (the same lists)
        self.episodes.members = members.count
        self.shuffles = members.shuffles()  # each member's own generator
        self.update_stats = torch.zeros((len(self.policies), members.count, len(self.stats)),
                                        device=env.device)
        # each member's coefficients; GAE's lambda per replica, its member's
        self.coefs = [members.setting(k) for k in ("clip_coef", "ent_coef", "vf_coef")]
        self.lam = members.setting("gae_lambda").repeat_interleave(
            config.trainer.num_envs)[None, :, None]
        self.member_losses = {p.name: member_losses(self, p) for p in self.policies}

    def replicas_named(self) -> str:
        return f"a population of {self.members.count} (trainer.population) x " \
               f"{self.config.trainer.num_envs:,}"

    def check_models_fit(self, networks: int):
        super().check_models_fit(networks * self.members.count)

    def make_policies(self) -> list:
        """Each policy's network: every member's made from its seed (every policy of member
        0, then of member 1, ...) and stacked; each member's exploration from a generator
        of its own, as its solo run draws it."""
        env, config, t, members = self.env, self.config, self.config.trainer, self.members
        nets, noise = [], []
        for member in members.list:
            torch.manual_seed(member.seed)
            nets.append({name: make_model(spec, config.policy, self.state_dim or None)
                         for name, spec in env.policy_specs.items()})
            noise.append(noise_generator(member.seed, env.device))
        check_stack_fits(env.backend, f"a population of {members.count} (trainer.population)",
                         list(nets[0].values()), members.count)
        policies = []
        for name, spec in env.policy_specs.items():
            model = StackedPolicy([n[name] for n in nets]).to(env.device)
            model.generators = noise
            adam = Adam(model.parameters(), members.rates(t.lr), eps=1e-5,
                        max_grad_norm=members.setting("max_grad_norm"), members=members.count,
                        device_lr=self.use_graphs)
            buffer = PolicyBuffer(spec, t.rollout_len, env.num_envs, env.device, self.state_dim,
                                  self.mask_width)
            policies.append(Policy(name, spec, self.agents[name], model, adam, buffer, model))
        return policies

    # ---- the update -------------------------------------------------------------------
    def update(self, lr: float) -> dict:
        """As the solo update, for every member still learning (each at its own rate); a
        member that diverged is put back and frozen."""
        for p in self.policies:
            p.adam.set_lr(self.members.rates(lr))
        orders = self.orders()
        if not any(self.alive):  # (the loop ends after this iteration)
            self.update_stats.zero_()
            return self.members_reported(self.update_stats, None)
        before = self.saved()
        return self.members_reported(self.speed.update(orders), before)

    def orders(self) -> dict:
        """Each policy's rows, per member, and every epoch's shuffle of each member's rows
        from that member's own generator."""
        orders = {}
        for _, p in self.learners:
            own, weights = self.member_rows(p)
            orders[p.name] = ((own, weights), [
                [torch.randperm(r.shape[0], generator=g, device=g.device)
                 for r, g in zip(own, self.shuffles)] for _ in range(self.cfg.update_epochs)])
        return orders

    def update_policy(self, p: Policy, rows: tuple, orders: list) -> torch.Tensor:
        """The rollout's values and GAE, then `update_epochs` passes of every member's
        shuffled minibatches, each a vmapped solo step; statistics (members, stats)."""
        cfg, buf = self.cfg, p.buffer
        with torch.no_grad():
            self.rollout_values(p)
            state = self.env.global_state() if self.central else None
            next_value = self.values(p, self.next_obs, state)
            advantages, returns = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
        advantages, returns = advantages.reshape(-1), returns.reshape(-1)
        own, weights = rows
        # who steps: the members still learning; in a captured update every member, those
        # no longer learning at rate 0
        learning = None if self.speed.whole else self.members.learning()
        stats = 0.0
        for epoch in range(cfg.update_epochs):
            for mb, held in minibatches(own, weights, orders[epoch], cfg.num_minibatches):
                adv = take(advantages, mb)
                if cfg.norm_adv and mb.shape[1] > 1:
                    adv = torch.func.vmap(normalized, in_dims=(0, None if held is None
                                                               else 0))(adv, held)
                stats = stats + self.members_step(p, mb, adv, take(returns, mb), held,
                                                  learning)
        return stats / (cfg.update_epochs * cfg.num_minibatches)

    def members_step(self, p: Policy, rows, adv, returns, weights, learning):
        """Every member's minibatch step at once (inputs (members, rows)): its loss under
        vmap, backpropagated, in chunks of `max_minibatch_rows` rows per member where it
        has more (each chunk's loss weighed by its share of the member's rows), then Adam's
        step of the members `learning` (None: all). The statistics, (members, stats)."""
        size, chunk = rows.shape[1], self.speed.chunk
        total = None if weights is None else weights.sum(1).clamp_min(1.0)
        stats = 0.0
        for start in range(0, size, chunk):
            n = min(chunk, size - start)
            part = [x if x is None else x.narrow(1, start, n)
                    for x in (rows, adv, returns, weights)]
            share = torch.full((rows.shape[0],), n / size, device=adv.device) \
                if weights is None else part[3].sum(1) / total
            loss, out = self.member_losses[p.name](*part, share)
            loss.sum().backward()
            stats = stats + out
        p.adam.step(None, learning)
        p.adam.zero_grad()
        return stats

    def gae(self, rewards, values, dones, next_value) -> tuple:
        """GAE of every replica at once: each with its member's lambda."""
        return losses.gae(rewards, values, dones, next_value, self.config.trainer.gamma,
                          self.lam)

    def rollout_values(self, p: Policy, valued=None):
        """Every step's value in one critic call: the members' replicas leading (the stacked
        network splits its inputs' leading dim among the members)."""
        buf = p.buffer
        states = buf.states.transpose(0, 1) if self.central else None
        buf.values.copy_(self.critic(p, buf.obs.transpose(0, 1), states).transpose(0, 1))

    def member_rows(self, p: Policy) -> tuple:
        """Each member's flat rows, in its solo run's order (with per-agent done and
        `out_of_play: skip`, its rows in play, unless fewer than its minibatches), and
        every flat row's weight (None: every row counts)."""
        shape = tuple(p.buffer.rewards.shape)  # (steps, envs, agents)
        share, device = shape[1] // self.members.count, p.buffer.rewards.device
        own = [rows_of(shape, torch.arange(k * share, (k + 1) * share, device=device))
               for k in range(self.members.count)]
        if not self.per_agent_done:
            return own, None
        active = p.buffer.active.reshape(-1)
        if self.cfg.out_of_play == "skip":
            kept = [rows[active[rows]] for rows in own]  # (a host read)
            own = [k if k.shape[0] >= self.cfg.num_minibatches else rows
                   for k, rows in zip(kept, own)]
        return own, active.float()

    # ---- what the loop reads ----------------------------------------------------------
    def finish(self, k: int, iteration: int):
        self.members.finish(k, iteration)

    def reported_names(self) -> list:
        return self.members.names(self.env.policy_specs)

    @staticmethod
    def tensors(p: Policy) -> list:
        return list(p.model.parameters()) + p.adam.exp_avg + p.adam.exp_avg_sq \
            + [p.adam.step_count]

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "shuffle_rngs": [g.get_state() for g in self.shuffles]}

    def load_state_dict(self, state: dict):
        self.members.load_state_dict(state)  # (its count checked)
        super().load_state_dict(state)
        for generator, saved in zip(self.shuffles, state["shuffle_rngs"]):
            generator.set_state(saved)


class PopulationA2C(PopulationPPO):
    Config = A2CConfig


def member_losses(ppo: PopulationPPO, p: Policy):
    """`(rows, adv, returns, weights, share) -> (losses, statistics)` of every member at
    once, each input leading with the members: the solo loss (`PPO.loss`) of each member
    on its own network and coefficients, weighed by its `share`, under `torch.func.vmap`
    (differentiable: the members' losses' sum, backpropagated, gives each member its own
    gradient)."""
    model = p.model

    def one(params, buffers, rows, adv, returns, weights, share, clip, ent, vf):
        def forward(*inputs):
            return torch.func.functional_call(model.calls["forward"], (
                {f"net.{n}": x for n, x in params.items()},
                {f"net.{n}": x for n, x in buffers.items()}), inputs)
        stats, value = ppo.loss(p, rows, adv, returns, weights, forward=forward,
                                coefs=(clip, ent, vf))
        return value * share, stats * share

    def run(rows, adv, returns, weights, share):
        params, buffers = model.stacked()
        return torch.func.vmap(one, in_dims=(0, 0, 0, 0, 0, None if weights is None else 0,
                                             0, 0, 0, 0))(
            params, buffers, rows, adv, returns, weights, share, *ppo.coefs)
    return run


def normalized(adv, weights):
    """A member's minibatch advantages normalised over its rows (weighted: those in play)."""
    total = adv.numel() if weights is None else weights.sum().clamp_min(1.0)
    return losses.normalized(adv, weights, total)


def minibatches(own: list, weights, orders: list, num_minibatches: int):
    """One epoch's minibatches, each (rows (members, units), their weights or None): member
    k's rows in the order `orders[k]`, cut into `num_minibatches` parts; where members'
    parts differ in size (rows in play), the shorter are padded with rows of their own
    weighing 0."""
    picked = [r[o] for r, o in zip(own, orders)]
    sizes = [len(r) // num_minibatches for r in picked]
    size = max(sizes)
    rows = torch.empty((num_minibatches, len(picked), size), dtype=torch.long,
                       device=picked[0].device)
    valid = None
    for k, (r, n) in enumerate(zip(picked, sizes)):
        part = r[:num_minibatches * n].view(num_minibatches, n)
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
                else take(weights, rows[j])
            yield rows[j], held if valid is None else held * valid[j]
