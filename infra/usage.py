"""The command-line parser every gpufleet script shares: a usage error is one line, exit 2.

argparse prints the whole usage block and then the error (two to four lines); the
convention (docs/exit-status.md) is one line naming what is wrong and where to look, and
status 2 for bad input. A message too long for an 80-column terminal continues on lines
indented two spaces (`fit`), so a problem is a line plus its indented continuation.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn

from infra.render import wrap_prose

USAGE_EXIT = 2
ERROR_WIDTH = 80  # stderr is read on a terminal of at least 80 columns, and in logs
CONTINUED = "  "  # a wrapped problem's later lines: a problem's first line never starts so


# kept on one line when a message is wrapped: a suggestion, the pointer to --help
_WHOLE = re.compile(r"\((?:did you mean [^()]*\?|see --help)\)")
_HELD = "\x01"


def fit(message: str) -> str:
    """One problem for stderr, as is when it fits ERROR_WIDTH, else continued on lines
    indented two spaces; a `command` in backticks (infra.render.wrap_prose), a "(did you
    mean 'x'?)" and "(see --help)" are not split, and no word is: a path wider than a line
    stays whole on a line of its own, so it can still be copied."""
    held = _WHOLE.sub(lambda m: m[0].replace(" ", _HELD), message)
    lines = wrap_prose(held, ERROR_WIDTH, "", CONTINUED)
    return "\n".join(lines).replace(_HELD, " ")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, fit(f"{self.prog}: {message} (see --help)") + "\n")


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
