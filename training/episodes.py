"""Episode returns, accumulated on the device during a rollout and read once per iteration."""
from __future__ import annotations

import torch


class EpisodeTracker:
    """Per step, which replicas finished and each policy's mean return in them.

    `record` adds a step's rewards (of agents still in play, with per-agent
    done) to the running returns and notes the replicas that just finished;
    `finished` reads the rollout's finished episodes to the host, once.
    """

    def __init__(self, env, rollout_len: int, agents: dict, members: int = 1):
        """`agents`: policy name -> its agents (a slice or an index tensor); `members`: a
        population's, whose replicas lie side by side (member k's the k-th share)."""
        self.agents = agents
        self.members = members
        self.counted = {}  # policy name -> the replicas whose episodes count as its returns
        self.running = torch.zeros((env.num_envs, env.num_agents), device=env.device)
        self.dones = torch.zeros((rollout_len, env.num_envs), dtype=torch.bool, device=env.device)
        self.returns = torch.zeros((rollout_len, len(agents), env.num_envs), device=env.device)

    def record(self, t: int, reward, done, active=None):
        """Step t's rewards; `done` the replicas that finished with it; `active` the agents
        that were in play (None: all)."""
        # out= and in-place forms throughout: this runs at every step, and at rollout sizes
        # an operator's dispatch costs more than its arithmetic
        self.dones[t].copy_(done)
        if active is None:
            self.running.add_(reward)
        else:
            self.running.add_(reward * active)
        for k, agents in enumerate(self.agents.values()):
            torch.mean(self.running[:, agents], 1, out=self.returns[t, k])
        self.running.masked_fill_(done[:, None], 0.0)

    def finished(self) -> dict:
        """One host read: per policy, the returns of the episodes that ended in the rollout
        (of a population: per policy and member, "policy/m3")."""
        dones = self.dones.cpu()
        returns = self.returns.cpu()
        if self.members == 1:
            counted = {name: mask.cpu() for name, mask in self.counted.items()}
            return {name: returns[:, k][dones & counted[name] if name in counted else dones]
                    .tolist() for k, name in enumerate(self.agents)}
        share = dones.shape[1] // self.members
        return {f"{name}/m{m}": returns[:, k, m * share:(m + 1) * share][
                    dones[:, m * share:(m + 1) * share]].tolist()
                for k, name in enumerate(self.agents) for m in range(self.members)}
