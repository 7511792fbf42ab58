"""Hand-computed sanity checks of the NumPy reference (oracle) of tag_continuous."""
import math

import numpy as np
import pytest

from gpusim.envs.tag_continuous import reference
from gpusim.envs.tag_continuous.config import TagContinuousConfig


def make_state(agent_type, x, y, speed=None, direction=None, acceleration=None,
               still_in_game=None, timestep=0):
    """Single-replica state (E = 1) from per-agent lists."""
    n = len(agent_type)
    zeros = [0.0] * n
    agent_type = np.array([agent_type], dtype=np.int32)
    still = np.array([still_in_game if still_in_game is not None else [1] * n],
                     dtype=np.int32)
    runners_left = int(((agent_type == 0) & (still == 1)).sum())
    return {
        "loc_x": np.array([x], dtype=np.float32),
        "loc_y": np.array([y], dtype=np.float32),
        "speed": np.array([speed or zeros], dtype=np.float32),
        "direction": np.array([direction or zeros], dtype=np.float32),
        "acceleration": np.array([acceleration or zeros], dtype=np.float32),
        "still_in_game": still,
        "agent_type": agent_type,
        "num_runners_left": np.array([runners_left], dtype=np.int32),
        "timestep": np.array([timestep], dtype=np.int32),
    }


def noop(n, e=1):
    return np.zeros((e, n, 2), dtype=np.int64)


def test_action_tables_and_obs_dim():
    cfg = TagContinuousConfig()
    acc, turn = reference.action_tables(cfg)
    assert acc.dtype == np.float32 and turn.dtype == np.float32
    assert acc.shape == (21,) and turn.shape == (21,)
    assert acc[0] == 0.0 and turn[0] == 0.0
    assert acc[1] == np.float32(-0.1) and acc[20] == np.float32(0.1)
    assert turn[1] == np.float32(-2.356) and turn[20] == np.float32(2.356)
    assert reference.obs_dim(cfg) == 71
    assert reference.obs_dim(TagContinuousConfig(use_full_observation=True)) == 7 * 109 + 1


def test_tag_one_tagger_one_runner():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0,
                              num_other_agents_observed=1)
    # threshold 0.02 * 10 = 0.2, distance 0.1 -> tagged
    state = make_state([1, 0], x=[5.0, 5.1], y=[5.0, 5.0])
    before = {k: v.copy() for k, v in state.items()}
    nxt, obs, rew, term, trunc = reference.step(cfg, state, noop(2))
    for k in state:  # input untouched
        np.testing.assert_array_equal(state[k], before[k])
    np.testing.assert_array_equal(rew, [[10.0, -10.0]])
    assert rew.dtype == np.float32
    assert nxt["still_in_game"].tolist() == [[1, 0]]
    assert nxt["num_runners_left"].tolist() == [0]
    assert nxt["timestep"].tolist() == [1]
    assert term.tolist() == [True] and trunc.tolist() == [False]
    # observation is taken before tagging: the runner still sees the tagger
    norm = np.float32(math.sqrt(2.0)) * np.float32(10.0)
    dx = np.float32(5.1) - np.float32(5.0)
    expected_tagger = [dx / norm, 0, 0, 0, 0, 0, 1, np.float32(1) / np.float32(500)]
    expected_runner = [-dx / norm, 0, 0, 0, 0, 1, 1, np.float32(1) / np.float32(500)]
    assert obs.shape == (1, 2, 8) and obs.dtype == np.float32
    np.testing.assert_allclose(obs[0, 0], expected_tagger, rtol=1e-6)
    np.testing.assert_allclose(obs[0, 1], expected_runner, rtol=1e-6)


def test_tag_ties_and_multiple_tags():
    cfg = TagContinuousConfig(num_taggers=2, num_runners=2, grid_length=16.0,
                              runner_exits_game_after_tagged=False)
    # threshold 0.02 * 16 = 0.32; all coordinates exact in float32.
    # runner 2 is equidistant (0.125) from taggers 0 and 1 -> lower id (0) gets it;
    # runner 3 is nearest to tagger 0 as well -> tagger 0 scores twice
    state = make_state([1, 1, 0, 0], x=[8.0, 8.25, 8.125, 7.875], y=[5.0, 5.0, 5.0, 5.0])
    nxt, _, rew, term, trunc = reference.step(cfg, state, noop(4))
    np.testing.assert_array_equal(rew, [[20.0, 0.0, -10.0, -10.0]])
    assert nxt["still_in_game"].tolist() == [[1, 1, 1, 1]]
    assert nxt["num_runners_left"].tolist() == [2]
    assert term.tolist() == [False] and trunc.tolist() == [False]


