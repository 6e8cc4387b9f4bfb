"""`fab install-watchdog`, `fab keep-alive` and `fab idle-status` over real SSH (loopback sshd).

The test node has no systemd as PID 1, so the timer is not enabled
(``--no-watchdog-timer``); the files, the config, the lease, the status and the proof that
scratch can be saved (a probe object written into a moto S3 bucket with credentials from a
fake metadata service, all on 127.0.0.1) go through the real tasks and the real watchdog on
the node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap.tasks import watchdog as fabdog
from tests.bootstrap.conftest import node_dir, run_fab
from tests.gpufleet_node.watchdog_fakes import FakeIMDS, serve
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer

BUCKET = "gpufleet-local-test"

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


@pytest.fixture(scope="module")
def cloud() -> Iterator[dict[str, str]]:
    """moto (S3) and a fake instance metadata service (role credentials) for the node."""
    imds = FakeIMDS(tags={"managed-by": "gpufleet"})
    with moto_server() as moto, serve(imds.handler()) as imds_url:
        s3 = boto3.client(
            "s3",
            endpoint_url=moto,
            region_name="us-east-1",
            aws_access_key_id="testing",  # module scope: before the autouse credential fixture
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket=BUCKET)
        yield {"storage-endpoint": moto, "metadata-url": imds_url, "api-endpoint": moto}


def path_args(paths: dict[str, str], *names: str) -> list[str]:
    return [arg for n in names for arg in (f"--{n}", paths[n])]


def inventory(tmp_path: Path, server: SshServer, bucket: str = BUCKET) -> str:
    path = tmp_path / "stack.json"
    data = server.inventory(bucket=bucket, idle={"idle_minutes": 20})
    path.write_text(json.dumps(data))
    return str(path)


def install_args(inv: str, paths: dict[str, str], cloud: dict[str, str]) -> list[str]:
    args = ["install-watchdog", "--inventory", inv, "--no-watchdog-timer", "--json"]
    args += path_args(paths, "prefix", "etc", "unit-dir", "state-dir")
    return args + path_args(cloud, "storage-endpoint", "metadata-url", "api-endpoint")


def test_install_watchdog_puts_files_config_proves_the_sync_and_is_idempotent(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    inv = inventory(tmp_path, sshd_server)
    args = install_args(inv, node_paths, cloud)
    first = run_fab(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    step = first.step("install-watchdog")
    assert step["status"] == "changed"
    assert step["message"].split(";")[1].strip().startswith("keep:")
    assert (
        f"sync ok (wrote and read back s3://{BUCKET}/.gpufleet/sync-check/local-0)"
        in (step["message"])
    )
    config = json.loads((Path(node_paths["etc"]) / "watchdog.json").read_text())
    assert config["bucket"] == BUCKET
    assert config["node"] == "local-0"
    assert config["role"] == "head"
    assert config["idle_minutes"] == 20
    assert config["scratch_kind"] == "nvme"
    for name in ("idle_rules.py", "bucket.py"):
        installed = Path(node_paths["prefix"]) / "gpufleet_node" / name
        assert installed.read_bytes() == (fabdog.UNIT_SOURCE / name).read_bytes()
    assert (Path(node_paths["unit-dir"]) / fabdog.TIMER).exists()
    s3 = boto3.client("s3", endpoint_url=cloud["storage-endpoint"], region_name="us-east-1")
    assert s3.head_object(Bucket=BUCKET, Key=".gpufleet/sync-check/local-0")["ContentLength"] > 0

    second = run_fab(*args)
    assert second.returncode == 0, second.stderr
    assert second.step("install-watchdog")["status"] == "ok"


def test_install_watchdog_fails_the_host_whose_bucket_cannot_be_written(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    inv = inventory(tmp_path, sshd_server, bucket="gpufleet-never-created")
    done = run_fab(*install_args(inv, node_paths, cloud))
    assert done.returncode == 1
    step = done.step("install-watchdog")
    assert step["status"] == "failed"
    assert "scratch cannot be saved from this node" in step["message"]
    assert "NoSuchBucket" in step["message"]


def test_keep_alive_writes_the_lease_that_idle_status_then_reports(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    inv = inventory(tmp_path, sshd_server)
    assert run_fab(*install_args(inv, node_paths, cloud)).returncode == 0

    lease = run_fab(
        "keep-alive", "--inventory", inv, "--hours", "3", "--json",
        *path_args(node_paths, "prefix", "etc"),
    )  # fmt: skip
    assert lease.returncode == 0, lease.stderr
    step = lease.step("keep-alive")
    assert step["status"] == "changed"
    assert step["message"].startswith("kept until ")
    # The node tagged itself (instance id and role credentials from the fake metadata
    # service, CreateTags into moto's EC2) and wrote the file its own watchdog reads.
    assert step["details"]["tag"] == "set", step
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
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    inv = inventory(tmp_path, sshd_server)
    assert run_fab(*install_args(inv, node_paths, cloud)).returncode == 0
    lease = run_fab(
        "keep-alive", "--inventory", inv, "--hours", "1000", "--json",
        *path_args(node_paths, "prefix", "etc"),
    )  # fmt: skip
    # refused before any connection, exit status 2, naming the number as typed
    assert lease.returncode == 2 and lease.stdout == ""
    assert "--hours 1000: give a number above 0 and at most 336" in lease.stderr
    assert "1000.0" not in lease.stderr and "Traceback" not in lease.stderr


def test_idle_status_without_a_watchdog_says_how_to_install_it(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path
) -> None:
    inv = inventory(tmp_path, sshd_server)
    status = run_fab(
        "idle-status", "--inventory", inv, "--json", *path_args(node_paths, "prefix", "etc")
    )
    assert status.returncode != 0
    assert "fab install-watchdog" in status.step("idle-status")["message"]


def test_idle_status_line_names_a_refused_power_off_and_unreadable_signals() -> None:
    status = {
        "action": "stop",
        "reason": "idle 20 min >= 15 min",
        "power_off_refused_since": "2026-03-01T09:00:00+00:00",
        "unsynced_files": 3,
        "unreadable": ["instance tags unreadable (metadata service: HTTP 500)"],
    }
    line = fabdog.idle_status_message(status, "idle 20/15 min")
    assert line == (
        "stop: idle 20 min >= 15 min (idle 20/15 min); POWER-OFF REFUSED since "
        "2026-03-01T09:00:00+00:00: 3 checkpoint file(s) not in the bucket; instance tags "
        "unreadable (metadata service: HTTP 500)"
    )
    calm = {"action": "keep", "reason": "lease until X", "unsynced_files": 0, "unreadable": []}
    line = fabdog.idle_status_message(calm, "no idle clock")
    assert line == "keep: lease until X (no idle clock)"


def test_setup_uses_this_install_step() -> None:
    from bootstrap.tasks.setup import setup_steps

    assert fabdog.install_watchdog_step in setup_steps()


def test_install_watchdog_with_a_space_in_prefix_and_etc_arms_a_unit_that_runs_it(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    """--prefix / --etc with a space: the files, the shell commands and the unit's
    ExecStart all name the same place (the timer cannot be armed without systemd as PID 1,
    so the unit's own command line is run instead, with `status` for `run`)."""
    from tests.bootstrap.tasks.test_watchdog_unit import environment, exec_start_argv

    spaced = {
        **node_paths,
        "prefix": node_paths["prefix"] + "/my tools",
        "etc": node_paths["etc"] + "/my etc",
    }
    inv = inventory(tmp_path, sshd_server)
    done = run_fab(*install_args(inv, spaced, cloud))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.step("install-watchdog")["status"] == "changed"
    unit = (Path(spaced["unit-dir"]) / fabdog.SERVICE).read_text()
    argv = exec_start_argv(unit)
    assert argv[1:3] == ["-m", "gpufleet_node.watchdog"]
    assert argv[3:] == ["run", "--config", f"{spaced['etc']}/watchdog.json"]
    env = environment(unit)
    assert env == {"PYTHONPATH": spaced["prefix"]}
    status = subprocess.run(
        ["python3", *argv[1:3], "status", "--json", *argv[4:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
        cwd="/",
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["action"]
    again = run_fab(*install_args(inv, spaced, cloud))
    assert again.returncode == 0, again.stderr
    assert again.step("install-watchdog")["status"] == "ok"


# What a node set up by gpufleet before f23798a holds flat under the prefix (a sample: the
# loop, two concerns, the shared modules, the node clouds and compiled copies).
OLD_FLAT = (
    "watchdog.py",
    "watchdog_config.py",
    "watchdog_state.py",
    "bucket.py",
    "idle_rules.py",
    "fleet_names.py",
    "scratch_sync.py",
    "clouds/__init__.py",
    "clouds/base.py",
)
OLD_COMPILED = (
    "__pycache__/watchdog_config.cpython-310.pyc",
    "clouds/__pycache__/base.cpython-310.pyc",
)


def plant_old_flat_install(prefix: Path) -> None:
    for name in (*OLD_FLAT, *OLD_COMPILED):
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_text("# an older gpufleet's flat watchdog file\n")


def test_install_watchdog_removes_an_older_flat_install_and_says_so_once(
    sshd_server: SshServer, node_paths: dict[str, str], tmp_path: Path, cloud: dict[str, str]
) -> None:
    prefix = Path(node_paths["prefix"])
    plant_old_flat_install(prefix)
    (prefix / "notes.txt").write_text("not gpufleet's\n")
    inv = inventory(tmp_path, sshd_server)
    args = install_args(inv, node_paths, cloud)
    first = run_fab(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    step = first.step("install-watchdog")
    assert step["status"] == "changed"
    line = f"removed {len(OLD_FLAT)} file(s) of an older flat install from {prefix} "
    assert step["message"].endswith(line + f"(the unit runs {prefix}/gpufleet_node/)"), step
    # the flat files, their compiled copies and the emptied folders gone; the rest stays
    assert sorted(p.name for p in prefix.iterdir()) == ["gpufleet_node", "notes.txt"]
    assert (prefix / "gpufleet_node" / "watchdog.py").is_file()

    again = run_fab(*args)
    assert again.returncode == 0, again.stderr
    assert again.step("install-watchdog")["status"] == "ok"
    assert "older flat install" not in again.step("install-watchdog")["message"]


def test_the_flat_files_go_only_where_a_flat_watchdog_was(tmp_path: Path) -> None:
    """The removal runs as root: a prefix without a flat watchdog*.py keeps its bucket.py,
    a missing prefix is no error, and a link is not followed."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "bucket.py").write_text("someone else's\n")
    missing = tmp_path / "never made"
    linked = tmp_path / "with a link"
    plant_old_flat_install(linked)
    (linked / "bucket.py").unlink()
    (linked / "bucket.py").symlink_to(plain / "bucket.py")
    for prefix, printed in ((plain, ""), (missing, ""), (linked, None)):
        done = subprocess.run(
            ["sh", "-c", fabdog.old_flat_command(str(prefix))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        if printed is not None:
            assert done.stdout == printed
    assert (plain / "bucket.py").read_text() == "someone else's\n"
    assert not missing.exists()
    assert sorted(p.name for p in linked.iterdir()) == ["bucket.py"]
    assert (linked / "bucket.py").is_symlink()
