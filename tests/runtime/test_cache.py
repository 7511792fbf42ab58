"""The compile cache is private: created 0700, and a directory others can write is refused."""
import os
import stat

import pytest

from gpusim import cache
from gpusim.errors import GpusimError


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_a_fresh_cache_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "new" / "cache"))
    entry = cache.entry_dir("cpu", "some source")
    root = tmp_path / "new" / "cache"
    for path in (root, root / "cpu", entry):
        assert mode(path) == 0o700, path


@pytest.mark.parametrize("bits", [0o777, 0o775, 0o757])
def test_a_cache_others_can_write_is_refused(tmp_path, monkeypatch, bits):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(bits)
    monkeypatch.setenv(cache.ENV_VAR, str(shared))
    with pytest.raises(GpusimError, match="writable by other users .*chmod go-w") as err:
        cache.entry_dir("cpu", "x")
    assert "\n" not in str(err.value)


def test_a_subdirectory_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    cache.entry_dir("cpu", "x")
    (tmp_path / "cache" / "cpu").chmod(0o777)  # someone opened up a directory gpusim made
    with pytest.raises(GpusimError, match="writable by other users"):
        cache.entry_dir("cpu", "y")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a directory to another user needs root")
def test_a_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 12345, 12345)
    monkeypatch.setenv(cache.ENV_VAR, str(foreign))
    with pytest.raises(GpusimError, match="belongs to another user"):
        cache.cache_root()
