"""infra/usage.py: the one-line parser and its whole-number type."""

from __future__ import annotations

import pytest

from infra.usage import OneLineParser, whole_number


def parser() -> OneLineParser:
    p = OneLineParser(prog="tool.py")
    p.add_argument("--days", type=whole_number(1), default=1)
    return p


def test_a_whole_number_at_or_above_the_floor_is_taken() -> None:
    assert parser().parse_args(["--days", "1"]).days == 1
    assert parser().parse_args(["--days", "14"]).days == 14


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "0: give a whole number of 1 or more"),
        ("-3", "-3: give a whole number of 1 or more"),
        ("x", "'x': give a whole number of 1 or more"),
        ("", "'': give a whole number of 1 or more"),
        ("1.5", "'1.5': give a whole number of 1 or more"),
        ("1e3", "'1e3': give a whole number of 1 or more"),
    ],
)
def test_anything_else_is_one_line_exit_2_naming_the_flag(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parser().parse_args([f"--days={value}"])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tool.py: argument --days: {said} (see --help)\n"
