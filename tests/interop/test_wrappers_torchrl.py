"""The TorchRL adapter: specs, layout, device-resident data, auto-reset, seeding, and PPO.

The PPO example below is the one docs/interop.md shows, run verbatim.
"""
import importlib
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gpusim
from gpusim.errors import ConfigError, GpusimError

torchrl = pytest.importorskip("torchrl")
from torchrl.envs.utils import check_env_specs  # noqa: E402

from gpusim.wrappers.torchrl import TorchRLEnv, to_torchrl  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
TAG = dict(num_taggers=2, num_runners=3, num_other_agents_observed=2, episode_length=15)
# a small arena and a wide tag radius: runners are tagged (and leave play) within a few steps
TAGGY = dict(TAG, episode_length=40, grid_length=2.0, tagging_distance=0.2)
SHORT = {"max_episode_steps": 30}  # the classic-control envs' time limit
SMALL_CONFIGS = {"tag_continuous": TAGGY, "tag_gridworld": {"episode_length": 15},
                 "acrobot": SHORT, "mountain_car": SHORT, "mountain_car_continuous": SHORT,
                 "pendulum": SHORT, "cartpole": SHORT}
# every registered env (small where it is large), and a few variants
ENVS = [(name, SMALL_CONFIGS.get(name, {})) for name in gpusim.env_names()] + [
    ("tag_continuous", TAG), ("tag_continuous", dict(TAGGY, continuous_actions=True)),
    ("mixed_team_env:MixedTeam", {})]
ENV_IDS = list(gpusim.env_names()) + ["tag_continuous-K2", "tag_continuous-Box", "mixed_team"]

# What docs/interop.md shows: a rollout, and PPO in two parts so a test can look between them.
EXAMPLE_ROLLOUT = '''\
import gpusim
from gpusim.wrappers import to_torchrl

env = to_torchrl(gpusim.make("tag_continuous", num_envs=64, backend="cpu",
                             num_taggers=2, num_runners=3))
rollout = env.rollout(100, break_when_any_done=False)  # random actions
print(rollout["next", "tagger", "reward"].shape)  # torch.Size([64, 100, 2, 1])
'''
EXAMPLE_SETUP = '''\
import torch
from torch import nn
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import RewardSum, TransformedEnv
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import gpusim
from gpusim.wrappers import to_torchrl

torch.manual_seed(0)
# 16 cartpole replicas, one batch on the env's device; RewardSum adds ("next", "episode_reward")
env = TransformedEnv(to_torchrl(gpusim.make("cartpole", num_envs=16, backend="cpu", seed=0)),
                     RewardSum())
actor = ProbabilisticActor(
    TensorDictModule(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2)),
                     in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"], spec=env.action_spec,
    distribution_class=torch.distributions.Categorical, return_log_prob=True)
critic = ValueOperator(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)),
                       in_keys=["observation"])
advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01)
optimizer = torch.optim.Adam(loss_fn.parameters(), lr=3e-3)
'''
EXAMPLE_TRAIN = '''\


def train(iterations, steps_per_env=64, epochs=4, minibatch_size=256):
    """PPO on batches of (num_envs, steps_per_env) transitions.

    Returns the mean return of the episodes finished in each batch (nan if none did)
    and the last loss.
    """
    num_envs = env.batch_size[0]
    collector = Collector(env, actor, frames_per_batch=num_envs * steps_per_env,
                          total_frames=num_envs * steps_per_env * iterations,
                          auto_register_policy_transforms=False)  # feed-forward: no InitTracker
    mean_returns = []
    for batch in collector:  # batch_size (num_envs, steps_per_env): time is the last dim
        with torch.no_grad():
            advantage(batch)
        transitions = batch.reshape(-1)
        for _ in range(epochs):
            for minibatch in transitions[torch.randperm(len(transitions))].split(minibatch_size):
                losses = loss_fn(minibatch)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        finished = batch["next", "done"].squeeze(-1)
        mean_returns.append(batch["next", "episode_reward"][finished].mean().item())
    collector.shutdown()
    return mean_returns, loss.item()


mean_returns, last_loss = train(iterations=4)
'''
EXAMPLE = EXAMPLE_SETUP + EXAMPLE_TRAIN


