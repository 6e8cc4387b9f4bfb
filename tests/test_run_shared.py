"""tests/support/run_shared.py: what one test run's processes make once and share."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import run_shared

REPO = Path(__file__).resolve().parents[1]

# One process of a run: asks for "thing"; the first makes it slowly, the others must wait
# and find it made. Prints whether it was first and what it found.
_WORKER = textwrap.dedent(
    """
    import sys, time
    from tests.support import run_shared
    with run_shared.made_once("thing") as (path, first):
        if first:
            time.sleep(0.5)
            (path / "made").write_text(sys.argv[1])
        print(first, (path / "made").read_text())
    """
)


def test_the_first_process_makes_it_and_the_others_wait_and_find_it(tmp_path: Path) -> None:
    env = {**os.environ, run_shared.ENV: str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(i)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    said = [p.communicate(timeout=60)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    firsts = [i for i, (first, _) in enumerate(said) if first == "True"]
    assert len(firsts) == 1  # made once, by one of them
    assert {made for _, made in said} == {str(firsts[0])}  # the others read what it made
    assert oct((tmp_path / "thing").stat().st_mode & 0o777) == "0o755"  # SSH users read it


def test_the_process_that_made_the_folder_removes_it_and_no_other_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Config:
        def __init__(self) -> None:
            self.stash = pytest.Stash()

    monkeypatch.delenv(run_shared.ENV)
    controller, worker = Config(), Config()
    run_shared.start(controller)  # type: ignore[arg-type]
    made = run_shared.folder()
    assert made.parent == Path("/var/tmp") and made.is_dir()
    run_shared.start(worker)  # type: ignore[arg-type]  # inherits the name: makes nothing
    assert run_shared.folder() == made
    run_shared.finish(worker)  # type: ignore[arg-type]
    assert made.is_dir()
    run_shared.finish(controller)  # type: ignore[arg-type]
    assert not made.exists() and run_shared.ENV not in os.environ


def test_this_run_has_its_folder_named_by_the_process_that_started_it() -> None:
    assert run_shared.folder().is_dir()  # made in pytest_configure, before any worker
