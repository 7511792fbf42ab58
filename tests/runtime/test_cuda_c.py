"""The CUDA C kernels of the cuda_c backend, verified without a GPU.

- Their parameter lists follow the argument convention: a pointer for every
  env array in the order of `env.arrays.views`, then every parameter of
  `env.params()`, with matching names and C types; an env kernel takes the
  generated GPUSIM_ENV_PARAMS, and a file is found beside its env, at an
  absolute path, or in the package.
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
- nvcc and NVRTC compile every kernel, with its generated header, to PTX for
  sm_80 and sm_90 without a warning, and `build` fills the user's compile
  cache once per source, header set, architecture and compiler.
- The pycuda launcher's protocol (context push/pop, stream ordering) against
  stand-ins for pycuda and torch.cuda.
- Without a GPU, `get_backend("cuda_c")` (and its alias "pycuda") is one clear error.
Tests that need g++ (C++20), nvcc or NVRTC skip, with the reason, where they are absent.
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
from gpusim.backends import cuda_c_backend
from gpusim.backends.cuda_c import (GENERATED_HEADER, Nvcc, Nvrtc, TensorPointer, args_header,
                                    argument_format, build, find_nvcc, header_params,
                                    include_dirs, kernel_dir, kernel_signature, nvrtc_libraries,
                                    kernel_signatures, kernel_source, locate, nvcc_command)
from gpusim.envs.tag_continuous.env import TagContinuous
from gpusim.errors import BackendError
from gpusim.sampler import SAMPLE_SPEC
from test_tag_vs_reference import run_against_reference

C_OF_TORCH = {torch.float32: "float", torch.int32: "int", torch.bool: "bool",
              torch.uint64: "unsigned long long"}
C_OF_NUMPY = {np.float32: "float", np.int32: "int", np.bool_: "bool"}

CONFIGS = {
    "small": dict(num_envs=3, num_taggers=3, num_runners=12),
    "own_state_and_frame": dict(num_envs=3, num_taggers=3, num_runners=12,
                                observe_own_state=True, observe_in_own_frame=True),
    "own_frame_full_observation": dict(num_envs=3, num_taggers=2, num_runners=9,
                                       use_full_observation=True, observe_in_own_frame=True),
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


def tag_header(env):
    return args_header(env.arrays.views, env._params, env.name)


@pytest.mark.parametrize("config", [{}, dict(use_full_observation=True, num_runners=7)])
def test_tag_kernels_take_the_generated_parameters(config):
    env = make_tag(num_envs=1, **config)
    names = env.arrays.views._fields
    expected = expected_arguments(names, [env.arrays[n].dtype for n in names],
                                  env._params._asdict())
    generated = header_params(env.arrays.views, env._params)
    assert [tuple(p) for p in generated] == expected
    for spec in (env.reset_kernel_spec(), env.step_kernel_spec()):
        source, function = locate(spec)
        assert source == kernel_dir().parent / "envs" / "tag_continuous" / "tag_continuous.cu" \
            or source.parent.name == "tag_continuous"  # beside the env, in the env's folder
        assert "GPUSIM_ENV_PARAMS" in source.read_text()
        params = kernel_signature(source.read_text(), function, source.name, generated)
        assert [tuple(p) for p in params] == expected, spec.name
    header = tag_header(env)
    for name in names:  # every array and parameter reachable by name
        assert f" {name};" in header


def test_sampler_signature_follows_the_sampler_arrays_and_params():
    env = make_tag(num_envs=2, num_taggers=1, num_runners=1)
    sampler = ActionSampler(env)
    probs = torch.zeros((2, 2, sampler.width))
    arrays = sampler._arrays_for(probs)
    params = sampler.params(False, False)
    dtypes = [torch.from_numpy(a).dtype for a in arrays]
    file, _, function = SAMPLE_SPEC.cuda_c.partition(":")
    assert parsed(file, function) == expected_arguments(arrays._fields, dtypes, params._asdict())


def test_every_named_kernel_exists():
    env = make_tag(num_envs=1)
    for spec in (env.reset_kernel_spec(), env.step_kernel_spec(), SAMPLE_SPEC):
        source, function = locate(spec)
        assert function in kernel_signatures(source.read_text(), [])
    assert (kernel_dir() / "sampler.cu").is_file() and (kernel_dir() / "gpusim_env.cuh").is_file()


def test_kernel_files_are_found_beside_the_env_then_absolute_then_in_the_package(tmp_path):
    own = tmp_path / "mine.cu"
    own.write_text("// a user's kernel\n")
    beside = gpusim.KernelSpec("my_env.step", (), "mine.cu:step", str(tmp_path))
    assert locate(beside) == (own.resolve(), "step")
    absolute = gpusim.KernelSpec("my_env.step", (), f"{own}:step")
    assert locate(absolute) == (own.resolve(), "step")
    package = gpusim.KernelSpec("sampler", (), "sampler.cu:sample_actions", str(tmp_path))
    assert locate(package) == (kernel_dir() / "sampler.cu", "sample_actions")
    missing = gpusim.KernelSpec("my_env.step", (), "gone.cu:step", str(tmp_path))
    with pytest.raises(BackendError) as err:
        locate(missing)
    assert f"{tmp_path / 'gone.cu'}" in str(err.value)
    assert f"{kernel_dir() / 'gone.cu'}" in str(err.value) and "\n" not in str(err.value)


def test_headers_a_kernel_includes_are_found_recursively():
    env = make_tag(num_envs=1)
    source, _ = locate(env.step_kernel_spec())
    from gpusim.backends.cuda_c import included_headers
    found = {p.name for p in included_headers(source.read_text(), include_dirs(source))}
    assert found == {"gpusim_env.cuh", "gpusim_math.cuh", "gpusim_rng.cuh"}


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
    config = Drifted.config_class.load()
    portable = TagContinuous(num_envs=1, backend="cpu", config=config)
    launched = len(portable.arrays.views) + len(portable.params())
    with pytest.raises(BackendError, match=f"sample_actions .*has 10 parameters but is "
                                           f"launched with {launched} .*obs, final_obs"):
        Drifted(num_envs=1, backend=host_backend, config=config)


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
                                  "tags_penalties_custom_ids", "two_agents",
                                  "own_state_and_frame"])
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


def test_cuda_c_sampler_with_per_agent_action_sets(host_backend):
    """Policies with different action sets: per-agent tables, the same draws on both."""
    import types
    from mixed_team_env import TwoSets
    cpu = TwoSets(num_envs=4, backend="cpu", seed=5)
    host = types.SimpleNamespace(backend=host_backend, device=cpu.device, num_envs=4,
                                 num_agents=3, policy_specs=cpu.policy_specs,
                                 rng_state=cpu.rng_state.clone())
    rng = np.random.default_rng(3)
    trials = [(torch.from_numpy(rng.random((4, 3, 7)).astype(np.float32)), k % 3 == 2, False)
              for k in range(9)]
    for k, ((a, lp, s), (b, lq, t)) in enumerate(zip(sample_trajectory(host, trials),
                                                     sample_trajectory(cpu, trials))):
        assert torch.equal(a, b) and torch.equal(s, t) and torch.equal(lp, lq), f"trial {k}"
        assert a[:, :2, 1].eq(0).all() and a[:, :2, 0].le(1).all()


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


def tag_source(env, build_dir):
    """tag_continuous.cu, its include directories (with its generated header) and parameters."""
    source, _ = locate(env.step_kernel_spec())
    (build_dir / GENERATED_HEADER).write_text(tag_header(env))
    return source, include_dirs(source, build_dir), header_params(env.arrays.views, env._params)


def test_cuda_c_kernels_have_no_data_races(tsan_dir):
    """Under ThreadSanitizer: tag_continuous (tags, a terminal step, auto-reset), the sampler."""
    rng = np.random.default_rng(4)
    env, launches = tag_race_launches(rng)
    source, dirs, generated = tag_source(env, tsan_dir)
    report = race_check(source.read_text(), "tag_continuous.cu", launches, 3, env.num_agents,
                        tsan_dir, dirs, repeats=3, generated=generated)
    assert report == "", report
    sampler = ActionSampler(env)
    probs = torch.from_numpy(rng.random((3, env.num_agents, sampler.width), dtype=np.float32))
    arrays = list(sampler._arrays_for(probs))
    launches = [("sample_actions", arrays, list(sampler.params(argmax, log_space)))
                for argmax in (False, True) for log_space in (False, True)]
    report = race_check(kernel_source("sampler.cu"), "sampler.cu", launches, 3, env.num_agents,
                        tsan_dir, [kernel_dir()], repeats=2)
    assert report == "", report


def test_race_check_catches_a_lost_update(tsan_dir):
    """A runner adding its tag reward straight into its tagger's reward is a race."""
    env, launches = tag_race_launches(np.random.default_rng(4))
    source, dirs, generated = tag_source(env, tsan_dir)
    racy = source.read_text().replace(
        "t.a.tagged_by[i] = nearest;",
        "t.a.tagged_by[i] = nearest;\n        t.a.reward[t.base + nearest] += t.a.tag_reward_for_tagger;")
    assert racy != source.read_text()
    report = race_check(racy, "racy_tag.cu", launches[:1], 3, env.num_agents, tsan_dir, dirs,
                        generated=generated)
    assert "data race" in report and "tag_runners" in report


