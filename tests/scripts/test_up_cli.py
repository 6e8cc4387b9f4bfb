"""scripts/up.py's command line: bad input is one line and exit 2 before any engine starts.

No test here reaches Pulumi: up.main takes ``engine_for`` (the Automation API seam), and
each one given here raises if it is ever called. The failover itself:
tests/infra/test_failover.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import up
from tests.support.stderr import problems


def no_engine(stack: str) -> object:
    raise AssertionError(f"no engine may start for bad input (stack {stack!r})")


@pytest.fixture
def stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "Pulumi.a10x1.yaml").write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: a10x1\n"
        "  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    monkeypatch.setattr(up, "STACKS_DIR", tmp_path)
    return tmp_path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = up.main(argv, engine_for=no_engine)
    except SystemExit as stop:  # the parser's own refusals (OneLineParser)
        code = stop.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert code == up.EXIT_INVALID and captured.out == "", captured.err
    assert "Traceback" not in captured.err
    (line,) = problems(captured.err)  # one problem, each of its lines in 80 columns
    return line


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "up.py: the following arguments are required: --stack (see --help)"),
        (["--stack"], "up.py: argument --stack: expected one argument (see --help)"),
        (["--stack", "a10x1", "--bogus"], "up.py: unrecognized arguments: --bogus (see --help)"),
        (["--stack", "a10x1", "--live=yes"], "up.py: argument --live: ignored explicit argument"),
        (["--stack", "a10x2"], "up.py: --stack: no stack 'a10x2':"),
        (["--stack", ""], "up.py: --stack: no stack '':"),
        (["--stack", "../a10x1"], "up.py: --stack: no stack '../a10x1':"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_engine(
    argv: list[str], said: str, stacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused(argv, capsys).startswith(said)


def test_an_unknown_stack_names_the_close_one_and_no_flag_up_lacks(
    stacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["--stack", "a10x2"], capsys)
    assert line.endswith("(did you mean 'a10x1'?). Known stacks: a10x1")
    assert "--stack-file" not in line  # up.py has no such flag


def test_an_unknown_stack_among_many_fits_80_columns(
    stacks: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a100x1", "a100x4", "a100x8", "azure-h100x8", "tencent-a100x1-monthly"):
        (stacks / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    monkeypatch.chdir(stacks.parent)  # the path is shown from the working directory
    line = refused(["--stack", "a100x"], capsys)
    assert line.startswith(f"up.py: --stack: no stack 'a100x': {stacks.name}/Pulumi.a100x.yaml")
    assert "(did you mean 'a100x8'?). Known stacks: a100x1, a100x4, a100x8, a10x1," in line
    assert line.endswith("tencent-a100x1-monthly")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("ttlHours", "-1", "gpufleet:ttlHours"),
        ("nodeCount", "0", "gpufleet:nodeCount"),
        ("tier", "a10x9", "gpufleet:tier"),
        # a long problem continues on indented lines (fits 80 columns), its text unchanged
        ("tier", "a10x9", "h100x8 (did you mean 'a10x4'?)"),
        ("tags", '{"aws:x": "1"}', "in any letter case, and managed-by, are set by gpufleet"),
        ("idleMinutes", "99999", "keep a node longer with `fab keep-alive --hours N`), got"),
    ],
)
def test_a_bad_value_in_the_stack_is_refused_before_any_engine(
    key: str, value: str, said: str, stacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = {"provider": "aws", "tier": "a10x1", "sshCidrs": "[203.0.113.0/24]", key: value}
    body = "".join(f"  gpufleet:{k}: {v}\n" for k, v in keys.items())
    (stacks / "Pulumi.a10x1.yaml").write_text("config:\n" + body)
    line = refused(["--stack", "a10x1"], capsys)
    assert line.startswith(f"gpufleet:{key}") and said in line


def test_help_still_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        up.main(["--help"], engine_for=no_engine)
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: up.py ")
    assert "--stack STACK" in text and "--live" in text
    assert "stack name (stacks/Pulumi.<name>.yaml)" in text
