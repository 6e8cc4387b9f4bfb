"""Every numeric option of every fab task is parsed by us: one line, exit 2, no host reached.

The walk covers whatever ``bootstrap.ns`` holds, so a task added later is tried too.
In-process runs of fab's own Program try every bad value on every option; a subprocess
per option proves the same as a person sees it, with a listening port that must stay
untouched.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from invoke.exceptions import Exit

from bootstrap import ns
from bootstrap.fleet.numbers import Bound, CheckedArgument, parse_number
from tests.bootstrap.conftest import REPO, fab_in_process


@dataclass(frozen=True)
class NumericOption:
    task: str
    flag: str
    kind: type
    bound: Bound
    checked: bool


def numeric_options() -> list[NumericOption]:
    out = []
    for name in sorted(ns.tasks):
        for arg in ns.tasks[name].get_arguments():
            if arg.kind in (int, float):
                flag = f"--{max(arg.names, key=len)}"
                bound = getattr(arg, "bound", Bound(0))
                out.append(
                    NumericOption(name, flag, arg.kind, bound, isinstance(arg, CheckedArgument))
                )
    return out


def bad_values(opt: NumericOption) -> list[str]:
    b = opt.bound
    values = ["abc", "", "1e999" if opt.kind is float else "1.5"]
    values.append(f"{b.low:g}" if b.above else f"{b.low - 1:g}")
    if b.high is not None:
        values.append(f"{b.high + 1:g}")
    if opt.kind is float:
        values.append("nan")
    return values


OPTIONS = numeric_options()
CASES = [(opt, value) for opt in OPTIONS for value in bad_values(opt)]


def test_the_walk_finds_the_numeric_options_of_every_kind_of_task() -> None:
    tasks = {opt.task for opt in OPTIONS}
    # connect-timeout is shared by every task that connects; each has its own numbers too.
    assert {"train", "cancel", "logs", "keep-alive", "status", "verify-gpu"} <= tasks
    assert len(OPTIONS) >= 25
    assert [f"{o.task} {o.flag}" for o in OPTIONS if not o.checked] == []


@pytest.mark.parametrize(("opt", "value"), CASES, ids=[f"{o.task}{o.flag}={v!r}" for o, v in CASES])
def test_a_bad_number_is_one_line_and_exit_2(
    opt: NumericOption,
    value: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = fab_in_process([opt.task, f"{opt.flag}={value}"], capsys, monkeypatch)
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpufleet: {opt.flag} "), err
    assert "e.g." in lines[0] and len(lines[0]) <= 100


@pytest.fixture
def listening_port() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _fab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_fab_refuses_each_bad_number_before_contacting_a_host(
    listening_port: socket.socket,
) -> None:
    host = f"nobody@127.0.0.1:{listening_port.getsockname()[1]}"
    # The ones issue 24 found as tracebacks (the in-process walk above tries them all).
    picks = [
        ("train", "--nproc-per-node", "abc"),
        ("train", "--max-workdir-mb", "-1"),
        ("keep-alive", "--hours", "abc"),
        ("status", "--connect-timeout", "-5"),
        ("cancel", "--wait", "abc"),
        ("logs", "--rank", "1.5"),
    ]
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda p: _fab("-H", host, *p), picks))
    for pick, proc in zip(picks, runs, strict=True):
        said = f"{' '.join(pick)}: {proc.stderr}"
        assert proc.returncode == 2 and proc.stdout == "", said
        assert len(proc.stderr.splitlines()) == 1, said
    with pytest.raises(BlockingIOError):
        listening_port.accept()


def test_a_default_is_not_checked_so_an_explicit_zero_is_refused() -> None:
    # --nproc-per-node's default 0 means "one per GPU"; typing 0 used to run 1 process.
    arg = next(a for a in ns.tasks["train"].get_arguments() if "nproc-per-node" in a.names)
    assert arg.value == 0
    with pytest.raises(Exit, match="whole number of 1 or more"):
        arg.set_value("0")


@pytest.mark.parametrize(
    ("text", "kind", "bound", "value"),
    [
        ("3", int, Bound(1), 3),
        ("0.5", float, Bound(0, above=True), 0.5),
        ("65535", int, Bound(0, high=65535), 65535),
    ],
)
def test_a_good_number_is_parsed_as_its_kind(
    text: str, kind: type, bound: Bound, value: float
) -> None:
    got = parse_number("--x", text, kind, bound)
    assert got == value and type(got) is kind


def test_a_missing_value_names_the_flag_as_typed() -> None:
    # invoke's own "needed value" error used to say <Argument: wait [float]>; it exits 2 now
    # (bootstrap/fleet/parse_errors.py, docs/exit-status.md)
    proc = _fab("cancel", "--wait")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpufleet: Flag --wait needed value and was not given one! "
        "(fab --help cancel lists its flags)"
    )
