"""Populations of SAC, TD3 and DDPG (`trainer.population`): each member trains as the solo
run it stands for (its draws from its own generator, its own replay ring), a member that
diverges stops alone, checkpoints hold every member, and sweeps take the off-policy keys."""
import json

import pytest
import torch
from gpusim.envs import env_class
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config

from gpusim.errors import GpusimError

TAG = {"env.num_taggers": 2, "env.num_runners": 3, "env.num_other_agents_observed": 3}
SMALL = {"trainer.learning_starts": 32, "trainer.batch_size": 16, "trainer.replay_ratio": 0.25,
         "trainer.replay_size": 64, "policy.hidden_sizes": [16, 16]}


def config(env, algorithm, **overrides):
    return load_run_config(env, env_class(env), overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 8,
        "trainer.total_steps": 10**6, "trainer.target_return": None,
        "trainer.torch_threads": 1, "trainer.compile": "off", "trainer.algorithm": algorithm,
        **SMALL, **overrides})


def iterations(trainer, count, lr=1e-3):
    """Each iteration's statistics and finished episodes' returns (env steps counted as the
    loop counts them, so learning starts after `learning_starts`)."""
    out = []
    for _ in range(count):
        stats = trainer.iterate(lr)
        out.append((stats, trainer.algorithm.episodes.finished()))
        trainer.env_steps += trainer.steps_per_iteration
    return out


def solo(env, algorithm, seed, count, lr=1e-3, **overrides):
    trainer = Trainer(config(env, algorithm, **{"trainer.seed": seed, **overrides}),
                      env_class(env))
    return iterations(trainer, count, lr)


def assert_member_is_solo(got, want, name, member):
    learned = ended = False
    for (stats, returns), (solo_stats, solo_returns) in zip(got, want):
        for policy, values in solo_stats.items():
            mine = stats[f"{policy}/{member}"]
            for key, value in values.items():
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, key)
            learned |= values["value_loss"] != 0
            ended |= bool(solo_returns[policy])
            assert returns[f"{policy}/{member}"] == pytest.approx(solo_returns[policy],
                                                                 rel=1e-5)
    assert learned and ended  # gradient steps and episodes compared, not only exploring


