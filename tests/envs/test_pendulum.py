"""pendulum against gymnasium's own Pendulum-v1, step by step, by state injection (random
actions, out-of-bound ones included: clipping); whole episodes from gymnasium's own reset;
check_env with its reference (cpu, and cpu against cudasim); NaN actions; bad configs; a
frame."""
import math

import numpy as np
import pytest
import torch

import gpusim
from conftest import draw_one_frame, step_matches_reference
from gpusim.check import check_env
from gpusim.envs.pendulum.config import PendulumConfig
from gpusim.envs.pendulum.reference import check_env_reference
from gpusim.errors import ArrayError, ConfigError

gymnasium = pytest.importorskip("gymnasium")

PHYSICS = ("theta", "theta_dot")
MAX_STEPS = 200
MAX_TORQUE = 2.0
MAX_SPEED = 8.0


def random_pendulum_state(rng, num_envs, max_steps):
    """Angles over several turns (theta is never wrapped), speeds over and beyond the
    limit (the clip), timesteps over the episode and at its last step (truncations)."""
    timestep = rng.integers(0, max_steps, num_envs)
    timestep[rng.random(num_envs) < 0.2] = max_steps - 1
    return {"theta": rng.uniform(-3 * math.pi, 3 * math.pi, num_envs),
            "theta_dot": rng.uniform(-1.2, 1.2, num_envs) * MAX_SPEED,
            "timestep": timestep.astype(np.int32)}


def random_torques(rng, num_envs):
    """Uniform over a range 30% wider than the bounds, a few exactly at them or 0."""
    torque = rng.uniform(-1.3, 1.3, num_envs) * MAX_TORQUE
    pick = rng.random(num_envs)
    torque[pick < 0.05] = MAX_TORQUE
    torque[(pick >= 0.05) & (pick < 0.1)] = -MAX_TORQUE
    torque[(pick >= 0.1) & (pick < 0.12)] = 0.0
    return torque.astype(np.float32).reshape(num_envs, 1, 1)


@pytest.mark.parametrize("backend, num_envs, steps, refresh_every", [
    ("cpu", 16, 300, 20),
    ("cudasim", 2, 40, 4),
    pytest.param("numba", 256, 300, 20, marks=pytest.mark.gpu),
])
def test_matches_gymnasium(backend, num_envs, steps, refresh_every):
    env = gpusim.make("pendulum", num_envs=num_envs, backend=backend, seed=1)
    env.reset()
    gym_env = gymnasium.make("Pendulum-v1").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(5)
    state = random_pendulum_state(rng, num_envs, MAX_STEPS)
    seen = {"truncated": 0, "running": 0, "clipped_torque": 0, "clipped_speed": 0}
    for t in range(steps):
        if t % refresh_every == 0:
            state = random_pendulum_state(rng, num_envs, MAX_STEPS)
        env.set_state(state)
        actions = random_torques(rng, num_envs)
        obs, reward, terminated, truncated, info = env.step(
            torch.from_numpy(actions).to(env.device))
        obs, reward, terminated, truncated = (x.cpu() for x in (obs, reward, terminated,
                                                                 truncated))
        final_obs = info["final_obs"].cpu()
        after = {k: v.cpu().numpy() for k, v in env.get_state().items()}
        for e in range(num_envs):
            gym_env.state = np.array([state[k][e] for k in PHYSICS], dtype=np.float64)
            want_obs, want_reward, want_term, _, _ = gym_env.step(actions[e, 0])
            want_trunc = state["timestep"][e] + 1 >= MAX_STEPS
            assert not bool(terminated[e]) and not want_term, (t, e)
            assert bool(truncated[e]) == want_trunc, (t, e)
            assert abs(float(reward[e, 0]) - want_reward) <= 1e-5, (t, e)
            got = final_obs[e, 0] if want_trunc else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=1e-5)
            if not want_trunc:  # a finished replica has been reset already
                got_state = [float(after[k][e]) for k in PHYSICS]
                np.testing.assert_allclose(got_state, gym_env.state, rtol=0, atol=1e-5)
                assert after["timestep"][e] == state["timestep"][e] + 1
            seen["truncated"] += want_trunc
            seen["running"] += not want_trunc
            seen["clipped_torque"] += bool(abs(actions[e, 0, 0]) > MAX_TORQUE)
            seen["clipped_speed"] += bool(abs(gym_env.state[1]) == MAX_SPEED)
        state = after
    assert all(seen.values()), seen


