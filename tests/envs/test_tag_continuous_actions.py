"""tag_continuous with `continuous_actions`: a Box of (acceleration change, turn) per agent.

The kernels against the NumPy reference by state injection (actions beyond
the bounds, so clipping is exercised), check_env with the reference, the
same trajectory as discrete mode when the floats equal table entries, the
cuda_c refusal, config checks, and a tiny training run.
"""
import math

import numpy as np
import pytest
import torch

from conftest import make_tag, random_actions, random_tag_state
from gpusim.check import check_env
from gpusim.config import from_dict
from gpusim.envs import env_class
from gpusim.envs.tag_continuous import reference as ref
from gpusim.envs.tag_continuous.config import TagContinuousConfig
from gpusim.envs.tag_continuous.env import move, move_continuous
from gpusim.errors import ArrayError, BackendError, ConfigError
from test_tag_vs_reference import run_against_reference

TWO_AGENTS = dict(num_taggers=1, num_runners=1, num_other_agents_observed=1,
                  tagging_distance=0.1, grid_length=4.0, episode_length=40)
SMALL = dict(num_taggers=2, num_runners=5, num_other_agents_observed=3, tagging_distance=0.1,
             grid_length=5.0, episode_length=60, edge_hit_penalty=-0.5,
             min_acceleration=-0.2, max_acceleration=0.3, min_turn=-1.0, max_turn=2.0)


def box_actions(env, rng):
    """Uniform over the bounds widened by half their span on each side, with some values
    exactly on a bound and some far outside (clipping must take them to the bound)."""
    c = env.config
    low = np.array([c.min_acceleration, c.min_turn], dtype=np.float32)
    high = np.array([c.max_acceleration, c.max_turn], dtype=np.float32)
    span = high - low
    shape = (env.num_envs, env.num_agents, 2)
    actions = rng.uniform(low - span / 2, high + span / 2, shape)
    pick = rng.random(shape)
    actions = np.where(pick < 0.05, low, np.where(pick > 0.95, high, actions))
    far = rng.choice([-1e6, 1e6], shape)
    actions = np.where(rng.random(shape) < 0.03, far, actions)
    return torch.from_numpy(actions.astype(np.float32)).to(env.device)


# ---- against the reference ------------------------------------------------------------------
@pytest.mark.parametrize("config", [TWO_AGENTS, SMALL], ids=["two_agents", "small_bounds"])
def test_cpu_matches_reference(config):
    counts = run_against_reference("cpu", num_envs=4, steps=150, draw_actions=box_actions,
                                   continuous_actions=True, **config)
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_cudasim_matches_reference():
    counts = run_against_reference("cudasim", num_envs=2, steps=60, refresh_every=20,
                                   draw_actions=box_actions, continuous_actions=True,
                                   **dict(TWO_AGENTS, episode_length=15, tagging_distance=0.25))
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_check_env_with_the_reference():
    env = make_tag(num_envs=3, seed=1, continuous_actions=True, num_taggers=2, num_runners=4,
                   num_other_agents_observed=3, tagging_distance=0.1, episode_length=30)
    result = check_env(env, reference=ref.check_env_reference(env.config), steps=120,
                       verbose=False)
    assert result.ok, str(result)
    assert "agrees with the reference for 120 steps" in result["reference"].message


def test_table_values_give_the_discrete_trajectory_bit_for_bit():
    """Continuous actions equal to the discrete tables' entries: the same run, exactly."""
    config = dict(SMALL, num_acceleration_levels=4, num_turn_levels=6)
    discrete = make_tag(num_envs=3, seed=4, **config)
    continuous = make_tag(num_envs=3, seed=4, continuous_actions=True, **config)
    acc_table, turn_table = (torch.from_numpy(t) for t in ref.action_tables(discrete.config))
    rng = np.random.default_rng(5)
    state = random_tag_state(discrete.config, 3, rng)
    for env in (discrete, continuous):
        env.reset()
        env.set_state(state)
    for t in range(40):
        actions = random_actions(discrete, rng)
        floats = torch.stack([acc_table[actions[..., 0].long()],
                              turn_table[actions[..., 1].long()]], dim=-1)
        got = continuous.step(floats)
        want = discrete.step(actions)
        for a, b in zip(got[:4], want[:4]):
            assert torch.equal(a, b), f"step {t}"
        assert torch.equal(got[4]["final_obs"], want[4]["final_obs"])
        for key, value in discrete.get_state(include_rng=True).items():
            assert torch.equal(continuous.get_state(include_rng=True)[key], value), key


