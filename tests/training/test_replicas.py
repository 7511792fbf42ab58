"""The replica rule (training.replicas): what follows `--num_envs`, and E(k) tables."""
import json

import pytest
import yaml

from gpusim.envs import env_class
from gpusim.training.replicas import floor, follow
from gpusim.training.run_config import load_run_config


def recipe(env="cartpole", *sets):
    return load_run_config(env, env_class(env), sets=list(sets))


def rows_per_minibatch(config):
    t = config.trainer
    return t.num_envs * t.rollout_len / config.algo.num_minibatches


def gradient_steps_per_env_step(config):
    t = config.trainer
    return config.algo.update_epochs * config.algo.num_minibatches / t.steps_per_iteration


@pytest.mark.parametrize("num_envs,rollout,minibatches,total", [
    (8, 64, 1, 499_712),        # fewer replicas: the recipe's rollout, fewer minibatches
    (32, 64, 4, 499_712),       # the recipe itself
    (128, 16, 4, 499_712),      # 4x: the rollout a quarter, the recipe's batch
    (256, 8, 4, 499_712),       # 8x: down to the floor, still the batch
    (512, 8, 8, 999_424),       # 16x: at the floor, the batch twice, so twice the minibatches
    (2048, 8, 32, 3_997_696),   # 64x: and the recipe's 244 iterations
])
def test_cartpole_at_k_times_its_replicas(num_envs, rollout, minibatches, total):
    base = recipe()
    followed = follow(base, num_envs)
    c = followed.config
    assert (c.trainer.num_envs, c.trainer.rollout_len, c.algo.num_minibatches,
            c.trainer.total_steps) == (num_envs, rollout, minibatches, total)
    # what the rule holds: the recipe's minibatch, gradient steps per env step, learning
    # rate, epochs and iterations (past the floor; more of them below it)
    assert rows_per_minibatch(c) == rows_per_minibatch(base)
    assert gradient_steps_per_env_step(c) == gradient_steps_per_env_step(base)
    assert (c.trainer.lr, c.algo.update_epochs) == (base.trainer.lr, base.algo.update_epochs)
    assert c.trainer.num_iterations() >= base.trainer.num_iterations()


def test_the_recipes_own_size_changes_nothing():
    for env in ("cartpole", "tag_continuous", "simple_spread", "pendulum"):
        base = recipe(env)
        followed = follow(base, base.trainer.num_envs)
        assert followed.config == base and set(followed.changes) == {"num_envs"}


def test_the_line_says_what_followed():
    line = follow(recipe(), 512).line()
    assert line == ("num_envs 32 -> 512: rollout_len 64 -> 8 (scale.min_rollout_len: 2x the "
                    "recipe's batch), num_minibatches 4 -> 8 (the recipe's minibatch), "
                    "total_steps 499,712 -> 999,424 (the recipe's 244 iterations)")
    assert follow(recipe(), 128).line() == \
        "num_envs 32 -> 128: rollout_len 64 -> 16 (the recipe's batch), total_steps kept"


def test_a_scored_envs_evaluation_replicas_follow_up_to_its_window():
    """tag_continuous's score is measured on evaluation replicas stepping one rollout chunk
    per iteration: they grow with k (up to the score's window), so the window fills in the
    recipe's env steps; an env scored by its return has none to follow."""
    base = recipe("tag_continuous")
    assert base.trainer.score_envs == 8 and base.trainer.score_window == 32
    sizes = {n: follow(base, n).config.trainer.score_envs for n in (4, 16, 32, 64, 1024)}
    assert sizes == {4: 2, 16: 8, 32: 16, 64: 32, 1024: 32}
    assert "score_envs 8 -> 32 (the score's evaluation replicas, up to its window)" in \
        follow(base, 64).line()
    assert follow(base, 64, frozenset({"trainer.score_envs"})).config.trainer.score_envs == 8
    off = recipe("tag_continuous", "trainer.score_envs=0")
    assert follow(off, 256).config.trainer.score_envs == 0
    assert follow(recipe(), 512).config.trainer.score_envs == recipe().trainer.score_envs


def test_keys_the_user_gave_stay_as_given():
    base = recipe("cartpole", "trainer.rollout_len=32")
    given = frozenset({"trainer.rollout_len", "trainer.total_steps"})
    c = follow(base, 512, given).config
    assert c.trainer.rollout_len == 32 and c.trainer.total_steps == 499_712
    assert c.algo.num_minibatches == 4 * 512 // 32  # the minibatch still held
    kept = follow(recipe(), 512, frozenset({"trainer.num_minibatches"})).config
    assert kept.algo.num_minibatches == 4 and kept.trainer.rollout_len == 8


def test_the_floor_is_a_key_and_a_recurrent_policy_keeps_whole_sequences():
    assert floor(recipe()) == 8
    assert follow(recipe("cartpole", "scale.min_rollout_len=4"), 512).config.trainer \
        .rollout_len == 4
    gru = recipe("cartpole", "policy.recurrent=gru", "policy.bptt_len=16")
    assert floor(gru) == 16
    for num_envs, rollout in ((64, 32), (128, 16), (512, 16), (96, 16)):
        c = follow(gru, num_envs).config
        assert c.trainer.rollout_len == rollout and c.trainer.rollout_len % 16 == 0
    short = recipe("cartpole", "policy.recurrent=gru", "policy.bptt_len=4")
    assert follow(short, 512).config.trainer.rollout_len == 8  # the floor, two sequences


