"""The CUDA C kernels (cuda_kernels/) of the pycuda backend, verified without a GPU.

- Their C signatures follow the argument convention: a pointer for every env
  array in the order of `env.arrays.views`, then every parameter of
  `env.params()`, with matching names and C types.
- Compiled with g++ against the host shim (tests/cuda_host/host_shim.h: one
  std::thread per GPU thread, __syncthreads() as a std::barrier), the same
  .cu source runs on the CPU as an env backend. There it must agree bit for
  bit with the portable kernels on the cpu backend (every array, the RNG
  streams and the neighbour scratch included), step after step, with state
  injection, terminal steps and auto-resets; and with the independent NumPy
  reference to the same tolerance as the portable kernels (2e-5 absolute on
  floats, exact on integers and flags): the reference's float32 cos/sin are
  numpy's own, a few ulps from libm's cosf/sinf, which both kernels use.
- Under ThreadSanitizer (same shim), the kernels have no data race, and a
  planted lost update is caught.
- nvcc compiles every .cu to PTX for sm_80 and sm_90 without a warning, and
  the backend's nvcc step fills the user's compile cache once.
- The launcher's protocol (context push/pop, stream ordering) against
  stand-ins for pycuda and torch.cuda.
- Without pycuda or a GPU, `get_backend("pycuda")` is one clear error.
Tests that need g++ (C++20) or nvcc skip, with the reason, where they are absent.
"""
import subprocess
from collections import namedtuple

import numpy as np
import pytest
import torch

import gpusim
from conftest import make_tag, random_actions, random_tag_state
from cuda_host.host_backend import (HostCBackend, build_library, call, compiler_problem,
                                    race_check, tsan_problem)
from gpusim import ActionSampler, get_backend
from gpusim.backends import pycuda_backend
from gpusim.backends.cuda_c import (TensorPointer, argument_format, find_nvcc, kernel_dir,
                                    kernel_signature, kernel_signatures, kernel_source,
                                    nvcc_command)
from gpusim.backends.pycuda_backend import PyCUDABackend
from gpusim.envs.tag_continuous.env import TagContinuous
from gpusim.errors import BackendError
from gpusim.sampler import SAMPLE_SPEC
from test_tag_vs_reference import run_against_reference

C_OF_TORCH = {torch.float32: "float", torch.int32: "int", torch.bool: "bool",
              torch.uint64: "unsigned long long"}
C_OF_NUMPY = {np.float32: "float", np.int32: "int", np.bool_: "bool"}

CONFIGS = {
    "small": dict(num_envs=3, num_taggers=3, num_runners=12),
    "full_observation": dict(num_envs=3, num_taggers=2, num_runners=9,
                             use_full_observation=True),
    "runners_stay": dict(num_envs=3, num_taggers=3, num_runners=12,
                         runner_exits_game_after_tagged=False, tagging_distance=0.05),
    "k_above_agents_left": dict(num_envs=4, num_taggers=2, num_runners=5,
                                num_other_agents_observed=8, episode_length=60),
    "tags_penalties_custom_ids": dict(num_envs=3, num_taggers=3, num_runners=9,
                                      tagger_ids=[1, 4, 9], edge_hit_penalty=-0.5,
                                      step_penalty_for_tagger=-0.01, step_reward_for_runner=0.02,
                                      skill_level_runner=0.8, grid_length=5.0,
                                      tagging_distance=0.1),
    "two_agents": dict(num_envs=6, num_taggers=1, num_runners=1, num_other_agents_observed=1,
                       tagging_distance=0.1, grid_length=4.0, episode_length=40),
    "5+40": dict(num_envs=2, num_taggers=5, num_runners=40),
}


@pytest.fixture(scope="module")
def host_backend(tmp_path_factory):
    build_dir = tmp_path_factory.mktemp("cuda_host")
    problem = compiler_problem(build_dir)
    if problem:
        pytest.skip(f"the CUDA C kernels run on the CPU through the C++20 host shim: {problem}")
    return HostCBackend(build_dir)


# ---- the argument convention ----------------------------------------------------------------
def expected_arguments(array_names, array_dtypes, params):
    return ([(name, C_OF_TORCH[dtype], True) for name, dtype in zip(array_names, array_dtypes)]
            + [(name, C_OF_NUMPY[type(value)], False) for name, value in params.items()])


def parsed(file, function):
    return [tuple(p) for p in kernel_signature(kernel_source(file), function, file)]


