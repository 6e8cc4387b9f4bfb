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
from bootstrap.fleet.ttl import TTL_PY, WATCHDOG_STATE_FILE, ttl_cell, ttl_left, ttl_note
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.tasks.watchdog import WatchdogOptions
from bootstrap.verify.health.check import MAX_AGE_HOURS, age_hours, format_age
from bootstrap.verify.health.verdict import HealthVerdict
from gpufleet_node.verify_health import QUARANTINE_FILE, STATE_DIR, VERDICT_FILE
from infra.render import literal, output_width, wrap

_STATUS_SCRIPT = r"""
echo ==torch; {py} -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null
echo ==df; df -B1 --output=source,size,avail,target {path} 2>/dev/null | tail -n +2
echo ==mountpoint; mountpoint -q {path} && echo yes || echo no
echo ==nvcc; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -2
echo ==health; cat {verdict} 2>/dev/null | tr -d '\n'
echo; echo ==quarantine; test -e {quarantine} && echo yes || echo no
echo ==ttl; if [ -e {wstate} ]; then python3 -c {ttl_py} {wstate} 2>/dev/null \
  || echo unreadable; else echo missing; fi
echo ==now; date -u +%s
"""


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
    state = (ctx.options.of(WatchdogOptions) or WatchdogOptions()).state_dir or str(STATE_DIR)
    script = _STATUS_SCRIPT.format(
        ttl_py=shlex.quote(TTL_PY),
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
        options=Options(venv=venv, tasks=(WatchdogOptions(state_dir=state_dir),)),
        readonly=True,
        render=render_status,
    )