def test_edge_hit_penalty_and_clipping():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0,
                              edge_hit_penalty=-1.0, num_other_agents_observed=1,
                              step_reward_for_runner=0.5, step_penalty_for_tagger=-0.25)
    state = make_state([1, 0], x=[1.0, 9.95], y=[1.0, 5.0], speed=[0.0, 0.1])
    nxt, _, rew, term, trunc = reference.step(cfg, state, noop(2))
    assert nxt["loc_x"][0, 1] == np.float32(10.0)
    assert nxt["loc_y"][0, 1] == np.float32(5.0)
    assert nxt["speed"][0, 1] == np.float32(0.1)
    np.testing.assert_array_equal(rew, [[-0.25, -0.5]])  # -1 + 0.5 for the runner
    assert term.tolist() == [False] and trunc.tolist() == [False]
    # an out-of-game agent neither moves nor is rewarded
    state = make_state([1, 0, 0], x=[1.0, 9.95, 9.95], y=[1.0, 5.0, 5.0],
                       speed=[0.0, 0.1, 0.0], still_in_game=[1, 1, 0])
    nxt, _, rew, _, _ = reference.step(cfg, state, np.full((1, 3, 2), 20))
    assert rew[0, 2] == 0.0
    assert nxt["loc_x"][0, 2] == np.float32(9.95)
    assert nxt["speed"][0, 2] == 0.0 and nxt["direction"][0, 2] == 0.0
    assert nxt["acceleration"][0, 2] == 0.0


def test_acceleration_action_changes_acceleration():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0)
    state = make_state([1, 0], x=[1.0, 8.0], y=[1.0, 8.0])
    actions = noop(2)
    actions[0, 1, 0] = 20  # +0.1 acceleration for the runner
    nxt, *_ = reference.step(cfg, state, actions)
    assert nxt["acceleration"][0, 1] == np.float32(0.1)
    assert nxt["speed"][0, 1] == np.float32(0.1)
    np.testing.assert_allclose(nxt["loc_x"][0, 1], 8.1, rtol=1e-6)
    nxt2, *_ = reference.step(cfg, nxt, noop(2))  # acceleration persists
    assert nxt2["acceleration"][0, 1] == np.float32(0.1)
    assert nxt2["speed"][0, 1] == np.float32(0.1) + np.float32(0.1)
    # -0.1 cancels the acceleration: speed stays 0.1
    actions[0, 1, 0] = 1  # -0.1
    nxt3, *_ = reference.step(cfg, nxt, actions)
    assert nxt3["acceleration"][0, 1] == 0.0
    assert nxt3["speed"][0, 1] == np.float32(0.1)
    # -0.1 again: speed clips to 0, which resets acceleration to 0
    nxt5, *_ = reference.step(cfg, nxt3, actions)
    assert nxt5["speed"][0, 1] == 0.0 and nxt5["acceleration"][0, 1] == 0.0
    # accelerating past vmax clips the speed and resets acceleration
    fast = make_state([1, 0], x=[1.0, 5.0], y=[1.0, 5.0], speed=[0.0, 0.95],
                      acceleration=[0.0, 0.1])
    nxt6, *_ = reference.step(cfg, fast, noop(2))
    assert nxt6["speed"][0, 1] == 1.0 and nxt6["acceleration"][0, 1] == 0.0
    # turning wraps modulo 2*pi
    state = make_state([1, 0], x=[1.0, 8.0], y=[1.0, 8.0], direction=[0.0, 5.0])
    actions = noop(2)
    actions[0, 1, 1] = 20  # +2.356
    nxt4, *_ = reference.step(cfg, state, actions)
    expected = np.mod(np.float32(5.0) + np.float32(2.356), reference.TWO_PI)
    assert nxt4["direction"][0, 1] == expected


