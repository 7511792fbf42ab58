"""The off-policy learners' CUDA graphs: the rollout and the gradient step, where static.

Mixed into OffPolicy (offpolicy.py), whose plain steps these wrap. A static
gradient step draws its batch's rows into a fixed tensor first and samples
them against the replay's held count on the device (training.replay); a
static rollout writes the replay rings on the device, and their host
counters advance after it. On a CUDA device each is captured once and
replayed (training.graphs.StepGraph); on the CPU a test runs them eagerly
(tests/test_static_steps.py). Where the sample is not static (prioritized
replay, per-agent done, several processes, a population) both run eagerly.
"""
from __future__ import annotations

import functools

import torch

from gpusim.errors import GpusimError

from ..fused import EagerDescent
from ..graphs import StepGraph


class OffPolicyGraphs:
    """What OffPolicy replays as graphs (see the module)."""
    captures_graphs = True  # where the sample is static (`graphs_supported`)
    graphs_gradient_step = True  # a population steps its members its own way

    def graphs_supported(self, trainer) -> bool:
        """The gradient step is static (a CUDA graph replays it) where its sample is: a lone
        process's uniform replay, every row valid. Elsewhere it runs eagerly, and
        `cuda_graphs: on` is refused in one line."""
        why = self._why_not_static()
        if why and trainer.cuda_graphs == "on":
            raise GpusimError(f"config key 'trainer.cuda_graphs' on: {why}, so its gradient "
                              "step is not captured (use auto or off)")
        return why is None

    def _why_not_static(self) -> str | None:
        if not self.graphs_gradient_step:
            return "a population samples each member's own ring"
        if self.cfg.prioritized_replay:
            return "prioritized replay samples in proportion to priorities over the held rows"
        if self.env.agent_active_array is not None:
            return "with per-agent done, the replay draws only rows in play"
        if self.distributed:
            return "several processes sample across their shards"
        return None

    def collect(self, env_steps: int):
        """A rollout: eagerly, or (static steps) a CUDA graph replayed, one per way of acting
        (random before `learning_starts`, the actor's after); a rollout that crosses
        `learning_starts` runs eagerly. A replay writes the replay rings on the device; their
        host counters advance after it."""
        t_cfg = self.config.trainer
        self.env_steps = env_steps
        # (trainer.num_envs: a population's env holds every member's replicas)
        explore = tuple(env_steps + t * t_cfg.num_envs * self.world_size
                        < self.cfg.learning_starts for t in range(t_cfg.rollout_len))
        if not self.static_steps:
            self._collect(explore)
            return
        graph = self.rollout_graphs.get(explore)
        if graph is None and len(set(explore)) == 1:
            graph = self.rollout_graphs[explore] = StepGraph(
                functools.partial(self._collect, explore),
                "the rollout" + (" (random actions)" if explore[0] else ""), self.use_graphs,
                self.timer)
        if graph is None:
            self._collect(explore)
        elif graph.graph is None:
            graph()
        else:
            with self.timer("rollout"):  # (a replay runs no Python: no inner sections)
                graph()
        for g in self.groups:
            for _ in range(t_cfg.rollout_len):
                g.replay.advance(self.env.num_envs * g.spec.num_agents)

    def _static_gradient_step(self, g) -> torch.Tensor:
        """The gradient step as a StepGraph (one per actor-due value: TD3 alternates): its
        batch drawn into a fixed tensor first, its statistics out through `step_stats`."""
        g.updates += 1
        actor_due = self.actor_due(g)
        graph = g.graphs.get(actor_due)
        if graph is None:
            if g.step_stats is None:
                g.step_stats = torch.zeros(len(self.stats), device=self.env.device)
            graph = g.graphs[actor_due] = StepGraph(
                functools.partial(self._static_step, g, actor_due),
                f"policy {g.name!r}'s gradient step", self.use_graphs, self.timer)
        g.replay.draw_static(self.cfg.batch_size)
        graph()
        return g.step_stats

    def _static_step(self, g, actor_due: bool):
        """What a static gradient step replays: sample (the drawn rows), step, statistics."""
        batch = g.replay.sample_static()
        stats, _ = self._gradient_step(EagerDescent(g.optimized, self.cfg.max_grad_norm), g,
                                       batch.obs, batch.actions, batch.rewards, batch.next_obs,
                                       batch.terminated, batch.weights, actor_due)
        g.step_stats.copy_(stats)

    def warming_up(self) -> bool:
        """Whether a graph is still to be captured (the gradient steps' after learning
        starts)."""
        graphs = [*self.rollout_graphs.values(),
                  *(graph for g in self.groups for graph in g.graphs.values())]
        return any(graph.warming_up() for graph in graphs)