@pytest.fixture(autouse=True)
def same_random_actions():
    torch.manual_seed(0)  # rand_action draws from torch's global RNG


def make(name="cartpole", num_envs=4, seed=0, **config):
    return gpusim.make(name, num_envs=num_envs, backend="cpu", seed=seed, **config)


def near_episode_end(tenv, steps_left=2):
    """A root TensorDict `steps_left` steps before every replica's time limit."""
    td = tenv.reset()
    for _ in range(tenv.env.time_limit - steps_left):
        _, td = tenv.step_and_maybe_reset(tenv.rand_action(td))
    return td


class StepSpy:
    """Wraps a gpusim env's step and reset: records the actions and counts resets."""

    def __init__(self, env, monkeypatch):
        self.actions, self.resets, self.infos = [], 0, []
        step, reset = env.step, env.reset

        def spy_step(actions):
            self.actions.append(actions)
            result = step(actions)
            self.infos.append(result)
            return result

        def spy_reset(seed=None):
            self.resets += 1
            return reset(seed=seed)

        monkeypatch.setattr(env, "step", spy_step)
        monkeypatch.setattr(env, "reset", spy_reset)


# ---- specs and layout ------------------------------------------------------------------
@pytest.mark.parametrize("name, config", ENVS, ids=ENV_IDS)
def test_check_env_specs(name, config):
    tenv = to_torchrl(make(name, **config))
    check_env_specs(tenv, break_when_any_done="both")
    if tenv.env.time_limit is not None:  # again where episodes end inside the check's rollout
        check_env_specs(tenv, tensordict=near_episode_end(tenv), break_when_any_done=False)


def test_batch_size_device_and_multi_agent_layout():
    genv = make("tag_continuous", num_envs=5, **TAG)
    tenv = to_torchrl(genv)
    assert isinstance(tenv, TorchRLEnv) and isinstance(tenv, torchrl.envs.EnvBase)
    assert tenv.batch_size == torch.Size([5]) and tenv.device == genv.device
    td = tenv.step(tenv.rand_action(tenv.reset()))
    for group, n in (("tagger", 2), ("runner", 3)):
        assert td[group, "observation"].shape == (5, n, genv.obs_dim)
        assert td[group, "action"].shape == (5, n, 2)  # MultiCategorical over action_nvec
        assert td["next", group, "reward"].shape == (5, n, 1)
        for key in ("done", "terminated", "truncated"):  # each agent's own
            assert td["next", group, key].shape == (5, n, 1)
            assert td["next", group, key].dtype == torch.bool
        assert td["next", group, "mask"].shape == (5, n)  # per-agent done: who is in play
    for key in ("done", "terminated", "truncated"):  # the replica's
        assert td["next", key].shape == (5, 1) and td["next", key].dtype == torch.bool
    assert list(tenv.action_spec["tagger", "action"].nvec[0, 0]) == [21, 21]
    assert tenv.group_map == {"tagger": ["tagger_0", "tagger_1"],
                              "runner": ["runner_0", "runner_1", "runner_2"]}


def test_single_agent_is_flat_unless_asked():
    flat = to_torchrl(make("cartpole"))
    td = flat.step(flat.rand_action(flat.reset()))
    assert td["observation"].shape == (4, 4) and td["action"].shape == (4,)
    assert td["next", "reward"].shape == (4, 1)
    assert set(td["next"].keys()) == {"observation", "reward", "done", "terminated", "truncated"}
    assert isinstance(flat.action_spec, torchrl.data.Categorical) and flat.action_spec.space.n == 2

    grouped = to_torchrl(make("cartpole"), flatten_single_agent=False)
    td = grouped.step(grouped.rand_action(grouped.reset()))
    assert td["agent", "observation"].shape == (4, 1, 4) and td["agent", "action"].shape == (4, 1)
    assert td["next", "agent", "reward"].shape == (4, 1, 1)
    check_env_specs(grouped)


