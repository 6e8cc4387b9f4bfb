"""Walk-away runs on more than one node (issue 41): each node's supervisor, no controller,
the bucket as the meeting place (gpufleet_node/job_group.py). Two "nodes" are two
supervisors on this machine, each with its own job folder and checkpoint folder, under
real torchrun (static rendezvous with an id per attempt, gloo, CPU, one rank a node) and
moto S3 on 127.0.0.1. Each story ends at the right step with the steps lost no more than
one checkpoint interval (10 steps), and prints what it measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_boot, job_group, job_policy, job_runner, job_sync
from tests.gpufleet_node.test_job_recovery import SCRIPT, free_port, steps_printed
from tests.support.moto_server import moto_server, s3_bucket

BUCKET = "gpufleet-group-test"
PREFIX = "checkpoints/n0/g1/"
INTERVAL = 10  # the script saves every 10 steps
HANG_S = 6.0


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


@pytest.fixture
def endpoint(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with s3_bucket(moto_url, BUCKET) as url:
        yield url


def group(tmp_path: Path, endpoint: str, env: dict[str, str], **extra: Any) -> list[Path]:
    """Two nodes' job folders: the same job.json but for the checkpoint folder (each node
    has its own disk; here both are on this machine)."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(SCRIPT)
    port = free_port()
    out = []
    for r in (0, 1):
        job_dir = tmp_path / f"node{r}" / "jobs" / "g1"
        ckpt = tmp_path / f"node{r}" / "scratch" / "checkpoints" / "g1"
        for d in (job_dir, ckpt):
            d.mkdir(parents=True, exist_ok=True)
        spec = {
            "job": "g1",
            "attempt": 1,
            "nnodes": 2,
            "nproc_per_node": 1,
            "master_addr": "127.0.0.1",
            "master_port": port,
            "python": sys.executable,
            "workdir": str(work),
            "script": "train.py",
            "args": ["{checkpoint_dir}"],
            "resume_args": ["--resume={newest ckpt-*.json}"],
            "checkpoint_dir": str(ckpt),
            "bucket": BUCKET,
            "bucket_prefix": PREFIX,
            "sync_node": "n0",
            "provider": "aws",
            "region": "us-east-1",
            "s3_endpoint": endpoint,
            "sync_interval_s": 3600,
            "restart_backoff_s": 0.5,
            "cancel_grace_s": 3,
            "restore_deadline_s": 20,
            "group_poll_s": 0.5,
            "end_records_s": 6,
            "rdzv_join_timeout_s": 30,
            "worker_wait_s": 90,
            "reclaim_recovery": True,
            "boot_unit": False,  # this machine is no node: no unit in its /etc
            "env": {"OMP_NUM_THREADS": "1", **env},
            **extra,
        }
        (job_dir / "job.json").write_text(json.dumps(spec))
        out.append(job_dir)
    return out


def supervise(job_dir: Path, node_rank: int, **env: str) -> subprocess.Popen[bytes]:
    log = open(job_dir.parent / f"supervisor-{node_rank}.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet_node.job_runner",
            "supervise",
            f"--job-dir={job_dir}",
            f"--node-rank={node_rank}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**clean_env(), **env},
    )


def clean_env() -> dict[str, str]:
    """This process's environment without the test script's knobs (an in-process
    Supervisor puts its job's env into os.environ: never let one test's FAULT reach
    another's ranks)."""
    return {k: v for k, v in os.environ.items() if k not in ("FAULT", "STEPS", "STEP_SLEEP")}


def state(job_dir: Path, node_rank: int) -> dict[str, Any]:
    return json.loads((job_dir / f"node-{node_rank}" / "state.json").read_text())


def wait_all(procs: list[subprocess.Popen[bytes]], jobs: list[Path], cap: float = 100) -> None:
    deadline = time.monotonic() + cap
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                job_runner.cancel(jobs[r], r, wait_s=10)
                p.wait(timeout=30)


def logs(jobs: list[Path]) -> str:
    return "\n".join(
        f"--- {p}\n{p.read_text()[-3000:]}"
        for j in jobs
        for p in [*j.parent.glob("supervisor-*.log"), *j.glob("node-*/torchrun.log")]
    )


def rank_log(job_dir: Path, rank: int) -> str:
    return (job_dir / "logs" / f"rank-{rank}.log").read_text()


