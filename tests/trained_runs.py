"""Tiny trained runs of every algorithm and policy kind, for the tests of loading, evaluating
and exporting trained policies (tests/training/test_policies.py, tests/training/test_export.py).

`TrainedRuns(root).get(kind)` trains a run of `kind` once (a few hundred env steps, in
this process) and returns its run directory.
"""
from pathlib import Path

import numba
import torch

from gpusim import train

TINY = ["--backend", "cpu", "--num_envs", "4", "--rollout_len", "8", "--quiet",
        "--set", "policy.hidden_sizes=[16,16]"]
OFF_POLICY = ["--env", "pendulum", "--total_steps", "64", "--set", "trainer.learning_starts=32",
              "--set", "trainer.batch_size=16", "--set", "trainer.replay_size=64"]
RECURRENT = ["--set", "policy.bptt_len=8", "--set", "policy.recurrent_size=8"]

# kind -> the training command's arguments
KINDS = {
    "ppo": ["--env", "cartpole", "--total_steps", "64"],
    "a2c": ["--env", "cartpole", "--total_steps", "64", "--set", "trainer.algorithm=a2c"],
    "gru": ["--env", "cartpole", "--total_steps", "64", "--set", "policy.recurrent=gru",
            *RECURRENT],
    "lstm": ["--env", "cartpole", "--total_steps", "64", "--set", "policy.recurrent=lstm",
             *RECURRENT],
    "masked": ["--env", "tag_gridworld", "--total_steps", "64", "--set", "env.mask_walls=true",
               "--set", "env.episode_length=20"],
    "central": ["--env", "simple_spread", "--total_steps", "64", "--set", "policy.critic=central",
                "--set", "env.continuous_actions=true"],
    "gaussian": ["--env", "pendulum", "--total_steps", "64",
                 "--set", "policy.state_dependent_std=true"],
    "gru_gaussian": ["--env", "pendulum", "--total_steps", "64", "--set", "policy.recurrent=gru",
                     "--set", "trainer.num_minibatches=2",
                     *RECURRENT],
    "mixed": ["--env", "mixed_team_env:MixedTeam", "--total_steps", "64"],
    "ddpg": [*OFF_POLICY, "--algorithm", "ddpg"],
    "td3": [*OFF_POLICY, "--algorithm", "td3"],
    "sac": [*OFF_POLICY, "--algorithm", "sac"],
}


class TrainedRuns:
    def __init__(self, root: Path):
        self.root = root
        self.runs = {}

    def get(self, kind: str) -> Path:
        if kind not in self.runs:
            results = self.root / kind
            threads = torch.get_num_threads(), numba.get_num_threads()
            try:
                assert train.main(TINY + KINDS[kind] + ["--results_dir", str(results)]) == 0
            finally:  # the trainer binds this process's thread counts
                torch.set_num_threads(threads[0])
                numba.set_num_threads(threads[1])
            (self.runs[kind],) = results.iterdir()
        return self.runs[kind]
