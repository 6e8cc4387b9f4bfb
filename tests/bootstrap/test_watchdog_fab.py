"""`fab install-watchdog`, `fab keep-alive` and `fab idle-status` over real SSH (loopback sshd).

The test node has no systemd as PID 1, so the timer is not enabled (``--no-enable``); the
files, the config, the lease and the status all go through the real tasks and the real
watchdog on the node.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap import watchdog as fabdog
from tests.bootstrap.conftest import node_dir, run_fab
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration


@pytest.fixture
def node_paths() -> Iterator[dict[str, str]]:
    base = node_dir("gpufleet-watchdog-")
    paths = {
        "prefix": str(base / "opt"),
        "etc": str(base / "etc"),
        "unit-dir": str(base / "units"),
        "state-dir": str(base / "state"),
    }
    yield paths
    shutil.rmtree(base, ignore_errors=True)


def path_args(paths: dict[str, str], *names: str) -> list[str]:
    return [arg for n in names for arg in (f"--{n}", paths[n])]


def inventory(tmp_path: Path, server: SshServer) -> str:
    path = tmp_path / "stack.json"
    data = server.inventory(bucket="gpufleet-local-test", idle={"idle_minutes": 20})
    path.write_text(json.dumps(data))
    return str(path)


def test_install_watchdog_puts_files_config_and_is_idempotent(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, sshd_server)
    args = ["install-watchdog", "--inventory", inv, "--no-enable", "--json"]
    args += path_args(node_paths, "prefix", "etc", "unit-dir", "state-dir")
    first = run_fab(*args)
    assert first.returncode == 0, first.stderr
    step = first.step("install-watchdog")
    assert step["status"] == "changed"
    assert step["message"].split(";")[1].strip().startswith("keep:")
    config = json.loads((Path(node_paths["etc"]) / "watchdog.json").read_text())
    assert config["bucket"] == "gpufleet-local-test"
    assert config["node"] == "local-0"
    assert config["role"] == "head"
    assert config["idle_minutes"] == 20
    installed = Path(node_paths["prefix"]) / "watchdog_policy.py"
    assert installed.read_bytes() == (fabdog.REMOTE_DIR / "watchdog_policy.py").read_bytes()
    assert (Path(node_paths["unit-dir"]) / fabdog.TIMER).exists()

    second = run_fab(*args)
    assert second.returncode == 0, second.stderr
    assert second.step("install-watchdog")["status"] == "ok"


def test_keep_alive_writes_the_lease_that_idle_status_then_reports(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, sshd_server)
    install = ["install-watchdog", "--inventory", inv, "--no-enable", "--json"]
    install += path_args(node_paths, "prefix", "etc", "unit-dir", "state-dir")
    assert run_fab(*install).returncode == 0

    lease = run_fab(
        "keep-alive", "--inventory", inv, "--hours", "3", "--json",
        *path_args(node_paths, "prefix", "etc"),
    )  # fmt: skip
    assert lease.returncode == 0, lease.stderr
    step = lease.step("keep-alive")
    assert step["status"] == "changed"
    assert step["message"].startswith("kept until ")
    # No metadata service or role on the test node: the tag fails, the file is there.
    assert step["details"]["tag"].startswith("failed")
    written = (Path(node_paths["state-dir"]) / "keep-alive-until").read_text().strip()
    assert written == step["details"]["lease_until"]

    status = run_fab(
        "idle-status", "--inventory", inv, "--json", *path_args(node_paths, "prefix", "etc")
    )
    assert status.returncode == 0, status.stderr
    details = status.step("idle-status")["details"]
    assert details["action"] == "keep"
    assert details["lease_until"] == written
    assert "lease until" in details["reason"]


def test_keep_alive_refuses_an_absurd_lease(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, sshd_server)
    install = ["install-watchdog", "--inventory", inv, "--no-enable", "--json"]
    install += path_args(node_paths, "prefix", "etc", "unit-dir", "state-dir")
    assert run_fab(*install).returncode == 0
    lease = run_fab(
        "keep-alive", "--inventory", inv, "--hours", "1000", "--json",
        *path_args(node_paths, "prefix", "etc"),
    )  # fmt: skip
    assert lease.returncode != 0
    assert "at most 336" in lease.step("keep-alive")["message"]


def test_idle_status_without_a_watchdog_says_how_to_install_it(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, sshd_server)
    status = run_fab(
        "idle-status", "--inventory", inv, "--json", *path_args(node_paths, "prefix", "etc")
    )
    assert status.returncode != 0
    assert "fab install-watchdog" in status.step("idle-status")["message"]


def test_setup_uses_this_install_step() -> None:
    from bootstrap.setup import setup_steps

    assert fabdog.install_watchdog in setup_steps()