def test_groups_of_scattered_agents_map_to_their_ids(monkeypatch):
    genv = make("tag_continuous", **TAG, tagger_ids=(3, 1))
    tenv = to_torchrl(genv)
    assert tenv.group_map == {"tagger": ["tagger_0", "tagger_1"],  # in agent-id order
                              "runner": ["runner_0", "runner_1", "runner_2"]}
    assert genv.agent_names == ("runner_0", "tagger_0", "runner_1", "tagger_1", "runner_2")
    spy = StepSpy(genv, monkeypatch)
    td = tenv.reset()
    assert torch.equal(td["tagger", "observation"], genv.arrays["obs"][:, [1, 3]])
    assert torch.equal(td["runner", "observation"], genv.arrays["obs"][:, [0, 2, 4]])
    td = tenv.step(tenv.rand_action(td))
    actions = spy.actions[-1]  # one tensor per policy, its agents in agent-id order
    assert torch.equal(actions["tagger"], td["tagger", "action"])
    assert torch.equal(actions["runner"], td["runner", "action"])
    reward = spy.infos[-1][1]
    assert torch.equal(td["next", "tagger", "reward"][..., 0], reward[:, [1, 3]])
    check_env_specs(tenv)


def test_box_actions_reach_gpusim_as_given():
    genv = make("pendulum")
    tenv = to_torchrl(genv)
    assert isinstance(tenv.action_spec, torchrl.data.Bounded)
    assert tenv.action_spec.space.high.flatten().tolist() == [2.0] * 4
    td = tenv.reset()
    td["action"] = torch.tensor([[-9.0], [-1.0], [0.5], [9.0]])
    tenv.step(td)
    assert genv.arrays["continuous_actions"][:, 0, 0].tolist() == [-2.0, -1.0, 0.5, 2.0]


def test_policies_that_observe_and_act_differently_are_groups_of_their_own():
    tenv = to_torchrl(make("mixed_team_env:MixedTeam"))
    td = tenv.step(tenv.rand_action(tenv.reset()))
    assert td["glider", "observation"].shape == (4, 2, 2)  # policy_obs_dim 2
    assert td["stepper", "observation"].shape == (4, 1, 3)
    glider = td["glider", "action"]
    assert glider.dtype == torch.float32 and glider.shape == (4, 2, 1)
    assert td["stepper", "action"].dtype == torch.int64 and td["stepper", "action"].shape == (4, 1)
    assert tenv.group_map == {"glider": ["glider_0", "glider_1"], "stepper": ["stepper_2"]}


def test_each_agent_is_done_from_the_step_it_leaves_play():
    """Against env.agent_active() of a twin env stepped with the rollout's actions: an
    agent out of play is terminated (and masked out) until its replica's episode ends,
    when every agent still in play ends as the replica does."""
    tenv = to_torchrl(make("tag_continuous", num_envs=6, **TAGGY))
    twin = make("tag_continuous", num_envs=6, **TAGGY)
    rollout = tenv.rollout(120, break_when_any_done=False)
    twin.reset()
    ids = {group: list(twin.policy_specs[group].agent_ids) for group in ("tagger", "runner")}
    left_mid_episode = 0
    for t in range(120):
        before = twin.agent_active().clone()
        _, _, terminated, truncated, info = twin.step(
            {group: rollout[group, "action"][:, t] for group in ids})
        after = twin.agent_active()
        ended = info["reset_mask"][:, None]
        expected = {"terminated": torch.where(ended, terminated[:, None] | ~before, ~after),
                    "truncated": ended & truncated[:, None] & before,
                    "mask": torch.where(ended, before, after)}
        expected["done"] = expected["terminated"] | expected["truncated"]
        for group, agents in ids.items():
            for key, value in expected.items():
                got = rollout["next", group, key][:, t]
                assert torch.equal(got.reshape(value[:, agents].shape), value[:, agents]), (t, key)
        assert torch.equal(rollout["next", "done"][:, t, 0], info["reset_mask"])
        left_mid_episode += int((before & ~after & ~ended).sum())
    assert left_mid_episode >= 20


