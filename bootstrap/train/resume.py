"""``fab train --resume``: which recorded job to rerun, and whether it has anything to
resume from.

Each refusal is a TrainError with one line, raised before anything starts on a node.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from invoke import Context
from rich.console import Console

from bootstrap.fleet.hosts import Fleet
from bootstrap.train.jobs import find_job
from bootstrap.train.runs import collect_jobs, job_hosts, warn_unreachable
from bootstrap.train.spec import JOBS_ROOT, TrainError
from bootstrap.train.steps import nothing_to_restore, restorable_line
from bootstrap.train.workdir import build_manifest, workdir_files


def job_to_resume(
    c: Context,
    fleet: Fleet,
    resume: str,
    jobs_dir: str,
    max_workdir_mb: float,
    timeout: float,
    rerun: bool = False,
) -> tuple[Mapping[str, Any], Fleet, dict[str, list[Any]] | None, int] | None:
    """The recorded job ``--resume`` names (``auto``: the newest interrupted one), the hosts
    it ran on, its workdir's manifest when the workdir is still here and the attempt its
    nodes last ran (a resume whose restore failed wrote the next one's job.json, not its
    state); None: nothing to resume. Refuses, before anything starts, a job still running
    or a host list without its nodes."""
    rows, report = collect_jobs(c, fleet, jobs_dir or JOBS_ROOT, timeout)
    if report.failed_hosts:
        warn_unreachable(report)
        raise TrainError("cannot resume: not every node answered (see above); nothing started")
    if resume == "auto":
        stopped = [r for r in rows if r.state == "interrupted"]
        if not stopped:
            return None
        row = stopped[-1]
    else:
        row = find_job(rows, resume)
    if row.state in ("running", "starting"):
        raise TrainError(f"job {row.job} is {row.state}: `fab cancel {row.job}` first")
    if row.state == "succeeded" and not rerun:
        raise TrainError(
            f"job {row.job} already succeeded: nothing to resume (--rerun runs it again)"
        )
    old = row.spec
    fleet = job_hosts(fleet, old)
    if len(fleet.hosts) != int(old.get("nnodes") or 1):
        raise TrainError(
            f"job {row.job} ran on {old.get('nnodes')} node(s); {len(fleet.hosts)} of them "
            "are in this host list: give the job's hosts (fab jobs shows them)"
        )
    manifest = None
    local = Path(str(old.get("local_workdir") or ""))
    if local.is_dir():
        manifest = build_manifest(local, workdir_files(local), max_workdir_mb * 1e6)
    return old, fleet, manifest, row.attempt


def check_restorable(
    old: Mapping[str, Any],
    found: Mapping[str, Any] | None,
    from_scratch: bool,
    console: Console,
) -> None:
    """Refuse a resume with nothing to restore (no checkpoint on the head, none complete in
    the bucket) unless ``from_scratch``: it would start from step 0 and call it resumed.
    ``found``: what the head's resume-check said (run with train-check, in its round
    trips), None when the head did not answer."""
    if found is None:
        raise TrainError(f"job {old['job']}: cannot tell what to resume from: nothing started")
    if not nothing_to_restore(found):
        return
    said = restorable_line(found)
    if not from_scratch:
        raise TrainError(
            f"job {old['job']}: nothing to restore ({said}); --from-scratch starts it "
            "again from step 0"
        )
    console.print(
        f"gpufleet: job {old['job']}: nothing to restore ({said}): starting from step 0 "
        "(--from-scratch)",
        highlight=False,
        soft_wrap=True,
    )
