"""The CPU thread policy: the cores a process may use (affinity, cgroup quota), what the
user set (trainer.torch_threads, OMP_NUM_THREADS, NUMBA_NUM_THREADS, the waiting
policy), and counts decided by the work that never exceed the cores."""
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest
import torch

from gpusim import cpu_threads
from gpusim.errors import GpusimError
from gpusim.scale import threads
from gpusim.scale.device import DeviceContext
from gpusim.scale.threads import Work, plan

ROOT = Path(__file__).resolve().parents[2]
BIG = Work(rollout_macs=2 ** 31, update_macs=2 ** 31, env_obs_values=2 ** 20)


# ---- cgroup quota, from fake /proc and /sys trees ---------------------------------------
def fake_root(tmp_path, cgroup: str, mounts: list[str], files: dict) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text("".join(m + "\n" for m in mounts))
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"
V1_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct"


@pytest.mark.parametrize("cpu_max, quota", [("150000 100000\n", 1.5), ("max 100000\n", None),
                                            ("400000 100000\n", 4.0), ("junk\n", None)])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, quota):
    root = fake_root(tmp_path, "0::/job.slice/step_0\n", [V2_MOUNT],
                     {"sys/fs/cgroup/job.slice/step_0/cpu.max": cpu_max})
    assert cpu_threads.cgroup_quota(root) == quota


def test_cgroup_v2_an_ancestors_quota_binds(tmp_path):
    """Slurm and systemd put the quota on a parent group: the tightest one up the tree."""
    root = fake_root(tmp_path, "0::/job.slice/step_0\n", [V2_MOUNT], {
        "sys/fs/cgroup/cpu.max": "max 100000",
        "sys/fs/cgroup/job.slice/cpu.max": "100000 100000",
        "sys/fs/cgroup/job.slice/step_0/cpu.max": "max 100000"})
    assert cpu_threads.cgroup_quota(root) == 1.0


@pytest.mark.parametrize("quota_us, period_us, quota", [("250000", "100000", 2.5),
                                                         ("-1", "100000", None)])
def test_cgroup_v1_cfs_quota(tmp_path, quota_us, period_us, quota):
    group = "sys/fs/cgroup/cpu,cpuacct/docker/abc"
    root = fake_root(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", [V1_MOUNT],
                     {f"{group}/cpu.cfs_quota_us": quota_us,
                      f"{group}/cpu.cfs_period_us": period_us})
    assert cpu_threads.cgroup_quota(root) == quota


def test_cgroup_inside_a_container_reads_the_mount_itself(tmp_path):
    """A container's mount shows its own group as the root, named by the host's path."""
    mount = "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"
    root = fake_root(tmp_path, "5:cpu:/other/path\n", [mount], {
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000",
        "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"})
    assert cpu_threads.cgroup_quota(root) == 1.0


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cpu_threads.cgroup_quota(tmp_path) is None


@pytest.mark.parametrize("affinity, cpu_max, cores", [(4, "150000 100000", 1),
                                                      (4, "250000 100000", 2),
                                                      (2, "800000 100000", 2),
                                                      (3, "max 100000", 3),
                                                      (4, "50000 100000", 1)])
