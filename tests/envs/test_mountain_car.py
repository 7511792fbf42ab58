"""mountain_car against gymnasium's own MountainCar-v0, step by step, by state injection;
whole episodes from gymnasium's own reset; check_env with its reference (cpu, and cpu
against cudasim); bad configs; a frame; a tiny training run."""
import numpy as np
import pytest
import torch

import gpusim
from conftest import draw_one_frame, step_matches_reference
from gpusim.check import check_env
from gpusim.envs.mountain_car.config import MountainCarConfig
from gpusim.envs.mountain_car.reference import check_env_reference
from gpusim.errors import ConfigError

gymnasium = pytest.importorskip("gymnasium")

PHYSICS = ("position", "velocity")
MAX_STEPS = 200
MIN_POSITION = -1.2


def random_mountain_car_state(rng, num_envs, max_steps):
    """States over the whole track; a third next to the goal (terminations), a third
    against the left wall moving left (the wall rule), some exactly at the wall; speeds
    slightly beyond the limit (the clip); timesteps over the episode and at its last step
    (truncations)."""
    kind = rng.integers(0, 3, num_envs)
    position = np.where(kind == 0, rng.uniform(-1.2, 0.6, num_envs),
                        np.where(kind == 1, rng.uniform(0.42, 0.6, num_envs),
                                 rng.uniform(-1.2, -1.12, num_envs)))
    velocity = np.where(kind == 0, rng.uniform(-0.075, 0.075, num_envs),
                        np.where(kind == 1, rng.uniform(-0.02, 0.075, num_envs),
                                 rng.uniform(-0.075, 0.0, num_envs)))
    position[rng.random(num_envs) < 0.05] = MIN_POSITION
    timestep = rng.integers(0, max_steps, num_envs)
    timestep[rng.random(num_envs) < 0.2] = max_steps - 1
    return {"position": position, "velocity": velocity, "timestep": timestep.astype(np.int32)}


@pytest.mark.parametrize("backend, num_envs, steps, refresh_every", [
    ("cpu", 64, 300, 20),
    ("cudasim", 2, 40, 4),
    pytest.param("numba", 256, 300, 20, marks=pytest.mark.gpu),
])
def test_matches_gymnasium(backend, num_envs, steps, refresh_every):
    env = gpusim.make("mountain_car", num_envs=num_envs, backend=backend, seed=1)
    env.reset()
    gym_env = gymnasium.make("MountainCar-v0").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(5)
    state = random_mountain_car_state(rng, num_envs, MAX_STEPS)
    seen = {"terminated": 0, "truncated": 0, "running": 0, "wall": 0}
    for t in range(steps):
        if t % refresh_every == 0:
            state = random_mountain_car_state(rng, num_envs, MAX_STEPS)
        env.set_state(state)
        actions = rng.integers(0, 3, (num_envs, 1, 1)).astype(np.int32)
        obs, reward, terminated, truncated, info = env.step(
            torch.from_numpy(actions).to(env.device))
        obs, reward, terminated, truncated = (x.cpu() for x in (obs, reward, terminated,
                                                                 truncated))
        final_obs = info["final_obs"].cpu()
        after = {k: v.cpu().numpy() for k, v in env.get_state().items()}
        for e in range(num_envs):
            gym_env.state = np.array([state[k][e] for k in PHYSICS], dtype=np.float64)
            want_obs, want_reward, want_term, _, _ = gym_env.step(int(actions[e, 0, 0]))
            want_trunc = (not want_term) and state["timestep"][e] + 1 >= MAX_STEPS
            assert bool(terminated[e]) == want_term, (t, e)
            assert bool(truncated[e]) == want_trunc, (t, e)
            assert reward[e, 0] == want_reward == -1.0, (t, e)
            done = want_term or want_trunc
            got = final_obs[e, 0] if done else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=1e-5)
            if not done:  # the state itself (a finished replica has been reset already)
                got_state = [float(after[k][e]) for k in PHYSICS]
                np.testing.assert_allclose(got_state, np.array(gym_env.state, dtype=np.float64),
                                           rtol=0, atol=1e-5)
                assert after["timestep"][e] == state["timestep"][e] + 1
            seen["terminated"] += want_term
            seen["truncated"] += want_trunc
            seen["running"] += not done
            seen["wall"] += bool(gym_env.state[0] == MIN_POSITION and gym_env.state[1] == 0
                                 and state["velocity"][e] < 0)
        state = after
    assert all(seen.values()), seen
    if backend == "cpu":
        assert seen["terminated"] >= 100 and seen["wall"] >= 100, seen


