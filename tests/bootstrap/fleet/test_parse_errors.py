"""invoke's own parse errors end a fab run with one line and exit 2 (docs/exit-status.md).

The walk covers whatever ``bootstrap.ns`` holds: every flag that takes a value is given
none, every task is given a flag it does not have (on a task with a positional argument too:
``fab cancel --x`` is an unknown flag, not a job named ``--x``), and a task that does not
exist is asked for; each must say so in one line, exit 2, and start nothing.
"""

from __future__ import annotations

import subprocess
import sys

import fabric.main
import invoke.parser.parser as invoke_parser
import pytest
from invoke.exceptions import ParseError
from invoke.parser import ParseMachine, Parser, ParserContext

from bootstrap import ns
from bootstrap.fleet.parse_errors import _dash_aware_parsing, exit_2_on_parse_errors
from tests.bootstrap.conftest import REPO, fab_in_process


def value_flags() -> list[tuple[str, str]]:
    """(task, --flag) for every task flag that needs a value (bool flags take none)."""
    out = []
    for name in sorted(ns.tasks):
        for arg in ns.tasks[name].get_arguments():
            if arg.kind is not bool and not arg.optional:
                out.append((name, f"--{max(arg.names, key=len)}"))
    return out


def with_positionals() -> list[str]:
    """Tasks with a positional argument (``fab cancel JOB``): invoke alone would give it
    whatever token comes next, an unknown ``--x`` included."""
    return [
        name
        for name in sorted(ns.tasks)
        if any(arg.positional for arg in ns.tasks[name].get_arguments())
    ]


VALUE_FLAGS = value_flags()
POSITIONAL_TASKS = with_positionals()
CASES = (
    [[task, flag] for task, flag in VALUE_FLAGS]
    + [[task, "--no-such-flag"] for task in sorted(ns.tasks)]
    + [["no-such-task"], ["--help", "no-such-task"], ["--no-such-flag", "status"]]
)
# what an unknown flag looks like where a positional waits: long, short, with a value, bare
DASHED = ["--x", "-x", "--x=1", "-", "--no-such-flag"]


def test_the_walk_finds_flags_that_need_a_value_on_the_tasks_that_connect() -> None:
    tasks = {task for task, _ in VALUE_FLAGS}
    assert {"train", "status", "logs", "cancel", "keep-alive"} <= tasks
    assert len(VALUE_FLAGS) >= 40


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(a) for a in CASES])
def test_a_parse_error_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = fab_in_process(argv, capsys, monkeypatch)
    assert code == 2, err
    assert out == ""
    (line,) = err.splitlines()
    task = argv[0] if argv[0] in ns.tasks else None
    assert line.startswith("gpufleet: ") and "Traceback" not in err
    # where to look: the task's own help when the error is in a task, else the list
    if task:
        assert line.endswith(f"(fab --help {task} lists its flags)"), line
    else:
        assert line.endswith("(fab --list names the tasks, fab --help TASK its flags)"), line
    assert "<Argument" not in line  # a flag is named as it is typed


def test_the_walk_covers_every_task_with_a_positional_argument() -> None:
    assert {"cancel", "logs", "data-fetch", "data-pull", "data-push"} <= set(POSITIONAL_TASKS)


@pytest.mark.parametrize("task", POSITIONAL_TASKS)
@pytest.mark.parametrize("dashed", DASHED)
def test_a_dash_where_a_positional_waits_is_an_unknown_flag_not_its_value(
    task: str,
    dashed: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = fab_in_process([task, dashed], capsys, monkeypatch)
    assert code == 2 and out == "", err
    flag = dashed.partition("=")[0]
    assert err.splitlines() == [
        f"gpufleet: fab {task}: unknown flag {flag!r} (fab --help {task} lists its flags)"
    ]


def parse(*argv: str) -> ParserContext:
    """``argv`` parsed as fab parses a task's arguments here (nothing runs)."""
    initial = ParserContext(args=fabric.main.program.core_args())
    with _dash_aware_parsing():
        result = Parser(initial=initial, contexts=ns.to_contexts()).parse_argv(list(argv))
    _core, ctx = result
    return ctx


def test_a_positional_that_does_not_start_with_a_dash_is_still_its_value() -> None:
    ctx = parse("cancel", "run-261202-101500-ab12", "--wait", "5")
    assert ctx.args["job"].value == "run-261202-101500-ab12"
    assert ctx.args["wait"].value == 5
    assert parse("data-push", "./-odd-folder", "--to", "bucket").args["source"].value == (
        "./-odd-folder"
    )
    # a known flag before the positional is a flag, as it always was
    assert parse("logs", "--follow", "job-1").args["job"].value == "job-1"


def test_an_unknown_flag_after_the_positional_is_still_refused() -> None:
    with pytest.raises(ParseError, match="No idea what '--x' is!"):
        parse("cancel", "job-1", "--x")


def test_invokes_own_machine_is_back_after_each_parse() -> None:
    with pytest.raises(ParseError):
        parse("cancel", "--x")
    assert invoke_parser.ParseMachine is ParseMachine


@pytest.mark.parametrize("argv", [["cancel", "--help"], ["cancel", "job-1", "--help"]])
def test_help_after_a_task_with_a_positional_shows_its_help(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, ``fab cancel --help`` looked for a job named --help."""
    code, out, err = fab_in_process(argv, capsys, monkeypatch)
    assert code == 0 and err == ""
    assert out.startswith("Usage: fab [--core-opts] cancel [--options]")
    assert "--wait" in out


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
        "(fab --help status lists its flags)"
    ]
