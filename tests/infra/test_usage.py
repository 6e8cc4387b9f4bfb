"""infra/usage.py: the one-line parser and its whole-number type."""

from __future__ import annotations

import pytest

from infra.usage import CONTINUED, ERROR_WIDTH, OneLineParser, fit, whole_number


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


def test_fit_keeps_a_short_problem_and_wraps_a_long_one_without_splitting_words() -> None:
    assert fit("plan.py: --stack: no stack 'x'") == "plan.py: --stack: no stack 'x'"
    regions = ", ".join(f"region-{n}" for n in range(30))
    long = f"plan.py: no region 'nowhere' (did you mean 'region-1'?); regions: {regions}"
    lines = fit(long).splitlines()
    assert len(lines) > 1 and all(len(line) <= ERROR_WIDTH for line in lines)
    assert all(line.startswith(CONTINUED) for line in lines[1:])
    assert not lines[0].startswith(" ")
    assert " ".join(line.strip() for line in lines) == long
    assert any("(did you mean 'region-1'?)" in line for line in lines)
    path = "/tmp/" + "d" * 90 + "/fc-wheels"
    lines = fit(f"plan.py: {path}: no wheels: run `make fc-wheels`").splitlines()
    assert path + ":" in [line.strip() for line in lines]  # whole, so it can be copied