def test_whole_episodes_follow_gymnasium_from_its_reset():
    """Episodes from gymnasium's own initial states, not re-injected: the float64 state
    keeps the trajectories together to the truncation."""
    num_envs = 16
    env = gpusim.make("pendulum", num_envs=num_envs, backend="cpu", seed=6)
    env.reset()
    gyms = [gymnasium.make("Pendulum-v1").unwrapped for _ in range(num_envs)]
    for e, gym_env in enumerate(gyms):
        gym_env.reset(seed=100 + e)
    env.set_state({"theta": np.array([g.state[0] for g in gyms]),
                   "theta_dot": np.array([g.state[1] for g in gyms]),
                   "timestep": np.zeros(num_envs, np.int32)})
    rng = np.random.default_rng(7)
    worst = 0.0
    for t in range(MAX_STEPS):
        # a swing-up controller (push along the velocity) with random torques mixed in
        push = np.array([np.sign(g.state[1]) * 2.5 for g in gyms])
        random = rng.random(num_envs) < np.linspace(0.0, 0.9, num_envs)
        push[random] = rng.uniform(-2.6, 2.6, int(random.sum()))
        actions = push.astype(np.float32).reshape(num_envs, 1, 1)
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        after = env.get_state()
        for e, gym_env in enumerate(gyms):
            want_obs, want_reward, _, _, _ = gym_env.step(actions[e, 0])
            want_trunc = t + 1 >= MAX_STEPS
            assert not bool(terminated[e]) and bool(truncated[e]) == want_trunc, (t, e)
            assert abs(float(reward[e, 0]) - want_reward) <= 1e-5, (t, e)
            got = info["final_obs"][e, 0] if want_trunc else obs[e, 0]
            np.testing.assert_allclose(got.numpy(), want_obs, rtol=0, atol=1e-5)
            if not want_trunc:
                got_state = np.array([float(after[k][e]) for k in PHYSICS])
                worst = max(worst, float(np.abs(got_state - gym_env.state).max()))
    assert worst <= 1e-5, worst


def test_reference_follows_the_config():
    """A variant config reaches gymnasium through the reference (no built-in constants)."""
    config = dict(g=9.81, m=1.3, l=0.8, max_torque=1.5, max_speed=6.0, dt=0.03,
                  max_episode_steps=50)
    env = gpusim.make("pendulum", num_envs=32, backend="cpu", seed=5, **config)
    env.reset()
    reference = check_env_reference(env.config)
    rng = np.random.default_rng(8)
    for _ in range(10):
        state = random_pendulum_state(rng, 32, 50)
        actions = (rng.uniform(-2.0, 2.0, (32, 1, 1))).astype(np.float32)
        step_matches_reference(env, reference, state, actions, PHYSICS, reward_atol=1e-5)
        assert env.get_state()["theta_dot"].abs().max() <= 6.0


