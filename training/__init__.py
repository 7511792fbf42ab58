"""Training on device-resident rollouts, installed as `gpusim.training`: the algorithms
(PPO, A2C; DDPG, TD3, SAC) with their models, losses and replay, the run loop and its
config, checkpoints and logs, auto-scale trials, evaluation, rendering, trained policies
loaded and exported, and the bodies of `python -m gpusim.train`, `.evaluate`, `.render`,
`.export` and `.plot`."""
