"""`check_env`: validate an environment the way gpusim will use it.

    from gpusim.check import check_env
    result = check_env(env)                        # prints one PASS/FAIL line per check
    assert result.ok, result

Checks, in order (names as printed; pass any of them in `skip=` to leave it out):

- `attributes`  num_agents, obs_dim and action_nvec are positive integers;
                policies map names to agent ids covering every agent exactly once;
                config_class is a dataclass with a `load` classmethod.
- `reset`       reset() returns obs of shape (num_envs, num_agents, obs_dim),
                float32, on env.device, and the reset phases write every entry.
- `seeding`     reset(seed=s) and reset(seed=s+1) differ, and (with several
                replicas) replicas do not all start from the same state.
- `step`        step() returns (obs, reward, terminated, truncated, info) with the
                documented shapes, dtypes and device; on every step of the rollout
                the step phases write every obs and reward entry and the
                terminated and truncated flag of every replica.
- `finite`      no NaN or Inf in obs, reward or final_obs over the rollout.
- `auto_reset`  some episode ends within `steps`; reset_mask equals
                terminated | truncated; terminated and truncated are never both
                set; a finished replica's new observation differs from its
                final one; and after an auto-reset every state and obs entry that
                is the same in all initial states (a timestep of 0, a full
                count, ...) has that value again.
- `reference`   agreement with a NumPy reference (only with `reference=`; see below).
- `determinism` two fresh instances (same class, config, backend and seed; at most
                64 replicas), stepped with the same random actions, give
                bit-identical observations, rewards, flags and final observations,
                and end in the same state, RNG streams included.
- `backends`    agreement with the same env on another backend (only with
                `compare_backend=`, e.g. "cudasim" to run the GPU kernel code,
                with bounds checks, on the CPU).

The rollout behind step, finite, auto_reset and reference runs on `env`
itself after `env.reset(seed=seed)`, with actions uniform over each action
component drawn from a torch generator seeded with `seed`.

Reference protocol: `reference(state, actions)` is a callable taking
- `state`: a dict of numpy arrays, the env's `get_state()` for the first
  `reference_envs` replicas (arrays of scope "global" whole);
- `actions`: int32 numpy array (replicas, num_agents, len(action_nvec));
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

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch

from gpusim.env import Env

CHECKS = ("attributes", "reset", "seeding", "step", "finite", "auto_reset", "reference",
          "determinism", "backends")

# Written into obs and reward before reset/step: an entry still holding it was not written.
SENTINEL = np.float32(-2.4691357e38)
_FLAG_SENTINEL = 2  # byte value written into the bool flags before a step
_FRESH_MAX_ENVS = 64  # replicas of the fresh instances built for determinism
_MIN_RESET_SAMPLES = 16  # initial states looked at to tell constant entries from random ones


@dataclass
class Check:
    """One check's outcome. `skipped` checks count as ok."""
    name: str
    ok: bool
    message: str
    skipped: bool = False

    @property
    def status(self) -> str:
        return "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")

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


class _Fail(Exception):
    """Raised inside a check to report its failure with a message."""


