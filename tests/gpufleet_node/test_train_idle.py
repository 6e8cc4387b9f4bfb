"""Idle guards that understand ``fab train`` jobs, on a simulated clock: a running job keeps
its node busy, a stalled one does not, the idle clock starts when the job ends, and
``--stop-when-done`` stops the node once the job is over (the watchdog still saves scratch
first). The watchdog reads the job runner's state files (docs/train.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import idle_rules as policy
from tests.gpufleet_node.test_watchdog import (
    BOOT,
    Timeline,
    make_dog,
    wd,
    wsignals,
)

LIMITS = policy.Limits(idle_minutes=15, ttl_hours=24)


def samples(start: float, end: float, *, util: float = 0.0, procs: int = 0) -> list[Any]:
    """One sample a minute from ``start`` to ``end`` minutes after boot."""
    return [
        policy.Sample(BOOT + timedelta(minutes=m), (util,), procs, 0)
        for m in range(int(start), int(end) + 1)
    ]


def at(minutes: float) -> datetime:
    return BOOT + timedelta(minutes=minutes)


def decide(end: float, jobs: Any, **kw: Any) -> Any:
    return policy.decide_node(
        samples(40, end, **kw), now=at(end), boot_time=BOOT, limits=LIMITS, jobs=jobs
    )


def test_a_running_job_keeps_a_node_busy_even_with_the_gpus_idle() -> None:
    d = decide(200, policy.Jobs(running=1))
    assert d.action == policy.KEEP and "1 running job(s)" in d.reason
    assert decide(200, policy.Jobs()).stop  # the same node without the job is long idle


def test_a_stalled_job_is_not_busy_it_holds_gpu_memory_at_no_utilization() -> None:
    d = decide(40 + 71, policy.Jobs(running=1), util=1.0, procs=2)
    assert d.stop and "stalled job" in d.reason


def test_the_idle_clock_starts_when_the_job_ends() -> None:
    ended = policy.Jobs(ended_at=at(190))
    d = decide(200, ended)
    assert d.action == policy.KEEP and d.idle_minutes == pytest.approx(10)
    assert decide(206, ended).stop  # 16 minutes after the job ended


def test_stop_when_done_stops_at_once_unless_protected_or_leased() -> None:
    done = policy.Jobs(ended_at=at(50), stop_when_done="lm-1")
    d = decide(51, done)
    assert d.stop and "lm-1 ended and asked --stop-when-done" in d.reason
    still = policy.Jobs(running=1, ended_at=at(50), stop_when_done="lm-1")
    assert not decide(51, still).stop  # another job still runs
    lease = policy.Lease(until=at(120))
    kept = policy.decide_node(
        samples(40, 51), now=at(51), boot_time=BOOT, limits=LIMITS, jobs=done, lease=lease
    )
    assert not kept.stop and "lease" in kept.reason
    safe = policy.decide_node(
        samples(40, 51), now=at(51), boot_time=BOOT, limits=LIMITS, jobs=done, protected=True
    )
    assert not safe.stop


# ---------------------------------------------------------------------------- state files


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[int]:
    """A live process that looks like the job runner's supervisor."""
    # `python -m gpufleet_node.job_runner supervise`, as job_runner.py's detach starts it
    package = tmp_path / "bin" / "gpufleet_node"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "job_runner.py").write_text("import time\ntime.sleep(300)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet_node.job_runner", "supervise"], cwd=package.parent
    )
    # Between fork and exec the child still shows the parent's command line: wait (bounded)
    # until it is the "supervisor", or a loaded machine reads it as some other process.
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(500):
        if b"gpufleet_node.job_runner" in cmdline.read_bytes():
            break
        time.sleep(0.01)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def write_state(jobs: Path, job: str, **state: Any) -> Path:
    path = jobs / job / "node-0" / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"job": job, "node_rank": 0, **state}))
    return path


