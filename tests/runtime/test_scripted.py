"""Scripted policies (gpusim.scripted): simple_tag's and tag_continuous's chaser and fleer
beat random play at their own game, act with no host read, and play in
`python -m gpusim.evaluate --opponents scripted` and `python -m gpusim.league --panel`."""
import json

import pytest
import torch

from gpusim.envs import env_class
from gpusim.errors import GpusimError
from gpusim.scripted import scripted_policies
from gpusim.training.run_config import load_run_config
from gpusim.training.trained.evaluation import mean_ci, play
from test_host_syncs import counting_host_reads

SMALL = {"simple_tag": {},
         "tag_continuous": {"env.num_taggers": 3, "env.num_runners": 8,
                            "env.episode_length": 100}}


def small_env(name, **overrides):
    cls = env_class(name)
    config = load_run_config(name, cls, overrides={**SMALL[name], **overrides}).env
    return cls(num_envs=16, backend="cpu", seed=3, config=config)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mean(played, key):
    return mean_ci(played[key])[0]


@pytest.mark.parametrize("name", ["simple_tag", "tag_continuous"])
def test_the_chaser_catches_more_and_the_fleer_is_caught_less_than_random(name):
    """Against uniformly random opponents, 32 episodes each (the same starts): the chaser's
    side scores more than random play (more touches or tags), and the fleer's side is
    caught less (simple_tag: fewer touches, so the adversaries score less; tag_continuous:
    runners survive longer)."""
    env = small_env(name)
    chasers, fleers = env.policies
    shipped = scripted_policies(type(env))
    assert set(shipped) == {chasers, fleers}
    chaser = shipped[chasers]["chaser"](env, chasers)
    fleer = shipped[fleers]["fleer"](env, fleers)
    random = play(env, {}, 32)
    chased = play(env, {chasers: chaser}, 32)
    fled = play(env, {fleers: fleer}, 32)
    ret = f"return/{chasers}"
    assert _mean(chased, ret) > 2 * _mean(random, ret) + 1.0
    if name == "simple_tag":
        assert _mean(fled, ret) < _mean(random, ret)
    else:
        survived = "runner_steps_survived"
        assert _mean(fled, survived) > _mean(random, survived)
        assert _mean(chased, survived) < _mean(random, survived)


@pytest.mark.parametrize("name", ["simple_tag", "tag_continuous"])
def test_scripted_policies_read_nothing_on_the_host(name):
    env = small_env(name)
    obs = env.reset()
    acting = [cls(env, policy) for policy, options in scripted_policies(type(env)).items()
              for cls in options.values()]
    with counting_host_reads() as counts:
        for _ in range(3):
            for policy in acting:
                log_probs = policy.log_probs(obs)
            env.step()
    assert counts["reads"] == 0
    width = sum(env.policy_specs[acting[-1].policy].actions)
    assert log_probs.shape == (16, len(acting[-1].agents), width)
    # exactly one choice per component at probability 1
    assert torch.allclose(log_probs.exp().sum(-1), torch.tensor(
        float(len(env.policy_specs[acting[-1].policy].actions))))


def test_an_env_without_scripted_policies_has_none_and_continuous_actions_are_refused():
    assert scripted_policies(env_class("cartpole")) == {}
    cls = env_class("simple_tag")  # declared only: no kernel compiled
    env = cls.declared(load_run_config("simple_tag", cls, overrides={
        "env.continuous_actions": True}).env)
    with pytest.raises(GpusimError, match="plays discrete actions"):
        scripted_policies(type(env))["adversary"]["chaser"](env, "adversary")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import numba
    from gpusim import train
    root = tmp_path_factory.mktemp("scripted_run")
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        assert train.main(["--env", "simple_tag", "--backend", "cpu", "--num_envs", "8",
                           "--quiet", "--total_steps", "400", "--results_dir", str(root),
                           "--set", "policy.hidden_sizes=[16,16]",
                           "--set", "trainer.keep_snapshots=2",
                           "--set", "trainer.final_eval_episodes=0"]) == 0
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    (run,) = root.iterdir()  # 2 iterations: snapshots 1 and 2 (the final network)
    return run


def test_evaluate_plays_the_scripted_opponents(tiny_run, capsys):
    from gpusim.training.trained import evaluation
    assert evaluation.main([str(tiny_run), "--episodes", "8", "--opponents", "scripted"]) == 0
    out = capsys.readouterr().out
    assert "adversary trained, agent scripted fleer" in out
    assert "adversary scripted chaser, agent trained" in out
    saved = json.loads((tiny_run / "eval_scripted.json").read_text())
    assert saved["opponents"] == "scripted" and len(saved["pairings"]) == 4


def test_league_plays_the_panel(tiny_run, tmp_path, capsys):
    from gpusim.training.judge import league_cli as league_eval
    assert league_eval.main([str(tiny_run), "--episodes", "4", "--panel",
                             "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 adversary x 4 agent players" in out  # u1, final, random, the scripted one
    saved = json.loads((tmp_path / "league.json").read_text())
    labels = [p["label"] for p in saved["players"]["adversary"]]
    assert labels == ["u1", "final", "random", "chaser"]
    assert len(saved["cells"]) == 16
    # panel players are opponents in the transitivity summary, never compared themselves
    assert saved["transitivity"]["sides"]["adversary"]["comparisons"] == 1 * 4
    assert saved["transitivity"]["symmetric"]["times"] == [1, 2]
