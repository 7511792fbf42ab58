"""A population run's members as plain runs: one exported, every one evaluated.

A population's checkpoint holds its members' networks stacked. `export_member`
writes member k as the run directory a solo run of its seed and settings
would have written (its config, and its networks in a checkpoint), so
`python -m gpusim.evaluate`, `render`, `export` and `gpusim.load_policies`
take it as they take any run. `evaluate_members` evaluates each (every
policy trained) and summarises per setting across seeds; the best member
(the highest mean return, over its policies) can be kept as a plain run.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gpusim.errors import GpusimError, writing

from ..population import members as population
from ..population.members import member_config
from ..population.stacked import unflat_name
from ..records import checkpoint
from ..run_config import load_run_dir_config


def is_population(run_dir) -> bool:
    """Whether `run_dir` holds a population run (read from its config, nothing built)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return False
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    spec = trainer.get("population", 1)
    return isinstance(spec, dict) or (isinstance(spec, int) and spec > 1)


def pick(run_dir, config, member=None) -> tuple:
    """(k, the line that says which): member `member` of population run `run_dir` ("m3",
    3), or by default (None, "best") its best: the highest mean over its policies of the
    last mean return logged (metrics.jsonl)."""
    team = population.members(config.trainer)
    size = len(team)
    if member not in (None, "best"):
        text = str(member)
        k = int(text[1:]) if text[:1] == "m" and text[1:].isdigit() else \
            int(text) if text.isdigit() else -1
        if not 0 <= k < size:
            raise GpusimError(f"{run_dir} has members m0 to m{size - 1}, not {member!r}")
        chosen = team[k]
        return k, (f"gpusim: {Path(run_dir).name} is a population of {size}: member "
                   f"{chosen.name} (seed {chosen.seed}, {chosen.label})")
    scores = _last_returns(Path(run_dir), config, team)
    k = max(range(size), key=lambda i: (scores[i] is not None, scores[i] or 0.0, -i))
    chosen = team[k]
    why = "the best by its last mean return" if scores[k] is not None \
        else "none has a logged return yet, so the first"
    return k, (f"gpusim: {Path(run_dir).name} is a population of {size}: member {chosen.name} "
               f"(seed {chosen.seed}, {chosen.label}), {why}; --member (member=) picks "
               "another")


def _last_returns(run_dir: Path, config, team: list) -> list:
    """Per member, the mean over its policies of the last logged mean return (None: none)."""
    from ..records.metrics import read_lines, record
    try:
        records = [r for r in map(record, read_lines(run_dir / "metrics.jsonl")) if r]
    except GpusimError:
        records = []
    last = records[-1] if records else {}
    out = []
    for m in team:
        values = [v for k, v in last.items() if k.startswith("episode_return/")
                  and k.endswith(f"/{m.name}") and v is not None]
        out.append(sum(values) / len(values) if values else None)
    return out


def member_models(models: dict, k: int) -> dict:
    """Member k's networks from a population checkpoint's stacked ones (StackedPolicy
    state dicts: each tensor (members, ...), named with `__` for `.`)."""
    return {name: {unflat_name(key): value[k].clone() for key, value in stacked.items()}
            for name, stacked in models.items()}


def export_member(run_dir, k: int, out_dir) -> Path:
    """Member k of population run `run_dir` as a plain run directory `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    _, config = load_run_dir_config(run_dir)
    members = population.members(config.trainer)
    if not 0 <= k < len(members):
        raise GpusimError(f"{run_dir} has members m0 to m{len(members) - 1}, not m{k}")
    state = checkpoint.load_latest(run_dir / "checkpoints")
    models = (state.get("algorithm") or {}).get("models")
    if not isinstance(models, dict):
        raise GpusimError(f"{run_dir}: its checkpoint holds no population's networks")
    member = members[k]
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        member_config(config, member).dump(out_dir / "config.yaml")
    checkpoint.save(out_dir / "checkpoints", state.get("iteration", 0), {
        "iteration": state.get("iteration", 0), "env_steps": state.get("env_steps", 0),
        "algorithm": {"models": member_models(models, k)},
        "population_member": {"run": run_dir.name, "member": member.name,
                              "seed": member.seed, "settings": member.settings}})
    return out_dir


def evaluate_members(run_dir, evaluate, log=print, best: bool = False, **options) -> dict:
    """Every member evaluated (`evaluate(member_dir, ...)`, every policy trained), then per
    setting and policy the mean over seeds with its 95% bootstrap interval and the IQM;
    with `best`, the best member kept as RUN_DIR/best_member. Written to eval.json."""
    import json
    run_dir = Path(run_dir)
    _, config = load_run_dir_config(run_dir)
    members = population.members(config.trainer)
    folder = run_dir / "members"
    scores, results = {}, {}
    for member in members:
        member_dir = export_member(run_dir, member.index, folder / member.name)
        log(f"{member.name} (seed {member.seed}, {member.label}):")
        pairing = evaluate(member_dir, log=lambda line: log("  " + line), trained_only=True,
                           **options)
        means = {key.split("/", 1)[1]: value["mean"]
                 for key, value in next(iter(pairing.values())).items()
                 if key.startswith("return/")}
        results[member.name] = means
        scores[member.name] = sum(means.values()) / len(means)
    policies = list(next(iter(results.values())))
    summary = {name: population.summary(members, {m: r[name] for m, r in results.items()})
               for name in policies}
    log("per setting, across seeds: mean [95% bootstrap interval], interquartile mean")
    for name, rows in summary.items():
        for row in rows:
            log(f"  {name:<10} {row['setting']:<28} {row['mean']:10.3f} "
                f"[{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]  IQM {row['iqm']:.3f}  "
                f"({row['seeds']} seeds)")
    out = {"members": results, "summary": summary}
    if best:
        top = max(members, key=lambda m: scores[m.name])
        target = run_dir / "best_member"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder / top.name, target)
        out["best_member"] = {"member": top.name, "seed": top.seed, "settings": top.settings,
                              "run_dir": str(target)}
        log(f"best member: {top.name} (seed {top.seed}, {top.label}), mean return "
            f"{scores[top.name]:.3f}: a plain run directory in {target}")
    with writing(run_dir / "eval.json"):
        (run_dir / "eval.json").write_text(json.dumps(out, indent=1))
    return out
