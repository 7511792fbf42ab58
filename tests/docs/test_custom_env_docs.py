"""The env reference pages say what gpusim does, in the parts their runnable blocks cannot
show:

- the parameter list of a CUDA C kernel (section (c)): gpusim's arrays in the listed
  order, those of the features an env lacks left out, then the env's own, then
  `agent_active`; the generated header declares exactly that;
- the one-line messages it quotes from tests/planted_env.py are what check_env prints.
"""
import re
from pathlib import Path

import pytest

from bad_envs import Good
from gpusim.backends.cuda_c import args_header, header_params
from gpusim.check import check_env
from mixed_team_env import MixedTeam
from planted_env import NARROW_OBS, ZERO_BY_ZERO, chase, pursuit

DOCS = Path(__file__).resolve().parents[2] / "docs"


def guide() -> str:
    """The reference pages, one text."""
    return "\n".join((DOCS / name).read_text() for name in ("env_phases.md", "env_numba.md",
                                                             "env_cuda_c.md"))


def listed_parameters() -> tuple:
    """The three items of the list after "Its parameters are every array of the env": the
    names in backticks of each, in order."""
    text = guide()
    start = text.index("Its parameters are every array of the env")
    items = re.findall(r"^\d\. (.*?)(?=^\d\. |^then every scalar)", text[start:],
                       re.S | re.M)[:3]
    return tuple(re.findall(r"`(\w+)(?:\(\))?`", item) for item in items)


class WithState(MixedTeam):
    """Every feature that adds an array: discrete and continuous actions, per-agent done,
    a global state."""

    def setup(self, config):
        super().setup(config)
        self.state_dim = 4


@pytest.mark.parametrize("cls", [Good, MixedTeam, WithState])
def test_the_kernel_parameters_are_listed_in_order(cls):
    gpusims, own, alias = listed_parameters()
    assert own == ["array_specs"] and alias == ["agent_active", "agent_active_array"]
    env = cls(num_envs=1, backend="cpu")
    fields = list(env.arrays.views._fields)
    mine = list(env.array_specs())
    expected = [name for name in gpusims if name in fields] + mine
    expected += ["agent_active"] if env.agent_active_array else []
    assert fields == expected
    params = header_params(env.arrays.views, env._params)
    assert [p.name for p in params] == fields + list(env._params._fields)
    header = args_header(env.arrays.views, env._params)
    assert all(f" {name};" in header for name in fields)


def test_the_feature_list_names_every_array_gpusim_adds():
    gpusims, _, _ = listed_parameters()
    added = set()
    for cls in (Good, MixedTeam, WithState):
        env = cls(num_envs=1, backend="cpu")
        added |= set(env.arrays.views._fields) - set(env.array_specs()) - {"agent_active"}
    assert added <= set(gpusims)
    assert {"state", "final_state", "continuous_actions", "final_active"} <= added


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("bug, policy, check", [
    (NARROW_OBS, None, "reset"),
    (ZERO_BY_ZERO, chase, "finite"),
])
def test_the_quoted_messages_are_check_envs(bug, policy, check):
    message = check_env(pursuit(bug), policy=policy, skip=("determinism",),
                        verbose=False)[check].message
    assert message in flat(guide())


def test_the_walkthrough_shows_every_check():
    """Its first check_env output names each check once, in order."""
    from gpusim.check import CHECKS
    text = guide()
    start = text.index("```text\nPASS attributes")
    block = text[start:text.index("```\n", start + 8)]
    assert [line.split()[1].rstrip(":") for line in block.splitlines()[1:]] == list(CHECKS)