def attempt_restores(jobs: list[Path], node_rank: int) -> list[Any]:
    """The version each attempt of a node restored (its restore events)."""
    events = job_runner.history(jobs[node_rank], node_rank)["events"]
    return [(e.get("version"), e.get("step")) for e in events if e["event"] == "restore"]


def lost_after(printed: list[int], resumed: int) -> int:
    """Steps trained after the checkpoint the next attempt resumed from: the last step
    printed before the steps went back."""
    back = next((i for i in range(1, len(printed)) if printed[i] <= printed[i - 1]), None)
    assert back is not None, printed
    return printed[back - 1] - resumed


def test_a_crash_on_node_1_restarts_both_nodes_from_the_same_version(
    tmp_path: Path, endpoint: str
) -> None:
    jobs = group(tmp_path, endpoint, {"FAULT": "crash"}, max_restarts=1)
    began = time.monotonic()
    procs = [supervise(jobs[0], 0), supervise(jobs[1], 1)]
    wait_all(procs, jobs)
    took = time.monotonic() - began
    head, worker = state(jobs[0], 0), state(jobs[1], 1)
    assert head["state"] == "succeeded" and head["end_reason"] == "succeeded", logs(jobs)
    assert worker["state"] == "succeeded", logs(jobs)
    first, second = head["attempts"]
    # rank 1 (node 1's only rank) exits 3 at step 25: the head names that node, not its
    # own rank 0, which only lost its peer.
    assert first["reason"] == "crash" and first["node"] == 1, first
    assert (first["rank"], first["exit_code"]) == (1, 3), first
    assert first["newest_step"] == 20 and first["version"] == 1
    assert second["reason"] == "succeeded" and second["resumed_from"] == {"version": 1, "step": 20}
    # Both nodes restored exactly version 1 for attempt 2, and resumed there.
    assert attempt_restores(jobs, 0) == [(1, 20)] == attempt_restores(jobs, 1)
    for r in (0, 1):
        text = rank_log(jobs[r], r)
        assert "RESUMED 20" in text and text.rstrip().endswith("DONE"), text[-500:]
    printed = steps_printed(rank_log(jobs[0], 0))
    lost = lost_after(printed, 20)
    assert printed[-1] == 40 and 0 <= lost <= INTERVAL, printed
    store = job_sync.make_store("aws", BUCKET, "us-east-1", endpoint)
    assert store is not None
    record = job_group.read_attempt(store, PREFIX, 2)
    assert record and record["version"] == 1 and record["rdzv_id"] == "g1-a2", record
    print(f"\ntwo-node crash: {took:.1f} s in all, steps lost {lost}")


def test_a_barrier_hang_on_two_nodes_is_restarted(tmp_path: Path, endpoint: str) -> None:
    jobs = group(tmp_path, endpoint, {"FAULT": "hang"}, max_restarts=1, hang_after_s=HANG_S)
    procs = [supervise(jobs[0], 0), supervise(jobs[1], 1)]
    log = jobs[0] / "logs" / "rank-0.log"
    last_size, last_change, restarted = -1, time.monotonic(), None
    deadline = time.monotonic() + 100
    try:
        while procs[0].poll() is None and time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if restarted is None and "attempt 2" in text:
                restarted = time.monotonic()
            elif restarted is None and len(text) != last_size:
                last_size, last_change = len(text), time.monotonic()
            time.sleep(0.05)
    finally:
        wait_all(procs, jobs, cap=60)
    head = state(jobs[0], 0)
    assert head["state"] == "succeeded", logs(jobs)
    hung = head["attempts"][0]
    assert hung["reason"] == "hang" and HANG_S <= hung["silent_s"] < HANG_S + 5, hung
    assert hung["tails"]["0"][-1] == "STEP 24" and hung["newest_step"] == 20
    assert state(jobs[1], 1)["state"] == "succeeded"
    assert attempt_restores(jobs, 1) == [(1, 20)]
    assert restarted is not None
    to_restart = restarted - last_change
    printed = steps_printed(log.read_text())
    lost = lost_after(printed, 20)
    assert printed[-1] == 40 and 0 <= lost <= INTERVAL, printed
    # hang_after + the worker's stop + push + backoff + restore + both torchruns
    assert to_restart < HANG_S + 30, to_restart
    print(
        f"\ntwo-node hang: last progress to the new attempt's first line {to_restart:.1f} s, "
        f"steps lost {lost}"
    )