def check_env(env, reference=None, *, steps: int = 500, seed: int = 0,
              reference_steps: int = 200, reference_envs: int = 8,
              atol: float = 2e-5, rtol: float = 1e-5,
              compare_backend=None, compare_steps: int = 30,
              skip=(), verbose: bool = True) -> CheckResult:
    """Run every check on `env` (a gpusim.Env instance); print and return the results.

    steps: length of the random rollouts (actions uniform over each action
        component, drawn by a torch generator seeded with `seed`); long enough
        for episodes to end.
    reference, reference_steps, reference_envs, atol, rtol: the `reference`
        check (see the module docstring for the protocol).
    compare_backend, compare_steps: the `backends` check: the env's class on
        that backend (min(num_envs, 2) replicas) against the same on env's own
        backend, stepped `compare_steps` times, floats to atol/rtol.
    skip: names of checks to leave out (reported as SKIP).
    verbose: print one line per check.
    """
    _check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
                     compare_steps, skip)
    other_backend = None
    if compare_backend is not None:
        from gpusim.backends import get_backend
        other_backend = compare_backend if not isinstance(compare_backend, str) \
            else get_backend(compare_backend, quiet=True)
    skip = set(skip)
    if reference is None:
        skip_reason = {"reference": "no reference given"}
    else:
        skip_reason = {}
    if other_backend is None:
        skip_reason["backends"] = "no compare_backend given"

    result = CheckResult(getattr(env, "name", type(env).__name__))
    saved = {name: t.clone() for name, t in env.arrays.tensors.items()}
    saved_seed = env.seed
    runner = _Runner(env, steps, seed, reference, reference_steps, reference_envs, atol, rtol)
    try:
        planned = {
            "attributes": runner.attributes,
            "reset": runner.reset,
            "seeding": runner.seeding,
            "step": runner.step,
            "finite": runner.finite,
            "auto_reset": runner.auto_reset,
            "reference": runner.reference,
            "determinism": runner.determinism,
            "backends": lambda: runner.backends(other_backend, compare_steps),
        }
        # In order: "seeding" samples the initial states that "auto_reset" needs, and
        # one rollout serves step, finite, auto_reset and reference.
        for name in CHECKS:
            if name in skip:
                check = Check(name, True, "skipped (skip=)", skipped=True)
            elif name in skip_reason:
                check = Check(name, True, skip_reason[name], skipped=True)
            else:
                check = _run_one(name, planned[name])
            result.checks.append(check)
            if verbose:
                print(check, flush=True)
    finally:
        for name, tensor in saved.items():
            env.arrays.tensors[name].copy_(tensor)
        env.seed = saved_seed
    return result


def _run_one(name, fn) -> Check:
    try:
        message = fn()
    except _Fail as fail:
        return Check(name, False, str(fail))
    except Exception as exc:  # a crash inside the env is that check's failure
        return Check(name, False, f"raised {type(exc).__name__}: {_one_line(exc)}")
    return Check(name, True, message)


def _one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) < 300 else text[:297] + "..."


def _check_arguments(env, reference, steps, seed, reference_steps, reference_envs, atol, rtol,
                     compare_steps, skip):
    if not isinstance(env, Env):
        raise TypeError(f"check_env needs an instance of gpusim.Env, got {type(env).__name__}"
                        + (" (a class: instantiate it first)" if isinstance(env, type) else ""))
    if not hasattr(env, "arrays"):
        raise TypeError(f"{type(env).__name__} instance is not initialised "
                        "(did its __init__ call Env.__init__?)")
    for key, value, low in (("steps", steps, 1), ("reference_steps", reference_steps, 1),
                            ("reference_envs", reference_envs, 1),
                            ("compare_steps", compare_steps, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"check_env: {key} must be an integer >= {low}, got {value!r}")
    for key, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"check_env: {key} must be a number >= 0, got {value!r}")
    if reference is not None and not callable(reference):
        raise TypeError("check_env: reference must be a callable (state, actions) -> "
                        "(next_state, obs, reward, terminated, truncated), "
                        f"got {type(reference).__name__}")
    if isinstance(skip, str):
        raise TypeError("check_env: skip must be a collection of check names, not a string")
    unknown = set(skip) - set(CHECKS)
    if unknown:
        raise ValueError(f"check_env: unknown check names in skip: {sorted(unknown)} "
                         f"(checks: {', '.join(CHECKS)})")


# ---- helpers -----------------------------------------------------------------------
def _index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _fmt(value) -> str:
    """A numpy or torch scalar as plain text: 9 significant digits for floats."""
    value = value.item() if hasattr(value, "item") else value
    return f"{value:.9g}" if isinstance(value, float) else str(value)


def _np(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _mismatch(name, got, want, atol=0.0, rtol=0.0, rows=None, labels=("got", "want")):
    """The first differing entry of `got` and `want` as text, or None.

    Floats within atol + rtol*|want| (NaN equals NaN), others exactly;
    `rows` (a bool mask over the first axis) limits the comparison.
    """
    got, want = _np(got), _np(want)
    if got.shape != want.shape:
        return f"{name} has shape {got.shape}, expected {want.shape}"
    if got.dtype.kind == "f" or want.dtype.kind == "f":
        g, w = got.astype(np.float64), want.astype(np.float64)
        close = np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True) if (atol or rtol) \
            else ((g == w) | (np.isnan(g) & np.isnan(w)))
    else:
        close = got == want
    if rows is not None:
        close = close | ~np.asarray(rows, dtype=bool).reshape((-1,) + (1,) * (close.ndim - 1))
    if close.all():
        return None
    idx = tuple(np.argwhere(~close)[0])
    return (f"{name}{_index(idx)}: {labels[0]} {_fmt(got[idx])}, {labels[1]} {_fmt(want[idx])}"
            + (f" (tolerance atol={atol:g}, rtol={rtol:g})" if (atol or rtol) else ""))


