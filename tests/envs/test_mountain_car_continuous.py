"""mountain_car_continuous against gymnasium's own MountainCarContinuous-v0, step by step,
by state injection (random actions, out-of-bound ones included: the env clips the force
itself and charges gymnasium's reward on the raw action); whole episodes from gymnasium's
own reset; check_env with its reference (cpu, and cpu against cudasim); actions exactly at
the bounds; NaN and infinite actions; bad configs; a frame."""
import numpy as np
import pytest
import torch

import gpusim
from conftest import draw_one_frame, step_matches_reference
from gpusim.check import check_env
from gpusim.envs.mountain_car_continuous.config import MountainCarContinuousConfig
from gpusim.envs.mountain_car_continuous.reference import check_env_reference
from gpusim.errors import ArrayError, ConfigError

gymnasium = pytest.importorskip("gymnasium")

PHYSICS = ("position", "velocity")
MAX_STEPS = 999
MIN_POSITION = -1.2


def random_mountain_car_state(rng, num_envs, max_steps):
    """States over the whole track; a third next to the goal (terminations), a third
    against the left wall moving left (the wall rule), some exactly at the wall, some at
    the right end; speeds slightly beyond the limit (the clip); timesteps over the episode,
    at 0 (gymnasium's float64 state of a fresh episode) and at the last step (truncations)."""
    kind = rng.integers(0, 3, num_envs)
    position = np.where(kind == 0, rng.uniform(-1.2, 0.6, num_envs),
                        np.where(kind == 1, rng.uniform(0.42, 0.6, num_envs),
                                 rng.uniform(-1.2, -1.12, num_envs)))
    velocity = np.where(kind == 0, rng.uniform(-0.075, 0.075, num_envs),
                        np.where(kind == 1, rng.uniform(-0.02, 0.075, num_envs),
                                 rng.uniform(-0.075, 0.0, num_envs)))
    pick = rng.random(num_envs)
    position[pick < 0.05] = MIN_POSITION
    position[pick > 0.97] = 0.6
    timestep = rng.integers(0, max_steps, num_envs)
    pick = rng.random(num_envs)
    timestep[pick < 0.2] = max_steps - 1
    timestep[pick > 0.8] = 0
    return {"position": position, "velocity": velocity, "timestep": timestep.astype(np.int32)}


def gym_state(state, e):
    """The state as gymnasium holds it: float64 right after its reset, float32 after a step."""
    dtype = np.float64 if state["timestep"][e] == 0 else np.float32
    return np.array([state[k][e] for k in PHYSICS], dtype=dtype)


def random_forces(rng, num_envs):
    """Uniform over a range 30% wider than the bounds, a few exactly 0, a few exactly at a
    bound (not clipped: gymnasium keeps the float32 action) and a few one float32 ulp
    beyond one (clipped: gymnasium's Python float bound)."""
    force = rng.uniform(-1.3, 1.3, num_envs).astype(np.float32)
    pick = rng.random(num_envs)
    sign = np.where(rng.random(num_envs) < 0.5, -1.0, 1.0).astype(np.float32)
    force[pick < 0.02] = 0.0
    at = (pick >= 0.02) & (pick < 0.06)
    force[at] = sign[at]
    beyond = (pick >= 0.06) & (pick < 0.08)
    force[beyond] = np.nextafter(sign[beyond], 2 * sign[beyond])
    return force.reshape(num_envs, 1, 1)


def float32_rounding(value):
    """Half a float32 ulp at `value`: the most that rounding gymnasium's (Python float)
    reward to the env's float32 reward may move it."""
    return float(np.spacing(np.float32(abs(value)))) / 2


