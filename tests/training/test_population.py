"""Populations (`trainer.population`): each member trains as the solo run it stands for, a
member that diverges stops alone, checkpoints hold every member, and the statistics across
seeds are those of their formulas."""
import json
import math

import pytest
import torch

from gpusim.envs import env_class
from gpusim.errors import GpusimError
from gpusim.training.loop import Trainer
from gpusim.training.population import members as population
from gpusim.training.run_config import load_run_config

TAG = {"env.num_taggers": 2, "env.num_runners": 3, "env.num_other_agents_observed": 3}


def config(env, **overrides):
    return load_run_config(env, env_class(env), overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 16,
        "trainer.total_steps": 10**6, "trainer.target_return": None,
        "trainer.torch_threads": 1, "trainer.compile": "off", **overrides})


def iterations(trainer, count):
    """Each iteration's statistics and finished episodes' returns."""
    out = []
    for _ in range(count):
        stats = trainer.iterate(1e-3)
        out.append((stats, trainer.algorithm.episodes.finished()))
    return out


def solo(env, seed, count, **overrides):
    """A solo run, alone in the process as it would be (its exploration noise comes from
    torch's own generator, which another run's seeding would move)."""
    trainer = Trainer(config(env, **{"trainer.seed": seed, **overrides}), env_class(env))
    return iterations(trainer, count)


def assert_member_is_solo(got, want, name, member):
    for (stats, returns), (solo_stats, solo_returns) in zip(got, want):
        for policy, values in solo_stats.items():
            mine = stats[f"{policy}/{member}"]
            for key, value in values.items():
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, key)
            assert returns[f"{policy}/{member}"] == pytest.approx(solo_returns[policy],
                                                                 rel=1e-5)


