"""The Makefile's targets say what they do, and a filter that selects no test is not a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()
DOCUMENTED = dict(re.findall(r"^([a-zA-Z_-]+):.*?## (.+)$", MAKEFILE, re.M))


def make(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.fail("no make on PATH (Debian package: make)")
    # -o: never rebuild .venv nor fetch the function wheels (PyPI) from a test; PY: the
    # interpreter running these tests
    return subprocess.run(
        [
            "make",
            "-s",
            "-o",
            ".venv/.installed",
            "-o",
            "build/wheels/.complete",
            f"PY={sys.executable}",
            *args,
        ],
        cwd=ROOT,
        # the Makefile's own defaults, not those of the shell that runs the tests
        env={k: v for k, v in os.environ.items() if k not in ("PYTEST_WORKERS", "MYPY_WORKERS")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_help_lists_every_documented_target_with_its_comment_in_80_columns() -> None:
    done = make("help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(DOCUMENTED) >= 10
    for target, comment in DOCUMENTED.items():
        assert any(f"make {target} " in ln and ln.endswith(comment.strip()) for ln in lines), target
    assert all(len(ln) <= 80 for ln in lines)


def test_every_phony_target_but_the_setup_file_has_a_comment() -> None:
    phony = re.search(r"^\.PHONY: (.+)$", MAKEFILE, re.M)
    assert phony is not None
    assert set(phony.group(1).split()) == set(DOCUMENTED)


def test_a_test_filter_that_selects_nothing_is_said_and_is_not_a_failure() -> None:
    # PYTEST_WORKERS=0: the exit status is pytest's either way, and two xdist workers, each
    # importing the suite's conftest, took 22 s of this test on 3 busy workers
    done = make(
        "test-fast",
        "PYTEST_WORKERS=0",
        "PYTEST_ARGS=-p no:cacheprovider tests/test_makefile.py -k nothing_xyz",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no test selected (exit 5)" in done.stdout


def test_a_pytest_usage_error_still_fails_make() -> None:
    done = make(
        "test-fast",
        "PYTEST_WORKERS=0",
        "PYTEST_ARGS=-p no:cacheprovider tests/test_makefile.py --co -q -x -k",
    )
    assert done.returncode not in (0, 5)


def test_setup_fetches_the_function_wheels_and_fc_wheels_never_rebuilds_the_venv() -> None:
    # the one cloud that builds its function from wheels pins them in its own folder
    lock = "infra/clouds/alicloud/function-requirements.txt"
    # setup: the venv held as built; fc-wheels: a newer requirements.txt must not reinstall
    for target, extra in (
        ("setup", ["-o", ".venv/.installed"]),
        ("fc-wheels", ["-W", "requirements.txt"]),
    ):
        cmd = ["make", "-s", "-n", "-W", lock, *extra]
        done = subprocess.run([*cmd, target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "scripts/fc_wheels.py --into build/wheels" in done.stdout, target
        assert "pip install" not in done.stdout, target


@pytest.mark.parametrize(
    ("workers", "argv"),
    [
        (None, ["-n", "3", "--dist", "loadfile"]),
        ("2", ["-n", "2", "--dist", "loadfile"]),
        ("0", []),
    ],
)
def test_make_test_runs_pytest_in_parallel_workers_unless_told_not_to(
    workers: str | None, argv: list[str]
) -> None:
    # make -n prints the commands without running them (system packages, setup: -o above)
    extra = [] if workers is None else [f"PYTEST_WORKERS={workers}"]
    done = make("-n", "-o", "system-packages", "test", *extra, "PYTEST_ARGS=-k x")
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if " -m pytest " in ln]
    assert line.split(" -m pytest ")[1].split(";")[0].split() == [*argv, "-k", "x"]
    if workers != "0":  # the plugin the flags need is pinned with the other test tools
        assert "pytest-xdist==" in (ROOT / "requirements-dev.txt").read_text()
