"""E(k): the env steps a recipe needs to its score at k times its replicas, shipped as data.

Under the replica rule (training.replicas) a run at k x the recipe's replicas needs
E(k) env steps to the score; env steps, not seconds, so the CPU measures them once for
every device (`benchmarks/learning/time_to_score.py`), and `env_steps.yaml` beside the recipe
keeps them: `tables`, a list, each for the recipe with some `settings` (dotted keys,
none for the recipe as written), a row per k with the median over seeds, its interval,
and how many seeds reached the score within the benchmark's cap. The auto-scale search
divides E(k) by each size's measured throughput (training.autoscale.to_score).

A table applies to a run whose learning settings are the table's: the env, the policy,
the algorithm's keys and the trainer's, all but the sizes and how the run is sped up
(`SIZE_KEYS`, `SPEED_KEYS`). Between measured k, E is interpolated on log-log axes;
past the largest, it grows in proportion to k (a score needs episodes of every replica
to end, so its cost in env steps grows with the replicas at least that fast); a k whose
median did not reach the score is never predicted to.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

from gpusim.config import load_yaml
from gpusim.errors import ConfigError

FILE = "env_steps.yaml"
# keys that may differ between a run and its table: the sizes the rule sets ...
SIZE_KEYS = ("num_envs", "rollout_len", "total_steps", "num_minibatches", "max_minibatch_rows",
             "league_snapshot_every", "score_envs")
# ... and what neither changes learning per env step nor is a learning setting
SPEED_KEYS = ("seed", "backend", "compile", "cuda_graphs", "precision", "checkpoint_every",
              "keep_snapshots", "final_eval_episodes", "torch_threads", "noise_scale_every")


@dataclass(frozen=True)
class Table:
    """One measured E(k): rows of (k, median env steps or None where it missed), and its
    source for the lines that cite it."""
    rows: tuple      # ((k, median or None), ...) in increasing k
    source: str

    def at(self, k: float) -> float | None:
        """E(k), interpolated (None: not reached there, or past a k that was not)."""
        ks = [row[0] for row in self.rows]
        if k <= ks[0]:
            return self.rows[0][1]
        if k in ks:  # a measured k: its own median
            return self.rows[ks.index(k)][1]
        for (k0, e0), (k1, e1) in zip(self.rows, self.rows[1:]):
            if k <= k1:
                if e0 is None or e1 is None:
                    return None if (e1 is None and k > k0) or e0 is None else e0
                w = math.log(k / k0) / math.log(k1 / k0)
                return math.exp((1 - w) * math.log(e0) + w * math.log(e1))
        last_k, last_e = self.rows[-1]
        return None if last_e is None else last_e * k / last_k

    def factor(self, k: float) -> float | None:
        """E(k) / E(1)."""
        here, base = self.at(k), self.at(1.0)
        return None if here is None or base is None else here / base


def learning_settings(config) -> dict:
    """What a table must share with a run: every setting but sizes and speed."""
    out = config.to_dict()
    out.pop("auto_scale_report", None)
    out.pop("replica_rule", None)
    out.pop("scale", None)
    out["trainer"] = {k: v for k, v in out["trainer"].items()
                      if k not in SIZE_KEYS + SPEED_KEYS}
    return out


def table_for(config) -> Table | None:
    """The shipped table whose settings are the run's (None: no table applies)."""
    from gpusim.envs import env_class
    try:
        cls = env_class(config.env_name)
    except Exception:  # an env given as module:Class that no longer imports: no table
        return None
    path = Path(inspect.getfile(cls)).parent / FILE
    if not path.is_file():
        return None
    wanted = learning_settings(config)
    for entry, settings in _entries(str(path), config.env_name, config.trainer.algorithm):
        if settings == wanted:
            rows = tuple((float(r["k"]), r["median"] if r["reached"] * 2 > r["seeds"] else None)
                         for r in sorted(entry["rows"], key=lambda r: r["k"]))
            return Table(rows, f"{path.parent.name}/{FILE}" +
                         (f", {entry['name']}" if entry.get("name") else ""))
    return None


@functools.lru_cache(maxsize=None)
def _entries(path: str, env_name: str, algorithm: str) -> tuple:
    """(entry, its learning settings) for each table of the file measured with `algorithm`;
    a malformed file is one error line naming it and the key."""
    from gpusim.envs import env_class

    from .run_config import load_run_config, recipe_path
    cls = env_class(env_name)
    out = []
    for index, entry in enumerate(tables(path)):
        settings = entry["settings"]
        if settings.get("trainer.algorithm", "ppo") != algorithm:
            continue
        try:
            config = load_run_config(env_name, cls, path=recipe_path(cls, algorithm),
                                     sets=[f"{k}={v}" for k, v in settings.items()])
        except ConfigError as exc:
            raise ConfigError(f"{path}: tables[{index}].settings: {exc}") from None
        out.append((entry, learning_settings(config)))
    return tuple(out)


def tables(path: str) -> list:
    """The file's tables, every part checked: `tables` a list of mappings, each with an
    optional `name`, `settings` (dotted config keys to values) and `rows`, each row a
    mapping with `k` (> 0), `median` (> 0), `reached` and `seeds` (0 <= reached <= seeds,
    seeds >= 1), and optional `low` and `high`."""
    data = load_yaml(path)
    found = data.get("tables")
    if not isinstance(found, list) or not found:
        raise ConfigError(f"{path}: 'tables' must be a non-empty list of tables")
    for t, entry in enumerate(found):
        where = f"{path}: tables[{t}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping (name, settings, rows)")
        unknown = set(entry) - {"name", "settings", "rows"}
        if unknown:
            raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}' (known: name, "
                              "settings, rows)")
        entry.setdefault("settings", {})
        if entry["settings"] is None:
            entry["settings"] = {}
        if not isinstance(entry["settings"], dict) or not all(
                isinstance(k, str) and "." in k for k in entry["settings"]):
            raise ConfigError(f"{where}.settings must map dotted config keys (trainer.lr) "
                              "to values")
        rows = entry.get("rows")
        if not isinstance(rows, list) or not rows:
            raise ConfigError(f"{where}.rows must be a non-empty list of rows")
        for r, row in enumerate(rows):
            _check_row(row, f"{where}.rows[{r}]")
    return found


def _check_row(row, where: str):
    if not isinstance(row, dict):
        raise ConfigError(f"{where} must be a mapping (k, median, reached, seeds)")
    unknown = set(row) - {"k", "median", "low", "high", "reached", "seeds"}
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'")
    for key, low in (("k", 0), ("median", 0), ("low", 0), ("high", 0)):
        value = row.get(key)
        if value is None and key in ("low", "high"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= low:
            raise ConfigError(f"{where}.{key} must be a positive number, got {value!r}")
    for key in ("reached", "seeds"):
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (key == "seeds"):
            raise ConfigError(f"{where}.{key} must be a whole number >= {int(key == 'seeds')}, "
                              f"got {value!r}")
    if row["reached"] > row["seeds"]:
        raise ConfigError(f"{where}: reached ({row['reached']}) exceeds seeds ({row['seeds']})")
