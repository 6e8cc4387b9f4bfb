"""The install-driver step's exact remote commands and their failure paths, on Fabric's own
mocked SSH session (``fabric.testing``'s MockRemote, as fabric's own tests use it): every
command the step sends is expected in order, with the exit status and output a node gives."""

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
from bootstrap.tasks.driver import install_driver_step

JAMMY = OsInfo("ubuntu", "22.04", "Ubuntu 22.04.5 LTS", "jammy")
A100_SMI = "NVIDIA A100-SXM4-40GB"
FM_ACTIVE = "systemctl is-active --quiet nvidia-fabricmanager"
KEYRING = "dpkg-query -W -f='${Status}' cuda-keyring 2>/dev/null"
SMI = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"


def sudo(command: str) -> str:
    """What root_sh sends for an ordinary user: ``sudo -n sh -c '<command>'``."""
    return f"sudo -n sh -c '{command}'"


def apt_install(*packages: str) -> str:
    args = ["install", "--no-install-recommends", *packages]
    # apt_command's own quoting has double quotes: root_sh shell-quotes the whole line.
    return f"sudo -n sh -c {shlex.quote(apt_command(args, 300))}"


def facts(*, driver: str | None = None, cuda: tuple[int, int] | None = None) -> dict[str, Any]:
    return {
        "os": JAMMY,
        "uid": 1000,
        "arch": "x86_64",
        "kernel": "6.8.0-1015-aws",
        "gpu_count": 8,
        "smi_gpus": [],
        "lspci_names": ["GA100 [A100 SXM4 40GB]"],
        "driver_version": driver,
        "cuda_driver_version": cuda,
    }


def run_driver_step(
    mock: MockRemote, commands: Sequence[Command], *, nvswitch: bool = True, **fact_args: Any
) -> tuple[StepResult, HostContext]:
    mock.expect(host="node", user="ubuntu", commands=list(commands))
    ctx = HostContext(
        host=Host("node", user="ubuntu"),
        options=Options(),
        tier=TierInfo(name="a100x8", gpu_model="A100-40GB", gpu_count=8, nvswitch=nvswitch),
        facts=facts(**fact_args),
    )
    conn = Connection("node", user="ubuntu")
    try:
        return run_step(install_driver_step, conn, ctx), ctx
    finally:
        conn.close()


INSTALL = ("linux-headers-6.8.0-1015-aws", "nvidia-open-580", "cuda-toolkit-12-8")
INSTALL_FM = (*INSTALL, "nvidia-fabricmanager-580")


def until_keyring() -> list[Command]:
    """No fabric manager running; NVIDIA's apt keyring already there."""
    return [Command(FM_ACTIVE, exit=3), Command(KEYRING, out=b"install ok installed")]


def fresh_install_until_modprobe() -> list[Command]:
    return [
        *until_keyring(),
        Command(apt_install(*INSTALL_FM), out=b"Setting up nvidia-open-580 ...\n"),
        Command(sudo("systemctl enable nvidia-persistenced")),
        Command(sudo("systemctl enable nvidia-fabricmanager")),
        Command(sudo("modprobe nvidia")),
    ]


def fresh_install_until_fabric_manager_start() -> list[Command]:
    """The driver loaded (580.95.05) and the persistence daemon started."""
    return [
        *fresh_install_until_modprobe(),
        Command(SMI, out=b"580.95.05\n"),
        Command(sudo("systemctl start nvidia-persistenced")),
    ]


