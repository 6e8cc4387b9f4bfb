"""How verdicts look in a terminal: per host (and the cluster) one line per check with its
status and the figure against its expectation, the details beneath it (as ``pulumi preview``
shows a resource's inputs), and the closing line.

Each line fits the width it is given (infra/render.py ``output_width``: the terminal's, or
COLUMNS); with no width (piped), a line is as long as its content and never wrapped. A
detail holding several findings ("a; b") shows one finding per line.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from bootstrap.verify.verdict import CPU_ONLY, FAIL, NOT_RUN, PASS, SKIP, WARN, Check, Verdict
from infra.render import wrap, wrap_prose

STYLE = {PASS: "green", WARN: "yellow", SKIP: "cyan", NOT_RUN: "dim", FAIL: "bold red"}
STYLE[CPU_ONLY] = "magenta"
STATUS_COLUMN = len(NOT_RUN)  # the widest a check can have (CPU-ONLY is a host's)
NAME_COLUMN = 16  # longer names push their figure along rather than widen every line
DETAIL_INDENT = " " * (2 + STATUS_COLUMN + 2 + 2)


def _figure(c: Check) -> str:
    """The measured value against the expected one ('-' and '' expect nothing)."""
    if c.expected and c.expected not in ("-", c.measured):
        return f"{c.measured}  (want {c.expected})"
    return c.measured


def check_lines(c: Check, width: int | None, name_column: int) -> tuple[list[str], list[str]]:
    """One check: its headline (wrapped under the figure), then each finding of its detail on
    lines of its own."""
    head = f"  {c.status:<{STATUS_COLUMN}}  {c.name:<{name_column}}  "
    headline = [line.rstrip() for line in wrap(_figure(c), width, head, " " * len(head))]
    details: list[str] = []
    for part in (p.strip() for p in c.detail.split("; ")):
        if part:
            details += wrap_prose(part, width, DETAIL_INDENT)
    return headline, details


def verdict_text(v: Verdict, title: str, width: int | None = None) -> Text:
    """The host's verdict as lines no wider than ``width``, the statuses in colour."""
    name_column = min(max((len(c.name) for c in v.checks), default=0), NAME_COLUMN)
    text = Text()
    text.append(f"{title}: ")
    text.append(v.status, STYLE[v.status])
    for c in v.checks:
        headline, details = check_lines(c, width, name_column)
        text.append("\n  ")
        text.append(c.status, STYLE[c.status])
        text.append(headline[0][2 + len(c.status) :])
        for line in headline[1:]:
            text.append("\n" + line)
        for line in details:
            text.append("\n" + line)
    return text


def overall_line(verdicts: Sequence[Verdict], status: str) -> str:
    failed = [f"{v.host}: {', '.join(c.name for c in v.failures)}" for v in verdicts if v.failures]
    if status == FAIL:
        return f"verify-gpu: FAIL ({'; '.join(failed)})"
    if status == CPU_ONLY:
        return "verify-gpu: CPU-ONLY: the CPU training path works; the GPU tier was NOT verified"
    return f"verify-gpu: {status}"
