"""A folder shared by every pytest process of one test run, for what is costly to make
and the same for every test that uses it (a node venv with torch in it: ~40-60 s of CPU).

`make test` runs the suite in pytest-xdist workers, and a session fixture is made once per
worker, so such a thing was made once per worker. The process that configures pytest
first (the xdist controller, or the only process) makes the folder and names it in the
environment, which the workers it starts inherit; it alone removes the folder when the
session ends, after its workers have. :func:`made_once` lets the first process to need a
thing make it while the others wait for it.

The folder is under /var/tmp, not pytest's own temporary folders, because those are
private to root and the SSH test users read what is made here.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ENV = "GPUFLEET_TEST_RUN_DIR"
_OWNED = pytest.StashKey[Path]()


def start(config: pytest.Config) -> None:
    """Make the run's folder unless a process above this one already did."""
    if os.environ.get(ENV):
        return
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-run-", dir="/var/tmp"))
    folder.chmod(0o755)
    os.environ[ENV] = str(folder)
    config.stash[_OWNED] = folder


def finish(config: pytest.Config) -> None:
    """Remove the run's folder, in the process that made it (the others leave it)."""
    folder = config.stash.get(_OWNED, None)
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    if os.environ.get(ENV) == str(folder):
        del os.environ[ENV]


def folder() -> Path:
    value = os.environ.get(ENV)
    if not value or not Path(value).is_dir():
        raise RuntimeError(f"{ENV} names no folder: tests/conftest.py's pytest_configure makes it")
    return Path(value)


@contextmanager
def made_once(name: str) -> Iterator[tuple[Path, bool]]:
    """(the folder ``name`` in the run's folder, whether this process is the first to ask
    for it), held under a lock: the first makes what goes in it inside the ``with`` block,
    the others wait until it has, then find it made. A first that fails leaves what it
    wrote (a recorded failure), so the others do not try again."""
    base = folder()
    with open(base / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            path = base / name
            first = not path.exists()
            if first:
                path.mkdir()
                path.chmod(0o755)
            yield path, first
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
