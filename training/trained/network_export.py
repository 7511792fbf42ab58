"""Export a run's acting networks: `python -m gpusim.export RUN_DIR --format onnx --out DIR`.

Each policy's `ActingNetwork` (training.trained.policies) is written to DIR as
`<policy>.onnx` (ONNX, for onnxruntime and other runtimes) or `<policy>.pt`
(TorchScript, for `torch.jit.load`), with DIR/policies.json describing every
file's inputs and outputs. The network takes `obs` (float32, (batch,
obs_dim)), and `state` (float32, (batch, state_size)) where the policy is
recurrent and `mask` (bool, (batch, sum of the choices)) where the env masks
choices; it gives `action`, the deterministic action in the env's own space
(int64 choice indices per component, or float32 values in the Box), and
`next_state` where the policy is recurrent. The batch size is free.

ONNX goes through torch's TorchScript-based exporter (`dynamo=False`), which
needs the onnx package but not onnxscript; running the file needs onnxruntime
(both: `pip install 'gpusim[export]'`).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import sys
import warnings
from pathlib import Path

import torch

from gpusim.arguments import ArgumentParser
from gpusim.errors import GpusimError, describe, writing

from .policies import load_policies

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
OPSET = 17  # onnxruntime 1.14 and later run it


def signature(policy) -> dict:
    """The exported network's inputs and outputs: name -> [dtype, shape]."""
    spec = policy.spec
    inputs = {"obs": ["float32", ["batch", spec.obs_dim]]}
    outputs = {"action": ["float32", ["batch", spec.action_width]] if spec.continuous
               else ["int64", ["batch", spec.action_width]]}
    if policy.recurrent:
        inputs["state"] = outputs["next_state"] = ["float32", ["batch", policy.state_size]]
    if policy.masked:
        inputs["mask"] = ["bool", ["batch", sum(spec.actions)]]
    return {"inputs": inputs, "outputs": outputs}


def example_inputs(policy, batch: int = 2) -> tuple:
    """Inputs to trace the network with (its graph is the same for every batch size)."""
    inputs = [torch.zeros((batch, policy.spec.obs_dim), device=policy.device)]
    if policy.recurrent:
        inputs.append(torch.zeros((batch, policy.state_size), device=policy.device))
    if policy.masked:
        inputs.append(torch.ones((batch, sum(policy.spec.actions)), dtype=torch.bool,
                                 device=policy.device))
    return tuple(inputs)


@contextlib.contextmanager
def quiet():
    """torch's exporters warn (deprecations, tracer notes) and log on a normal export; none
    of it is the user's to act on."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def to_torchscript(policy, path: Path):
    with quiet(), torch.no_grad():
        traced = torch.jit.trace(policy.network, example_inputs(policy), check_trace=False)
    with writing(path):
        traced.save(str(path))


def to_onnx(policy, path: Path):
    try:
        import onnx  # noqa: F401  (the exporter's own import would fail inside it)
    except ImportError:
        raise GpusimError("exporting ONNX needs the onnx package: pip install 'gpusim[export]'") \
            from None
    names = signature(policy)
    inputs, outputs = list(names["inputs"]), list(names["outputs"])
    options = dict(input_names=inputs, output_names=outputs, opset_version=OPSET,
                   dynamic_axes={name: {0: "batch"} for name in inputs + outputs})
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False  # the TorchScript-based exporter: no onnxscript needed
    with quiet(), torch.no_grad(), writing(path):
        torch.onnx.export(policy.network, example_inputs(policy), str(path), **options)


WRITERS = {"onnx": to_onnx, "torchscript": to_torchscript}


def export(run_dir, fmt: str, out=None, names=None, member=None) -> list:
    """Write the acting network of each policy of the run (or of those `names`; of a
    population's member `member`, default its best) to `out` (default RUN_DIR/export) in
    format `fmt`; returns the paths written."""
    if fmt not in FORMATS:
        raise GpusimError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "export"
    if out.exists() and not out.is_dir():
        raise GpusimError(f"--out {out} is a file: name a folder")
    policies = load_policies(run_dir, member=member)
    chosen = [policies[name] for name in (names or policies)]  # an unknown name: one line
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    written, manifest = [], {}
    for policy in chosen:
        path = out / f"{policy.name}{FORMATS[fmt]}"
        try:
            WRITERS[fmt](policy, path)
        except GpusimError:
            raise
        except Exception as exc:  # an exporter's own failure: one line, not its traceback
            raise GpusimError(f"exporting policy {policy.name!r} as {fmt} failed: "
                              f"{describe(exc)[:200]}") from None
        written.append(path)
        manifest[policy.name] = {"file": path.name, "agents": list(policy.agent_names),
                                 **signature(policy)}
    with writing(out / "policies.json"):
        (out / "policies.json").write_text(json.dumps(
            {"run": str(run_dir), "format": fmt, "policies": manifest}, indent=1) + "\n")
    return written


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m gpusim.export", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run directory written by python -m gpusim.train")
    parser.add_argument("--format", choices=tuple(FORMATS), default="onnx")
    parser.add_argument("--out", help="the folder to write into (default: RUN_DIR/export)")
    parser.add_argument("--policy", action="append", dest="names", metavar="NAME",
                        help="export this policy only (repeat for several; default: all)")
    parser.add_argument("--member", help="a population run: the member to export (m3; "
                                         "default: the best by its last logged return)")
    args = parser.parse_args(argv)
    try:
        paths = export(args.run_dir, args.format, args.out, args.names, args.member)
    except GpusimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for path in paths:
        print(path)
    return 0