@pytest.mark.parametrize("config", [{}, dict(use_full_observation=True, num_runners=7)])
def test_tag_signatures_follow_the_env_arrays_and_params(config):
    env = make_tag(num_envs=1, **config)
    names = env.arrays.views._fields
    expected = expected_arguments(names, [env.arrays.specs[n].dtype for n in names],
                                  env._params._asdict())
    for spec in (env.reset_kernel_spec(), env.step_kernel_spec()):
        file, _, function = spec.cuda_c.partition(":")
        assert parsed(file, function) == expected, spec.name


def test_sampler_signature_follows_the_sampler_arrays_and_params():
    env = make_tag(num_envs=2, num_taggers=1, num_runners=1)
    sampler = ActionSampler(env)
    probs = torch.zeros((2, 2, sampler.width))
    arrays = sampler._arrays_for(probs)
    params = sampler.params(False, False)
    dtypes = [torch.from_numpy(a).dtype for a in arrays]
    file, _, function = SAMPLE_SPEC.cuda_c.partition(":")
    assert parsed(file, function) == expected_arguments(arrays._fields, dtypes, params._asdict())


def test_every_named_kernel_exists_and_is_packaged():
    named = [TagContinuous.cuda_c_reset, TagContinuous.cuda_c_step, SAMPLE_SPEC.cuda_c]
    for name in named:
        file, _, function = name.partition(":")
        assert function in kernel_signatures(kernel_source(file))
    assert {p.name for p in kernel_dir().glob("*.cu")} >= {"tag_continuous.cu", "sampler.cu"}


def test_argument_check_names_the_difference():
    params = kernel_signature(kernel_source("sampler.cu"), "sample_actions")
    arrays_type = namedtuple("A", ("rng_state", "actions", "log_prob", "nvec", "offsets", "probs"))
    dtypes = (torch.uint64, torch.int32, torch.float32, torch.int32, torch.int32, torch.float32)
    arrays = arrays_type(*(TensorPointer(torch.zeros(2, dtype=d)) for d in dtypes))
    params_type = namedtuple("P", ("argmax", "log_space", "num_components", "width"))
    good = params_type(np.bool_(True), np.bool_(False), np.int32(2), np.int32(7))
    assert argument_format(params, arrays, good, "k") == "PPPPPP??ii"
    with pytest.raises(BackendError, match="parameter 8 is 'int num_components' but the env "
                                           "passes 'long long num_components'"):
        argument_format(params, arrays, params_type(np.bool_(True), np.bool_(False), np.int64(2),
                                                    np.int32(7)), "k")
    swapped = namedtuple("P2", ("argmax", "log_space", "width", "num_components"))(
        np.bool_(True), np.bool_(False), np.int32(7), np.int32(2))
    with pytest.raises(BackendError, match="parameter 8"):
        argument_format(params, arrays, swapped, "k")
    with pytest.raises(BackendError, match="has 10 parameters but is launched with 8"):
        argument_format(params, arrays, namedtuple("P3", ("argmax", "width"))(True, 7), "k")


def test_signature_parser_reads_qualifiers_and_launch_bounds():
    source = """
    // extern "C" __global__ void commented_out(int x)
    extern "C" __global__ void __launch_bounds__(256) k(const float* __restrict__ a,
        unsigned long long *rng, bool flag, /* note */ gpusim_u64* more, int n) {}
    extern "C" __global__ void empty() {}
    """
    signatures = kernel_signatures(source)
    assert list(signatures) == ["k", "empty"]
    assert [tuple(p) for p in signatures["k"]] == [
        ("a", "float", True), ("rng", "unsigned long long", True), ("flag", "bool", False),
        ("more", "unsigned long long", True), ("n", "int", False)]
    with pytest.raises(BackendError, match="has no kernel"):
        kernel_signature(source, "missing", "x.cu")


def test_a_kernel_that_does_not_fit_the_env_fails_at_construction(host_backend):
    class Drifted(TagContinuous):
        cuda_c_step = "sampler.cu:sample_actions"
    with pytest.raises(BackendError, match="sample_actions .* has 10 parameters but is "
                                           "launched with 42 .*obs, final_obs"):
        Drifted(num_envs=1, backend=host_backend, config=Drifted.config_class.load())


def test_env_without_cuda_c_kernel_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="env cartpole has no CUDA C kernel .*"
                                           "use backend numba or cpu"):
        gpusim.make("cartpole", num_envs=1, backend=HostCBackend(tmp_path))


