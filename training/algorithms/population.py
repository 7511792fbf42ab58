"""A population of PPO or A2C runs trained as one (`trainer.population`, training.population).

`populated(PPO)` is PPO with every member's networks stacked (StackedPolicy)
and its replicas side by side in one env (member k's are the k-th share).
What changes against a solo run, and only that, is written here:
- networks made from each member's seed, stacked; one Adam per member
  (StackedAdam) with the member's learning rate and clipping norm;
- every member's minibatch drawn from its own generator, over its own rows
  (`_units`: per member, in the order of a solo run's rows), and its loss
  computed by torch.func.vmap over members, with the member's coefficients;
- statistics and episode returns per member ("agent/m3");
- a member whose loss or parameters stop being finite is put back to its
  weights before that update and frozen (learning rate 0), with one line;
  the others go on. Only when every member has diverged does the run stop;
- with `trainer.target_return`, a member that reaches it stops learning
  there, as its solo run stops; the run ends when every member has.
With per-agent done, on the CPU each member trains on its rows in play (the
longest member's count, the others filled with rows of their own out of
play, weighted 0); in static steps (on a GPU) on every row, as a solo run.
"""
from __future__ import annotations


import torch

from gpusim.errors import GpusimError

from .. import losses, population
from ..acceleration import MaybeCompiled
from ..episodes import EpisodeTracker
from ..losses import normalized
from ..models import make_model
from ..population import MemberLives, StackedAdam, StackedPolicy, noise_generator
from .rollout import PolicyBuffer, PolicyGroup, take


def populated(cls) -> type:
    """The population version of algorithm class `cls` (off-policy ones:
    population_offpolicy.py); one line where it has none."""
    from . import ALGORITHMS
    from .offpolicy import OffPolicy
    if not getattr(cls, "populates", False):
        names = [name for name, c in ALGORITHMS.items() if getattr(c, "populates", False)]
        raise GpusimError(f"config key 'trainer.population' applies to {', '.join(names)}; "
                          f"{cls.__name__.lower()} trains one member per process (run its "
                          "seeds as separate runs)")
    if issubclass(cls, OffPolicy):
        from .population_offpolicy import OffPolicyPopulation
        return type(f"Population{cls.__name__}", (OffPolicyPopulation, cls), {})
    return type(f"Population{cls.__name__}", (Population, cls), {})


