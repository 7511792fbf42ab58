"""tag_continuous kernels against the independent NumPy reference, by state injection.

Each step injects a state into the env, steps the env and the reference with
the same random actions, and compares every output. Trajectories continue
from the kernel's own next state (auto-reset replicas included) and are
replaced by fresh random states every few steps.
"""
import numpy as np
import pytest
import torch

from conftest import make_tag, random_actions, random_tag_state
from gpusim.envs.tag_continuous import reference as ref

ATOL = 2e-5
FLOAT_KEYS = ("loc_x", "loc_y", "speed", "direction", "acceleration")
INT_KEYS = ("still_in_game", "agent_type", "num_runners_left", "timestep")

CONFIGS = {
    "default": dict(num_envs=2),
    "5+100": dict(num_envs=2, num_taggers=5),
    "full_observation": dict(num_envs=3, num_taggers=4, num_runners=20,
                             use_full_observation=True),
    "runners_stay": dict(num_envs=3, num_taggers=3, num_runners=30,
                         runner_exits_game_after_tagged=False, tagging_distance=0.05),
    "two_agents": dict(num_envs=8, num_taggers=1, num_runners=1, num_other_agents_observed=1,
                       tagging_distance=0.1, grid_length=4.0, episode_length=40),
    "k_above_agents_left": dict(num_envs=4, num_taggers=2, num_runners=5,
                                num_other_agents_observed=8, episode_length=60),
    "many_tags_one_tagger": dict(num_envs=4, num_taggers=1, num_runners=12,
                                 tagging_distance=0.3, grid_length=6.0),
    "penalties_and_custom_ids": dict(num_envs=3, num_taggers=3, num_runners=9,
                                     tagger_ids=[1, 4, 9], edge_hit_penalty=-0.5,
                                     step_penalty_for_tagger=-0.01,
                                     step_reward_for_runner=0.02, skill_level_runner=0.8,
                                     grid_length=5.0),
}


def as_numpy(state):
    return {k: v.cpu().numpy() for k, v in state.items()}


def assert_initial(state, config, rows):
    """Replicas `rows` hold a fresh initial state (spec: reset)."""
    length = config.grid_length
    for key in ("loc_x", "loc_y"):
        assert np.all((state[key][rows] >= 0) & (state[key][rows] <= length))
    quarter_turns = state["direction"][rows] / (np.pi / 2)
    assert np.allclose(quarter_turns, np.round(quarter_turns), atol=1e-6)
    assert np.all(state["speed"][rows] == 0) and np.all(state["acceleration"][rows] == 0)
    assert np.all(state["still_in_game"][rows] == 1)
    assert np.all(state["timestep"][rows] == 0)
    assert np.all(state["num_runners_left"][rows] == config.num_runners)


