"""``fab status``: one line per node with what a person needs before training on it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fabric import Connection
from invoke import Context
from rich.text import Text

from bootstrap.fleet.api import HostContext, Options, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.runner import FleetReport, summary_table
from bootstrap.fleet.system import sh, split_sections
from bootstrap.remote.verify_health import QUARANTINE_FILE, STATE_DIR, VERDICT_FILE
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.verify.health_run import MAX_AGE_HOURS, age_hours, format_age
from bootstrap.verify.node_health import HealthVerdict
from infra.render import literal, output_width, wrap

_STATUS_SCRIPT = r"""
echo ==torch; {py} -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null
echo ==df; df -B1 --output=source,size,avail,target {path} 2>/dev/null | tail -n +2
echo ==mountpoint; mountpoint -q {path} && echo yes || echo no
echo ==nvcc; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -2
echo ==health; cat {verdict} 2>/dev/null | tr -d '\n'
echo; echo ==quarantine; test -e {quarantine} && echo yes || echo no
echo ==ttl; if [ -e {wstate} ]; then python3 -c "$GPUFLEET_TTL_PY" {wstate} 2>/dev/null \
  || echo unreadable; else echo missing; fi
echo ==now; date -u +%s
"""
# The watchdog's TTL record from its state file (watchdog_state.State.ttl), and nothing
# else of that file (its sample history is not ours to ship back).
_TTL_PY = "import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get('ttl')))"


# The watchdog's state file in the node's state folder (bootstrap/remote/watchdog_state.py's
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
        return {"state": "unknown", "reason": f"watchdog silent {format_uptime(age)}"}
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


def health_summary(sections: Mapping[str, str], now: dt.datetime | None = None) -> dict[str, Any]:
    """The node's last verdict as status shows it: its status, age and first reason."""
    try:
        verdict = HealthVerdict.from_json(json.loads(sections.get("health") or "null") or {})
    except (ValueError, AttributeError):
        return {"status": "none", "age": "", "reason": "no verdict: run fab health"}
    hours = age_hours(verdict.taken_at, now)
    worst = next((r for r in verdict.reasons if r.level == verdict.status), None)
    return {
        "status": verdict.status,
        "taken_at": verdict.taken_at,
        "age": format_age(hours),
        "age_hours": hours,
        "reason": f"{worst.check}: {worst.text}" if worst else "",
        "quarantined": sections.get("quarantine") == "yes",
    }


_HEALTH_STYLE = {"healthy": "green", "degraded": "yellow", "failed": "bold red"}


