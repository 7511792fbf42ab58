"""How deep and how wide one solo PPO iteration is, traced from outside with sys.setprofile.

    python benchmarks/learner_shape.py                   # this checkout
    PYTHONPATH=OTHER python benchmarks/learner_shape.py  # another gpusim, importable

A tiny solo cartpole PPO run (cpu backend, 8 replicas x 32 steps, compile and CUDA
graphs off, as they resolve on the CPU) is built and trained for one iteration; the
second iteration runs under `sys.setprofile`, Python frames only. It prints:

- the depth: at the first gradient computation (`Tensor.backward`,
  `torch.autograd.backward` or `torch.autograd.grad`), the gpusim frames on the stack
  from the loop's `Trainer.train` (counted as 1) down to the caller of that function;
- the breadth: the distinct gpusim functions called in that whole iteration (rollout,
  update, bookkeeping), and the files they are in;
- whether any of them lies under training/league/ or training/population/.

A gpusim frame is one whose file lies inside the imported gpusim package.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main():
    import torch

    import gpusim
    from gpusim.envs import env_class
    from gpusim.training.config import load_run_config
    from gpusim.training.loop import Trainer
    root = Path(gpusim.__file__).resolve().parent
    roots = [root, *(p.resolve() for p in (root / "envs", root / "training") if p.exists())]

    def ours(filename: str) -> str | None:
        """The file's path from the package's parent folder, where it is gpusim's."""
        path = Path(filename).resolve()
        for r in roots:
            if path.is_relative_to(r):
                return str(path.relative_to(r.parent))
        return None

    cls = env_class("cartpole")
    config = load_run_config("cartpole", cls, sets=[
        "trainer.backend=cpu", "trainer.num_envs=8", "trainer.rollout_len=32",
        "trainer.total_steps=100000", "trainer.torch_threads=1", "trainer.compile=off",
        "trainer.cuda_graphs=off"])
    trainer = Trainer(config, cls)
    trainer.num_iterations = trainer.iteration + 1
    trainer.train()  # the first iteration: whatever is made once
    trainer.num_iterations += 1

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

    sys.setprofile(profile)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
    files = sorted({f for f, _ in functions})
    print(f"gpusim {gpusim.__version__} at {root.parent}")
    print(f"depth from Trainer.train to the gradient call: {len(depth or [])} gpusim frames")
    for line in depth or []:
        print(f"  {line}")
    named = {(f, n) for f, n in functions if not n.split(".")[-1].startswith("<")}
    print(f"one iteration: {len(functions)} distinct gpusim functions in {len(files)} files "
          f"({len(named)} of them named: no lambda, comprehension or generator expression)")
    for f in files:
        print(f"  {f}: {sum(1 for g, _ in functions if g == f)}")
    league = [f for f in files if "/league/" in f or "/population/" in f]
    print(f"under league/ or population/: {', '.join(league) or 'none'}")
    del torch


if __name__ == "__main__":
    main()
