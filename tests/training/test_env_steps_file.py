"""A recipe's E(k) table (`env_steps.yaml`) is checked whole as it is read: a malformed one is
one error line naming the file and the key, never a traceback from inside the search."""
import pytest
import yaml

from gpusim.errors import ConfigError
from gpusim.training.env_steps import tables

ROW = {"k": 1, "median": 1000, "low": 800, "high": 1200, "reached": 3, "seeds": 3}


def written(tmp_path, data) -> str:
    path = tmp_path / "env_steps.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_shipped_tables_are_well_formed():
    from pathlib import Path
    files = sorted((Path(__file__).parents[2] / "envs").glob("*/env_steps.yaml"))
    assert files and all(tables(str(f)) for f in files)


@pytest.mark.parametrize("data, where", [
    ({"tables": []}, "'tables' must be a non-empty list"),
    ({"table": [{"rows": [ROW]}]}, "'tables' must be a non-empty list"),
    ({"tables": ["cartpole"]}, "tables[0] must be a mapping"),
    ({"tables": [{"rows": [ROW], "seeds": 3}]}, "tables[0]: unknown key 'seeds'"),
    ({"tables": [{"settings": {"lr": 1}, "rows": [ROW]}]}, "tables[0].settings must map dotted"),
    ({"tables": [{"rows": []}]}, "tables[0].rows must be a non-empty list"),
    ({"tables": [{"rows": [{**ROW, "k": "x"}]}]}, "tables[0].rows[0].k must be a positive number"),
    ({"tables": [{"rows": [ROW, {**ROW, "median": -5}]}]},
     "tables[0].rows[1].median must be a positive number"),
    ({"tables": [{"rows": [{**ROW, "seeds": 0}]}]}, "tables[0].rows[0].seeds must be a whole"),
    ({"tables": [{"rows": [{**ROW, "reached": 4}]}]}, "reached (4) exceeds seeds (3)"),
    ({"tables": [{"rows": [{**ROW, "meadian": 3}]}]}, "rows[0]: unknown key 'meadian'"),
])
def test_a_malformed_table_is_one_line_naming_the_file_and_key(tmp_path, data, where):
    path = written(tmp_path, data)
    with pytest.raises(ConfigError) as raised:
        tables(path)
    message = str(raised.value)
    assert message.startswith(path) and where in message and "\n" not in message, message


def test_a_settings_key_the_config_refuses_names_the_table(tmp_path, monkeypatch):
    """Through the search's own reader: a table's unknown setting is its file's line."""
    from gpusim.envs import env_class
    from gpusim.training import env_steps
    from gpusim.training.run_config import load_run_config
    path = written(tmp_path, {"tables": [{"settings": {"trainer.lrr": 1}, "rows": [ROW]}]})
    cls = env_class("cartpole")
    monkeypatch.setattr(env_steps.inspect, "getfile", lambda _: str(tmp_path / "env.py"))
    env_steps._entries.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"env_steps.yaml: tables\[0\].settings: "
                                              r"unknown config key 'trainer.lrr'"):
            env_steps.table_for(load_run_config("cartpole", cls))
    finally:
        env_steps._entries.cache_clear()