def test_a_reclaimed_node_rejoins_at_boot_and_the_run_finishes(
    tmp_path: Path, endpoint: str
) -> None:
    # A slower script (0.15 s a step) so the kill lands mid-run.
    jobs = group(tmp_path, endpoint, {"STEPS": "60", "STEP_SLEEP": "0.15"})
    procs = [supervise(jobs[0], 0), supervise(jobs[1], 1)]
    log0 = jobs[0] / "logs" / "rank-0.log"
    try:
        deadline = time.monotonic() + 60
        while "STEP 25" not in (log0.read_text() if log0.exists() else ""):
            assert time.monotonic() < deadline and procs[0].poll() is None, logs(jobs)
            time.sleep(0.05)
        # The reclaim: node 1's supervisor, its torchrun and its rank, all at once.
        gone = state(jobs[1], 1)
        pids = [procs[1].pid, int(gone.get("torchrun_pid") or 0)]
        pids += job_runner.rank_pids(jobs[1] / "node-1")
        for pid in pids:
            if pid:
                with __import__("contextlib").suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        procs[1].wait(timeout=10)
        killed_at_step = steps_printed(log0.read_text())[-1]
        time.sleep(3)  # the node is down; the head notices and waits for it
        assert procs[0].poll() is None
        # The node boots again (another boot id): its boot entry rejoins the run.
        booted = time.monotonic()
        env = {**clean_env(), job_runner.BOOT_ID_ENV: "boot-after-reclaim"}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet_node.job_runner",
                "boot",
                f"--root={jobs[1].parent}",
                "--detach=fork",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        resumed = json.loads(done.stdout)["resumed"]
        assert [(r["node_rank"], r["ok"]) for r in resumed] == [(1, True)], resumed
        log1 = jobs[1] / "logs" / "rank-1.log"
        rejoined = None
        while procs[0].poll() is None and time.monotonic() < booted + 90:
            text = log1.read_text()
            if rejoined is None and "RESUMED" in text.split("attempt 1,")[-1]:
                tail = text[text.rfind("RESUMED") :]
                if "STEP " in tail:
                    rejoined = time.monotonic()
            time.sleep(0.05)
        wait_all(procs[:1], jobs[:1], cap=60)
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                job_runner.cancel(jobs[r], r, wait_s=10)
    worker_done = time.monotonic() + 30
    while state(jobs[1], 1)["state"] in ("running", "starting"):
        assert time.monotonic() < worker_done, logs(jobs)
        time.sleep(0.2)
    head, worker = state(jobs[0], 0), state(jobs[1], 1)
    assert head["state"] == "succeeded", logs(jobs)
    assert worker["state"] == "succeeded" and worker["boot_id"] == "boot-after-reclaim"
    reasons = [a["reason"] for a in head["attempts"]]
    assert reasons[0] == "reclaimed" and head["attempts"][0]["node"] == 1, head["attempts"]
    assert reasons[-1] == "succeeded" and set(reasons[1:-1]) <= {"waiting"}, reasons
    assert worker["attempts"][0]["reason"] == "reclaimed"  # its own record of the reclaim
    printed = steps_printed(log0.read_text())
    resumed_at = head["attempts"][-1]["resumed_from"]["step"]
    lost = lost_after(printed, resumed_at)
    assert printed[-1] == 60 and 0 <= lost <= INTERVAL and killed_at_step >= 25, printed
    assert rejoined is not None
    print(
        f"\nreclaim: node 1's boot entry to its first training step {rejoined - booted:.1f} s, "
        f"steps lost {lost} (resumed at {resumed_at})"
    )


