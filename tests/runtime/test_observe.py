"""`env.observe()`: every built-in env recomputes its observation (and its action mask)
from the state arrays, so a state injected with `set_state` is seen as it is."""
import pytest
import torch

import gpusim
from gpusim.envs import builtin_names
from gpusim.errors import GpusimError

# small worlds where the defaults are large
SMALL = {"tag_continuous": dict(num_taggers=2, num_runners=3, grid_length=4.0,
                                num_other_agents_observed=2),
         "tag_gridworld": dict(mask_walls=True)}


def random_actions(env, generator) -> dict:
    actions = {}
    for name, spec in env.policy_specs.items():
        shape = (env.num_envs, spec.num_agents)
        if spec.continuous:
            low, high = (torch.tensor(b) for b in (spec.actions.low, spec.actions.high))
            actions[name] = low + (high - low) * torch.rand(shape + (spec.action_width,),
                                                            generator=generator)
        else:
            actions[name] = torch.stack([torch.randint(n, shape, generator=generator)
                                         for n in spec.actions], -1)
    return actions


def make(name, seed):
    return gpusim.make(name, num_envs=3, backend="cpu", seed=seed, **SMALL.get(name, {}))


@pytest.mark.parametrize("name", builtin_names())
def test_observe_after_set_state_sees_the_injected_state(name):
    source, target = make(name, 1), make(name, 2)
    source.reset()
    target.reset()
    generator = torch.Generator().manual_seed(0)
    # tag_continuous observes before it tags (README rule), so its stepped observation is
    # not that of the state after the step: compare it right after reset
    for _ in range(0 if name == "tag_continuous" else 4):
        source.step(random_actions(source, generator))
    target.set_state(source.get_state(include_rng=True))
    if "comm" in source.arrays.tensors:  # MPE: the last utterances, not counted as state
        target.arrays["comm"].copy_(source.arrays["comm"])
    obs = target.observe()
    assert obs is target.arrays["obs"]
    torch.testing.assert_close(obs, source.arrays["obs"], rtol=0, atol=0)
    if source.action_mask() is not None:
        assert torch.equal(target.action_mask(), source.action_mask())


def test_an_env_without_observe_phases_says_so():
    from bad_envs import Good  # a user's env that declares none
    env = Good(num_envs=2, backend="cpu")
    with pytest.raises(GpusimError, match="env good declares no observe_phases"):
        env.observe()
