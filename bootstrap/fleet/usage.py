"""invoke's own parse errors exit 2, as every other usage error of gpufleet does.

invoke's Program prints a ParseError (``Flag '--hours' needed value and was not given one!``,
``No idea what '--bogus' is!``) and exits 1, the status gpufleet keeps for "it ran and the
answer is no" (docs/exit-status.md). The fabfile hands the running program to
:func:`exit_2_on_parse_errors`, which wraps its two parse steps that run after the fabfile is
loaded (the task arguments, and --help/--list cleanup): the same message, one line, with
where to look, and exit 2. A core flag before the task name (``fab --bogus status``) fails
before any fabfile is read, so invoke's exit 1 stands there (said in docs/exit-status.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit, ParseError

from bootstrap.fleet.numbers import USAGE_EXIT

_WRAPPED = "_gpufleet_exit_2"


def exit_2_on_parse_errors(program: Any) -> None:
    """Make `program`'s task parsing raise Exit(code 2) for a ParseError (idempotent)."""
    for step in ("parse_tasks", "parse_cleanup"):
        original = getattr(program, step)
        if getattr(original, _WRAPPED, False):
            continue
        setattr(program, step, _exit_2(original))


def _exit_2(step: Callable[[], None]) -> Callable[[], None]:
    def parse() -> None:
        try:
            step()
        except ParseError as exc:
            said = " ".join(str(exc).split())
            raise Exit(
                f"gpufleet: {said} (fab --list names the tasks, fab --help TASK its flags)",
                code=USAGE_EXIT,
            ) from None

    setattr(parse, _WRAPPED, True)
    return parse
