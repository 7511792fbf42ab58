"""DDPG, TD3 and SAC: they run through the CLI and learn, checkpoint (optionally with the
replay buffers) and resume exactly, keep two gloo ranks' parameters identical, and refuse
discrete actions in one line."""
import json
from pathlib import Path

import pytest
import torch

from gpusim import train
from gpusim.envs import env_class
from gpusim.errors import GpusimError
from gpusim.scale import distributed
from gpusim.training.algorithms.offpolicy import OffPolicy
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config
from gpusim.training.speed.descent import EagerDescent

PENDULUM = env_class("pendulum")
TINY = {"trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.rollout_len": 8,
        "trainer.learning_starts": 32, "trainer.batch_size": 16, "trainer.replay_ratio": 0.25,
        "policy.hidden_sizes": [16, 16], "trainer.target_return": None}


def tiny(algorithm, **extra):
    return load_run_config("pendulum", PENDULUM, overrides={
        **TINY, "trainer.algorithm": algorithm, "trainer.total_steps": 32 * 4, **extra})


@pytest.mark.parametrize("algorithm", ["ddpg", "td3", "sac"])
def test_each_algorithm_updates_its_networks_and_reports_losses(algorithm):
    trainer = Trainer(tiny(algorithm), PENDULUM)
    assert isinstance(trainer.algorithm, OffPolicy)
    model = trainer.algorithm.policies[0].model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    summary = trainer.train()
    assert summary["iterations"] == 4
    after = model.state_dict()
    for part in ("actor.", "critics.", "target_critics."):
        assert any(not torch.equal(before[k], after[k]) for k in after if k.startswith(part))
    assert len(model.critics) == (1 if algorithm == "ddpg" else 2)
    assert len(trainer.algorithm.policies[0].replay) == 4 * 8 * 4  # every agent-step kept
    stats = trainer.metrics({"agent": trainer.iterate(1e-3)["agent"]}, 1.0, 1e-3)
    assert stats["value_loss/agent"] > 0 and "alpha/agent" in stats
    if algorithm == "sac":  # alpha is tuned
        assert not torch.equal(before["log_alpha"], after["log_alpha"])


def test_compile_auto_compiles_long_off_policy_runs_on_the_cpu():
    """`trainer.compile: auto` on the CPU: a run of CPU_COMPILE_MIN_STEPS gradient steps or
    more (after learning_starts) compiles its gradient step; a shorter one, or a short PPO
    run, runs eagerly; `off` always wins."""
    from gpusim.training.algorithms.offpolicy import CPU_COMPILE_MIN_STEPS
    steps = 4 * 8  # env steps per iteration; x replay_ratio 0.25: 8 gradient steps
    enough = (CPU_COMPILE_MIN_STEPS // 8 + TINY["trainer.learning_starts"] // steps) * steps
    assert Trainer(tiny("sac", **{"trainer.total_steps": enough}), PENDULUM).algorithm.use_compile
    assert not Trainer(tiny("sac", **{"trainer.total_steps": enough - steps}),
                       PENDULUM).algorithm.use_compile
    assert not Trainer(tiny("sac", **{"trainer.total_steps": enough, "trainer.compile": "off"}),
                       PENDULUM).algorithm.use_compile
    ppo = load_run_config("pendulum", PENDULUM, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 4, "trainer.total_steps": 10**5})
    assert not Trainer(ppo, PENDULUM).algorithm.use_compile


def test_td3_steps_its_actor_every_policy_delay_critic_steps(monkeypatch):
    trainer = Trainer(tiny("td3", **{"trainer.policy_delay": 3}), PENDULUM)
    trainer.algorithm.collect(10**6)  # past learning_starts
    calls = []
    original = EagerDescent.step
    monkeypatch.setattr(EagerDescent, "step", lambda self, name, *a: (
        calls.append(name), original(self, name, *a))[1])
    for _ in range(6):
        trainer.algorithm.policies[0].step()
    assert calls == ["critic"] * 2 + ["critic", "actor"] + ["critic"] * 2 + ["critic", "actor"]


