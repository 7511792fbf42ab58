"""`python -m gpusim.plot RUN_DIR`: PNG learning curves from a run's metrics.jsonl.

Writes RUN_DIR/plots/returns.png (mean episode return per policy),
losses.png (policy loss, value loss, entropy per policy) and
throughput.png (env steps/s and the time split); for a population run
(`trainer.population`) also population.png: per policy, each setting's mean
return over its seeds with the 95% bootstrap interval as a band.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gpusim.arguments import ArgumentParser
from gpusim.errors import GpusimError, writing

from ..population import members as population
from ..records import metrics
from ..run_config import load_run_dir_config
from . import member_runs as members


def read_metrics(run_dir: Path) -> list:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise GpusimError(f"no metrics.jsonl in {run_dir}: is it a run directory?")
    rows = []
    for number, line in enumerate(metrics.read_lines(path), 1):
        row = metrics.record(line)
        if row is None or not isinstance(row.get("env_steps"), (int, float)):
            raise metrics.not_a_record(path, number)
        rows.append(row)
    if not rows:
        raise GpusimError(f"{path} is empty: the run logged no iteration yet")
    return rows


def policies(rows) -> list:
    return sorted({key.split("/", 1)[1] for key in rows[-1] if key.startswith("episode_return/")})


def _series(rows, key):
    points = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(run_dir) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GpusimError("plotting needs matplotlib: pip install 'gpusim[plot]'") from None
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    names = policies(rows)
    out_dir = run_dir / "plots"
    with writing(out_dir):
        out_dir.mkdir(exist_ok=True)
    title = run_dir.name
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        ax.plot(*_series(rows, f"episode_return/{name}"), label=name)
    ax.set(xlabel="env steps", ylabel="mean episode return (last 100 episodes)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out_dir / "returns.png"))

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key in zip(axes, ("policy_loss", "value_loss", "entropy")):
        for name in names:
            ax.plot(*_series(rows, f"{key}/{name}"), label=name)
        ax.set(xlabel="env steps", title=key.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    written.append(_save(fig, out_dir / "losses.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    left.plot(*_series(rows, "env_steps_per_s"))
    left.set(xlabel="env steps", ylabel="env steps / s", title="throughput")
    left.grid(alpha=0.3)
    for section in ("env", "forward", "update"):
        right.plot(*_series(rows, f"time_share/{section}"), label=section)
    right.set(xlabel="env steps", ylabel="share of iteration time", title="time split")
    right.grid(alpha=0.3)
    right.legend()
    fig.suptitle(title)
    written.append(_save(fig, out_dir / "throughput.png"))
    if members.is_population(run_dir):
        written.append(_population_plot(plt, run_dir, rows, out_dir / "population.png"))
    return written


def _population_plot(plt, run_dir, rows, path):
    """Per policy, each setting's mean return across seeds with its bootstrap band."""
    _, config = load_run_dir_config(run_dir)
    team = population.members(config.trainer)
    names = sorted({key.split("/")[1] for key in rows[-1] if key.startswith("episode_return/")})
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label in dict.fromkeys(m.label for m in team):
            keys = [f"episode_return/{name}/{m.name}" for m in team if m.label == label]
            steps, mean, low, high = [], [], [], []
            for row in rows:
                values = [row[k] for k in keys if row.get(k) is not None]
                if values:
                    steps.append(row["env_steps"])
                    mean.append(sum(values) / len(values))
                    interval = population.bootstrap_interval(values, resamples=400)
                    low.append(interval[0])
                    high.append(interval[1])
            ax.plot(steps, mean, label=f"{label} ({len(keys)} seeds)")
            ax.fill_between(steps, low, high, alpha=0.25)
        ax.set(xlabel="env steps", ylabel="mean episode return (last 100 episodes)",
               title=f"{name}: mean over seeds, 95% bootstrap band")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(run_dir.name)
    return _save(fig, path)


def _save(fig, path):
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.plot", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run directory written by python -m gpusim.train")
    args = parser.parse_args(argv)
    try:
        for path in plot_run(args.run_dir):
            print(path)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
