"""What a run directory holds, format by format, and how an older one is read today.

A run's `config.yaml` and each of its checkpoints record the run format they were
written in (`format`) and the gpusim that wrote them (`gpusim_version`). Every change
to a saved config key, or to what a checkpoint holds, adds one `Step` below: the keys
it added (with the value that reproduces how older runs trained), renamed and
removed, and its change to a checkpoint. A file of an older format is upgraded step
by step as it is read, with one line saying what was filled in; nothing is rewritten
on disk unless the user asks (`python -m gpusim.upgrade RUN_DIR`). A file of today's
format is read as it is: one that lacks a key is damaged, and refused.

Formats 1 and 2 recorded no number; they are told apart by the keys they held.
"""
from __future__ import annotations

import copy
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from gpusim.version import __version__
from gpusim.errors import ConfigError, GpusimError, writing


@dataclass(frozen=True)
class Added:
    """A key that a step added, and the value that reproduces how runs before it trained.
    `algorithms` or `envs` limit it to the trainer sections of those algorithms, or the
    env sections of those envs (default: every one)."""
    key: str  # section.name
    value: object
    algorithms: tuple = ()
    envs: tuple = ()

    def applies(self, data: dict) -> bool:
        algorithm = (data.get("trainer") or {}).get("algorithm", "ppo")
        return (not self.algorithms or algorithm in self.algorithms) and \
               (not self.envs or data.get("env_name") in self.envs)


@dataclass(frozen=True)
class Step:
    """From run format `to - 1` to `to`."""
    to: int
    since: str                 # the first gpusim that wrote format `to`
    added: tuple = ()          # Added
    removed: tuple = ()        # "section.key"
    renamed: tuple = ()        # ("section.old", "section.new")
    checkpoint: object = None  # the checkpoint's change: a function of its state, in place
    config: object = None      # a change of values no table above says: a function of the
                               # saved config's data, in place, first; what it did, or ""


def _sides_in_target_score(data: dict) -> str:
    """Format 4 names the score's measured sides in `trainer.target_score` ({side: target}),
    where `trainer.score_policy` named the one side measured before."""
    trainer = data.get("trainer")
    if not isinstance(trainer, dict) or "score_policy" not in trainer:
        return ""
    side, target = trainer["score_policy"], trainer.get("target_score")
    if side is None and target is None:
        return ""
    if side is None:  # a number: an env's first side, or an env without a score's return
        from gpusim.envs import env_class
        score = getattr(env_class(data.get("env_name")), "score", None)
        if score is None:
            return ""
        side = next(iter(score.sides))
    trainer["target_score"] = {side: target}
    return f"trainer.target_score={{{side}: {'null' if target is None else target}}}"


def _score_by_side(state: dict):
    """Format 4 keeps the score of each measured side, by its name; format 3 kept one side's,
    nameless: it stays under "" (the run's one measured side, whichever it is)."""
    score = state.get("score")
    if isinstance(score, dict) and "sides" not in score:
        state["score"] = {"sides": {"": score}}


def _scores_kept_their_replicas(state: dict):
    """Format 2 kept the score's evaluation replicas in checkpoints; older ones restart."""
    score = state.setdefault("score", None)
    if isinstance(score, dict):
        score.setdefault("monitor", None)


STEPS = (
    Step(to=1, since="0.1.0 (2026-11-28)"),
    Step(to=2, since="0.1.0 (2026-12-02)",
         added=(Added("trainer.score_every", 1),
                Added("trainer.score_opponents", "random"),
                Added("trainer.league_scripted", False, algorithms=("ppo", "a2c")),
                Added("env.observe_own_state", False, envs=("tag_continuous",)),
                Added("env.observe_in_own_frame", False, envs=("tag_continuous",))),
         removed=("trainer.score_share", "scale.minibatch_rows"),
         # (a score paced by wall time, score_share, has no counted equivalent: an older
         # run's score is now measured every iteration)
         checkpoint=_scores_kept_their_replicas),
    Step(to=3, since="0.2.0 (2026-12-07)"),  # the format and version recorded
    Step(to=4, since="0.2.0 (2026-12-07)", removed=("trainer.score_policy",),
         config=_sides_in_target_score, checkpoint=_score_by_side),
)
FORMAT = STEPS[-1].to
RECORD_KEYS = ("format", "gpusim_version")  # in config.yaml and each checkpoint


def record() -> dict:
    """What every config.yaml and checkpoint written today records of its writer."""
    return {"format": FORMAT, "gpusim_version": __version__}