# ---- compiling: nvcc and NVRTC -------------------------------------------------------------
@pytest.fixture(scope="module")
def nvcc():
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc not found (not on PATH, nor under $CUDA_HOME/bin or the CUDA "
                    "toolkit's default prefix)")
    return Nvcc(found)


@pytest.fixture(scope="module")
def nvrtc():
    try:
        return Nvrtc()
    except Exception as exc:
        pytest.skip(f"NVRTC cannot be used here ({type(exc).__name__}: {exc}); it comes with "
                    "pip install gpusim[cuda12] or [cuda13]")


def kernels_to_compile(build_dir):
    """(source, include dirs, functions) of every kernel: tag_continuous with its generated
    header, and the sampler."""
    env = make_tag(num_envs=1)
    source, dirs, generated = tag_source(env, build_dir)
    return [(source, dirs, kernel_signatures(source.read_text(), generated)),
            (kernel_dir() / "sampler.cu", [kernel_dir()],
             kernel_signatures(kernel_source("sampler.cu")))]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_every_kernel_to_ptx_without_warnings(nvcc, arch, tmp_path):
    runs = []
    for source, dirs, functions in kernels_to_compile(tmp_path):  # in parallel: nvcc is slow
        out = tmp_path / f"{source.stem}.ptx"
        command = nvcc_command(nvcc.path, arch, source, out, "--ptx", dirs) + [
            "-Werror", "all-warnings"]
        runs.append((source, out, functions, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for source, out, functions, run in runs:
        output = run.communicate()[0]
        assert run.returncode == 0, f"{source.name} for {arch}:\n{output}"
        assert "warning" not in output.lower(), output
        ptx = out.read_text()
        for function in functions:
            assert f".entry {function}(" in ptx


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_every_kernel_with_its_generated_header(nvrtc, arch, tmp_path):
    for source, dirs, functions in kernels_to_compile(tmp_path):
        ptx = nvrtc.compile(source, dirs, arch, "ptx").decode()
        for function in functions:
            assert f".entry {function}(" in ptx
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k(int* x) { x[0] = undefined_thing; }\n')
    with pytest.raises(BackendError, match="(?s)NVRTC could not compile broken.cu .*undefined_thing"):
        nvrtc.compile(broken, [kernel_dir()], arch, "ptx")


@pytest.mark.parametrize("major", [12, 13])
def test_nvrtc_of_each_cuda_major_compiles_every_kernel(major, tmp_path):
    """CUDA 12 and 13 drivers each need their own NVRTC: both majors, from NVIDIA's wheels side
    by side (the test extra installs them), compile every kernel for sm_80 and sm_90."""
    path = nvrtc_libraries().get(major)
    if path is None:
        pytest.skip(f"no NVRTC {major} wheel here (pip install "
                    f"{'nvidia-cuda-nvrtc-cu12' if major == 12 else 'nvidia-cuda-nvrtc'})")
    compiler = Nvrtc(path)
    assert compiler.identity().startswith(f"nvrtc {major}.")
    for source, dirs, functions in kernels_to_compile(tmp_path):
        for arch in ("sm_80", "sm_90"):
            ptx = compiler.compile(source, dirs, arch, "ptx").decode()
            assert f".target {arch}" in ptx
            for function in functions:
                assert f".entry {function}(" in ptx
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k(int* x) { x[0] = undefined_thing; }\n')
    with pytest.raises(BackendError, match="(?s)NVRTC could not compile.*undefined_thing"):
        compiler.compile(broken, [kernel_dir()], "sm_90", "ptx")


def test_build_compiles_once_into_the_user_cache(nvcc, tmp_path, monkeypatch):
    """The cuda_c backend's compile step and its cache (no GPU needed to build a cubin)."""
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    env = make_tag(num_envs=1)
    source, _ = locate(env.step_kernel_spec())
    header = tag_header(env)
    cubin = build(nvcc, source, header, "sm_80")
    assert cubin[:4] == b"\x7fELF"
    (entry,) = (tmp_path / "cache" / "cuda_c").iterdir()
    assert [p.name for p in entry.iterdir()] == ["tag_continuous.cubin"]

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(nvcc, "compile", no_compiler)
    assert build(nvcc, source, header, "sm_80") == cubin  # from the cache
    for changed in (header + "// another layout\n", ):  # other header, other entry
        with pytest.raises(AssertionError, match="compiled again"):
            build(nvcc, source, changed, "sm_80")
    with pytest.raises(AssertionError, match="compiled again"):
        build(nvcc, source, header, "sm_90")


class StandInDriver:
    """Takes the images the backend loads and launches nothing."""

    def __init__(self):
        self.images = []

    def load(self, image, function):
        self.images.append(image)
        return function, 1024

    def prepare(self, kernel, params, struct_format):
        return None


class CudaCOnTheCpu(cuda_c_backend.CudaCBackend):
    """The cuda_c backend's compile path (its cache and the in-process kernels) with a real
    compiler and a stand-in driver: CPU tensors, no GPU."""

    def __init__(self, compiler):
        self.compiler, self.driver, self.arch = compiler, StandInDriver(), "sm_90"
        self.device = torch.device("cpu")

    def memory(self):
        raise BackendError("no GPU memory to read here")  # check_fits: let it be


def test_the_backend_builds_its_cubin_into_the_user_cache_once_per_process(nvrtc, tmp_path,
                                                                          monkeypatch):
    """What test_cuda_c_gpu's cache test checks, on the CPU: make() writes
    cuda_c/<key>/tag_continuous.cubin into $GPUSIM_CACHE_DIR and loads that file. A kernel
    this process already built is reused from memory and writes nothing into a cache
    folder set later (why that GPU test once found no cubin); with nothing in memory, the
    cubin comes from the cache without compiling."""
    from gpusim.backends.base import Backend
    monkeypatch.setattr(Backend, "_compiled", {})
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "first"))
    backend = CudaCOnTheCpu(nvrtc)
    make_tag(num_envs=2, backend=backend, num_taggers=3, num_runners=9)
    (cubin,) = (tmp_path / "first").glob("cuda_c/*/tag_continuous.cubin")
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    assert backend.driver.images == [cubin.read_bytes()] * 2  # the reset and step kernels

    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "second"))
    make_tag(num_envs=2, backend=backend, num_taggers=3, num_runners=9)
    assert not list((tmp_path / "second").glob("cuda_c/*/*"))
    assert len(backend.driver.images) == 2  # nothing built or loaded again

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again for a cached cubin")
    monkeypatch.setattr(nvrtc, "compile", no_compiler)
    monkeypatch.setattr(Backend, "_compiled", {})
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path / "first"))
    make_tag(num_envs=2, backend=backend, num_taggers=3, num_runners=9)
    assert backend.driver.images[2:] == [cubin.read_bytes()] * 2


