"""Environment definitions, installed as `gpusim.envs`.

Each env is a package with its config dataclass and `config.yaml`, its
portable kernel phases (`env.py`) and an independent NumPy reference
(`reference.py`) used by the tests.
"""
