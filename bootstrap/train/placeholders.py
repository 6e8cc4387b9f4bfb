"""The placeholders ``--args`` and ``--resume-args`` may hold, checked before anything starts.

The job id is known only once fab has made it, and the checkpoint folder only on the node,
so a script's arguments name them as placeholders that the node expands just before
torchrun starts (job_runner.py); job.json keeps them as typed. fab only checks the syntax
here, so a typo is one line before any node is touched, not a failed attempt later:

- ``{checkpoint_dir}``, ``{job}``, ``{attempt}``, ``{node_rank}``, ``{scratch}``;
- ``{newest GLOB}``: the entry directly under the checkpoint folder matching GLOB with the
  highest trailing number (then the newest), as an absolute path;
- ``{{`` and ``}}``: a literal brace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NAMES = ("checkpoint_dir", "job", "attempt", "node_rank", "scratch")
NEWEST = "newest"
KNOWN = ", ".join(f"{{{n}}}" for n in (*NAMES, f"{NEWEST} GLOB"))
# One token: a doubled brace, a placeholder, or a lone brace (which is the error).
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def problem(text: str) -> str | None:
    """Why ``text`` (one argument) is not valid placeholder syntax, or None."""
    for m in _TOKEN.finditer(text):
        token = m.group(0)
        if token in ("{{", "}}"):
            continue
        inner = m.group(1)
        if inner is None:
            return f"a lone {token!r} at character {m.start() + 1}"
        if inner in NAMES:
            continue
        name, _, glob = inner.partition(" ")
        if name == NEWEST:
            glob = glob.strip()
            if not glob:
                return "{newest} needs a pattern, e.g. {newest checkpoint-*}"
            if "/" in glob:
                return f"{{newest {glob}}}: the pattern names an entry directly in the folder"
            continue
        return f"unknown placeholder {{{inner}}}"
    return None


def refusal(option: str, args: Iterable[str]) -> str | None:
    """The one line refusing the first argument of ``option`` that is not valid, or None."""
    for arg in args:
        why = problem(arg)
        if why:
            return f"{option} {arg!r}: {why}; known: {KNOWN} ({{{{ and }}}} write a brace)"
    return None
