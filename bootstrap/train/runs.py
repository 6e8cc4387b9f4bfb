"""Running the train steps across the fleet, and reading back what the nodes said."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from invoke import Context
from rich.console import Console

from bootstrap.fleet.api import Host, HostContext, Options
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.runner import FleetReport, run_fleet
from bootstrap.train.chart import CHART_NAME, history_of, job_figure, save_chart
from bootstrap.train.jobs import JobRow, merge_jobs
from bootstrap.train.options import ChartKeep, JobRef, JobsList, LogsOptions
from bootstrap.train.spec import rank_of
from bootstrap.train.steps import chart_step, history_step, jobs_step, logs_step


def _context_factory(fleet: Fleet, tasks: tuple[object, ...]) -> Callable[[Host], HostContext]:
    options = Options(tasks=tasks)
    return lambda host: fleet.context(host, options)


def run_steps(
    c: Context,
    fleet: Fleet,
    name: str,
    steps: Sequence[Any],
    *,
    tasks: tuple[object, ...],
    console: Console | None,
    connect_timeout: float,
) -> FleetReport:
    # No probe step first: the train steps read no OS facts, and each step is a round trip
    # on the way to the job's first line (issue 24).
    return run_fleet(
        name,
        fleet.hosts,
        list(steps),
        _context_factory(fleet, tasks),
        config=c.config,
        console=console,
        connect_timeout_s=connect_timeout,
    )


def host_problems(report: FleetReport) -> list[str]:
    out = []
    for h in report.hosts:
        if h.connection_error:
            out.append(h.connection_message)
            continue
        for s in h.steps:
            if s.result.is_failure:
                msg = s.result.message
                out.append(msg if msg.startswith(h.host.label) else f"{h.host.label}: {msg}")
                break
    return out


def collect_jobs(
    c: Context, fleet: Fleet, jobs_dir: str, connect_timeout: float, state_dir: str = ""
) -> tuple[list[JobRow], FleetReport]:
    report = run_steps(
        c,
        fleet,
        "jobs",
        [jobs_step],
        tasks=(JobsList(jobs_dir, state_dir),),
        console=None,
        connect_timeout=connect_timeout,
    )
    records: list[Mapping[str, Any]] = []
    for h in report.hosts:
        for s in h.steps:
            if s.name == "jobs":
                # each record carries the time its node has before the hard TTL
                ttl = s.result.details.get("ttl")
                records.extend(
                    {**rec, "node_ttl": ttl} for rec in s.result.details.get("jobs") or []
                )
    return merge_jobs(records, now=dt.datetime.now(dt.UTC), outputs=fleet.outputs), report


def warn_unreachable(report: FleetReport) -> None:
    for line in host_problems(report):
        print(f"gpufleet: {line}", file=sys.stderr)


def follow_logs(
    c: Context,
    fleet: Fleet,
    spec: Mapping[str, Any],
    *,
    rank: int | None,
    follow: bool,
    connect_timeout: float,
    this_attempt: bool = False,
) -> FleetReport:
    given = LogsOptions(
        out=sys.stdout,
        lock=threading.Lock(),
        rank=rank,
        follow=follow,
        this_attempt=this_attempt,
    )
    return run_steps(
        c,
        fleet,
        "logs",
        [logs_step],
        tasks=(JobRef(spec), given),
        console=None,
        connect_timeout=connect_timeout,
    )


def job_hosts(fleet: Fleet, spec: Mapping[str, Any]) -> Fleet:
    hosts = tuple(h for h in fleet.hosts if rank_of(spec, h) is not None)
    return dataclasses.replace(fleet, hosts=hosts or fleet.hosts)


def charts_dir() -> Path:
    """Where the laptop keeps each job's chart: ``$XDG_CACHE_HOME/gpufleet/jobs`` (else
    ``~/.cache/gpufleet/jobs``), one folder per job."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufleet" / "jobs"


def chart_path(job: str) -> Path:
    return charts_dir() / job / CHART_NAME


def write_chart(
    c: Context, fleet: Fleet, row: JobRow, *, connect_timeout: float
) -> tuple[Path | None, list[str]]:
    """Read the job's history from its nodes, draw its chart here, and keep it with the
    job's record on its head node and in the bucket. (local path or None, what to say)."""
    report = run_steps(
        c,
        fleet,
        "history",
        [history_step],
        tasks=(JobRef(row.spec),),
        console=None,
        connect_timeout=connect_timeout,
    )
    answers: dict[int, Mapping[str, Any]] = {}
    for h in report.hosts:
        for s in h.steps:
            if s.name == "history" and "history" in s.result.details:
                answers[int(s.result.details["node_rank"])] = s.result.details["history"]
    notes = host_problems(report)
    history = history_of(row.job, row.name, answers)
    if history.empty:
        return None, [*notes, f"chart: no samples or events recorded for {row.job} yet"]
    # The same history as the chart drawn last, and kept everywhere then: nothing to draw
    # (matplotlib, 2-4 s) or send again, as for each `fab logs` of an ended job.
    path = chart_path(row.job)
    drawn = history_digest(row, answers)
    stamp = path.with_name(path.name + ".sha256")
    if not notes and path.is_file() and _read(stamp) == drawn:
        return path, ["chart unchanged since it was drawn and kept with the job: not redrawn"]
    stamp.unlink(missing_ok=True)
    fig = job_figure(history)
    path = save_chart(fig, path)
    kept = run_steps(
        c,
        fleet,
        "chart",
        [chart_step],
        tasks=(JobRef(row.spec), ChartKeep(path.read_bytes(), CHART_NAME)),
        console=None,
        connect_timeout=connect_timeout,
    )
    every_node = not notes  # the history round's problems are all the notes so far
    for h in kept.hosts:
        for s in h.steps:
            if s.name == "chart" and s.result.status.value != "skipped":
                notes.append(f"chart on {h.host.label}: {s.result.message}")
    problems = host_problems(kept)  # a failed upload is one
    notes += problems
    if every_node and not problems:  # drawn from every node, kept on the head and in the bucket
        stamp.write_text(drawn + "\n")
    return path, notes


def history_digest(row: JobRow, answers: Mapping[int, Any]) -> str:
    """sha256 of what a job's chart is drawn from: its id, name and each node's history."""
    doc = {"job": row.job, "name": row.name, "nodes": {str(k): answers[k] for k in answers}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
