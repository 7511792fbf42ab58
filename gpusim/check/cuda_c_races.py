"""`check_cuda_c_races(env)`: an env's CUDA C kernels under ThreadSanitizer, on a CPU.

The env's `cuda_c_reset` and `cuda_c_step` kernels run in a standalone program
compiled with g++ against gpusim's host shim and `-fsanitize=thread`
(gpusim.check.host_shim.race_check): one std::thread per GPU thread, the
shim's barrier the only synchronisation, so two threads of a block touching
one element between two `__syncthreads()`, one of them writing, is a reported
data race. The launches use the env's own arrays (with its generated argument
header) at a step that ends an episode where the env's rollout reaches one, so
the auto-reset runs too. Needs g++ 11 or newer with ThreadSanitizer, no GPU.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch

from gpusim.backends.cuda_c import (GENERATED_HEADER, args_header, header_params, include_dirs,
                                    locate)
from gpusim.check.compare import actions_to, as_numpy, random_actions
from gpusim.check.host_shim import compiler_problem, race_check, tsan_problem
from gpusim.errors import GpusimError


def check_cuda_c_races(env, *, steps: int = 200, repeats: int = 3, seed: int = 0,
                       build_dir=None) -> list:
    """The data races ThreadSanitizer finds in `env`'s CUDA C kernels, one line each
    (`[]`: none), with the threads' kernels, source lines and the access of each.

    The env (any backend; its arrays are copied to the CPU) is reset with `seed` and
    stepped with random actions until a replica finishes (at most `steps` steps);
    from the state before that step the step kernel runs, then the reset kernel, the
    pair `repeats` times. `build_dir` keeps the generated program (else a temporary
    folder). Raises GpusimError, in one line, where the env has no CUDA C kernels or
    g++ or ThreadSanitizer cannot run here; the env's arrays are left as they were.
    """
    if env.cuda_c_reset is None or env.cuda_c_step is None:
        raise GpusimError(f"env {env.name} has no CUDA C kernels (cuda_c_reset and "
                          "cuda_c_step name none)")
    if build_dir is not None:
        Path(build_dir).mkdir(parents=True, exist_ok=True)
        return _check(env, steps, repeats, seed, Path(build_dir))
    with tempfile.TemporaryDirectory(prefix="gpusim_tsan_") as folder:
        return _check(env, steps, repeats, seed, Path(folder))


def _check(env, steps, repeats, seed, build_dir) -> list:
    problem = compiler_problem(build_dir) or tsan_problem(build_dir)
    if problem:
        raise GpusimError(f"the CUDA C race check cannot run here: {problem.splitlines()[0]}")
    arrays = _arrays_before_an_end(env, steps, seed)
    s, p = env.arrays.views, env._params
    (build_dir / GENERATED_HEADER).write_text(args_header(s, p, env.name))
    generated = header_params(s, p)
    by_file = {}  # source -> its launches: one program per file, the step's first
    for spec in (env.step_kernel_spec(), env.reset_kernel_spec()):
        source, function = locate(spec)
        by_file.setdefault(source, []).append((function, [a.copy() for a in arrays], list(p)))
    reports = []
    for source, launches in by_file.items():
        report = race_check(source.read_text(), source.name, launches, env.num_envs,
                            env.num_agents, build_dir, include_dirs(source, build_dir),
                            repeats=repeats, generated=generated)
        reports += summarize(report, " and ".join(f for f, _, _ in launches))
    return list(dict.fromkeys(reports))


def _arrays_before_an_end(env, steps, seed) -> list:
    """Every array of `env` (numpy copies, in kernel-parameter order) before the first step
    of a random rollout in which a replica finishes, or its last step; the actions of
    that step written. The env's arrays are restored."""
    saved = {name: t.clone() for name, t in env.arrays.tensors.items()}
    generator = torch.Generator().manual_seed(seed)
    try:
        env.reset(seed=seed)
        for t in range(steps):
            before = {name: t.clone() for name, t in env.arrays.tensors.items()}
            actions = actions_to(random_actions(generator, env), env.device)
            env.step(actions)
            ended = bool(env.arrays["reset_mask"].any())
            if ended or t == steps - 1:
                for name, tensor in before.items():
                    if name not in ("actions", "continuous_actions"):
                        env.arrays.tensors[name].copy_(tensor)
                break
        return [as_numpy(env.arrays[name]).copy() for name in env.arrays.views._fields]
    finally:
        for name, tensor in saved.items():
            env.arrays.tensors[name].copy_(tensor)


_HEADLINE = re.compile(r"WARNING: ThreadSanitizer: (.+?) \(pid=")
_ACCESS = re.compile(r"^\s*(Previous )?(Write|Read|Atomic write|Atomic read) of size \d+ at "
                     r"\S+ by thread (T\d+)", re.I)
_FRAME = re.compile(r"^\s*#0 (\S+?)(?:\(.*?\))? (\S+?):(\d+)")


def summarize(report: str, kernel: str) -> list:
    """One line per ThreadSanitizer warning of `report`: what, and each access's kind,
    thread, function and file:line; a report it cannot parse gives its first line."""
    if not report:
        return []
    if "ThreadSanitizer" not in report:  # race_check's own line (it names the kernel)
        return [report.splitlines()[0]]
    lines = []
    for block in report.split("==================")[1:]:
        headline = _HEADLINE.search(block)
        if headline is None:
            continue
        accesses, rows = [], block.splitlines()
        for k, row in enumerate(rows):
            access = _ACCESS.match(row)
            frame = next((_FRAME.match(r) for r in rows[k + 1:k + 3] if _FRAME.match(r)), None)
            if access and frame:
                accesses.append(f"{access.group(2).lower()} by thread {access.group(3)} in "
                                f"{frame.group(1)} ({Path(frame.group(2)).name}:{frame.group(3)})")
        lines.append(f"kernel {kernel}: {headline.group(1)}: " + "; ".join(accesses)
                     + " (two threads of a block touch one element between two "
                       "__syncthreads(), one writing)")
    return lines or [f"{kernel}: {report.splitlines()[0]}"]
