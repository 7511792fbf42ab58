"""The learner a run's `trainer.algorithm` names: PPO/A2C (on-policy) or DDPG/TD3/SAC."""
from __future__ import annotations

from .config import OFF_POLICY, RunConfig
from .offpolicy import OffPolicyTrainer
from .trainer import Trainer


def make_trainer(config: RunConfig, env_class, context=None, logger=None) -> Trainer:
    """The trainer for `config` (see Trainer for the arguments)."""
    cls = OffPolicyTrainer if config.trainer.algorithm in OFF_POLICY else Trainer
    return cls(config, env_class, context, logger)