# ---- the pycuda launcher, against stand-ins --------------------------------------------------
def test_pycuda_launch_protocol_with_a_stand_in_driver(monkeypatch):
    """The launcher's calls, in order, with pycuda and torch.cuda replaced by recorders."""
    log = []

    class Function:
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
    driver = object.__new__(cuda_c_backend.PyCUDADriver)
    driver.device, driver.context = torch.device("cpu"), Context()
    driver.drv = type("Driver", (), {"Context": Context})
    args = (1, 2, np.int32(7))
    driver.launch(Function(), 5, 3, None, args)  # on torch's default stream: the legacy one
    call = ("launch", (5, 1), (3, 1, 1), None, args)
    assert log == ["push", call, "pop"]
    log.clear()
    streams["current"] = Stream("side", 77)  # inside torch.cuda.stream(side)
    driver.launch(Function(), 5, 3, None, args)
    assert log == ["default waits for side", "push", call, "pop", "side waits for default"]


# ---- no GPU here ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cuda_c", "pycuda"])
def test_cuda_c_backend_unavailable_is_one_clear_error(name):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the backend may be available")
    for attempt in (lambda: get_backend(name),
                    lambda: gpusim.make("tag_continuous", num_envs=1, backend=name)):
        with pytest.raises(BackendError) as err:
            attempt()
        message = str(err.value)
        assert message.startswith("backend 'cuda_c' is unavailable: torch sees no CUDA GPU")
        assert "pip install gpusim[cuda12]" in message and "\n" not in message
        assert err.value.__cause__ is None