def test_whole_episodes_follow_gymnasium_from_its_reset():
    """Episodes from gymnasium's own initial states, not re-injected: the float64 state
    keeps the trajectories identical to the end (termination or truncation)."""
    num_envs = 16
    env = gpusim.make("mountain_car", num_envs=num_envs, backend="cpu", seed=6)
    env.reset()
    gyms = [gymnasium.make("MountainCar-v0").unwrapped for _ in range(num_envs)]
    for e, gym_env in enumerate(gyms):
        gym_env.reset(seed=100 + e)
    env.set_state({"position": np.array([g.state[0] for g in gyms]),
                   "velocity": np.zeros(num_envs), "timestep": np.zeros(num_envs, np.int32)})
    rng = np.random.default_rng(7)
    # a bang-bang controller (push along the velocity) with random actions mixed in:
    # some episodes reach the goal, some are truncated
    finished = np.zeros(num_envs, dtype=bool)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(MAX_STEPS):
        actions = np.array([2 if g.state[1] >= 0 else 0 for g in gyms], dtype=np.int32)
        random = rng.random(num_envs) < np.linspace(0.0, 0.9, num_envs)
        actions[random] = rng.integers(0, 3, int(random.sum()))
        obs, _, terminated, truncated, info = env.step(
            torch.from_numpy(actions.reshape(num_envs, 1, 1)))
        for e, gym_env in enumerate(gyms):
            if finished[e]:
                continue
            want_obs, _, want_term, _, _ = gym_env.step(int(actions[e]))
            want_trunc = (not want_term) and t + 1 >= MAX_STEPS
            assert bool(terminated[e]) == want_term and bool(truncated[e]) == want_trunc, (t, e)
            done = want_term or want_trunc
            got = info["final_obs"][e, 0] if done else obs[e, 0]
            assert np.array_equal(got.numpy(), want_obs), (t, e)
            finished[e] = done
            ends["terminated"] += want_term
            ends["truncated"] += want_trunc
    assert finished.all() and ends["terminated"] > 0 and ends["truncated"] > 0, ends


def test_reference_follows_the_config():
    """A variant config reaches gymnasium through the reference (no built-in constants)."""
    config = dict(force=0.002, gravity=0.003, max_speed=0.05, goal_position=0.3,
                  goal_velocity=0.01, min_position=-1.0, max_episode_steps=50)
    env = gpusim.make("mountain_car", num_envs=32, backend="cpu", seed=5, **config)
    env.reset()
    reference = check_env_reference(env.config)
    rng = np.random.default_rng(8)
    seen_term = 0
    for _ in range(10):
        state = random_mountain_car_state(rng, 32, 50)
        state["position"] = np.clip(state["position"], -1.0, 0.6)
        actions = rng.integers(0, 3, (32, 1, 1)).astype(np.int32)
        want_term = step_matches_reference(env, reference, state, actions, PHYSICS)
        seen_term += int(want_term.sum())
    assert seen_term > 0


def test_reset_state_matches_the_spec():
    env = gpusim.make("mountain_car", num_envs=500, backend="cpu", seed=2)
    obs = env.reset()
    assert obs.shape == (500, 1, 2) and obs.dtype == torch.float32
    assert env.policies == {"agent": (0,)} and env.action_nvec == (3,)
    assert env.time_limit == MAX_STEPS
    state = env.get_state()
    assert set(state) == {"position", "velocity", "timestep"}
    assert (state["timestep"] == 0).all() and (state["velocity"] == 0).all()
    position = state["position"]
    assert position.dtype == torch.float64
    assert position.min() >= -0.6 and position.max() <= -0.4 and position.std() > 0.04
    assert not torch.equal(position, position.float().double())  # float64, as gymnasium's
    assert torch.equal(obs[:, 0, 0], position.float()) and (obs[:, 0, 1] == 0).all()


def test_check_env_passes_with_the_gymnasium_reference():
    env = gpusim.make("mountain_car", num_envs=8, backend="cpu", seed=0)
    result = check_env(env, reference=check_env_reference(env.config), steps=220,
                       reference_steps=220, compare_backend="cudasim", compare_steps=5,
                       verbose=False)
    assert result.ok, str(result)
    assert not result["reference"].skipped and not result["backends"].skipped


@pytest.mark.parametrize("data, message", [
    ({"min_position": 1.0}, "'min_position' must be below max_position"),
    ({"max_speed": 0.0}, "'max_speed' must be positive"),
    ({"force": -0.001}, "'force' must be >= 0"),
    ({"gravity": -1.0}, "'gravity' must be >= 0"),
    ({"max_episode_steps": 0}, "'max_episode_steps' must be at least 1"),
    ({"reset_low": -0.3}, "'reset_low' must not exceed reset_high"),
    ({"reset_low": -2.0}, "the reset range must lie in"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        MountainCarConfig.load(**data)


def test_draw_a_frame():
    ax = draw_one_frame("mountain_car")
    assert ax.lines and ax.patches


def test_training_runs(tmp_path):
    from gpusim.train import main
    assert main(["--env", "mountain_car", "--backend", "cpu", "--num_envs", "4",
                 "--rollout_len", "16", "--total_steps", "128", "--results_dir", str(tmp_path),
                 "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "metrics.jsonl").is_file()
