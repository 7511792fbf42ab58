"""GPU tests (`gpu` marker) of the cuda_c backend's CUDA C kernels.

On the same injected states and actions: cuda_c against numba, cpu and the
NumPy reference; the CUDA C sampler against the numba sampler; launches on a
non-default torch stream; a full 1024-agent block; the cubin cache; a user's
kernel outside the package (the guide's ring_gather). They run with whichever
driver the backend finds (pycuda, else cuda-bindings) and compiler (NVRTC,
else nvcc). Skipped cleanly where no CUDA GPU works (see conftest.py) or the
backend cannot be built here.

Tolerances: the RNG draws and everything computed from them without
transcendental functions agree exactly; positions and observations agree to
2e-5 (the GPU's cosf/sinf are within a few ulps of libm's and numpy's, and
numba's GPU code contracts a * b + c into FMA where CUDA C does not). A
discrete decision taken from floats (a tag at the radius, so also a runner's
exit and a termination) can flip between implementations when a distance
lies within that rounding of its threshold: across implementations such
decisions may differ in at most 1% of replica-steps (MAX_FLIPS); a backend
against itself (reruns, streams) is compared bit for bit.
"""
import numpy as np
import pytest
import torch

from conftest import make_tag, random_actions, random_tag_state
from gpusim import ActionSampler
from gpusim.envs.tag_continuous import reference as ref

pytestmark = pytest.mark.gpu
ATOL = 2e-5
MAX_FLIPS = 0.01  # share of replica-steps whose float-derived decisions may differ


def flipped(a, b) -> np.ndarray:
    """Per replica (first axis): whether integer or boolean arrays `a` and `b` differ."""
    a, b = np.asarray(a), np.asarray(b)
    return (a != b).reshape(len(a), -1).any(1)
FLOAT_STATE = ("loc_x", "loc_y", "speed", "direction", "acceleration")
INT_STATE = ("still_in_game", "agent_type", "num_runners_left", "timestep")


@pytest.fixture(scope="module", autouse=True)
def needs_cuda_c():
    from gpusim import get_backend
    from gpusim.errors import BackendError
    try:
        get_backend("cuda_c")
    except BackendError as exc:
        pytest.skip(str(exc))


def host(t):
    return t.detach().cpu().numpy()


@pytest.mark.parametrize("config", [dict(num_taggers=5), dict(num_taggers=3, num_runners=20,
                                                              use_full_observation=True),
                                    dict(num_taggers=3, num_runners=30, tagging_distance=0.05,
                                         runner_exits_game_after_tagged=False)])
def test_cuda_c_matches_numba_cpu_and_reference(config):
    rng = np.random.default_rng(0)
    envs = {name: make_tag(num_envs=4, backend=name, **config)
            for name in ("cuda_c", "numba", "cpu")}
    for env in envs.values():
        env.reset()
    cfg = envs["cpu"].config
    tags = resets = flips = replica_steps = 0
    for t in range(100):
        state = random_tag_state(cfg, 4, rng)
        actions = random_actions(envs["cpu"], rng)
        want = ref.step(cfg, state, actions.numpy())
        done = want[3] | want[4]
        outs = {}
        for name, env in envs.items():
            env.set_state(state)
            obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
            outs[name] = (host(obs), host(reward), host(terminated), host(truncated),
                          host(info["final_obs"]), {k: host(v) for k, v in env.get_state().items()})
        got = outs["cuda_c"]
        # replicas whose float-derived decisions flipped are counted, and left out of the
        # float comparisons (a flipped tag moves rewards by 10)
        flip = flipped(got[2], want[3]) | flipped(got[3], want[4]) | np.any(
            [flipped(got[5][key], want[0][key]) & ~done for key in INT_STATE], axis=0)
        ok, flips = ~flip, flips + int(flip.sum())
        np.testing.assert_allclose(got[1][ok], want[2][ok], atol=ATOL, err_msg=f"reward, {t}")
        np.testing.assert_allclose(got[0][ok & ~done], want[1][ok & ~done], atol=ATOL,
                                   err_msg=f"obs, step {t}")
        np.testing.assert_allclose(got[4][ok & done], want[1][ok & done], atol=ATOL,
                                   err_msg=f"final_obs, step {t}")
        for key in FLOAT_STATE:
            np.testing.assert_allclose(got[5][key][ok & ~done], want[0][key][ok & ~done],
                                       atol=ATOL, err_msg=f"{key}, step {t}")
        for other in ("numba", "cpu"):
            theirs = outs[other]
            # replicas reset in the step drew the same initial state from the same streams
            flip = flipped(got[2], theirs[2]) | flipped(got[3], theirs[3]) | np.any(
                [flipped(got[5][key], theirs[5][key]) for key in INT_STATE], axis=0)
            ok, flips = ~flip, flips + int(flip.sum())
            for k, label in enumerate(("obs", "reward")):
                np.testing.assert_allclose(got[k][ok], theirs[k][ok], atol=ATOL,
                                           err_msg=f"{label} vs {other}, step {t}")
        replica_steps += 3 * 4  # against the reference, numba and cpu
        tags += int((want[2] >= cfg.tag_reward_for_tagger - 1).sum())
        resets += int(done.sum())
    assert tags > 0 and resets > 0
    assert flips <= MAX_FLIPS * replica_steps, f"{flips} of {replica_steps} replica-steps differ"