def test_an_nvrtc_compile_leaves_python_and_torch_intact(nvrtc, tmp_path):
    """NVRTC writes its (empty) log into the buffer it is given: never into a bytes object
    Python shares (the 1-byte b" "), which once broke every later torch.load in the process."""
    import io
    source = tmp_path / "clean.cu"
    source.write_text('extern "C" __global__ void k(int* x) { x[0] = 1; }\n')
    _, log = nvrtc.compile_with_log(source, [kernel_dir()], "sm_90", "ptx")
    assert log == "" and b" " == bytes([32]) and b" ".decode() == " "
    buffer = io.BytesIO()
    torch.save({"u": torch.zeros(128, dtype=torch.uint8)}, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["u"].shape == (128,)


# ---- the public entry point: gpusim.check.check_cuda_c_races --------------------------------
TSAN_REPORT = """==================
WARNING: ThreadSanitizer: data race (pid=1370)
  Read of size 4 at 0x7b2c00000004 by thread T22:
    #0 tag::tag_runners(tag::Tag const&) /tmp/build/racy_tag.cu:240 (racy_tag_race+0x3e06)
    #1 tag_continuous_step /tmp/build/racy_tag.cu:323 (racy_tag_race+0x5719)

  Previous write of size 4 at 0x7b2c00000004 by thread T21:
    #0 tag::tag_runners(tag::Tag const&) /tmp/build/racy_tag.cu:240 (racy_tag_race+0x3e1e)
    #1 tag_continuous_step /tmp/build/racy_tag.cu:323 (racy_tag_race+0x5719)

SUMMARY: ThreadSanitizer: data race /tmp/build/racy_tag.cu:240 in tag::tag_runners(tag::Tag const&)
==================
ThreadSanitizer: reported 1 warnings
"""


def test_a_thread_sanitizer_report_is_one_line_per_race():
    from gpusim.check.cuda_c_races import summarize
    assert summarize(TSAN_REPORT, "tag_continuous_step") == [
        "kernel tag_continuous_step: data race: read by thread T22 in tag::tag_runners "
        "(racy_tag.cu:240); write by thread T21 in tag::tag_runners (racy_tag.cu:240) (two "
        "threads of a block touch one element between two __syncthreads(), one writing)"]
    assert summarize("", "k") == []
    assert summarize("k: threads passed different numbers of __syncthreads()", "k") == \
        ["k: threads passed different numbers of __syncthreads()"]


def test_check_cuda_c_races_needs_cuda_c_kernels():
    from gpusim.check import check_cuda_c_races
    with pytest.raises(gpusim.GpusimError, match="env cartpole has no CUDA C kernels"):
        check_cuda_c_races(gpusim.make("cartpole", num_envs=1, backend="cpu"))


@pytest.mark.slow
def test_check_cuda_c_races_of_an_env(tsan_dir, tmp_path):
    """tag_continuous's kernels have no race; a copy adding a runner's tag reward straight into
    its tagger's reward has one, named in one line."""
    from gpusim.check import check_cuda_c_races
    config = dict(num_envs=3, num_taggers=2, num_runners=12, tagging_distance=0.25,
                  grid_length=4.0, episode_length=20)
    assert check_cuda_c_races(make_tag(**config), build_dir=tmp_path / "clean") == []
    source, _ = locate(make_tag(num_envs=1).step_kernel_spec())
    racy = tmp_path / "racy_tag.cu"
    racy.write_text(source.read_text().replace(
        "t.a.tagged_by[i] = nearest;",
        "t.a.tagged_by[i] = nearest;\n        t.a.reward[t.base + nearest] += t.a.tag_reward_for_tagger;"))

    class RacyTag(TagContinuous):
        cuda_c_step = f"{racy}:tag_continuous_step"
        cuda_c_reset = f"{racy}:tag_continuous_reset"

    env = RacyTag(num_envs=3, backend="cpu", config=TagContinuous.config_class.load(
        **{k: v for k, v in config.items() if k != "num_envs"}))
    (problem,) = check_cuda_c_races(env, build_dir=tmp_path / "racy")
    assert problem.startswith("kernel tag_continuous_step and tag_continuous_reset: data race: ")
    assert "in tag::tag_runners (racy_tag.cu:" in problem
