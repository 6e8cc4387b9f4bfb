"""How verdicts look in a terminal: one table per host (and the cluster) and the closing line."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from bootstrap.verify.verdict import CPU_ONLY, FAIL, NOT_RUN, PASS, SKIP, WARN, Verdict

STYLE = {PASS: "green", WARN: "yellow", SKIP: "cyan", NOT_RUN: "dim", FAIL: "bold red"}
STYLE[CPU_ONLY] = "magenta"


def verdict_table(v: Verdict, title: str) -> Table:
    table = Table(title=f"{title}: {v.status}", title_justify="left", show_lines=False)
    for col in ("check", "status", "measured", "expected", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("check", "status"))
    for c in v.checks:
        table.add_row(c.name, Text(c.status, STYLE[c.status]), c.measured, c.expected, c.detail)
    return table


def overall_line(verdicts: Sequence[Verdict], status: str) -> str:
    failed = [f"{v.host}: {', '.join(c.name for c in v.failures)}" for v in verdicts if v.failures]
    if status == FAIL:
        return f"verify-gpu: FAIL ({'; '.join(failed)})"
    if status == CPU_ONLY:
        return "verify-gpu: CPU-ONLY: the CPU training path works; the GPU tier was NOT verified"
    return f"verify-gpu: {status}"
