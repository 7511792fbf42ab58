"""Every shipped recipe (each `*.yaml` beside each env but its E(k) table) runs a whole number of iterations, so
none prints the CLI's "total_steps ... is not a whole number of iterations" line."""
import inspect
from pathlib import Path

import pytest

from gpusim.envs import builtin_names, env_class
from gpusim.training import env_steps
from gpusim.training.run_config import load_run_config


def shipped_recipes():
    for name in builtin_names():  # every folder in envs/, whatever has been added
        folder = Path(inspect.getfile(env_class(name))).parent
        for path in sorted(p for p in folder.glob("*.yaml") if p.name != env_steps.FILE):
            yield pytest.param(name, path, id=f"{name}/{path.name}")


RECIPES = list(shipped_recipes())


def test_every_env_ships_a_recipe():
    assert {param.values[0] for param in RECIPES} == set(builtin_names())


@pytest.mark.parametrize("name, path", RECIPES)
def test_recipe_total_steps_is_a_whole_number_of_iterations(name, path):
    t = load_run_config(name, env_class(name), path=path).trainer
    planned = t.num_iterations() * t.steps_per_iteration  # what the CLI compares
    assert planned == t.total_steps, (
        f"{path.name} of {name}: total_steps {t.total_steps} is not a multiple of "
        f"num_envs x rollout_len = {t.steps_per_iteration}; nearest below: {planned}")