def test_the_watchdog_reads_running_ended_stale_and_unreadable_job_states(
    tmp_path: Path, supervisor: int
) -> None:
    jobs = tmp_path / "jobs"
    fmt = wd.idle_rules.format_utc
    write_state(jobs, "live", state="running", pid=supervisor, boot_id=boot_id())
    write_state(jobs, "killed", state="running", pid=999_999_999, boot_id=boot_id())
    write_state(jobs, "old-boot", state="running", pid=supervisor, boot_id="another-boot")
    write_state(jobs, "done", state="succeeded", ended_at=fmt(at(90)), stop_when_done=True)
    write_state(jobs, "before-boot", state="failed", ended_at=fmt(at(-60)))
    (jobs / "broken" / "node-0").mkdir(parents=True)
    (jobs / "broken" / "node-0" / "state.json").write_text('{"state": "runn')
    seen, problems = wsignals.read_jobs(jobs, BOOT)
    # The live one, and the unreadable one (an unreadable signal counts as activity).
    assert seen.running == 2
    assert seen.ended_at == at(90) and seen.stop_when_done == "done"
    assert len(problems) == 1 and "broken" in problems[0]
    assert wsignals.read_jobs(tmp_path / "none", BOOT) == (wd.idle_rules.Jobs(), [])


def test_watchdog_loop_keeps_a_node_while_its_job_runs_and_stops_15_min_after(
    tmp_path: Path, supervisor: int
) -> None:
    jobs = tmp_path / "jobs"
    dog, probe, rec = make_dog(tmp_path, Timeline(), jobs_dir=str(jobs))
    fmt = wd.idle_rules.format_utc
    while probe.minutes < 200 and not rec.poweroffs():
        if probe.minutes < 90:  # a CPU-only job: no GPU use, no SSH, only the job
            write_state(jobs, "lm", state="running", pid=supervisor, boot_id=boot_id())
        else:
            write_state(jobs, "lm", state="succeeded", ended_at=fmt(at(90)))
        dog.run_once()
        probe.sleep(15)
    (off,) = rec.poweroffs()
    assert 104.5 <= off <= 107  # job end (90) + the A100 tier's 15 idle minutes
    assert [e for e, _ in rec.events][-2].startswith("sync")  # scratch saved first


def test_stop_when_done_powers_off_right_after_the_job_and_its_sync(
    tmp_path: Path, supervisor: int
) -> None:
    jobs = tmp_path / "jobs"
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 90.0), jobs_dir=str(jobs))
    fmt = wd.idle_rules.format_utc
    while probe.minutes < 200 and not rec.poweroffs():
        if probe.minutes < 60:
            write_state(jobs, "lm", state="running", pid=supervisor, boot_id=boot_id())
        else:
            write_state(jobs, "lm", state="succeeded", ended_at=fmt(at(60)), stop_when_done=True)
        dog.run_once()
        probe.sleep(15)
    (off,) = rec.poweroffs()
    # The GPU still looked busy (its last samples), yet the finished job's wish wins.
    assert 60 <= off <= 62.5
    assert (
        "stop-when-done"
        in json.loads((tmp_path / "state" / "watchdog-state.json").read_text())["last_decision"][
            "reason"
        ]
    )


def test_the_watchdog_keeps_each_running_jobs_gpu_samples_in_its_node_folder(
    tmp_path: Path, supervisor: int
) -> None:
    """The samples a run takes go to the job's own folder too (its chart reads them);
    a job that ended, or whose supervisor is gone, gets none."""
    jobs = tmp_path / "jobs"
    dog, probe, _ = make_dog(
        tmp_path, Timeline(util=lambda m: 80.0 if m < 40 else 30.0), jobs_dir=str(jobs)
    )
    write_state(jobs, "lm", state="running", pid=supervisor, boot_id=boot_id())
    write_state(jobs, "killed", state="running", pid=999_999_999, boot_id=boot_id())
    write_state(jobs, "done", state="succeeded", ended_at="2026-03-01T08:10:00Z")
    for _ in range(3):
        dog.run_once()
        probe.sleep(15)
    path = jobs / "lm" / "node-0" / "gpu-samples.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3 * 4  # every sample of every run (4 a run)
    assert lines[0] == {"at": "2026-03-01T08:31:00Z", "gpu_util": [80.0, 0.0], "gpu_mem": 40.0}
    assert [line["at"] for line in lines] == sorted(line["at"] for line in lines)
    assert not (jobs / "killed" / "node-0" / "gpu-samples.jsonl").exists()
    assert not (jobs / "done" / "node-0" / "gpu-samples.jsonl").exists()
