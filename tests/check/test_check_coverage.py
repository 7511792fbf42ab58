"""check_env's coverage check, and rollouts driven by a policy or by given actions; the
helpers that name a rollout's first NaN or Inf (gpusim.check.nonfinite); StepSums, an
env's per-episode measures, as evaluation reports them."""
import pytest
import torch

import gpusim
from gpusim.check import check_env, env_nonfinite_message, first_nonfinite
from gpusim.errors import GpusimError
from planted_env import OK, pursuit


@pytest.fixture(scope="module")
def cartpole():
    return gpusim.make("cartpole", num_envs=4, backend="cpu", seed=0)


def only(*names):
    return tuple(n for n in ("attributes", "reset", "seeding", "step", "finite", "auto_reset",
                             "coverage", "races", "reference", "determinism", "backends")
                 if n not in names)


def test_coverage_counts_each_way_episodes_end():
    walls = gpusim.make("tag_gridworld", num_envs=4, backend="cpu", seed=0)
    result = check_env(walls, steps=300, skip=only("coverage"), verbose=False)
    assert result["coverage"].status == "PASS"
    message = result["coverage"].message
    assert message.startswith("in 300 steps of random actions, ") and " by termination, " \
        in message and " by truncation" in message


def test_a_path_never_taken_is_a_warning_not_a_failure(cartpole):
    """Random actions topple the pole long before cartpole's 500-step limit."""
    result = check_env(cartpole, steps=200, skip=only("coverage"), verbose=False)
    assert result.ok and result.warnings == [result["coverage"]]
    assert str(result["coverage"]).startswith(
        "WARN coverage: no episode ended by truncation in 200 steps of random actions (")
    assert result["coverage"].message.endswith(
        "the truncation path is untested; if the env has one, drive it there with policy= or "
        "actions=, or pass a larger steps=")


def test_per_agent_done_never_seen_is_named():
    env = pursuit(OK, num_envs=2, catch_radius=0.0)  # nobody is ever caught
    result = check_env(env, steps=40, skip=only("coverage"), verbose=False)
    assert result["coverage"].message.startswith(
        "no episode ended by termination and no agent left play in 40 steps of random "
        "actions (2 episodes ended: 0 by termination, 2 by truncation; 0 agents left play): "
        "the termination and per-agent done paths are untested")


def test_given_actions_drive_every_rollout(cartpole):
    """Always pushing right topples the pole in about ten steps, in every replica."""
    right = [torch.ones((4, 1, 1), dtype=torch.int32)] * 60
    result = check_env(cartpole, actions=right, skip=("reference", "backends"), verbose=False)
    assert result["step"].message.startswith("60 steps:")  # steps= defaults to len(actions)
    assert result["coverage"].message.startswith("no episode ended by truncation in 60 steps "
                                                 "of the given actions (24 episodes ended")
    assert result["determinism"].ok


def test_a_policy_sees_each_observation(cartpole):
    seen = []

    def lean(obs, step):
        seen.append(step)
        return (obs[:, :, 2:3] > 0).to(torch.int32)  # push the way the pole leans

    result = check_env(cartpole, policy=lean, steps=50, skip=only("coverage", "determinism"),
                       verbose=False)
    assert "50 steps of the policy" in result["coverage"].message
    assert seen[:3] == [0, 1, 2] and len(seen) == 2 * 50  # the rollout; two fresh envs in step


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(policy=lambda obs, t: obs, actions=[0]), ValueError, "pass policy= or actions="),
    (dict(policy=42), TypeError, "policy must be a callable (obs, step) -> actions"),
    (dict(actions=[torch.zeros((4, 1, 1), dtype=torch.int32)] * 5, steps=10), ValueError,
     "actions holds 5 steps but steps is 10"),
    (dict(actions=7), TypeError, "actions must be a sequence of per-step actions"),
])
def test_bad_drivers_raise(cartpole, kwargs, error, message):
    with pytest.raises(error, match=None) as err:
        check_env(cartpole, **kwargs)
    assert message in str(err.value)


# ---- the first NaN or Inf, named -----------------------------------------------------------
def test_first_nonfinite_names_the_element():
    reward = torch.zeros(4, 3, 2)
    reward[3, 1, 0] = float("nan")
    reward[2, 2, 1] = float("inf")
    obs = torch.zeros(4, 3, 2, 5)
    obs[1, 0, 1, 4] = float("-inf")
    assert first_nonfinite({"reward": reward}) == "reward[step 2, replica 2, agent 1] = inf"
    assert first_nonfinite({"obs": obs, "reward": reward}) == \
        "obs[step 1, replica 0, agent 1, 4] = -inf"
    assert first_nonfinite({"reward": reward}, dims={"reward": ("t", "env", "agent")}) == \
        "reward[t 2, env 2, agent 1] = inf"
    assert first_nonfinite({"reward": torch.zeros(3), "count": torch.ones(2, dtype=torch.int64)}) \
        is None


def test_first_nonfinite_looks_past_a_sum_that_overflows():
    big = torch.full((4,), 3e38)  # finite, but its float32 sum is not
    assert first_nonfinite({"reward": big}) is None


def test_env_nonfinite_message_blames_the_env_only_when_its_outputs_are_not_finite():
    reward = torch.zeros(2, 2, 3)
    assert env_nonfinite_message("pursuit", {"reward": reward}) is None
    reward[1, 0, 2] = float("nan")
    assert env_nonfinite_message("pursuit", {"reward": reward}).startswith(
        "env pursuit returned reward[step 1, replica 0, agent 2] = nan: the env's outputs, not "
        "the learning, are not finite")


# ---- per-episode measures -------------------------------------------------------------------
def test_step_sums_are_an_envs_measures_in_evaluation():
    from gpusim.training.trained.evaluation import play
    env = pursuit(OK, num_envs=4, catch_radius=0.3)
    played = play(env, {}, num_episodes=8)
    assert set(played) == {"return/chaser", "return/runner", "runners_caught"}
    caught = played["runners_caught"]
    assert len(caught) == 8 and all(c in (0.0, 1.0, 2.0) for c in caught) and sum(caught) > 0


def test_step_sums_refuse_a_measure_of_the_wrong_shape():
    from gpusim.measures import StepSums
    env = pursuit(OK, num_envs=2)
    sums = StepSums(env, wrong=lambda env: torch.zeros(3))
    with pytest.raises(GpusimError, match="measure 'wrong' gave shape \\(3,\\)"):
        sums.after_step(torch.zeros(2, dtype=torch.bool))


def test_evaluate_prints_a_custom_envs_measures(tmp_path, capsys):
    from gpusim import train
    from gpusim.training.trained import evaluation
    results = tmp_path / "runs"
    assert train.main(["--env", "planted_env:Pursuit", "--backend", "cpu", "--num_envs", "4",
                       "--rollout_len", "8", "--total_steps", "32", "--quiet",
                       "--results_dir", str(results), "--set", "env.catch_radius=0.3"]) == 0
    (run_dir,) = results.iterdir()
    assert evaluation.main([str(run_dir), "--episodes", "4", "--trained_only"]) == 0
    printed = capsys.readouterr().out
    assert "runners_caught" in printed and "return/chaser" in printed
