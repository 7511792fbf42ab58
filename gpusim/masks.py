"""Action masks that leave an agent no legal choice, found where a host read is cheap.

An env's mask (`action_mask_array`) marks, side by side, the legal choices of
each of an agent's discrete action components. A component whose every choice
is masked has nothing to draw: its log-probabilities are all -inf, and
training diverges without naming the mask. `Env.reset` checks the mask it
starts from (one host read, only for an env with a mask; `step` never reads
it), and check_env checks it after every step of its rollout.
"""
from __future__ import annotations

import torch

from gpusim.errors import GpusimError

ADVICE = "keep at least one choice legal per action component"


def dead_choice(env) -> tuple | None:
    """(replica, agent, component) of the first action component with every choice
    masked, or None (also for an env without a mask). One host read."""
    mask = env.action_mask()
    if mask is None:
        return None
    dead = torch.zeros((*mask.shape[:2], env.discrete_width), dtype=torch.bool,
                       device=mask.device)
    for spec in env.policy_specs.values():
        if spec.continuous:
            continue
        agents = list(spec.agent_ids)
        start = 0
        for component, choices in enumerate(spec.actions):
            dead[:, agents, component] = ~mask[:, agents, start:start + choices].any(-1)
            start += choices
    found = dead.nonzero()[:1].tolist()
    return tuple(found[0]) if found else None


def problem(env) -> str | None:
    """What is wrong with the env's mask now, as a phrase, or None."""
    found = dead_choice(env)
    if found is None:
        return None
    replica, agent, component = found
    return (f"the action mask ('{env.action_mask_array}') leaves agent "
            f"{env.agent_names[agent]} (id {agent}) of replica {replica} no legal choice for "
            f"action component {component}")


def check(env, when: str):
    """Raise one line naming the env, the agent and `when` (the step) if the mask leaves
    an agent no legal choice."""
    found = problem(env)
    if found is not None:
        raise GpusimError(f"env {env.name}: {found} {when}; {ADVICE}")