# ---- the host shim itself ----------------------------------------------------------------------
SHIM_PROBE = """
extern "C" __global__ void rotate(int* values, int* out, int rounds)
{
    const int base = blockIdx.x * blockDim.x;
    int value = threadIdx.x * 10 + blockIdx.x;
    for (int r = 0; r < rounds; ++r) {
        values[base + threadIdx.x] = value;
        __syncthreads();
        value = values[base + (threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    out[base + threadIdx.x] = value;
}

extern "C" __global__ void divergent(int* values)
{
    if (threadIdx.x == 0)
        __syncthreads();
    values[threadIdx.x] = 1;
}
"""


def test_host_shim_barrier_synchronises_a_block(host_backend, tmp_path):
    lib = build_library(SHIM_PROBE, "probe.cu", tmp_path)
    grid, block, rounds = 3, 16, 50
    values = np.zeros(grid * block, dtype=np.int32)
    out = np.zeros_like(values)
    call(lib, "rotate", grid, block, values.ctypes.data, out.ctypes.data, rounds)
    want = [((t + rounds) % block) * 10 + b for b in range(grid) for t in range(block)]
    assert out.tolist() == want
    with pytest.raises(AssertionError, match="different numbers of __syncthreads"):
        call(lib, "divergent", 1, 4, values.ctypes.data)


# ---- CUDA C kernels vs the portable kernels and the reference ---------------------------------
# Each backend runs its whole trajectory on its own (host threads and numba's
# spinning OpenMP workers would otherwise compete for the cores), then every
# array is compared at every step.
def snapshot(env):
    return {name: tensor.numpy().copy() for name, tensor in env.arrays.tensors.items()}


def assert_same_snapshots(got, want, where):
    for name, value in got.items():
        expected = want[name]
        if value.dtype == np.float32:  # bit for bit (signed zeros included)
            value, expected = value.view(np.uint32), expected.view(np.uint32)
        np.testing.assert_array_equal(value, expected, err_msg=f"array '{name}', {where}")


def tag_trajectory(env, schedule):
    """Snapshots after reset, after each scheduled (injected state or None, actions) step,
    and after a reseeded reset."""
    env.reset()
    snapshots = [snapshot(env)]
    for state, actions in schedule:
        if state is not None:
            env.set_state(state)
        env.step(actions)
        snapshots.append(snapshot(env))
    env.reset(seed=3)
    snapshots.append(snapshot(env))
    return snapshots


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_c_matches_portable_kernels_bit_for_bit(host_backend, name):
    config = dict(CONFIGS[name])
    num_envs = config.pop("num_envs")
    host = make_tag(num_envs=num_envs, backend=host_backend, seed=7, **config)
    cpu = make_tag(num_envs=num_envs, backend="cpu", seed=7, **config)
    rng = np.random.default_rng(11)
    schedule = []
    for t in range(80):  # a fresh random state every 10 steps, free running (auto-reset) between
        state = random_tag_state(cpu.config, num_envs, rng) if t % 10 == 0 else None
        schedule.append((state, random_actions(cpu, rng)))
    got, want = tag_trajectory(host, schedule), tag_trajectory(cpu, schedule)
    where = ["after reset"] + [f"step {t}" for t in range(len(schedule))] + ["after reseeding"]
    for g, w, label in zip(got, want, where):  # RNG streams and K-nearest scratch included
        assert_same_snapshots(g, w, label)
    assert sum(w["reset_mask"].sum() for w in want[1:-1]) > 0
    assert sum((w["tagged_by"] >= 0).sum() for w in want[1:-1]) > 0


@pytest.mark.parametrize("name", ["small", "full_observation", "runners_stay",
                                  "tags_penalties_custom_ids", "two_agents"])
def test_cuda_c_matches_reference(host_backend, name):
    config = dict(CONFIGS[name])
    num_envs = config.pop("num_envs")
    counts = run_against_reference(host_backend, num_envs, steps=60, **config)
    assert counts["resets"] > 0 and counts["tags"] > 0


def sample_trajectory(env, trials):
    sampler = ActionSampler(env)
    out = []
    for probs, argmax, log_space in trials:
        actions = sampler.sample(probs, argmax=argmax, log_space=log_space).clone()
        out.append((actions, sampler.log_prob.clone(), env.rng_state.clone()))
    return out


