"""The time before the hard TTL stops a node, as `fab status` and `fab jobs` show it: read
from the watchdog's own record on the node (gpufleet_node/watchdog.py ``ttl_ahead``
writes ``state.ttl``: the stop time it resolved from the boot time, the TTL tag or config
and any lease), on the node's clock."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections.abc import Mapping
from typing import Any

from fabric import Connection

from bootstrap.fleet.system import sh, split_sections

# The watchdog's TTL record from its state file (watchdog_state.State.ttl), and nothing
# else of that file (its sample history is not ours to ship back).
TTL_PY = "import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get('ttl')))"

_TTL_SCRIPT = r"""
echo ==ttl; if [ -e {wstate} ]; then python3 -c {py} {wstate} 2>/dev/null \
  || echo unreadable; else echo missing; fi
echo ==now; date -u +%s
echo ==uptime; cut -d' ' -f1 /proc/uptime
"""


# The watchdog's state file in the node's state folder (gpufleet_node/watchdog_state.py's
# STATE_FILE; that module runs on the node only, so the name is repeated here, and tested).
WATCHDOG_STATE_FILE = "watchdog-state.json"
# A TTL record older than this is not today's news: the watchdog runs about once a minute.
TTL_RECORD_MAX_AGE_S = 10 * 60
# A record of another boot: its boot time and this one's more than this apart.
SAME_BOOT_S = 120


def _parse_time(text: Any) -> dt.datetime | None:
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def format_left(seconds: float) -> str:
    """Time left, short: 48m, 18h05m, 3d 4h."""
    minutes = max(0, int(seconds // 60))
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def ttl_left(section: str, node_now: Any, uptime_s: Any) -> dict[str, Any]:
    """The time before the hard TTL stops this node, from the watchdog's own record of it
    (``state.ttl``: the stop time it resolved from the node's boot, its TTL tag or config,
    and any lease), on the node's clock (``node_now``, epoch seconds).

    ``state``: "left" (``seconds``, ``stop_at``; ``why`` "lease" when a lease holds the TTL
    off until then, "cap" for the 14-day cap), "off" (no TTL, or protected: ``why``) or
    "unknown" (``reason``, short)."""
    text = (section or "").strip()
    if text == "missing":
        return {"state": "unknown", "reason": "no watchdog state (fab install-watchdog)"}
    try:
        record = json.loads(text) if text and text != "unreadable" else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        why = "no TTL in watchdog state (fab install-watchdog)" if text == "null" else None
        return {"state": "unknown", "reason": why or "watchdog state unreadable"}
    try:
        now = dt.datetime.fromtimestamp(float(str(node_now).strip()), dt.UTC)
    except (TypeError, ValueError, OverflowError):
        return {"state": "unknown", "reason": "node clock unreadable"}
    boot, at = _parse_time(record.get("boot")), _parse_time(record.get("at"))
    if boot is None or at is None:
        return {"state": "unknown", "reason": "watchdog state unreadable"}
    if isinstance(uptime_s, int | float):
        this_boot = now - dt.timedelta(seconds=float(uptime_s))
        if abs((this_boot - boot).total_seconds()) > SAME_BOOT_S:
            return {"state": "unknown", "reason": "watchdog has not run since boot"}
    age = (now - at).total_seconds()
    if age > TTL_RECORD_MAX_AGE_S:
        return {"state": "unknown", "reason": f"watchdog silent {format_left(age)}"}
    why = str(record.get("why") or "")
    if why in ("off", "protected"):
        return {"state": "off", "why": why}
    stop_at = _parse_time(record.get("stop_at"))
    if stop_at is None:
        return {"state": "unknown", "reason": "watchdog state unreadable"}
    return {
        "state": "left",
        "seconds": max(0.0, (stop_at - now).total_seconds()),
        "stop_at": stop_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "why": why,
        "ttl_hours": record.get("ttl_hours"),
        "lease_until": record.get("lease_until"),
    }


def ttl_cell(ttl: Mapping[str, Any] | None) -> str:
    """The TTL column: "18h05m", "30h05m lease", "off", "protected", "unknown"."""
    ttl = ttl or {"state": "unknown"}
    if ttl["state"] == "off":
        return "protected" if ttl.get("why") == "protected" else "off"
    if ttl["state"] != "left":
        return "unknown"
    suffix = {"lease": " lease", "cap": " cap"}.get(str(ttl.get("why")), "")
    return format_left(float(ttl["seconds"])) + suffix


def ttl_note(ttl: Mapping[str, Any] | None) -> str:
    """What the TTL column cannot say in its cell, for the host's detail lines."""
    ttl = ttl or {"state": "unknown", "reason": "not read"}
    if ttl["state"] == "unknown":
        return f"TTL unknown: {ttl.get('reason') or 'not read'}"
    if ttl["state"] == "left" and ttl.get("why") == "lease":
        return f"TTL held off by a lease: stops at {ttl['stop_at']}, even mid-job"
    if ttl["state"] == "left" and ttl.get("why") == "cap":
        return f"unreadable tag or lease: the 14-day cap stops it at {ttl['stop_at']}"
    return ""


def read_ttl(conn: Connection, state_dir: str) -> dict[str, Any]:
    """One round trip: the node's TTL record, clock and uptime -> :func:`ttl_left`."""
    script = _TTL_SCRIPT.format(
        wstate=shlex.quote(f"{state_dir.rstrip('/')}/{WATCHDOG_STATE_FILE}"),
        py=shlex.quote(TTL_PY),
    )
    sections = split_sections(sh(conn, script, timeout=60).stdout)
    try:
        uptime: float | None = float(sections.get("uptime", "").strip())
    except ValueError:
        uptime = None
    return ttl_left(sections.get("ttl", ""), sections.get("now"), uptime)
