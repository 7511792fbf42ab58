"""`gpusim.load_policies`: a run's trained policies act anywhere, without an env, as they act
in gpusim; and `python -m gpusim.evaluate --deterministic / --trained_only`."""
import json

import numpy as np
import pytest
import torch

import gpusim
from gpusim.errors import GpusimError
from gpusim.spaces import agent_index
from gpusim.training.actors import Actors
from gpusim.training.algorithms import algorithm_class
from gpusim.training.records import checkpoint
from gpusim.training.run_config import load_run_dir_config
from gpusim.training.trained import evaluation
from trained_runs import KINDS, TrainedRuns


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return TrainedRuns(tmp_path_factory.mktemp("policies"))


def test_loading_builds_no_env_and_compiles_nothing(runs, monkeypatch):
    run_dir = runs.get("central")

    def refuse(*args, **kwargs):
        raise AssertionError("an env was built or a kernel compiled")
    monkeypatch.setattr(gpusim.Env, "__init__", refuse)
    monkeypatch.setattr(gpusim.backends.Backend, "compile", refuse)
    policies = gpusim.load_policies(run_dir)
    (policy,) = policies.values()
    # the central critic (every agent's observation) is not loaded: only the actor
    assert not any("critic" in key for key in policy.model.state_dict())
    assert policy.agent_names == ("agent_0", "agent_1", "agent_2")
    assert policies.by_agent["agent_1"] is policy
    action, state = policy.act(np.zeros((3, 18), np.float32))
    assert state is None and action.shape == (3, 5) and action.dtype == np.float32
    assert ((0 <= action) & (action <= 1)).all()


def built_env(run_dir, num_envs=3):
    cls, config = load_run_dir_config(run_dir)
    return cls(num_envs=num_envs, backend="cpu", seed=1, config=config.env), config


def full_models(run_dir, env, config):
    """The trained networks whole (critics too), as gpusim's own acting builds them."""
    state = checkpoint.load_latest(run_dir / "checkpoints")["algorithm"]
    algorithm = algorithm_class(config.trainer.algorithm)
    models = {}
    for name, spec in env.policy_specs.items():
        models[name] = algorithm.acting_model(config, env, spec).to(env.device)
        models[name].load_state_dict(state["models"][name])
    return {name: model.eval() for name, model in models.items()}


def env_actions(env, name, agents):
    spec = env.policy_specs[name]
    array = env.arrays["continuous_actions" if spec.continuous else "actions"]
    return array[:, agents, :spec.action_width]


@pytest.mark.parametrize("kind", list(KINDS))
def test_deterministic_actions_are_those_gpusim_takes(runs, kind):
    """Step a built env with the whole trained networks through gpusim's actors and check,
    at every step, every policy's `act(deterministic=True)` on the same observations."""
    run_dir = runs.get(kind)
    policies = gpusim.load_policies(run_dir)
    env, config = built_env(run_dir)
    actors = Actors(env, full_models(run_dir, env, config))
    states = {name: None for name in policies}
    obs = env.reset()
    for _ in range(6):
        actors.act(obs, deterministic=True)
        mask = env.action_mask()
        for name, policy in policies.items():
            spec = env.policy_specs[name]
            agents = agent_index(spec.agent_ids, env.device)
            own_mask = None if mask is None else mask[:, agents, :sum(spec.actions)]
            action, states[name] = policy.act(obs[:, agents, :spec.obs_dim], True,
                                              states[name], own_mask)
            want = env_actions(env, name, agents)
            torch.testing.assert_close(action.to(want.dtype), want, rtol=0, atol=1e-6)
        obs, _, terminated, truncated, _ = env.step()
        done = (terminated | truncated)[:, None, None]
        states = {name: None if s is None else s * ~done for name, s in states.items()}


@pytest.mark.parametrize("kind", ["ppo", "gru", "masked", "gaussian", "sac", "mixed"])
def test_sampled_actions_lie_in_the_action_space(runs, kind):
    policies = gpusim.load_policies(runs.get(kind))
    torch.manual_seed(0)
    for policy in policies.values():
        space, spec = policy.action_space, policy.spec
        obs = np.random.default_rng(0).normal(size=(64, spec.obs_dim)).astype(np.float32)
        state = policy.initial_state(64)
        mask = None
        if policy.masked:  # a random legal set, never empty
            mask = np.random.default_rng(1).random((64, sum(spec.actions))) < 0.5
            mask[:, 0] = True
        action, state = policy.act(obs, state=state, mask=mask)
        assert action.shape == (64, spec.action_width)
        assert all(space.contains(a) for a in action.astype(space.dtype))
        if mask is not None:
            assert mask[np.arange(64), action[:, 0]].all()
        assert (state is None) == (not policy.recurrent)
        if not spec.continuous:  # sampled, not the argmax every time
            assert len(np.unique(action[:, 0])) > 1


