"""The cache of what train-check learnt (bootstrap/train/check_cache.py): where it lives,
what names an entry, and that a bad or foreign file only costs a torch import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.train import check_cache
from bootstrap.train.check_cache import Known


def test_the_cache_lives_where_the_environment_says_else_under_the_users_cache() -> None:
    assert check_cache.cache_file({"GPUFLEET_CACHE_DIR": "/c"}) == Path("/c/train-check.json")
    assert check_cache.cache_file({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path(
        "/x/gpufleet/train-check.json"
    )
    assert check_cache.cache_file({"HOME": "/h"}) == Path("/h/.cache/gpufleet/train-check.json")


def test_an_entry_is_one_node_by_its_host_key_and_address_and_one_venv() -> None:
    a = check_cache.entry_key("ssh-ed25519 SHA256:aaa", "10.0.0.5", 22, "/opt/v/bin/python")
    others = {
        check_cache.entry_key("ssh-ed25519 SHA256:bbb", "10.0.0.5", 22, "/opt/v/bin/python"),
        check_cache.entry_key("ssh-ed25519 SHA256:aaa", "10.0.0.6", 22, "/opt/v/bin/python"),
        check_cache.entry_key("ssh-ed25519 SHA256:aaa", "10.0.0.5", 22, "/opt/w/bin/python"),
    }
    assert a not in others and len(others) == 3


def test_what_is_remembered_is_found_again_and_the_newest_wins(tmp_path: Path) -> None:
    path = tmp_path / "c" / "train-check.json"
    assert check_cache.lookup("k", path) is None
    check_cache.remember({"k": Known("1.2.3.4 5.6.7.8", "2.13.0")}, path)
    assert check_cache.lookup("k", path) == Known("1.2.3.4 5.6.7.8", "2.13.0")
    check_cache.remember({"k": Known("9.9.9.9", "2.14.0")}, path)
    assert check_cache.lookup("k", path) == Known("9.9.9.9", "2.14.0")


def test_the_file_stays_bounded_dropping_the_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train-check.json"
    monkeypatch.setattr(check_cache, "MAX_ENTRIES", 3)
    for i in range(5):
        check_cache.remember({f"k{i}": Known(f"v{i}", "2.13.0")}, path)
    assert list(json.loads(path.read_text())["entries"]) == ["k2", "k3", "k4"]


def test_a_damaged_or_foreign_file_is_an_empty_cache(tmp_path: Path) -> None:
    path = tmp_path / "train-check.json"
    for text in ("{not json", "[]", json.dumps({"schema": "other/1", "entries": {"k": {}}})):
        path.write_text(text)
        assert check_cache.lookup("k", path) is None
    path.write_text(json.dumps({"schema": check_cache.SCHEMA, "entries": {"k": {"torch": ""}}}))
    assert check_cache.lookup("k", path) is None
    check_cache.remember({"k": Known("v", "2.13.0")}, path)  # written over, whole
    assert check_cache.lookup("k", path) == Known("v", "2.13.0")


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would go")
    check_cache.remember({"k": Known("v", "2.13.0")}, blocked / "train-check.json")