CASES = {
    "sac": ("pendulum", "sac", {"env.max_episode_steps": 10}),
    "td3": ("pendulum", "td3", {"env.max_episode_steps": 10, "trainer.policy_delay": 3}),
    "ddpg": ("mountain_car_continuous", "ddpg", {"env.max_episode_steps": 10}),
    "sac, prioritized replay": ("pendulum", "sac", {"env.max_episode_steps": 10,
                                                    "trainer.prioritized_replay": True}),
    "sac, per-agent done, two policies": ("tag_continuous", "sac", {
        **TAG, "env.continuous_actions": True, "env.episode_length": 12}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_member_trains_as_its_solo_run(case):
    env, algorithm, overrides = CASES[case]
    trainer = Trainer(config(env, algorithm, **{"trainer.population": 2, **overrides}),
                      env_class(env))
    got = iterations(trainer, 4)
    for k in range(2):
        assert_member_is_solo(got, solo(env, algorithm, k, 4, **overrides), case, f"m{k}")


def test_a_sweep_member_trains_as_the_solo_run_of_its_setting():
    sweep = {"trainer.population": {"lr": ["1e-3", 3e-3], "sac_alpha": [0.0, 0.2],
                                    "tau": [0.005, 0.05], "max_grad_norm": [0.5, 0.0]},
             "env.max_episode_steps": 10}
    trainer = Trainer(config("pendulum", "sac", **sweep), env_class("pendulum"))
    members = trainer.algorithm.members.list
    assert len(members) == 16
    picks = [members[0], next(m for m in members if m.settings == {
        "lr": 3e-3, "sac_alpha": 0.2, "tau": 0.05, "max_grad_norm": 0.0})]
    lr = trainer.config.trainer.lr  # the loop's rate; a member's scales with it
    got = iterations(trainer, 3, lr)
    for member in picks:
        settings = {f"trainer.{k}": v for k, v in member.settings.items()}
        want = solo("pendulum", "sac", member.seed, 3, member.settings["lr"],
                    **{"env.max_episode_steps": 10, **settings})
        assert_member_is_solo(got, want, "sweep", member.name)
        assert got[-1][0][f"agent/{member.name}"]["alpha"] == pytest.approx(
            member.settings["sac_alpha"])


@pytest.mark.parametrize("algorithm,sweep,message", [
    ("sac", {"ent_coef": [0.0, 0.1]}, "'trainer.population.ent_coef' cannot differ"),
    ("td3", {"sac_alpha": [0.1, 0.2]}, "'trainer.population.sac_alpha' cannot differ"),
    ("ddpg", {"tau": [0.1, 1.5]}, "'trainer.population.tau' holds 1.5"),
    ("sac", {"sac_alpha": [-1.0, 0.1]}, "'trainer.population.sac_alpha' holds -1.0"),
])
def test_keys_an_off_policy_member_cannot_differ_in_are_refused(algorithm, sweep, message):
    with pytest.raises(GpusimError, match=message) as caught:
        config("pendulum", algorithm, **{"trainer.population": sweep})
    assert "\n" not in str(caught.value)
    if "cannot differ" in message:
        assert "members may differ in lr, max_grad_norm, tau" in str(caught.value)


def test_a_diverging_member_is_frozen_and_the_others_go_on(capsys):
    trainer = Trainer(config("pendulum", "sac", **{"trainer.population": 3}),
                      env_class("pendulum"))
    iterations(trainer, 2)
    group = trainer.algorithm.policies[0]
    critic = group.optimizer["critic"]
    with torch.no_grad():  # member 1's next Adam step takes the root of a negative moment
        for moment in critic.exp_avg_sq:
            moment[1].fill_(-1.0)
    before = [p[1].clone() for p in group.model.parameters()]
    others = [p[0].clone() for p in group.model.parameters()]
    (stats, _), = iterations(trainer, 1)
    assert trainer.algorithm.members.alive == [True, False, True]
    assert set(stats) == {"agent/m0", "agent/m2"}
    assert "member m1 (seed 1, seeds) diverged" in capsys.readouterr().err
    for param, saved in zip(group.model.parameters(), before):  # put back, then frozen
        assert torch.equal(param[1], saved)
    trainer._check_finite(stats)  # the loop goes on, every parameter finite
    iterations(trainer, 1)
    assert all(torch.equal(p[1], f) for p, f in zip(group.model.parameters(), before))
    assert not all(torch.equal(p[0], f) for p, f in zip(group.model.parameters(), others))
    with torch.no_grad():
        for moment in critic.exp_avg_sq:
            moment[0].fill_(-1.0)
            moment[2].fill_(-1.0)
    with pytest.raises(GpusimError, match="every member of the population diverged"):
        iterations(trainer, 1)


def test_a_member_that_reaches_the_target_stops_learning_there(capsys):
    trainer = Trainer(config("pendulum", "td3", **{"trainer.population": 2}),
                      env_class("pendulum"))
    iterations(trainer, 2)
    algorithm = trainer.algorithm
    algorithm.members.finish(0, 2)  # as the loop calls it (Trainer._finish_members)
    assert "population member m0 (seed 0, seeds) reached the target return" in \
        capsys.readouterr().out
    model = algorithm.policies[0].model
    frozen = [p[0].clone() for p in model.parameters()]
    moving = [p[1].clone() for p in model.parameters()]
    (stats, _), = iterations(trainer, 2)[-1:]
    assert set(stats) == {"agent/m1"} and algorithm.members.finished == [True, False]
    assert all(torch.equal(p[0], f) for p, f in zip(model.parameters(), frozen))
    assert not all(torch.equal(p[1], f) for p, f in zip(model.parameters(), moving))
    assert not trainer.solved()
    algorithm.members.finish(1, 4)
    assert trainer.solved()


def cli(results, *args):
    from gpusim import train
    return train.main(["--env", "pendulum", "--algorithm", "sac", "--backend", "cpu",
                       "--num_envs", "4", "--rollout_len", "8", "--results_dir", str(results),
                       "--quiet", "--set", "trainer.learning_starts=32",
                       "--set", "trainer.batch_size=16", "--set", "trainer.replay_ratio=0.25",
                       "--set", "policy.hidden_sizes=[16,16]", "--set", "env.max_episode_steps=10",
                       "--set", "trainer.checkpoint_every=2", "--set", "trainer.anneal_lr=false",
                       "--set", "trainer.population={lr: [0.001, 0.003]}",
                       "--set", "trainer.seeds_per_setting=2", *args])


def test_a_population_checkpoints_resumes_and_evaluates_every_member(tmp_path):
    from gpusim.training.trained import evaluation
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli(full, "--total_steps", str(32 * 6), "--set", "trainer.final_eval_episodes=0") == 0
    assert cli(part, "--total_steps", str(32 * 4), "--set", "trainer.final_eval_episodes=0") == 0
    (part_dir,), (full_dir,) = part.iterdir(), full.iterdir()
    state = torch.load(max((part_dir / "checkpoints").iterdir()), weights_only=True)
    assert len(state["ranks"][0]["algorithm"]["replay"]["agent"]["members"]) == 4
    assert train_resume(part_dir, 32 * 6) == 0

    def metrics(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k.startswith(("episode_return/", "value_loss/",
                                                             "alpha/"))} for r in rows]
    got, want = metrics(part_dir), metrics(full_dir)
    assert got == want and "value_loss/agent/m3" in want[-1]
    assert evaluation.main([str(full_dir), "--episodes", "2", "--population_best"]) == 0
    saved = json.loads((full_dir / "eval.json").read_text())
    assert sorted(saved["members"]) == ["m0", "m1", "m2", "m3"]
    assert evaluation.main([str(full_dir / "best_member"), "--episodes", "2"]) == 0


def train_resume(run_dir, total_steps):
    from gpusim import train
    return train.main(["--resume", str(run_dir), "--total_steps", str(total_steps), "--quiet"])


def test_a_checkpoint_of_another_population_size_is_refused_in_one_line():
    def trainer(size):
        return Trainer(config("pendulum", "td3", **{"trainer.population": size}),
                       env_class("pendulum"))
    two = trainer(2)
    iterations(two, 2)
    state = two.state_dict()
    three = trainer(3)
    with pytest.raises(GpusimError, match="holds a population of 2 members; this run's "
                                          "trainer.population makes 3") as caught:
        three.load_state_dict(state)
    assert "\n" not in str(caught.value)
    with pytest.raises(GpusimError, match="holds 2 population members; this run has 3 "
                                          r"\(config key 'trainer.population'\)"):
        three.algorithm.load_state_dict(state["algorithm"])
    again = trainer(2)  # the same size resumes: every member's networks and generators
    again.load_state_dict(state)
    for mine, saved in zip(again.algorithm.policies[0].model.parameters(),
                           two.algorithm.policies[0].model.parameters()):
        assert torch.equal(mine, saved)
    assert all(torch.equal(a.get_state(), b.get_state())
               for a, b in zip(again.algorithm.noise, two.algorithm.noise))