def _random_actions(generator, env, num_envs=None):
    n = env.num_envs if num_envs is None else num_envs
    cols = [torch.randint(0, int(k), (n, env.num_agents), generator=generator)
            for k in env.action_nvec]
    return torch.stack(cols, dim=-1).to(torch.int32)


def _state_rows(env, rows, with_global=True) -> dict:
    """The state arrays as numpy copies: replica-indexed ones at `rows`, global ones whole."""
    out = {}
    for name in env.arrays.state_names():
        tensor = env.arrays[name]
        if env.arrays.specs[name].scope == "global":
            if with_global:
                out[name] = _np(tensor).copy()
        else:
            out[name] = _np(tensor[rows]).copy()
    return out


def _fresh(env, seed, num_envs, backend=None):
    """Another instance of env's class: same config, given seed/backend."""
    try:
        return type(env)(num_envs=num_envs, backend=env.backend if backend is None else backend,
                         seed=seed, config=env.config, check_actions=env.check_actions)
    except Exception as exc:
        raise _Fail(f"could not build another instance as {type(env).__name__}(num_envs=..., "
                    f"backend=..., seed=..., config=env.config, check_actions=...): "
                    f"{type(exc).__name__}: {_one_line(exc)}") from None


class _Runner:
    """Holds what the checks share: the env, the rollout and the initial-state samples."""

    def __init__(self, env, steps, seed, reference, reference_steps, reference_envs, atol, rtol):
        self.env = env
        self.steps = steps
        self.seed = seed
        self.ref = reference
        self.reference_steps = min(reference_steps, steps)
        self.reference_envs = min(reference_envs, env.num_envs)
        self.atol, self.rtol = atol, rtol
        self.constant = None  # entry-wise constants of the initial states
        self.rollout_done = False
        self.failures = {}  # check name -> first failure message in the rollout
        self.stats = {}

    # ---- attributes ------------------------------------------------------------
    def attributes(self):
        env = self.env
        problems = []
        for key in ("num_agents", "obs_dim"):
            value = getattr(env, key, None)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                problems.append(f"{key} must be a positive integer, got {value!r}")
        nvec = getattr(env, "action_nvec", None)
        if (not isinstance(nvec, (tuple, list)) or not nvec
                or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1
                       for n in nvec)):
            problems.append(f"action_nvec must be a non-empty tuple of positive integers "
                            f"(choices per action component), got {nvec!r}")
        problems += self._policy_problems()
        cfg = getattr(env, "config_class", None)
        if cfg is None or not dataclasses.is_dataclass(cfg) or not hasattr(cfg, "load"):
            problems.append("config_class must be a dataclass with a load() classmethod "
                            "(subclass gpusim.config.EnvConfig)")
        if problems:
            raise _Fail("; ".join(problems))
        plural = "" if env.num_agents == 1 else "s"
        return (f"{env.num_agents} agent{plural}, obs_dim {env.obs_dim}, action_nvec "
                f"{tuple(env.action_nvec)}, policies {', '.join(env.policies)}")

    def _policy_problems(self):
        env = self.env
        policies = getattr(env, "policies", None)
        if not isinstance(policies, dict) or not policies:
            return [f"policies must be a non-empty dict of name -> agent ids, got {policies!r}"]
        num_agents = getattr(env, "num_agents", None)
        problems, owner = [], {}
        for name, ids in policies.items():
            if not isinstance(name, str) or not name:
                problems.append(f"policy names must be non-empty strings, got {name!r}")
            try:
                ids = list(ids)
            except TypeError:
                problems.append(f"policies[{name!r}] must be a sequence of agent ids")
                continue
            if not ids:
                problems.append(f"policies[{name!r}] has no agents")
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, numbers.Integral) or \
                        not isinstance(num_agents, numbers.Integral) or not 0 <= i < num_agents:
                    problems.append(f"policies[{name!r}] holds {i!r}, not an agent id "
                                    f"0..{num_agents - 1 if isinstance(num_agents, int) else '?'}")
                elif i in owner:
                    problems.append(f"agent {i} is in policies {owner[i]!r} and {name!r}")
                else:
                    owner[int(i)] = name
        if isinstance(num_agents, numbers.Integral):
            missing = [i for i in range(num_agents) if i not in owner]
            if missing:
                more = "..." if len(missing) > 10 else ""
                problems.append(f"agents {missing[:10]}{more} belong to no policy")
        return problems

    # ---- reset -----------------------------------------------------------------
    def reset(self):
        env = self.env
        env.arrays["obs"].fill_(float(SENTINEL))
        obs = env.reset(seed=self.seed)
        problems = _tensor_problems("obs", obs, (env.num_envs, env.num_agents, env.obs_dim),
                                    torch.float32, env.device)
        if problems:
            raise _Fail("reset() returned " + "; ".join(problems))
        unwritten = (obs == float(SENTINEL))
        if bool(unwritten.any()):
            idx = unwritten.nonzero()[0].tolist()
            raise _Fail(f"obs{_index(idx)} was not written by the reset phases "
                        f"(obs_dim is {env.obs_dim}: is it declared larger than the phases "
                        "fill? every obs entry must be written)")
        return f"obs {tuple(obs.shape)} float32 on {env.device}, every entry written"

    # ---- seeding (and the initial-state constants for auto_reset) --------------
    def _initial_sample(self, seed):
        env = self.env
        rows = slice(0, min(env.num_envs, _MIN_RESET_SAMPLES))
        obs = env.reset(seed=seed)
        return {"obs": _np(obs[rows]).copy(), **_state_rows(env, rows, with_global=False)}

    def seeding(self):
        env = self.env
        per_reset = min(env.num_envs, _MIN_RESET_SAMPLES)
        resets = max(4, math.ceil(_MIN_RESET_SAMPLES / per_reset))
        samples = [self._initial_sample(self.seed + k) for k in range(resets)]
        env.reset(seed=self.seed)
        # entries equal in every initial state seen (every replica, every seed)
        self.constant = {}
        for name in samples[0]:
            stacked = np.concatenate([s[name] for s in samples])
            first = stacked[0]
            same = np.all(stacked == first, axis=0)
            if stacked.dtype.kind == "f":
                same &= ~np.isnan(first)
            self.constant[name] = (same, first)
        a, b = samples[0], samples[1]
        if all(np.array_equal(a[n], b[n], equal_nan=a[n].dtype.kind == "f") for n in a):
            raise _Fail(f"reset(seed={self.seed}) and reset(seed={self.seed + 1}) give the same "
                        "states and observations: the reset phases must draw from the env's "
                        "RNG streams (gpusim.rng.uniform/randint on s.rng_state)")
        if env.num_envs >= 2:
            if all(np.all(a[n] == a[n][:1]) for n in a):
                raise _Fail(f"all {env.num_envs} replicas start from the same state: draw "
                            "with the replica's own stream, rng.uniform(s.rng_state, env, agent)")
            return "seeds change the initial state; replicas start from different states"
        return "seeds change the initial state (one replica: replicas not compared)"

    # ---- the rollout behind step / finite / auto_reset / reference ------------
    def _rollout(self):
        if self.rollout_done:
            return
        self.rollout_done = True
        self.t = 0
        try:
            self._run_rollout()
        except Exception as exc:
            self.failures["step"] = (f"at step {self.t}, the rollout raised "
                                     f"{type(exc).__name__}: {_one_line(exc)}")
            for name in ("finite", "auto_reset", "reference"):
                self.failures.setdefault(name, f"not run past step {self.t}: the rollout "
                                               "raised (see the step check)")

    def _run_rollout(self):
        env, a = self.env, self.env.arrays
        shape_problems = None
        generator = torch.Generator().manual_seed(self.seed)
        env.reset(seed=self.seed)
        finished = 0
        for t in range(self.steps):
            self.t = t
            actions = _random_actions(generator, env).to(env.device)
            want = self._reference_step(t, actions)
            a["obs"].fill_(float(SENTINEL))
            a["reward"].fill_(float(SENTINEL))
            for flag in ("terminated", "truncated"):
                a[flag].view(torch.uint8).fill_(_FLAG_SENTINEL)
            out = env.step(actions)
            if shape_problems is None:
                shape_problems = self._output_problems(out)
                if shape_problems:
                    self.failures["step"] = "step() returned " + "; ".join(shape_problems)
                    for name in ("finite", "auto_reset", "reference"):
                        self.failures.setdefault(name, "not run: step() outputs are malformed "
                                                       "(see the step check)")
                    return
            obs, reward, terminated, truncated, info = out
            self._unwritten(t, obs, reward, terminated, truncated)
            for flag in (terminated, truncated):  # sentinel bytes back to plain bools
                flag.copy_(flag.view(torch.uint8) != 0)
            done = terminated | truncated
            self._finite(t, obs, reward, info["final_obs"], done)
            n_done = int(done.sum())
            finished += n_done
            if "auto_reset" not in self.failures:
                self._auto_reset(t, obs, terminated, truncated, info, done, n_done)
            if want is not None:
                self._compare_reference(t, want, out)
        self.stats["finished"] = finished

    def _output_problems(self, out):
        env = self.env
        if not isinstance(out, tuple) or len(out) != 5:
            return ["not a 5-tuple (obs, reward, terminated, truncated, info)"]
        obs, reward, terminated, truncated, info = out
        E, A = env.num_envs, env.num_agents
        problems = _tensor_problems("obs", obs, (E, A, env.obs_dim), torch.float32, env.device)
        problems += _tensor_problems("reward", reward, (E, A), torch.float32, env.device)
        problems += _tensor_problems("terminated", terminated, (E,), torch.bool, env.device)
        problems += _tensor_problems("truncated", truncated, (E,), torch.bool, env.device)
        if not isinstance(info, dict) or not {"final_obs", "reset_mask"} <= set(info):
            problems.append("info must be a dict with 'final_obs' and 'reset_mask'")
        else:
            problems += _tensor_problems('info["final_obs"]', info["final_obs"],
                                         (E, A, env.obs_dim), torch.float32, env.device)
            problems += _tensor_problems('info["reset_mask"]', info["reset_mask"], (E,),
                                         torch.bool, env.device)
        return problems

    def _unwritten(self, t, obs, reward, terminated, truncated):
        if "step" in self.failures:
            return
        for name, tensor, unwritten in (
                ("obs", obs, obs == float(SENTINEL)),
                ("reward", reward, reward == float(SENTINEL)),
                ("terminated", terminated, terminated.view(torch.uint8) == _FLAG_SENTINEL),
                ("truncated", truncated, truncated.view(torch.uint8) == _FLAG_SENTINEL)):
            if bool(unwritten.any()):
                idx = unwritten.nonzero()[0].tolist()
                extra = (f" (obs_dim is {self.env.obs_dim}: is it declared larger than the "
                         "phases fill?)" if name == "obs" else "")
                self.failures["step"] = (
                    f"at step {t}, {name}{_index(idx)} was not written by the step phases"
                    f"{extra}: every step must write every obs and reward entry (zeros "
                    "included) and both flags of every replica")
                return

    def _finite(self, t, obs, reward, final_obs, done):
        if "finite" in self.failures:
            return
        bad_obs = ~torch.isfinite(obs)
        bad_reward = ~torch.isfinite(reward)
        bad_final = ~torch.isfinite(final_obs) & done.view(-1, 1, 1)
        if not bool(bad_obs.any() | bad_reward.any() | bad_final.any()):
            return
        for name, tensor, bad in (("obs", obs, bad_obs), ("reward", reward, bad_reward),
                                  ('info["final_obs"]', final_obs, bad_final)):
            if bool(bad.any()):
                idx = tuple(bad.nonzero()[0].tolist())
                self.failures["finite"] = (f"at step {t}, {name}{_index(idx)} = "
                                           f"{_fmt(tensor[idx])}")
                return

    def _auto_reset(self, t, obs, terminated, truncated, info, done, n_done):
        if not torch.equal(info["reset_mask"], done):
            e = int((info["reset_mask"] != done).nonzero()[0])
            self.failures["auto_reset"] = (f"at step {t}, reset_mask[{e}] is "
                                           f"{bool(info['reset_mask'][e])} but terminated | "
                                           f"truncated is {bool(done[e])}")
            return
        both = terminated & truncated
        if bool(both.any()):
            e = int(both.nonzero()[0])
            self.failures["auto_reset"] = (
                f"at step {t}, replica {e} is both terminated and truncated: set truncated "
                "only where the episode did not terminate (a truncated replica's final "
                "observation is bootstrapped by the trainer)")
            return
        if n_done == 0:
            return
        index = done.nonzero().flatten()
        rows = index.tolist()
        final = info["final_obs"]
        for e in rows:
            if torch.equal(final[e], obs[e]):
                self.failures["auto_reset"] = (
                    f"at step {t}, replica {e} finished but its new observation equals its "
                    "final one: the reset phases must draw a new initial state and write obs")
                return
        if self.constant is None:
            return
        current = {"obs": _np(obs[index]), **_state_rows(self.env, index, with_global=False)}
        for name, (same, value) in self.constant.items():
            for j, e in enumerate(rows):
                wrong = same & (current[name][j] != value)
                if wrong.any():
                    where = tuple(np.argwhere(wrong)[0])
                    self.failures["auto_reset"] = (
                        f"replica {e} finished at step {t}, but after its auto-reset "
                        f"{name}{_index((e,) + where)} = {_fmt(current[name][(j,) + where])} "
                        f"where every initial state has {_fmt(value[where])}: the reset "
                        "phases must re-initialise every state entry (and write every obs "
                        "entry)")
                    return

    # ---- reference -------------------------------------------------------------
    def _reference_step(self, t, actions):
        """The reference's outputs for this step (state taken before the step), or None."""
        if self.ref is None or t >= self.reference_steps or "reference" in self.failures:
            return None
        env, n = self.env, self.reference_envs
        state = _state_rows(env, slice(0, n))
        acts = _np(actions)[:n].copy()
        try:
            out = self.ref(state, acts)
        except Exception as exc:
            self.failures["reference"] = (f"at step {t}, the reference raised "
                                          f"{type(exc).__name__}: {_one_line(exc)}")
            return None
        if not isinstance(out, (tuple, list)) or len(out) != 5 or not isinstance(out[0], dict):
            self.failures["reference"] = ("the reference must return (next_state dict, obs, "
                                          "reward, terminated, truncated)")
            return None
        unknown = set(out[0]) - set(state)
        if unknown:
            self.failures["reference"] = (f"the reference's next_state has keys "
                                          f"{sorted(unknown)} that are not state arrays "
                                          f"(state arrays: {', '.join(sorted(state))})")
            return None
        return out

    def _compare_reference(self, t, want, out):
        if "reference" in self.failures:
            return
        env, n = self.env, self.reference_envs
        next_state, w_obs, w_reward, w_term, w_trunc = want
        obs, reward, terminated, truncated, info = out
        w_term = np.asarray(w_term, dtype=bool)
        w_trunc = np.asarray(w_trunc, dtype=bool)
        labels = ("env", "reference")
        found = (_mismatch("terminated", terminated[:n], w_term, labels=labels)
                 or _mismatch("truncated", truncated[:n], w_trunc, labels=labels)
                 or _mismatch("reward", reward[:n], w_reward, self.atol, self.rtol,
                              labels=labels))
        if not found:
            done = w_term | w_trunc
            live = ~done
            found = (_mismatch("obs", obs[:n], w_obs, self.atol, self.rtol, rows=live,
                               labels=labels)
                     or _mismatch('info["final_obs"]', info["final_obs"][:n], w_obs,
                                  self.atol, self.rtol, rows=done, labels=labels))
            if not found:
                state = _state_rows(env, slice(0, n))
                for name, value in next_state.items():
                    scope = env.arrays.specs[name].scope
                    found = _mismatch(name, state[name], value,
                                      self.atol, self.rtol,
                                      rows=None if scope == "global" else live, labels=labels)
                    if found:
                        break
        if found:
            self.failures["reference"] = (f"at step {t}: {found} (state before the step from "
                                          "env.get_state(), so earlier steps agreed)")
        else:
            self.stats["reference_steps"] = t + 1

    # ---- the checks the rollout serves ----------------------------------------
    def step(self):
        self._rollout()
        if "step" in self.failures:
            raise _Fail(self.failures["step"])
        return (f"{self.steps} steps: output shapes, dtypes and device right, every obs, "
                "reward and flag written")

    def finite(self):
        self._rollout()
        if "finite" in self.failures:
            raise _Fail(self.failures["finite"])
        return f"no NaN or Inf in obs, reward and final_obs over {self.steps} steps"

    def auto_reset(self):
        self._rollout()
        if "auto_reset" in self.failures:
            raise _Fail(self.failures["auto_reset"])
        finished = self.stats.get("finished", 0)
        if finished == 0:
            raise _Fail(f"no replica finished in {self.steps} steps, so auto-reset was not "
                        "exercised: pass a larger steps= (or a config with shorter episodes)")
        extra = "" if self.constant is not None else " (initial-state constants not checked: " \
                                                     "seeding was skipped or failed)"
        return f"{finished} episodes ended and restarted from fresh initial states{extra}"

    def reference(self):
        self._rollout()
        if "reference" in self.failures:
            raise _Fail(self.failures["reference"])
        done = self.stats.get("reference_steps", 0)
        return (f"agrees with the reference for {done} steps x {self.reference_envs} replicas "
                f"(atol={self.atol:g}, rtol={self.rtol:g})")

    # ---- determinism -----------------------------------------------------------
    def determinism(self):
        env = self.env
        n = min(env.num_envs, _FRESH_MAX_ENVS)
        first = _fresh(env, self.seed, n)
        second = _fresh(env, self.seed, n)
        found = _lockstep(first, second, self.steps, self.seed, 0.0, 0.0, ("first", "second"))
        if found:
            raise _Fail(f"two fresh instances with seed {self.seed} differ {found}: phases "
                        "must draw only from gpusim.rng on s.rng_state (no np.random, no "
                        "clock), read only arrays they or earlier phases wrote, and never "
                        "an entry another thread writes in the same phase")
        return f"two fresh instances ({n} replicas, seed {self.seed}) agree bit for bit " \
               f"over {self.steps} steps"

    # ---- backends --------------------------------------------------------------
    def backends(self, other_backend, compare_steps):
        env = self.env
        n = min(env.num_envs, 2)
        steps = min(compare_steps, self.steps)
        mine = _fresh(env, self.seed, n)
        other = _fresh(env, self.seed, n, backend=other_backend)
        found = _lockstep(mine, other, steps, self.seed, self.atol, self.rtol,
                          (env.backend.name, other.backend.name))
        if found:
            raise _Fail(f"{env.backend.name} and {other.backend.name} differ {found}")
        return (f"{env.backend.name} and {other.backend.name} agree over {steps} steps "
                f"({n} replicas)")


