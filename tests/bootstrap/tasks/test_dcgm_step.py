"""install-dcgm: the DCGM 4 package for the driver's CUDA major (NVIDIA's DCGM installation
guide), then its host engine service, as exact remote commands on Fabric's mocked SSH
session (the way test_driver_step.py drives install-driver)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import pytest
from fabric import Connection
from fabric.testing.base import Command, MockRemote
from fabric.testing.fixtures import remote  # noqa: F401  (the pytest fixture)

from bootstrap.fleet.api import Host, HostContext, Options, StepResult, TierInfo
from bootstrap.fleet.runner import run_step
from bootstrap.fleet.system import OsInfo, apt_command
from bootstrap.tasks.dcgm import dcgm_package, install_dcgm_step, plan_dcgm

JAMMY = OsInfo("ubuntu", "22.04", "Ubuntu 22.04.5 LTS", "jammy")
PKG = "datacenter-gpu-manager-4-cuda12"
QUERY = f"dpkg-query -W -f='${{Status}}' {PKG} 2>/dev/null"
ACTIVE = "systemctl is-active --quiet nvidia-dcgm"
KEYRING = "dpkg-query -W -f='${Status}' cuda-keyring 2>/dev/null"
ENABLE = "sudo -n sh -c 'systemctl --now enable nvidia-dcgm'"


def test_the_package_follows_the_drivers_cuda_major() -> None:
    assert dcgm_package((12, 8)) == PKG
    assert dcgm_package((13, 0)) == "datacenter-gpu-manager-4-cuda13"
    with pytest.raises(ValueError, match=r"no DCGM 4 package for CUDA 10\.2"):
        dcgm_package((10, 2))


@pytest.mark.parametrize(
    ("installed", "active", "action"),
    [(False, False, "install"), (True, False, "start"), (True, True, "keep")],
)
def test_the_plan_installs_starts_or_keeps(installed: bool, active: bool, action: str) -> None:
    plan = plan_dcgm(cuda=(12, 8), installed=installed, active=active, reboot_required=False)
    assert (plan.action, plan.package) == (action, PKG)


def test_a_node_waiting_for_its_reboot_gets_dcgm_after_it() -> None:
    plan = plan_dcgm(cuda=None, installed=False, active=False, reboot_required=True)
    assert plan.action == "skip" and "after the reboot" in plan.reason


def run_dcgm_step(mock: MockRemote, commands: Sequence[Command], **facts: Any) -> StepResult:
    mock.expect(host="node", user="ubuntu", commands=list(commands))
    ctx = HostContext(
        host=Host("node", user="ubuntu"),
        options=Options(),
        tier=TierInfo(name="a100x8", gpu_count=8),
        facts={"os": JAMMY, "uid": 1000, "arch": "x86_64", "gpu_count": 8, **facts},
    )
    conn = Connection("node", user="ubuntu")
    try:
        return run_step(install_dcgm_step, conn, ctx)
    finally:
        conn.close()


def test_a_fresh_node_gets_the_package_from_nvidias_repository_and_the_service_started(
    remote: MockRemote,  # noqa: F811
) -> None:
    install = apt_command(["install", "--install-recommends", PKG], 300)
    result = run_dcgm_step(
        remote,
        [
            Command(QUERY, exit=1),
            Command(ACTIVE, exit=3),
            Command(KEYRING, out=b"install ok installed"),
            Command(f"sudo -n sh -c {shlex.quote(install)}"),
            Command(ENABLE),
        ],
        cuda_driver_version=(12, 8),
    )
    assert result.status == "changed", result.message
    assert result.message == f"{PKG}: nvidia-dcgm running"


def test_an_installed_and_running_dcgm_is_left_alone(remote: MockRemote) -> None:  # noqa: F811
    result = run_dcgm_step(
        remote,
        [Command(QUERY, out=b"install ok installed"), Command(ACTIVE)],
        cuda_driver_version=(12, 8),
    )
    assert result.status == "ok" and "nvidia-dcgm active" in result.message


def test_a_driver_installed_in_this_run_is_asked_for_its_cuda(remote: MockRemote) -> None:  # noqa: F811
    smi = b"| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0     |\n"
    result = run_dcgm_step(
        remote,
        [
            Command("nvidia-smi 2>&1 | head -5", out=smi),
            Command("dpkg-query -W -f='${Status}' datacenter-gpu-manager-4-cuda13 2>/dev/null",
                    out=b"install ok installed"),
            Command(ACTIVE),
        ],
        driver_version="580.95.05",
        cuda_driver_version=None,
    )  # fmt: skip
    assert result.status == "ok" and "cuda13" in result.message


def test_a_service_that_will_not_start_fails_the_step(remote: MockRemote) -> None:  # noqa: F811
    result = run_dcgm_step(
        remote,
        [
            Command(QUERY, out=b"install ok installed"),
            Command(ACTIVE, exit=3),
            Command(ENABLE, err=b"Failed to enable unit: Unit file nvidia-dcgm.service "
                    b"does not exist.\n", exit=1),
        ],
        cuda_driver_version=(12, 8),
    )  # fmt: skip
    assert result.is_failure and "nvidia-dcgm.service does not exist" in result.message
