"""Watch episodes: `python -m gpusim.render RUN_DIR_OR_ENV --episodes 1 --out episode.gif`.

From a run directory the run's trained policies act (its latest checkpoint);
from an env name (or `module:Class`) every policy acts uniformly at random.
One replica is recorded: each step copies the arrays a frame needs
(`env.render_arrays`) into buffers on the device, and they come to the host
once, at the end. The env draws a frame (`env.draw(ax, frame)`); matplotlib
writes the animation headless (GIF with Pillow; MP4 needs ffmpeg). A frame
shows the state before a step, so an episode's last frame is the state
before its final step (the auto-reset has already replaced the final state).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from gpusim.arguments import ArgumentParser, int_in, output_file
from gpusim.envs import env_class
from gpusim.errors import GpusimError, writing
from ..actors import Actors
from ..run_config import load_run_dir_config
from .evaluation import load_policies

ANIMATIONS = (".gif", ".mp4")
MAX_STEPS = 100_000  # frames are kept on the device, then drawn one by one
MAX_REPLICA = 1_000_000  # the env is built with replica + 1 replicas


@torch.no_grad()
def record(env, models: dict, episodes: int = 1, replica: int = 0, max_steps: int = 10_000,
           every: int = 1) -> list:
    """Frames (dicts of numpy arrays) of `episodes` episodes of one replica."""
    if not env.render_arrays:
        raise GpusimError(f"env {env.name} cannot be rendered (it names no render_arrays)")
    if not 0 <= replica < env.num_envs:
        raise GpusimError(f"--replica must lie in 0..{env.num_envs - 1}, got {replica}")
    actors = Actors(env, models)
    names = env.render_arrays
    frames = {n: torch.empty((max_steps,) + tuple(env.arrays[n].shape[1:]),
                             dtype=env.arrays[n].dtype, device=env.device) for n in names}
    ended = torch.zeros(max_steps, dtype=torch.bool, device=env.device)
    obs = env.reset()
    steps = 0
    finished = 0
    while finished < episodes and steps < max_steps:
        for n in names:
            frames[n][steps].copy_(env.arrays[n][replica])
        actors.act(obs)
        obs, _, terminated, truncated, _ = env.step()
        actors.episode_ended(terminated | truncated, env.agent_active())
        ended[steps] = terminated[replica] | truncated[replica]
        steps += 1
        if steps % 64 == 0 or steps == max_steps:  # a host read now and then, not per step
            finished = int(ended[:steps].sum())
    finished_at = ended[:steps].nonzero().flatten().tolist()
    last = finished_at[episodes - 1] + 1 if len(finished_at) >= episodes else steps
    host = {n: frames[n][:last:every].cpu().numpy() for n in names}  # the one copy
    return [{n: host[n][k] for n in names} for k in range(len(host[names[0]]))]


def write_animation(env, frames: list, out: Path, fps: int = 20, every: int = 1):
    """Draw every frame with `env.draw` and write a GIF or MP4, headless."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import animation
    except ImportError:
        raise GpusimError("rendering needs matplotlib: pip install 'gpusim[plot]'") from None
    suffix = output_file(out, ANIMATIONS).suffix.lower()
    if suffix == ".mp4" and not animation.FFMpegWriter.isAvailable():
        raise GpusimError("writing MP4 needs ffmpeg on PATH; write a .gif instead")
    fig, ax = plt.subplots(figsize=(4, 4), dpi=72)

    def draw(k):
        ax.clear()
        env.draw(ax, frames[k])
        ax.set_title(f"{env.name}  step {k * every}", fontsize=9)
    movie = animation.FuncAnimation(fig, draw, frames=len(frames))
    writer = animation.PillowWriter(fps=fps) if suffix == ".gif" else \
        animation.FFMpegWriter(fps=fps)
    with writing(out):
        movie.save(out, writer=writer)
    plt.close(fig)


def render(source: str, out, episodes: int = 1, replica: int = 0, seed: int = 0,
           every: int = 1, max_steps: int = 10_000, member=None) -> int:
    """Render episodes of a run (trained policies; a population's: member `member`, default
    its best) or an env (random policies); frame count."""
    path = Path(source)
    if (path / "config.yaml").is_file():
        cls, config = load_run_dir_config(path)
        env = cls(num_envs=replica + 1, backend="cpu", seed=seed, config=config.env)
        models = load_policies(path, env, member)
    else:
        if member is not None:
            raise GpusimError("--member picks a population run's member; "
                              f"{source} is an env, not a run directory")
        cls = env_class(source)
        env = cls(num_envs=replica + 1, backend="cpu", seed=seed)
        models = {}
    frames = record(env, models, episodes, replica, max_steps, every)
    write_animation(env, frames, Path(out), every=every)
    return len(frames)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.render", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="a run directory (trained policies) or an env name "
                                       "or module:Class (random policies)")
    parser.add_argument("--out", default="episode.gif", help="episode.gif or episode.mp4")
    parser.add_argument("--episodes", type=int_in(1), default=1)
    parser.add_argument("--replica", type=int_in(0, MAX_REPLICA), default=0,
                        help="which replica to record")
    parser.add_argument("--seed", type=int_in(0, 2**64 - 1), default=0)
    parser.add_argument("--every", type=int_in(1), default=1, help="keep every n-th frame")
    parser.add_argument("--max_steps", type=int_in(1, MAX_STEPS), default=10_000,
                        help="frames recorded at most (kept in memory until written)")
    parser.add_argument("--member", help="a population run: the member to watch (m3; "
                                         "default: the best by its last logged return)")
    args = parser.parse_args(argv)
    try:
        output_file(args.out, ANIMATIONS)  # before recording, not after
        count = render(args.source, args.out, args.episodes, args.replica, args.seed,
                       args.every, args.max_steps, args.member)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"{args.out}: {count} frames")
    return 0
