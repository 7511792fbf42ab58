"""Training on device-resident rollouts (PPO, A2C), installed as `gpusim.training`."""
