"""Runs written by earlier gpusim trees (tests/fixtures/saved_runs, frozen) still evaluate, load,
export, render and resume under this one, and a resumed run continues as the original did.

Each folder under tests/fixtures/saved_runs is one tree's output (its name: the run format
and the commit that wrote it; write.py there says how), never rewritten.
"""
import json
import shutil
from pathlib import Path

import numba
import pytest
import torch

import gpusim
from gpusim import train
from gpusim.training.trained import animation, evaluation, network_export

FIXTURES = Path(__file__).parents[1] / "fixtures" / "saved_runs"
TREES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
KINDS = ("ppo", "two_policies", "sac", "population", "league")
TIMED = ("time_s", "env_steps_per_s")  # wall-clock figures: never the same twice


@pytest.fixture
def old_run(request, tmp_path):
    """A copy of a frozen run directory (the frozen one is never written)."""
    tree, kind = request.param
    copy = tmp_path / kind
    shutil.copytree(FIXTURES / tree / kind / "run", copy)
    threads = torch.get_num_threads(), numba.get_num_threads()
    yield copy
    torch.set_num_threads(threads[0])  # a resumed trainer binds the process's threads
    numba.set_num_threads(threads[1])


CASES = [pytest.param((tree, kind), id=f"{tree}-{kind}") for tree in TREES for kind in KINDS]


@pytest.mark.parametrize("old_run", CASES, indirect=True)
def test_an_old_run_loads_evaluates_exports_and_renders(old_run, tmp_path):
    policies = gpusim.load_policies(old_run)
    assert len(policies) >= 1
    assert evaluation.main([str(old_run), "--episodes", "2", "--num_envs", "2"]) == 0
    assert network_export.main([str(old_run), "--format", "torchscript",
                        "--out", str(tmp_path / "export")]) == 0
    assert animation.main([str(old_run), "--out", str(tmp_path / "episode.gif"),
                        "--max_steps", "8"]) == 0
    assert (tmp_path / "episode.gif").stat().st_size > 0


