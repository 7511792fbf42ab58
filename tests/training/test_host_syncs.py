"""How often the learner reaches for host values: a fixed few times per iteration, whatever
the rollout's size (on a GPU each would wait for the device).

Every way a tensor's value reaches Python (`item`, `tolist`, `cpu`, `numpy`, `bool`,
`int`, `float`, `nonzero`) is counted during whole iterations; the count must not grow
with `num_envs` or `rollout_len`, nor with the number of gradient steps.
"""
import contextlib
import os
import traceback

import pytest
import torch

from gpusim.envs import env_class
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero")


@contextlib.contextmanager
def counting_host_reads():
    counts = {"reads": 0}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(original):
        def read(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0].filename
            if f"torch{os.sep}optim{os.sep}" not in caller:  # Adam's step counts live on
                counts["reads"] += 1                            # the host by design
            return original(self, *args, **kwargs)
        return read
    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def reads_per_iteration(name, num_envs, rollout_len, **overrides):
    cls = env_class(name)
    config = load_run_config(name, cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": num_envs,
        "trainer.rollout_len": rollout_len, "trainer.target_return": None,
        "trainer.total_steps": 10**6, "trainer.torch_threads": 1,
        # (a run this long would compile its learner: that is the compile tests' business,
        # tests/training/test_fused.py, and costs a minute of C++ compiles per case from a cold cache)
        "trainer.compile": "off", **overrides})
    trainer = Trainer(config, cls)
    trainer._train_one(False)  # warm-up: compiles, fills what fills once
    with counting_host_reads() as counts:
        trainer._train_one(False)
        trainer._train_one(False)
    return counts["reads"] / 2


CASES = {
    "ppo": ("cartpole", {}),
    "ppo, per-agent done, two policies": (
        "tag_continuous", {"env.num_taggers": 2, "env.num_runners": 3,
                           "trainer.update_epochs": 2, "trainer.num_minibatches": 2}),
    "ppo, recurrent": ("cartpole", {"policy.recurrent": "gru", "policy.bptt_len": 4}),
    "ppo, central critic": ("tag_gridworld", {"policy.critic": "central"}),
    "sac": ("pendulum", {"trainer.algorithm": "sac", "trainer.learning_starts": 0,
                         "trainer.batch_size": 32, "trainer.replay_ratio": 0.25,
                         "policy.hidden_sizes": [16, 16]}),
    "td3, prioritized": ("pendulum", {"trainer.algorithm": "td3", "trainer.learning_starts": 0,
                                      "trainer.batch_size": 32, "trainer.replay_ratio": 0.25,
                                      "trainer.prioritized_replay": True,
                                      "policy.hidden_sizes": [16, 16]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_host_reads_per_iteration_do_not_grow_with_the_rollout(case):
    name, overrides = CASES[case]
    small = reads_per_iteration(name, 4, 8, **overrides)
    large = reads_per_iteration(name, 16, 32, **overrides)  # 16x the steps and updates
    assert small == large, (small, large)
    # the deliberate ones: finished episodes and the finite check, each policy's statistics
    # and, with per-agent done, its rows in play (PPO trains on those only)
    assert small <= 4 + 3 * len(env_class(name)(num_envs=1, backend="cpu").policies), small