# the state and observation: identical to gymnasium's on the CPU (and cudasim); the GPU's
# cos may differ from the CPU's in the last bit (FMA contraction)
@pytest.mark.parametrize("backend, num_envs, steps, refresh_every, atol", [
    ("cpu", 64, 300, 20, 0.0),
    ("cudasim", 2, 40, 4, 0.0),
    pytest.param("numba", 256, 300, 20, 1e-5, marks=pytest.mark.gpu),
])
def test_matches_gymnasium(backend, num_envs, steps, refresh_every, atol):
    env = gpusim.make("mountain_car_continuous", num_envs=num_envs, backend=backend, seed=1)
    env.reset()
    gym_env = gymnasium.make("MountainCarContinuous-v0").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(5)
    state = random_mountain_car_state(rng, num_envs, MAX_STEPS)
    seen = {"terminated": 0, "truncated": 0, "running": 0, "wall": 0, "fresh": 0,
            "clipped": 0, "at_bound": 0}
    worst = {"reward": 0.0, "obs": 0.0, "state": 0.0}
    for t in range(steps):
        if t % refresh_every == 0:
            state = random_mountain_car_state(rng, num_envs, MAX_STEPS)
        env.set_state(state)
        actions = random_forces(rng, num_envs)
        obs, reward, terminated, truncated, info = env.step(
            torch.from_numpy(actions).to(env.device))
        obs, reward, terminated, truncated = (x.cpu() for x in (obs, reward, terminated,
                                                                 truncated))
        final_obs = info["final_obs"].cpu()
        after = {k: v.cpu().numpy() for k, v in env.get_state().items()}
        for e in range(num_envs):
            gym_env.state = gym_state(state, e)
            want_obs, gym_reward, want_term, _, _ = gym_env.step(actions[e, 0])
            want_trunc = (not want_term) and state["timestep"][e] + 1 >= MAX_STEPS
            assert bool(terminated[e]) == want_term, (t, e)
            assert bool(truncated[e]) == want_trunc, (t, e)
            action = float(actions[e, 0, 0])
            # gymnasium's own reward (of the raw action, out of bounds too), as a float32
            deviation = abs(float(reward[e, 0]) - gym_reward)
            assert deviation <= float32_rounding(gym_reward), (t, e, action)
            assert reward[e, 0] == np.float32(gym_reward), (t, e, action)
            worst["reward"] = max(worst["reward"], deviation)
            done = want_term or want_trunc
            got = final_obs[e, 0] if done else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=atol)
            worst["obs"] = max(worst["obs"], float(np.abs(got.numpy() - want_obs).max()))
            if not done:  # the state itself (a finished replica has been reset already)
                got_state = np.array([float(after[k][e]) for k in PHYSICS])
                want_state = gym_env.state.astype(np.float64)
                np.testing.assert_allclose(got_state, want_state, rtol=0, atol=atol)
                worst["state"] = max(worst["state"], float(np.abs(got_state - want_state).max()))
                assert after["timestep"][e] == state["timestep"][e] + 1
            seen["terminated"] += want_term
            seen["truncated"] += want_trunc
            seen["running"] += not done
            seen["wall"] += bool(gym_env.state[0] == np.float32(MIN_POSITION)
                                 and gym_env.state[1] == 0 and state["velocity"][e] < 0)
            seen["fresh"] += bool(state["timestep"][e] == 0)
            seen["clipped"] += bool(abs(action) > 1.0)
            seen["at_bound"] += bool(abs(action) == 1.0)
        state = after
    print(backend, seen, "max deviation from gymnasium:", worst)
    assert all(seen.values()), seen
    if backend == "cpu":
        assert seen["terminated"] >= 100 and seen["wall"] >= 100, seen