CASES = {
    "ppo, discrete": ("cartpole", {}),
    "ppo, Box actions": ("pendulum", {}),
    "ppo, per-agent done, two policies": ("tag_continuous", TAG),
    "a2c, central critic": ("tag_gridworld", {"policy.critic": "central",
                                              "trainer.algorithm": "a2c",
                                              "trainer.update_epochs": 1,
                                              "trainer.num_minibatches": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_member_trains_as_its_solo_run(case, monkeypatch):
    """Per-agent done included: each member's minibatches are drawn over its own rows in
    play, as its solo run's (the members' counts differ: asserted)."""
    env, overrides = CASES[case]
    trainer = Trainer(config(env, **{"trainer.population": 2, **overrides}), env_class(env))
    counts = []
    member_rows = type(trainer.algorithm).member_rows

    def noted(self, p):
        own, weights = member_rows(self, p)
        counts.append([rows.shape[0] for rows in own])
        return own, weights
    monkeypatch.setattr(type(trainer.algorithm), "member_rows", noted)
    got = iterations(trainer, 3)
    if env == "tag_continuous":  # the runners' rows in play: one member's differ from the other's
        assert any(a != b for a, b in counts[1::2])
    for k in range(2):
        assert_member_is_solo(got, solo(env, k, 3, **overrides), case, f"m{k}")


def test_a_sweep_member_trains_as_the_solo_run_of_its_setting():
    sweep = {"trainer.population": {"lr": ["1e-3", 3e-3], "ent_coef": [0.0, 0.05]},
             "trainer.seeds_per_setting": 2}
    trainer = Trainer(config("cartpole", **sweep), env_class("cartpole"))
    members = trainer.algorithm.members.list
    assert len(members) == 8 and [m.seed for m in members[:4]] == [0, 1, 0, 1]
    picked = next(m for m in members if m.settings == {"lr": 3e-3, "ent_coef": 0.05}
                  and m.seed == 1)
    got = []
    for _ in range(2):  # the loop's rate is trainer.lr; a member's scales with it
        stats = trainer.iterate(trainer.config.trainer.lr)
        got.append((stats, trainer.algorithm.episodes.finished()))
    lone = Trainer(config("cartpole", **{"trainer.seed": 1, "trainer.lr": 3e-3,
                                         "trainer.ent_coef": 0.05}), env_class("cartpole"))
    want = []
    for _ in range(2):
        want.append((lone.iterate(3e-3), lone.algorithm.episodes.finished()))
    assert_member_is_solo(got, want, "sweep", picked.name)


def test_a_diverging_member_is_frozen_and_the_others_go_on(capsys):
    trainer = Trainer(config("cartpole", **{"trainer.population": 3}), env_class("cartpole"))
    trainer.iterate(1e-3)
    group = trainer.algorithm.policies[0]
    with torch.no_grad():  # member 1's next Adam step takes the root of a negative moment
        for moment in group.adam.exp_avg_sq:
            moment[1].fill_(-1.0)
    before = [p[1].clone() for p in group.model.parameters()]
    stats = trainer.iterate(1e-3)
    assert trainer.algorithm.members.alive == [True, False, True]
    assert set(stats) == {"agent/m0", "agent/m2"}
    assert "member m1 (seed 1, seeds) diverged" in capsys.readouterr().err
    for param, saved in zip(group.model.parameters(), before):  # put back, then frozen
        assert torch.equal(param[1], saved)
    trainer._check_finite(stats)  # the loop goes on, every parameter finite
    others = [p[0].clone() for p in group.model.parameters()]
    trainer.iterate(1e-3)
    assert all(torch.equal(p[1], f) for p, f in zip(group.model.parameters(), before))
    assert not all(torch.equal(p[0], f) for p, f in zip(group.model.parameters(), others))
    with torch.no_grad():
        for moment in group.adam.exp_avg_sq:
            moment[0].fill_(-1.0)
            moment[2].fill_(-1.0)
    with pytest.raises(GpusimError, match="every member of the population diverged"):
        trainer.iterate(1e-3)


def test_a_population_checkpoints_and_resumes_every_member(tmp_path):
    from gpusim import train
    common = ["--env", "cartpole", "--backend", "cpu", "--quiet", "--set",
              "trainer.population=3", "--set", "trainer.num_envs=4", "--set",
              "trainer.rollout_len=16", "--set", "trainer.target_return=null",
              "--set", "trainer.checkpoint_every=2", "--set", "trainer.anneal_lr=false"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert train.main(common + ["--total_steps", str(64 * 6), "--results_dir", str(full)]) == 0
    assert train.main(common + ["--total_steps", str(64 * 4), "--results_dir", str(part)]) == 0
    (part_dir,), (full_dir,) = part.iterdir(), full.iterdir()
    assert train.main(["--resume", str(part_dir), "--total_steps", str(64 * 6), "--quiet"]) == 0

    def metrics(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k.startswith(("episode_return/", "value_loss/"))}
                for r in rows]
    got, want = metrics(part_dir), metrics(full_dir)
    assert got == want and "value_loss/agent/m2" in want[-1]


@pytest.mark.parametrize("overrides,message", [
    ({"trainer.population": {"hidden_sizes": [8]}}, "cannot differ between members"),
    ({"trainer.population": {"lr": [1e-3, -1.0]}}, "'trainer.population.lr' holds -1.0"),
    ({"trainer.population": {"lr": ["fast"]}}, "must be a non-empty list of numbers"),
    ({"trainer.population": 0}, "must be at least 1"),
    ({"trainer.population": 2, "trainer.seeds_per_setting": 2}, "applies to a sweep"),
    ({"trainer.population": {"lr": [1e-3]}}, "holds one value: set trainer.lr instead"),
    ({"trainer.population": {"lr": [1e-3, 3e-3, "1e-3"]}}, "holds 0.001 twice"),
])
def test_a_population_no_batched_run_can_train_is_refused(overrides, message):
    with pytest.raises(GpusimError, match=message):
        config("cartpole", **overrides)


def test_populations_of_what_is_not_batched_are_refused():
    with pytest.raises(GpusimError, match="recurrent"):
        Trainer(config("cartpole", **{"trainer.population": 2, "policy.recurrent": "gru",
                                      "policy.bptt_len": 4}), env_class("cartpole"))
    for algorithm in ("ppo", "sac"):
        env = "cartpole" if algorithm == "ppo" else "pendulum"
        with pytest.raises(GpusimError, match="'trainer.compile' on: a population runs "
                                              "uncompiled"):
            Trainer(config(env, **{"trainer.population": 2, "trainer.compile": "on",
                                   "trainer.algorithm": algorithm}), env_class(env))


def test_statistics_across_seeds_follow_their_formulas():
    values = [1.0, 2.0, 3.0, 4.0, 100.0, 5.0, 6.0, 7.0]
    assert population.interquartile_mean(values) == pytest.approx((3 + 4 + 5 + 6) / 4)
    low, high = population.bootstrap_interval(values)
    assert low < sum(values) / len(values) < high
    assert population.bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    members = population.members(config("cartpole", **{
        "trainer.population": {"lr": [1e-3, 2e-3]}, "trainer.seeds_per_setting": 2}).trainer)
    rows = population.summary(members, {"m0": 1.0, "m1": 3.0, "m2": 10.0, "m3": None})
    assert [r["setting"] for r in rows] == ["lr=0.001", "lr=0.002"]
    assert rows[0]["mean"] == 2.0 and rows[0]["seeds"] == 2 and rows[1]["seeds"] == 1
    assert math.isclose(rows[1]["iqm"], 10.0)


def test_a_population_run_is_summarised_evaluated_per_member_and_plotted(tmp_path, capsys):
    """The CLI's summary per setting, evaluate per member with the best kept as a plain
    run (which load_policies and evaluate take as any run), and the population plot."""
    from gpusim import load_policies, train
    from gpusim.training.trained import evaluation, learning_curves
    code = train.main(["--env", "cartpole", "--backend", "cpu", "--quiet", "--results_dir",
                       str(tmp_path), "--total_steps", "256", "--set", "trainer.num_envs=4",
                       "--set", "trainer.rollout_len=16", "--set",
                       "trainer.population={lr: [0.001, 0.003]}", "--set",
                       "trainer.seeds_per_setting=2", "--set", "trainer.final_eval_episodes=0"])
    out = capsys.readouterr().out
    assert code == 0 and "lr=0.001" in out and "IQM" in out and "(2 seeds)" in out
    (run_dir,) = tmp_path.iterdir()
    assert evaluation.main([str(run_dir), "--episodes", "4", "--population_best"]) == 0
    saved = json.loads((run_dir / "eval.json").read_text())
    assert sorted(saved["members"]) == ["m0", "m1", "m2", "m3"]
    assert [row["setting"] for row in saved["summary"]["agent"]] == ["lr=0.001", "lr=0.003"]
    best = run_dir / "best_member"
    member = saved["best_member"]["member"]
    assert saved["members"][member]["agent"] == max(m["agent"] for m in saved["members"].values())
    policy = load_policies(best)["agent"]
    actions, _ = policy.act(torch.zeros(3, 4), deterministic=True)
    assert actions.shape == (3, 1)
    assert evaluation.main([str(best), "--episodes", "2"]) == 0  # a plain run now
    assert (run_dir / "plots" / "population.png") in learning_curves.plot_run(run_dir)
    capsys.readouterr()
    # the population's own directory, wherever a run's goes: its best member, or one named
    load_policies(run_dir)
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "a population of 4: member m" in line and "best" in line
    assert load_policies(run_dir, member="m2")["agent"].act(torch.zeros(4))[0].shape == (1,)
    assert "member m2 (seed 0, lr=0.003)" in capsys.readouterr().err
    from gpusim.training.trained import animation, network_export
    assert network_export.main([str(run_dir), "--format", "torchscript", "--member", "m1",
                        "--out", str(tmp_path / "exported")]) == 0
    assert animation.main([str(run_dir), "--member", "3", "--max_steps", "3",
                        "--out", str(tmp_path / "m3.gif")]) == 0
    capsys.readouterr()
    assert animation.main([str(run_dir), "--member", "m9", "--out", str(tmp_path / "x.gif")]) == 2
    assert "has members m0 to m3, not 'm9'" in capsys.readouterr().err
    assert train.main(["--resume", str(best)]) != 0
    assert "holds population member" in capsys.readouterr().err


def test_population_flags_that_do_not_apply_are_one_line(tmp_path, capsys):
    from gpusim import train
    from gpusim.training.trained import evaluation
    assert train.main(["--env", "cartpole", "--backend", "cpu", "--num_gpus", "2",
                       "--set", "trainer.population=2", "--results_dir", str(tmp_path)]) == 2
    assert "drop --num_gpus" in capsys.readouterr().err
    assert train.main(["--env", "cartpole", "--backend", "cpu", "--quiet", "--total_steps",
                       "64", "--set", "trainer.num_envs=4", "--set", "trainer.rollout_len=16",
                       "--results_dir", str(tmp_path)]) == 0
    capsys.readouterr()
    (run_dir,) = tmp_path.iterdir()
    assert evaluation.main([str(run_dir), "--population_best"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --population_best") and err.count("\n") == 1


@pytest.mark.slow
def test_a_member_that_reaches_the_target_stops_learning_there(capsys):
    """With a target return each member stops learning when it reaches it (as its solo run
    would stop: from there the two part only by float rounding); the run ends when all
    have, and a stopped member's weights stay as they were."""
    overrides = {"trainer.target_return": 25.0, "trainer.anneal_lr": False}
    trainer = Trainer(config("cartpole", **{"trainer.population": 2, **overrides}),
                      env_class("cartpole"))
    frozen = {}
    members = trainer.algorithm.members
    finish = members.finish

    def noting(k, iteration):
        if members.alive[k]:
            frozen[k] = [p[k].clone() for p in trainer.algorithm.policies[0].model.parameters()]
        finish(k, iteration)
    members.finish = noting
    trainer.train()
    out = capsys.readouterr().out
    stopped = {k: int(next(line for line in out.splitlines()
                           if line.startswith(f"population member m{k} "))
                      .split("at iteration ")[1].split(":")[0]) for k in range(2)}
    assert trainer.iteration == max(stopped.values()) and all(members.finished)
    for k, weights in frozen.items():
        now = [p[k] for p in trainer.algorithm.policies[0].model.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(now, weights))


def test_the_members_still_learning_train_as_their_solo_runs_once_one_stops():
    """On the CPU the update leaves a member that stopped learning out: the others' steps
    are still those of their solo runs, and the stopped member's weights stay put."""
    trainer = Trainer(config("cartpole", **{"trainer.population": 3}), env_class("cartpole"))
    algorithm = trainer.algorithm
    got = iterations(trainer, 1)
    algorithm.members.finish(0, 1)
    params = list(algorithm.policies[0].model.parameters())
    stopped = [p[0].clone() for p in params]
    got += iterations(trainer, 2)
    assert algorithm.members.learning().tolist() == [1, 2]
    assert all(torch.equal(p[0], saved) for p, saved in zip(params, stopped))
    for k in (1, 2):
        assert_member_is_solo(got, solo("cartpole", k, 3), "one stopped", f"m{k}")


def test_members_train_on_their_rows_in_play():
    """With per-agent done a member's units are its own rows in play, in its solo run's
    order; a member with fewer rows in play than minibatches trains on all of its rows,
    those out of play weighing 0."""
    trainer = Trainer(config("tag_continuous", **{"trainer.population": 3, **TAG}),
                      env_class("tag_continuous"))
    algorithm = trainer.algorithm
    algorithm.collect(0)
    runner = next(p for p in algorithm.policies if p.name == "runner")
    active = runner.buffer.active  # (steps, 3 members x 4 replicas, 3 runners)
    active.fill_(True)
    active[:, 0:4, 0] = False      # member 0: a third of its rows out of play
    active[:, 4:8, :] = False      # member 1: every row
    active[:, 8:12, 2] = False     # member 2: a third
    units, weights = algorithm.member_rows(runner)
    flat = active.reshape(-1)
    every = active[:, 0:4].numel()
    assert [u.shape[0] for u in units] == [every * 2 // 3, every, every * 2 // 3]
    for k, u in enumerate(units):
        assert torch.equal((u // 3) % 12 // 4, torch.full((len(u),), k))  # its own rows
        assert bool((u[1:] > u[:-1]).all())  # in its solo run's order
    assert flat[units[0]].all() and flat[units[2]].all()
    assert torch.equal(weights, flat.float())
    trainer.iterate(1e-3)  # and the update runs on them


def test_a_populations_minibatches_in_chunks_train_as_whole_ones():
    """max_minibatch_rows splits every member's minibatch (along its rows, the member dim
    leading) into chunks whose gradients add up to the whole minibatch's."""
    results = []
    for rows in (65536, 50):  # 128 rows per member per minibatch: chunks of 50, 50, 28
        trainer = Trainer(config("cartpole", **{"trainer.population": 2, "trainer.num_envs": 8,
                                                "trainer.rollout_len": 32,
                                                "trainer.max_minibatch_rows": rows}),
                          env_class("cartpole"))
        assert trainer.algorithm.speed.chunk == rows
        results.append(iterations(trainer, 2))
    for (whole, _), (chunked, _) in zip(*results):
        for name, values in whole.items():
            for key, value in values.items():
                assert chunked[name][key] == pytest.approx(value, rel=1e-4, abs=1e-6)
