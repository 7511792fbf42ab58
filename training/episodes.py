"""Episode returns, accumulated on the device during a rollout and read once per iteration."""
from __future__ import annotations

import torch


class EpisodeTracker:
    """Per step, which replicas finished and each policy's mean return in them.

    `record` adds a step's rewards (of agents still in play, with per-agent
    done) to the running returns and notes the replicas that just finished;
    `finished` reads the rollout's finished episodes to the host, once.
    """

    def __init__(self, env, rollout_len: int, agents: dict):
        """`agents`: policy name -> its agents (a slice or an index tensor)."""
        self.agents = agents
        self.running = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self.dones = torch.zeros((rollout_len, env.num_envs), dtype=torch.bool, device=env.device)
        self.returns = torch.zeros((rollout_len, len(agents), env.num_envs), device=env.device)

    def record(self, t: int, reward, done, active=None):
        """Step t's rewards; `done` the replicas that finished with it; `active` the agents
        that were in play (None: all)."""
        self.dones[t] = done
        self.running += reward if active is None else reward * active
        for k, agents in enumerate(self.agents.values()):
            self.returns[t, k] = self.running[:, agents].mean(1)
        self.running *= (~done).unsqueeze(1).to(reward.dtype)

    def finished(self) -> dict:
        """One host read: per policy, the returns of the episodes that ended in the rollout."""
        dones = self.dones.cpu()
        returns = self.returns.cpu()
        return {name: returns[:, k][dones].tolist() for k, name in enumerate(self.agents)}
