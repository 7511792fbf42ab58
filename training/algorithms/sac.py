"""SAC: a squashed-Gaussian actor, twin critics and an entropy bonus.

The target is the smaller target critic at the actor's own sampled next
action, minus alpha times its log-probability; the actor minimises
alpha * log pi(a|s) - min Q(s, a) for a freshly sampled a; alpha is fixed
(`sac_alpha`) or tuned towards an entropy of -(action dims).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpusim.config import require

from .offpolicy import OffPolicy, OffPolicyConfig
from .offpolicy_networks import OffPolicyModel


@dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    sac_alpha: float | None = None  # the entropy weight (0: none); null tunes it towards an
                                    # entropy of -(action dims)
    sweepable: ClassVar[tuple] = OffPolicyConfig.sweepable + ("sac_alpha",)

    def check(self):
        super().check()
        require(self.sac_alpha is None or self.sac_alpha >= 0, "trainer.sac_alpha",
                "must be >= 0, or null (tuned)")


class SAC(OffPolicy):
    Config = SACConfig
    num_critics = 2
    stochastic = True

    @classmethod
    def model_for(cls, config, spec, exploring: bool = True) -> OffPolicyModel:
        alpha = config.algo.sac_alpha
        return OffPolicyModel(spec, config.policy, cls.num_critics, stochastic=True,
                              alpha=alpha, tune_alpha=alpha is None)

    def next_action(self, g, next_obs):
        return g.actor(next_obs)

    def step_draws(self, actor_due: bool) -> int:
        return 1 + actor_due  # the next action's sample, then the actor's

    def actor_loss(self, g, obs, alpha):
        action, log_prob = g.actor(obs)
        q = g.q(g.model.critics, obs, action).min(0).values
        return (alpha * log_prob - q).sum() / self.cfg.batch_size, log_prob

    def alpha_loss(self, g, log_alpha, log_prob):
        """Tuned alpha: towards an entropy of -(action dims)."""
        target_entropy = -g.spec.action_width
        return -(log_alpha * (log_prob + target_entropy)).sum() / self.cfg.batch_size