def test_cuda_c_sampler_matches_portable_sampler(host_backend):
    for config in (dict(num_taggers=1, num_runners=2, num_acceleration_levels=2,
                        num_turn_levels=3), dict(num_taggers=2, num_runners=5)):
        host = make_tag(num_envs=4, backend=host_backend, seed=5, **config)
        cpu = make_tag(num_envs=4, backend="cpu", seed=5, **config)
        width = sum(host.action_nvec)
        rng = np.random.default_rng(2)
        trials = []
        for trial in range(12):
            probs = rng.random((4, host.num_agents, width)).astype(np.float32)
            probs[rng.random(probs.shape) < 0.4] = 0  # zero weights, sometimes all of them
            probs[:, 0] *= 50  # unnormalised weights
            log_space = trial % 3 == 2  # every 3rd: log-probabilities (of -inf when 0)
            if log_space:
                with np.errstate(divide="ignore"):
                    probs = np.log(probs / probs.sum(-1, keepdims=True).clip(1e-30))
            trials.append((torch.from_numpy(probs), trial % 4 == 3, log_space))  # 4th: argmax
        for k, ((a, lp, s), (b, lq, t)) in enumerate(zip(sample_trajectory(host, trials),
                                                         sample_trajectory(cpu, trials))):
            assert torch.equal(a, b) and torch.equal(s, t), f"trial {k}"
            assert torch.allclose(lp, lq, equal_nan=True, atol=0, rtol=0), f"trial {k}"
        assert host.rng_state.ne(make_tag(num_envs=4, seed=5, **config).rng_state).any()


@pytest.fixture(scope="module")
def tsan_dir(host_backend, tmp_path_factory):
    build_dir = tmp_path_factory.mktemp("tsan")
    problem = tsan_problem(build_dir)
    if problem:
        pytest.skip(problem)
    return build_dir


def tag_race_launches(rng):
    """Step (three times) and reset launches of tag_continuous with tags and an auto-reset."""
    env = make_tag(num_envs=3, num_taggers=2, num_runners=12, tagging_distance=0.25,
                   grid_length=4.0)  # cpu backend: only its arrays and parameters are used
    env.reset()
    state = random_tag_state(env.config, 3, rng)
    state["timestep"][0] = env.config.episode_length - 1  # replica 0 finishes and auto-resets
    env.set_state(state)
    env.arrays["actions"].copy_(random_actions(env, rng))
    arrays = [env.arrays[name].numpy() for name in env.arrays.views._fields]
    return env, [("tag_continuous_step", arrays, list(env._params)),
                 ("tag_continuous_reset", arrays, list(env._params))]


def test_cuda_c_kernels_have_no_data_races(tsan_dir):
    """Under ThreadSanitizer: tag_continuous (tags, a terminal step, auto-reset), the sampler."""
    rng = np.random.default_rng(4)
    env, launches = tag_race_launches(rng)
    report = race_check(kernel_source("tag_continuous.cu"), "tag_continuous.cu", launches, 3,
                        env.num_agents, tsan_dir, kernel_dir(), repeats=3)
    assert report == "", report
    sampler = ActionSampler(env)
    probs = torch.from_numpy(rng.random((3, env.num_agents, sampler.width), dtype=np.float32))
    arrays = list(sampler._arrays_for(probs))
    launches = [("sample_actions", arrays, list(sampler.params(argmax, log_space)))
                for argmax in (False, True) for log_space in (False, True)]
    report = race_check(kernel_source("sampler.cu"), "sampler.cu", launches, 3, env.num_agents,
                        tsan_dir, kernel_dir(), repeats=2)
    assert report == "", report


def test_race_check_catches_a_lost_update(tsan_dir):
    """A runner adding its tag reward straight into its tagger's reward is a race."""
    env, launches = tag_race_launches(np.random.default_rng(4))
    racy = kernel_source("tag_continuous.cu").replace(
        "t.tagged_by[i] = nearest;",
        "t.tagged_by[i] = nearest;\n        t.reward[t.base + nearest] += t.tag_reward_for_tagger;")
    report = race_check(racy, "racy_tag.cu", launches[:1], 3, env.num_agents, tsan_dir,
                        kernel_dir())
    assert "data race" in report and "tag_runners" in report


# ---- nvcc ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nvcc():
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc not found (not on PATH, nor under $CUDA_HOME/bin or the CUDA "
                    "toolkit's default prefix)")
    return found


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_every_kernel_to_ptx_without_warnings(nvcc, arch, tmp_path):
    sources = sorted(kernel_dir().glob("*.cu"))
    assert sources
    runs = []
    for source in sources:  # in parallel: nvcc is slow to start
        out = tmp_path / f"{source.stem}.ptx"
        command = nvcc_command(nvcc, arch, source, out, kind="--ptx") + ["-Werror",
                                                                         "all-warnings"]
        runs.append((source, out, subprocess.Popen(command, stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True)))
    for source, out, run in runs:
        output = run.communicate()[0]
        assert run.returncode == 0, f"{source.name} for {arch}:\n{output}"
        assert "warning" not in output.lower(), output
        ptx = out.read_text()
        for function in kernel_signatures(source.read_text()):
            assert f".entry {function}(" in ptx


