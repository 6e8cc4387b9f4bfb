"""The command-line parser every gpufleet script shares: a usage error is one line, exit 2.

argparse prints the whole usage block and then the error (two to four lines); the
convention (docs/exit-status.md) is one line naming what is wrong and where to look, and
status 2 for bad input.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

USAGE_EXIT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: {message} (see --help)\n")
