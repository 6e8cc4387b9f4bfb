"""``fab top`` over two real sshd "nodes" on 127.0.0.1, each with a fake ``nvidia-smi`` on
its PATH (sshd_config SetEnv) printing the recorded shapes in tests/fixtures/top, a job
state written as gpufleet_node/job_runner.py's contract says, and the watchdog's state
file. The second node drops its SSH session in the middle of the second refresh."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bootstrap.conftest import run_fab
from tests.support.sshd import SshServer, start_sshd, stop_sshd

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "top"

# A stand-in nvidia-smi: prints this node's recorded output, counts its calls, and on the
# call numbered in drop-at kills the SSH session it runs in (its shell's parent): the
# connection ends in the middle of a refresh, as a node that goes away does.
FAKE_SMI = """#!/bin/sh
d=$(dirname "$0")
n=$(( $(cat "$d/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/calls"
if [ "$n" = "$(cat "$d/drop-at" 2>/dev/null)" ]; then
  kill -9 "$(cut -d' ' -f4 /proc/$PPID/stat)"
  sleep 5
fi
cat "$d/smi.out"
"""


@dataclass
class Node:
    server: SshServer
    bin: Path


def fake_node(base: Path, name: str, fixture: str, key: Path) -> Node:
    bin_dir = base / name / "bin"
    bin_dir.mkdir(parents=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    shutil.copy(FIXTURES / fixture, bin_dir / "smi.out")
    for path in (base / name, bin_dir, bin_dir / "smi.out"):
        path.chmod(0o777 if path.is_dir() else 0o666)
    server = start_sshd(extra_config=[f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin"])
    auth = server.workdir / "authorized_keys"
    auth.write_text(Path(f"{key}.pub").read_text())
    return Node(server, bin_dir)


@pytest.fixture
def place() -> Iterator[Path]:
    base = Path(
        subprocess.check_output(["mktemp", "-d", "/var/tmp/gpufleet-top-XXXX"], text=True).strip()
    )
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def two_nodes(sshd_server: SshServer, place: Path) -> Iterator[list[Node]]:
    nodes = [
        fake_node(place, "node-0", "a100x4_training.csv", sshd_server.key_path),
        fake_node(place, "node-1", "t4x1_starved.csv", sshd_server.key_path),
    ]
    try:
        yield nodes
    finally:
        for n in nodes:
            stop_sshd(n.server)


@pytest.fixture
def supervisor() -> Iterator[int]:
    """A live process the job runner takes for a job's supervisor (its argv names
    gpufleet_node.job_runner and supervise, as _is_supervisor reads /proc/<pid>/cmdline)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
            "gpufleet_node.job_runner",
            "supervise",
        ]
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def write_job(jobs: Path, nodes: list[Node], pid: int) -> None:
    """One job on both nodes, running for 30 min, as fab train leaves it (job.json, each
    node's state.json, the head's rank log)."""
    job = jobs / "train-lm-261202-030000-ab12"
    spec = {
        "schema": "gpufleet.job/1",
        "job": job.name,
        "name": "train-lm",
        "nnodes": 2,
        "nproc_per_node": 1,
        "created_at": "2026-12-02T03:00:00Z",
        "jobs_dir": str(jobs),
        "checkpoint_dir": str(jobs / "ckpt"),
        "nodes": [
            {"name": f"node-{i}", "address": "127.0.0.1", "port": n.server.port}
            for i, n in enumerate(nodes)
        ],
    }
    (job / "logs").mkdir(parents=True)
    (job / "job.json").write_text(json.dumps(spec))
    (job / "logs" / "rank-0.log").write_text("step 10 loss 3.90\nstep 40 loss 3.12\n")
    for rank in (0, 1):
        state = {
            "schema": "gpufleet.job-state/1",
            "job": job.name,
            "name": "train-lm",
            "node_rank": rank,
            "nnodes": 2,
            "nproc_per_node": 1,
            "attempt": 1,
            "state": "running",
            "pid": pid,
            "boot_id": "",
            "started_at": "2026-12-02T03:00:00Z",
            "heartbeat_at": "2026-12-02T03:30:00Z",
            "runtime_s_before": 0.0,
        }
        (job / f"node-{rank}").mkdir()
        (job / f"node-{rank}" / "state.json").write_text(json.dumps(state))
    subprocess.run(["chmod", "-R", "a+rwX", str(jobs)], check=True)


def inventory(place: Path, nodes: list[Node], key: Path, user: str) -> Path:
    data = {
        "stack": "top-test",
        "provider": "aws",
        "region": "us-east-1",
        "tier": {"name": "local", "gpu_count": 0},
        "nodes": [
            {
                "name": f"node-{i}",
                "role": "head" if i == 0 else "worker",
                "instance_id": f"i-{i}",
                "public_ip": "127.0.0.1",
                "private_ip": "127.0.0.1",
                "ssh_port": n.server.port,
            }
            for i, n in enumerate(nodes)
        ],
        "ssh_user": user,
        "ssh_key": str(key),
        "hourly_cost": {"currency": "USD", "billing": "on-demand", "amount": 4.0},
    }
    path = place / "inventory.json"
    path.write_text(json.dumps(data))
    return path


def top_args(inv: Path, place: Path, *extra: str) -> list[str]:
    return [
        "top",
        "--inventory",
        str(inv),
        "--jobs-dir",
        str(place / "jobs"),
        "--state-dir",
        str(place / "state"),
        "--known-hosts",
        str(place / "known_hosts"),
        *extra,
    ]


@pytest.fixture
def fleet(sshd_server: SshServer, two_nodes: list[Node], place: Path, supervisor: int) -> Path:
    (place / "jobs").mkdir()
    write_job(place / "jobs", two_nodes, supervisor)
    state = place / "state"
    state.mkdir()
    watchdog = {
        "samples": [],
        "last_decision": {
            "action": "keep",
            "reason": "stalled job: 1 process(es) hold GPU memory at < 5 % for 62 min",
            "warning": "stalled job; this node stops in 8 min unless the job makes progress",
            "idle_minutes": 62.0,
            "idle_limit_minutes": 15.0,
        },
        "stall_warned": True,
    }
    (state / "watchdog-state.json").write_text(json.dumps(watchdog))
    subprocess.run(["chmod", "-R", "a+rwX", str(state)], check=True)
    return inventory(place, two_nodes, sshd_server.key_path, sshd_server.user)


def test_one_refresh_shows_both_nodes_their_gpus_the_job_and_the_marks(
    fleet: Path, place: Path
) -> None:
    result = run_fab(*top_args(fleet, place, "--once", "--json"), timeout=120)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    head, worker = doc["nodes"]
    assert [g["util_pct"] for g in head["gpus"]] == [98.0, 97.0, 99.0, 97.0]
    assert head["gpus"][0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert worker["gpus"][0]["power_w"] == 27.31
    assert (head["job"]["name"], head["job"]["node_rank"]) == ("train-lm", 0)
    assert worker["job"]["node_rank"] == 1
    assert head["job"]["last_line"] == "step 40 loss 3.12"
    assert head["job"]["cost"] > 0 and head["job"]["currency"] == "USD"
    # the T4 at 3 % while the job runs; both share the state file that warned of a stall
    assert any(m.startswith("under-fed") for m in worker["marks"])
    assert not any(m.startswith("under-fed") for m in head["marks"])
    assert any(m.startswith("stop soon") for m in head["marks"])


def test_the_text_of_one_refresh_fits_80_columns_piped(fleet: Path, place: Path) -> None:
    result = run_fab(*top_args(fleet, place, "--once"), timeout=120, env={"COLUMNS": ""})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.rstrip("\n").splitlines()
    assert lines[0].startswith("fab top: top-test, 2 node(s)")
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if re.match(r"  [! ] node-\d +\dx", line)]
    assert len(rows) == 2 and "4xA100" in rows[0] and "train-lm" in rows[0]
    assert rows[1].startswith("  ! node-1") and "1xT4" in rows[1]
    assert any("under-fed" in line for line in lines)
    Path(os.environ.get("GPUFLEET_TOP_SAMPLE", "/dev/null")).write_text(result.stdout)


def test_a_node_that_drops_mid_refresh_is_shown_lost_then_back_and_the_other_stays(
    fleet: Path, place: Path, two_nodes: list[Node]
) -> None:
    (two_nodes[1].bin / "drop-at").write_text("2\n")
    args = top_args(fleet, place, "--count", "3", "--interval", "0.5", "--json")
    result = run_fab(*args, timeout=180)
    assert result.returncode == 0, result.stderr
    refreshes = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(refreshes) == 3
    assert [n["reachable"] for n in refreshes[0]["nodes"]] == [True, True]
    head, worker = refreshes[1]["nodes"]
    assert head["reachable"] and len(head["gpus"]) == 4
    assert not worker["reachable"] and "no answer" in worker["error"]
    # reconnected on the next refresh, over a new connection
    assert [n["reachable"] for n in refreshes[2]["nodes"]] == [True, True]
    assert refreshes[2]["nodes"][1]["gpus"][0]["name"] == "Tesla T4"
    # the head answered all three refreshes over the one connection it opened
    assert (two_nodes[0].bin / "calls").read_text().strip() == "3"


def test_a_node_that_is_down_fails_the_one_shot_and_says_so(
    fleet: Path, place: Path, two_nodes: list[Node]
) -> None:
    stop_sshd(two_nodes[1].server, remove_workdir=False)
    result = run_fab(*top_args(fleet, place, "--once"), timeout=120, env={"COLUMNS": "80"})
    assert result.returncode == 1
    lost = [line for line in result.stdout.splitlines() if "lost:" in line]
    assert len(lost) == 1 and "node-1" in lost[0] and "connection refused" in lost[0]
    assert "4xA100" in result.stdout  # the node that answered is still shown


def test_ctrl_c_ends_the_live_view_cleanly(fleet: Path, place: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", *top_args(fleet, place, "--interval", "0.5")],
        cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first refresh's header: the view runs
        assert first.startswith("fab top: top-test")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_jobs_folder_the_runner_cannot_be_installed_in_still_shows_the_gpus(
    fleet: Path, place: Path
) -> None:
    (place / "jobs").chmod(0o555)  # the SSH user cannot create jobs/bin
    result = run_fab(*top_args(fleet, place, "--once", "--json"), timeout=120)
    assert result.returncode == 0, result.stderr
    head, _ = json.loads(result.stdout)["nodes"]
    assert len(head["gpus"]) == 4 and head["job"] is None
    assert any(
        m.startswith("jobs unknown: could not install the job runner") for m in head["marks"]
    )