def test_pycuda_cubin_is_compiled_once_into_the_user_cache(nvcc, tmp_path, monkeypatch):
    """The pycuda backend's nvcc step and its cache (no GPU needed to build a cubin)."""
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    backend = object.__new__(PyCUDABackend)  # no GPU here: only the compile step
    backend.nvcc, backend.arch = nvcc, "sm_80"
    source = kernel_source("sampler.cu")
    cubin = backend._cubin("sampler.cu", source)
    assert cubin[:4] == b"\x7fELF"
    (entry,) = (tmp_path / "cache" / "pycuda").iterdir()
    assert [p.name for p in entry.iterdir()] == ["sampler.cubin"]

    def no_nvcc(*args, **kwargs):
        raise AssertionError("nvcc ran again for a cached cubin")
    monkeypatch.setattr(pycuda_backend.subprocess, "run", no_nvcc)
    assert backend._cubin("sampler.cu", source) == cubin
    with pytest.raises(AssertionError, match="nvcc ran again"):  # other source, other entry
        backend._cubin("sampler.cu", source + "\n// changed\n")


def test_pycuda_launch_protocol_with_a_stand_in_driver(monkeypatch):
    """The launcher's calls, in order, with pycuda and torch.cuda replaced by recorders."""
    log = []

    class Kernel:
        def prepare(self, fmt):
            log.append(("prepare", fmt))

        def prepared_async_call(self, grid, block, stream, *args):
            log.append(("launch", grid, block, stream, args))

    class Context:
        def push(self):
            log.append("push")

        @staticmethod
        def pop():
            log.append("pop")

    class Stream:
        def __init__(self, name, handle):
            self.name, self.cuda_stream = name, handle

        def wait_stream(self, other):
            log.append(f"{self.name} waits for {other.name}")

    streams = {"current": Stream("default", 0), "default": Stream("default", 0)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams["current"])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: streams["default"])
    backend = object.__new__(PyCUDABackend)
    backend.device, backend._context = torch.device("cpu"), Context()
    backend._drv = type("Driver", (), {"Context": Context})
    params = kernel_signature(kernel_source("sampler.cu"), "sample_actions")
    launch = pycuda_backend.PyCUDAKernel(backend, Kernel(), params, "sample_actions", 64)
    arrays = namedtuple("A", ("rng_state", "actions", "log_prob", "nvec", "offsets", "probs"))(*(
        TensorPointer(torch.zeros(1, dtype=d)) for d in
        (torch.uint64, torch.int32, torch.float32, torch.int32, torch.int32, torch.float32)))
    scalars = namedtuple("P", ("argmax", "log_space", "num_components", "width"))(
        np.bool_(False), np.bool_(False), np.int32(2), np.int32(7))
    launch(5, 3, arrays, scalars)  # on torch's default stream: the legacy default stream
    call = ("launch", (5, 1), (3, 1, 1), None, (*arrays, *scalars))
    assert log == [("prepare", "PPPPPP??ii"), "push", call, "pop"]
    log.clear()
    streams["current"] = Stream("side", 77)  # inside torch.cuda.stream(side)
    launch(5, 3, arrays, scalars)
    assert log == ["default waits for side", "push", call, "pop", "side waits for default"]
    with pytest.raises(BackendError, match="at most 64 agents per replica"):
        launch(5, 65, arrays, scalars)


# ---- no pycuda / no GPU here ---------------------------------------------------------------
def test_pycuda_backend_unavailable_is_one_clear_error():
    try:
        import pycuda.driver  # noqa: F401
        if torch.cuda.is_available() and find_nvcc():
            pytest.skip("pycuda, nvcc and a GPU are all present: the backend is available")
    except Exception:
        pass
    for attempt in (lambda: get_backend("pycuda"),
                    lambda: gpusim.make("tag_continuous", num_envs=1, backend="pycuda")):
        with pytest.raises(BackendError) as err:
            attempt()
        message = str(err.value)
        assert message.startswith("backend 'pycuda' is unavailable: ")
        for hint in ("pip install gpusim[pycuda]", "CUDA toolkit", "nvcc", "driver"):
            assert hint in message
        assert err.value.__cause__ is None and err.value.__suppress_context__
