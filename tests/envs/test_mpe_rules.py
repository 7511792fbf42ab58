"""MPE rules the random-state tests rarely reach, checked against mpe2: early termination
on success, hundreds of agents per replica; `check_env` with mpe2 as the reference (and
cpu against cudasim); bad configs and states; a frame of every scenario."""
import numpy as np
import pytest

import gpusim
from conftest import draw_one_frame
from gpusim.check import check_env
from gpusim.errors import ArrayError, ConfigError
from mpe_cases import SCENARIOS, Envs, as_numpy, random_actions, random_state, reference, step_both

pytest.importorskip("mpe2")


@pytest.fixture(scope="module")
def envs():
    return Envs()


def test_spread_terminates_once_every_landmark_is_covered(envs):
    """Replica 0: covered; 1: covered on its last step (truncated, not terminated, as mpe2
    reports it); 2: one agent moved off its landmark, which no other covers (runs on)."""
    env = envs.get("simple_spread", num_envs=3, terminate_on_success=True)
    state = as_numpy(env.get_state())
    state["landmark_pos"][:] = np.array([[-0.6, 0.0], [0.0, 0.5], [0.6, 0.0]], np.float32)
    state["pos"][:] = state["landmark_pos"] + np.float32(0.04)
    state["pos"][2, 1] += np.float32(0.3)
    state["vel"][:] = 0
    state["timestep"][:] = [3, env.config.max_cycles - 1, 3]
    env.set_state(state)
    actions = {"agent": np.zeros((3, 3, 1), np.int32)}
    step_both(env, reference("simple_spread", env.config), state, actions)
    assert env.arrays["reset_mask"].tolist() == [True, True, False]
    assert env.arrays["terminated"].tolist() == [True, False, False]


def test_tag_terminates_once_every_good_agent_is_caught(envs):
    env = envs.get("simple_tag", num_envs=2, num_good=2, num_adversaries=3,
                   terminate_on_success=True)
    state = as_numpy(env.get_state())
    state["vel"][:] = 0
    state["pos"][:] = np.array([[-0.5, 0], [0.5, 0], [0, 0.7], [-0.45, 0], [0.55, 0]])
    state["pos"][1, 4] = [0.9, 0.9]  # the second good agent runs free in replica 1
    state["landmark_pos"][:] = np.array([[0, -0.8], [0.8, -0.8]])
    state["timestep"][:] = 0
    env.set_state(state)
    actions = {"adversary": np.zeros((2, 3, 1), np.int32), "agent": np.zeros((2, 2, 1), np.int32)}
    step_both(env, reference("simple_tag", env.config), state, actions)
    assert env.arrays["terminated"].tolist() == [True, False]


@pytest.mark.parametrize("name, config", [
    ("simple_spread", dict(N=128)),
    pytest.param("simple_spread", dict(N=150, num_agent_neighbors=6, num_landmark_neighbors=6),
                 marks=pytest.mark.slow),
    ("simple_tag", dict(num_adversaries=5, num_good=100)),
])
def test_hundreds_of_agents_per_replica_step_as_in_mpe2(envs, name, config):
    env = envs.get(name, num_envs=2, **config)
    oracle = reference(name, env.config)
    rng = np.random.default_rng(4)
    env.reset(seed=3)
    state = as_numpy(env.get_state())
    for _ in range(2):
        state, _, _ = step_both(env, oracle, state, random_actions(env, rng))
    state = random_state(env, rng)
    env.set_state(state)
    step_both(env, oracle, state, random_actions(env, rng))


@pytest.mark.parametrize("name", ["simple_speaker_listener", "simple_world_comm"])
def test_check_env_passes_with_mpe2_as_reference(envs, name):
    env = envs.get(name, num_envs=8)
    result = check_env(env, reference=reference(name, env.config), steps=60,
                       reference_steps=60, atol=1e-4, rtol=0, compare_backend="cudasim",
                       compare_steps=3, verbose=False)
    assert result.ok, str(result)
    assert not result["reference"].skipped and not result["backends"].skipped


@pytest.mark.parametrize("name, config, message", [
    ("simple_spread", dict(N=0), "'N' must be at least 1"),
    ("simple_spread", dict(local_ratio=1.5), "'local_ratio' must lie in"),
    ("simple_spread", dict(num_agent_neighbors=0), "'num_agent_neighbors' must be a positive"),
    ("simple_tag", dict(num_good=0), "'num_good' must be at least 1"),
    ("simple_tag", dict(num_obstacles=-1), "'num_obstacles' must be at least 0"),
    ("simple_world_comm", dict(num_food=0), "'num_food' must be at least 1"),
    ("simple_reference", dict(local_ratio=-0.1), "'local_ratio' must lie in"),
    ("simple", dict(max_cycles=0), "'max_cycles' must be at least 1"),
    ("simple", dict(continuous_actions=1), "'env.continuous_actions' must be true or false"),
    ("simple_push", dict(N=2), "unknown config key 'env.N'"),
])
def test_bad_config_names_the_key(name, config, message):
    with pytest.raises(ConfigError, match=message):
        gpusim.make(name, num_envs=1, backend="cpu", **config)


def test_an_out_of_range_goal_is_refused(envs):
    env = envs.get("simple_reference", num_envs=2)
    state = as_numpy(env.get_state())
    state["goal"][1, 0] = 3
    with pytest.raises(ArrayError, match="goal must lie in 0..2"):
        env.set_state(state)


@pytest.mark.parametrize("name", SCENARIOS)
def test_draw_a_frame(name):
    ax = draw_one_frame(name)
    assert len(ax.patches) >= 2  # agents and landmarks as discs
