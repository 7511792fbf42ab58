"""tag_gridworld: kernels against the NumPy reference by state injection, and the rules by hand.

The env is built from its `module:Class` path, so these tests do not depend
on the registry. Random states put agents on the walls, taggers next to (and
on) the runner's cell, and timesteps on the last step of an episode, so
wall hits, tags and truncations all happen. Trajectories continue from the
kernel's own next state (auto-reset replicas included) and are replaced by
fresh random states every few steps.
"""
import numpy as np
import pytest
import torch

import gpusim
from gpusim import rng as gpusim_rng
from gpusim.envs.tag_gridworld import reference as ref
from gpusim.envs.tag_gridworld.config import TagGridworldConfig
from gpusim.errors import ArrayError, ConfigError

TARGET = "gpusim.envs.tag_gridworld.env:TagGridworld"
STAY, PLUS_X, MINUS_X, PLUS_Y, MINUS_Y = range(5)


def make(num_envs=1, backend="cpu", seed=0, **config):
    return gpusim.make(TARGET, num_envs=num_envs, backend=backend, seed=seed, **config)


def as_numpy(state):
    return {k: v.cpu().numpy().copy() for k, v in state.items()}


# ---- random states ------------------------------------------------------------------
NEIGHBOURS = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]])


def random_state(config, num_envs, rng):
    """A random state biased towards walls, near-tags and the last step of an episode."""
    n, size = config.num_taggers, config.grid_size
    pos = rng.integers(0, size, (num_envs, n + 1, 2))
    on_wall = rng.random((num_envs, n + 1)) < 0.25
    axis = rng.integers(0, 2, (num_envs, n + 1))
    side = rng.choice([0, size - 1], (num_envs, n + 1))
    e_idx, a_idx = np.nonzero(on_wall)
    pos[e_idx, a_idx, axis[on_wall]] = side[on_wall]
    for e in range(num_envs):
        runner = pos[e, n]
        pick = rng.random()
        if pick < 0.5:  # one tagger right next to the runner
            cells = runner + NEIGHBOURS
            cells = cells[((cells >= 0) & (cells < size)).all(axis=1)]
            pos[e, rng.integers(0, n)] = cells[rng.integers(0, len(cells))]
        elif pick < 0.6:  # one tagger already on the runner's cell
            pos[e, rng.integers(0, n)] = runner
    timestep = rng.integers(0, config.episode_length, num_envs)
    timestep[rng.random(num_envs) < 0.3] = config.episode_length - 1
    return {"pos_x": np.ascontiguousarray(pos[..., 0], dtype=np.int32),
            "pos_y": np.ascontiguousarray(pos[..., 1], dtype=np.int32),
            "timestep": timestep.astype(np.int32)}


def random_actions(env, rng):
    return torch.from_numpy(rng.integers(0, 5, (env.num_envs, env.num_agents, 1)).astype(np.int32))


def wall_hits(config, state, actions):
    """(E, A) bool: which agents try to step off the grid."""
    want_x = state["pos_x"] + ref.MOVES[actions[..., 0], 0]
    want_y = state["pos_y"] + ref.MOVES[actions[..., 0], 1]
    size = config.grid_size
    return (want_x < 0) | (want_x >= size) | (want_y < 0) | (want_y >= size)


def runner_corner_draws(rng_state, rows, runner):
    """Advance the runner's stream of each replica in `rows` by its reset draw (in place)."""
    return np.array([gpusim_rng.randint(rng_state, int(e), runner, 4) for e in rows],
                    dtype=np.int64)