def test_a_reclaimed_single_node_run_goes_on_at_boot_with_a_new_attempt(
    tmp_path: Path, endpoint: str
) -> None:
    """One node: its supervisor and ranks SIGKILLed (the node stopped), then the boot
    entry under another boot id: a new attempt from the newest version, the interrupted
    one recorded as reclaimed (no restart used), the run finished at its last step."""
    from tests.gpufleet_node import test_job_recovery as one

    job_dir = one.job(
        tmp_path,
        endpoint,
        {"STEPS": "50", "STEP_SLEEP": "0.2"},
        bucket_prefix=PREFIX,
        bucket=BUCKET,
        reclaim_recovery=True,
        boot_unit=False,
        sync_interval_s=0.5,  # a checkpoint every 2 s is in the bucket within about 1 s
        sync_quiet_s=0.3,
    )
    proc = supervise(job_dir, 0)
    log = job_dir / "logs" / "rank-0.log"
    try:
        deadline = time.monotonic() + 60
        while (
            "STEP 25" not in (log.read_text() if log.exists() else "")
            or ((state(job_dir, 0).get("last_sync") or {}).get("newest_step") or 0) < 20
        ):  # a version of step 20 or later in the bucket
            assert time.monotonic() < deadline and proc.poll() is None, logs([job_dir])
            time.sleep(0.05)
        for pid in [proc.pid, *job_runner.rank_pids(job_dir / "node-0")]:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(0.5)
        env = {**clean_env(), job_runner.BOOT_ID_ENV: "boot-after-reclaim"}
        booted = time.monotonic()
        done = subprocess.run(
            [
                *(sys.executable, "-m", "gpufleet_node.job_runner", "boot"),
                *("--detach=fork", f"--root={job_dir.parent}"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        until = time.monotonic() + 90
        while state(job_dir, 0)["state"] in ("running", "starting"):
            assert time.monotonic() < until, logs([job_dir])
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - booted
    now = state(job_dir, 0)
    assert now["state"] == "succeeded" and now["attempt"] == 2, now
    first, second = now["attempts"]
    assert first["reason"] == "reclaimed" and first["attempt"] == 1, first
    assert second["reason"] == "succeeded" and now.get("restarts", 0) == 0
    resumed = second["resumed_from"]["step"]
    printed = steps_printed(log.read_text())
    lost = lost_after(printed, resumed)
    assert printed[-1] == 50 and 0 <= lost <= INTERVAL, printed
    print(f"\none node reclaimed: boot entry to the run's end {took:.1f} s, steps lost {lost}")


def test_a_node_that_never_comes_is_waited_for_within_the_wait_limit(
    tmp_path: Path, endpoint: str
) -> None:
    """Only the head starts: each attempt's rendezvous times out (5 s here), the head says
    it waits for node 1 (state waiting_for, fab jobs), starts another attempt without
    using a restart, and ends the run failed (waiting) once node_wait_s is over."""
    jobs = group(tmp_path, endpoint, {}, max_restarts=0, rdzv_join_timeout_s=5, node_wait_s=8)
    head = supervise(jobs[0], 0)
    seen_waiting = False
    deadline = time.monotonic() + 90
    try:
        while head.poll() is None and time.monotonic() < deadline:
            with __import__("contextlib").suppress(OSError, ValueError):
                seen_waiting = seen_waiting or state(jobs[0], 0).get("waiting_for") == [1]
            time.sleep(0.2)
    finally:
        wait_all([head], jobs[:1], cap=30)
    now = state(jobs[0], 0)
    assert (now["state"], now["end_reason"]) == ("failed", "waiting"), logs(jobs[:1])
    reasons = {a["reason"] for a in now["attempts"]}
    assert reasons == {"waiting"} and len(now["attempts"]) >= 2, now["attempts"]
    assert all(a["waiting_for"] == [1] for a in now["attempts"])
    assert seen_waiting and now.get("restarts", 0) == 0
    ended = [e for e in job_runner.history(jobs[0], 0)["events"] if e["event"] == "end"]
    assert "no node came back within 8 s" in ended[-1]["detail"], ended


def test_the_budget_of_two_nodes_stops_both(tmp_path: Path, endpoint: str) -> None:
    # 3.6 per node-hour, two nodes: 0.002 a second; 0.050 is about 25 s of the run: room
    # for both nodes' torch to start and the head to save a checkpoint on a loaded machine.
    jobs = group(
        tmp_path,
        endpoint,
        {"STEPS": "100000"},
        max_restarts=3,
        max_cost=0.050,
        hourly_price=3.6,
        currency="USD",
    )
    began = time.monotonic()
    procs = [supervise(jobs[0], 0), supervise(jobs[1], 1)]
    wait_all(procs, jobs, cap=120)
    took = time.monotonic() - began
    head, worker = state(jobs[0], 0), state(jobs[1], 1)
    assert head["state"] == "cancelled" and head["end_reason"] == "budget", logs(jobs)
    spent = float(head["budget"].split()[1])
    assert 0.050 <= spent < 0.075 and head["budget"].endswith("of 0.05 USD"), head["budget"]
    assert head["final_sync"]["pushed"] and head["final_sync"]["newest_step"] >= 10
    assert [a["reason"] for a in head["attempts"]] == ["budget"]
    assert (worker["state"], worker["end_reason"]) == ("cancelled", "budget"), worker
    assert 25 <= took < 110, took
    print(f"\ntwo-node budget: {head['budget']}, both stopped {took:.1f} s after the start")


def test_the_boot_entry_picks_only_runs_a_reclaim_interrupted() -> None:
    spec = {"reclaim_recovery": True}
    running = {"state": "running", "boot_id": "old"}
    assert job_boot.interrupted(running, spec, "new")
    assert not job_boot.interrupted(running, spec, "old")  # this boot's: still running
    assert not job_boot.interrupted({**running, "state": "succeeded"}, spec, "new")
    assert not job_boot.interrupted(running, {}, "new")  # no reclaim recovery asked


ODD = "/opt/my gpufleet/50%$HOME"


@pytest.mark.parametrize("root", ["/var/lib/gpufleet/jobs", ODD + "/jobs"])
def test_systemd_itself_accepts_the_boot_unit(tmp_path: Path, root: str) -> None:
    import pwd
    import shutil

    from tests.support.real import missing_real_part

    if shutil.which("systemd-analyze") is None:
        missing_real_part("no systemd-analyze on PATH", package="systemd")
    user = pwd.getpwuid(os.getuid()).pw_name
    text = job_boot.render_unit(sys.executable, root + "/bin", root, user)
    unit = tmp_path / job_boot.UNIT
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not [ln for ln in done.stderr.splitlines() if job_boot.UNIT in ln], done.stderr
    # systemd reads the paths back as they were written, each one argument.
    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert f'"{root.replace("%", "%%").replace("$", "$$")}"' in exec_start or root in exec_start
    assert "job_runner boot --root" in exec_start and "KillMode=process" in text


def test_the_node_that_failed_first_is_the_one_named() -> None:
    lost = "RuntimeError: [.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [x]:1."
    assert job_policy.peer_lost(["Traceback ...", lost]) and not job_policy.peer_lost(["exit 3"])
    worker = {"rank": 9, "exit_code": 3, "failed_at": "2026-12-05_17:40:02"}
    head_lost = {"rank": 0, "exit_code": 1, "failed_at": "2026-12-05_17:40:01", "peer_lost": True}
    assert job_runner.first_failure(worker, head_lost)  # the head only lost its peer
    head_crash = {"rank": 0, "exit_code": 1, "failed_at": "2026-12-05_17:40:02"}
    assert not job_runner.first_failure({**worker, "peer_lost": True}, head_crash)
    assert job_runner.first_failure(worker, {**head_crash, "failed_at": "2026-12-05_17:40:03"})
    assert job_runner.first_failure(worker, {})
    records = {1: {"state": "ended", "why": "exit", "rc": 1, "node_rank": 1, "at": "b"}}
    assert job_group.failed_node(records) == records[1]
    assert job_group.lost_nodes({1: {"state": "running"}, 2: {"state": "ended"}}) == [1]
    assert job_group.missing_nodes(3, {1: {}}) == [2]
    assert job_group.newest_progress({1: {"progress_t": 5.0}, 2: {"progress_t": "x"}}) == 5.0


def test_a_waiting_worker_says_where_its_attempts_lines_start(
    tmp_path: Path, endpoint: str
) -> None:
    # A worker says "running" while it waits for the head's attempt record; fab's follow of
    # a resume reads the log offsets as soon as it does, so they are set by then: the lines
    # of the earlier attempt are not shown again (CI saw rank 1's "from scratch" line of
    # attempt 1 in a two-node resume's output).
    jobs = group(tmp_path, endpoint, {})
    logs_dir = jobs[1] / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    (logs_dir / "rank-1.log").write_text("Initializing a new model from scratch\n")
    before = (logs_dir / "rank-1.log").stat().st_size
    proc = supervise(jobs[1], 1)
    try:
        deadline = time.monotonic() + 60
        now: dict[str, Any] = {}
        while time.monotonic() < deadline:
            now = (
                state(jobs[1], 1)
                if (job_runner.node_dir(jobs[1], 1) / "state.json").exists()
                else {}
            )
            if now.get("waiting_for_head"):
                break
            time.sleep(0.2)
        assert now.get("state") == "running" and now.get("waiting_for_head"), now
        assert now.get("log_offsets") == {"1": before}, now
    finally:
        (job_runner.node_dir(jobs[1], 1) / "cancel").write_text("")
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
