"""scripts/reserve.py's command line: bad input is one line and exit 2, before any cloud
is asked (the offerings themselves: tests/infra/test_reserved.py)."""

from __future__ import annotations

import io

import pytest

from infra import reserved
from scripts import reserve
from tests.support.stderr import problems

OK = ["h100x8", "--start", "2026-12-14", "--days", "7"]


@pytest.fixture(autouse=True)
def no_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    def offerings(*_a: object, **_k: object) -> None:
        raise AssertionError("bad input must be refused before any cloud is asked")

    monkeypatch.setattr(reserved, "offerings", offerings)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    try:
        code = reserve.main(argv, out, err)
    except SystemExit as stop:  # argparse's own refusals (OneLineParser)
        code = stop.code  # type: ignore[assignment]
    said = err.getvalue() + capsys.readouterr().err
    assert code == 2 and out.getvalue() == "", said
    assert "Traceback" not in said
    (line,) = problems(said)  # one problem, each of its lines in 80 columns
    assert line.startswith("reserve.py: "), line
    return line


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["h100x8", "--start", "2026-13-14", "--days", "7"], "'2026-13-14' is not a date"),
        (["h100x8", "--start", "14/12/2026", "--days", "7"], "'14/12/2026' is not a date"),
        (["h100x8", "--start", "", "--days", "7"], "'' is not a date"),
        ([*OK, "--end", "2026-02-30"], "argument --end: '2026-02-30' is not a date"),
        ([*OK, "--end", "2026-12-15"], "--end 2026-12-15 is before --start plus --days"),
        (["h100x8", "--start", "2026-12-14", "--days", "x"], "--days: 'x': give a whole"),
        (["h100x8", "--start", "2026-12-14", "--days", "0"], "--days: 0: give a whole"),
        (["h100x8", "--start", "2026-12-14", "--days", "-7"], "--days: -7: give a whole"),
        ([*OK, "--nodes", "0"], "argument --nodes: 0: give a whole number of 1"),
        ([*OK, "--nodes", "-2"], "argument --nodes: -2: give a whole number of 1"),
        ([*OK, "--nodes", "2.5"], "argument --nodes: '2.5': give a whole number"),
        (
            [*OK, "--region", "us-east-9"],
            "--region 'us-east-9' is not a region of aws (did you mean 'us-east-2'?)",
        ),
        ([*OK, "--nodes", "2.5"], "'2.5': give a whole number of 1 or more (see --help)"),
        ([*OK, "--days", "1" * 16], "a block lasts 1-14 days, or 21-182 in whole weeks"),
        ([*OK, "--region"], "argument --region: expected one argument"),
        ([*OK, "--bogus"], "unrecognized arguments: --bogus"),
        (["h100x8", "--days", "7"], "the following arguments are required: --start"),
        # no cloud that sells blocks offers a100x1: the numbers are still checked
        (["a100x1", "--start", "2026-12-14", "--days", "-5"], "--days: -5: give a whole"),
        (["a100x1", "--start", "2026-12-14", "--days", "10" * 10], "past the calendar's end"),
        (["a100x1", "--start", "9999-12-30", "--days", "1"], "past the calendar's end"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_cloud_is_asked(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert said in refused(argv, capsys)


def test_a_usage_error_ends_pointing_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused([*OK, "--nodes", "0"], capsys).endswith("(see --help)")


def test_help_still_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        reserve.main(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: reserve.py ")
    for flag in ("--start START", "--end END", "--days DAYS", "--nodes NODES", "--region"):
        assert flag in text, flag
    assert "how long: 1-14, or whole weeks" in text
