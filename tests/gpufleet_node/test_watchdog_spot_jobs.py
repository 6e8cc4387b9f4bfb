"""A spot interruption notice reaches the running jobs too: besides saving scratch, the
watchdog asks each running job's supervisor to push its checkpoint folder now (a
``sync-now`` file in the job's node folder, which the supervisor takes within seconds;
tests/gpufleet_node/test_checkpoint_resume.py has its side), with the spot sync's
budget, before its own sync starts; once per run that sees the notice, as its scratch save."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet_node import job_runner
from tests.gpufleet_node.test_watchdog import Timeline, make_dog, wd
from tests.gpufleet_node.test_watchdog_ttl import job_folder

BUSY = Timeline(util=lambda m: 95.0, procs=lambda m: 1)
NOTICE = json.dumps({"action": "terminate", "time": "2026-12-05T08:40:00Z"})


class SpotCloud:
    """The node cloud's spot notice, as its metadata service would answer it."""

    def __init__(self) -> None:
        self.notice: str | None = None

    def spot_notice(self) -> str | None:
        return self.notice


def test_a_spot_notice_asks_each_running_job_to_push_its_checkpoints_before_the_scratch_sync(
    tmp_path: Path,
) -> None:
    dog, _probe, rec = make_dog(tmp_path, BUSY)
    folder = job_folder(tmp_path)
    other = job_folder(tmp_path / "second")
    dog._job_folders = lambda: [folder, other]
    cloud = SpotCloud()
    dog.cloud = cloud
    seen_at_sync: list[bool] = []
    inner = dog.syncer.sync

    def sync(timeout_s: float) -> object:
        seen_at_sync.append((folder / wd.JOB_SYNC_NOW_FILE).exists())
        return inner(timeout_s)

    dog.syncer.sync = sync
    dog.run_once()
    assert not (folder / wd.JOB_SYNC_NOW_FILE).exists() and not rec.syncs()
    cloud.notice = NOTICE
    dog.run_once()
    for f in (folder, other):
        doc = json.loads((f / wd.JOB_SYNC_NOW_FILE).read_text())
        assert doc["why"] == f"spot interruption notice {NOTICE}"
        assert doc["budget_s"] == wd.SPOT_SYNC_S  # the spot sync's own budget
        assert not (f / f".{wd.JOB_SYNC_NOW_FILE}.tmp").exists()  # written whole
    assert seen_at_sync == [True]  # the jobs were asked first
    assert len(rec.syncs()) == 1 and not rec.poweroffs()
    # The same notice, once saved, asks nothing again.
    (folder / wd.JOB_SYNC_NOW_FILE).unlink()
    dog.run_once()
    assert not (folder / wd.JOB_SYNC_NOW_FILE).exists() and len(rec.syncs()) == 1


def test_a_job_folder_that_cannot_be_written_does_not_stop_the_spot_sync(tmp_path: Path) -> None:
    dog, _probe, rec = make_dog(tmp_path, BUSY)
    dog._job_folders = lambda: [tmp_path / "gone" / "node-0"]  # removed since it was listed
    dog.cloud = SpotCloud()
    dog.cloud.notice = NOTICE
    dog.run_once()
    assert len(rec.syncs()) == 1


def test_the_watchdog_and_the_supervisor_name_the_same_file() -> None:
    assert wd.JOB_SYNC_NOW_FILE == job_runner.SYNC_NOW_FILE