class Population(MemberLives):
    """Mixed in before PPO (or A2C): see the module."""
    chunks_graphs = False  # every member's minibatch is one batched step (_minibatch_step)

    def __init__(self, config, env, context, timer):
        from dataclasses import replace
        t = config.trainer
        if config.policy.recurrent != "none":
            raise GpusimError("config key 'trainer.population' with policy.recurrent: a "
                              "population of recurrent policies is not batched yet (run its "
                              "members as separate runs)")
        size = self._take_members(config, env, context)
        central = config.policy.critic == "central"
        state_dim = env.global_state().shape[-1] if central else None
        self.member_nets, noise = [], []
        for member in self.members:  # each made as a solo run of its seed makes it
            torch.manual_seed(member.seed)
            self.member_nets.append({name: make_model(spec, config.policy, state_dim)
                                     for name, spec in env.policy_specs.items()})
            noise.append(noise_generator(member.seed, env.device))
        # members run uncompiled: one batched call each is what compiling would buy
        super().__init__(replace(config, trainer=replace(t, compile="off")), env, context,
                         timer)
        device = env.device
        for g in self.groups:  # Gaussian exploration: each member from its own generator
            g.model.generators = noise
        self.shuffles = [torch.Generator(device=device).manual_seed(m.seed)
                         for m in self.members]
        self.episodes = EpisodeTracker(env, t.rollout_len, self.agents, members=size)
        self.update_stats = torch.zeros((len(self.groups), size, len(self.stats)),
                                        device=device)
        self.alive = [True] * size     # still learning
        self.finished = [False] * size  # reached trainer.target_return: stopped, as its
                                        # solo run would have
        per_replica = t.num_envs
        self.lam = self._per_member("gae_lambda").repeat_interleave(per_replica)[None, :, None]
        self.coefs = torch.stack([self._per_member(k) for k in ("clip_coef", "ent_coef",
                                                                "vf_coef")], 1)
        self._member_units = {}
        self.learning = None  # the members the update runs (None: all)

    def _per_member(self, key: str) -> torch.Tensor:
        return torch.tensor([population.setting(m, key, self.config.trainer, self.cfg)
                             for m in self.members], device=self.env.device)

    def reported_names(self) -> list:
        return [f"{name}/{m.name}" for name in self.env.policy_specs for m in self.members]

    def steps_fuse(self) -> bool:
        return False

    # ---- the members' networks and optimizers -------------------------------------------
    def _policy_group(self, name, spec) -> PolicyGroup:
        env, t = self.env, self.config.trainer
        model = StackedPolicy([nets[name] for nets in self.member_nets]).to(env.device)
        optimizer = StackedAdam(list(model.parameters()), self._per_member("lr").clone(),
                                self._per_member("max_grad_norm"))
        return PolicyGroup(
            name, spec, self.agents[name], model, optimizer, model,
            MaybeCompiled(model.value, f"policy {name!r} (value)", False),
            MaybeCompiled(model, f"policy {name!r} (update)", False),
            PolicyBuffer(spec, t.rollout_len, env.num_envs, env.device, self.state_dim,
                         self.mask_width))

    def set_lr(self, optimizer, lr: float):
        """Each member's rate, scaled as the loop's schedule scales trainer.lr; 0 if frozen
        (made on the host, one copy to the device per update)."""
        scale = lr / self.config.trainer.lr
        rates = [population.setting(m, "lr", self.config.trainer, self.cfg) * scale * alive
                 for m, alive in zip(self.members, self.alive)]
        optimizer.lr.copy_(torch.tensor(rates), non_blocking=True)

    # ---- the update: every member's minibatch in one batched step -----------------------
    def _gae_lambda(self):
        return self.lam

    def _units(self, buf: PolicyBuffer) -> tuple:
        """(units, members): member k's rows, in the order of a solo run's own (step,
        replica, agent) rows; and every row's weight (in play), or None.

        With per-agent done, outside static steps (on the CPU), each member's rows in play
        come first and the units stop at the most any member has (one host read, as a solo
        run's compaction): a member with fewer fills up with rows of its own out of play,
        which weigh 0."""
        steps, envs, agents = buf.rewards.shape
        units = self._member_units.get((steps, envs, agents))
        if units is None:
            share = envs // len(self.members)
            device = buf.rewards.device
            local = torch.arange(steps * share * agents, device=device)
            step, rest = local // (share * agents), local % (share * agents)
            first = torch.arange(len(self.members), device=device) * share * agents
            units = step[:, None] * envs * agents + first[None, :] + rest[:, None]
            self._member_units[(steps, envs, agents)] = units
        if self.env.agent_active_array is None:
            return units, None
        active = buf.active.reshape(-1)
        if not self._leaves_out_of_play():
            return units, active.float()
        out_of_play = (~active[units]).to(torch.int8)
        learning = out_of_play if self.learning is None else out_of_play[:, self.learning]
        most = int((1 - learning).sum(0).max())  # the update's one host read
        if most < self.cfg.num_minibatches:
            return units, active.float()
        first_in_play = torch.sort(out_of_play, dim=0, stable=True).indices[:most]
        return units.gather(0, first_in_play), active.float()

    def _shuffled(self, units: int) -> torch.Tensor:
        """Each member's shuffle of its units, from its own generator: (units, members)."""
        return torch.stack([torch.randperm(units, generator=g, device=g.device)
                            for g in self.shuffles], 1)

    def _draw_orders(self, g: PolicyGroup):
        units = self._units(g.buffer)[0].shape[0]
        orders = self.orders.get(g.name)
        if orders is None:
            orders = self.orders[g.name] = torch.empty(
                (self.cfg.update_epochs, units, len(self.members)), dtype=torch.long,
                device=self.env.device)
        for epoch in range(self.cfg.update_epochs):  # a solo run's draws, per member
            for k, shuffle in enumerate(self.shuffles):
                orders[epoch, :, k].copy_(torch.randperm(units, generator=shuffle,
                                                         device=shuffle.device))

    def _minibatch_rows(self, units, picked):
        return units.gather(0, picked)  # (rows, members): each member's own picks

    def _rollout_values(self, g: PolicyGroup, in_play):
        """Every step's value, the members' replicas leading (StackedPolicy splits dim 0)."""
        buf = g.buffer
        states = None if buf.states is None else buf.states.transpose(0, 1)
        buf.values.copy_(self._critic(g, buf.obs.transpose(0, 1), states).transpose(0, 1))

    def _minibatch_step(self, g: PolicyGroup, rows, advantages, returns, active=None):
        """One gradient step of every member on its own rows (rows: (picks, members)):
        every member's PPO loss at once (its rows leading with its member dim, its
        coefficients), their sum differentiated once (a member's gradient is its own
        loss's), then each member's clipped Adam step."""
        cfg, count, learning = self.cfg, rows.shape[0], self.learning
        cols = rows.t()  # (members, picks)
        coefs = self.coefs
        if learning is not None:  # only the members still learning
            cols, coefs = cols[learning], coefs[learning]
        batch = g.buffer.rows(cols.reshape(-1))

        def split(x):
            return None if x is None else x.reshape(cols.shape + x.shape[1:])
        weights = None if active is None else take(active, cols)
        total = count if weights is None else weights.sum(-1, keepdim=True).clamp_min(1.0)
        adv = take(advantages, cols)
        if cfg.norm_adv and count > 1:
            adv = normalized(adv, weights, total, dim=-1)
        inputs = (split(batch["obs"]), split(batch["actions"]), split(batch["mask"]),
                  split(batch["critic_obs"]))
        with self.precision.autocast():
            new = self._members_forward(g, inputs, learning)
        clip, ent, vf = coefs.unbind(1)
        stats, loss = losses.ppo_objective(new, split(batch["log_probs"]),
                                           split(batch["values"]), adv, take(returns, cols),
                                           weights, clip, cfg.clip_vloss, ent, vf, dim=-1)
        g.optimizer.zero_grad()
        loss.sum().backward()
        g.optimizer.step()
        if learning is None:
            return stats
        return stats.new_zeros((len(self.members),) + stats.shape[1:]).index_copy_(
            0, learning, stats)

    @staticmethod
    def _members_forward(g: PolicyGroup, inputs: tuple, learning=None):
        """The training pass of every member on its rows (inputs (members, picks, ...)), or
        of the members `learning` (their indices) on theirs."""
        model = g.model
        params, buffers = model.stacked()
        if learning is not None:
            params = {n: t[learning] for n, t in params.items()}
            buffers = {n: t[learning] for n, t in buffers.items()}
        if model.direct:
            return model.lead("forward", *inputs,
                              tensors=list(params.values()) + list(buffers.values()))
        named = ({f"net.{n}": x for n, x in params.items()},
                 {f"net.{n}": x for n, x in buffers.items()})

        def member(p, b, *xs):
            return torch.func.functional_call(model.calls["forward"], (p, b), xs)
        dims = tuple(None if x is None else 0 for x in inputs)
        return torch.func.vmap(member, in_dims=(0, 0) + dims)(*named, *inputs)

    # ---- statistics, divergence and checkpoints -----------------------------------------
    def _statistics(self) -> dict:
        """The update (eagerly, or its graph replayed), then per member its statistics; a
        member that diverged in it goes back to its weights before it, and is frozen."""
        before = [self._group_state(g) for g in self.groups]
        # on the CPU the update leaves the members no longer learning out (in static
        # steps every member runs, those at rate 0 standing still)
        self.learning = None if self.static_steps or all(self.alive) else torch.tensor(
            [k for k, alive in enumerate(self.alive) if alive], device=self.env.device)
        if any(self.alive):
            self.update_graph()
        else:  # (the loop ends after this iteration)
            self.update_stats.zero_()
        values = self.update_stats.tolist()  # (policies, members, statistics)
        self._freeze_diverged(values, before)
        return {f"{g.name}/{m.name}": dict(zip(self.stats, values[i][k]))
                for i, g in enumerate(self.groups) for k, m in enumerate(self.members)
                if self.alive[k]}

    @staticmethod
    def _tensors(g: PolicyGroup) -> list:
        opt = g.optimizer
        return list(g.model.parameters()) + opt.exp_avg + opt.exp_avg_sq + [opt.step_count]

    def state_dict(self) -> dict:
        return {"models": {g.name: g.model.state_dict() for g in self.groups},
                "optimizers": {g.name: g.optimizer.state_dict() for g in self.groups},
                "shuffle_rngs": [s.get_state() for s in self.shuffles],
                "alive": list(self.alive), "finished": list(self.finished)}

    def load_state_dict(self, state: dict):
        self.check_policies(state, "models", "optimizers")
        if len(state.get("alive", ())) != len(self.members):
            raise GpusimError(f"the checkpoint holds {len(state.get('alive', ()))} population "
                              f"members; this run has {len(self.members)}")
        for g in self.groups:
            g.model.load_state_dict(state["models"][g.name])
            g.optimizer.load_state_dict(state["optimizers"][g.name])
        for shuffle, saved in zip(self.shuffles, state["shuffle_rngs"]):
            shuffle.set_state(saved)
        self.alive = list(state["alive"])
        self.finished = list(state.get("finished", [False] * len(self.members)))
        self.rollout_graph.drop()
        self.update_graph.drop()