# ---- env against reference --------------------------------------------------------------
def run_against_reference(backend, num_envs, steps, seed=0, refresh_every=10, **config):
    env = make(num_envs, backend=backend, seed=seed, **config)
    cfg = env.config
    runner = cfg.runner_id
    rng = np.random.default_rng(seed + 101)
    env.reset()
    state = random_state(cfg, num_envs, rng)
    counts = dict(tags=0, truncations=0, wall_hits=0, resets=0, steps_on_last=0)
    for t in range(steps):
        if t % refresh_every == 0 and t:
            state = random_state(cfg, num_envs, rng)
        env.set_state(state)
        rng_before = env.get_state(include_rng=True)["rng_state"].numpy().copy()
        actions = random_actions(env, rng)
        obs, reward, terminated, truncated, info = env.step(actions)
        want_state, want_obs, want_reward, want_term, want_trunc = ref.step(
            cfg, state, actions.numpy())
        msg = f"step {t}"

        np.testing.assert_array_equal(terminated.numpy(), want_term, err_msg=msg)
        np.testing.assert_array_equal(truncated.numpy(), want_trunc, err_msg=msg)
        np.testing.assert_array_equal(reward.numpy(), want_reward, err_msg=f"reward, {msg}")
        done = want_term | want_trunc
        np.testing.assert_array_equal(info["reset_mask"].numpy(), done, err_msg=msg)

        got = as_numpy(env.get_state(include_rng=True))
        live = ~done
        for key in ref.STATE_KEYS:
            np.testing.assert_array_equal(got[key][live], want_state[key][live],
                                          err_msg=f"{key}, {msg}")
        np.testing.assert_array_equal(obs.numpy()[live], want_obs[live], err_msg=f"obs, {msg}")

        # Only the runner's stream of a finished replica moves: one draw, its corner.
        rows = np.nonzero(done)[0]
        corners = runner_corner_draws(rng_before, rows, runner)
        np.testing.assert_array_equal(got["rng_state"], rng_before, err_msg=f"rng, {msg}")
        if rows.size:
            np.testing.assert_array_equal(info["final_obs"].numpy()[done], want_obs[done],
                                          err_msg=f"final_obs, {msg}")
            fresh, fresh_obs = ref.reset(cfg, corners)
            for key in ref.STATE_KEYS:
                np.testing.assert_array_equal(got[key][done], fresh[key],
                                              err_msg=f"reset {key}, {msg}")
            np.testing.assert_array_equal(obs.numpy()[done], fresh_obs,
                                          err_msg=f"reset obs, {msg}")

        counts["tags"] += int(want_term.sum())
        counts["truncations"] += int(want_trunc.sum())
        counts["wall_hits"] += int(wall_hits(cfg, state, actions.numpy()).sum())
        counts["resets"] += int(done.sum())
        counts["steps_on_last"] += int((np.asarray(state["timestep"])
                                        == cfg.episode_length - 1).sum())
        state = {k: got[k] for k in ref.STATE_KEYS}
    return counts