def test_whole_episodes_follow_gymnasium_from_its_reset():
    """Episodes from gymnasium's own initial states, not re-injected: the first step in
    float64 and the others in float32, as gymnasium's, keep the observations identical to
    the end (termination or truncation)."""
    num_envs = 16
    env = gpusim.make("mountain_car_continuous", num_envs=num_envs, backend="cpu", seed=6)
    env.reset()
    gyms = [gymnasium.make("MountainCarContinuous-v0").unwrapped for _ in range(num_envs)]
    for e, gym_env in enumerate(gyms):
        gym_env.reset(seed=100 + e)
    env.set_state({"position": np.array([g.state[0] for g in gyms]),
                   "velocity": np.zeros(num_envs), "timestep": np.zeros(num_envs, np.int32)})
    rng = np.random.default_rng(7)
    # a bang-bang controller (push along the velocity: out of bounds, clipped, in even
    # replicas, exactly at the bounds, not clipped, in odd ones) with random pushes mixed
    # in: some episodes reach the goal, some are truncated
    finished = np.zeros(num_envs, dtype=bool)
    ends = {"terminated": 0, "truncated": 0}
    strength = np.where(np.arange(num_envs) % 2 == 0, 1.2, 1.0)
    for t in range(MAX_STEPS):
        push = np.array([1.0 if g.state[1] >= 0 else -1.0 for g in gyms]) * strength
        random = rng.random(num_envs) < np.linspace(0.0, 0.95, num_envs)
        push[random] = rng.uniform(-1.1, 1.1, int(random.sum()))
        actions = push.astype(np.float32).reshape(num_envs, 1, 1)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        for e, gym_env in enumerate(gyms):
            if finished[e]:
                continue
            want_obs, gym_reward, want_term, _, _ = gym_env.step(actions[e, 0])
            want_trunc = (not want_term) and t + 1 >= MAX_STEPS
            assert bool(terminated[e]) == want_term and bool(truncated[e]) == want_trunc, (t, e)
            assert reward[e, 0] == np.float32(gym_reward), (t, e)
            done = want_term or want_trunc
            got = info["final_obs"][e, 0] if done else obs[e, 0]
            assert np.array_equal(got.numpy(), want_obs), (t, e)
            finished[e] = done
            ends["terminated"] += want_term
            ends["truncated"] += want_trunc
        if finished.all():
            break
    assert finished.all() and ends["terminated"] > 0 and ends["truncated"] > 0, ends


def test_reference_follows_the_config():
    """A variant config reaches gymnasium through the reference (no built-in constants)."""
    config = dict(power=0.002, max_speed=0.05, goal_position=0.3, goal_velocity=0.01,
                  min_position=-1.0, max_episode_steps=50)
    env = gpusim.make("mountain_car_continuous", num_envs=32, backend="cpu", seed=5, **config)
    env.reset()
    reference = check_env_reference(env.config)
    rng = np.random.default_rng(8)
    seen_term = 0
    for _ in range(10):
        state = random_mountain_car_state(rng, 32, 50)
        state["position"] = np.clip(state["position"], -1.0, 0.6)
        actions = random_forces(rng, 32)
        want_term = step_matches_reference(env, reference, state, actions, PHYSICS)
        seen_term += int(want_term.sum())
    assert seen_term > 0


def test_reset_state_matches_the_spec():
    env = gpusim.make("mountain_car_continuous", num_envs=500, backend="cpu", seed=2)
    obs = env.reset()
    assert obs.shape == (500, 1, 2) and obs.dtype == torch.float32
    assert env.policies == {"agent": (0,)} and env.action_nvec == ()
    assert env.action_box.low == (-1.0,) and env.action_box.high == (1.0,)
    assert env.arrays["continuous_actions"].shape == (500, 1, 1)
    assert env.time_limit == MAX_STEPS
    state = env.get_state()
    assert set(state) == {"position", "velocity", "timestep"}
    assert (state["timestep"] == 0).all() and (state["velocity"] == 0).all()
    position = state["position"]
    assert position.dtype == torch.float64
    assert position.min() >= -0.6 and position.max() <= -0.4 and position.std() > 0.04
    assert not torch.equal(position, position.float().double())  # float64, as gymnasium's
    assert torch.equal(obs[:, 0, 0], position.float()) and (obs[:, 0, 1] == 0).all()
    # after a step, the state holds float32 values, as gymnasium's
    env.step(torch.full((500, 1, 1), 0.5))
    for value in env.get_state().values():
        assert torch.equal(value, value.float().to(value.dtype))


