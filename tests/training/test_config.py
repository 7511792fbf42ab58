"""Config loading: YAML, unknown keys, bad values, each a one-line error naming the key."""
import dataclasses

import pytest

from gpusim.config import from_dict, load_yaml
from gpusim.envs import builtin_names, env_class
from gpusim.envs.tag_continuous.config import TagContinuousConfig
from gpusim.errors import ConfigError
from gpusim.scale.scale_config import ScaleConfig
from gpusim.training.algorithms import ALGORITHMS
from gpusim.training.run_config import PolicyConfig, TrainerConfig, recipe_path


def test_env_defaults_are_the_dataclass_defaults():
    assert TagContinuousConfig.load() == TagContinuousConfig()


def test_help_lists_every_config_key_with_its_default_and_description(capsys):
    from gpusim.config import field_help
    from gpusim.training.train_cli import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    classes = [TrainerConfig, PolicyConfig, ScaleConfig] + \
        [cls.Config for cls in ALGORITHMS.values()] + \
        [env_class(name).config_class for name in builtin_names()]
    for cls in classes:
        defaults = dataclasses.asdict(cls())
        for key, description in field_help(cls).items():
            assert description, f"{cls.__name__}.{key} has no description comment"
            assert f"    {key} = {defaults[key]!r}  ({description})" in text
    for name in builtin_names():
        assert name in text


@pytest.mark.parametrize("name", builtin_names())
def test_recipes_hold_only_what_differs_from_the_defaults(name):
    """Defaults are written once: a recipe key equal to its dataclass default is a copy."""
    cls = env_class(name)
    assert cls.name == name  # the folder name is the env's name
    recipes = [recipe_path(cls)] + [recipe_path(cls, a) for a in ALGORITHMS
                                    if recipe_path(cls, a) != recipe_path(cls)]
    for recipe in recipes:  # config.yaml, and the recipe of each algorithm that has one
        data = load_yaml(recipe)
        algorithm = ALGORITHMS[(data.get("trainer") or {}).get("algorithm", "ppo")]
        defaults = {"env": dataclasses.asdict(cls.config_class()),
                    "trainer": {**dataclasses.asdict(TrainerConfig()),
                                **dataclasses.asdict(algorithm.Config())},
                    "policy": dataclasses.asdict(PolicyConfig()),
                    "scale": dataclasses.asdict(ScaleConfig())}
        for section, values in data.items():
            fields = defaults[section]
            for key, value in values.items():
                default = fields[key]
                same = list(default) == list(value) if isinstance(default, tuple) \
                    else default == value
                assert not same, f"{name}/{recipe.name} repeats the default {section}.{key}"


@pytest.mark.parametrize("data, message", [
    ({"bogus": 1}, "unknown config key 'env.bogus'"),
    ({"num_taggers": 1.5}, "'env.num_taggers' must be an integer"),
    ({"num_taggers": True}, "'env.num_taggers' must be an integer"),
    ({"grid_length": "big"}, "'env.grid_length' must be a number"),
    ({"use_full_observation": 1}, "'env.use_full_observation' must be true or false"),
    ({"tagger_ids": 3}, "'env.tagger_ids' must be a list"),
    ({"num_runners": 0}, "'num_runners' must be at least 1"),
    ({"grid_length": -1.0}, "'grid_length' must be positive"),
    ({"min_turn": 3.0}, "'min_turn' must not exceed max_turn"),
    ({"edge_hit_penalty": 0.5}, "'edge_hit_penalty' must be <= 0"),
    ({"tagger_ids": [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]}, "'tagger_ids' must not repeat"),
    ({"tagger_ids": [0]}, "'tagger_ids' must list exactly num_taggers=10"),
    ({"num_taggers": 1, "num_runners": 1, "tagger_ids": [2]}, "ids must lie in 0..1"),
])
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(TagContinuousConfig, data, section="env")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_yaml(tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_yaml(listy)


def test_load_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  num_taggers: 3\n  tagger_ids: [5, 1, 2]\n")
    config = TagContinuousConfig.load(path, num_runners=7)
    assert (config.num_taggers, config.num_runners) == (3, 7)
    assert config.tagger_id_list == (1, 2, 5)