def test_reset_state_matches_the_spec():
    env = gpusim.make("pendulum", num_envs=500, backend="cpu", seed=2)
    obs = env.reset()
    assert obs.shape == (500, 1, 3) and obs.dtype == torch.float32
    assert env.policies == {"agent": (0,)} and env.action_nvec == ()
    assert env.action_box.low == (-2.0,) and env.action_box.high == (2.0,)
    box = env.action_space["agent"]
    assert box.shape == (1,) and box.low[0] == -2.0 and box.high[0] == 2.0
    assert env.arrays["continuous_actions"].shape == (500, 1, 1)
    assert env.time_limit == MAX_STEPS
    state = env.get_state()
    assert set(state) == {"theta", "theta_dot", "timestep"}
    assert (state["timestep"] == 0).all()
    theta, theta_dot = state["theta"], state["theta_dot"]
    assert theta.dtype == theta_dot.dtype == torch.float64
    assert theta.abs().max() <= math.pi and theta.std() > 1.5
    assert theta_dot.abs().max() <= 1.0 and theta_dot.std() > 0.5
    want = np.stack([np.cos(theta.numpy()), np.sin(theta.numpy()), theta_dot.numpy()], axis=1)
    np.testing.assert_allclose(obs[:, 0].numpy(), want.astype(np.float32), rtol=0, atol=1e-7)


def test_check_env_passes_with_the_gymnasium_reference():
    env = gpusim.make("pendulum", num_envs=8, backend="cpu", seed=0)
    result = check_env(env, reference=check_env_reference(env.config), steps=210,
                       reference_steps=210, compare_backend="cudasim", compare_steps=5,
                       verbose=False)
    assert result.ok, str(result)
    assert not result["reference"].skipped and not result["backends"].skipped


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_action_is_an_error_under_check_actions(bad):
    env = gpusim.make("pendulum", num_envs=3, backend="cpu", check_actions=True)
    env.reset()
    actions = torch.zeros((3, 1, 1))
    actions[1, 0, 0] = bad
    with pytest.raises(ArrayError, match=r"not finite: actions\[1, 0, 0\]"):
        env.step(actions)
    with pytest.raises(ArrayError, match="float dtype"):
        env.step(torch.zeros((3, 1, 1), dtype=torch.int32))
    with pytest.raises(ArrayError, match="shape"):
        env.step(torch.zeros((3, 1, 2)))


def test_out_of_bound_actions_are_clipped_as_gymnasium_clips_them():
    """Far out of bounds (and infinite, without check_actions) is the bound itself."""
    env = gpusim.make("pendulum", num_envs=4, backend="cpu", check_actions=False)
    env.reset()
    state = {"theta": np.array([0.3, -1.0, 2.0, 0.3]),
             "theta_dot": np.array([1.0, -2.0, 0.5, 1.0]), "timestep": np.zeros(4, np.int32)}
    env.set_state(state)
    actions = torch.tensor([1e9, -float("inf"), float("inf"), 2.0]).view(4, 1, 1)
    obs, reward, *_ = env.step(actions)
    assert torch.equal(obs[0], obs[3]) and torch.equal(reward[0], reward[3])
    for e, torque in enumerate((2.0, -2.0, 2.0, 2.0)):
        gym_env = gymnasium.make("Pendulum-v1").unwrapped
        gym_env.reset(seed=0)
        gym_env.state = np.array([state["theta"][e], state["theta_dot"][e]])
        want_obs, want_reward, _, _, _ = gym_env.step(np.array([torque], dtype=np.float32))
        np.testing.assert_allclose(obs[e, 0].numpy(), want_obs, rtol=0, atol=1e-6)
        assert abs(float(reward[e, 0]) - want_reward) <= 1e-5


@pytest.mark.parametrize("data, message", [
    ({"max_torque": 0.0}, "'max_torque' must be positive"),
    ({"max_speed": -1.0}, "'max_speed' must be positive"),
    ({"dt": 0.0}, "'dt' must be positive"),
    ({"l": 0.0}, "'l' must be positive"),
    ({"g": -9.8}, "'g' must be >= 0"),
    ({"max_episode_steps": 0}, "'max_episode_steps' must be at least 1"),
    ({"init_theta": -1.0}, "'init_theta' must be >= 0"),
    ({"m": "heavy"}, "'env.m' must be a number"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        PendulumConfig.load(**data)


def test_draw_a_frame():
    ax = draw_one_frame("pendulum")
    assert ax.lines
