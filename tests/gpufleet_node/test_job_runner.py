"""The job runner's resume check and cancel, in process, against a moto S3 bucket.

``restorable`` is what ``fab train --resume`` asks the head before anything starts;
``cancel --s3-endpoint`` saves to the endpoint it is given when the supervisor is gone.
Its units: the systemd unit's argv, and how a state file reads after a crash or reboot.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_runner
from tests.support.sshd import free_port

BUCKET = "gpufleet-runner-test"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3(url: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1")


@pytest.fixture
def bucket(moto_url: str) -> Iterator[Any]:
    client = s3(moto_url)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def recorded_job(tmp_path: Path, endpoint: str, *, bucket: str = BUCKET) -> Path:
    """A job folder as a finished attempt leaves it: job.json and an interrupted state."""
    job_dir = tmp_path / "jobs" / "j1"
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    ckpt.mkdir(parents=True)
    (job_dir / "node-0").mkdir(parents=True)
    spec = {
        "job": "j1",
        "nnodes": 1,
        "nproc_per_node": 1,
        "checkpoint_dir": str(ckpt),
        "bucket": bucket,
        "bucket_prefix": "checkpoints/n0/j1/" if bucket else "",
        "sync_node": "n0",
        "provider": "aws",
        "region": "us-east-1",
        "s3_endpoint": endpoint,
        "env": {},
    }
    (job_dir / "job.json").write_text(json.dumps(spec))
    state = {"state": "running", "pid": 2**22 + 1, "boot_id": job_runner.boot_id()}
    (job_dir / "node-0" / "state.json").write_text(json.dumps(state))
    return job_dir


def marker(step: int) -> str:
    return json.dumps({"step": step, "files": {"model.pt": 10}})


def checkpoint(root: Path, step: int) -> None:
    folder = root / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"w" * 10)
    (folder / "COMPLETE").write_text(marker(step))


def test_a_job_with_no_checkpoint_anywhere_has_nothing_to_restore(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    out = job_runner.restorable(recorded_job(tmp_path, moto_url))
    assert out["ok"] and out["local_files"] == 0 and out["bucket_step"] is None
    assert out["bucket"] == f"{BUCKET}/checkpoints/n0/j1/"


def test_the_resume_check_reports_the_newest_version_without_downloading_it(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    job_dir = recorded_job(tmp_path, moto_url)
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    checkpoint(ckpt, 3)
    assert job_runner.Supervisor(job_dir, 0).sync(final=True)["ok"]  # type: ignore[index]
    shutil.rmtree(ckpt)
    ckpt.mkdir()
    out = job_runner.restorable(job_dir)
    assert out["version"] == {"seq": 1, "step": 3, "files": 2, "bytes": len(marker(3)) + 10}
    assert (out["bucket_step"], out["bucket_files"], out["local_files"]) == (3, 2, 0)
    assert not list(ckpt.iterdir())


def test_without_a_bucket_the_node_s_own_files_are_what_a_resume_reuses(tmp_path: Path) -> None:
    job_dir = recorded_job(tmp_path, "", bucket="")
    (tmp_path / "scratch" / "checkpoints" / "j1" / "snapshot.pt").write_bytes(b"s")
    out = job_runner.restorable(job_dir)
    assert out == {**out, "ok": True, "local_files": 1, "bucket": None, "bucket_step": None}


def test_an_unreachable_bucket_is_an_error_not_nothing_to_restore(tmp_path: Path) -> None:
    out = job_runner.restorable(recorded_job(tmp_path, f"http://127.0.0.1:{free_port()}"))
    assert out["ok"] is False and out["error"].startswith(f"cannot list {BUCKET}/")


def test_cancel_saves_to_the_endpoint_it_is_given_when_the_supervisor_is_gone(
    tmp_path: Path, bucket: Any, moto_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The job was started against an endpoint that is gone; cancel is told the right one.
    job_dir = recorded_job(tmp_path, f"http://127.0.0.1:{free_port()}")
    checkpoint(tmp_path / "scratch" / "checkpoints" / "j1", 7)
    argv = ["cancel", "--job-dir", str(job_dir), "--wait", "1", "--s3-endpoint", moto_url]
    assert job_runner.main(argv) == 0  # as fab cancel --s3-endpoint runs it
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["state"]["state"] == "cancelled"
    assert out["state"]["final_sync"]["ok"] is True, out
    keys = [o["Key"] for o in bucket.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "checkpoints/n0/j1/.gpufleet/versions/00000001.json" in keys
    assert out["state"]["final_sync"]["newest_step"] == 7


def test_cancelling_a_job_that_ended_changes_nothing_and_says_so(tmp_path: Path) -> None:
    job_dir = recorded_job(tmp_path, "", bucket="")
    state_path = job_dir / "node-0" / "state.json"
    state_path.write_text(json.dumps({"state": "succeeded", "ended_at": "2026-01-01T00:00:00Z"}))
    out = job_runner.cancel(job_dir, 0, 1.0)
    assert out["changed"] is False and out["note"] == "already succeeded"
    assert json.loads(state_path.read_text())["state"] == "succeeded"


# ---------------------------------------------------------------------------- any layout


def snapshot_job(tmp_path: Path, moto_url: str) -> tuple[Path, Path]:
    """A job that saves as most scripts do: one torch.save file, no step-<N> folders."""
    job_dir = recorded_job(tmp_path, moto_url)
    spec = json.loads((job_dir / "job.json").read_text())
    (job_dir / "job.json").write_text(json.dumps({**spec, "resume": True}))
    ckpt = Path(spec["checkpoint_dir"])
    (ckpt / "snapshot.pt").write_bytes(b"epoch 3 weights")
    (ckpt / "logs").mkdir()
    (ckpt / "logs" / "loss.csv").write_text("1,0.9\n2,0.7\n")
    return job_dir, ckpt


def test_a_push_writes_the_version_manifest_last_with_every_file_and_digest(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    job_dir, _ = snapshot_job(tmp_path, moto_url)
    out = job_runner.Supervisor(job_dir, 0).sync(final=True)
    assert out is not None and out["ok"] and out["version"] == 1, out
    key = "checkpoints/n0/j1/.gpufleet/versions/00000001.json"
    files = json.loads(bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read())["files"]
    assert {k: v["size"] for k, v in files.items()} == {"snapshot.pt": 15, "logs/loss.csv": 12}


def test_an_upload_that_failed_writes_no_manifest(tmp_path: Path, bucket: Any) -> None:
    job_dir, _ = snapshot_job(tmp_path, f"http://127.0.0.1:{free_port()}")
    out = job_runner.Supervisor(job_dir, 0).sync(final=True)
    assert out is not None and not out["ok"]
    assert "Contents" not in bucket.list_objects_v2(Bucket=BUCKET)


def test_a_plain_torch_save_folder_comes_back_on_an_empty_node(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    # Issue 24: the bucket held snapshot.pt, yet the resume trained from epoch 0.
    job_dir, ckpt = snapshot_job(tmp_path, moto_url)
    assert job_runner.Supervisor(job_dir, 0).sync(final=True)["ok"]  # type: ignore[index]
    for path in sorted(ckpt.rglob("*"), reverse=True):  # a stop wiped the instance store
        path.rmdir() if path.is_dir() else path.unlink()
    found = job_runner.restorable(job_dir)
    assert (found["local_files"], found["bucket_step"], found["bucket_files"]) == (0, None, 2)
    out = job_runner.Supervisor(job_dir, 0).restore()
    assert out["ok"] and (out["version"], out["fetched"], out["kept"]) == (1, 2, 0), out
    assert (ckpt / "snapshot.pt").read_bytes() == b"epoch 3 weights"
    assert (ckpt / "logs" / "loss.csv").read_text() == "1,0.9\n2,0.7\n"
    assert sorted(p.name for p in ckpt.iterdir()) == ["logs", "snapshot.pt"]
    saved = json.loads((job_dir / "node-0" / "restore.json").read_text())
    assert saved["attempt"] == 1 and saved["version"] == 1


def test_a_local_file_that_differs_from_the_version_is_set_aside_not_lost(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    job_dir, ckpt = snapshot_job(tmp_path, moto_url)
    assert job_runner.Supervisor(job_dir, 0).sync(final=True)["ok"]  # type: ignore[index]
    (ckpt / "snapshot.pt").write_bytes(b"epoch 4, never pushed")
    out = job_runner.Supervisor(job_dir, 0).restore()
    assert out["ok"] and (out["fetched"], out["kept"]) == (1, 1), out
    assert (ckpt / "snapshot.pt").read_bytes() == b"epoch 3 weights"
    assert (Path(out["aside"]) / "snapshot.pt").read_bytes() == b"epoch 4, never pushed"


# ---------------------------------------------------------------------------- follow


def test_following_a_resume_shows_this_attempt_not_the_earlier_ones_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir = recorded_job(tmp_path, "", bucket="")
    logs = job_dir / "logs"
    logs.mkdir()
    earlier = "gpufleet: rank 0 attempt 1\nepoch 0 done\nepoch 1 done\n"
    (logs / "rank-0.log").write_text(earlier + "gpufleet: rank 0 attempt 2\nResuming at 2\n")
    state = {"state": "succeeded", "log_offsets": {"0": len(earlier)}}
    (job_dir / "node-0" / "state.json").write_text(json.dumps(state))
    job_runner.follow(job_dir, [0], keep_following=False, this_attempt_of=0)
    assert (
        capsys.readouterr().out == "[rank 0] gpufleet: rank 0 attempt 2\n[rank 0] Resuming at 2\n"
    )
    job_runner.follow(job_dir, [0], keep_following=False)  # fab logs: every attempt
    assert capsys.readouterr().out.startswith("[rank 0] gpufleet: rank 0 attempt 1\n")


# ---------------------------------------------------------------------------- units


def test_systemd_unit_runs_the_supervisor_as_the_user_and_outlives_ssh() -> None:
    argv = job_runner.systemd_argv(Path("/jobs/j1"), 0, "j1", sudo=True)
    assert argv[:3] == ["sudo", "-n", "systemd-run"]
    assert "--unit=gpufleet-job-j1-n0" in argv and "--collect" in argv
    assert any(a.startswith("--uid=") for a in argv)
    assert argv[-3:] == ["supervise", "--job-dir=/jobs/j1", "--node-rank=0"]


def test_state_files_of_a_dead_supervisor_or_another_boot_read_as_interrupted() -> None:
    st = {"state": "running", "boot_id": "b1"}
    assert job_runner.effective_state(st, alive=True, current_boot="b1") == "running"
    assert job_runner.effective_state(st, alive=False, current_boot="b1") == "interrupted"
    assert job_runner.effective_state(st, alive=True, current_boot="b2") == "interrupted"
    done = {"state": "succeeded", "boot_id": "b1"}
    assert job_runner.effective_state(done, alive=False, current_boot="b2") == "succeeded"


def events(job_dir: Path) -> list[tuple[str, Any]]:
    return [
        (e["event"], e.get("step") or e.get("supervisor"))
        for e in job_runner.history(job_dir, 0)["events"]
    ]


def test_each_newer_checkpoint_step_an_upload_reports_is_an_event_for_the_chart(
    tmp_path: Path,
) -> None:
    job_dir = recorded_job(tmp_path, "", bucket="")
    sup = job_runner.Supervisor(job_dir, 0)
    for step in (10, 10, None, 20):
        sup.record_sync({"at": "2026-12-02T04:00:00Z", "ok": True, "newest_step": step})
    sup.record_sync({"at": "2026-12-02T04:01:00Z", "ok": False, "newest_step": 30})
    assert events(job_dir) == [("checkpoint", 10), ("checkpoint", 20)]
    assert sup.state["last_sync"]["newest_step"] == 30  # the state still says the last try


def test_a_cancel_done_without_the_supervisor_is_an_event_too(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    job_dir = recorded_job(tmp_path, moto_url)
    assert job_runner.cancel(job_dir, 0, wait_s=0.5)["ok"]
    assert events(job_dir) == [("cancel", "gone")]


def test_history_thins_a_long_file_evenly_and_keeps_its_first_and_last_lines(
    tmp_path: Path,
) -> None:
    job_dir = recorded_job(tmp_path, "", bucket="")
    lines = [json.dumps({"at": f"t{i}", "gpu_util": [i], "gpu_mem": 1.0}) for i in range(10_001)]
    (job_dir / "node-0" / "gpu-samples.jsonl").write_text("\n".join([*lines, "{half"]) + "\n")
    samples = job_runner.history(job_dir, 0)["samples"]
    assert len(samples) == job_runner.HISTORY_POINTS
    assert samples[0]["at"] == "t0" and samples[-1]["at"] == "t10000"


def test_put_uploads_a_file_beside_the_jobs_checkpoints(
    tmp_path: Path, bucket: Any, moto_url: str
) -> None:
    job_dir = recorded_job(tmp_path, moto_url)
    chart = job_dir / "gpufleet-chart.png"
    chart.write_bytes(b"\x89PNG fake")
    out = job_runner.put_file(job_dir, chart)
    assert out == {"ok": True, "key": "checkpoints/n0/j1/gpufleet-chart.png", "bucket": BUCKET}
    body = bucket.get_object(Bucket=BUCKET, Key=out["key"])["Body"].read()
    assert body == b"\x89PNG fake"
    no_bucket = job_runner.put_file(recorded_job(tmp_path / "b", "", bucket=""), chart)
    assert no_bucket["ok"] and no_bucket["key"] is None
