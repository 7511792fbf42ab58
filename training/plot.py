"""`python -m gpusim.plot RUN_DIR`: PNG learning curves from a run's metrics.jsonl.

Writes RUN_DIR/plots/returns.png (mean episode return per policy),
losses.png (policy loss, value loss, entropy per policy) and
throughput.png (env steps/s and the time split).
"""
from __future__ import annotations

import sys
from pathlib import Path

from gpusim.errors import GpusimError, writing

from . import metrics
from .arguments import ArgumentParser


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
    return written


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
