"""TD3: DDPG with twin critics, target-policy smoothing and a delayed actor.

The target takes the smaller of two target critics at the target actor's
action plus clipped Gaussian noise; the actor (and the target networks)
step once every `policy_delay` critic steps, on the first critic.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusim.config import require

from .ddpg import DDPG, DDPGConfig


@dataclass(frozen=True)
class TD3Config(DDPGConfig):
    policy_delay: int = 2          # critic steps per actor step
    target_noise: float = 0.2      # noise on the target action, in half-ranges ...
    noise_clip: float = 0.5        # ... clipped to +-this

    def check(self):
        super().check()
        require(self.policy_delay >= 1, "trainer.policy_delay", "must be at least 1")
        for key in ("target_noise", "noise_clip"):
            require(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")


class TD3(DDPG):
    Config = TD3Config
    num_critics = 2

    def next_action(self, g, next_obs):
        action, _ = g.target_actor(next_obs)
        noise = (g.randn_like(action) * self.cfg.target_noise).clamp(-self.cfg.noise_clip,
                                                                         self.cfg.noise_clip)
        return (action + noise).clamp(-1, 1), None

    def actor_due(self, g) -> bool:
        return g.updates % self.cfg.policy_delay == 0

    def step_draws(self, actor_due: bool) -> int:
        return 1  # the target smoothing