def test_continuous_actions_are_the_changes_clipped_to_the_bounds():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0,
                              continuous_actions=True)
    state = make_state([1, 0], x=[1.0, 8.0], y=[1.0, 8.0], direction=[0.0, 5.0])
    actions = np.array([[[0.0625, 0.5], [0.05, 2.0]]], dtype=np.float32)
    nxt, *_ = reference.step(cfg, state, actions)
    assert nxt["acceleration"][0].tolist() == [0.0625, np.float32(0.05)]
    assert nxt["speed"][0].tolist() == [0.0625, np.float32(0.05)]
    assert nxt["direction"][0, 0] == np.float32(0.5)
    assert nxt["direction"][0, 1] == np.mod(np.float32(5.0) + np.float32(2.0), reference.TWO_PI)
    # beyond the bounds: clipped to +-0.1 and +-2.356 (float32)
    far = np.array([[[-7.0, 100.0], [1e9, -3.0]]])
    nxt, *_ = reference.step(cfg, state, far)
    assert nxt["acceleration"][0, 1] == np.float32(0.1) and nxt["speed"][0, 1] == np.float32(0.1)
    assert nxt["speed"][0, 0] == 0.0 and nxt["acceleration"][0, 0] == 0.0  # -0.1: clipped at 0
    assert nxt["direction"][0, 0] == np.float32(2.356)
    assert nxt["direction"][0, 1] == np.mod(np.float32(5.0) - np.float32(2.356), reference.TWO_PI)
    # the same values as discrete table entries give the same step
    discrete = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0)
    want, *_ = reference.step(discrete, state, np.array([[[1, 20], [20, 1]]]))
    for k in reference.STATE_KEYS:
        np.testing.assert_array_equal(nxt[k], want[k])


def test_obs_layout_three_agents():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=2, grid_length=10.0,
                              num_other_agents_observed=2, episode_length=10)
    state = make_state([1, 0, 0], x=[5.0, 8.0, 5.0], y=[5.0, 5.0, 6.0],
                       speed=[0.5, 0.25, 1.0], direction=[0.0, math.pi, 1.0],
                       acceleration=[0.0, 0.1, 0.0], timestep=3)
    obs = reference.observe(cfg, state)
    assert obs.shape == (1, 3, 15) and obs.dtype == np.float32
    n = np.float32(math.sqrt(2.0)) * np.float32(10.0)
    tp = np.float32(2.0 * math.pi)
    pi32 = np.float32(math.pi)
    # agent 0: nearest is agent 2 (dist 1), then agent 1 (dist 3)
    expected0 = [
        0.0, 3.0 / n,                  # dx
        1.0 / n, 0.0,                  # dy
        0.5, -0.25,                    # dspeed / (1 + 1e-10)
        0.0, np.float32(0.1),          # dacc
        1.0 / tp, pi32 / tp,           # ddirection / 2pi
        0.0, 0.0,                      # neighbour is tagger
        1.0, 1.0,                      # neighbour in game
        0.3,                           # timestep / episode_length
    ]
    np.testing.assert_allclose(obs[0, 0], expected0, rtol=1e-6, atol=1e-7)
    # agent 1: agent 0 at dist 3, agent 2 at dist sqrt(10)
    expected1 = [
        -3.0 / n, -3.0 / n,
        0.0, 1.0 / n,
        0.25, 0.75,
        -np.float32(0.1), -np.float32(0.1),
        -pi32 / tp, (1.0 - pi32) / tp,
        1.0, 0.0,
        1.0, 1.0,
        0.3,
    ]
    np.testing.assert_allclose(obs[0, 1], expected1, rtol=1e-6, atol=1e-7)

    # agent 2 out of the game: its row is all zeros, and others don't see it
    state["still_in_game"][0, 2] = 0
    obs = reference.observe(cfg, state)
    assert not obs[0, 2].any()
    expected0_partial = [3.0 / n, 0, 0, 0, -0.25, 0, np.float32(0.1), 0,
                         pi32 / tp, 0, 0, 0, 1, 0, 0.3]
    np.testing.assert_allclose(obs[0, 0], expected0_partial, rtol=1e-6, atol=1e-7)

    # full observation: id order, out-of-game agents included with flag 0
    full = TagContinuousConfig(num_taggers=1, num_runners=2, grid_length=10.0,
                               use_full_observation=True, episode_length=10)
    obs = reference.observe(full, state)
    assert obs.shape == (1, 3, 15)
    expected0_full = [3.0 / n, 0.0, 0.0, 1.0 / n, -0.25, 0.5, np.float32(0.1), 0.0,
                      pi32 / tp, 1.0 / tp, 0, 0, 1, 0, 0.3]
    np.testing.assert_allclose(obs[0, 0], expected0_full, rtol=1e-6, atol=1e-7)
    assert not obs[0, 2].any()


