"""invoke's own parse errors exit 2, as every other usage error of gpufleet does.

invoke's Program prints a ParseError (``Flag '--hours' needed value and was not given one!``,
``No idea what '--bogus' is!``) and exits 1, the status gpufleet keeps for "it ran and the
answer is no" (docs/exit-status.md). The fabfile hands the running program to
:func:`exit_2_on_parse_errors`, which wraps its two parse steps that run after the fabfile is
loaded (the task arguments, and --help/--list cleanup): the same message, one line, with
where to look, and exit 2. A core flag before the task name (``fab --bogus status``) fails
before any fabfile is read, so invoke's exit 1 stands there (said in docs/exit-status.md).

A task with a positional argument (``fab cancel JOB``, ``fab logs JOB``, the ``data-*``
tasks) is parsed by :class:`DashIsNoPositional` instead of invoke's own machine: invoke
gives a waiting positional whatever token comes next, so ``fab cancel --x`` would look for
a job named ``--x`` and ``fab cancel --help`` for one named ``--help``. Here a token that
starts with ``-`` is never a positional's value: it is a core flag (``--help`` shows the
task's help, as on every other task) or an unknown flag, refused in one line. No value
gpufleet takes there can start with ``-``: job and dataset names start with a letter or a
digit (bootstrap/train/spec.py), and a folder named ``-x`` is typed ``./-x``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import invoke.parser.parser as invoke_parser
from invoke.exceptions import Exit, ParseError
from invoke.parser import ParseMachine, ParserContext

from bootstrap.fleet.numbers import USAGE_EXIT

_WRAPPED = "_gpufleet_exit_2"
_GENERAL = "(fab --list names the tasks, fab --help TASK its flags)"


class DashIsNoPositional(ParseMachine):
    """invoke's parse machine, except that ``-x``/``--x`` never fills a positional."""

    def handle(self, token: str) -> None:
        ctx = self.context
        if (
            self.current_state == "unknown"
            or ctx is None
            or not token.startswith("-")
            or token in ctx.flags
            or token in ctx.inverse_flags
            or self.waiting_for_flag_value
            or not ctx.missing_positional_args
        ):
            super().handle(token)
            return
        core = self.initial.flags.get(token) if self.initial else None
        if core is None:
            self.error(f"No idea what {token!r} is!")
        elif core.name == "help":  # as invoke does for --help after a task name
            core.value = ctx.name
            self.helped = ctx.name
        else:
            self.switch_to_flag(token)

    def complete_context(self) -> None:
        try:
            super().complete_context()
        except ParseError:
            # `fab cancel --help`: the help is wanted, not the missing JOB (the task never
            # runs: --help prints the task's help and exits)
            if self.context is None or getattr(self, "helped", None) != self.context.name:
                raise
            if self.context not in self.result:
                self.result.append(self.context)

    def complete_flag(self) -> None:
        try:
            super().complete_flag()
        except ParseError as exc:
            if self.flag is None or "needed value" not in str(exc):
                raise
            # invoke names the flag by its repr (<Argument: stack>): name it as typed
            flag = f"--{max(self.flag.names, key=len)}"
            raise ParseError(
                f"Flag {flag} needed value and was not given one!", self.context
            ) from None


# invoke's vendored state machine gathers a class's states while its body runs, so a subclass
# starts with none: it shares its parent's (the states call methods by name: the overrides)
DashIsNoPositional._class_states = ParseMachine._class_states
DashIsNoPositional._class_transitions = ParseMachine._class_transitions


@contextmanager
def _dash_aware_parsing() -> Iterator[None]:
    """invoke's Parser builds its machine by this module-level name; swap it for one parse."""
    original = invoke_parser.ParseMachine
    invoke_parser.ParseMachine = DashIsNoPositional  # type: ignore[misc]
    try:
        yield
    finally:
        invoke_parser.ParseMachine = original  # type: ignore[misc]


def exit_2_on_parse_errors(program: Any) -> None:
    """Make `program`'s task parsing raise Exit(code 2) for a ParseError (idempotent)."""
    for step in ("parse_tasks", "parse_cleanup"):
        original = getattr(program, step)
        if getattr(original, _WRAPPED, False):
            continue
        setattr(program, step, _exit_2(original, program))


def one_line(exc: ParseError, tasks: Any = None) -> str:
    """The ParseError as the one line fab prints: where to look names the task when the
    error is in one (``tasks``: the program's collection, to tell tasks from the core)."""
    said = " ".join(str(exc).split())
    ctx = getattr(exc, "context", None)
    name = ctx.name if isinstance(ctx, ParserContext) else None
    if not name or tasks is None or name not in getattr(tasks, "task_names", {}):
        return f"gpufleet: {said} {_GENERAL}"
    if said.startswith("No idea what '-"):
        flag = said.removeprefix("No idea what ").removesuffix(" is!")
        said = f"fab {name}: unknown flag {flag}"
    return f"gpufleet: {said} (fab --help {name} lists its flags)"


def _exit_2(step: Callable[[], None], program: Any) -> Callable[[], None]:
    def parse() -> None:
        try:
            with _dash_aware_parsing():
                step()
        except ParseError as exc:
            line = one_line(exc, getattr(program, "collection", None))
            raise Exit(line, code=USAGE_EXIT) from None

    setattr(parse, _WRAPPED, True)
    return parse