def test_usable_cores_is_the_affinity_capped_by_the_quota(tmp_path, monkeypatch, affinity,
                                                          cpu_max, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    root = fake_root(tmp_path, "0::/\n", [V2_MOUNT], {"sys/fs/cgroup/cpu.max": cpu_max})
    assert cpu_threads.usable_cores(root) == cores


# ---- environment variables ---------------------------------------------------------------
@pytest.mark.parametrize("raw, count", [("3", 3), ("4,2", 4), ("", None), ("0", None),
                                        ("two", None), (" 2 ", 2)])
def test_user_counts(raw, count):
    assert cpu_threads.user_count("OMP_NUM_THREADS", {"OMP_NUM_THREADS": raw}) == count


@pytest.mark.parametrize("environ, set_", [({}, {"OMP_WAIT_POLICY": "PASSIVE"}),
                                           ({"OMP_WAIT_POLICY": "ACTIVE"}, {}),
                                           ({"GOMP_SPINCOUNT": "10000"}, {}),
                                           ({"KMP_BLOCKTIME": "200"}, {})])
def test_wait_defaults_never_override_the_user(environ, set_):
    before = dict(environ)
    assert cpu_threads.set_wait_defaults(environ) == set_
    assert environ == {**before, **set_}


def test_gpusim_import_sets_the_waiting_policy_before_torch_loads():
    """`python -m gpusim.train` imports gpusim first: torch's OpenMP runtime, loaded after,
    reads the default. A user's choice stays; torch imported first is noted."""
    probe = ("import sys; first = sys.argv[1] == 'torch'\n"
             "if first: import torch\n"
             "import gpusim, os\n"
             "print(os.environ.get('OMP_WAIT_POLICY'), gpusim.cpu_threads.torch_loaded_first,"
             " 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in cpu_threads.WAIT_CHOICES}
    seen = {}
    for order, extra in (("gpusim", {}), ("torch", {}), ("gpusim", {"OMP_WAIT_POLICY": "ACTIVE"})):
        done = subprocess.run([sys.executable, "-c", probe, order], env={**env, **extra},
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        seen[(order, bool(extra))] = done.stdout.split()
    # gpusim's package import itself imports torch, after setting the default
    assert seen[("gpusim", False)] == ["PASSIVE", "False", "True"]
    assert seen[("torch", False)] == ["PASSIVE", "True", "True"]
    assert seen[("gpusim", True)] == ["ACTIVE", "False", "True"]


# ---- the counts --------------------------------------------------------------------------
def test_small_work_runs_one_thread_and_large_work_every_core():
    assert plan(4, Work(rollout_macs=10 ** 5, update_macs=10 ** 6, env_obs_values=100),
                environ={}) == threads.ThreadPlan(1, 1, 1, plan(4, environ={}).why)
    big = plan(4, BIG, environ={})
    assert (big.rollout_torch, big.update_torch, big.numba) == (4, 4, 4)
    mixed = plan(2, Work(rollout_macs=10 ** 5, update_macs=2 ** 30), environ={})
    assert (mixed.rollout_torch, mixed.update_torch, mixed.numba) == (1, 2, 1)


def test_a_populations_batched_update_takes_every_core_from_smaller_work():
    """A population's update products are batched over its members: a second thread pays
    from POPULATION_PARALLEL_MACS, far below one product's threshold; its rollout keeps
    one product's."""
    work = Work(rollout_macs=2 ** 20, update_macs=threads.POPULATION_PARALLEL_MACS)
    assert plan(2, work, environ={}).update_torch == 1  # one run: too small
    population = plan(2, Work(rollout_macs=2 ** 20, update_macs=work.update_macs,
                              members=8), environ={})
    assert (population.rollout_torch, population.update_torch) == (1, 2)
    small = Work(update_macs=threads.POPULATION_PARALLEL_MACS - 1, members=8)
    assert plan(2, small, environ={}).update_torch == 1


def test_the_users_counts_win_over_the_work():
    small = Work()
    p = plan(4, small, environ={"OMP_NUM_THREADS": "3", "NUMBA_NUM_THREADS": "2"})
    assert (p.rollout_torch, p.update_torch, p.numba) == (3, 3, 2)
    p = plan(4, BIG, environ={"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"})
    assert (p.rollout_torch, p.update_torch, p.numba) == (1, 1, 1)
    p = plan(4, BIG, torch_threads=2, environ={"OMP_NUM_THREADS": "1"})  # the config wins
    assert (p.rollout_torch, p.update_torch) == (2, 2)
    assert "trainer.torch_threads" in p.why


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
def test_counts_never_exceed_the_cores(cores):
    works = (None, Work(), BIG, Work(update_macs=2 ** 30))
    envs = ({}, {"OMP_NUM_THREADS": "64"}, {"NUMBA_NUM_THREADS": "64"},
            {"OMP_NUM_THREADS": "1,64", "NUMBA_NUM_THREADS": "0"})
    for work, environ, torch_threads in itertools.product(works, envs, range(cores + 1)):
        p = plan(cores, work, torch_threads, environ)
        assert 1 <= min(p.rollout_torch, p.update_torch, p.numba)
        assert p.most <= cores, (work, environ, torch_threads, p)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads(), numba.get_num_threads()
    yield
    torch.set_num_threads(before[0])
    numba.set_num_threads(before[1])


@pytest.mark.parametrize("local_world", [1, 2, 4])
def test_bind_shares_the_usable_cores_between_local_processes(monkeypatch, restore_threads,
                                                              local_world):
    """`--num_gpus N --backend cpu`: each of N workers gets its share of the affinity and
    quota, and its pools stay within it even where the user asks for more."""
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda root="/": 4)
    monkeypatch.setenv("WORLD_SIZE", str(local_world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "16")
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    share = 4 // local_world
    assert context.cores() == share
    context.fit_threads(BIG)
    for phase in ("rollout", "update"):
        context.use_threads(phase)
        assert torch.get_num_threads() == share
        assert numba.get_num_threads() == min(share, numba.config.NUMBA_NUM_THREADS)
    alone = context.alone()  # an auto-scale trial keeps this process's share
    assert (alone.world_size, alone.cores()) == (1, share)


def test_torch_threads_beyond_the_cores_is_refused(monkeypatch, restore_threads):
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda root="/": 2)
    with pytest.raises(GpusimError, match="trainer.torch_threads=3 exceeds the 2 cores"):
        DeviceContext().bind("cpu", quiet=True, torch_threads=3)


def test_the_loop_runs_each_phase_with_its_counts(monkeypatch, restore_threads):
    """A run whose update is large and rollout small: one torch thread while acting, every
    core while training (here 2, forced by the thresholds)."""
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    monkeypatch.setattr(threads, "TORCH_PARALLEL_MACS", 10 ** 6)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config = load_run_config("cartpole", env_class("cartpole"), overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 64,
        "trainer.num_minibatches": 1, "trainer.update_epochs": 1, "trainer.total_steps": 256})
    context = DeviceContext(cpu_cores=2)
    context.bind("cpu", quiet=True)
    trainer = Trainer(config, env_class("cartpole"), context)
    assert (context.thread_plan.rollout_torch, context.thread_plan.update_torch) == (1, 2)
    seen = []
    for name in ("collect", "update"):
        method = getattr(trainer.algorithm, name)
        monkeypatch.setattr(trainer.algorithm, name, lambda *a, _m=method, _n=name: (
            seen.append((_n, torch.get_num_threads())), _m(*a))[1])
    trainer.iterate(config.trainer.lr)
    assert seen == [("collect", 1), ("update", 2)]


def test_shipped_recipes_run_one_thread_per_pool():
    """The thresholds put every shipped recipe's work below them (measured: a second
    thread did not pay at these sizes; docs/benchmarks.md)."""
    import gpusim
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config, recipe_path
    from gpusim.training.work import run_work
    for name, algorithm in (("cartpole", None), ("tag_continuous", None), ("pendulum", "sac")):
        cls = env_class(name)
        config = load_run_config(name, cls, path=recipe_path(cls, algorithm))
        env = cls(num_envs=config.trainer.num_envs, backend=gpusim.get_backend("cpu"),
                  config=config.env)
        p = plan(2, run_work(config, env), environ={})
        assert p.most == 1, (name, p)
