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


def wrap(
    text: str,
    width: int | None,
    first: str = "",
    rest: str | None = None,
    *,
    break_words: bool = True,
) -> list[str]:
    """`first` + text, continued under `rest` (default: spaces as wide as `first`).

    Breaks at spaces where it can and inside long words where it must, so every character of
    `text` is kept; with no width, one line. With ``break_words=False`` a word longer than
    the line (a URL in a command to copy) stays whole on a line of its own, past the width:
    a terminal soft-wraps it and a copy keeps it intact."""
    rest = " " * len(first) if rest is None else rest
    if width is None or len(first) + len(text) <= width:
        return [first + text]
    room = max(width - max(len(first), len(rest)), 10)
    wrapper = textwrap.TextWrapper(
        width=room,
        break_long_words=break_words,
        break_on_hyphens=False,
        replace_whitespace=False,
        drop_whitespace=True,
    )
    pieces = wrapper.wrap(text) or [""]
    return [first + pieces[0], *(rest + p for p in pieces[1:])]


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