# ---- the env's interface ------------------------------------------------------------------
def test_box_space_arrays_and_kernel():
    env = make_tag(num_envs=2, continuous_actions=True, **SMALL)
    for name in ("tagger", "runner"):
        space = env.action_space[name]
        np.testing.assert_array_equal(space.low, np.float32([-0.2, -1.0]))
        np.testing.assert_array_equal(space.high, np.float32([0.3, 2.0]))
    assert env.action_nvec == () and env.continuous_dim == 2
    fields = env.arrays.views._fields
    assert "continuous_actions" in fields
    assert not {"actions", "acc_table", "turn_table"} & set(fields)
    spec = env.step_kernel_spec()
    fns = [phase.fn for section in spec.sections for phase in section.phases]
    assert move_continuous in fns and move not in fns and spec.cuda_c is None
    discrete = make_tag(num_envs=2, **SMALL).step_kernel_spec()
    fns = [phase.fn for section in discrete.sections for phase in section.phases]
    assert move in fns and move_continuous not in fns
    assert discrete.cuda_c == "tag_continuous.cu:tag_continuous_step"
    env.reset()
    with pytest.raises(ArrayError, match="must have a float dtype"):
        env.step(torch.zeros((2, env.num_agents, 2), dtype=torch.int32))


def test_cuda_c_backend_refuses_continuous_actions():
    """The continuous step has no CUDA C kernel: the cuda_c backend's lookup says why (the
    env itself never asks which backend runs it)."""
    from gpusim.backends.cuda_c_sources import split_cuda_c
    env = make_tag(num_envs=1, backend="cpu", continuous_actions=True, **TWO_AGENTS)
    with pytest.raises(BackendError) as err:
        split_cuda_c(env.step_kernel_spec())
    message = str(err.value)
    assert "'continuous_actions' is true" in message and "use backend numba or cpu" in message
    assert "\n" not in message
    discrete = make_tag(num_envs=1, backend="cpu", **TWO_AGENTS)
    assert split_cuda_c(discrete.step_kernel_spec())[0] == "tag_continuous.cu"


@pytest.mark.gpu
def test_real_cuda_c_backend_refuses_continuous_actions():
    pytest.importorskip("gpusim.backends.cuda_c_backend")
    with pytest.raises(BackendError, match="'continuous_actions' is true"):
        make_tag(num_envs=1, backend="cuda_c", continuous_actions=True, **TWO_AGENTS)


# ---- config -------------------------------------------------------------------------------
@pytest.mark.parametrize("data, message", [
    ({"continuous_actions": 1}, "'env.continuous_actions' must be true or false"),
    ({"continuous_actions": True, "min_turn": 1.0, "max_turn": 1.0},
     "'min_turn' must be below max_turn with continuous_actions"),
    ({"continuous_actions": True, "min_acceleration": 0.1},
     "'min_acceleration' must be below max_acceleration with continuous_actions"),
])
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(TagContinuousConfig, data, section="env")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_equal_bounds_stay_allowed_in_discrete_mode():
    assert from_dict(TagContinuousConfig, {"min_turn": 1.0, "max_turn": 1.0}, section="env")


def test_reference_clips_and_rejects_non_finite():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, continuous_actions=True)
    acc, turn = ref.action_changes(cfg, np.array([[[5.0, -9.0], [-0.05, 1.5]]]))
    np.testing.assert_array_equal(acc, np.float32([[0.1, -0.05]]))
    np.testing.assert_array_equal(turn, np.float32([[-2.356, 1.5]]))
    assert acc.dtype == np.float32 and turn.dtype == np.float32
    with pytest.raises(ValueError, match="finite"):
        ref.action_changes(cfg, np.array([[[math.nan, 0.0], [0.0, 0.0]]]))


# ---- training -----------------------------------------------------------------------------
def test_trainer_runs_in_continuous_mode():
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 2, "trainer.rollout_len": 8,
        "trainer.total_steps": 32, "env.num_taggers": 2, "env.num_runners": 4,
        "env.num_other_agents_observed": 3, "env.episode_length": 10,
        "env.continuous_actions": True})
    trainer = Trainer(config, cls)
    assert [g.name for g in trainer.algorithm.policies] == ["tagger", "runner"]
    assert all(g.spec.continuous for g in trainer.algorithm.policies)
    trainer.algorithm.collect(0)
    before = [[q.clone() for q in p.model.parameters()] for p in trainer.algorithm.policies]
    stats = trainer.algorithm.update(1e-3)
    metrics = trainer.metrics(stats, 1.0, 1e-3)
    for name in ("tagger", "runner"):
        assert math.isfinite(metrics[f"value_loss/{name}"]) and metrics[f"value_loss/{name}"] > 0
    for saved, p in zip(before, trainer.algorithm.policies):  # each Gaussian policy stepped
        assert all(not torch.equal(a, b) for a, b in zip(saved, p.model.parameters()))