def format_uptime(seconds: float) -> str:
    minutes = int(seconds // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m"


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # unreachable; keeps type checkers happy


def parse_scratch(df_line: str, is_mountpoint: bool) -> dict[str, Any]:
    """``df -B1 --output=source,size,avail,target PATH`` (one line) -> facts about scratch."""
    fields = df_line.split()
    if not is_mountpoint or len(fields) < 4:
        return {"mounted": False}
    return {
        "mounted": True,
        "source": fields[0],
        "size_bytes": int(fields[1]),
        "free_bytes": int(fields[2]),
    }


def status_details(facts: Mapping[str, Any], sections: Mapping[str, str]) -> dict[str, Any]:
    """The status row of one host from probe facts + the status script's output (pure)."""
    smi = facts.get("smi_gpus") or []
    names = [g.name for g in smi] or list(facts.get("lspci_names") or [])
    model = names[0] if names else None
    cuda = facts.get("cuda_driver_version")
    scratch = parse_scratch(sections.get("df", ""), sections.get("mountpoint") == "yes")
    return {
        "gpu_model": model,
        "gpu_count": facts.get("gpu_count", 0),
        "driver": facts.get("driver_version"),
        "cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None,
        "nvcc": sections.get("nvcc", "").splitlines()[-1] if sections.get("nvcc") else None,
        "torch": sections.get("torch") or None,
        "scratch": scratch,
        "uptime_s": facts.get("uptime_s"),
        "reboot_required": bool(facts.get("reboot_required")),
        "os": facts["os"].pretty_name if facts.get("os") else None,
    }


@step("status")
def status_step(conn: Connection, ctx: HostContext) -> StepResult:
    py = shlex.quote(f"{ctx.options.venv.rstrip('/')}/bin/python")
    state = str(ctx.options.extra.get("state_dir") or STATE_DIR)
    script = f"GPUFLEET_TTL_PY={shlex.quote(_TTL_PY)}\n" + _STATUS_SCRIPT.format(
        py=py,
        path=shlex.quote(ctx.scratch.path),
        verdict=shlex.quote(f"{state}/{VERDICT_FILE}"),
        quarantine=shlex.quote(f"{state}/{QUARANTINE_FILE}"),
        wstate=shlex.quote(f"{state}/{WATCHDOG_STATE_FILE}"),
    )
    sections = split_sections(sh(conn, script, timeout=60).stdout)
    details = status_details(ctx.facts, sections)
    details["health"] = health_summary(sections)
    details["scratch_path"] = ctx.scratch.path
    details["ttl"] = ttl_left(sections.get("ttl", ""), sections.get("now"), details["uptime_s"])
    gpu = f"{details['gpu_count']}x {details['gpu_model']}" if details["gpu_count"] else "no GPU"
    return StepResult.ok(f"{gpu}, driver {details['driver'] or '-'}", **details)


# Piped with no COLUMNS, the status fits this many columns (as `fab top` does).
NARROW_COLUMNS = 80
HOST_COLUMN_MAX = 24  # a longer host label gets a line of its own (never cut)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def _short_model(model: Any) -> str:
    """The GPU model without the vendor's name every NVIDIA GPU's name starts with."""
    name = str(model)
    return name[len("NVIDIA ") :] if name.startswith("NVIDIA ") else name


def status_rows(report: FleetReport) -> list[dict[str, Any]]:
    """One dict per host: its row cells and the detail lines beneath it (pure)."""
    rows = []
    for h in report.hosts:
        rec = next((s for s in h.steps if s.name == "status"), None)
        if h.connection_error or rec is None or rec.result.is_failure:
            why = h.connection_message or next(
                (s.result.message for s in h.steps if s.result.is_failure), "no data"
            )
            rows.append({"host": h.host.label, "failed": h.status, "details": [why]})
            continue
        d = rec.result.details
        gpus = f"{d['gpu_count']}x {_short_model(d['gpu_model'])}" if d["gpu_count"] else "none"
        sc = d["scratch"]
        if sc.get("mounted"):
            scratch = (
                f"{d['scratch_path']}: {format_bytes(sc['free_bytes'])} free"
                f" of {format_bytes(sc['size_bytes'])}"
            )
        else:
            scratch = f"{d['scratch_path']}: not mounted"
        notes = ["REBOOT REQUIRED"] if d["reboot_required"] else []
        hv = d.get("health") or {}
        if hv.get("quarantined"):
            notes.append("QUARANTINED")
        elif (hv.get("age_hours") or 0) > MAX_AGE_HOURS:  # fab train refuses it: say so here
            notes.append("HEALTH STALE: fab health")
        software = (
            f"driver {d['driver'] or '-'}, CUDA {d['cuda'] or '-'}, torch {d['torch'] or '-'}"
        )
        details = [software, f"scratch {scratch}"]
        ttl = d.get("ttl")
        if ttl_note(ttl):
            details.append(ttl_note(ttl))
        rows.append(
            {
                "host": h.host.label,
                "cells": [
                    gpus,
                    format_uptime(d["uptime_s"] or 0),
                    ttl_cell(ttl),
                    f"{hv.get('status', 'none')} {hv.get('age', '')}".strip(),
                ],
                "health": hv.get("status", ""),
                "notes": "; ".join(notes),
                "details": details,
            }
        )
    return rows


_HEADINGS = ("GPUs", "uptime", "TTL left", "health")


def status_lines(report: FleetReport, width: int) -> list[Any]:
    """The status as lines of at most ``width`` columns: per host one row (host, GPUs,
    uptime, time left before the hard TTL, health) and its details beneath it, wrapped."""
    rows = status_rows(report)
    host_w = min(HOST_COLUMN_MAX, max([4, *(len(r["host"]) for r in rows)]))
    widths = [
        max([len(h), *(len(r["cells"][i]) for r in rows if "cells" in r)])
        for i, h in enumerate(_HEADINGS)
    ]
    # The GPU model is cut (with "~") when the row would not fit; nothing else is.
    over = host_w + 2 + sum(w + 2 for w in widths) - 2 - width
    if over > 0:
        widths[0] = max(len(_HEADINGS[0]), widths[0] - over)

    def row(host: str, cells: Sequence[str]) -> str:
        shown = [_fit(c, w).ljust(w) for c, w in zip(cells, widths[: len(cells)], strict=True)]
        return "  ".join([host.ljust(host_w), *shown]).rstrip()

    out: list[Any] = [literal(f"fab status: {len(report.hosts)} host(s)", "bold")]
    out.append(literal(row("host", _HEADINGS), "bold"))
    for r in rows:
        host = r["host"]
        if len(host) > host_w:
            out.extend(literal(line) for line in wrap(host, width))
            host = ""
        if "failed" in r:
            out.append(literal(row(host, [r["failed"], "", "", ""]), "bold red"))
        else:
            line = Text(row(host, r["cells"][:3]))
            if line.plain:
                line.append(" " * (host_w + 2 + sum(w + 2 for w in widths[:3]) - len(line.plain)))
            line.append(r["cells"][3], _HEALTH_STYLE.get(r["health"], ""))
            out.append(line)
        for detail in r["details"]:
            out.extend(literal(part) for part in wrap(detail, width, "  ", "    "))
        if r.get("notes"):
            out.extend(literal(part, "bold yellow") for part in wrap(r["notes"], width, "  "))
    return out


def render_status(report: FleetReport, width: int | None = None) -> Iterable[Any]:
    width = width or output_width() or NARROW_COLUMNS
    yield from status_lines(report, width)
    failed_steps = [h for h in report.hosts if not h.connection_error and h.failed]
    if failed_steps:
        # the failed steps' own messages; a host that could not be reached is already said
        # once, in its row above
        yield summary_table(dataclasses.replace(report, hosts=failed_steps))


@fleet_task(
    help={
        "venv": f"node virtualenv to read torch from ({DEFAULT_VENV})",
        "state_dir": f"the node's gpufleet state folder, where its health verdict is ({STATE_DIR})",
    }
)
def status(
    c: Context,
    fleet_args: FleetArgs,
    venv: str = DEFAULT_VENV,
    state_dir: str = "",
) -> None:
    """Per node: GPU model/count, driver, CUDA, torch, scratch, uptime, health verdict."""
    fleet_run(
        c,
        "status",
        [status_step],
        fleet_args,
        options=Options(venv=venv, extra={"state_dir": state_dir or STATE_DIR}),
        readonly=True,
        render=render_status,
    )
