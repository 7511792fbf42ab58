"""The first NaN or Inf among named tensors, in one phrase that names where it is.

When training stops on a non-finite loss, the cause is often the env: a reward of
0/0 on a path the random rollouts of check_env never took. `first_nonfinite`
names the first non-finite element of a rollout's tensors,

    first_nonfinite({"reward": rewards, "obs": observations})
    -> "reward[step 3, replica 5, agent 2] = nan"

and `env_nonfinite_message` turns that into the line a learner prints instead of
advice about its learning rate. Each tensor costs one reduction (one host read on
a GPU) when it is finite, which is the common case.
"""
from __future__ import annotations

import torch

DIMS = ("step", "replica", "agent")


def first_nonfinite(arrays: dict, dims=DIMS) -> str | None:
    """`"name[step 3, replica 5, agent 2] = nan"` for the first NaN or Inf in `arrays`
    (name -> tensor, looked at in order; integer tensors are skipped), or None.

    `dims` names the leading axes of every tensor (axes past them are plain
    indices: `obs[step 3, replica 5, agent 2, 7] = inf`); a dict name -> axis names
    gives each tensor its own.
    """
    for name, tensor in arrays.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() \
                or tensor.numel() == 0:
            continue
        # a finite sum means every element is finite; an overflowing one is looked at whole
        if bool(torch.isfinite(tensor.sum(dtype=torch.float64))):
            continue
        bad = ~torch.isfinite(tensor)
        if not bool(bad.any()):
            continue
        index = bad.nonzero()[0].tolist()
        names = dims.get(name, ()) if isinstance(dims, dict) else dims
        parts = [f"{names[k]} {i}" if k < len(names) else str(i) for k, i in enumerate(index)]
        value = tensor[tuple(index)].item()
        return f"{name}[{', '.join(parts)}] = {value}"
    return None


def env_nonfinite_message(env_name: str, arrays: dict, dims=DIMS) -> str | None:
    """The line for a run stopped by a non-finite loss when the env's own outputs were
    not finite (`arrays`: the rollout's rewards, observations, ... by name), or None
    when they were all finite (then the learning itself diverged)."""
    found = first_nonfinite(arrays, dims)
    if found is None:
        return None
    return (f"env {env_name} returned {found}: the env's outputs, not the learning, are "
            "not finite; check_env(env) finds the phase (pass policy= or actions= to reach "
            "the path that produced it)")
