"""``fab train`` end to end over two real sshd "nodes" on 127.0.0.1: the example script as a
2 nodes x 2 processes gloo job, the node venv made by ``fab install-pytorch``, checkpoints in
a moto S3 bucket, kills, resumes, cancels and a dropped ``--follow`` connection.

The test sshd has no systemd as PID 1, so the jobs here run under the runner's supervised,
double-forked path (the systemd transient unit is only unit-tested: its argv).
Both sshds are the same machine: the nodes share one disk, which the job layout allows
(per-node state files, rank-numbered logs, content-addressed runner files).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bootstrap.fleet.api import StepFailed
from bootstrap.train import check_cache
from bootstrap.train.steps import put_bytes
from gpufleet_node import job_runner
from tests.bootstrap.conftest import REPO, FabResult, node_dir, run_fab
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer, free_port, start_sshd, stop_sshd

pytestmark = pytest.mark.integration

BUCKET = "gpufleet-train-test"
CREDS = "AWS_ACCESS_KEY_ID=testing,AWS_SECRET_ACCESS_KEY=testing"
# examples/train_lm.py at a third of its CPU per step (bf16 autocast on a CPU without bf16
# instructions, and every block's activations recomputed, cost the rest), for the tests
# whose job only has to take steps and save checkpoints.
QUICK = "--dtype fp32 --no-grad-checkpointing"


@pytest.fixture(scope="module")
def second_node(sshd_server: SshServer) -> Iterator[SshServer]:
    """Another sshd that accepts the first one's client key (one ssh_key per inventory)."""
    server = start_sshd()
    auth = server.workdir / "authorized_keys"
    auth.write_text(auth.read_text() + Path(f"{sshd_server.key_path}.pub").read_text())
    try:
        yield server
    finally:
        stop_sshd(server)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


def s3(url: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def place(moto_url: str) -> Iterator[dict[str, Path]]:
    """Scratch and job folders the SSH user can write, and an empty bucket."""
    base = node_dir("gpufleet-train-")
    scratch, jobs = base / "scratch", base / "jobs"
    for p in (scratch, jobs):
        p.mkdir()
        p.chmod(0o777)
    client = s3(moto_url)
    client.create_bucket(Bucket=BUCKET)
    try:
        yield {"base": base, "scratch": scratch, "jobs": jobs}
    finally:
        # A job a test left running (it failed, or its job was not what it was about) would
        # go on training and uploading, on the CPUs the next test needs: stopped here.
        stop_live_jobs(jobs)
        # A job a test launched without following may still be uploading its last
        # checkpoint for a few seconds: empty the bucket until the delete takes
        # (bounded), so that upload cannot race the delete.
        for _ in range(60):
            listed = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
            for obj in listed:
                client.delete_object(Bucket=BUCKET, Key=obj["Key"])
            try:
                client.delete_bucket(Bucket=BUCKET)
                break
            except client.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "BucketNotEmpty":
                    raise
                time.sleep(1)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def inventory(
    folder: Path, nodes: list[tuple[SshServer | None, int]], scratch: Path, user: str, key: Path
) -> Path:
    data = {
        "stack": "train-test",
        "provider": "aws",
        "region": "us-east-1",
        "bucket": BUCKET,
        "tier": {"name": "local", "gpu_count": 0, "efa": False},
        "nodes": [
            {
                "name": f"node-{i}",
                "role": "head" if i == 0 else "worker",
                "instance_id": f"i-{i}",
                "public_ip": "127.0.0.1",
                "private_ip": "127.0.0.1",
                "ssh_port": port,
            }
            for i, (_server, port) in enumerate(nodes)
        ],
        "ssh_user": user,
        "ssh_key": str(key),
        "scratch": {"path": str(scratch), "kind": "disk"},
        "hourly_cost": {"currency": "USD", "billing": "on-demand", "amount": 2.0},
    }
    path = folder / "inventory.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def known_venvs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train-check-cache")


