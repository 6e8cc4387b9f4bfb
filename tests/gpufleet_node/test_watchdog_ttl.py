"""The watchdog's warnings before the hard TTL, on a simulated clock across timer runs: the
journal (``warn``) and each running job's rank logs get one line at 60 min and one at 10 min
before the stop, never one per run; a lease that moves the stop re-arms them; a late first
run says the nearer one only; and ``state.ttl`` records the stop time `fab status` shows."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.gpufleet_node.test_watchdog import (
    BOOT,
    FakeProbe,
    Recorder,
    Timeline,
    make_dog,
    wd,
    wsignals,
    wstate,
)

BUSY = Timeline(util=lambda m: 95.0, procs=lambda m: 1)


def job_folder(tmp_path: Path, nproc: int = 2) -> Path:
    """A job's folder on this node (node rank 0) with its rank logs started."""
    job = tmp_path / "jobs" / "run-1"
    (job / "node-0").mkdir(parents=True)
    (job / "logs").mkdir()
    (job / "job.json").write_text(json.dumps({"job": "run-1", "nproc_per_node": nproc}))
    for rank in range(nproc):
        (job / "logs" / f"rank-{rank}.log").write_text(f"rank {rank} step 1\n")
    return job / "node-0"


def timer_runs(
    tmp_path: Path, probe: FakeProbe, rec: Recorder, until_min: float, **config: Any
) -> Any:
    """The systemd timer's runs, each by a fresh Watchdog (a new process: only the state
    file carries over), until power-off or ``until_min``; the last dog."""
    dog = None
    folder = tmp_path / "jobs" / "run-1" / "node-0"
    while probe.minutes < until_min:
        dog, _, _ = make_dog(tmp_path, probe.timeline, **config)
        dog.probe, dog.warn = probe, rec.warnings.append
        dog.poweroff = lambda: rec.events.append(("poweroff", probe.minutes))
        dog._job_folders = lambda: [folder] if folder.is_dir() else []
        dog.run_once()
        if rec.poweroffs():
            break
        probe.sleep(15)
    return dog


def minutes_left(line: str) -> int:
    found = re.search(r"\(in (\d+) min\)", line)
    assert found, line
    return int(found[1])


def ttl_warnings(rec: Recorder) -> list[str]:
    return [w for w in rec.warnings if "hard TTL" in w or "lease ends" in w]


def test_a_busy_job_is_warned_once_at_60_and_once_at_10_minutes_then_stopped(
    tmp_path: Path,
) -> None:
    folder = job_folder(tmp_path)
    probe, rec = FakeProbe(BUSY, clock=BOOT + timedelta(minutes=100)), Recorder()
    dog = timer_runs(tmp_path, probe, rec, 4 * 60, ttl_hours=3)
    off = rec.poweroffs()
    assert off and 180 <= off[0] <= 181.5  # the TTL stops it, busy as it is
    said = ttl_warnings(rec)
    assert len(said) == 2, said  # about 80 runs, two lines
    assert 58 <= minutes_left(said[0]) <= 60 and 8 <= minutes_left(said[1]) <= 10
    assert "2026-03-01T11:00:00Z" in said[0] and "`fab keep-alive --hours N`" in said[0]
    assert "N <= 336" in said[0]
    for rank in (0, 1):
        log = (folder.parent / "logs" / f"rank-{rank}.log").read_text().splitlines()
        lines = [ln for ln in log if "gpufleet watchdog" in ln]
        assert len(lines) == 3, log  # 60 min, 10 min, and the stop itself
        assert lines[0].endswith(said[0]) and lines[1].endswith(said[1])
        assert "hard TTL 3 h reached" in lines[2] and "stopping this node now" in lines[2]
        assert log[0] == f"rank {rank} step 1"  # the job's own lines are kept
    ttl = wstate.State.load(dog.state_path).ttl
    assert ttl["stop_at"] == (BOOT + timedelta(hours=3)).isoformat()
    assert (ttl["why"], ttl["ttl_hours"], ttl["warned"]) == ("ttl", 3.0, [60.0, 10.0])


def test_a_lease_that_moves_the_stop_rearms_both_warnings_for_the_new_time(
    tmp_path: Path,
) -> None:
    probe, rec = FakeProbe(BUSY, clock=BOOT + timedelta(minutes=110)), Recorder()
    dog = timer_runs(tmp_path, probe, rec, 150, ttl_hours=3)
    assert len(ttl_warnings(rec)) == 1  # the 60-minute one
    wsignals.write_lease(dog.config, 2, probe.now(), None)  # fab keep-alive --hours 2
    timer_runs(tmp_path, probe, rec, 6 * 60, ttl_hours=3)
    said = ttl_warnings(rec)
    assert len(said) == 3, said  # one for the old stop, then both again for the new one
    assert "the lease ends at 2026-03-01T12:30" in said[2] and 8 <= minutes_left(said[2]) <= 10
    assert 58 <= minutes_left(said[1]) <= 60
    off = rec.poweroffs()
    assert off and 270 <= off[0] <= 271.5


def test_a_first_run_inside_the_last_10_minutes_says_only_the_nearer_warning(
    tmp_path: Path,
) -> None:
    probe, rec = FakeProbe(BUSY, clock=BOOT + timedelta(minutes=175)), Recorder()
    timer_runs(tmp_path, probe, rec, 4 * 60, ttl_hours=3)
    said = ttl_warnings(rec)
    assert len(said) == 1 and 3 <= minutes_left(said[0]) <= 5


def test_jitter_in_the_boot_time_between_runs_does_not_repeat_a_warning(
    tmp_path: Path,
) -> None:
    probe, rec = FakeProbe(BUSY, clock=BOOT + timedelta(minutes=115)), Recorder()
    jitter = iter([0, 1, -1, 2] * 100)

    class Jittery(FakeProbe):
        def boot_time(self) -> Any:
            return BOOT + timedelta(seconds=next(jitter))

    probe = Jittery(BUSY, clock=probe.clock)
    timer_runs(tmp_path, probe, rec, 160, ttl_hours=3)
    assert len(ttl_warnings(rec)) == 1


def test_no_ttl_means_no_warning_and_a_state_that_says_off(tmp_path: Path) -> None:
    probe, rec = FakeProbe(BUSY, clock=BOOT + timedelta(hours=23)), Recorder()
    dog = timer_runs(tmp_path, probe, rec, 25 * 60, ttl_hours=0)
    assert not rec.poweroffs() and not ttl_warnings(rec)
    ttl = wstate.State.load(dog.state_path).ttl
    assert (ttl["stop_at"], ttl["why"], ttl["ttl_hours"]) == (None, "off", None)


def test_the_warning_text_names_the_stop_and_the_way_to_extend() -> None:
    stop = wd.idle_rules.TtlStop(BOOT + timedelta(hours=24), "ttl", 24.0)
    text = wd.ttl_warning(stop, 59.6)
    assert text.startswith("the hard TTL (24 h) is reached at 2026-03-02T08:00:00Z (in 60 min)")
    assert "even mid-job" in text and "`fab keep-alive --hours N` (N <= 336)" in text
