"""The command-line parser every gpufleet script shares: a usage error is one line, exit 2.

argparse prints the whole usage block and then the error (two to four lines); the
convention (docs/exit-status.md) is one line naming what is wrong and where to look, and
status 2 for bad input.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

USAGE_EXIT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: {message} (see --help)\n")


def _span(kind: str, low: float, high: float | None) -> str:
    return (
        f"give {kind} of {low:g} or more"
        if high is None
        else (f"give {kind} from {low:g} to {high:g}")
    )


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` (to ``high``), else one line that
    says what to give (argparse adds the flag: ``argument --days: -5: give ...``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {_span('a whole number', low, high)}"
            ) from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value}: {_span('a whole number', low, high)}")
        return value

    return parse


def real_number(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number from ``low`` to ``high`` (no nan, no inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r}: {_span('a number', low, high)}")
        return value

    return parse