@pytest.fixture
def known_venvs(known_venvs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """train-check's cache of the nodes' venvs (bootstrap/train/check_cache.py), shared by
    the tests that use it: the module's first launch imports torch on each node (2-5 s of
    CPU each) and later launches read its version from the cache, as a user's second launch
    does. The test of that cache keeps its own, in its HOME."""
    monkeypatch.setenv(check_cache.CACHE_ENV, str(known_venvs_dir))
    return known_venvs_dir


@pytest.fixture
def two_nodes(
    sshd_server: SshServer, second_node: SshServer, place: dict[str, Path], tmp_path: Path
) -> Path:
    return inventory(
        tmp_path,
        [(sshd_server, sshd_server.port), (second_node, second_node.port)],
        place["scratch"],
        sshd_server.user,
        sshd_server.key_path,
    )


def train_args(inv: Path, venv: Path, jobs: Path, moto: str, steps_args: str) -> list[str]:
    return [
        "train",
        "--inventory", str(inv),
        "--script", "examples/train_lm.py",
        "--cpu",
        "--nproc-per-node", "2",
        "--venv", str(venv),
        "--jobs-dir", str(jobs),
        "--s3-endpoint", moto,
        "--node-env", CREDS,
        "--sync-interval", "1",
        "--args", steps_args,
    ]  # fmt: skip


@dataclass(frozen=True)
class TrainFleet:
    """The two local nodes, the session's torch venv, a jobs folder and the moto bucket."""

    inventory: Path
    venv: Path
    jobs: Path
    moto_url: str

    def train(self, script_args: str) -> list[str]:
        return train_args(self.inventory, self.venv, self.jobs, self.moto_url, script_args)


@pytest.fixture
def fleet(
    two_nodes: Path,
    node_venv: tuple[Path, FabResult],
    place: dict[str, Path],
    moto_url: str,
    known_venvs: Path,
) -> TrainFleet:
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return TrainFleet(two_nodes, venv, place["jobs"], moto_url)


def fab_jobs(inv: Path, jobs: Path) -> dict[str, Any]:
    done = run_fab("jobs", "--inventory", str(inv), "--jobs-dir", str(jobs), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.doc


def one_job(inv: Path, jobs: Path) -> dict[str, Any]:
    (row,) = fab_jobs(inv, jobs)["jobs"]
    return dict(row)


def started_job(result: FabResult, nodes: int = 2) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    match = re.search(rf"job (\S+) (running|resumed|restarted) on {nodes} node", result.stdout)
    assert match, result.stdout
    return match.group(1)


def bucket_steps(moto: str, job: str) -> list[int]:
    """The steps of the checkpoint versions in the bucket under the job's prefix (each
    version's manifest, written last, says its step)."""
    client = s3(moto)
    prefix = f"checkpoints/node-0/{job}/.gpufleet/versions/"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    steps = []
    for obj in listed.get("Contents", []):
        body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
        step = json.loads(body).get("step")
        if step is not None:
            steps.append(int(step))
    return sorted(set(steps))


def wait_for(what: str, check: Any, timeout: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def states(jobs: Path, job: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((jobs / job).glob("node-*/state.json"))]


def kill_job(jobs: Path, job: str) -> None:
    """What a spot reclaim does: every process of the job dies at once, nothing is saved."""
    for st in states(jobs, job):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(st["pid"]), signal.SIGKILL)  # the supervisor
        if st.get("pgid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(st["pgid"]), signal.SIGKILL)  # torchrun
        for pidfile in (jobs / job / f"node-{st['node_rank']}").glob("rank-*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the ranks (own sessions)


def stop_live_jobs(jobs: Path, job: str = "*") -> None:
    """SIGKILL what still runs of the jobs under ``jobs`` (or of ``job``): only processes the
    runner's own checks say are a supervisor, a rank or torchrun, never a pid that was
    reused since the state file was written."""
    for path in jobs.glob(f"{job}/node-*/state.json"):
        state = job_runner.state_now(path)
        if state is None:
            continue
        if state["effective"] in job_runner.ACTIVE:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(state["pid"]), signal.SIGKILL)
        pgid = int(state.get("pgid") or 0)
        if pgid and _runs_torchrun(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in job_runner.rank_pids(path.parent):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _runs_torchrun(pid: int) -> bool:
    try:
        return b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def losses(log: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(r"\bstep \d+ loss ([0-9.]+)", log)]


def events(jobs: Path, job: str, node_rank: int = 0) -> list[dict[str, Any]]:
    """The node's event log (job_runner.py's events.jsonl)."""
    path = jobs / job / f"node-{node_rank}" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_nodes_of_two_processes_train_to_the_end_even_when_the_follow_drops(
    fleet: TrainFleet, place: dict[str, Path]
) -> None:
    two_nodes, moto_url = fleet.inventory, fleet.moto_url
    argv = fleet.train("--steps 40 --step-sleep 0.05 --log-every 5")
    follow = subprocess.Popen(
        [sys.executable, "-m", "fabric", *argv, "--follow"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    seen = []
    assert follow.stdout is not None
    for line in follow.stdout:  # until the job's first step reached this terminal
        seen.append(line)
        if "first step" in line:
            break
    # The laptop's connection drops (the fab process dies): the job must not notice.
    follow.kill()
    follow.wait(30)
    text = "".join(seen)
    job = re.search(r"job (\S+) running on 2 node", text)
    assert job, text
    job_id = job.group(1)
    assert one_job(two_nodes, place["jobs"])["state"] in ("running", "succeeded")

    # Reattach until the end.
    logs = run_fab(
        "logs", job_id, "--follow", "--inventory", str(two_nodes), "--jobs-dir",
        str(place["jobs"]), timeout=400,
    )  # fmt: skip
    assert logs.returncode == 0, logs.stderr[-2000:]
    row = one_job(two_nodes, place["jobs"])
    assert row["state"] == "succeeded", row
    assert row["runtime_s"] > 0 and row["cost"] > 0 and row["currency"] == "USD"
    assert row["nodes"] == {"0": "succeeded", "1": "succeeded"}
    assert row["last_line"].startswith("done")

    every = run_fab("logs", job_id, "--inventory", str(two_nodes), "--jobs-dir", str(place["jobs"]))
    assert every.returncode == 0, every.stderr
    for rank in range(4):
        assert f"[rank {rank}] gpufleet: rank {rank} " in every.stdout
        assert re.search(rf"\[rank {rank}\] first step 1 at", every.stdout)
    curve = losses(every.stdout)
    assert len(curve) >= 6 and curve[-1] < 0.95 * curve[0], curve
    only = run_fab(
        "logs", job_id, "--rank", "3", "--inventory", str(two_nodes), "--jobs-dir",
        str(place["jobs"]),
    )  # fmt: skip
    assert "[rank 3]" in only.stdout and "[rank 0]" not in only.stdout
    # The final checkpoint reached the bucket, in the watchdog's layout.
    assert bucket_steps(moto_url, job_id)[-1] == 40
    table = run_fab("jobs", "--inventory", str(two_nodes), "--jobs-dir", str(place["jobs"]))
    assert job_id in table.stdout and "succeeded" in table.stdout


@pytest.mark.slow
def test_a_killed_job_resumes_from_its_last_checkpoint_in_the_bucket_not_step_zero(
    fleet: TrainFleet, place: dict[str, Path]
) -> None:
    two_nodes, jobs, moto_url = fleet.inventory, fleet.jobs, fleet.moto_url
    # fp32 without gradient checkpointing: the steps only have to run and be checkpointed
    # (the example's defaults are trained by the test above), at a third of the CPU.
    # A save every 3 s: a version is uploaded once the folder has been quiet for 2 s
    # (job_sync.py QUIET_S), so saves closer than that are uploaded only at the end.
    argv = fleet.train("--steps 25 --step-sleep 0.3 --ckpt-every 10 " + QUICK)
    job = started_job(run_fab(*argv))
    wait_for("a checkpoint in the bucket", lambda: bucket_steps(moto_url, job))
    kill_job(jobs, job)
    wait_for("the job read as interrupted",
             lambda: one_job(two_nodes, jobs)["state"] == "interrupted")  # fmt: skip
    saved = bucket_steps(moto_url, job)[-1]
    assert 0 < saved < 25

    # A new scratch disk (the node came back empty) and, in the bucket, the object of a
    # newer save whose upload was cut off before its version's manifest: the resume must
    # take `saved`, from the bucket.
    shutil.rmtree(place["scratch"] / "checkpoints" / job)
    client = s3(moto_url)
    orphan = f"checkpoints/node-0/{job}/.gpufleet/objects/{'9' * 64}"
    client.put_object(Bucket=BUCKET, Key=orphan, Body=b"half")

    resumed = run_fab(
        "train", "--resume", job, "--inventory", str(two_nodes), "--jobs-dir", str(jobs),
        "--follow", timeout=400,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from step {saved}" in resumed.stdout
    assert "resumed from step 99" not in resumed.stdout
    done = re.search(r"done (\{.*\})", resumed.stdout)
    assert done, resumed.stdout[-2000:]
    summary = json.loads(done.group(1))
    assert (summary["start_step"], summary["end_step"]) == (saved, 25)
    row = one_job(two_nodes, jobs)
    assert (row["state"], row["attempt"]) == ("succeeded", 2)
    assert bucket_steps(moto_url, job)[-1] == 25
    # The head's events, for the job's chart: the killed attempt has no end of its own.
    kinds = [(e["event"], e.get("attempt") or e.get("state")) for e in events(jobs, job)]
    assert kinds[0] == ("start", 1) and ("resume", 2) in kinds
    assert kinds[-1] == ("end", "succeeded")
    assert [k for k, _ in kinds].count("end") == 1
    steps = [e["step"] for e in events(jobs, job) if e["event"] == "checkpoint"]
    assert saved in steps and steps[-1] == 25


@pytest.mark.slow
def test_a_rank_killed_on_node_1_restarts_both_nodes_with_no_fab_command_after_the_first(
    fleet: TrainFleet,
) -> None:
    """Issue 41 on two nodes through fab: `fab train --max-restarts 1`, then nothing but
    looking. A rank of node 1 SIGKILLed after a checkpoint reached the bucket: node 1's
    supervisor records it, the head stops its own ranks, both nodes restore the same
    version and the run ends at its last step (fab jobs names node 1 and the rank)."""
    two_nodes, jobs, moto_url = fleet.inventory, fleet.jobs, fleet.moto_url
    argv = fleet.train("--steps 30 --step-sleep 0.3 --ckpt-every 10 " + QUICK)
    job = started_job(run_fab(*argv, "--max-restarts", "1"))
    wait_for("a checkpoint in the bucket", lambda: bucket_steps(moto_url, job))
    saved = bucket_steps(moto_url, job)[-1]
    node1 = jobs / job / "node-1"
    victim = min(int(p.read_text()) for p in node1.glob("rank-*.pid"))
    os.kill(victim, signal.SIGKILL)
    row = wait_for(
        "the run's end",
        lambda: (r := one_job(two_nodes, jobs))["state"] not in ("running", "starting") and r,
        timeout=300,
    )
    assert (row["state"], row["attempt"]) == ("succeeded", 2), row
    first, second = row["attempts"]
    assert first["reason"] == "crash" and first["node"] == 1, first
    assert first["rank"] in (2, 3) and first["signal"] == "SIGKILL", first
    assert second["reason"] == "succeeded" and second["resumed_from"]["step"] >= saved, second
    assert bucket_steps(moto_url, job)[-1] == 30
    restores = [
        [(e.get("version"), e.get("step")) for e in events(jobs, job, r) if e["event"] == "restore"]
        for r in (0, 1)
    ]
    assert restores[0] == restores[1] and len(restores[0]) == 1, restores
    table = run_fab("jobs", "--inventory", str(two_nodes), "--jobs-dir", str(jobs))
    assert "attempt 1: crash (node 1, rank" in table.stdout, table.stdout


@pytest.mark.slow
def test_cancel_stops_every_rank_gracefully_and_saves_the_last_checkpoint(
    fleet: TrainFleet,
) -> None:
    two_nodes, jobs, moto_url = fleet.inventory, fleet.jobs, fleet.moto_url
    argv = fleet.train("--steps 400 --step-sleep 0.2 --ckpt-every 1000 " + QUICK)
    job = started_job(run_fab(*argv, "--name", "cancel-me"))
    log0 = jobs / job / "logs" / "rank-0.log"
    wait_for("a few steps", lambda: log0.exists() and "step 10 loss" in log0.read_text())
    out = run_fab(
        "cancel", "cancel-me", "--wait", "60", "--inventory", str(two_nodes), "--jobs-dir",
        str(jobs), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert one_job(two_nodes, jobs)["state"] == "cancelled"
    text = log0.read_text()
    stopped = re.search(r"stopping at step (\d+) \(SIGTERM\)", text)
    assert stopped, text[-2000:]
    # No periodic checkpoint was due (every 1000 steps): this one is the graceful stop's.
    assert bucket_steps(moto_url, job) == [int(stopped.group(1))]
    head = next(s for s in states(jobs, job) if s["node_rank"] == 0)
    assert head["final_sync"]["ok"] is True
    kinds = [(e["event"], e.get("state")) for e in events(jobs, job)]
    assert ("cancel", None) in kinds and kinds[-1] == ("end", "cancelled")


def test_bad_input_is_refused_in_one_line_before_any_node_changes(
    sshd_server: SshServer, place: dict[str, Path], tmp_path: Path, moto_url: str
) -> None:
    closed = free_port()  # nothing listens here
    inv = inventory(
        tmp_path, [(sshd_server, sshd_server.port)], place["scratch"], sshd_server.user,
        sshd_server.key_path,
    )  # fmt: skip
    jobs = place["jobs"] / "never"
    base = ["train", "--inventory", str(inv), "--jobs-dir", str(jobs), "--cpu"]

    missing = run_fab(*base, "--script", "examples/nope.py")
    assert missing.returncode == 2 and "--script examples/nope.py: no such file" in missing.stderr

    big = run_fab(*base, "--script", "examples/train_lm.py", "--max-workdir-mb", "0.001")
    assert big.returncode == 2 and "over the 0 MB limit" in big.stderr

    no_torch = run_fab(*base, "--script", "examples/train_lm.py", "--venv", "/nonexistent/venv")
    assert no_torch.returncode == 2
    assert "torch is not installed in /nonexistent/venv" in no_torch.stdout + no_torch.stderr
    assert "fab setup" in no_torch.stdout + no_torch.stderr

    two = inventory(
        tmp_path, [(sshd_server, sshd_server.port), (None, closed)], place["scratch"],
        sshd_server.user, sshd_server.key_path,
    )  # fmt: skip
    gone = run_fab(
        "train", "--inventory", str(two), "--jobs-dir", str(jobs), "--cpu", "--script",
        "examples/train_lm.py",
    )  # fmt: skip
    out = gone.stdout + gone.stderr
    assert gone.returncode == 2, out
    # Every node's problem is reported, each on its own line (this node has no venv either).
    # the runner names the cause of an SSH failure (here: nothing listens on the port)
    assert f"gpufleet: gpufleet-node@127.0.0.1:{closed}: connection refused" in out
    assert f"gpufleet: node-0 (127.0.0.1:{sshd_server.port}): torch is not installed" in out
    assert "2 of 2 node(s) not ready: nothing started" in out
    assert "Traceback" not in out
    # Issue 24: the per-node lines went to stdout, the summary to stderr.
    assert "gpufleet:" not in gone.stdout and "torch is not installed" in gone.stderr
    assert not jobs.exists()  # nothing was created on the reachable node either

    # Issue 39: a placeholder fab does not know, on a new job or a resume, and an option a
    # resume cannot change: one line each, before any node is contacted.
    typo = run_fab(*base, "--script", "examples/train_lm.py", "--args", "--out {ckpt_dir}")
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert typo.stderr.startswith("gpufleet: --args '{ckpt_dir}': unknown placeholder")
    assert "({{ and }} write a brace)" in typo.stderr and len(typo.stderr.splitlines()) == 1
    for extra, says in (
        (["--resume-args", "--from {newest}"], "{newest} needs a pattern"),
        (["--workdir", "examples"], "--workdir: a resume runs from the job's recorded"),
    ):
        bad = run_fab("train", "--inventory", str(two), "--jobs-dir", str(jobs), "--resume",
                      "some-job", *extra)  # fmt: skip
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
        assert "connection refused" not in bad.stderr  # the closed port was never tried
    assert not jobs.exists()

    unknown = run_fab("logs", "no-such-job", "--inventory", str(inv), "--jobs-dir", str(jobs))
    assert unknown.returncode == 2 and "no job 'no-such-job' on these nodes" in unknown.stderr


@pytest.fixture(scope="module")
def node_without_sftp(sshd_server: SshServer) -> Iterator[SshServer]:
    server = start_sshd(sftp=False)
    try:
        yield server
    finally:
        stop_sshd(server)


def test_a_node_without_the_sftp_subsystem_is_named_as_such(
    node_without_sftp: SshServer, sshd_server: SshServer
) -> None:
    # Issue 24: this said "SSH connection lost: Channel closed."
    dest = f"/tmp/gpufleet-put-{os.getpid()}"
    with node_without_sftp.connection() as conn, pytest.raises(StepFailed) as refused:
        put_bytes(conn, b"workdir", dest)
    assert str(refused.value).startswith("the node's sshd has no SFTP subsystem")
    assert "Subsystem sftp internal-sftp" in str(refused.value)
    with sshd_server.connection() as conn:
        put_bytes(conn, b"workdir", dest)  # the same copy where sshd has it
        assert conn.run(f"cat {dest} && rm {dest}", hide=True, in_stream=False).stdout == "workdir"


@pytest.fixture
def one_node(
    sshd_server: SshServer, node_venv: tuple[Path, FabResult], place: dict[str, Path],
    tmp_path: Path, moto_url: str,
) -> TrainFleet:  # fmt: skip
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout + installed.stderr
    inv = inventory(
        tmp_path, [(sshd_server, sshd_server.port)], place["scratch"], sshd_server.user,
        sshd_server.key_path,
    )  # fmt: skip
    return TrainFleet(inv, venv, place["jobs"], moto_url)


def resume(fleet: TrainFleet, job: str, *extra: str) -> FabResult:
    return run_fab(
        "train", "--resume", job, "--inventory", str(fleet.inventory), "--jobs-dir",
        str(fleet.jobs), *extra, timeout=400,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("known_venvs")
def test_a_resume_with_nothing_to_restore_stops_unless_told_to_start_from_scratch(
    one_node: TrainFleet,
) -> None:
    # A job that fails before its first checkpoint: nothing on the node, nothing in the bucket.
    argv = [a if a != "2" else "1" for a in one_node.train("--steps 3 --no-such-flag")]
    failed = run_fab(*argv, "--follow", timeout=400)
    job = re.search(r"job (\S+) running on 1 node", failed.stdout)
    assert failed.returncode == 1 and job, failed.stdout[-2000:] + failed.stderr[-2000:]
    job_id = job.group(1)
    assert one_job(one_node.inventory, one_node.jobs)["state"] == "failed"

    # Issue 24: this said "resumed" and trained from step 0.
    refused = resume(one_node, job_id)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("gpufleet:")]
    assert line.startswith(f"gpufleet: job {job_id}: nothing to restore (no local files; no ")
    assert line.endswith("--from-scratch starts it again from step 0")
    assert one_job(one_node.inventory, one_node.jobs)["attempt"] == 1  # nothing started

    again = resume(one_node, job_id, "--from-scratch", "--follow")
    # Issue 39: "resumed" only when a checkpoint was restored.
    assert f"job {job_id} restarted on 1 node" in again.stdout, again.stdout[-2000:]
    assert "resumed" not in again.stdout.replace("resumed on", "")
    assert "nothing to restore" in again.stdout and "(--from-scratch)" in again.stdout
    assert one_job(one_node.inventory, one_node.jobs)["attempt"] == 2


@pytest.mark.slow
@pytest.mark.usefixtures("known_venvs")
def test_a_succeeded_job_is_not_rerun_nor_cancelled_without_being_asked(
    one_node: TrainFleet,
) -> None:
    argv = [a if a != "2" else "1" for a in one_node.train("--steps 4 --ckpt-every 2")]
    done = run_fab(*argv, "--follow", timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    job = one_job(one_node.inventory, one_node.jobs)
    assert job["state"] == "succeeded"

    # Issue 24: this reran the job (exit 0, no warning).
    refused = resume(one_node, job["job"])
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout[-2000:]
    assert refused.stderr.strip() == (
        f"gpufleet: job {job['job']} already succeeded: nothing to resume (--rerun runs it again)"
    )
    # ... and cancelling it reported "changed"; cancel takes train's --s3-endpoint too.
    cancelled = run_fab(
        "cancel", job["job"], "--inventory", str(one_node.inventory), "--jobs-dir",
        str(one_node.jobs), "--s3-endpoint", one_node.moto_url, "--json",
    )  # fmt: skip
    assert cancelled.returncode == 0, cancelled.stderr
    step = cancelled.step("cancel")
    assert step["status"] == "ok" and "already succeeded" in step["message"], step
    assert one_job(one_node.inventory, one_node.jobs)["state"] == "succeeded"

    rerun = resume(one_node, job["job"], "--rerun", "--follow")
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert "resumed from step 4" in rerun.stdout
    assert one_job(one_node.inventory, one_node.jobs)["attempt"] == 2


# Saves as most scripts do (as pytorch/examples' ddp-tutorial-series multinode.py does):
# one torch.save file, rewritten every epoch, loaded when it is there. Our own code.
SNAPSHOT_SCRIPT = """\
import argparse, os, time
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int)
p.add_argument("--sleep", type=float)
a = p.parse_args()
path = os.path.join(os.environ["GPUFLEET_CHECKPOINT_DIR"], "snapshot.pt")
dist.init_process_group("gloo")
start = 0
if os.path.exists(path):
    start = torch.load(path)["epoch"] + 1
    print(f"Resuming training from snapshot at Epoch {start}", flush=True)
for epoch in range(start, a.epochs):
    time.sleep(a.sleep)
    if dist.get_rank() == 0:
        torch.save({"epoch": epoch}, path)
    print(f"epoch {epoch} done", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.usefixtures("known_venvs")
def test_a_plain_torch_save_job_resumes_from_the_bucket_on_an_emptied_node(
    one_node: TrainFleet, place: dict[str, Path], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "multinode.py").write_text(SNAPSHOT_SCRIPT)
    # An epoch every 3 s: the folder is quiet long enough between saves for a version.
    argv = one_node.train("--epochs 10 --sleep 3")
    argv[argv.index("examples/train_lm.py")] = str(work / "multinode.py")
    argv[argv.index("--nproc-per-node") + 1] = "1"
    job = re.search(r"job (\S+) running on 1 node", (started := run_fab(*argv)).stdout)
    assert started.returncode == 0 and job, started.stdout[-2000:] + started.stderr[-2000:]
    job_id = job.group(1)
    versions = f"checkpoints/node-0/{job_id}/.gpufleet/versions/"

    def folder_saved() -> bool:
        listed = s3(one_node.moto_url).list_objects_v2(Bucket=BUCKET, Prefix=versions)
        return bool(listed.get("Contents"))

    wait_for("the job's folder in the bucket", folder_saved)
    time.sleep(2)
    kill_job(one_node.jobs, job_id)
    wait_for(
        "the job read as interrupted",
        lambda: one_job(one_node.inventory, one_node.jobs)["state"] == "interrupted",
    )
    # A stop wiped the instance store: only the bucket has the job's snapshot.pt.
    shutil.rmtree(place["scratch"] / "checkpoints" / job_id)

    resumed = resume(one_node, job_id, "--follow")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    start = re.search(r"Resuming training from snapshot at Epoch (\d+)", resumed.stdout)
    assert start and 0 < int(start.group(1)) < 10, resumed.stdout[-3000:]
    assert "epoch 9 done" in resumed.stdout
    # The follow shows this attempt only: the killed one's lines are not replayed.
    assert "epoch 0 done" not in resumed.stdout and "attempt 1," not in resumed.stdout
    assert one_job(one_node.inventory, one_node.jobs)["state"] == "succeeded"


def _check_line(result: FabResult, jobs: Path) -> str:
    """The launch's train-check line. The job it started is not what the test is about: it
    is stopped at once, so that it does not train (and import torch twice) on the CPUs the
    next launch's check needs, nor upload into the bucket after the test."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stop_live_jobs(jobs, started_job(result, nodes=1))
    (line,) = [ln for ln in result.stdout.splitlines() if "] train-check: " in ln]
    return line


@pytest.mark.slow
def test_train_check_imports_torch_once_per_node_and_venv_until_either_changes(
    one_node: TrainFleet, second_node: SshServer, place: dict[str, Path], tmp_path: Path
) -> None:
    # Issue 24: every launch imported torch on the node (2.3-4.7 s) to read its version.
    argv = [a if a != "2" else "1" for a in one_node.train("--steps 2")]
    jobs = one_node.jobs
    first = _check_line(run_fab(*argv), jobs)
    assert "(known venv)" not in first and "torch 2." in first
    cache = Path(os.environ["HOME"]) / ".cache" / "gpufleet" / "train-check.json"
    (entry,) = json.loads(cache.read_text())["entries"].values()
    assert entry["torch"] in first and entry["venv_id"]

    assert "(known venv)" in _check_line(run_fab(*argv), jobs)  # the node said: same venv

    # The venv changed (torch reinstalled: its version.py rewritten): imported again.
    (version,) = one_node.venv.glob("lib/python3*/site-packages/torch/version.py")
    os.utime(version, (time.time(), time.time() + 5))
    assert "(known venv)" not in _check_line(run_fab(*argv), jobs)
    assert "(known venv)" in _check_line(run_fab(*argv), jobs)

    # Another node (its own host key), the same venv path and files: not known there.
    other = inventory(
        tmp_path, [(second_node, second_node.port)], place["scratch"], second_node.user,
        second_node.key_path,
    )  # fmt: skip
    moved = list(argv)
    moved[moved.index("--inventory") + 1] = str(other)
    assert "(known venv)" not in _check_line(run_fab(*moved), jobs)
    assert len(json.loads(cache.read_text())["entries"]) == 2


# Checkpoints as nanoGPT's train.py keeps them (our own code, its names): one ckpt.pt in
# --out_dir holding iter_num, loaded only with --init_from=resume; otherwise it says
# "Initializing a new model from scratch" and starts at iter 1. --fail_at ends the run
# with an error after that iter's save (as a crash would, with the checkpoint saved).
RESUMABLE_SCRIPT = """\
import argparse, os, sys, time
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int)
p.add_argument("--out_dir")
p.add_argument("--init_from", default="scratch")
p.add_argument("--fail_at", type=int, default=-1)
a = p.parse_args()
print("argv " + " ".join(sys.argv[1:]), flush=True)
dist.init_process_group("gloo")
path = os.path.join(a.out_dir, "ckpt.pt")
start = 0
if a.init_from == "resume":
    start = torch.load(path)["iter_num"]
    print(f"resuming from iter {start}", flush=True)
else:
    print("Initializing a new model from scratch", flush=True)
for it in range(start + 1, a.steps + 1):
    time.sleep(0.2)
    if dist.get_rank() == 0:
        torch.save({"iter_num": it}, path)
    print(f"iter {it} done", flush=True)
    if it == a.fail_at:
        sys.exit(3)
dist.destroy_process_group()
"""


def resumable_job(fleet: TrainFleet, tmp_path: Path, script_args: str) -> list[str]:
    """``fab train`` of RESUMABLE_SCRIPT on one process per node."""
    work = tmp_path / "nanolike"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(RESUMABLE_SCRIPT)
    argv = fleet.train(script_args)
    argv[argv.index("examples/train_lm.py")] = str(work / "train.py")
    argv[argv.index("--nproc-per-node") + 1] = "1"
    return argv


def failed_job(fleet: TrainFleet, place: dict[str, Path], tmp_path: Path, args: str) -> str:
    """A job that saved a checkpoint, failed, and whose node lost its checkpoint folder (a
    stop wipes instance-store NVMe): only the bucket has it."""
    done = run_fab(*resumable_job(fleet, tmp_path, args), "--follow", timeout=400)
    job = re.search(r"job (\S+) running on 1 node", done.stdout)
    assert done.returncode == 1 and job, done.stdout[-3000:] + done.stderr[-3000:]
    assert one_job(fleet.inventory, fleet.jobs)["state"] == "failed"
    shutil.rmtree(place["scratch"] / "checkpoints" / job.group(1))
    return job.group(1)


def job_json(jobs: Path, job: str) -> dict[str, Any]:
    return dict(json.loads((jobs / job / "job.json").read_text()))


@pytest.mark.slow
@pytest.mark.usefixtures("known_venvs")
def test_a_resume_applies_new_args_adds_the_resume_args_and_says_what_it_resumed(
    one_node: TrainFleet, place: dict[str, Path], tmp_path: Path
) -> None:
    jobs = one_node.jobs
    job = failed_job(one_node, place, tmp_path, "--steps 8 --out_dir={checkpoint_dir} --fail_at 3")
    ckpt = place["scratch"] / "checkpoints" / job
    assert job_json(jobs, job)["args"] == ["--steps", "8", "--out_dir={checkpoint_dir}",
                                           "--fail_at", "3"]  # fmt: skip

    # Issue 39: `--resume JOB --args ...` exited 0 and ran the recorded args.
    resumed = resume(
        one_node, job, "--args", "--steps 5 --out_dir={checkpoint_dir}",
        "--resume-args", "--init_from=resume", "--follow",
    )  # fmt: skip
    out = resumed.stdout
    assert resumed.returncode == 0, out[-3000:] + resumed.stderr[-3000:]
    assert f"job {job}, attempt 2: --args, --resume-args as given now" in out
    said = re.search(rf"job {job} resumed on 1 node\(s\) x 1 process\(es\), from (.*)", out)
    assert said and said.group(1).startswith("version ") and "(step 3)" in said.group(1), out
    # The placeholders were filled in on the node, the resume args added after the args.
    assert f"argv --steps 5 --out_dir={ckpt} --init_from=resume" in out
    assert "resuming from iter 3" in out and "iter 5 done" in out
    assert "iter 1 done" not in out and "from scratch" not in out
    recorded = job_json(jobs, job)
    assert recorded["args"] == ["--steps", "5", "--out_dir={checkpoint_dir}"]
    assert recorded["resume_args"] == ["--init_from=resume"]
    assert recorded["changed"] == ["args", "resume_args"] and recorded["attempt"] == 2
    row = one_job(one_node.inventory, jobs)
    assert (row["state"], row["attempt"]) == ("succeeded", 2)
    assert row["resumed_from"]["step"] == 3 and row["warnings"] == []

    # Run again without the resume args: the script starts from scratch and writes iter 2
    # over the restored iter 5. fab jobs and fab logs say both.
    again = resume(
        one_node, job, "--rerun", "--resume-args", "", "--args",
        "--steps 2 --out_dir={checkpoint_dir}", "--follow",
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Initializing a new model from scratch" in again.stdout
    assert job_json(jobs, job)["resume_args"] == []
    row = wait_for("the attempt's warnings",
                   lambda: (r := one_job(one_node.inventory, jobs))["warnings"] and r)  # fmt: skip
    text = " ".join(row["warnings"])
    assert "from scratch" in text, row["warnings"]
    table = run_fab(
        "jobs", "--inventory", str(one_node.inventory), "--jobs-dir", str(jobs),
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert "  warning: " in table.stdout and "  resumed from version " in table.stdout
    assert all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
    logs = run_fab("logs", job, "--inventory", str(one_node.inventory), "--jobs-dir", str(jobs))
    assert f"gpufleet: job {job}: warning: " in logs.stderr, logs.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("known_venvs")
def test_a_resume_whose_bucket_answers_503_to_every_get_fails_and_starts_nothing(
    one_node: TrainFleet, place: dict[str, Path], tmp_path: Path
) -> None:
    from tests.support.fault_proxy import Fault, fault_proxy

    jobs = one_node.jobs
    job = failed_job(one_node, place, tmp_path, "--steps 4 --out_dir={checkpoint_dir} --fail_at 2")
    with fault_proxy(one_node.moto_url) as proxy:
        # Every download of a checkpoint file is throttled; the listing answers.
        proxy.add(Fault("status", method="GET", path=r"/\.gpufleet/objects/", times=10_000))
        refused = resume(
            one_node, job, "--s3-endpoint", proxy.url, "--resume-args", "--init_from=resume",
        )  # fmt: skip
        assert proxy.requests("GET", fault="status"), proxy.seen
    err = refused.stderr
    assert refused.returncode == 1, refused.stdout[-3000:] + err[-3000:]
    (line,) = [ln for ln in err.splitlines() if "restore failed: " in ln]
    assert line.startswith("gpufleet: node-0 (") and "throttled" in line, err
    assert err.splitlines()[-1] == (
        f"gpufleet: job {job}: not resumed: 1 of 1 node(s) could not restore its "
        "checkpoint; nothing started"
    )
    assert "resumed" not in refused.stdout and "Traceback" not in err
    row = one_job(one_node.inventory, jobs)
    assert (row["state"], row["attempt"]) == ("failed", 1)  # no supervisor ran
    assert not (place["scratch"] / "checkpoints" / job / "ckpt.pt").exists()

    # The bucket answers again: the same attempt number, and the job goes on from iter 2.
    ok = resume(one_node, job, "--s3-endpoint", one_node.moto_url, "--follow")
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "resuming from iter 2" in ok.stdout and "iter 4 done" in ok.stdout
    assert one_job(one_node.inventory, jobs)["attempt"] == 2
