"""Several processes on the CPU: gloo DDP, failures, the launcher (its store, whom it blames,
Ctrl-C, the store barrier), torchrun, the messenger, the compile cache."""
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
import torch.distributed as tdist

from gpusim import cache
from gpusim.backends import set_build_once
from gpusim.envs.cartpole.env import CartPole
from gpusim.errors import BackendError, ConfigError, GpusimError
from gpusim.kernels import KernelSpec, agent_phase
from gpusim.scale import distributed, messenger
from gpusim.scale.scale_config import ONE_WEEK_S, ScaleConfig

HERE = Path(__file__).resolve().parent  # children import this module by name
TESTS = HERE.parent
ROOT = TESTS.parent
CARTPOLE_FLAGS = ["--env", "cartpole", "--backend", "cpu", "--num_envs", "4",
                  "--rollout_len", "8", "--total_steps", "192", "--quiet",
                  "--set", "trainer.checkpoint_every=1"]


def child_env(**extra):
    path = os.pathsep.join([str(HERE), str(TESTS), str(ROOT)])
    env = dict(os.environ, PYTHONPATH=path, **extra)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", distributed.LAUNCHER_STORE):
        env.pop(name, None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- DDP with gloo ---------------------------------------------------------------------
def ddp_worker(out_dir):
    """One rank: train a few iterations, then save what the test compares."""
    from gpusim.scale.device import DeviceContext
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    distributed.init(context, timeout_s=60)
    config = load_run_config("cartpole", CartPole, overrides={
        "trainer.num_envs": 4, "trainer.rollout_len": 8, "trainer.total_steps": 4 * 8 * 2 * 3})
    trainer = Trainer(config, CartPole, context)
    first_rng = trainer.env.rng_state.clone()
    summary = trainer.train()
    torch.save({"params": {g.name: g.model.state_dict() for g in trainer.algorithm.policies},
                "first_rng": first_rng, "summary": summary,
                "state": trainer.state_dict()},
               Path(out_dir) / f"rank{context.rank}.pt")
    distributed.shutdown()
    return 0


def test_two_rank_gloo_ddp_keeps_parameters_identical_and_replicas_distinct(tmp_path):
    distributed.launch(2, ddp_worker, str(tmp_path), timeout_s=120)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["summary"]["iterations"] == r1["summary"]["iterations"] == 3
    for name, params in r0["params"].items():
        for key, value in params.items():
            assert torch.equal(value, r1["params"][name][key]), key
    # Replicas differ across ranks: rank r holds global replicas r*4 .. r*4+3.
    assert not torch.equal(r0["first_rng"], r1["first_rng"])
    together = CartPole(num_envs=8, backend="cpu", seed=0)  # one process, all 8 replicas
    together.reset()
    assert torch.equal(r0["first_rng"], together.rng_state[:4])
    assert torch.equal(r1["first_rng"], together.rng_state[4:])
    # Rank 0's checkpoint state holds every rank's replicas; the others return None.
    assert r1["state"] is None
    ranks = r0["state"]["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["next_obs"], ranks[1]["next_obs"])
    # Episodes of both ranks are pooled: the same count on both.
    assert r0["summary"]["episodes"] == r1["summary"]["episodes"] > 0


@pytest.mark.slow
def test_two_cpu_processes_through_the_cli_and_resume(tmp_path):
    argv = [sys.executable, "-m", "gpusim.train", *CARTPOLE_FLAGS, "--num_gpus", "2",
            "--results_dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    (run_dir,) = tmp_path.iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # 192 steps / (2 ranks x 4 replicas x 8 steps)
    assert '"num_processes": 2' in lines[0]
    resumed = subprocess.run([sys.executable, "-m", "gpusim.train", "--resume", str(run_dir),
                              "--total_steps", "256", "--num_gpus", "2", "--quiet"],
                             capture_output=True, text=True, env=child_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at iteration 3" in resumed.stdout
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    wrong = subprocess.run([sys.executable, "-m", "gpusim.train", "--resume", str(run_dir),
                            "--total_steps", "512", "--quiet"],
                           capture_output=True, text=True, env=child_env(), timeout=300)
    assert wrong.returncode != 0 and "resume it with 2 processes" in wrong.stderr


class FailingCartPole(CartPole):
    """Raises on rank 1 (replicas offset from 0) at its fifth step."""

    def step(self, actions=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.env_offset > 0 and self.calls == 5:
            raise RuntimeError("injected failure on the second rank")
        return super().step(actions)


@pytest.mark.slow
def test_one_rank_failing_stops_every_rank_with_its_message(tmp_path):
    argv = [sys.executable, "-m", "gpusim.train", "--env", "test_distributed:FailingCartPole",
            "--backend", "cpu", "--num_gpus", "2", "--total_steps", "100000", "--quiet",
            "--results_dir", str(tmp_path)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 1
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error_lines == ["error: rank 1: RuntimeError: injected failure on the second rank"]
    assert time.perf_counter() - start < 120  # and no rank left behind:
    assert "Traceback" not in done.stderr


def test_more_gpus_than_exist_is_a_clear_error(capsys):
    from gpusim.train import main
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    asked = max(2, count + 1)
    assert main(["--env", "cartpole", "--backend", "auto", "--num_gpus", str(asked)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --num_gpus {asked} ") and "GPU" in err
    assert err.count("\n") == 1


# ---- the launcher: its store, whom it blames, the store barrier -------------------------
def listening_hosts(port: int, table: str) -> list[str]:
    """The kernel's local addresses (hex) of sockets listening on `port`, from /proc/net/<table>."""
    path = Path("/proc/net", table)
    if not path.exists():  # no IPv6 here
        return []
    hosts = []
    for line in path.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, port_hex = local.rsplit(":", 1)
        if int(port_hex, 16) == port and state == "0A":  # 0A: TCP_LISTEN
            hosts.append(host)
    return hosts


def test_launcher_store_listens_on_loopback_only():
    store = distributed.loopback_store(2, timeout_s=10)
    assert listening_hosts(store.port, "tcp") == ["0100007F"]  # 127.0.0.1, little-endian
    assert listening_hosts(store.port, "tcp6") == []
    peer = tdist.TCPStore("127.0.0.1", store.port, 2, is_master=False)
    peer.set("key", "value")
    assert store.get("key") == b"value"


def join_group(collective_timeout_s=30.0):
    from gpusim.scale.device import DeviceContext
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    distributed.init(context, timeout_s=30, collective_timeout_s=collective_timeout_s)
    return context


def failing_worker(how):
    """Rank 1 fails `how` after joining the group; rank 0 waits for it in a collective."""
    context = join_group(collective_timeout_s=5)
    if context.rank == 1:
        if how == "exit":
            os._exit(3)
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "hang":
            time.sleep(120)
    distributed.min_across(context.rank)
    return 0


@pytest.mark.parametrize("how, message, exit_code, limit_s", [
    ("exit", "rank 1: exited with code 3", 3, 10),
    ("kill", "rank 1: killed by signal SIGKILL", 1, 10),
    ("hang", "rank 1: did not reach a collective within scale.collective_timeout_s=5 s "
             "(the other ranks timed out waiting for it)", 1, 5 + 10),
], ids=["exit", "kill", "hang"])
def test_launcher_blames_the_rank_that_failed_not_the_first_to_report(
        how, message, exit_code, limit_s):
    start = time.perf_counter()
    with pytest.raises(distributed.RankFailed) as raised:
        distributed.launch(2, failing_worker, how, timeout_s=30, collective_timeout_s=5)
    assert time.perf_counter() - start < limit_s
    assert str(raised.value) == message
    assert (raised.value.rank, raised.value.exit_code) == (1, exit_code)
    assert not multiprocessing.active_children()  # the hanging rank was stopped too


def barrier_worker(how):
    """Both ranks meet at a store barrier; rank 1 comes late, or never."""
    context = join_group()
    if context.rank == 1:
        time.sleep(120 if how == "never" else 1.0)
    start = time.perf_counter()
    for _ in range(2):  # a name can be used again
        distributed.wait_for_all("meet", timeout_s=1.0 if how == "never" else 30.0)
    waited = time.perf_counter() - start
    if context.rank == 0 and waited < 0.8:
        raise AssertionError(f"rank 0 left the barrier after {waited:.2f} s, before rank 1 came")
    distributed.shutdown()
    return 0


def test_wait_for_all_returns_when_every_rank_arrived():
    distributed.wait_for_all("alone", timeout_s=0.001)  # a lone process: nothing to wait for
    distributed.launch(2, barrier_worker, "late", timeout_s=30)


def test_wait_for_all_times_out_naming_how_many_ranks_arrived():
    with pytest.raises(distributed.RankFailed) as raised:
        distributed.launch(2, barrier_worker, "never", timeout_s=30)
    assert str(raised.value).startswith(
        "rank 0: timed out after 1 s waiting at 'meet': 1 of 2 ranks arrived")


def ctrl_c_proof_worker(_):
    """A rank that runs on through a Ctrl-C, as a trainer does until its iteration ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.write(1, f"ready {os.getpid()}\n".encode())  # one write: the ranks share the pipe
    time.sleep(60)
    return 0


@pytest.mark.slow
def test_first_ctrl_c_is_left_to_the_ranks_the_second_stops_them():
    code = ("import test_distributed as t; from gpusim.scale import distributed as d; "
            "d.launch(2, t.ctrl_c_proof_worker, None)")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env())
    ready = [launcher.stdout.readline().split() for _ in range(2)]
    assert [word for word, _ in ready] == ["ready", "ready"]
    launcher.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert launcher.poll() is None  # still watching its ranks
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=15)
    assert err.count("stopping after the current iteration (Ctrl-C again to stop now)") == 1
    assert "KeyboardInterrupt" in err and launcher.returncode != 0
    for _, pid in ready:  # both ranks were stopped
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


@pytest.mark.parametrize("key", ["timeout_s", "time_limit_s", "collective_timeout_s"])
def test_scale_waits_must_be_positive_and_at_most_a_week(key):
    ScaleConfig(**{key: ONE_WEEK_S}).check()
    with pytest.raises(ConfigError, match=f"'scale.{key}' must be positive"):
        ScaleConfig(**{key: 0}).check()
    with pytest.raises(ConfigError, match=f"'scale.{key}' must be at most {ONE_WEEK_S} s"):
        ScaleConfig(**{key: 1e300}).check()


# ---- torchrun -----------------------------------------------------------------------
@pytest.mark.slow
def test_torchrun_one_node_two_processes(tmp_path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(free_port()), "-m", "gpusim.train", *CARTPOLE_FLAGS,
            "--results_dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()  # only rank 0 made a run directory
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_torchrun_two_nodes_over_loopback(tmp_path):
    port = str(free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n),
         "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port,
         "-m", "gpusim.train", *CARTPOLE_FLAGS, "--results_dir", str(tmp_path / f"node{n}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        for n in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-2000:]
    assert "env steps" in outputs[0][0] and outputs[1][0].strip() == ""
    (run_dir,) = (tmp_path / "node0").iterdir()
    assert '"num_processes": 2' in (run_dir / "metrics.jsonl").read_text()
    assert not (tmp_path / "node1").exists()


# ---- the messenger ------------------------------------------------------------------
@pytest.fixture()
def store():
    master = tdist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    yield master


def client(store, rank, timeout_s=10.0):
    other = tdist.TCPStore("127.0.0.1", store.port, 2, is_master=False)
    return messenger.EventMessenger(other, rank, 2, timeout_s)


def test_messenger_waits_for_rank_zero(store):
    rank0, rank1 = client(store, 0), client(store, 1)
    order = []

    def publish_later():
        time.sleep(0.3)
        order.append("rank0 done")
        rank0.publish("built")
    thread = threading.Thread(target=publish_later)
    thread.start()
    assert rank1.wait("built")["ok"]
    order.append("rank1 woke")
    thread.join()
    assert order == ["rank0 done", "rank1 woke"]


def test_messenger_once_runs_on_rank_zero_first(store):
    rank0, rank1 = client(store, 0), client(store, 1)
    calls = []
    results = {}
    thread = threading.Thread(target=lambda: results.update(r1=rank1.once("job", lambda: calls.append(1) or 1)))
    thread.start()
    time.sleep(0.2)
    assert calls == []  # rank 1 is waiting
    assert rank0.once("job", lambda: calls.append(0) or 0) == 0
    thread.join(timeout=10)
    assert calls == [0, 1] and results["r1"] == 1


def test_messenger_times_out_with_a_clear_error(store):
    rank1 = client(store, 1, timeout_s=0.5)
    start = time.perf_counter()
    with pytest.raises(GpusimError, match="rank 1: timed out after 0.5 s waiting for rank 0"):
        rank1.wait("never")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("timeout", [0, -1])
def test_messenger_rejects_bad_timeouts(store, timeout):
    with pytest.raises(GpusimError, match="timeout must be positive"):
        messenger.EventMessenger(store, 0, 2, timeout)


def broken_phase(env, agent, s, p):
    s.obs[env, agent] = undefined_name  # noqa: F821 - a compile error on purpose


def test_compile_error_on_rank_zero_reaches_waiting_ranks(store):
    from gpusim.backends import get_backend
    spec = KernelSpec.of("broken_kernel", agent_phase(numba.jit(nopython=True)(broken_phase)))
    backend = get_backend("cpu")
    errors = {}

    def rank1():
        try:
            client(store, 1).once("compile cpu broken_kernel", lambda: None)
        except GpusimError as exc:
            errors[1] = str(exc)
    thread = threading.Thread(target=rank1)
    thread.start()
    set_build_once(client(store, 0).once)
    try:
        import collections
        views = collections.namedtuple("S", "obs")(np.zeros((1, 1, 1), np.float32))
        with pytest.raises(BackendError, match="compiling kernel 'broken_kernel'") as raised:
            backend.compile(spec, views, collections.namedtuple("P", "x")(np.float32(0)))
    finally:
        set_build_once(None)
    thread.join(timeout=30)
    assert "undefined_name" in str(raised.value)  # the compiler's own message
    assert "'compile cpu broken_kernel' failed on rank 0" in errors[1]
    assert "undefined_name" in errors[1]


# ---- the compile cache ---------------------------------------------------------------
def package_files():
    found = set()
    for top in ("gpusim", "envs", "training", "cuda_kernels"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".nbi", ".nbc") or path.name.startswith("gpusim_kernel") or \
                    path.name == "kernel.py":
                found.add(path)
    return found


@pytest.mark.slow
def test_compile_cache_shared_by_concurrent_processes_and_outside_the_package(tmp_path):
    """Two processes compile the same kernels into a fresh cache at once; a third loads them."""
    before = package_files()
    code = ("import gpusim, torch; env = gpusim.make('cartpole', num_envs=3, backend='cpu');"
            "env.reset(); env.step(torch.zeros((3, 1, 1), dtype=torch.int32));"
            "print(env._step_kernel.dispatcher.stats.cache_hits.total())")
    env = child_env(GPUSIM_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    later = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300)
    assert later.returncode == 0 and later.stdout.strip() == "1", later.stderr  # loaded
    assert package_files() == before
    entries = list((tmp_path / "cache" / "cpu").iterdir())
    assert len(entries) == 2  # cartpole's reset and step kernels
    assert all(list((e / "__pycache__").glob("*.nbi")) for e in entries)


def test_cache_refuses_a_directory_inside_the_package(monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(ROOT / "gpusim" / "compiled"))
    with pytest.raises(GpusimError, match="must not live inside the gpusim package"):
        cache.cache_root()


@numba.jit(nopython=True)
def callee_for_fingerprint():
    return 12345


def caller_for_fingerprint(env, agent, s, p):
    return callee_for_fingerprint()


def test_cache_key_follows_the_source_of_every_callee():
    text = cache.source_fingerprint(caller_for_fingerprint)
    assert "return 12345" in text  # a callee's edit changes the key
    assert cache.importable_name(callee_for_fingerprint) == (__name__, "callee_for_fingerprint")

    @numba.jit(nopython=True)
    def local():
        return 1
    assert cache.importable_name(local) is None  # compiled in memory instead


def league_worker(out_dir):
    """One rank of a league run: its pools and league statistics, saved after training."""
    from gpusim.envs import env_class
    from gpusim.scale.device import DeviceContext
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    distributed.init(context, timeout_s=60)
    cls = env_class("tag_continuous")
    config = load_run_config("tag_continuous", cls, overrides={
        "trainer.num_envs": 4, "trainer.rollout_len": 8, "trainer.total_steps": 4 * 8 * 2 * 4,
        "env.num_taggers": 2, "env.num_runners": 3, "env.num_other_agents_observed": 3,
        "env.episode_length": 6, "trainer.league": True, "trainer.league_snapshot_every": 1,
        "trainer.league_capacity": 2, "trainer.league_eviction": "lowest"})
    trainer = Trainer(config, cls, context)
    trainer.train()
    torch.save(trainer.algorithm.league.state_dict(), Path(out_dir) / f"rank{context.rank}.pt")
    distributed.shutdown()
    return 0


@pytest.mark.slow
def test_under_ddp_every_rank_holds_the_same_league(tmp_path):
    """Snapshots of identical models and statistics summed across ranks: the same pools,
    eviction choices (lowest rated: full pools after 4 updates) and baselines everywhere."""
    distributed.launch(2, league_worker, str(tmp_path), timeout_s=120)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert torch.equal(r0["baseline"], r1["baseline"]) and r0["updates"] == r1["updates"] == 4
    # games were played and credited (an episode whose snapshot was overwritten before it
    # ended counts for none: with a snapshot every update, most of them)
    assert sum(float(pool["games"].sum()) for pool in r0["pools"].values()) > 0
    for name, pool in r0["pools"].items():
        theirs = r1["pools"][name]
        assert pool["born"] == theirs["born"] and torch.equal(pool["wins"], theirs["wins"])
        assert torch.equal(pool["games"], theirs["games"])
        for key, value in pool["nets"].items():
            assert torch.equal(value, theirs["nets"][key]), key