def test_partial_obs_distance_ties_go_to_lower_id():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=3, grid_length=10.0,
                              num_other_agents_observed=2)
    # agents 1, 2, 3 all at distance 1 from agent 0
    state = make_state([1, 0, 0, 0], x=[5.0, 6.0, 4.0, 5.0], y=[5.0, 5.0, 5.0, 6.0])
    obs = reference.observe(cfg, state)
    n = np.float32(math.sqrt(2.0)) * np.float32(10.0)
    np.testing.assert_allclose(obs[0, 0, 0:2], [1.0 / n, -1.0 / n], rtol=1e-6)
    np.testing.assert_allclose(obs[0, 0, 2:4], [0.0, 0.0], atol=1e-7)


def test_truncation_with_end_of_game_reward():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=2, grid_length=10.0,
                              episode_length=3, num_other_agents_observed=2)
    # runner 1 is tagged on the last step, runner 2 survives
    state = make_state([1, 0, 0], x=[5.0, 5.1, 9.0], y=[5.0, 5.0, 9.0], timestep=2)
    nxt, obs, rew, term, trunc = reference.step(cfg, state, noop(3))
    np.testing.assert_array_equal(rew, [[10.0, -10.0, 1.0]])
    assert nxt["timestep"].tolist() == [3]
    assert nxt["num_runners_left"].tolist() == [1]
    assert term.tolist() == [False] and trunc.tolist() == [True]
    assert obs[0, 0, -1] == np.float32(1.0)
    # one step earlier: no end-of-game reward, not done
    state = make_state([1, 0, 0], x=[5.0, 1.0, 9.0], y=[5.0, 1.0, 9.0], timestep=1)
    _, _, rew, term, trunc = reference.step(cfg, state, noop(3))
    np.testing.assert_array_equal(rew, [[0.0, 0.0, 0.0]])
    assert term.tolist() == [False] and trunc.tolist() == [False]


def test_termination_wins_over_truncation():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0,
                              episode_length=1, num_other_agents_observed=1)
    state = make_state([1, 0], x=[5.0, 5.05], y=[5.0, 5.0])
    _, _, rew, term, trunc = reference.step(cfg, state, noop(2))
    np.testing.assert_array_equal(rew, [[10.0, -10.0]])  # tagged runner: no +1
    assert term.tolist() == [True] and trunc.tolist() == [False]


def test_multiple_replicas_are_independent():
    cfg = TagContinuousConfig(num_taggers=1, num_runners=1, grid_length=10.0,
                              num_other_agents_observed=1)
    a = make_state([1, 0], x=[5.0, 5.1], y=[5.0, 5.0])
    b = make_state([1, 0], x=[1.0, 9.0], y=[1.0, 9.0])
    both = {k: np.concatenate([a[k], b[k]]) for k in reference.STATE_KEYS}
    nxt, obs, rew, term, trunc = reference.step(cfg, both, noop(2, e=2))
    np.testing.assert_array_equal(rew, [[10.0, -10.0], [0.0, 0.0]])
    assert term.tolist() == [True, False]
    for e, single in enumerate((a, b)):
        n1, o1, r1, _, _ = reference.step(cfg, single, noop(2))
        for k in reference.STATE_KEYS:
            np.testing.assert_array_equal(nxt[k][e], n1[k][0])
        np.testing.assert_array_equal(obs[e], o1[0])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
