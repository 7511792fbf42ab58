"""Trained gpusim policies in other clients: the examples of docs/interop.md ("Loading a
trained policy") and of Getting started's "Use a trained policy", run as they are written.

The default suite runs them on tiny runs (a few episodes). The slow tests train a
cartpole and a simple_spread policy briefly and check that gymnasium's CartPole-v1 and
mpe2's parallel simple_spread give the same mean return as gpusim's own evaluation: the
two 95% confidence intervals overlap.
"""
import re
from pathlib import Path

import numba
import pytest
import torch

from gpusim import train
from gpusim.training.trained import evaluation

pytest.importorskip("gymnasium")
pytest.importorskip("mpe2")

ROOT = Path(__file__).resolve().parents[2]
INTEROP = (ROOT / "docs" / "interop.md").read_text()
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text()
CARTPOLE = ["--env", "cartpole", "--backend", "cpu", "--quiet"]
SPREAD = ["--env", "simple_spread", "--backend", "cpu", "--quiet",
          "--set", "env.continuous_actions=true"]


def python_block(text: str, containing: str) -> str:
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S)
               if containing in block]
    return code


def defined(code: str, name: str):
    namespace = {}
    exec(compile(code, "docs/interop.md", "exec"), namespace)
    return namespace[name]


def trained(results: Path, argv) -> Path:
    threads = torch.get_num_threads(), numba.get_num_threads()
    try:
        assert train.main(argv + ["--results_dir", str(results)]) == 0
    finally:  # the trainer binds this process's thread counts
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    (run_dir,) = results.iterdir()
    return run_dir


TINY = ["--num_envs", "4", "--rollout_len", "25", "--total_steps", "100"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    return {"cartpole": trained(root / "cartpole", CARTPOLE + TINY),
            "simple_spread": trained(root / "simple_spread", SPREAD + TINY)}


def test_the_docs_examples_run(tiny_runs):
    returns = defined(python_block(INTEROP, "def gymnasium_returns"), "gymnasium_returns")
    mean, half = returns(tiny_runs["cartpole"], episodes=3)
    assert 1 <= mean <= 500 and half >= 0
    returns = defined(python_block(INTEROP, "def pettingzoo_returns"), "pettingzoo_returns")
    mean, half = returns(tiny_runs["simple_spread"], episodes=2)
    assert mean < 0 and half >= 0


@pytest.mark.parametrize("client, run", [("import gymnasium", "cartpole"),
                                         ("from mpe2", "simple_spread")])
def test_the_getting_started_examples_run(tiny_runs, client, run):
    """Getting started's loops of a trained policy, each under ten lines, on a tiny run of their env."""
    code = python_block(GETTING_STARTED, client)
    assert len([line for line in code.splitlines() if line.strip()]) < 10
    code, count = re.subn(r'load_policies\("[^"]+"\)', f'load_policies({str(tiny_runs[run])!r})',
                          code)
    assert count == 1
    namespace = {}
    exec(compile(code, "docs/getting-started.md", "exec"), namespace)
    if run == "cartpole":
        assert namespace["terminated"] or namespace["truncated"]
    else:
        assert not namespace["env"].agents


def gpusim_returns(run_dir, episodes):
    results = evaluation.evaluate(run_dir, episodes, deterministic=True, trained_only=True,
                                log=lambda *args: None)
    (figures,) = results.values()
    return figures["return/agent"]["mean"], figures["return/agent"]["ci95"]


def same_within_confidence(ours, theirs):
    (m1, h1), (m2, h2) = ours, theirs
    assert abs(m1 - m2) <= h1 + h2, f"gpusim {m1:.2f} +- {h1:.2f}, other {m2:.2f} +- {h2:.2f}"


@pytest.mark.slow
def test_a_cartpole_policy_returns_as_much_in_gymnasium(tmp_path, capsys):
    run_dir = trained(tmp_path, CARTPOLE + ["--total_steps", "98304"])
    ours = gpusim_returns(run_dir, 200)
    returns = defined(python_block(INTEROP, "def gymnasium_returns"), "gymnasium_returns")
    theirs = returns(run_dir, episodes=200)
    with capsys.disabled():
        print(f"\ncartpole: gpusim {ours[0]:.1f} +- {ours[1]:.1f}, "
              f"gymnasium {theirs[0]:.1f} +- {theirs[1]:.1f}")
    same_within_confidence(ours, theirs)


@pytest.mark.slow
def test_a_simple_spread_policy_returns_as_much_in_mpe2(tmp_path, capsys):
    run_dir = trained(tmp_path, SPREAD + ["--total_steps", "96000"])
    # an episode's return varies more here (SD about 5 against a mean of about -19)
    ours = gpusim_returns(run_dir, 500)
    returns = defined(python_block(INTEROP, "def pettingzoo_returns"), "pettingzoo_returns")
    theirs = returns(run_dir, episodes=500)
    with capsys.disabled():
        print(f"\nsimple_spread: gpusim {ours[0]:.2f} +- {ours[1]:.2f}, "
              f"mpe2 {theirs[0]:.2f} +- {theirs[1]:.2f}")
    same_within_confidence(ours, theirs)