def _tensor_problems(name, tensor, shape, dtype, device) -> list:
    if not isinstance(tensor, torch.Tensor):
        return [f"{name} is a {type(tensor).__name__}, not a torch tensor"]
    problems = []
    if tuple(tensor.shape) != tuple(shape):
        problems.append(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if tensor.dtype != dtype:
        problems.append(f"{name} has dtype {tensor.dtype}, expected {dtype}")
    if tensor.device != device:
        problems.append(f"{name} is on {tensor.device}, expected env.device {device}")
    return problems


def _lockstep(a, b, steps, seed, atol, rtol, labels):
    """Step two envs with the same random actions; the first difference as text, or None."""
    gen = torch.Generator().manual_seed(seed)
    found = _mismatch("obs", a.reset(seed=seed), b.reset(seed=seed), atol, rtol, labels=labels)
    if found:
        return f"after reset: {found}"
    for t in range(steps):
        actions = _random_actions(gen, a)
        out_a = a.step(actions.to(a.device))
        out_b = b.step(actions.to(b.device))
        done = _np(out_a[2] | out_a[3])
        for k, name in enumerate(("obs", "reward", "terminated", "truncated")):
            found = _mismatch(name, out_a[k], out_b[k], atol, rtol, labels=labels)
            if found:
                return f"at step {t}: {found}"
        found = _mismatch('info["final_obs"]', out_a[4]["final_obs"], out_b[4]["final_obs"],
                          atol, rtol, rows=done, labels=labels)
        if found:
            return f"at step {t}: {found}"
    state_a, state_b = a.get_state(include_rng=True), b.get_state(include_rng=True)
    for name in state_a:
        exact = name == "rng_state"
        found = _mismatch(name, state_a[name], state_b[name], 0.0 if exact else atol,
                          0.0 if exact else rtol, labels=labels)
        if found:
            return f"in the state after {steps} steps: {found}"
    return None