def test_a_fresh_nvswitch_install_enables_and_starts_both_services(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, ctx = run_driver_step(
        remote,
        [
            *fresh_install_until_fabric_manager_start(),
            Command(sudo("systemctl start nvidia-fabricmanager")),
        ],
    )
    assert result.status == "changed", result.message
    assert result.message.endswith("driver 580.95.05 loaded")
    assert ctx.facts["driver_version"] == "580.95.05"


def test_a_fabric_manager_that_does_not_start_fails_the_step_with_the_reason(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, _ = run_driver_step(
        remote,
        [
            *fresh_install_until_fabric_manager_start(),
            Command(
                sudo("systemctl start nvidia-fabricmanager"),
                err=b"Job for nvidia-fabricmanager.service failed because the control "
                b"process exited with error code.\n",
                exit=1,
            ),
        ],
    )
    assert result.is_failure
    assert result.message.startswith("nvidia-fabricmanager did not start (systemctl start exit 1)")
    assert "control process exited with error code" in result.message
    assert "match the driver's (580.95.05)" in result.message
    assert "journalctl -u nvidia-fabricmanager" in result.message
    assert result.details["service"] == "nvidia-fabricmanager"


def test_a_service_that_cannot_be_enabled_fails_the_step_before_modprobe(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, _ = run_driver_step(
        remote,
        [
            *until_keyring(),
            Command(apt_install(*INSTALL_FM)),
            Command(sudo("systemctl enable nvidia-persistenced")),
            Command(
                sudo("systemctl enable nvidia-fabricmanager"),
                err=b"Failed to enable unit: Unit file nvidia-fabricmanager.service does not "
                b"exist.\n",
                exit=1,
            ),
        ],
    )
    assert result.is_failure
    assert result.message == (
        "systemctl enable nvidia-fabricmanager failed (exit 1): Failed to enable unit: "
        "Unit file nvidia-fabricmanager.service does not exist."
    )


def test_a_driver_that_needs_a_reboot_leaves_the_services_enabled_not_started(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, ctx = run_driver_step(
        remote,
        [
            *fresh_install_until_modprobe()[:-1],
            Command(
                sudo("modprobe nvidia"),
                err=b"modprobe: ERROR: could not insert 'nvidia': Exec format error\n",
                exit=1,
            ),
            Command(SMI, out=b"NVIDIA-SMI has failed\n", exit=9),
        ],
    )
    assert result.status == "changed"
    assert "REBOOT REQUIRED" in result.message
    assert result.details["modprobe"] == (
        "modprobe: ERROR: could not insert 'nvidia': Exec format error"
    )
    assert ctx.facts["reboot_required"] is True


def test_a_loaded_driver_without_fabric_manager_gets_only_the_matching_one(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, _ = run_driver_step(
        remote,
        [
            *until_keyring(),
            Command(apt_install("nvidia-fabricmanager-570")),
            Command(sudo("systemctl enable nvidia-fabricmanager")),
            Command(sudo("modprobe nvidia")),
            Command(SMI, out=b"570.172.08\n"),
            Command(sudo("systemctl start nvidia-fabricmanager"), exit=1, err=b"failed\n"),
        ],
        driver="570.172.08",
        cuda=(12, 8),
    )
    assert result.is_failure
    assert "nvidia-fabricmanager did not start" in result.message
    assert "match the driver's (570.172.08)" in result.message


def test_a_working_driver_is_kept_with_one_read_only_command(
    remote: MockRemote,  # noqa: F811
) -> None:
    result, _ = run_driver_step(
        remote, [Command(FM_ACTIVE, exit=0)], driver="580.95.05", cuda=(13, 0)
    )
    assert (result.status, result.message) == (
        "ok",
        "driver 580.95.05 (CUDA 13.0) already loaded",
    )


def test_a_failed_keyring_download_fails_the_step_naming_it(
    remote: MockRemote,  # noqa: F811
) -> None:
    url = (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
        "cuda-keyring_1.1-1_all.deb"
    )
    fetch = (
        f"curl -fsSL --retry 3 -o /tmp/cuda-keyring.deb {url} && "
        "dpkg -i /tmp/cuda-keyring.deb && rm -f /tmp/cuda-keyring.deb"
    )
    result, _ = run_driver_step(
        remote,
        [
            Command(KEYRING, exit=1),
            Command(sudo(fetch), err=b"curl: (6) Could not resolve host\n", exit=6),
        ],
        nvswitch=False,
    )
    assert result.is_failure
    assert result.message == (
        "installing cuda-keyring failed (exit 6): curl: (6) Could not resolve host"
    )


def test_the_mock_session_fails_a_test_when_the_step_sends_another_command() -> None:
    """The harness itself can fail: a command other than the expected one is an error."""
    mock = MockRemote()
    try:
        result, _ = run_driver_step(mock, [Command("systemctl is-active nvidia-fabricmanager")])
        assert result.is_failure  # the session had no second command to give
        with pytest.raises(AssertionError):
            mock.safety()
    finally:
        mock.stop()