CONFIGS = {
    "default": dict(num_envs=16),
    "one_tagger_2x2": dict(num_envs=8, num_taggers=1, grid_size=2, episode_length=3),
    "five_taggers_4x4": dict(num_envs=8, num_taggers=5, grid_size=4, episode_length=7),
    "custom_rewards_3x3": dict(num_envs=8, num_taggers=2, grid_size=3, episode_length=20,
                               wall_penalty=-0.75, tag_reward=1.5, tag_penalty=-0.25,
                               step_penalty_tagger=0.0, step_reward_runner=0.3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cpu_matches_reference(name):
    config = dict(CONFIGS[name])
    num_envs = config.pop("num_envs")
    counts = run_against_reference("cpu", num_envs, steps=150, **config)
    for key in ("tags", "truncations", "wall_hits", "resets", "steps_on_last"):
        assert counts[key] > 0, (key, counts)


def test_cudasim_matches_reference():
    counts = run_against_reference("cudasim", num_envs=2, steps=24, refresh_every=6,
                                   num_taggers=2, grid_size=3, episode_length=4)
    assert counts["tags"] > 0 and counts["resets"] > 0 and counts["wall_hits"] > 0


def test_cpu_and_cudasim_agree_bit_for_bit():
    """Same seed, same actions: the same trajectory on both backends, resets included."""
    config = dict(num_taggers=1, grid_size=3, episode_length=4)
    envs = [make(3, backend=b, seed=11, **config) for b in ("cpu", "cudasim")]
    first = [env.reset().clone() for env in envs]
    torch.testing.assert_close(first[0], first[1], rtol=0, atol=0)
    rng = np.random.default_rng(3)
    resets = 0
    for _ in range(12):
        actions = random_actions(envs[0], rng)
        outs = [[x.clone() for x in env.step(actions)[:4]] for env in envs]
        for a, b in zip(*outs):
            assert torch.equal(a, b)
        resets += int((outs[0][2] | outs[0][3]).sum())
        for key, value in envs[0].get_state(include_rng=True).items():
            assert torch.equal(value, envs[1].get_state(include_rng=True)[key]), key
    assert resets > 0


# ---- reset ------------------------------------------------------------------------
def test_reset_puts_taggers_at_the_centre_and_the_runner_in_a_drawn_corner():
    num_envs, seed = 400, 5
    env = make(num_envs, seed=seed)
    cfg = env.config
    obs = env.reset()
    state = as_numpy(env.get_state())
    n, size = cfg.num_taggers, cfg.grid_size
    assert (state["pos_x"][:, :n] == size // 2).all() and (state["pos_y"][:, :n] == size // 2).all()
    assert (state["timestep"] == 0).all()
    cells = np.stack([state["pos_x"][:, n], state["pos_y"][:, n]], axis=1)
    corner_index = (cells[:, 0] // (size - 1)) + 2 * (cells[:, 1] // (size - 1))
    assert np.isin(cells, [0, size - 1]).all()
    counts = np.bincount(corner_index, minlength=4)
    assert (counts > 60).all(), counts  # all four corners, roughly uniformly (100 expected)
    # the corner is the runner's first draw from its own stream
    streams = gpusim_rng.seed_streams(num_envs, env.num_agents, seed).numpy()
    draws = runner_corner_draws(streams, range(num_envs), n)
    np.testing.assert_array_equal(corner_index, draws)
    want_state, want_obs = ref.reset(cfg, draws)
    for key in ref.STATE_KEYS:
        np.testing.assert_array_equal(state[key], want_state[key])
    np.testing.assert_array_equal(obs.numpy(), want_obs)
    # the taggers' streams were not touched
    after = env.get_state(include_rng=True)["rng_state"].numpy()
    np.testing.assert_array_equal(after, streams)


def test_reset_with_a_seed_is_reproducible():
    env = make(32, seed=1)
    env.reset(seed=9)
    a = as_numpy(env.get_state(include_rng=True))
    env.step(torch.zeros((32, 4, 1), dtype=torch.int32))
    env.reset(seed=9)
    b = as_numpy(env.get_state(include_rng=True))
    for key in ref.STATE_KEYS + ("rng_state",):
        np.testing.assert_array_equal(a[key], b[key])


# ---- the rules on hand-built situations ------------------------------------------------
def situation(taggers, runner, actions, timestep=0, **config):
    """One replica: taggers' and runner's cells, per-agent actions; env and reference agree."""
    env = make(1, **config)
    env.reset()
    cells = np.array(list(taggers) + [runner], dtype=np.int32)
    state = {"pos_x": cells[None, :, 0].copy(), "pos_y": cells[None, :, 1].copy(),
             "timestep": np.array([timestep], dtype=np.int32)}
    env.set_state(state)
    acts = torch.tensor(actions, dtype=torch.int32).reshape(1, -1, 1)
    obs, reward, terminated, truncated, info = env.step(acts)
    want = ref.step(env.config, state, acts.numpy())
    np.testing.assert_array_equal(reward.numpy(), want[2])
    assert bool(terminated[0]) == bool(want[3][0]) and bool(truncated[0]) == bool(want[4][0])
    return dict(reward=reward[0].tolist(), terminated=bool(terminated[0]),
                truncated=bool(truncated[0]), final_obs=info["final_obs"][0].clone(),
                obs=obs[0].clone(), state=as_numpy(env.get_state()), next=want[0])


def approx(values):
    return pytest.approx(values, abs=1e-6)


def test_tagger_steps_onto_the_runner():
    r = situation([(5, 5), (0, 3), (1, 1)], (6, 5), [PLUS_X, MINUS_X, STAY, STAY])
    assert r["terminated"] and not r["truncated"]
    # every tagger gets the tag reward; tagger 1 also hit the wall
    assert r["reward"] == approx([10.0, 10.0 - 0.1, 10.0, -5.0])
    # the terminal observation is kept; the replica restarted
    fo = r["final_obs"]
    assert fo[0, :2].tolist() == approx([0.6, 0.5])
    assert fo[3, 2:4].tolist() == [0.0, 0.0] and fo[3, 10] == 0.0 and fo[0, 10] == 1.0
    assert fo[0, 11] == pytest.approx(0.01)
    assert r["state"]["timestep"][0] == 0 and (r["state"]["pos_x"][0, :3] == 5).all()


def test_runner_steps_onto_a_tagger():
    r = situation([(3, 3), (9, 9), (9, 8)], (3, 4), [STAY, STAY, STAY, MINUS_Y])
    assert r["terminated"] and r["reward"] == approx([10.0, 10.0, 10.0, -5.0])


def test_tag_against_a_wall_adds_the_wall_penalty():
    r = situation([(1, 0), (5, 5), (5, 5)], (0, 0), [MINUS_X, STAY, STAY, MINUS_X])
    assert r["terminated"] and r["reward"] == approx([10.0, 10.0, 10.0, -5.1])


def test_several_taggers_on_the_cell_each_get_the_full_reward():
    r = situation([(4, 5), (6, 5), (5, 4)], (5, 5), [PLUS_X, MINUS_X, PLUS_Y, STAY])
    assert r["terminated"] and r["reward"] == approx([10.0, 10.0, 10.0, -5.0])


def test_swapping_cells_is_not_a_tag():
    r = situation([(5, 5), (0, 0), (0, 1)], (6, 5), [PLUS_X, STAY, STAY, MINUS_X])
    assert not r["terminated"] and not r["truncated"]
    assert r["reward"] == approx([-0.01, -0.01, -0.01, 0.01])
    assert r["state"]["pos_x"][0].tolist() == [6, 0, 0, 5] and r["state"]["timestep"][0] == 1


def test_runner_leaving_the_cell_a_tagger_enters_is_not_a_tag():
    r = situation([(4, 5), (0, 0), (0, 1)], (5, 5), [PLUS_X, STAY, STAY, PLUS_X])
    assert not r["terminated"] and r["state"]["pos_x"][0].tolist() == [5, 0, 0, 6]


def test_wall_hits_leave_the_agent_in_place():
    r = situation([(10, 10), (0, 10), (5, 0)], (0, 0),
                  [PLUS_X, PLUS_Y, MINUS_Y, MINUS_Y], timestep=5)
    assert not r["terminated"] and not r["truncated"]
    assert r["reward"] == approx([-0.11, -0.11, -0.11, -0.09])
    assert r["state"]["pos_x"][0].tolist() == [10, 0, 5, 0]
    assert r["state"]["pos_y"][0].tolist() == [10, 10, 0, 0]
    assert r["state"]["timestep"][0] == 6
    # the observation of the runner after the step, entry by entry
    assert r["obs"][3].tolist() == approx([0, 0, 0, 0, 1, 1, 0, 1, 0.5, 0, 0, 0.06])


def test_every_action_moves_one_cell():
    for action, (dx, dy) in enumerate(ref.MOVES.tolist()):
        r = situation([(1, 1)], (5, 5), [action, STAY], num_taggers=1)
        assert (r["state"]["pos_x"][0, 0], r["state"]["pos_y"][0, 0]) == (1 + dx, 1 + dy)


def test_truncation_at_the_episode_length():
    r = situation([(5, 5), (5, 5), (5, 5)], (0, 0), [STAY] * 4, timestep=99)
    assert r["truncated"] and not r["terminated"]
    assert r["reward"] == approx([-0.01, -0.01, -0.01, 0.01])
    assert r["final_obs"][:, 11].tolist() == [1.0] * 4
    assert r["state"]["timestep"][0] == 0  # auto-reset


def test_a_tag_on_the_last_step_terminates_and_does_not_truncate():
    r = situation([(1, 0), (5, 5), (5, 5)], (0, 0), [MINUS_X, STAY, STAY, STAY], timestep=99)
    assert r["terminated"] and not r["truncated"]


def test_the_step_before_the_last_is_not_truncated():
    r = situation([(5, 5), (5, 5), (5, 5)], (0, 0), [STAY] * 4, timestep=98)
    assert not r["truncated"] and not r["terminated"] and r["state"]["timestep"][0] == 99


def test_observation_layout():
    env = make(1, num_taggers=2, grid_size=5, episode_length=8)
    env.reset()
    env.set_state({"pos_x": np.array([[0, 4, 2]], dtype=np.int32),
                   "pos_y": np.array([[1, 3, 4]], dtype=np.int32),
                   "timestep": np.array([1], dtype=np.int32)})
    obs, *_ = env.step(torch.zeros((1, 3, 1), dtype=torch.int32))
    assert env.obs_dim == 10 and obs.shape == (1, 3, 10)
    q = 0.25
    assert obs[0, 0].tolist() == approx([0, q, 2 * q, 3 * q, 0, 0, 4 * q, 2 * q, 1, 0.25])
    assert obs[0, 1].tolist() == approx([1, 3 * q, -2 * q, q, -4 * q, -2 * q, 0, 0, 1, 0.25])
    assert obs[0, 2].tolist() == approx([2 * q, 1, 0, 0, -2 * q, -3 * q, 2 * q, -q, 0, 0.25])


# ---- determinism --------------------------------------------------------------------
def sampled_rollout(env, steps):
    sampler = gpusim.ActionSampler(env)
    probs = torch.ones((env.num_envs, env.num_agents, 5))
    out = [env.reset().clone()]
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(sampler.sample(probs))
        out += [obs.clone(), reward.clone(), terminated.clone(), truncated.clone()]
    return out


def test_same_seed_same_trajectory_and_different_seeds_differ():
    a = sampled_rollout(make(16, seed=7, grid_size=5, episode_length=20), 120)
    b = sampled_rollout(make(16, seed=7, grid_size=5, episode_length=20), 120)
    c = sampled_rollout(make(16, seed=8, grid_size=5, episode_length=20), 120)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert sum(int(x.sum()) for x in a[3::4]) > 0  # some tags happened


# ---- API, config, injected-state checks ----------------------------------------------
def test_shapes_policies_and_action_space():
    env = make(3, num_taggers=4)
    assert env.num_agents == 5 and env.obs_dim == 14 and env.action_nvec == (5,)
    assert env.policies == {"tagger": (0, 1, 2, 3), "runner": (4,)}
    obs = env.reset()
    assert obs.shape == (3, 5, 14) and obs.dtype == torch.float32


@pytest.mark.parametrize("overrides, key", [
    (dict(grid_size=1), "grid_size"),
    (dict(num_taggers=0), "num_taggers"),
    (dict(episode_length=0), "episode_length"),
    (dict(wall_penalty=0.1), "wall_penalty"),
    (dict(tag_penalty=5.0), "tag_penalty"),
    (dict(step_penalty_tagger=0.01), "step_penalty_tagger"),
    (dict(tag_reward=float("nan")), "tag_reward"),
    (dict(grid_size=11.5), "grid_size"),
    (dict(grid_sise=11), "grid_sise"),
])
def test_bad_config_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        TagGridworldConfig.load(**overrides)


def test_shipped_config_loads_with_all_sections():
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    cls = env_class(TARGET)
    config = load_run_config(TARGET, cls)
    assert config.env == TagGridworldConfig()
    assert config.trainer.total_steps > 0 and config.policy.hidden_sizes


@pytest.mark.parametrize("name, value, message", [
    ("pos_x", 11, "pos_x"), ("pos_y", -1, "pos_y"), ("timestep", 100, "timestep"),
])
def test_set_state_rejects_impossible_values(name, value, message):
    env = make(2)
    env.reset()
    state = as_numpy(env.get_state())
    state[name].flat[0] = value
    with pytest.raises(ArrayError, match=message):
        env.set_state({name: state[name]})
