"""The real tasks, through `fab`, over real SSH to a local sshd (no GPU on this machine)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fabric import Connection

from bootstrap.fleet.api import Host, HostContext, StepResult, step
from bootstrap.fleet.runner import run_fleet
from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens once the socket is closed: connection refused


def test_fab_list_shows_the_bootstrap_tasks() -> None:
    result = run_fab("--list")
    assert result.returncode == 0, result.stderr
    for name in ("setup", "install-driver", "install-pytorch", "mount-scratch", "status"):
        assert name in result.stdout


def test_setup_on_a_node_without_gpu_fails_at_the_driver_step_and_says_why(
    sshd_server: SshServer,
) -> None:
    result = run_fab(*sshd_server.fab_args(), "setup", "--json")
    assert result.returncode == 1
    driver = result.step("install-driver")
    assert driver["status"] == "failed"
    assert "no NVIDIA GPU" in driver["message"] and "--allow-no-gpu" in driver["message"]
    later = result.step("install-pytorch")
    assert later["status"] == "skipped" and "install-driver failed" in later["message"]
    assert result.doc["ok"] is False


def test_install_pytorch_puts_the_pinned_torch_in_the_node_venv(
    sshd_server: SshServer, node_venv: tuple[Path, FabResult]
) -> None:
    venv, result = node_venv
    assert result.returncode == 0, result.stdout + result.stderr
    step_ = result.step("install-pytorch")
    assert step_["status"] == "changed"
    assert step_["details"]["torch"] == "2.13.0+cpu"
    assert "CUDA not checked (no NVIDIA GPU)" in step_["message"]
    # The venv is real: its python imports torch and is not the system python.
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import sys, torch; print(torch.__version__, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["2.13.0+cpu", str(venv)]


@pytest.mark.slow
def test_second_setup_changes_nothing_and_says_so(
    sshd_server: SshServer, node_venv: tuple[Path, FabResult]
) -> None:
    venv, _ = node_venv
    args = [
        *sshd_server.fab_args(),
        "setup",
        "--allow-no-gpu",
        "--torch-index",
        "default",
        "--venv",
        str(venv),
        # the test sshd runs without systemd: install the watchdog, do not arm its timer
        "--no-watchdog-timer",
    ]
    first = run_fab(*args, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.step("install-driver")["status"] == "skipped"  # never "ok" without a GPU
    assert first.step("install-pytorch")["status"] == "ok"
    started = time.monotonic()
    second = run_fab(*args)
    elapsed = time.monotonic() - started
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed" in second.stdout
    assert "changed" not in second.stdout.replace("nothing changed", "")
    assert elapsed < 10, f"idempotent re-run took {elapsed:.1f} s"


def test_status_reports_gpu_torch_scratch_and_uptime(
    sshd_server: SshServer, node_venv: tuple[Path, FabResult]
) -> None:
    venv, _ = node_venv
    result = run_fab(*sshd_server.fab_args(), "status", "--venv", str(venv), "--json")
    assert result.returncode == 0, result.stderr
    d = result.step("status")["details"]
    assert d["gpu_count"] == 0 and d["driver"] is None
    assert d["torch"] == "2.13.0+cpu"
    assert d["scratch"] == {"mounted": False}
    assert d["uptime_s"] > 0
    table = run_fab(*sshd_server.fab_args(), "status", "--venv", str(venv))
    assert table.returncode == 0
    assert "2.13.0+cpu" in table.stdout and "/scratch: not mounted" in table.stdout


def watchdog_state_on_the_node(ttl_hours: float, lease_hours: float | None = None) -> Path:
    """A state folder as the node's watchdog leaves it: one real watchdog run (its code, on
    this machine's clock and boot time), busy, with the given TTL and lease."""
    from tests.gpufleet_node.test_watchdog import FakeProbe, Timeline, make_dog, wsignals

    base = node_dir("gpufleet-state-")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    now = dt.datetime.now(dt.UTC)

    class ThisMachine(FakeProbe):
        def boot_time(self) -> dt.datetime:
            return now - dt.timedelta(seconds=uptime)

    dog, _, _ = make_dog(base / "run", Timeline(util=lambda m: 95.0), ttl_hours=ttl_hours)
    dog.probe = ThisMachine(Timeline(util=lambda m: 95.0), clock=now)
    dog.config = dataclasses.replace(dog.config, state_dir=str(base), samples_per_run=1)
    if lease_hours is not None:
        wsignals.write_lease(dog.config, lease_hours, now, None)
    dog.run_once()
    for path in base.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return base


