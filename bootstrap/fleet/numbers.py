"""Numeric task options, parsed by us rather than by invoke.

invoke turns ``--hours abc`` into ``float("abc")`` inside its parser, and the ValueError
reaches the person as a 22-line traceback (exit 1). Every fleet task instead declares a
:class:`Bound` per numeric option; :class:`CheckedTask` gives those options an argument
that checks the value the moment the parser reads it, so a bad one ends the run with one
line and exit 2 before any host is resolved or contacted.

Only values the person typed are checked: a default (``--nproc-per-node`` 0, "one per
GPU") never goes through :meth:`CheckedArgument.set_value`, so an explicit 0 is refused
while the default keeps its meaning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from invoke import Task
from invoke.exceptions import Exit
from invoke.parser import Argument

USAGE_EXIT = 2  # a usage error, as argparse and the scripts/ tools exit


@dataclass(frozen=True)
class Bound:
    """The values a numeric option accepts: ``low`` (or above it when ``above``) up to
    ``high``; ``example`` goes into the error's "e.g." so the fix can be pasted."""

    low: float
    high: float | None = None
    above: bool = False
    example: str = ""

    def describe(self, kind: type) -> str:
        what = "a whole number" if kind is int else "a number"
        low = f"{self.low:g}"
        if self.above:
            span = f"above {low}" + (f" and at most {self.high:g}" if self.high else "")
        elif self.high is not None:
            span = f"from {low} to {self.high:g}"
        else:
            span = f"of {low} or more"
        return f"{what} {span}"

    def admits(self, value: float) -> bool:
        if self.above and not value > self.low:
            return False
        if value < self.low:
            return False
        return self.high is None or value <= self.high


def parse_number(flag: str, text: str, kind: type, bound: Bound) -> int | float:
    """``text`` as ``kind`` within ``bound``, or an Exit (code 2) saying what to type."""
    example = f" (e.g. {flag} {bound.example})" if bound.example else ""
    want = bound.describe(kind)
    try:
        value: int | float = int(text) if kind is int else float(text)
    except (TypeError, ValueError):
        raise Exit(f"gpufleet: {flag} {text!r}: give {want}{example}", code=USAGE_EXIT) from None
    if not math.isfinite(value) or not bound.admits(value):
        raise Exit(f"gpufleet: {flag} {text}: give {want}{example}", code=USAGE_EXIT)
    return value


class CheckedArgument(Argument):
    """An invoke Argument whose typed value is checked against a :class:`Bound`."""

    def __init__(self, *args: Any, bound: Bound, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bound = bound

    @property
    def flag(self) -> str:
        return f"--{max(self.names, key=len)}"

    def set_value(self, value: Any, cast: bool = True) -> None:
        if cast:
            self.raw_value = value
            self._value = parse_number(self.flag, value, self.kind, self.bound)
            return
        super().set_value(value, cast=cast)

    def __repr__(self) -> str:
        # invoke's "Flag {!r} needed value and was not given one!" then names the flag as
        # it is typed, not as <Argument: wait [float]>.
        return self.flag


def numeric_params(defaults: Mapping[str, Any]) -> list[str]:
    """The options invoke would parse as numbers: those whose default is an int or float."""
    return [
        name
        for name, default in defaults.items()
        if isinstance(default, int | float) and not isinstance(default, bool)
    ]


class CheckedTask(Task[Any]):
    """A Task whose numeric options are :class:`CheckedArgument`s (``bounds`` by name)."""

    bounds: Mapping[str, Bound] = {}

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        out: list[Argument] = []
        for arg in super().get_arguments(ignore_unknown_help=ignore_unknown_help):
            bound = self.bounds.get(arg.attr_name or arg.name or "")
            if bound is None or arg.kind not in (int, float):
                out.append(arg)
                continue
            out.append(
                CheckedArgument(
                    names=arg.names,
                    kind=arg.kind,
                    default=arg.default,
                    help=arg.help,
                    positional=arg.positional,
                    optional=arg.optional,
                    incrementable=arg.incrementable,
                    attr_name=arg.attr_name,
                    bound=bound,
                )
            )
        return out
