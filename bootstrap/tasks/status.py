"""``fab status``: one line per node with what a person needs before training on it."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from fabric import Connection
from invoke import Context
from rich.table import Table
from rich.text import Text

from bootstrap.fleet.api import HostContext, Options, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.runner import FleetReport, summary_table
from bootstrap.fleet.system import sh, split_sections
from bootstrap.tasks.pytorch import DEFAULT_VENV
from infra.render import literal

_STATUS_SCRIPT = r"""
echo ==torch; {py} -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null
echo ==df; df -B1 --output=source,size,avail,target {path} 2>/dev/null | tail -n +2
echo ==mountpoint; mountpoint -q {path} && echo yes || echo no
echo ==nvcc; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -2
"""


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
    script = _STATUS_SCRIPT.format(py=py, path=shlex.quote(ctx.scratch.path))
    sections = split_sections(sh(conn, script, timeout=60).stdout)
    details = status_details(ctx.facts, sections)
    details["scratch_path"] = ctx.scratch.path
    gpu = f"{details['gpu_count']}x {details['gpu_model']}" if details["gpu_count"] else "no GPU"
    return StepResult.ok(f"{gpu}, driver {details['driver'] or '-'}", **details)


def render_status(report: FleetReport) -> Iterable[Any]:
    table = Table(title=f"fab status: {len(report.hosts)} host(s)")
    for column in ("host", "GPUs", "driver", "CUDA", "torch", "scratch", "uptime", "notes"):
        table.add_column(column, overflow="fold")
    problems = False
    for h in report.hosts:
        rec = next((s for s in h.steps if s.name == "status"), None)
        if h.connection_error or rec is None or rec.result.is_failure:
            problems = True
            why = h.connection_message or next(
                (s.result.message for s in h.steps if s.result.is_failure), "no data"
            )
            table.add_row(
                literal(h.host.label), Text(h.status, "bold red"), "", "", "", "", "", literal(why)
            )
            continue
        d = rec.result.details
        gpus = f"{d['gpu_count']}x {d['gpu_model']}" if d["gpu_count"] else "none"
        sc = d["scratch"]
        if sc.get("mounted"):
            scratch = (
                f"{d['scratch_path']}: {format_bytes(sc['free_bytes'])} free"
                f" of {format_bytes(sc['size_bytes'])}"
            )
        else:
            scratch = f"{d['scratch_path']}: not mounted"
        notes = "REBOOT REQUIRED" if d["reboot_required"] else ""
        table.add_row(
            *(
                literal(cell)
                for cell in (
                    h.host.label,
                    gpus,
                    d["driver"] or "-",
                    d["cuda"] or "-",
                    d["torch"] or "-",
                    scratch,
                    format_uptime(d["uptime_s"] or 0),
                )
            ),
            Text(notes, "bold yellow"),
        )
    yield table
    if problems:
        # the failed steps' own messages; a host that could not be reached is already said
        # once, in its row above
        failed_steps = [h for h in report.hosts if not h.connection_error and h.failed]
        if failed_steps:
            yield summary_table(dataclasses.replace(report, hosts=failed_steps))


@fleet_task(help={"venv": f"node virtualenv to read torch from ({DEFAULT_VENV})"})
def status(
    c: Context,
    fleet_args: FleetArgs,
    venv: str = DEFAULT_VENV,
) -> None:
    """Per node: GPU model/count, driver, CUDA, torch, scratch space, uptime."""
    fleet_run(
        c,
        "status",
        [status_step],
        fleet_args,
        options=Options(venv=venv),
        readonly=True,
        render=render_status,
    )