def test_status_shows_the_time_left_before_the_ttl_as_the_watchdog_recorded_it(
    sshd_server: SshServer,
) -> None:
    uptime_h = float(Path("/proc/uptime").read_text().split()[0]) / 3600
    # hours as a stack writes them (a limit tag has at most 6 decimals)
    state = watchdog_state_on_the_node(round(uptime_h + 5, 4))  # stops 5 h from now
    leased = watchdog_state_on_the_node(round(uptime_h + 1, 4), lease_hours=30)
    off = watchdog_state_on_the_node(0)
    try:
        args = [*sshd_server.fab_args(), "status", "--json", "--state-dir"]
        d = run_fab(*args, str(state)).step("status")["details"]["ttl"]
        assert d["state"] == "left" and d["why"] == "ttl"
        assert 5 * 3600 - 120 <= d["seconds"] <= 5 * 3600 + 1
        lease = run_fab(*args, str(leased)).step("status")["details"]["ttl"]
        assert lease["why"] == "lease" and 30 * 3600 - 120 <= lease["seconds"] <= 30 * 3600
        assert run_fab(*args, str(off)).step("status")["details"]["ttl"] == {
            "state": "off",
            "why": "off",
        }
        for columns in ("80", ""):  # piped: COLUMNS=80, and no COLUMNS at all
            shown = run_fab(
                *sshd_server.fab_args(), "status", "--state-dir", str(leased),
                env={"COLUMNS": columns},
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            assert max(len(line) for line in lines) <= 80, shown.stdout
            row = next(line for line in lines if line.startswith("127.0.0.1"))
            assert re.search(r"\b(29h5\dm|30h00m) lease\b", row), row
            assert "TTL held off by a lease" in shown.stdout
    finally:
        for base in (state, leased, off):
            shutil.rmtree(base, ignore_errors=True)


def test_jobs_shows_the_time_left_before_the_ttl_of_a_running_jobs_node(
    sshd_server: SshServer,
) -> None:
    uptime_h = float(Path("/proc/uptime").read_text().split()[0]) / 3600
    state = watchdog_state_on_the_node(round(uptime_h + 2, 4))  # stops 2 h from now
    jobs = node_dir("gpufleet-jobs-")
    jobs.chmod(0o777)  # the SSH user ships the job runner into it
    job = jobs / "lm-261202-080000-ab12"
    (job / "node-0").mkdir(parents=True)
    (job / "logs").mkdir()
    # A live process that reads as the job's supervisor (job_runner.py's own check).
    supervisor = subprocess.Popen(
        ["python3", "-c", "import time; time.sleep(300)", "gpufleet_node.job_runner", "supervise"]
    )
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        (job / "job.json").write_text(json.dumps({"job": job.name, "name": "lm", "nnodes": 1}))
        (job / "logs" / "rank-0.log").write_text("step 40 loss 2.1\n")
        (job / "node-0" / "state.json").write_text(
            json.dumps(
                {
                    "job": job.name, "name": "lm", "node_rank": 0, "nnodes": 1, "attempt": 1,
                    "state": "running", "pid": supervisor.pid, "boot_id": boot_id,
                    "started_at": dt.datetime.now(dt.UTC).isoformat(),
                }
            )
        )  # fmt: skip
        for path in jobs.rglob("*"):
            path.chmod(0o777 if path.is_dir() else 0o666)
        args = [*sshd_server.fab_args(), "jobs", "--jobs-dir", str(jobs), "--state-dir"]
        done = run_fab(*args, str(state), "--json")
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(done.stdout)["jobs"]
        assert row["state"] == "running", row
        assert row["ttl"]["state"] == "left" and 2 * 3600 - 120 <= row["ttl"]["seconds"] <= 7201
        for columns in ("80", ""):
            shown = run_fab(*args, str(state), env={"COLUMNS": columns})
            lines = shown.stdout.splitlines()
            assert max(len(line) for line in lines) <= 80, shown.stdout
            assert re.search(r"running .* (1h5\dm|2h00m)$", shown.stdout, re.M), shown.stdout
            assert "  last: step 40 loss 2.1" in lines
        unknown = run_fab(*args, str(jobs / "nowhere"), "--json")
        (row,) = json.loads(unknown.stdout)["jobs"]
        assert row["ttl"] == {
            "state": "unknown",
            "reason": "no watchdog state (fab install-watchdog)",
        }
    finally:
        supervisor.kill()
        supervisor.wait()
        shutil.rmtree(jobs, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_inventory_file_with_the_sshd_port_drives_the_tasks(
    sshd_server: SshServer, tmp_path: Path
) -> None:
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps(sshd_server.inventory()))
    result = run_fab("status", "--inventory", str(inventory), "--json")
    assert result.returncode == 0, result.stderr
    assert result.host()["name"] == "local-0" and result.host()["port"] == sshd_server.port
    via_env = run_fab("status", "--json", env={"GPUFLEET_INVENTORY": str(inventory)})
    assert via_env.returncode == 0 and via_env.host()["name"] == "local-0"


def test_unreachable_host_is_reported_and_the_good_one_still_runs(
    sshd_server: SshServer,
) -> None:
    bad = f"{sshd_server.user}@127.0.0.1:{closed_port()}"
    result = run_fab(
        "-H",
        f"{sshd_server.host_string()},{bad}",
        "-i",
        str(sshd_server.key_path),
        "status",
        "--json",
    )
    assert result.returncode == 1
    by_port = {h["port"]: h for h in result.doc["hosts"]}
    assert by_port[sshd_server.port]["status"] == "ok"
    down = by_port[int(bad.rsplit(":", 1)[1])]
    assert down["status"] == "unreachable"
    assert "connection refused" in down["error"]


def test_a_key_the_node_does_not_accept_is_reported_as_authentication_failure(
    sshd_server: SshServer,
) -> None:
    result = run_fab(*sshd_server.fab_args(key=sshd_server.wrong_key_path), "status", "--json")
    assert result.returncode == 1
    host = result.host()
    assert host["status"] == "auth-failed"
    assert "wrong key" in host["error"] and str(sshd_server.wrong_key_path) in host["error"]


def test_a_user_without_sudo_is_told_so_before_anything_changes(sshd_server: SshServer) -> None:
    result = run_fab(
        *sshd_server.fab_args(user=sshd_server.nosudo_user), "setup", "--allow-no-gpu", "--json"
    )
    assert result.returncode == 1
    preflight = result.step("preflight")
    assert preflight["status"] == "failed"
    assert "no passwordless sudo" in preflight["message"]
    assert all(s["status"] == "skipped" for s in result.host()["steps"][1:])


def test_missing_pulumi_and_no_hosts_exits_with_advice() -> None:
    result = run_fab("status", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "pulumi CLI is not installed" in result.stderr and "--inventory" in result.stderr


def test_hosts_run_concurrently(sshd_server: SshServer) -> None:
    # Each host's step waits for the other at a barrier: run one after the other, this
    # would time out; run in parallel, both pass.
    barrier = threading.Barrier(2, timeout=10)

    @step("rendezvous")
    def rendezvous(conn: Connection, ctx: HostContext) -> StepResult:
        conn.run("true", hide=True)
        barrier.wait()
        return StepResult.ok("met")

    hosts = [
        Host(
            "127.0.0.1",
            user=sshd_server.user,
            port=sshd_server.port,
            name=f"n{i}",
            key_filename=str(sshd_server.key_path),
        )
        for i in range(2)
    ]
    report = run_fleet("rendezvous", hosts, [rendezvous], lambda h: HostContext(host=h))
    messages = [(h.connection_message, [s.result.message for s in h.steps]) for h in report.hosts]
    assert [h.status for h in report.hosts] == ["ok", "ok"], messages


def test_a_step_that_raises_is_reported_failed_not_crashing_the_run(
    sshd_server: SshServer,
) -> None:
    @step("explodes")
    def explodes(conn: Connection, ctx: HostContext) -> StepResult:
        raise RuntimeError("disk on fire")

    host = Host(
        "127.0.0.1",
        user=sshd_server.user,
        port=sshd_server.port,
        key_filename=str(sshd_server.key_path),
    )
    report = run_fleet("x", [host], [explodes], lambda h: HostContext(host=h))
    record = report.hosts[0].steps[0]
    assert record.result.status == "failed"
    assert record.result.message == "RuntimeError: disk on fire"


def test_no_gpu_steps_are_never_reported_as_passed_with_allow_no_gpu(
    sshd_server: SshServer,
) -> None:
    result = run_fab(*sshd_server.fab_args(), "install-driver", "--allow-no-gpu", "--json")
    assert result.returncode == 0
    assert result.step("install-driver")["status"] == "skipped"


def test_scratch_without_devices_is_skipped_on_this_machine(sshd_server: SshServer) -> None:
    scratch = node_dir("gpufleet-scratch-")
    try:
        result = run_fab(
            *sshd_server.fab_args(),
            "mount-scratch",
            "--path",
            str(scratch / "mnt"),
            "--fstab",
            str(scratch / "fstab"),
            "--json",
        )
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.step("mount-scratch")["status"] == "skipped"
