"""Text for people: terminal width, wrapping that never cuts a value, literal rich output.

Shared by scripts/plan.py, scripts/cost.py and the fab tasks. Pure functions and no Pulumi or
provider SDK import, so every command can use it cheaply.

Three rules every command follows:

- Width: the terminal's when stdout is one, `COLUMNS` when set, and otherwise none at all (piped
  to a file, lines are as long as their content: no guessed 80 that wraps).
- Wrapping splits values across lines, with a hanging indent, and never drops a character.
- Dynamic text (resource types, names, hosts, messages, prices) is never read as rich markup or
  emoji codes: `literal_console()` turns both off, and `literal()` makes a Text of a string for
  consoles that are not ours.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from typing import IO, Any

# rich is imported where a console or Text is built: plan --json and cost --json never need it.

MIN_WIDTH = 40  # below this, wrapping does more harm than a long line


def output_width(stream: IO[str] | None = None) -> int | None:
    """Columns to fit, or None for "no limit" (not a terminal and no COLUMNS)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(int(env), MIN_WIDTH)
    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return None
    return max(shutil.get_terminal_size().columns, MIN_WIDTH)


def number(value: Any) -> str:
    """A number as JSON writes it, whole floats without `.0` (22, not 22.0; 21.958 stays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def value_text(value: Any) -> str:
    """One value on one logical line: strings as they are, numbers whole, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return number(value)
    return json.dumps(jsonable(value), separators=(", ", ": "), default=str)


def jsonable(value: Any) -> Any:
    """Whole floats back to ints, recursively (what `json.dumps` should print for a person)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def wrap(text: str, width: int | None, first: str = "", rest: str | None = None) -> list[str]:
    """`first` + text, continued under `rest` (default: spaces as wide as `first`).

    Breaks at spaces where it can and inside long words where it must, so every character of
    `text` is kept; with no width, one line."""
    rest = " " * len(first) if rest is None else rest
    if width is None or len(first) + len(text) <= width:
        return [first + text]
    room = max(width - max(len(first), len(rest)), 10)
    return _joined(_wrapper(room).wrap(text) or [""], first, rest)


def _wrapper(room: int) -> textwrap.TextWrapper:
    return textwrap.TextWrapper(
        width=room,
        break_long_words=True,
        break_on_hyphens=False,
        replace_whitespace=False,
        drop_whitespace=True,
    )


def _joined(pieces: list[str], first: str, rest: str) -> list[str]:
    return [first + pieces[0], *(rest + p for p in pieces[1:])]


CODE_SPAN = re.compile(r"`([^`]+)`")
HELD = "\0"  # a space inside a command, while the prose around it is split into words


def wrap_prose(text: str, width: int | None, first: str = "", rest: str | None = None) -> list[str]:
    """Like `wrap`, for prose that quotes shell commands in backticks, so each command can be
    copied whole: a command that fits the line is never split across lines, and one longer
    than the line goes on lines of its own (indented, without its backticks), continued with
    a backslash as a shell reads it. With no width, one line."""
    rest = " " * len(first) if rest is None else rest
    if width is None or len(first) + len(text) <= width:
        return [first + text]
    room = max(width - max(len(first), len(rest)), 10)
    pieces: list[str] = []
    line = ""
    for word in CODE_SPAN.sub(lambda m: m[0].replace(" ", HELD), text).split():
        word = word.replace(HELD, " ")
        span = CODE_SPAN.search(word)
        if span and len(word) > room:
            before, after = word[: span.start()], word[span.end() :]
            if line or before:
                pieces.append(f"{line} {before}".strip())
            pieces += _continued(span[1], room)
            line = after
        elif not line:
            line = word
        elif len(line) + 1 + len(word) <= room:
            line += " " + word
        else:
            pieces.append(line)
            line = word
    if line or not pieces:
        pieces.append(line)
    return _joined(pieces, first, rest)


def _continued(command: str, room: int) -> list[str]:
    """A shell command in lines of `room` columns: the first indented two, the rest four,
    each but the last ending in a backslash. Words are never split, and an option stays on
    the line of its value."""
    units: list[str] = []
    for word in command.split():
        option = units and units[-1].startswith("-") and " " not in units[-1]
        if option and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    parts: list[str] = []
    for unit in units:
        if parts and len(parts[-1]) + 1 + len(unit) <= room - 6:
            parts[-1] += " " + unit
        else:
            parts.append(unit)
    return [
        ("  " if i == 0 else "    ") + part + (" \\" if i < len(parts) - 1 else "")
        for i, part in enumerate(parts)
    ]


def wrap_line(line: str, width: int | None) -> list[str]:
    """A line of already laid-out text, wrapped under its own indentation."""
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    return wrap(body, width, indent, indent + "  ")


def literal(text: Any, style: str = "") -> Any:
    """A rich Text of `text` exactly: `[bold]` and `:guard:` stay as typed."""
    from rich.text import Text

    return Text(str(text), style=style)


def literal_console(*, stderr: bool = False, soft_wrap: bool = False, **kwargs: Any) -> Any:
    """A rich Console that prints strings as they are (no markup, no emoji, no highlighting),
    as wide as `output_width` says (very wide when piped, so tables keep their values whole)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = output_width(stream)
    return Console(
        stderr=stderr,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=soft_wrap,
        width=width if width is not None else kwargs.pop("piped_width", 1000),
        **kwargs,
    )
