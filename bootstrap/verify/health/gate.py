"""fab train's health gate: a node whose last health verdict is failed, older than
:data:`~bootstrap.verify.health.check.MAX_AGE_HOURS`, or quarantined is refused with one line
and the command that re-checks it; ``--ignore-health`` lets a failed or stale node in and
the job's record says so (a quarantined node stays out: it waits for its replacement).

The verdict is the one ``fab health`` / ``fab setup`` / ``fab verify-gpu`` keep in the
node's state folder, the parent of the jobs folder (``/var/lib/gpufleet`` by default).
A node with no verdict at all (set up by hand, never checked) is let in and the record
says "none": refusing it would make every node that never ran ``fab health`` unusable.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from bootstrap.verify.health.check import MAX_AGE_HOURS, age_hours, format_age
from bootstrap.verify.health.verdict import FAILED, HealthVerdict
from gpufleet_node.verify_health import QUARANTINE_FILE, VERDICT_FILE

RECHECK = "fab health"


def state_dir_of(jobs_dir: str) -> str:
    """The node's gpufleet state folder: the jobs folder's parent."""
    return str(PurePosixPath(jobs_dir.rstrip("/") or "/").parent)


def check_lines(jobs_dir: str) -> str:
    """Shell lines that print the verdict (one line of JSON) and the quarantine mark."""
    state = state_dir_of(jobs_dir)
    verdict = shlex.quote(f"{state}/{VERDICT_FILE}")
    mark = shlex.quote(f"{state}/{QUARANTINE_FILE}")
    return (
        f"echo health=$(tr -d '\\n' < {verdict} 2>/dev/null); "
        f"echo quarantine=$(test -e {mark} && echo yes || echo no)"
    )


def health_record(facts: Mapping[str, str], now: dt.datetime | None = None) -> dict[str, Any]:
    """What the job's record keeps of one node's verdict (status "none": no verdict)."""
    try:
        v = HealthVerdict.from_json(json.loads(facts.get("health") or "null") or {})
    except (ValueError, AttributeError):
        return {"status": "none", "quarantined": facts.get("quarantine") == "yes"}
    hours = age_hours(v.taken_at, now)
    worst = next((r for r in v.reasons if r.level == v.status), None)
    return {
        "status": v.status,
        "taken_at": v.taken_at,
        "age_hours": None if hours is None else round(hours, 2),
        "reason": f"{worst.check}: {worst.text}" if worst else "",
        "quarantined": facts.get("quarantine") == "yes",
    }


def refusal(record: Mapping[str, Any], host: str, max_age_h: float = MAX_AGE_HOURS) -> str | None:
    """Why the health gate keeps this node out (one line), or None."""
    hint = f"re-check with `{RECHECK}`, or pass --ignore-health to train anyway"
    if record["status"] == "none":
        return None
    age = record.get("age_hours")
    if record["status"] == FAILED:
        when = f" {format_age(age)} ago" if age is not None else ""
        return f"{host}: health verdict failed{when} ({record.get('reason')}): {hint}"
    if age is None or age > max_age_h:
        return f"{host}: health verdict is {format_age(age)} old (limit {max_age_h:g} h): {hint}"
    return None


def quarantined(record: Mapping[str, Any], host: str) -> str | None:
    if not record.get("quarantined"):
        return None
    return (
        f"{host}: quarantined for replacement (`{RECHECK}` prints its `pulumi up --replace`; "
        f"`{RECHECK} --release` lifts it)"
    )
