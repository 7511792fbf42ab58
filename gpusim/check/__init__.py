"""`check_env`: validate an environment the way gpusim will use it.

    from gpusim.check import check_env
    result = check_env(env)                        # prints one PASS/FAIL line per check
    assert result.ok, result

Checks, in order (names as printed; pass any of them in `skip=` to leave it out):

- `attributes`  num_agents and obs_dim are positive integers; the env declares
                actions (action_nvec, action_box or policy_actions);
                policies map names to agent ids covering every agent exactly once;
                agent_names holds one distinct, non-empty name per agent;
                config_class is a dataclass with a `load` classmethod.
- `reset`       reset() returns obs of shape (num_envs, num_agents, obs_dim),
                float32, on env.device, and the reset phases write every entry.
- `seeding`     reset(seed=s) and reset(seed=s+1) differ, and (with several
                replicas) replicas do not all start from the same state.
- `step`        step() returns (obs, reward, terminated, truncated, info) with the
                documented shapes, dtypes and device; on every step of the rollout
                the step phases write every obs and reward entry and the
                terminated and truncated flag of every replica, and an action
                mask (`action_mask_array`) leaves every agent a legal choice in
                each discrete action component.
- `finite`      no NaN or Inf in obs, reward or final_obs over the rollout (and,
                where the races check replayed that step, the phase, agent and
                source line that wrote the first one).
- `auto_reset`  some episode ends within `steps`; reset_mask equals
                terminated | truncated; terminated and truncated are never both
                set; a finished replica's new observation differs from its
                final one; and after an auto-reset every state and obs entry that
                is the same in all initial states (a timestep of 0, a full
                count, ...) has that value again.
- `coverage`    how the rollout's episodes ended (by termination, by truncation)
                and how many agents left play (per-agent done); WARN for each of
                these that never happened (that path is untested), of the ways
                the env says its episodes end (`Env.episode_ends`); FAIL for a
                way it says they never end.
- `races`       the reset and the rollout's steps replayed thread by thread over
                recording arrays (gpusim.check.races; every step of a small env, a
                budget of accesses for a large one): no race between the agents of
                a phase, no entry of another agent or replica written.
- `reference`   agreement with a NumPy reference (only with `reference=`; see below).
- `determinism` two fresh instances (same class, config, backend and seed; at most
                64 replicas), stepped with the same actions, give bit-identical
                observations, rewards, flags and final observations, and end in
                the same state, RNG streams included.
- `backends`    agreement with the same env on another backend (only with
                `compare_backend=`, e.g. "cudasim" to run the GPU kernel code on
                the CPU).

On the `cpu` backend the reset, seeding and rollout launches run the env's
kernels compiled with numba's bounds checks (gpusim.check.bounds; separate
compile-cache entries, so the first check_env of an env compiles them once):
an index out of bounds fails the check in one line naming the array, the index,
the agent and replica, the phase and the source line.

The rollout behind step, finite, auto_reset, coverage, races and reference runs
on `env` itself after `env.reset(seed=seed)`, with random actions drawn from a
torch generator seeded with `seed` (uniform over each discrete component, and
uniform over a range 10% wider than the bounds for continuous ones), or with
`policy(obs, step)`, or `actions[step]`.

Reference protocol: `reference(state, actions)` is a callable taking
- `state`: a dict of numpy arrays, the env's `get_state(include_rng=True)` for the
  first `reference_envs` replicas (arrays of scope "global" whole): `rng_state` holds
  the RNG streams, so a reference whose step draws random numbers draws the same ones
  with `gpusim.rng.uniform(state["rng_state"], replica, agent)` (the same function,
  on numpy arrays) and may return the advanced streams to have them compared;
- `actions`: int32 numpy array (replicas, num_agents, len(action_nvec)), or
  float32 (replicas, num_agents, Box dims) for continuous actions, not yet
  clipped; a dict policy name -> array (replicas, its agents, its width)
  when policies act differently;
and returning `(next_state, obs, reward, terminated, truncated)` for one step
*without* auto-reset: `next_state` a dict holding any subset of the state
arrays, `obs` (replicas, num_agents, obs_dim), `reward` (replicas,
num_agents), `terminated` and `truncated` (replicas,) bool. For replicas
that finish, `obs` is the final observation (compared with
`info["final_obs"]`) and their `next_state` is not compared (the env has
already reset them). The comparison follows the env's own rollout, feeding
the reference the env's state before every step; floats must agree to
`atol + rtol * |reference|`, everything else exactly. Adapters for the
bundled envs: `gpusim.envs.tag_continuous.reference.check_env_reference(config)`
and `gpusim.envs.cartpole.reference.check_env_reference(config)`.

check_env never raises for a failing check: an exception inside a check is
reported as that check's failure. Bad arguments raise at once. The env is
reset and stepped (with several seeds) during the checks, and every one of
its arrays, and its seed, are restored at the end.

Also here: `check_kernel_races` (a raw numba CUDA kernel under the simulator,
gpusim.check.raw), `check_cuda_c_races` (an env's CUDA C kernels under
ThreadSanitizer, gpusim.check.cuda_c_races), and `first_nonfinite` /
`env_nonfinite_message` (gpusim.check.nonfinite), which name the first NaN or
Inf of a rollout's tensors.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from gpusim.backends import get_backend
from gpusim.check import checks, races, static_races
from gpusim.check.bounds import checked_kernels
from gpusim.check.compare import ActionSource, BadActions, action_problem, one_line
from gpusim.check.coverage import Warning_, coverage
from gpusim.check.replay import KernelFault
from gpusim.check.nonfinite import env_nonfinite_message, first_nonfinite  # noqa: F401
from gpusim.check.rollout import record_initial_states, record_rollout
from gpusim.env import Env

CHECKS = ("attributes", "reset", "seeding", "step", "finite", "auto_reset", "coverage",
          "races", "static_races", "reference", "determinism", "backends")
_ROLLOUT_CHECKS = frozenset({"step", "finite", "auto_reset", "coverage", "races", "reference"})
DEFAULT_STEPS = 500


@dataclass
class Check:
    """One check's outcome. `skipped` checks count as ok, and so do warnings (`warning`:
    something the check could not see, such as a path the rollout never took)."""
    name: str
    ok: bool
    message: str
    skipped: bool = False
    warning: bool = False
    fault: bool = False  # failed on an index out of bounds (gpusim.check.replay.KernelFault)

    @property
    def status(self) -> str:
        if self.skipped:
            return "SKIP"
        return ("WARN" if self.warning else "PASS") if self.ok else "FAIL"

    def __str__(self):
        return f"{self.status} {self.name}: {self.message}"


@dataclass
class CheckResult:
    """The checks in order; `ok` (and truth value) is true when none failed."""
    env_name: str
    checks: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list:
        return [c for c in self.checks if not c.ok]

    @property
    def warnings(self) -> list:
        return [c for c in self.checks if c.warning]

    @property
    def names(self) -> tuple:
        return tuple(c.name for c in self.checks)

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named '{name}' (checks: {', '.join(self.names)})")

    def __iter__(self):
        return iter(self.checks)

    def __len__(self):
        return len(self.checks)

    def __bool__(self):
        return self.ok

    def __str__(self):
        return "\n".join(str(c) for c in self.checks)


def check_env(env, reference=None, *, steps: int | None = None, seed: int = 0,
              policy=None, actions=None,
              reference_steps: int = 200, reference_envs: int = 8,
              atol: float = 2e-5, rtol: float = 1e-5,
              compare_backend=None, compare_steps: int = 30,
              skip=(), verbose: bool = True) -> CheckResult:
    """Run every check on `env` (a gpusim.Env instance); print and return the results.

    steps: length of the rollouts (500 by default, or len(actions)); long enough for
        episodes to end.
    policy, actions: what the rollouts do, instead of random actions (uniform over each
        action component, drawn by a torch generator seeded with `seed`):
        `policy(obs, step)` returns the actions for the observation `obs` at step `step`
        (a scripted policy that reaches a rare path), `actions[step]` gives them in
        turn; either in any form `env.step` takes. The same in every rollout.
    reference, reference_steps, reference_envs, atol, rtol: the `reference`
        check (see the package docstring for the protocol).
    compare_backend, compare_steps: the `backends` check: the env's class on
        that backend (min(num_envs, 2) replicas) against the same on env's own
        backend, stepped `compare_steps` times, floats to atol/rtol.
    skip: names of checks to leave out (reported as SKIP).
    verbose: print one line per check.
    """
    if steps is None:
        steps = len(actions) if _sized(actions) else DEFAULT_STEPS
    _check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
                     compare_steps, skip, policy, actions)
    other_backend = get_backend(compare_backend, quiet=True) \
        if isinstance(compare_backend, str) else compare_backend
    skipped = {name: "skipped (skip=)" for name in skip}  # name -> why
    if reference is None:
        skipped.setdefault("reference", "no reference given")
    if other_backend is None:
        skipped.setdefault("backends", "no compare_backend given")
    source = ActionSource(seed, policy, actions)

    result = CheckResult(getattr(env, "name", type(env).__name__))
    saved = {name: t.clone() for name, t in env.arrays.tensors.items()}
    saved_seed = env.seed
    try:
        with checked_kernels(env):
            # The initial states before the rollout: a reset phase that leaves an entry
            # alone would otherwise carry the rollout's values into them.
            samples = None if "seeding" in skipped else record_initial_states(env, seed)
            watch = None if "races" in skipped else races.RaceWatch(env)
            rollout = None if _ROLLOUT_CHECKS.issubset(skipped) else record_rollout(
                env, steps, seed, None if "reference" in skipped else reference,
                reference_steps=reference_steps, reference_envs=reference_envs, atol=atol,
                rtol=rtol, source=source, watch=watch)
        run = {
            "attributes": lambda: checks.attributes(env),
            "reset": lambda: checks.reset(env, seed),
            "seeding": lambda: checks.seeding(samples),
            "step": lambda: checks.step(rollout),
            "finite": lambda: checks.finite(rollout, watch and watch.nonfinite),
            "auto_reset": lambda: checks.auto_reset(rollout, samples),
            "coverage": lambda: coverage(rollout, env.episode_ends),
            "races": lambda: races.races(watch),
            "static_races": lambda: static_races.static_races(env, watch),
            "reference": lambda: checks.reference(rollout),
            "determinism": lambda: checks.determinism(env, steps, seed, source),
            "backends": lambda: checks.backends(env, other_backend, min(compare_steps, steps),
                                                seed, atol, rtol, source),
        }
        for name in CHECKS:
            fault = next((c for c in result.checks if c.fault), None)
            if name in skipped:
                check = Check(name, True, skipped[name], skipped=True)
            elif fault is not None and name in ("determinism", "backends"):
                check = Check(name, False, "not run: a phase indexes an array out of bounds "
                                           f"(see the {fault.name} check)")
            elif name == "reset":
                with checked_kernels(env):
                    check = _run_one(name, run[name])
            else:
                check = _run_one(name, run[name])
            result.checks.append(check)
            if verbose:
                print(check, flush=True)
    finally:
        for name, tensor in saved.items():
            env.arrays.tensors[name].copy_(tensor)
        env.seed = saved_seed
    return result


def _sized(actions) -> bool:
    return actions is not None and hasattr(actions, "__len__")


def _run_one(name, check) -> Check:
    try:
        message = check()
    except (checks.Failure, races.Failure, static_races.Failure) as failure:
        return Check(name, False, str(failure))
    except Warning_ as warning:
        return Check(name, True, str(warning), warning=True)
    except KernelFault as fault:
        return Check(name, False, str(fault), fault=True)
    except BadActions:
        raise  # policy= or actions= is wrong, not the env
    except Exception as exc:  # a crash inside the env is that check's failure
        return Check(name, False, f"raised {type(exc).__name__}: {one_line(exc)}")
    return Check(name, True, message)


def _check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
                     compare_steps, skip, policy=None, actions=None):
    if not isinstance(env, Env):
        raise TypeError(f"check_env needs an instance of gpusim.Env, got {type(env).__name__}"
                        + (" (a class: instantiate it first)" if isinstance(env, type) else ""))
    if not hasattr(env, "arrays"):
        raise TypeError(f"{type(env).__name__} instance is not initialised "
                        "(did its __init__ call Env.__init__?)")
    for key, value, low in (("steps", steps, 1), ("reference_steps", reference_steps, 1),
                            ("reference_envs", reference_envs, 1),
                            ("compare_steps", compare_steps, 1), ("seed", seed, 0)):
        if not checks.is_int_at_least(value, low):
            raise ValueError(f"check_env: {key} must be an integer >= {low}, got {value!r}")
    for key, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"check_env: {key} must be a number >= 0, got {value!r}")
    if reference is not None and not callable(reference):
        raise TypeError("check_env: reference must be a callable (state, actions) -> "
                        "(next_state, obs, reward, terminated, truncated), "
                        f"got {type(reference).__name__}")
    if policy is not None and actions is not None:
        raise ValueError("check_env: pass policy= or actions=, not both")
    if policy is not None and not callable(policy):
        raise TypeError("check_env: policy must be a callable (obs, step) -> actions, "
                        f"got {type(policy).__name__}")
    if actions is not None:
        if not _sized(actions) or not hasattr(actions, "__getitem__"):
            raise TypeError("check_env: actions must be a sequence of per-step actions "
                            f"(a list, or a tensor with a leading step axis), got "
                            f"{type(actions).__name__}")
        if len(actions) < steps:
            raise ValueError(f"check_env: actions holds {len(actions)} steps but steps is "
                             f"{steps}; pass steps={len(actions)} or more actions")
        for t in range(steps):
            problem = action_problem(env, actions[t])
            if problem:
                raise BadActions(f"check_env: actions[{t}] gives {problem}")
    if isinstance(skip, str):
        raise TypeError("check_env: skip must be a collection of check names, not a string")
    unknown = set(skip) - set(CHECKS)
    if unknown:
        raise ValueError(f"check_env: unknown check names in skip: {sorted(unknown)} "
                         f"(checks: {', '.join(CHECKS)})")


def __getattr__(name):
    """The checks that import heavier modules, imported when first asked for (numba's
    CUDA simulator; the CUDA C toolchain)."""
    if name == "check_kernel_races":
        from gpusim.check.raw import check_kernel_races
        return check_kernel_races
    if name == "check_cuda_c_races":
        from gpusim.check.cuda_c_races import check_cuda_c_races
        return check_cuda_c_races
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
