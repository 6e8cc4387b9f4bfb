"""invoke's own parse errors end a fab run with one line and exit 2 (docs/exit-status.md).

The walk covers whatever ``bootstrap.ns`` holds: every flag that takes a value is given
none, every task is given a flag it does not have, and a task that does not exist is asked
for; each must say so in one line, exit 2, and start nothing.
"""

from __future__ import annotations

import subprocess
import sys

import fabric.main
import pytest

from bootstrap import ns
from bootstrap.fleet.usage import exit_2_on_parse_errors
from tests.bootstrap.conftest import REPO


def value_flags() -> list[tuple[str, str]]:
    """(task, --flag) for every task flag that needs a value (bool flags take none)."""
    out = []
    for name in sorted(ns.tasks):
        for arg in ns.tasks[name].get_arguments():
            if arg.kind is not bool and not arg.optional:
                out.append((name, f"--{max(arg.names, key=len)}"))
    return out


def without_positionals() -> list[str]:
    """Tasks whose every argument is a flag: on a task with a positional argument invoke
    takes an unknown --flag as that argument's value (fab cancel --x is job '--x'), which
    is no parse error."""
    return [
        name
        for name in sorted(ns.tasks)
        if not any(arg.positional for arg in ns.tasks[name].get_arguments())
    ]


VALUE_FLAGS = value_flags()
CASES = (
    [[task, flag] for task, flag in VALUE_FLAGS]
    + [[task, "--no-such-flag"] for task in without_positionals()]
    + [["no-such-task"], ["--help", "no-such-task"], ["--no-such-flag", "status"]]
)


def test_the_walk_finds_flags_that_need_a_value_on_the_tasks_that_connect() -> None:
    tasks = {task for task, _ in VALUE_FLAGS}
    assert {"train", "status", "logs", "cancel", "keep-alive"} <= tasks
    assert len(VALUE_FLAGS) >= 40


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(a) for a in CASES])
def test_a_parse_error_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exc:
        fabric.main.program.run(["fab", *argv])
    out, err = capsys.readouterr()
    assert exc.value.code == 2, err
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("gpufleet: ") and "fab --help TASK" in line
    assert "Traceback" not in err


def test_wrapping_twice_changes_nothing() -> None:
    program = fabric.main.program
    exit_2_on_parse_errors(program)
    first = program.parse_tasks
    exit_2_on_parse_errors(program)
    assert program.parse_tasks is first


def test_fab_itself_exits_2_on_a_flag_without_its_value() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "status", "--connect-timeout"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "gpufleet: Flag --connect-timeout needed value and was not given one! "
        "(fab --list names the tasks, fab --help TASK its flags)"
    ]
