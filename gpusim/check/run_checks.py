"""`check_env`: the checks run in order on an env, each reported in one line.

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
- `static_races` every agent phase's source read, not run (gpusim.check.static_races):
                a write at an index that does not depend on the agent, with no
                single-agent guard and not atomic, or a read there of an array
                the phase writes at the agent's own, "may race" (unless the
                `races` check already reported it).
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
"""
from __future__ import annotations

from gpusim.backends import get_backend
from gpusim.check import checks, races, static_races
from gpusim.check.argument_checks import check_arguments, sized
from gpusim.check.bounds import checked_kernels
from gpusim.check.compare import ActionSource, BadActions, one_line
from gpusim.check.coverage import Warning_, coverage
from gpusim.check.kernel_replay import KernelFault
from gpusim.check.report import CHECKS, Check, CheckResult
from gpusim.check.rollout_facts import record_initial_states, record_rollout

_ROLLOUT_CHECKS = frozenset({"step", "finite", "auto_reset", "coverage", "races", "reference"})
DEFAULT_STEPS = 500


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
        check (see gpusim.check.run_checks for the protocol).
    compare_backend, compare_steps: the `backends` check: the env's class on
        that backend (min(num_envs, 2) replicas) against the same on env's own
        backend, stepped `compare_steps` times, floats to atol/rtol.
    skip: names of checks to leave out (reported as SKIP).
    verbose: print one line per check.
    """
    if steps is None:
        steps = len(actions) if sized(actions) else DEFAULT_STEPS
    check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
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
