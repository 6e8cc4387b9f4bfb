"""The words of a verdict: statuses, one :class:`Check` line, a host's :class:`Verdict`, and
:func:`grade`, the PASS / WARN / FAIL rule every measured-against-expected check shares.

Statuses: PASS, WARN, FAIL, SKIP (could not be checked: a tool or credential is missing; never
a pass) and NOT-RUN (not applicable, or not asked for: ``--quick``, ``--cpu``). A CPU run
(``--cpu``) is never a PASS: its overall verdict is CPU-ONLY, or FAIL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

PASS, WARN, FAIL, SKIP, NOT_RUN = "PASS", "WARN", "FAIL", "SKIP", "NOT-RUN"
CPU_ONLY = "CPU-ONLY"
_RANK = {PASS: 0, NOT_RUN: 0, SKIP: 1, WARN: 1, FAIL: 2}


@dataclass(frozen=True)
class Check:
    """One line of the verdict: what was measured, what was expected, and the call."""

    name: str
    status: str
    measured: str
    expected: str = ""
    detail: str = ""
    threshold: str | None = None  # the catalog threshold that decided a WARN/FAIL
    shortfall: float | None = None  # how far below that threshold, as a fraction of it
    value: float | None = None  # the measured number, for machines

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass(frozen=True)
class Verdict:
    """All checks of one host (or of the cluster) and the resulting status."""

    host: str
    mode: str
    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        worst = max((_RANK[c.status] for c in self.checks), default=0)
        if worst == 2:
            return FAIL
        if self.mode == "cpu":
            return CPU_ONLY
        return WARN if worst == 1 else PASS

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in {[c.name for c in self.checks]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "mode": self.mode,
            "status": self.status,
            "checks": [c.to_json() for c in self.checks],
        }


def overall(verdicts: Iterable[Verdict]) -> str:
    items = list(verdicts)
    if not items or any(v.status == FAIL for v in items):
        return FAIL
    if any(v.status == CPU_ONLY for v in items):
        return CPU_ONLY
    return WARN if any(v.status == WARN for v in items) else PASS


def grade(
    name: str,
    measured: float,
    expected: float,
    th: Mapping[str, float],
    *,
    unit: str,
    basis: str,
    detail: str = "",
) -> Check:
    """PASS at >= pass_ratio x expected, WARN at >= warn_ratio x expected, else FAIL.

    ``basis`` says where ``expected`` came from (e.g. "0.869 x 312 TF/s peak")."""
    pass_at, warn_at = th["pass_ratio"] * expected, th["warn_ratio"] * expected
    share = measured / expected if expected else 0.0
    text = f"{share:.0%} of expected {expected:,.1f} {unit} ({basis})"
    shown, want = f"{measured:,.1f} {unit}", f">= {pass_at:,.1f} {unit}"
    if measured >= pass_at:
        return Check(name, PASS, shown, want, detail=join(text, detail), value=measured)
    if measured >= warn_at:
        short = 1 - measured / pass_at
        why = f"{short:.0%} below the pass_ratio {th['pass_ratio']:g} threshold"
        return Check(
            name,
            WARN,
            shown,
            want,
            detail=join(text, why, detail),
            threshold="pass_ratio",
            shortfall=short,
            value=measured,
        )
    short = 1 - measured / warn_at if warn_at else 1.0
    why = f"{short:.0%} below the warn_ratio {th['warn_ratio']:g} threshold ({warn_at:,.1f} {unit})"
    return Check(
        name,
        FAIL,
        shown,
        want,
        detail=join(text, why, detail),
        threshold="warn_ratio",
        shortfall=short,
        value=measured,
    )


def join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def gpu_list(indices: Iterable[Any]) -> str:
    return ", ".join(f"GPU{i}" for i in indices)
