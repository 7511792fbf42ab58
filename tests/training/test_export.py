"""`python -m gpusim.export`: each policy's acting network as ONNX (run by onnxruntime) and
TorchScript (run by torch), giving `act(..., deterministic=True)`'s actions."""
import json
import warnings

import numpy as np
import pytest
import torch

import gpusim
from gpusim.training.trained import network_export
from trained_runs import TrainedRuns

KINDS = ["ppo", "lstm", "masked", "gaussian", "gru_gaussian", "sac", "mixed"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return TrainedRuns(tmp_path_factory.mktemp("export"))


def inputs_of(policy, batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    inputs = {"obs": rng.normal(size=(batch, policy.spec.obs_dim)).astype(np.float32)}
    if policy.masked:
        mask = rng.random((batch, sum(policy.spec.actions))) < 0.5
        mask[:, 0] = True  # a component keeps a legal choice
        inputs["mask"] = mask
    return inputs


def round_trip(run_dir, out, fmt, run_file):
    """For every policy, three steps of a batch of 7 (the export traced 2): the file's
    actions (and states) against `act`'s."""
    assert [p.name for p in network_export.export(run_dir, fmt, out)] == [
        f"{name}{network_export.FORMATS[fmt]}" for name in gpusim.load_policies(run_dir)]
    manifest = json.loads((out / "policies.json").read_text())["policies"]
    for name, policy in gpusim.load_policies(run_dir).items():
        assert list(manifest[name]["inputs"]) == ["obs"] + ["state"] * policy.recurrent \
            + ["mask"] * policy.masked
        state = policy.initial_state(7)
        for step in range(3):
            inputs = inputs_of(policy, 7, step)
            want, want_state = policy.act(inputs["obs"], True, state, inputs.get("mask"))
            if policy.recurrent:
                inputs["state"] = np.asarray(state, np.float32)
            got = run_file(out / manifest[name]["file"], inputs)
            action, state = (got[0], got[1]) if policy.recurrent else (got[0], None)
            assert action.dtype == want.dtype and action.shape == want.shape
            np.testing.assert_allclose(action, want, rtol=0, atol=1e-5)
            if policy.recurrent:
                np.testing.assert_allclose(state, want_state, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_gives_the_deterministic_actions(runs, tmp_path, kind):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")

    def run_file(path, inputs):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {name: inputs[name] for name in names})
    round_trip(runs.get(kind), tmp_path / "onnx", "onnx", run_file)


@pytest.mark.parametrize("kind", KINDS)
def test_torchscript_gives_the_deterministic_actions(runs, tmp_path, kind):
    def run_file(path, inputs):
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript in favour of export
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path))
        order = [name for name in ("obs", "state", "mask") if name in inputs]
        out = module(*(torch.from_numpy(inputs[name]) for name in order))
        return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
    round_trip(runs.get(kind), tmp_path / "ts", "torchscript", run_file)


def test_the_cli_writes_the_chosen_policies_quietly(runs, tmp_path, capsys):
    run_dir = runs.get("masked")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no library warning reaches the user
        assert network_export.main([str(run_dir), "--format", "torchscript", "--policy", "runner",
                            "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and printed.out.strip() == str(tmp_path / "out" / "runner.pt")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["policies.json",
                                                                    "runner.pt"]
    assert network_export.main([str(run_dir)]) == 0  # default: onnx into RUN_DIR/export
    assert (run_dir / "export" / "tagger.onnx").is_file()


def test_onnx_without_the_onnx_package_is_one_line(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    assert network_export.main([str(runs.get("ppo")), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: exporting ONNX needs the onnx package: "
                                       "pip install 'gpusim[export]'\n")
