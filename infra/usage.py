"""The command-line parser every gpufleet script shares: a usage error is one line, exit 2.

argparse prints the whole usage block and then the error (two to four lines); the
convention (docs/exit-status.md) is one line naming what is wrong and where to look, and
status 2 for bad input.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

USAGE_EXIT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: {message} (see --help)\n")


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of ``low`` or more, else one line naming it."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a whole number of {low} or more"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: give a whole number of {low} or more")
        return value

    parse.__name__ = f"whole number of {low} or more"
    return parse
