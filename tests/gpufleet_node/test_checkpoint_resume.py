"""A resume on the node: the supervisor's restore before torchrun, what it does when the
restore fails (state failed, torchrun never started), the job's arguments expanded and its
resume arguments added, and the warnings a resumed attempt earns (moto S3 on 127.0.0.1,
behind a small proxy that answers 503 SlowDown to chosen GETs)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_runner
from tests.support.moto_server import moto_server

BUCKET = "gpufleet-resume-test"
PREFIX = "checkpoints/n0/j1/"
REMOTE = Path(job_runner.__file__).resolve().parent


class SlowDownProxy(ThreadingHTTPServer):
    """Forwards to ``upstream``; a GET whose path contains ``fail_paths`` gets 503
    SlowDown (S3's throttling answer: docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html,
    read 2026-12-05)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream.split("://", 1)[1]
        self.fail_paths: tuple[str, ...] = ()
        self.refused = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: SlowDownProxy

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "GET" and any(p in self.path for p in self.server.fail_paths):
            self.server.refused += 1
            answer = b"<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        conn = http.client.HTTPConnection(self.server.upstream, timeout=30)
        try:
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for name, value in resp.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


@pytest.fixture
def proxy(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowDownProxy]:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    server = SlowDownProxy(moto_url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
        client.delete_bucket(Bucket=BUCKET)


def job(tmp_path: Path, endpoint: str, **extra: Any) -> Path:
    """A job folder with its spec, its script (prints its argv and what it finds) and an
    empty checkpoint folder."""
    job_dir = tmp_path / "jobs" / "j1"
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    work = tmp_path / "work"
    for d in (job_dir / "node-0", ckpt, work):
        d.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(
        "import os, sys\n"
        "print('ARGV', sys.argv[1:])\n"
        "d = os.environ['GPUFLEET_CHECKPOINT_DIR']\n"
        "print('FOUND', sorted(os.listdir(d)))\n"
    )
    spec = {
        "job": "j1",
        "attempt": 1,
        "nnodes": 1,
        "nproc_per_node": 1,
        "master_addr": "127.0.0.1",
        "master_port": 0,
        "python": sys.executable,
        "workdir": str(work),
        "script": "train.py",
        "args": ["--out_dir={checkpoint_dir}"],
        "resume_args": ["--resume_from={newest checkpoint-*}"],
        "checkpoint_dir": str(ckpt),
        "bucket": BUCKET,
        "bucket_prefix": PREFIX,
        "sync_node": "n0",
        "provider": "aws",
        "region": "us-east-1",
        "s3_endpoint": endpoint,
        "restore_deadline_s": 20,
        "env": {},
        **extra,
    }
    (job_dir / "job.json").write_text(json.dumps(spec))
    return job_dir


def saved_version(job_dir: Path, step: int) -> None:
    """The job's first attempt saved checkpoint-<step> and pushed it; then the node's
    instance store was wiped."""
    spec = json.loads((job_dir / "job.json").read_text())
    ckpt = Path(spec["checkpoint_dir"])
    (ckpt / f"checkpoint-{step}").mkdir(parents=True)
    (ckpt / f"checkpoint-{step}" / "model.pt").write_bytes(b"w" * 100)
    out = job_runner.Supervisor(job_dir, 0).sync(final=True)
    assert out is not None and out["pushed"], out
    for path in sorted(ckpt.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()


def resume(job_dir: Path, attempt: int = 2) -> None:
    spec = json.loads((job_dir / "job.json").read_text())
    (job_dir / "job.json").write_text(json.dumps({**spec, "resume": True, "attempt": attempt}))


def state(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "node-0" / "state.json").read_text())


def events(job_dir: Path) -> list[dict[str, Any]]:
    return job_runner.history(job_dir, 0)["events"]


def test_a_restore_throttled_on_every_get_fails_the_attempt_and_torchrun_never_starts(
    tmp_path: Path, proxy: SlowDownProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 39: every restore GET answered 503, yet the job "resumed" and trained from 0.
    job_dir = job(tmp_path, proxy.url)
    saved_version(job_dir, 400)
    resume(job_dir)
    proxy.fail_paths = ("/.gpufleet/",)  # manifests and objects alike
    argv = ["restore", "--job-dir", str(job_dir), "--node-rank", "0"]
    assert job_runner.main(argv) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["restore"]["cause"] == "throttled", out
    assert out["error"].startswith("restore failed (throttled): ")
    assert "\n" not in out["error"] and proxy.refused > 0

    sup = job_runner.Supervisor(job_dir, 0)
    assert sup.run() == 1
    now = state(job_dir)
    assert now["state"] == "failed" and now["error"].startswith("restore failed (throttled)")
    assert now["restore"]["ok"] is False and now["resumed_from"] is None
    assert "torchrun_pid" not in now and not (job_dir / "node-0" / "torchrun.log").exists()
    assert [e["event"] for e in events(job_dir)][-1] == "end"


def test_a_resume_restores_expands_the_args_and_adds_the_resume_args(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url)
    saved_version(job_dir, 400)
    resume(job_dir)
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet_node.job_runner", "supervise", f"--job-dir={job_dir}"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    now = state(job_dir)
    assert now["state"] == "succeeded", now
    assert now["resumed_from"] == {"version": 1, "step": 400}
    assert now["restore"]["fetched"] == 1 and now["warnings"] == []
    log = (job_dir / "logs" / "rank-0.log").read_text()
    want = [f"--out_dir={ckpt}", f"--resume_from={ckpt / 'checkpoint-400'}"]
    assert f"ARGV {want}" in log and "FOUND ['checkpoint-400']" in log
    # Its final push: nothing new, so no version 2.
    assert now["final_sync"]["detail"] == "unchanged since version 1 (step 400)"


def test_a_supervisor_reuses_its_attempts_restore_and_skips_the_bucket(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url)
    saved_version(job_dir, 300)
    resume(job_dir)
    assert job_runner.restore_node(job_dir, 0)["ok"]
    proxy.fail_paths = ("/",)  # the bucket is unusable now: a second restore would fail
    sup = job_runner.Supervisor(job_dir, 0)
    args = sup.prepare()
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    assert args == [f"--out_dir={ckpt}", f"--resume_from={ckpt / 'checkpoint-300'}"]
    assert sup.state["resumed_from"] == {"version": 1, "step": 300}
    # A restore.json of an earlier attempt is not this one's.
    resume(job_dir, attempt=3)
    again = job_runner.Supervisor(job_dir, 0)
    assert again.prepare() is None and again.state["error"].startswith("restore failed")


def test_resume_args_are_added_only_when_the_restore_put_something_there(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url, resume_args=["--init_from=resume"])
    resume(job_dir)
    sup = job_runner.Supervisor(job_dir, 0)
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    assert sup.prepare() == [f"--out_dir={ckpt}"]  # nothing anywhere: the script starts fresh
    assert "no checkpoint version in the bucket" in sup.state["restore"]["detail"]
    fresh = job(tmp_path / "first", proxy.url, resume_args=["--init_from=resume"])
    first = job_runner.Supervisor(fresh, 0)  # not a resume: no restore, no resume args
    assert first.prepare() == [f"--out_dir={tmp_path / 'first' / 'scratch' / 'checkpoints' / 'j1'}"]
    assert first.state["restore"] is None


def test_a_placeholder_with_nothing_to_name_fails_the_attempt_in_one_line(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url, args=["--from={newest step-*}"])
    saved_version(job_dir, 400)  # checkpoint-400, no step-*
    resume(job_dir)
    sup = job_runner.Supervisor(job_dir, 0)
    assert sup.run() == 1
    now = state(job_dir)
    assert now["state"] == "failed" and "nothing in" in now["error"] and "step-*" in now["error"]


def test_no_bucket_reuses_the_local_folder_and_says_so(tmp_path: Path) -> None:
    job_dir = job(tmp_path, "", bucket="", resume_args=["--init_from=resume"])
    (tmp_path / "scratch" / "checkpoints" / "j1" / "ckpt.pt").write_bytes(b"c")
    resume(job_dir)
    sup = job_runner.Supervisor(job_dir, 0)
    args = sup.prepare()
    assert args is not None and args[-1] == "--init_from=resume"
    assert sup.state["restore"]["detail"] == (
        "no bucket: the node's own checkpoint folder is reused (1 file(s))"
    )


def test_an_attempt_that_writes_an_older_step_than_it_restored_is_warned_about(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url)
    saved_version(job_dir, 400)
    resume(job_dir)
    sup = job_runner.Supervisor(job_dir, 0)
    assert sup.prepare() is not None
    sup.state["log_offsets"] = {"0": 0}
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    (ckpt / "checkpoint-100").mkdir()  # the script ignored checkpoint-400
    (ckpt / "checkpoint-100" / "model.pt").write_bytes(b"fresh")
    logs = job_dir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "rank-0.log").write_text("Initializing a new model from scratch\n")
    sup.scan_output()
    sup.record_sync(sup.sync(final=True))
    warnings = sup.state["warnings"]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("rank 0 started from scratch after a restore")
    assert warnings[1].startswith("version 2 regressed: step 100")
    kinds = [e.get("kind") for e in events(job_dir) if e["event"] == "warning"]
    assert kinds == ["from_scratch", "regressed"]
    sup.scan_output()  # the same line again is not a second warning
    assert len(sup.state["warnings"]) == 2
    # A later restore still takes version 1 (step 400), not the regressed version 2.
    assert job_runner.restorable(job_dir)["version"]["seq"] == 1


def test_cancel_of_a_job_that_wrote_nothing_says_so(tmp_path: Path, proxy: SlowDownProxy) -> None:
    job_dir = job(tmp_path, proxy.url)
    (job_dir / "node-0" / "state.json").write_text(
        json.dumps({"state": "running", "pid": 2**22 + 1, "boot_id": job_runner.boot_id()})
    )
    out = job_runner.cancel(job_dir, 0, wait_s=0.5)
    final = out["state"]["final_sync"]
    assert final["wrote_nothing"] is True
    assert final["detail"].startswith("the job wrote nothing to its checkpoint folder")


def test_a_checkpoint_folder_that_never_stays_unchanged_is_warned_about_once(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    """A log appended inside the checkpoint folder keeps every periodic push waiting for a
    quiet folder: after NEVER_QUIET_SYNCS of them in a row the job's state says so, once;
    a push that goes through starts the count again."""
    job_dir = job(tmp_path, proxy.url)
    sup = job_runner.Supervisor(job_dir, 0)
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "model.pt").write_bytes(b"weights")
    for n in range(job_runner.NEVER_QUIET_SYNCS * 2):
        (ckpt / "train.log").write_text(f"line {n}\n")  # written just now: never quiet
        out = sup.sync()
        assert out is not None and out["changing"] is True, out
        sup.record_sync(out)
    warnings = sup.state.get("warnings") or []
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        f"no checkpoint version uploaded in the last {job_runner.NEVER_QUIET_SYNCS} syncs"
    )
    done = sup.sync(final=True)
    assert done is not None and done["pushed"] is True, done
    sup.record_sync(done)
    assert sup.state["changing_syncs"] == 0