# ---- device-resident data --------------------------------------------------------------
def test_steps_keep_data_on_device_with_no_host_copies(monkeypatch):
    tenv = to_torchrl(make("tag_continuous", **TAG))

    def no_host_copy(*args, **kwargs):
        raise AssertionError("a step copied data to the host")

    td = tenv.reset()
    for method in ("numpy", "tolist", "item"):
        monkeypatch.setattr(torch.Tensor, method, no_host_copy)
    rollout = tenv.rollout(20, break_when_any_done=False, tensordict=td, auto_reset=False)
    monkeypatch.undo()
    assert bool(rollout["next", "done"].any())  # auto-resets happened in there too
    for key, value in rollout.items(include_nested=True, leaves_only=True):
        assert isinstance(value, torch.Tensor) and value.device == tenv.device, key


def test_actions_reach_gpusim_without_a_copy(monkeypatch):
    genv = make("cartpole")
    tenv = to_torchrl(genv)
    spy = StepSpy(genv, monkeypatch)
    td = tenv.rand_action(tenv.reset())
    tenv.step(td)
    assert spy.actions[-1].data_ptr() == td["action"].data_ptr()


def test_returned_data_outlives_the_next_step():
    """TorchRL keeps what `_step` and `_reset` return: none of it may be a gpusim buffer."""
    genv = make("tag_continuous", **TAG)
    tenv = to_torchrl(genv)
    rollout = tenv.rollout(20, break_when_any_done=False)
    buffers = {t.untyped_storage().data_ptr() for t in genv.arrays.tensors.values()}
    for key, value in rollout.items(include_nested=True, leaves_only=True):
        assert value.untyped_storage().data_ptr() not in buffers, key
    # The observation at t+1 is the next observation at t, wherever no episode ended.
    running = ~rollout["next", "done"][:, :-1, 0]
    for group in ("tagger", "runner"):
        now = rollout[group, "observation"][:, 1:]
        before = rollout["next", group, "observation"][:, :-1]
        assert torch.equal(now[running], before[running])


