"""The MPE scenarios under test, their configs, random states and actions, and the
comparison of one gpusim step with mpe2's (tests/test_mpe*.py)."""
import importlib

import numpy as np
import torch

import gpusim

SCENARIOS = ("simple", "simple_adversary", "simple_crypto", "simple_push", "simple_reference",
             "simple_speaker_listener", "simple_spread", "simple_tag", "simple_world_comm")
# mpe2's module of each (their version suffixes differ)
MPE2_MODULES = {name: f"{name}_v4" if name == "simple_speaker_listener" else f"{name}_v3"
                for name in SCENARIOS}
# further configs: counts, partial observation, reward options (stepped on the kernels the
# default config compiled: a config changes shapes and parameters, not the code)
VARIANTS = {
    "simple_adversary": (dict(N=4, num_agent_neighbors=2, num_landmark_neighbors=3),),
    "simple_reference": (dict(local_ratio=0.2),),
    "simple_spread": (dict(N=6, local_ratio=0.25, curriculum=True),
                      dict(N=5, num_agent_neighbors=2, num_landmark_neighbors=7)),
    "simple_tag": (dict(num_good=3, num_adversaries=2, num_obstacles=0),
                   dict(num_good=2, num_adversaries=4, num_obstacles=3, num_agent_neighbors=3,
                        num_landmark_neighbors=2, curriculum=True)),
    "simple_world_comm": (dict(num_good=3, num_adversaries=2, num_obstacles=2, num_food=3,
                               num_forests=3),
                          dict(num_adversaries=1, num_forests=0, num_obstacles=0)),
}
TOLERANCE = 1e-4  # the bound on observations and rewards


class Envs:
    """Built envs shared by a test module: one compile per (scenario, action mode, backend)."""

    def __init__(self):
        self.built = {}

    def get(self, name, continuous=False, backend="cpu", num_envs=16, **config):
        key = (name, continuous, backend, num_envs, tuple(sorted(config.items())))
        if key not in self.built:
            self.built[key] = gpusim.make(name, num_envs=num_envs, backend=backend, seed=7,
                                          continuous_actions=continuous, **config)
        return self.built[key]


def reference(name, config):
    """mpe2 stepped from gpusim's states (the scenario's `check_env_reference`)."""
    module = importlib.import_module(f"gpusim.envs.{name}.reference")
    return module.check_env_reference(config)


def as_numpy(state):
    return {k: v.cpu().numpy().copy() for k, v in state.items()}


def random_state(env, rng):
    """A random state of every replica, biased towards contact: some agents sit next to
    another agent or a landmark (contact forces, collisions, forests, food), some beyond
    the [-1, 1] square (bound penalties), velocities beyond the speed limits, and
    timesteps over the episode with many at its last step (truncations)."""
    state = as_numpy(env.get_state())
    num_envs, n = state["pos"].shape[:2]
    landmarks = state["landmark_pos"].shape[1]
    pos = rng.uniform(-1.3, 1.3, (num_envs, n, 2))
    landmark_pos = rng.uniform(-1.1, 1.1, (num_envs, landmarks, 2))
    pick = rng.random((num_envs, n))
    partner = rng.integers(0, n, (num_envs, n))
    near = pick < 0.3
    pos[near] = pos[np.nonzero(near)[0], partner[near]] + rng.uniform(-0.25, 0.25, (near.sum(), 2))
    if landmarks:
        near = (pick >= 0.3) & (pick < 0.55)
        which = rng.integers(0, landmarks, near.sum())
        pos[near] = landmark_pos[np.nonzero(near)[0], which] + rng.uniform(-0.35, 0.35,
                                                                          (near.sum(), 2))
    state["pos"] = pos.astype(np.float32)
    state["landmark_pos"] = landmark_pos.astype(np.float32)
    state["vel"] = rng.uniform(-1.6, 1.6, (num_envs, n, 2)).astype(np.float32)
    last = env.config.max_cycles - 1
    timestep = rng.integers(0, last + 1, num_envs)
    timestep[rng.random(num_envs) < 0.25] = last
    state["timestep"] = timestep.astype(np.int32)
    for name, count in env.index_ranges().items():
        state[name] = rng.integers(0, count, state[name].shape).astype(np.int32)
    return state


def random_actions(env, rng):
    """Per policy: uniform discrete actions; continuous ones uniform over a range 10% wider
    than [0, 1] (clipping), and all zeros for a tenth of the agents (silence)."""
    actions = {}
    for name, spec in env.policy_specs.items():
        shape = (env.num_envs, spec.num_agents)
        if spec.continuous:
            drawn = rng.uniform(-0.1, 1.1, shape + (spec.action_width,)).astype(np.float32)
            drawn[rng.random(shape) < 0.1] = 0.0
        else:
            drawn = np.stack([rng.integers(0, n, shape) for n in spec.actions], -1)
        actions[name] = drawn.astype(np.float32 if spec.continuous else np.int32)
    return actions


def step_both(env, mpe2, state, actions):
    """Step `env` from its current state (which must be `state`) and mpe2 from `state` with
    the same actions; assert that they agree; return (env's state after, done, rewards)."""
    want_state, want_obs, want_reward, want_term, want_trunc = mpe2(state, actions)
    obs, reward, terminated, truncated, info = env.step(
        {k: torch.from_numpy(v).to(env.device) for k, v in actions.items()})
    done = want_term | want_trunc
    assert np.array_equal(terminated.cpu().numpy(), want_term)
    assert np.array_equal(truncated.cpu().numpy(), want_trunc)
    got = torch.where(torch.from_numpy(done)[:, None, None].to(env.device), info["final_obs"],
                      obs).cpu().numpy()
    np.testing.assert_allclose(got, want_obs, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(reward.cpu().numpy(), want_reward, rtol=0, atol=TOLERANCE)
    after = as_numpy(env.get_state())
    for key in ("pos", "vel"):
        np.testing.assert_allclose(after[key][~done], want_state[key][~done], rtol=0,
                                   atol=TOLERANCE)
    assert np.array_equal(after["timestep"][~done], want_state["timestep"][~done])
    assert np.all(after["timestep"][done] == 0)
    return after, done, want_reward