def torn_ckpt(ckpt: Path) -> None:
    """A zip (torch.save's format) cut before its directory, as a kill mid-save leaves it."""
    import zipfile

    ckpt.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(ckpt / "ckpt.pt", "w") as z:
        z.writestr("archive/data.pkl", b"p" * 4000)
    size = (ckpt / "ckpt.pt").stat().st_size
    with open(ckpt / "ckpt.pt", "r+b") as f:
        f.truncate(size // 2)
    then = time.time() - 60  # quiet since: the kill came a minute ago
    os.utime(ckpt / "ckpt.pt", (then, then))


def test_a_torn_checkpoint_at_the_final_push_is_one_warning_and_no_version(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url)
    sup = job_runner.Supervisor(job_dir, 0)
    torn_ckpt(tmp_path / "scratch" / "checkpoints" / "j1")
    final = sup.sync(final=True)
    assert final is not None and not final["ok"] and final["torn"] == "ckpt.pt", final
    sup.record_sync(final, final=True)
    sup.record_sync(final, final=True)  # said once
    assert sup.state["warnings"] == [
        "ckpt.pt is an incomplete torch.save (zip) file (no zip directory at its end): the "
        "job was stopped while saving? No version uploaded; the bucket has no version"
    ]
    kinds = [e.get("kind") for e in events(job_dir) if e["event"] == "warning"]
    assert kinds == ["torn"]
    assert job_runner.restorable(job_dir)["version"] is None


def test_a_torn_checkpoint_seen_by_one_periodic_push_is_no_warning_by_two_it_is(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    """Once may be a save that paused longer than the quiet period; the same file torn at
    the next sync is no save in progress."""
    job_dir = job(tmp_path, proxy.url)
    sup = job_runner.Supervisor(job_dir, 0)
    torn_ckpt(tmp_path / "scratch" / "checkpoints" / "j1")
    sup.record_sync(sup.sync())
    assert sup.state["warnings"] == [] and sup.state["last_sync"]["torn"] == "ckpt.pt"
    sup.record_sync(sup.sync())
    assert len(sup.state["warnings"]) == 1 and "ckpt.pt" in sup.state["warnings"][0]


def test_cancel_with_the_supervisor_gone_warns_of_a_torn_checkpoint(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    job_dir = job(tmp_path, proxy.url)
    torn_ckpt(tmp_path / "scratch" / "checkpoints" / "j1")
    (job_dir / "node-0" / "state.json").write_text(
        json.dumps({"state": "running", "pid": 2**22 + 1, "boot_id": job_runner.boot_id()})
    )
    out = job_runner.cancel(job_dir, 0, wait_s=0.5)
    assert out["state"]["final_sync"]["torn"] == "ckpt.pt"
    assert out["state"]["warnings"] == [out["state"]["final_sync"]["detail"]]


def test_the_supervisor_waits_for_the_jobs_own_sync_quiet_s(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    """job.json's sync_quiet_s (fab train --sync-quiet) is the quiet period of a periodic
    push; the push after the job ended needs none."""
    job_dir = job(tmp_path, proxy.url, sync_quiet_s=30.0)
    sup = job_runner.Supervisor(job_dir, 0)
    ckpt = tmp_path / "scratch" / "checkpoints" / "j1"
    (ckpt / "model.pt").write_bytes(b"weights")
    then = time.time() - 10  # quiet for 10 s: enough for the default 2 s, not for 30
    os.utime(ckpt / "model.pt", (then, then))
    out = sup.sync()
    assert out is not None and out["changing"] is True, out
    assert "a file changed in the last 30 s" in out["detail"]
    done = sup.sync(final=True)
    assert done is not None and done["pushed"] is True, done


def test_a_running_supervisor_pushes_at_once_when_the_watchdog_asks_not_at_its_interval(
    tmp_path: Path, proxy: SlowDownProxy
) -> None:
    """A spot interruption notice: the watchdog finds the running job (its supervisor lives)
    and writes sync-now in its node folder; the supervisor, whose next push is an hour
    away, pushes a version within seconds, removes the file and records why."""
    from gpufleet_node import watchdog, watchdog_signals

    job_dir = job(tmp_path, proxy.url, sync_interval_s=3600, sync_quiet_s=0.2)
    (tmp_path / "work" / "train.py").write_text(
        "import os, time\n"
        "d = os.environ['GPUFLEET_CHECKPOINT_DIR']\n"
        "open(os.path.join(d, 'ckpt.pt'), 'wb').write(b'w' * 100)\n"
        "print('SAVED', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet_node.job_runner", "supervise", f"--job-dir={job_dir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ckpt = tmp_path / "scratch" / "checkpoints" / "j1" / "ckpt.pt"
        deadline = time.monotonic() + 60
        while not (ckpt.exists() and state(job_dir).get("state") == "running"):
            assert time.monotonic() < deadline and proc.poll() is None, "the job never saved"
            time.sleep(0.2)
        time.sleep(0.5)  # quiet for the job's sync_quiet_s
        folders = watchdog_signals.running_job_folders(tmp_path / "jobs")
        assert folders == [job_dir / "node-0"]
        notice = "spot interruption notice terminate"
        asked_at = time.monotonic()
        assert watchdog.ask_jobs_to_push(folders, notice, 30.0, watchdog.dt.datetime.now()) == 1
        while not (state(job_dir).get("last_sync") or {}).get("pushed"):
            assert time.monotonic() - asked_at < 20, state(job_dir).get("last_sync")
            time.sleep(0.2)
        took = time.monotonic() - asked_at
        assert took < 10, took  # the loop looks every 5 s at most; the interval is an hour
        assert state(job_dir)["last_sync"]["version"] == 1
        assert not (job_dir / "node-0" / job_runner.SYNC_NOW_FILE).exists()
        asked = [e for e in events(job_dir) if e["event"] == "sync_now"]
        assert asked and asked[0]["why"] == notice and asked[0]["budget_s"] == 30.0
    finally:
        job_runner.cancel(job_dir, 0, wait_s=20)
        proc.wait(timeout=30)