# ---- auto-reset ------------------------------------------------------------------------
def test_finished_replicas_give_their_final_obs_then_gpusim_fresh_state(monkeypatch):
    """Against a twin gpusim env: next obs is the final one, the reset hands out gpusim's own."""
    genv, twin = make("cartpole", num_envs=8), make("cartpole", num_envs=8)
    tenv = to_torchrl(genv)
    spy = StepSpy(genv, monkeypatch)
    td = tenv.reset()
    assert torch.equal(td["observation"], twin.reset()[:, 0])
    partial_resets = 0
    for t in range(60):
        action = torch.full((8,), t % 2 * (t // 20 % 2), dtype=torch.int64)  # poles fall soon
        out, td = tenv.step_and_maybe_reset(td.set("action", action))
        obs, reward, terminated, truncated, info = twin.step(action.view(8, 1, 1))
        finished = info["reset_mask"]
        assert torch.equal(out["next", "done"][:, 0], finished)
        assert torch.equal(out["next", "terminated"][:, 0], terminated)
        assert torch.equal(out["next", "reward"][:, 0], reward[:, 0])
        expected_next = torch.where(finished[:, None], info["final_obs"][:, 0], obs[:, 0])
        assert torch.equal(out["next", "observation"], expected_next)
        assert torch.equal(td["observation"], obs[:, 0])  # finished: gpusim's fresh state
        assert not bool(td["done"].any())
        partial_resets += bool(finished.any()) and not bool(finished.all())
    assert partial_resets >= 3
    assert spy.resets == 1  # the first reset only: no kernel for the partial resets


def test_episodes_ending_together_are_not_reset_twice(monkeypatch):
    genv = make("tag_gridworld", episode_length=3)
    tenv = to_torchrl(genv)
    td = near_episode_end(tenv, steps_left=1)
    spy = StepSpy(genv, monkeypatch)
    out, td = tenv.step_and_maybe_reset(tenv.rand_action(td))
    assert bool(out["next", "truncated"].all())
    assert spy.resets == 0
    assert torch.equal(td["tagger", "observation"], genv.arrays["obs"][:, :3])


def test_reset_of_a_running_replica_is_refused_and_a_full_reset_runs_the_kernel(monkeypatch):
    genv = make("tag_continuous", **TAG)
    tenv = to_torchrl(genv)
    _, td = tenv.step_and_maybe_reset(tenv.rand_action(tenv.reset()))
    spy = StepSpy(genv, monkeypatch)
    partial = torch.tensor([[True], [False], [False], [False]])
    with pytest.raises(GpusimError, match="only when its episode ends"):
        tenv.reset(td.set("_reset", partial))
    td = tenv.reset(td.set("_reset", torch.ones(4, 1, dtype=torch.bool)))
    assert spy.resets == 1
    tenv.reset()
    assert spy.resets == 2


# ---- seeding ---------------------------------------------------------------------------
def rollout_obs(tenv, seed, steps=30):
    tenv.set_seed(seed)
    torch.manual_seed(0)  # the random actions
    rollout = tenv.rollout(steps, break_when_any_done=False)
    return rollout["tagger", "observation"], rollout["next", "runner", "observation"]


def test_set_seed_then_reset_starts_where_gpusim_reset_seed_does():
    tenv = to_torchrl(make("tag_continuous", seed=3, **TAG))
    assert isinstance(tenv.set_seed(7), int)
    td = tenv.reset()
    expected = make("tag_continuous", seed=3, **TAG).reset(seed=7)
    assert torch.equal(td["tagger", "observation"], expected[:, :2])
    assert torch.equal(td["runner", "observation"], expected[:, 2:])


def test_seeding_is_deterministic():
    tenv = to_torchrl(make("tag_continuous", **TAG))
    first, again, other = rollout_obs(tenv, 7), rollout_obs(tenv, 7), rollout_obs(tenv, 8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


# ---- errors ----------------------------------------------------------------------------
def test_missing_torchrl_says_what_to_install(monkeypatch):
    import gpusim.wrappers
    for name in [name for name in sys.modules if name.split(".")[0] == "torchrl"] + ["torchrl"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, "gpusim.wrappers.torchrl")
    with pytest.raises(GpusimError, match=re.escape("pip install 'gpusim[interop]'")):
        importlib.import_module("gpusim.wrappers.torchrl")
    with pytest.raises(GpusimError, match="to_torchrl needs torchrl"):
        gpusim.wrappers.to_torchrl(make())


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ConfigError, match="unknown to_torchrl option 'flatten'"):
        to_torchrl(make(), flatten=False)
    with pytest.raises(GpusimError, match="takes a gpusim env"):
        to_torchrl(object())
    with pytest.raises(ConfigError, match="seed"):
        to_torchrl(make()).set_seed(-1)


# ---- the examples ----------------------------------------------------------------------
def test_rollout_example(capsys):
    exec(compile(EXAMPLE_ROLLOUT, "interop.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "torch.Size([64, 100, 2, 1])"


# torchrl.collectors warns about its own weight updaters on import: not ours to fix.
quiet_collectors = pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater:DeprecationWarning")


@quiet_collectors
def test_ppo_example_updates_the_policy():
    namespace = {}
    exec(compile(EXAMPLE_SETUP, "interop.md", "exec"), namespace)
    before = [p.detach().clone() for p in namespace["loss_fn"].parameters()]
    exec(compile(EXAMPLE_TRAIN, "interop.md", "exec"), namespace)
    assert math.isfinite(namespace["last_loss"])
    assert len(namespace["mean_returns"]) == 4
    after = list(namespace["loss_fn"].parameters())
    assert all(not torch.equal(b, a) for b, a in zip(before, after))


def test_docs_show_the_tested_example():
    text = DOCS.read_text() if DOCS.is_file() else ""
    if "## TorchRL" not in text:
        pytest.skip("docs/interop.md has no TorchRL section yet")
    assert EXAMPLE_ROLLOUT in text and EXAMPLE in text


@pytest.mark.slow
@pytest.mark.learning
@quiet_collectors
def test_ppo_example_learns_cartpole():
    namespace = {}
    exec(compile(EXAMPLE, "interop.md", "exec"), namespace)  # 4 iterations, then 36 more
    mean_returns = namespace["mean_returns"] + namespace["train"](iterations=36)[0]
    first, last = np.nanmean(mean_returns[:3]), np.nanmean(mean_returns[-5:])
    print(f"\nmean return per batch: {np.round(mean_returns, 1).tolist()}\n"
          f"first 3 batches {first:.1f}, last 5 batches {last:.1f}")
    assert last > 100 and last > 3 * first