@pytest.mark.parametrize("old_run", CASES, indirect=True)
def test_an_old_run_resumes_as_the_original_continued(old_run, request):
    tree, kind = request.node.callspec.params["old_run"]
    assert train.main(["--resume", str(old_run), "--quiet"]) == 0
    rows = [json.loads(line) for line in (old_run / "metrics.jsonl").read_text().splitlines()]
    original = [json.loads(line) for line in
                (FIXTURES / tree / kind / "continued.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["iteration"] > 2]
    strip = lambda row: {k: v for k, v in row.items()
                         if k not in TIMED and not k.startswith("time_share/")}
    assert [strip(r) for r in resumed] == [strip(r) for r in original]


def _keys_after(keys: dict, steps) -> dict:
    """A tree's config keys (keys.yaml) with `steps`' additions, renames and removals."""
    keys = {"trainer": {a: set(k) for a, k in keys["trainer"].items()},
            "env": {e: set(k) for e, k in keys["env"].items()},
            "policy": set(keys["policy"]), "scale": set(keys["scale"])}

    def places(dotted, algorithms=(), envs=()):
        section, name = dotted.split(".", 1)
        if section in ("trainer", "env"):
            scope = algorithms if section == "trainer" else envs
            return [(held, name) for who, held in keys[section].items()
                    if not scope or who in scope]
        return [(keys[section], name)]

    for step in steps:
        for old, new in step.renamed:
            for held, name in places(old):
                if name in held:
                    held.discard(name)
                    held.add(new.split(".", 1)[1])
        for dotted in step.removed:
            for held, name in places(dotted):
                held.discard(name)
        for added in step.added:
            for held, name in places(added.key, added.algorithms, added.envs):
                held.add(name)
    return keys


def _fixture_format(tree: str) -> int:
    return int(tree.split("_")[0].removeprefix("format"))


@pytest.mark.parametrize("tree", TREES)
def test_every_config_key_change_since_a_format_has_its_migration(tree):
    """Today's config keys are a frozen tree's keys after the migration steps since its
    format: a key added, renamed or removed without a step fails here."""
    import yaml

    from fixtures.saved_runs.write import config_keys
    from gpusim.training.records.migrations import STEPS
    frozen = yaml.safe_load((FIXTURES / tree / "keys.yaml").read_text())
    expected = _keys_after(frozen, STEPS[_fixture_format(tree):])
    today = config_keys()
    problems = []
    for section in ("trainer", "env"):
        for who, held in expected[section].items():  # (a later algorithm or env: no old runs)
            now = set(today[section].get(who, ()))
            problems += [f"{section}.{k} ({who}) is new" for k in sorted(now - held)]
            problems += [f"{section}.{k} ({who}) is gone" for k in sorted(held - now)]
    for section in ("policy", "scale"):
        now = set(today[section])
        problems += [f"{section}.{k} is new" for k in sorted(now - expected[section])]
        problems += [f"{section}.{k} is gone" for k in sorted(expected[section] - now)]
    assert not problems, (f"since run format {_fixture_format(tree)}: {'; '.join(problems)}, "
                          "with no migration step: add one (training/records/migrations.py)")


def _copy(tmp_path, tree="format2_4ff5af1", kind="ppo") -> Path:
    copy = tmp_path / kind
    shutil.copytree(FIXTURES / tree / kind / "run", copy)
    return copy


def _rewrite(path: Path, change):
    import yaml
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_an_older_run_is_read_with_one_line_naming_what_was_filled_in(tmp_path, capsys):
    from gpusim.training.run_config import load_run_dir_config
    run = _copy(tmp_path, "format1_059f7f8", "league")
    _, config = load_run_dir_config(run)
    _, again = load_run_dir_config(run)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # once per run directory
    assert "run format 1" in lines[0] and "trainer.score_every=1" in lines[0] \
        and "env.observe_in_own_frame=false" in lines[0] and "trainer.score_share" in lines[0]
    assert config.trainer.score_opponents == "random" and not config.env.observe_in_own_frame
    assert config == again


def test_a_damaged_config_of_todays_format_is_refused_naming_the_key(tmp_path):
    from gpusim.errors import ConfigError
    from gpusim.training.run_config import load_run_dir_config
    run = _copy(tmp_path)
    assert train.main(["--resume", str(run), "--quiet"]) == 0  # today's format now
    _rewrite(run / "config.yaml", lambda d: d["trainer"].pop("gae_lambda"))
    with pytest.raises(ConfigError, match=r"damaged: it lacks trainer\.gae_lambda"):
        load_run_dir_config(run)


def test_a_damaged_older_config_is_refused_too(tmp_path):
    from gpusim.errors import ConfigError
    from gpusim.training.run_config import load_run_dir_config
    run = _copy(tmp_path, "format1_059f7f8")
    _rewrite(run / "config.yaml", lambda d: d["policy"].pop("activation"))
    with pytest.raises(ConfigError, match=r"damaged: it lacks policy\.activation"):
        load_run_dir_config(run)


def test_a_newer_format_is_one_line_naming_the_gpusim_that_reads_it(tmp_path, capsys):
    from gpusim.training.records.migrations import FORMAT
    run = _copy(tmp_path)
    _rewrite(run / "config.yaml", lambda d: d.update(format=FORMAT + 1, gpusim_version="9.1.0"))
    assert evaluation.main([str(run), "--episodes", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run format {FORMAT + 1}" in err[0] \
        and "install gpusim 9.1.0 or newer" in err[0], err


def test_a_newer_checkpoint_is_refused_the_same_way(tmp_path):
    from gpusim.errors import GpusimError
    from gpusim.training.records import checkpoint
    from gpusim.training.records.migrations import FORMAT
    run = _copy(tmp_path)
    (path,) = checkpoint.list_checkpoints(run / "checkpoints")
    state = torch.load(path, weights_only=True)
    torch.save({**state, "format": FORMAT + 1, "gpusim_version": "9.1.0"}, path)
    with pytest.raises(GpusimError, match="install gpusim 9.1.0 or newer"):
        checkpoint.load_latest(run / "checkpoints")


def test_a_config_file_with_a_removed_key_is_one_line_naming_the_step(tmp_path, capsys):
    run = _copy(tmp_path, "format1_059f7f8")
    code = train.main(["--config", str(run / "config.yaml"), "--quiet",
                       "--results_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "'trainer.score_share' was removed in run format 2" in err[0]


def test_upgrade_rewrites_an_older_run_keeping_the_originals(tmp_path, capsys):
    from gpusim.training.run_config import load_run_dir_config
    from gpusim.training.records.migrations import FORMAT
    from gpusim.training.trained import run_upgrade
    run = _copy(tmp_path, "format1_059f7f8", "sac")
    before = (run / "config.yaml").read_text()
    checkpoint_before = (run / "checkpoints" / "checkpoint_000002.pt").read_bytes()
    assert run_upgrade.main([str(run)]) == 0
    assert f"upgraded to run format {FORMAT}" in capsys.readouterr().out
    assert (run / "format1" / "config.yaml").read_text() == before
    assert (run / "format1" / "checkpoints" / "checkpoint_000002.pt").read_bytes() \
        == checkpoint_before
    assert (run / "config.yaml").read_text().startswith(f"format: {FORMAT}\n")
    state = torch.load(run / "checkpoints" / "checkpoint_000002.pt", weights_only=True)
    assert state["format"] == FORMAT
    load_run_dir_config(run)
    assert capsys.readouterr().err == ""  # today's format: read without a line
    assert run_upgrade.main([str(run)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_upgrade_refuses_what_is_not_a_run_and_a_run_in_use(tmp_path, capsys):
    from gpusim.training.records.logger import lock_run_dir
    from gpusim.training.trained import run_upgrade
    assert run_upgrade.main([str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    run = _copy(tmp_path, "format1_059f7f8")
    before = (run / "config.yaml").read_text()
    held = lock_run_dir(run)
    try:
        assert run_upgrade.main([str(run)]) == 2
        assert "in use" in capsys.readouterr().err
    finally:
        held.close()
    assert (run / "config.yaml").read_text() == before and not (run / "format1").exists()


def test_resuming_an_older_run_keeps_its_original_config(tmp_path):
    run = _copy(tmp_path, "format1_059f7f8")
    before = (run / "config.yaml").read_text()
    assert train.main(["--resume", str(run), "--quiet"]) == 0
    assert (run / "format1" / "config.yaml").read_text() == before


def test_a_saved_config_of_todays_format_reruns_with_config(tmp_path):
    run = _copy(tmp_path)
    assert train.main(["--resume", str(run), "--quiet"]) == 0  # its config.yaml: today's
    assert train.main(["--config", str(run / "config.yaml"), "--quiet", "--total_steps", "32",
                       "--results_dir", str(tmp_path / "again")]) == 0


@pytest.mark.parametrize("env, trainer, want", [
    ("tag_continuous", {"score_policy": "runner", "target_score": 345}, {"runner": 345}),
    ("tag_continuous", {"score_policy": None, "target_score": 200}, {"tagger": 200}),
    ("tag_continuous", {"score_policy": "runner", "target_score": None}, {"runner": None}),
    ("tag_continuous", {"score_policy": None, "target_score": None}, None),
    ("cartpole", {"score_policy": None, "target_score": 15}, 15),  # (its return's target)
])
def test_score_policy_becomes_the_side_named_in_target_score(env, trainer, want):
    from gpusim.training.records.migrations import upgrade_config
    data = {"format": 3, "gpusim_version": "0.2.0", "env_name": env,
            "trainer": {"algorithm": "ppo", **trainer}}
    upgraded, fmt, changes = upgrade_config(data, "config.yaml")
    assert fmt == 3 and upgraded["trainer"]["target_score"] == want
    assert "score_policy" not in upgraded["trainer"]
    assert any("trainer.score_policy" in c for c in changes)


def test_a_checkpoint_of_one_nameless_score_side_loads_as_the_runs_side(tmp_path):
    """Run format 3 kept the one measured side's score without its name."""
    import copy

    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    from gpusim.training.records.migrations import upgrade_checkpoint
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, sets=[
        "trainer.backend=cpu", "trainer.num_envs=4", "trainer.rollout_len=8",
        "env.num_taggers=2", "env.num_runners=3", "env.episode_length=6",
        "trainer.score_window=4", "trainer.target_score={runner: null}"])
    trainer = Trainer(config, cls)
    for _ in range(3):
        trainer._train_one(False)
    state = copy.deepcopy(trainer.state_dict())
    state.update(format=3, gpusim_version="0.2.0")
    state["score"] = state["score"]["sides"]["runner"]  # format 3's layout
    state, fmt = upgrade_checkpoint(state, "checkpoint_000003.pt")
    again = Trainer(config, cls)
    again.load_state_dict(state)
    assert fmt == 3 and list(again.score.recent["runner"]) == list(trainer.score.recent["runner"])
    assert again.score.episodes == trainer.score.episodes and trainer.score.episodes["runner"]