def run_against_reference(backend, num_envs, steps, seed=0, refresh_every=25,
                          draw_actions=random_actions, **config):
    """`draw_actions(env, rng)`: the actions of one step (uniform discrete by default)."""
    env = make_tag(num_envs=num_envs, backend=backend, seed=seed, **config)
    cfg = env.config
    rng = np.random.default_rng(seed + 17)
    env.reset()
    state = random_tag_state(cfg, num_envs, rng)
    counts = {"tags": 0, "resets": 0, "edge_hits": 0}
    for t in range(steps):
        if t % refresh_every == 0 and t:
            state = random_tag_state(cfg, num_envs, rng)
        env.set_state(state)
        actions = draw_actions(env, rng)
        obs, reward, terminated, truncated, info = env.step(actions)
        want_state, want_obs, want_reward, want_term, want_trunc = ref.step(
            cfg, state, actions.cpu().numpy())

        np.testing.assert_array_equal(terminated.cpu().numpy(), want_term, err_msg=f"step {t}")
        np.testing.assert_array_equal(truncated.cpu().numpy(), want_trunc, err_msg=f"step {t}")
        np.testing.assert_allclose(reward.cpu().numpy(), want_reward, atol=ATOL,
                                   err_msg=f"reward, step {t}")
        done = want_term | want_trunc
        np.testing.assert_array_equal(info["reset_mask"].cpu().numpy(), done)
        got_state = as_numpy(env.get_state())
        live = ~done
        for key in FLOAT_KEYS:
            np.testing.assert_allclose(got_state[key][live], want_state[key][live], atol=ATOL,
                                       err_msg=f"{key}, step {t}")
        for key in INT_KEYS:
            np.testing.assert_array_equal(got_state[key][live], want_state[key][live],
                                          err_msg=f"{key}, step {t}")
        np.testing.assert_allclose(obs.cpu().numpy()[live], want_obs[live], atol=ATOL,
                                   err_msg=f"obs, step {t}")
        if done.any():
            # the terminal observation is kept; the replica restarts from a fresh state
            np.testing.assert_allclose(info["final_obs"].cpu().numpy()[done], want_obs[done],
                                       atol=ATOL, err_msg=f"final_obs, step {t}")
            assert_initial(got_state, cfg, done)
            np.testing.assert_allclose(obs.cpu().numpy()[done], ref.observe(cfg, got_state)[done],
                                       atol=ATOL, err_msg=f"reset obs, step {t}")
        counts["tags"] += int((want_reward >= cfg.tag_reward_for_tagger - 1).sum()) \
            if cfg.tag_reward_for_tagger > 0 else 0
        counts["resets"] += int(done.sum())
        state = got_state
    return counts


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "5+100" else name
                                  for name in CONFIGS])
def test_cpu_matches_reference(name):
    config = dict(CONFIGS[name])
    num_envs = config.pop("num_envs")
    counts = run_against_reference("cpu", num_envs, steps=200, **config)
    # the random states must really exercise the interesting paths
    assert counts["resets"] > 0
    assert counts["tags"] > 0


@pytest.mark.slow
def test_cudasim_matches_reference():
    counts = run_against_reference("cudasim", num_envs=2, steps=200, num_taggers=1, num_runners=1,
                                   num_other_agents_observed=1, tagging_distance=0.1,
                                   grid_length=4.0, episode_length=40)
    assert counts["resets"] > 0 and counts["tags"] > 0


def test_cudasim_matches_reference_several_tags():
    counts = run_against_reference("cudasim", num_envs=1, steps=40, refresh_every=10,
                                   num_taggers=1, num_runners=4, num_other_agents_observed=5,
                                   tagging_distance=0.3, grid_length=3.0, episode_length=30)
    assert counts["resets"] > 0 and counts["tags"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["k_above_agents_left", "penalties_and_custom_ids"])
def test_cudasim_matches_reference_slow(name):
    config = dict(CONFIGS[name])
    config.pop("num_envs")
    run_against_reference("cudasim", num_envs=1, steps=200, **config)


def test_one_tagger_scores_several_tags_in_one_step():
    """Three runners inside one tagger's radius: all three tags count."""
    env = make_tag(num_envs=1, num_taggers=1, num_runners=4, tagging_distance=0.05,
                   grid_length=10.0)  # radius 0.5
    env.reset()
    state = as_numpy(env.get_state())
    state["loc_x"][0] = [5.0, 5.2, 4.8, 5.0, 9.0]
    state["loc_y"][0] = [5.0, 5.0, 5.1, 4.7, 9.0]
    state["speed"][:] = 0
    state["acceleration"][:] = 0
    env.set_state(state)
    _, reward, terminated, _, _ = env.step(torch.zeros((1, 5, 2), dtype=torch.int32))
    np.testing.assert_allclose(reward[0].numpy(), [30.0, -10.0, -10.0, -10.0, 0.0])
    after = env.get_state()
    assert after["still_in_game"][0].tolist() == [1, 0, 0, 0, 1]
    assert after["num_runners_left"][0] == 1 and not terminated[0]