def test_one_observation_numpy_or_torch(runs):
    policy = gpusim.load_policies(runs.get("gru"))["agent"]
    action, state = policy.act(np.zeros(4, np.float32), deterministic=True)
    assert action.shape == (1,) and action.dtype == np.int64 and state.shape == (8,)
    again, state2 = policy.act(torch.zeros(4), deterministic=True,
                               state=policy.initial_state())
    assert isinstance(again, torch.Tensor) and int(again[0]) == int(action[0])
    np.testing.assert_array_equal(state2.numpy(), state)
    assert policy.initial_state(5).shape == (5, 8) and policy.recurrent
    assert gpusim.load_policies(runs.get("ppo"))["agent"].initial_state(5) is None
    assert "recurrent" in repr(policy)


def test_spaces_are_the_envs(runs):
    env, _ = built_env(runs.get("mixed"), 1)
    for name, policy in gpusim.load_policies(runs.get("mixed")).items():
        assert policy.observation_space == env.observation_space[name]
        assert policy.action_space == env.action_space[name]


@pytest.mark.parametrize("call, phrase", [
    (lambda p: p["nope"], "has no policy 'nope' (its policies: agent)"),
    (lambda p: p.by_agent["agent_9"], "has no agent 'agent_9' (its agents: agent_0)"),
    (lambda p: p["agent"].act(np.zeros(5)), "obs must have shape (..., 4), got (5,)"),
    (lambda p: p["agent"].act(np.float32(1)), "obs must have shape (..., 4), got ()"),
    (lambda p: p["agent"].act(["a", "b", "c", "d"]), "obs must be an array of numbers"),
    (lambda p: p["agent"].act(np.zeros(4, bool)), "obs must hold real numbers"),
    (lambda p: p["agent"].act(np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]])),
     "obs[1, 1] is nan: it acts on finite observations only"),
    (lambda p: p["agent"].act(np.zeros(4), state=np.zeros(8)), "has no recurrent state"),
    (lambda p: p["agent"].act(np.zeros((2, 4)), mask=np.ones((2, 3), bool)),
     "mask must have shape (2, 2)"),
])
def test_bad_input_is_one_line(runs, call, phrase):
    with pytest.raises(GpusimError) as err:
        call(gpusim.load_policies(runs.get("ppo")))
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_bad_state_mask_and_device(runs):
    recurrent = gpusim.load_policies(runs.get("gru"))["agent"]
    with pytest.raises(GpusimError, match=r"state must have shape \(2, 8\)"):
        recurrent.act(np.zeros((2, 4)), state=np.zeros((3, 8)))
    box = gpusim.load_policies(runs.get("gaussian"))["agent"]
    with pytest.raises(GpusimError, match="acts in a Box: it takes no mask"):
        box.act(np.zeros(3), mask=np.ones(1, bool))
    with pytest.raises(GpusimError, match="device 'nope' is not available"):
        gpusim.load_policies(runs.get("ppo"), device="nope")


def test_a_run_without_a_checkpoint_or_config(runs, tmp_path):
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(runs.get("ppo"), run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(GpusimError, match="no checkpoint found"):
        gpusim.load_policies(run_dir)
    with pytest.raises(GpusimError, match="is not a run directory"):
        gpusim.load_policies(tmp_path)


# ---- evaluation ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["masked", "gru_gaussian"])
def test_greedy_policies_draw_their_most_likely_action(runs, kind):
    """Evaluation's --deterministic: a trained policy acts greedily beside random ones."""
    run_dir = runs.get(kind)
    env, config = built_env(run_dir)
    greedy = {name: evaluation.Greedy(model, env.policy_specs[name])
              for name, model in evaluation.load_policies(run_dir, env).items()}
    first = next(iter(greedy))
    actors = Actors(env, {first: greedy[first]})  # the others act at random
    obs = env.reset()
    policy = gpusim.load_policies(run_dir)[first]
    spec = env.policy_specs[first]
    agents = agent_index(spec.agent_ids, env.device)
    mask = env.action_mask()
    actors.act(obs)  # not asked to be deterministic: it is anyway
    want, _ = policy.act(obs[:, agents, :spec.obs_dim], True,
                         mask=None if mask is None else mask[:, agents])
    torch.testing.assert_close(env_actions(env, first, agents), want.to(
        env_actions(env, first, agents).dtype), rtol=0, atol=1e-6)


# (tool, argv after the run directory, what eval.json or the export folder holds)
CLI_ROWS = [
    ("evaluate", ["--deterministic", "--episodes", "4"],
     lambda out: out["deterministic"] and list(out["pairings"]) == [
         "tagger trained, runner trained", "tagger trained, runner random",
         "tagger random, runner trained", "tagger random, runner random"]),
    ("evaluate", ["--deterministic", "--trained_only", "--episodes", "4"],
     lambda out: list(out["pairings"]) == ["tagger trained, runner trained"]),
    ("evaluate", ["--episodes", "4"], lambda out: out["deterministic"] is False),
]


@pytest.mark.parametrize("tool, argv, check", CLI_ROWS, ids=[" ".join(r[1]) for r in CLI_ROWS])
def test_evaluate_cli(runs, capsys, tool, argv, check):
    run_dir = runs.get("masked")
    assert evaluation.main([str(run_dir)] + argv) == 0
    printed = capsys.readouterr()
    assert printed.err == ""
    saved = json.loads((run_dir / "eval.json").read_text())
    assert check(saved)
    assert ("deterministic actions" in printed.out) == ("--deterministic" in argv)