def test_a2c_keeps_one_gradient_step():
    a2c = recipe("cartpole", "trainer.algorithm=a2c")
    c = follow(a2c, 512).config
    assert (c.algo.num_minibatches, c.algo.update_epochs) == (1, 1)
    assert c.trainer.rollout_len == 8


def test_off_policy_learners_follow_with_their_rollout_only():
    cls = env_class("pendulum")
    from gpusim.training.run_config import recipe_path
    sac = load_run_config("pendulum", cls, path=recipe_path(cls, "sac"))
    assert sac.trainer.rollout_len == 8 <= floor(sac)
    c = follow(sac, 64).config  # its rollout is at the floor already: only the budget grows
    assert c.trainer.rollout_len == 8 and c.algo == sac.algo
    assert c.trainer.num_iterations() == sac.trainer.num_iterations()
    longer = load_run_config("pendulum", cls, path=recipe_path(cls, "sac"),
                             sets=["trainer.rollout_len=32"])
    c = follow(longer, 32).config
    assert c.trainer.rollout_len == 8 and c.algo == longer.algo


def test_a_population_resizes_each_member():
    pop = recipe("cartpole", "trainer.population=3")
    c = follow(pop, 512).config
    assert c.trainer.population == 3 and c.trainer.rollout_len == 8


# ---- the command line -------------------------------------------------------------------
def run(tmp_path, *argv):
    from gpusim.train import main
    return main(["--env", "cartpole", "--backend", "cpu", "--quiet", "--results_dir",
                 str(tmp_path), "--set", "trainer.final_eval_episodes=0", *argv])


def test_num_envs_on_the_command_line_applies_the_rule_and_saves_it(tmp_path, capsys):
    assert run(tmp_path, "--num_envs", "128", "--total_steps", "2048") == 0
    out = capsys.readouterr().out
    assert "gpusim: num_envs 32 -> 128: rollout_len 64 -> 16 (the recipe's batch), " \
           "total_steps kept" in out  # (--total_steps given: kept as given)
    (run_dir,) = tmp_path.iterdir()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["trainer"]["rollout_len"] == 16 and saved["trainer"]["num_envs"] == 128
    assert saved["replica_rule"]["rollout_len"] == [64, 16]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 2048


def test_the_raw_key_stays_raw(tmp_path, capsys):
    assert run(tmp_path, "--set", "trainer.num_envs=128", "--total_steps", "8192") == 0
    (run_dir,) = tmp_path.iterdir()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["trainer"]["rollout_len"] == 64 and "replica_rule" not in saved
    assert "->" not in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--num_envs", "64", "--set", "trainer.num_envs=8"], "give one"),
    (["--set", "scale.min_rollout_len=4"], "add --auto_scale"),
])
def test_bad_rule_inputs_are_one_line(tmp_path, capsys, argv, message):
    assert run(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_floor_key_applies_with_num_envs(tmp_path, capsys):
    assert run(tmp_path, "--num_envs", "512", "--total_steps", "2048",
               "--set", "scale.min_rollout_len=4") == 0
    assert "rollout_len 64 -> 4 (the recipe's batch)" in capsys.readouterr().out


# ---- E(k): the env steps a recipe needs at k x its replicas ---------------------------
def test_a_table_interpolates_on_log_log_axes_and_refuses_what_missed():
    from gpusim.training.env_steps import Table
    table = Table(((0.25, 300.0), (1.0, 200.0), (4.0, 400.0), (16.0, None)), "test")
    assert table.at(1.0) == 200.0 and table.at(4.0) == pytest.approx(400.0)
    assert table.at(2.0) == pytest.approx((200.0 * 400.0) ** 0.5)  # the geometric midpoint
    assert table.at(0.1) == 300.0           # below the table: its smallest k's
    assert table.at(8.0) is None            # towards a k that missed: not predicted
    assert table.at(16.0) is None and table.at(64.0) is None
    assert table.factor(4.0) == pytest.approx(2.0)
    grows = Table(((1.0, 100.0), (4.0, 200.0)), "test")
    assert grows.at(16.0) == pytest.approx(800.0)  # past the table: in proportion to k


def test_a_shipped_table_applies_to_its_recipe_and_not_to_other_learning_settings():
    from gpusim.training.env_steps import learning_settings, table_for
    base = recipe("cartpole")
    table = table_for(base)
    assert table is not None and table.at(1.0) > 0 and "cartpole/env_steps.yaml" in table.source
    assert table_for(follow(base, 512).config) is not None  # sizes may differ
    assert table_for(recipe("cartpole", "trainer.seed=3", "trainer.backend=cpu")) is not None
    assert table_for(recipe("cartpole", "trainer.lr=0.01")) is None
    assert table_for(recipe("cartpole", "policy.hidden_sizes=[32]")) is None
    assert "num_envs" not in learning_settings(base)["trainer"]
