"""A host's live line (a download's progress): redrawn in place on a terminal, one plain line
every 10 s or 10 % when piped, nothing at all under --json."""

from __future__ import annotations

import io

from rich.console import Console

from bootstrap.fleet.api import Host
from bootstrap.fleet.runner import _Printer, tick_due

A = Host("10.0.0.1", name="a100x8-0")
B = Host("10.0.0.2", name="a100x8-1")


def test_the_first_piped_line_is_due_at_once() -> None:
    assert tick_due(None, 0.0, 0.01)


def test_a_piped_line_waits_ten_seconds_or_a_tenth_of_the_way() -> None:
    assert not tick_due((0.0, 0.11), 9.9, 0.19)
    assert tick_due((0.0, 0.11), 10.0, 0.12)
    assert tick_due((0.0, 0.19), 1.0, 0.20)


def test_without_a_fraction_only_the_time_counts() -> None:
    assert not tick_due((0.0, None), 9.0, None)
    assert tick_due((0.0, None), 10.0, None)


def test_piped_ticks_print_plain_lines_only_when_due() -> None:
    out = io.StringIO()
    times = iter([0.0, 2.0, 4.0, 14.0, 15.0])
    printer = _Printer(Console(file=out, width=80), clock=lambda: next(times))
    for fraction in (0.01, 0.05, 0.12, 0.13, 0.14):
        printer.tick(A, f"torch: {fraction:.0%}", fraction)
    lines = out.getvalue().splitlines()
    assert lines == [
        "[a100x8-0 (10.0.0.1)] torch: 1%",
        "[a100x8-0 (10.0.0.1)] torch: 12%",  # crossed 10 %
        "[a100x8-0 (10.0.0.1)] torch: 13%",  # 10 s after the last one
    ]
    assert "\x1b" not in out.getvalue()


def test_piped_ticks_are_throttled_per_host() -> None:
    out = io.StringIO()
    times = iter([0.0, 1.0, 2.0])
    printer = _Printer(Console(file=out, width=80), clock=lambda: next(times))
    printer.tick(A, "a", 0.5)
    printer.tick(B, "b", 0.5)
    printer.tick(A, "a again", 0.51)
    assert [line.split("] ")[1] for line in out.getvalue().splitlines()] == ["a", "b"]


def test_on_a_terminal_each_host_has_one_line_redrawn_in_place_and_gone_at_the_end() -> None:
    out = io.StringIO()
    printer = _Printer(Console(file=out, width=80, force_terminal=True, color_system=None))
    printer.tick(A, "torch: 10 MB of 900 MB", 0.01)
    printer.tick(B, "torch: 20 MB of 900 MB", 0.02)
    printer.tick(A, "torch: 30 MB of 900 MB", 0.03)
    printer.line(A, "a line of its own")
    printer.end_tick(A)
    printer.end_tick(B)
    assert printer.live is None
    text = out.getvalue()
    for message in ("10 MB", "20 MB", "30 MB", "a line of its own"):
        assert message in text
    # Redrawn in place: back to the start of the live lines, erased, drawn again.
    assert text.count("\x1b[2K") >= 3 and "\x1b[1A" in text
    # every live line fits the terminal (cut with an ellipsis rather than wrapped)
    printer.tick(A, "x" * 200, None)
    printer.end_tick(A)
    assert "…" in out.getvalue()


def test_no_console_means_no_output_at_all() -> None:
    printer = _Printer(None)
    printer.tick(A, "torch: 1 %", 0.01)
    printer.end_tick(A)
    assert printer.live is None
