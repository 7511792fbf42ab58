"""DDPG: a deterministic actor and one critic, on the off-policy core (offpolicy.py).

The critic learns Q(s, a) towards r + gamma * (1 - terminated) * Q'(s', mu'(s'))
with target networks Q' and mu'; the actor ascends Q(s, mu(s)); rollouts add
Gaussian noise to the actor's action.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import require

from .offpolicy import OffPolicy, OffPolicyConfig
from .offpolicy_networks import OffPolicyModel


@dataclass(frozen=True)
class DDPGConfig(OffPolicyConfig):
    exploration_noise: float = 0.1  # Gaussian noise on rollout actions, in half-ranges

    def check(self):
        super().check()
        require(self.exploration_noise >= 0, "trainer.exploration_noise", "must be >= 0")


class DDPG(OffPolicy):
    Config = DDPGConfig
    num_critics = 1

    @classmethod
    def model_for(cls, config, spec, exploring: bool = True) -> OffPolicyModel:
        return OffPolicyModel(spec, config.policy, cls.num_critics, stochastic=False,
                              exploration_noise=config.algo.exploration_noise if exploring
                              else 0.0)

    def next_action(self, g, next_obs):
        action, _ = g.target_actor(next_obs)
        return action, None

    def actor_loss(self, g, obs, alpha):
        action, _ = g.actor(obs)
        q = g.q(g.model.critics, obs, action)[0]
        return -q.sum() / self.cfg.batch_size, None