def config_format(data: dict, path) -> int:
    """The run format of a saved config; a newer one than this gpusim reads is refused."""
    fmt = data.get("format")
    if fmt is None:  # formats 1 and 2 recorded none: format 1 held trainer.score_share
        trainer = data.get("trainer")
        return 1 if isinstance(trainer, dict) and "score_share" in trainer else 2
    return _known(fmt, data.get("gpusim_version"), path)


def checkpoint_format(state: dict, path) -> int:
    """The run format of a checkpoint; formats 1 and 2 both wrote `format: 2` (the loop's
    own count then) and no version, and differ in the score's state alone."""
    if "gpusim_version" not in state:
        score = state.get("score")
        return 1 if isinstance(score, dict) and "monitor" not in score else 2
    return _known(state.get("format"), state["gpusim_version"], path)


def _known(fmt, version, path) -> int:
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise GpusimError(f"{path} is damaged: its format must be a whole number, got {fmt!r}")
    if fmt > FORMAT:
        raise GpusimError(f"{path} was written by gpusim {version} in run format {fmt}; "
                          f"this gpusim ({__version__}) reads formats up to {FORMAT}: "
                          f"install gpusim {version} or newer to read it")
    return fmt


def upgrade_config(data: dict, path) -> tuple[dict, int, list]:
    """(the saved config in today's format, the format it was written in, what changed:
    phrases for one line). `data` is left as it is."""
    fmt = config_format(data, path)
    data = copy.deepcopy(data)
    filled, dropped, renamed = [], [], []
    for step in STEPS[fmt:]:
        if step.config is not None:
            changed = step.config(data)
            if changed:
                filled.append(changed)
        for old, new in step.renamed:
            (s, k), (s2, k2) = old.split(".", 1), new.split(".", 1)
            if isinstance(data.get(s), dict) and k in data[s]:
                data.setdefault(s2, {})[k2] = data[s].pop(k)
                renamed.append(f"{old} as {new}")
        for key in step.removed:
            section, name = key.split(".", 1)
            if isinstance(data.get(section), dict) and name in data[section]:
                del data[section][name]
                dropped.append(key)
        for added in step.added:
            section, name = added.key.split(".", 1)
            if added.applies(data) and isinstance(data.get(section), dict) \
                    and name not in data[section]:
                data[section][name] = added.value
                filled.append(f"{added.key}={_shown(added.value)}")
    for key in RECORD_KEYS:
        data.pop(key, None)
    changes = [f"{what} {', '.join(keys)}" for what, keys in
               (("filled in", filled), ("renamed", renamed), ("dropped", dropped)) if keys]
    return data, fmt, changes


def upgrade_checkpoint(state: dict, path) -> tuple[dict, int]:
    """(a checkpoint's state in today's format, the format it was written in); in place."""
    fmt = checkpoint_format(state, path)
    for step in STEPS[fmt:]:
        if step.checkpoint is not None:
            step.checkpoint(state)
    state.update(record())
    return state, fmt


def refuse_removed(data: dict, path):
    """A config file that holds a key an upgrade step removed or renamed: one line naming
    the step (a run directory's config.yaml is upgraded instead, as it is read)."""
    for step in STEPS:
        gone = list(step.removed) + [old for old, _ in step.renamed]
        for key in gone:
            section, name = key.split(".", 1)
            if isinstance(data.get(section), dict) and name in data[section]:
                instead = dict(step.renamed).get(key)
                raise ConfigError(
                    f"{path}: config key '{key}' was {'renamed ' + instead if instead else 'removed'}"
                    f" in run format {step.to} (gpusim {step.since}); "
                    + (f"write {instead}" if instead else "drop it")
                    + " (a run directory is read whole: python -m gpusim.upgrade RUN_DIR)")


def keep_original(run_dir, fmt: int, path):
    """Copy `path` (a file of `run_dir`) into RUN_DIR/format<fmt>/, at its relative place,
    before it is rewritten; an original kept there already stays."""
    run_dir, path = Path(run_dir), Path(path)
    target = run_dir / f"format{fmt}" / path.relative_to(run_dir)
    if target.exists():
        return
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


_told = set()


def tell(where, fmt: int, changes: list):
    """One line, once per run directory and process: read as an older format."""
    if fmt == FORMAT or str(where) in _told:
        return
    _told.add(str(where))
    done = "; ".join(changes) if changes else "no key changed"
    print(f"gpusim: {where} was written by an older gpusim (run format {fmt}; this one "
          f"writes {FORMAT}), read as today's: {done} (python -m gpusim.upgrade {where} "
          f"rewrites it, keeping the original)", file=sys.stderr, flush=True)


def _shown(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) \
        else str(value)
