"""mount-scratch's real mkfs/mount path on loop devices, through `fab` over SSH."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.tasks.scratch import LABEL
from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.support.real import missing_real_part
from tests.support.sshd import SshServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# each tool mount-scratch runs here, and the Debian package that provides it
LOOP_TOOLS = {
    "losetup": "util-linux",
    "wipefs": "util-linux",
    "blkid": "util-linux",
    "mount": "mount",
    "findmnt": "util-linux",
    "mkfs.ext4": "e2fsprogs",
}


def loop_missing_part() -> tuple[str, str | None] | None:
    """(what is missing, its Debian package) when loop devices cannot be used here."""
    if os.geteuid() != 0:
        return "loop devices need root", None
    for tool, package in LOOP_TOOLS.items():
        if shutil.which(tool) is None:
            return f"no {tool} on PATH", package
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control in this container (run it with --privileged)", None
    return None


@pytest.fixture
def loop_devices() -> Iterator[tuple[Path, list[str]]]:
    """Two 64 MB loop devices and a node-reachable work dir; all torn down afterwards."""
    part = loop_missing_part()
    if part is not None:
        missing_real_part(part[0], package=part[1])
    work = node_dir("gpufleet-loop-")
    devices: list[str] = []
    try:
        for i in range(2):
            image = work / f"disk{i}.img"
            with image.open("wb") as f:
                f.truncate(64 * 1024 * 1024)
            attach = subprocess.run(
                ["losetup", "--find", "--show", str(image)], capture_output=True, text=True
            )
            if attach.returncode != 0:
                missing_real_part(f"losetup cannot attach a loop device: {attach.stderr.strip()}")
            devices.append(attach.stdout.strip())
        yield work, devices
    finally:
        subprocess.run(["umount", "-q", str(work / "scratch")], check=False)
        for dev in devices:
            subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(work, ignore_errors=True)


def mount_scratch(sshd: SshServer, work: Path, device: str, *extra: str) -> FabResult:
    return run_fab(
        *sshd.fab_args(),
        "mount-scratch",
        "--devices",
        device,
        "--path",
        str(work / "scratch"),
        "--fstab",
        str(work / "fstab"),
        "--json",
        *extra,
    )


def findmnt_source(path: Path) -> str:
    return subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(path)], capture_output=True, text=True
    ).stdout.strip()


def test_fresh_device_gets_ext4_mounted_with_nofail_and_a_rerun_changes_nothing(
    sshd_server: SshServer, loop_devices: tuple[Path, list[str]]
) -> None:
    work, (device, _) = loop_devices
    first = mount_scratch(sshd_server, work, device)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.step("mount-scratch")["status"] == "changed"
    assert findmnt_source(work / "scratch") == device
    assert LABEL in subprocess.run(["blkid", "-p", device], capture_output=True, text=True).stdout
    fstab = (work / "fstab").read_text()
    assert f"LABEL={LABEL} {work / 'scratch'} ext4" in fstab and "nofail" in fstab
    # The node's user owns the scratch dir, so training jobs can write without sudo.
    assert (work / "scratch").stat().st_uid != 0

    second = mount_scratch(sshd_server, work, device)
    assert second.returncode == 0
    assert second.step("mount-scratch")["status"] == "ok"
    assert (work / "fstab").read_text() == fstab


def test_device_with_a_filesystem_is_refused_then_erased_only_with_force(
    sshd_server: SshServer, loop_devices: tuple[Path, list[str]]
) -> None:
    work, (_, device) = loop_devices
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "precious", device], check=True)
    refused = mount_scratch(sshd_server, work, device)
    assert refused.returncode == 1
    message = refused.step("mount-scratch")["message"]
    assert "refusing to format" in message and "ext4 label precious" in message
    assert (
        "precious" in subprocess.run(["blkid", "-p", device], capture_output=True, text=True).stdout
    )

    forced = mount_scratch(sshd_server, work, device, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    step_ = forced.step("mount-scratch")
    assert step_["status"] == "changed"
    assert any("ext4 label precious" in line for line in step_["details"]["erased"])
    assert findmnt_source(work / "scratch") == device
