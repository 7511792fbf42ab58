"""The gradient noise scale of a PPO policy's actor (McCandlish et al. 2018), per rollout.

The simple noise scale B = tr(Sigma) / |G|^2 (Sigma: the per-sample gradient's
covariance; G: the true gradient) predicts the batch past which more data per update
stops buying fewer updates: updates to a score S = S_min (1 + B / batch), env steps
E = E_min (1 + batch / B). It comes from gradient norms at two batch sizes at the same
parameters: the whole rollout (`big` samples) and parts of it (`small` each),

    |G|^2    ~ (big |G_big|^2 - small |G_small|^2) / (big - small)
    tr Sigma ~ (|G_small|^2 - |G_big|^2) / (1 / small - 1 / big)

with the two estimates averaged separately over many rollouts before their ratio
(each alone is noisy; their ratio of averages is not biased by it).

Measured before the update, so the ratio is 1 and nothing is clipped: the plain policy
gradient -A log pi(a|s), advantages normalised over the rollout, over the actor's
parameters only (the value loss would dominate the norm). The parts are groups of
replicas, not random rows: a replica's agents share one state, and GAE correlates a
rollout's steps, so rows are not independent samples. Its unit is env steps (a
replica's step, all of the policy's agents in it). It ignores what Adam's
preconditioning, clipping and several epochs do to the step; it is a guide for sizing,
not a law. It grows as training proceeds: log it through a run (`trainer.noise_scale_every`).
"""
from __future__ import annotations

import torch

GROUPS = 8  # parts of the rollout, each a block of replicas
DECAY = 0.9  # the running averages' weight of the past (about the last 10 measurements)


class NoiseScale:
    """Running estimates of |G|^2 and tr(Sigma) for each policy of a PPO run."""

    def __init__(self, every: int, num_envs: int):
        self.every = every
        self.groups = min(GROUPS, num_envs)
        self.calls = 0
        self.sums = {}  # policy name -> |G|^2 and tr(Sigma): recent averages, run-long sums

    @classmethod
    def for_run(cls, ppo):
        """A measurer that measures where the config asks and the run allows: a solo,
        feed-forward run of at least two replicas (else every 0: never)."""
        every = ppo.cfg.noise_scale_every
        if not ppo.members.solo or ppo.bptt_len or ppo.env.num_envs < 2:
            every = 0
        return cls(every, ppo.env.num_envs)

    def measure(self, ppo) -> dict:
        """Where due, per policy, the noise scale in env steps after this rollout's
        measurement: `noise_scale` of the last measurements, `noise_scale_run` of every
        one so far (each left out while its |G|^2 is not yet positive); else {}."""
        self.calls += 1
        out = {}
        if not self.every or (self.calls - 1) % self.every:
            return out
        for p in ppo.policies:
            g_big, g_small, big, small = self.norms(ppo, p)
            g2_now = (big * g_big - small * g_small) / (big - small)
            trace_now = (g_small - g_big) / (1 / small - 1 / big)
            g2, trace, run_g2, run_trace = self.sums.get(p.name, (0.0, 0.0, 0.0, 0.0))
            self.sums[p.name] = (DECAY * g2 + g2_now, DECAY * trace + trace_now,
                                 run_g2 + g2_now, run_trace + trace_now)
            g2, trace, run_g2, run_trace = self.sums[p.name]
            out[p.name] = {}
            if g2 > 0 and trace > 0:
                out[p.name]["noise_scale"] = trace / g2
            if run_g2 > 0 and run_trace > 0:  # the whole run's so far: the recipe's value
                out[p.name]["noise_scale_run"] = run_trace / run_g2
        return out

    @staticmethod
    def added(stats: dict, noise: dict) -> dict:
        """The update's statistics with each measured policy's noise scale."""
        for name, values in noise.items():
            stats[name].update(values)
        return stats

    def norms(self, ppo, p) -> tuple:
        """(|G_big|^2, mean |G_small|^2, big, small): squared norms of the actor's gradient
        over the whole rollout and over each group of replicas, and their sizes in env
        steps."""
        buf = p.buffer
        steps, envs, agents = buf.rewards.shape
        with torch.no_grad():
            state = ppo.env.global_state() if ppo.central else None
            ppo.rollout_values(p, None)
            next_value = ppo.values(p, ppo.next_obs, state)
            advantages, _ = p.gae(buf.rewards, buf.values, buf.dones, next_value.float())
            weights = buf.active.float()
            count = weights.sum().clamp_min(1.0)
            mean = (advantages * weights).sum() / count
            std = (((advantages - mean) ** 2 * weights).sum() / count).sqrt()
            advantages = (advantages - mean) / (std + 1e-8) * weights
        actor = [q for name, q in p.model.named_parameters() if not name.startswith("critic")]
        per = envs // self.groups
        grads = []
        for g in range(self.groups):
            part = slice(g * per, (g + 1) * per)
            critic_obs = None if buf.states is None else \
                buf.states[:, part, None].expand(-1, -1, agents, -1)
            mask = None if buf.masks is None else buf.masks[:, part]
            with ppo.precision.autocast():
                log_prob, _, _ = p.model(buf.obs[:, part], buf.actions[:, part], mask, critic_obs)
            # the group's mean over its env steps (its agents summed, as one sample)
            loss = -(advantages[:, part] * log_prob.float()).sum() / (steps * per)
            grads.append(torch.autograd.grad(loss, actor))
        flat = torch.stack([torch.cat([x.reshape(-1) for x in grad]) for grad in grads])
        g_small = flat.pow(2).sum(1).mean()
        g_big = flat.mean(0).pow(2).sum()
        return float(g_big), float(g_small), steps * per * self.groups, steps * per
