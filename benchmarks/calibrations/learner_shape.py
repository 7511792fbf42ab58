"""How deep and how wide one solo PPO iteration is, traced from outside with sys.setprofile.

    python -m benchmarks.calibrations.learner_shape                           # this checkout
    cd OTHER && PYTHONPATH=THIS python -m benchmarks.calibrations.learner_shape   # another gpusim

(OTHER: a folder from which `import gpusim` imports another gpusim; THIS: this checkout,
where the script is. A module run puts the working folder first on the import path.)

A tiny solo cartpole PPO run (cpu backend, 8 replicas x 32 steps, compile and CUDA
graphs off, as they resolve on the CPU) is built and trained for one iteration; the
second, amid the run (no checkpoint due), runs under `sys.setprofile`, Python frames
only. It prints:

- the depth: at the first gradient computation (`Tensor.backward`,
  `torch.autograd.backward` or `torch.autograd.grad`), the gpusim frames on the stack
  from the loop's `Trainer.train` (counted as 1) down to the caller of that function;
- the breadth: the distinct gpusim functions called in that whole iteration (rollout,
  update, bookkeeping: `Trainer._train_one`), and the files they are in; counted both
  with and without the code objects of lambdas, comprehensions and generator
  expressions (Python 3.12 inlines comprehensions: they are no functions there);
- whether any of them lies under training/league/ or training/population/.

A gpusim frame is one whose file lies inside the imported gpusim package.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main():
    import torch

    import gpusim
    import gpusim.envs
    import gpusim.training
    from gpusim.envs import env_class
    from gpusim.training.run_config import load_run_config
    from gpusim.training.loop import Trainer
    # the package's folders (installed, envs/ and training/ may lie elsewhere)
    roots = {name: Path(module.__file__).resolve().parent for name, module in (
        ("gpusim", gpusim), ("envs", gpusim.envs), ("training", gpusim.training))}

    def ours(filename: str) -> str | None:
        """The file's path as `folder/...`, where it is gpusim's."""
        path = Path(filename).resolve()
        for name, root in roots.items():
            if path.is_relative_to(root):
                return f"{name}/{path.relative_to(root)}"
        return None

    cls = env_class("cartpole")
    config = load_run_config("cartpole", cls, sets=[
        "trainer.backend=cpu", "trainer.num_envs=8", "trainer.rollout_len=32",
        "trainer.total_steps=100000", "trainer.torch_threads=1", "trainer.compile=off",
        "trainer.cuda_graphs=off"])
    trainer = Trainer(config, cls)
    one, traced = trainer._train_one, []

    def only_one(stop_requested):  # an iteration amid the run (no final checkpoint), then out
        if traced:
            sys.setprofile(profile)
        try:
            stopping = one(stop_requested)
        finally:
            sys.setprofile(None)
        trainer.num_iterations = trainer.iteration
        return stopping
    trainer._train_one = only_one

    functions, depth = set(), None
    gradient_calls = {("_tensor.py", "backward"), ("__init__.py", "backward"),
                      ("__init__.py", "grad")}

    def profile(frame, event, arg):
        nonlocal depth
        if event != "call":
            return
        code = frame.f_code
        name = ours(code.co_filename)
        if name is not None:
            functions.add((name, code.co_qualname if hasattr(code, "co_qualname")
                           else code.co_name))
            return
        where = (Path(code.co_filename).name, code.co_name)
        if depth is None and where in gradient_calls and "torch" in code.co_filename:
            stack, f = [], frame.f_back
            while f is not None:
                if ours(f.f_code.co_filename) is not None:
                    stack.append(f"{ours(f.f_code.co_filename)}:{f.f_code.co_name}")
                if f.f_code.co_name == "train" and f.f_code.co_filename.endswith("loop.py"):
                    break
                f = f.f_back
            depth = list(reversed(stack))

    trainer.train()  # the first iteration: whatever is made once
    traced.append(True)
    trainer.num_iterations = 10**6
    trainer.train()  # the second, traced
    files = sorted({f for f, _ in functions})
    print(f"gpusim {gpusim.__version__}")
    print(f"depth from Trainer.train to the gradient call: {len(depth or [])} gpusim frames")
    for line in depth or []:
        print(f"  {line}")
    named = {(f, n) for f, n in functions if not n.split(".")[-1].startswith("<")}
    print(f"one iteration: {len(functions)} distinct gpusim functions in {len(files)} files "
          f"({len(named)} of them named: no lambda, comprehension or generator expression)")
    for f in files:
        print(f"  {f}: {', '.join(sorted(n for g, n in functions if g == f))}")
    league = [f for f in files if "/league/" in f or "/population/" in f]
    print(f"under league/ or population/: {', '.join(league) or 'none'}")
    del torch


if __name__ == "__main__":
    main()