def test_transitions_hold_the_true_final_observation_and_terminal_flags():
    """Pendulum only truncates: no transition is terminal, and a truncated replica's stored
    next observation is its last one, not the next episode's first."""
    config = tiny("sac", **{"env.max_episode_steps": 5, "trainer.rollout_len": 5})
    trainer = Trainer(config, PENDULUM)
    trainer.algorithm.collect(0)
    replay = trainer.algorithm.policies[0].replay
    batch = replay.sample(len(replay))
    assert not bool(batch.terminated.any())
    state = trainer.env.get_state()
    # the last step truncated every replica: its next_obs is the final obs, while the env
    # has already reset (timestep 0)
    assert bool((state["timestep"] == 0).all())
    last = replay.state_dict()
    final_rows = last["next_obs"][-4:]
    assert not torch.allclose(final_rows, trainer.env.arrays["obs"][:, 0].cpu())


def test_discrete_policies_are_refused_in_one_line():
    with pytest.raises(GpusimError, match="needs continuous actions"):
        Trainer(load_run_config("cartpole", env_class("cartpole"), overrides={
            "trainer.backend": "cpu", "trainer.algorithm": "sac"}), env_class("cartpole"))


def run(results, *args):
    return train.main(["--env", "pendulum", "--algorithm", "td3", "--backend", "cpu",
                       "--num_envs", "4", "--rollout_len", "8", "--results_dir", str(results),
                       "--quiet", "--set", "trainer.learning_starts=32",
                       "--set", "trainer.batch_size=16", "--set", "trainer.replay_ratio=0.25",
                       "--set", "policy.hidden_sizes=[16,16]",
                       "--set", "trainer.checkpoint_every=2", "--set", "trainer.anneal_lr=false",
                       *args])


def metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time_s", "env_steps_per_s")
             and not k.startswith("time_share")} for r in rows]


@pytest.mark.parametrize("with_replay", [True, False])
def test_resume_restores_the_replay_buffer_when_checkpointed(tmp_path, with_replay):
    flag = f"trainer.checkpoint_replay={str(with_replay).lower()}"
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(full, "--total_steps", str(32 * 6), "--set", flag) == 0
    assert run(part, "--total_steps", str(32 * 4), "--set", flag) == 0
    (part_dir,) = part.iterdir()
    (full_dir,) = full.iterdir()
    state = torch.load(sorted((part_dir / "checkpoints").iterdir())[-1], weights_only=True)
    assert ("replay" in state["ranks"][0]["algorithm"]) == with_replay
    assert train.main(["--resume", str(part_dir), "--total_steps", str(32 * 6), "--quiet"]) == 0
    if with_replay:  # the resumed run is the uninterrupted one
        assert metrics(part_dir) == metrics(full_dir)
    else:  # it goes on with an empty buffer: the updates after resuming differ
        assert metrics(part_dir)[:4] == metrics(full_dir)[:4]
        assert metrics(part_dir)[4:] != metrics(full_dir)[4:]


def sac_worker(out_dir):
    """One rank: a few SAC iterations, then its parameters for the test to compare."""
    from gpusim.scale.device import DeviceContext
    context = DeviceContext.from_environment()
    context.bind("cpu", quiet=True)
    distributed.init(context, timeout_s=60)
    trainer = Trainer(tiny("sac", **{"trainer.prioritized_replay": True}), PENDULUM, context)
    trainer.train()
    torch.save({"params": trainer.algorithm.policies[0].model.state_dict(),
                "replay": len(trainer.algorithm.policies[0].replay),
                "counts": trainer.algorithm.policies[0].replay.last_counts},
               Path(out_dir) / f"rank{context.rank}.pt")
    distributed.shutdown()
    return 0


@pytest.mark.slow
def test_two_gloo_ranks_keep_sac_parameters_identical(tmp_path):
    distributed.launch(2, sac_worker, str(tmp_path), timeout_s=120)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    for key, value in r0["params"].items():
        assert torch.equal(value, r1["params"][key]), key
    # each rank kept its own shard, and they drew one global batch between them
    assert r0["replay"] == r1["replay"] == 4 * 8 * 2  # 2 iterations each (total_steps counts both)
    assert torch.equal(torch.as_tensor(r0["counts"]), torch.as_tensor(r1["counts"]))
    assert int(torch.as_tensor(r0["counts"]).sum()) == 16


def test_an_off_policy_run_is_evaluated_with_its_actor(tmp_path):
    from gpusim.training.trained import evaluation
    assert run(tmp_path, "--total_steps", str(32 * 2), "--set", "env.max_episode_steps=20",
               "--set", "trainer.final_eval_episodes=4") == 0
    (run_dir,) = tmp_path.iterdir()
    saved = json.loads((run_dir / "eval.json").read_text())
    assert list(saved["pairings"]) == ["agent trained", "agent random"]
    assert evaluation.main([str(run_dir), "--episodes", "2"]) == 0