def test_cuda_c_reset_and_streams_match_numba():
    cuda_c_env = make_tag(num_envs=16, backend="cuda_c", seed=4, num_taggers=5)
    numba_env = make_tag(num_envs=16, backend="numba", seed=4, num_taggers=5)
    for env in (cuda_c_env, numba_env):
        env.reset()
    a, b = cuda_c_env.get_state(include_rng=True), numba_env.get_state(include_rng=True)
    for key in ("rng_state", "loc_x", "loc_y", "direction", "speed", "still_in_game"):
        assert torch.equal(a[key], b[key]), key
    np.testing.assert_allclose(host(cuda_c_env.arrays["obs"]), host(numba_env.arrays["obs"]),
                               atol=ATOL)


def test_cuda_c_sampler_matches_numba_sampler():
    envs = [make_tag(num_envs=32, backend=name, seed=9, num_taggers=5)
            for name in ("cuda_c", "numba")]
    samplers = [ActionSampler(env) for env in envs]
    gen = torch.Generator().manual_seed(1)
    for trial in range(20):
        probs = torch.rand((32, envs[0].num_agents, samplers[0].width), generator=gen)
        probs[torch.rand(probs.shape, generator=gen) < 0.3] = 0
        argmax = trial % 5 == 4
        got = [s.sample(probs.to(e.device), argmax=argmax) for s, e in zip(samplers, envs)]
        assert torch.equal(got[0], got[1]), f"trial {trial}"
        assert torch.equal(envs[0].rng_state, envs[1].rng_state)


def test_cuda_c_on_a_side_stream_matches_the_default_stream():
    results = []
    for use_side_stream in (False, True):
        env = make_tag(num_envs=64, backend="cuda_c", seed=2, num_taggers=5, episode_length=30)
        sampler = ActionSampler(env)
        probs = torch.ones((64, env.num_agents, sampler.width), device=env.device)
        stream = torch.cuda.Stream(env.device) if use_side_stream else \
            torch.cuda.current_stream(env.device)
        with torch.cuda.stream(stream):
            env.reset()
            trace = []
            for _ in range(40):
                obs, reward, *_ = env.step(sampler.sample(probs))
                trace.append(torch.cat([obs.flatten(), reward.flatten()]))  # on `stream`
            total = torch.stack(trace)
        torch.cuda.synchronize()
        results.append(total.cpu())
    assert torch.equal(results[0], results[1])


def test_cuda_c_rollout_has_no_host_sync():
    env = make_tag(num_envs=64, backend="cuda_c", num_taggers=5)
    env.reset()
    sampler = ActionSampler(env)
    probs = torch.full((64, env.num_agents, sampler.width), 1.0, device=env.device)
    env.step(sampler.sample(probs))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            obs, reward, *_ = env.step(sampler.sample(probs))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert obs.is_cuda and reward.is_cuda


def test_cuda_c_runs_a_full_block_of_1024_agents():
    env = make_tag(num_envs=3, backend="cuda_c", num_taggers=24, num_runners=1000)
    env.reset()
    sampler = ActionSampler(env)
    probs = torch.ones((3, 1024, sampler.width), device=env.device)
    for _ in range(3):
        obs, *_ = env.step(sampler.sample(probs))
    torch.cuda.synchronize()
    assert torch.isfinite(obs).all()


def test_cuda_c_cubin_comes_from_the_user_cache(tmp_path, monkeypatch):
    """Built into the cache, then loaded from it. Each make starts with nothing in this
    process's memory: the module's earlier tests compiled the same kernels, and a kernel
    kept in memory is never built, so it writes no cubin into a new cache folder."""
    from gpusim.backends import cuda_c
    from gpusim.backends.base import Backend
    monkeypatch.setenv("GPUSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Backend, "_compiled", {})
    make_tag(num_envs=2, backend="cuda_c", num_taggers=3, num_runners=9)
    assert list(tmp_path.glob("cuda_c/*/tag_continuous.cubin"))

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again for a cached cubin")
    monkeypatch.setattr(cuda_c.Nvrtc, "compile", no_compiler)
    monkeypatch.setattr(cuda_c.Nvcc, "compile", no_compiler)
    monkeypatch.setattr(Backend, "_compiled", {})  # not from this process's memory either
    make_tag(num_envs=2, backend="cuda_c", num_taggers=3, num_runners=9)


def test_a_user_kernel_outside_the_package_runs(tmp_path, monkeypatch):
    """The guide's ring_gather, with its own ring_gather.cu, on the GPU against the CPU."""
    import gpusim
    from test_custom_env_guide import FILE_COMMENT, blocks
    (tmp_path / "ring_gather").mkdir()
    (tmp_path / "ring_gather" / "__init__.py").write_text("")
    for letter in "ac":
        for _, code in blocks(letter):
            match = FILE_COMMENT.match(code)
            if match:
                (tmp_path / match.group(1)).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    envs = [gpusim.make("ring_gather.cuda:RingGatherCUDA", num_envs=64, backend=name, seed=3)
            for name in ("cuda_c", "cpu")]
    for env in envs:
        env.reset()
    gen = torch.Generator().manual_seed(0)
    for t in range(200):
        actions = torch.randint(0, 3, (64, envs[0].num_agents, 1), generator=gen,
                                dtype=torch.int32)
        outs = [env.step(actions.to(env.device)) for env in envs]
        for k in range(4):
            assert torch.equal(outs[0][k].cpu(), outs[1][k]), f"output {k}, step {t}"
    assert torch.equal(envs[0].rng_state.cpu(), envs[1].rng_state)
