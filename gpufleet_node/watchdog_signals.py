"""What holds a node besides its samples: the lease (file and tag), protection, the
``fab train`` jobs' state files, and what could not be read (which counts as activity).

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import fleet_names as names
from . import idle_rules
from .watchdog_config import Config

LEASE_FILE = "keep-alive-until"
# fab health --quarantine marks a failed node kept for its replacement (verify_health.py
# writes it): the watchdog holds it as it holds an unreadable lease, within the same caps.
QUARANTINE_FILE = "health/quarantine.json"


@dataclass(frozen=True)
class Signals:
    """Everything besides the GPU/SSH samples that decides a run, gathered in one place
    (:meth:`Watchdog.gather_signals`). A new kind of activity (a job's own heartbeat, say)
    belongs there: it either holds the node like a lease does (``lease``) or is reported as
    unreadable (``problems``), which counts as activity until the hard TTL."""

    protected: bool
    lease: idle_rules.Lease
    limits: idle_rules.Limits
    problems: tuple[str, ...] = ()  # what could not be read: logged, published in status
    jobs: idle_rules.Jobs = field(default_factory=idle_rules.Jobs)  # fab train jobs (read_jobs)


def _pid_runs(pid: int, name: bytes) -> bool:
    try:
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists, or there is no /proc to tell: an unknown counts as active
    return name in cmd


def _current_boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _supervised(st: dict[str, Any], current_boot: str) -> bool:
    """A starting/running state whose supervisor lives, in this boot."""
    same_boot = not st.get("boot_id") or not current_boot or st["boot_id"] == current_boot
    return same_boot and _pid_runs(int(st.get("pid") or 0), b"gpufleet_node.job_runner")


def running_job_folders(jobs_dir: Path) -> list[Path]:
    """The node folders (``<job>/node-<R>``) of the jobs that run here now: where this
    run's samples go, for the job's chart."""
    current_boot = _current_boot()
    found = []
    for path in sorted(jobs_dir.glob("*/node-*/state.json")) if jobs_dir.is_dir() else []:
        try:
            st = json.loads(path.read_text())
            active = str(st["state"]) in ("starting", "running")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: read_jobs counts it as activity; no chart for it
        if active and _supervised(st, current_boot):
            found.append(path.parent)
    return found


def read_jobs(jobs_dir: Path, boot: dt.datetime) -> tuple[idle_rules.Jobs, list[str]]:
    """This node's ``fab train`` jobs from their state files (the job runner's contract): a
    job runs while its state is starting/running in this boot and its supervisor lives."""
    current_boot = _current_boot()
    running, problems = 0, []
    ended: list[dt.datetime] = []
    stop_when_done: str | None = None
    for path in sorted(jobs_dir.glob("*/node-*/state.json")) if jobs_dir.is_dir() else []:
        try:
            st = json.loads(path.read_text())
            state = str(st["state"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            running += 1  # an unreadable signal counts as activity
            problems.append(f"job state {path} unreadable ({exc.__class__.__name__})")
            continue
        if state in ("starting", "running"):
            if _supervised(st, current_boot):
                running += 1
            continue
        try:
            end = idle_rules.parse_utc(str(st.get("ended_at") or ""))
        except ValueError:
            continue
        if end >= boot:
            ended.append(end)
            if st.get("stop_when_done") and not st.get("syncing"):
                stop_when_done = str(st.get("job"))
    jobs = idle_rules.Jobs(running, max(ended) if ended else None, stop_when_done)
    return jobs, problems


def merge_leases(leases: Sequence[idle_rules.Lease], now: dt.datetime) -> idle_rules.Lease:
    """The lease that holds: the latest valid one; else an error if any was unreadable."""
    cap = now + dt.timedelta(hours=idle_rules.MAX_LEASE_HOURS)
    valid = [lease.until for lease in leases if lease.until and now < lease.until <= cap]
    if valid:
        return idle_rules.Lease(until=max(valid))
    errors = [lease.error for lease in leases if lease.error]
    if errors:
        return idle_rules.Lease(error="; ".join(errors))
    ends = [lease.until for lease in leases if lease.until]
    return idle_rules.Lease(until=max(ends)) if ends else idle_rules.Lease()


def is_protected(tags: dict[str, str]) -> bool:
    """As the reaper reads it: protected unless the tag clearly says no (an unknown value
    such as "on" or "maybe" holds the node too)."""
    return names.is_protected(tags.get(names.PROTECTED, ""))


def read_lease(state_dir: Path) -> idle_rules.Lease:
    path = state_dir / LEASE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return idle_rules.Lease()
    except OSError as exc:
        return idle_rules.Lease(error=f"{path}: {exc}")
    return idle_rules.Lease.parse(text)


def read_quarantine(state_dir: Path) -> idle_rules.Lease:
    """A hold while the node is quarantined (an error lease: kept, not for ever)."""
    path = state_dir / QUARANTINE_FILE
    if not path.exists():
        return idle_rules.Lease()
    return idle_rules.Lease(error=f"quarantined for replacement by fab health ({path})")


def write_lease(
    config: Config, hours: float, now: dt.datetime, tagger: Callable[[str], None] | None
) -> dict[str, Any]:
    """The lease file (what this watchdog reads) and the instance tag (what the reaper reads)."""
    if not 0 < hours <= idle_rules.MAX_LEASE_HOURS:
        raise ValueError(
            f"--hours must be more than 0 and at most {idle_rules.MAX_LEASE_HOURS}, got {hours}"
        )
    until = idle_rules.format_utc(now + dt.timedelta(hours=hours))
    path = Path(config.state_dir) / LEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(until + "\n")
    out: dict[str, Any] = {"lease_until": until, "file": str(path), "tag": "not set"}
    if tagger is not None:
        try:
            tagger(until)
            out["tag"] = "set"
        except Exception as exc:  # the file alone still keeps this node's watchdog away
            out["tag"] = f"failed: {exc}"
    return out