def test_check_env_passes_with_the_gymnasium_reference():
    env = gpusim.make("mountain_car_continuous", num_envs=8, backend="cpu", seed=0)
    result = check_env(env, reference=check_env_reference(env.config), steps=1010,
                       reference_steps=1010, compare_backend="cudasim", compare_steps=5,
                       verbose=False)
    assert result.ok, str(result)
    assert not result["reference"].skipped and not result["backends"].skipped


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_action_is_an_error_under_check_actions(bad):
    env = gpusim.make("mountain_car_continuous", num_envs=3, backend="cpu", check_actions=True)
    env.reset()
    actions = torch.zeros((3, 1, 1))
    actions[2, 0, 0] = bad
    with pytest.raises(ArrayError, match=r"not finite: actions\[2, 0, 0\]"):
        env.step(actions)
    with pytest.raises(ArrayError, match="float dtype"):
        env.step(torch.zeros((3, 1, 1), dtype=torch.int64))


@pytest.mark.parametrize("backend", ["cpu", "cudasim"])
def test_actions_at_and_beyond_the_bounds_and_non_finite_ones(backend):
    """The env sees the raw action (raw_continuous_actions): exactly at a bound it is
    gymnasium's float32 action, one ulp beyond it the Python float bound, and the state
    and reward are gymnasium's in each case; an infinite action is clipped as gymnasium
    clips it, its reward -inf as gymnasium's; NaN (refused under check_actions; gymnasium
    would carry it into its state) pushes as the low bound, its reward NaN as gymnasium's."""
    values = [1.0, -1.0, np.nextafter(np.float32(1), np.float32(2)),
              np.nextafter(np.float32(-1), np.float32(-2)), np.nextafter(np.float32(1), 0),
              1.3, -1.3, np.inf, -np.inf, np.nan]
    num_envs = 24 * len(values)
    env = gpusim.make("mountain_car_continuous", num_envs=num_envs, backend=backend, seed=3,
                      check_actions=False)
    env.reset()
    state = random_mountain_car_state(np.random.default_rng(9), num_envs, MAX_STEPS)
    state["timestep"][::2] = 0  # float64 steps (gymnasium's first) and float32 ones
    state["timestep"][1::2] = np.maximum(state["timestep"][1::2], 1)
    env.set_state(state)
    actions = np.repeat(np.array(values, dtype=np.float32), 24).reshape(num_envs, 1, 1)
    obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
    after = env.get_state()
    assert np.array_equal(env.arrays["continuous_actions"].cpu().numpy(), actions,
                          equal_nan=True)  # the action buffer holds them unclipped
    gym_env = gymnasium.make("MountainCarContinuous-v0").unwrapped
    gym_env.reset(seed=0)
    for e in range(num_envs):
        action = actions[e, 0]
        nan = bool(np.isnan(action[0]))
        gym_env.state = gym_state(state, e)
        # gymnasium with NaN: NaN state; the env pushes as with -1.0 (a Python float)
        want_obs, gym_reward, want_term, _, _ = gym_env.step(
            np.array([-np.inf], dtype=np.float32) if nan else action)
        if nan:
            assert np.isnan(float(reward[e, 0])), e
        else:
            assert reward[e, 0] == np.float32(gym_reward), (e, action)
        assert bool(terminated[e]) == want_term, (e, action)
        done = want_term or bool(truncated[e])
        got = info["final_obs"][e, 0] if done else obs[e, 0]
        assert np.array_equal(got.numpy(), want_obs), (e, action)
        if not done:
            assert [float(after[k][e]) for k in PHYSICS] == list(map(float, gym_env.state))


@pytest.mark.parametrize("data, message", [
    ({"min_position": 1.0}, "'min_position' must be below max_position"),
    ({"max_speed": 0.0}, "'max_speed' must be positive"),
    ({"power": -0.001}, "'power' must be >= 0"),
    ({"max_episode_steps": 0}, "'max_episode_steps' must be at least 1"),
    ({"reset_low": -0.3}, "'reset_low' must not exceed reset_high"),
    ({"reset_low": -2.0}, "the reset range must lie in"),
    ({"goal_position": "far"}, "'env.goal_position' must be a number"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        MountainCarContinuousConfig.load(**data)


def test_draw_a_frame():
    ax = draw_one_frame("mountain_car_continuous")
    assert ax.lines and ax.patches
