"""``fab setup``: the whole bootstrap, each step idempotent and also a task of its own."""

from __future__ import annotations

from invoke import Context

from bootstrap.fleet.api import (
    DEFAULT_APT_LOCK_TIMEOUT_S,
    DEFAULT_FSTAB,
    DEFAULT_TORCH,
    DEFAULT_TORCH_INDEX,
    DEFAULT_VENV,
    Options,
    Step,
)
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.numbers import Bound
from bootstrap.tasks.agent import monitoring_agent_step
from bootstrap.tasks.dcgm import DcgmOptions, install_dcgm_step
from bootstrap.tasks.driver import install_driver_step
from bootstrap.tasks.health import health_step
from bootstrap.tasks.pytorch import install_pytorch_step
from bootstrap.tasks.scratch import mount_scratch_step
from bootstrap.tasks.watchdog import WatchdogOptions, install_watchdog_step
from bootstrap.verify.health.check import HealthOptions


def setup_steps() -> list[Step]:
    # The cloud's monitoring agent after the rest: a node whose agent will not install still
    # has them; the fast health check last, so its verdict sees the node as it is left.
    return [
        install_driver_step,
        install_dcgm_step,
        install_pytorch_step,
        mount_scratch_step,
        install_watchdog_step,
        monitoring_agent_step,
        health_step,
    ]


_HEALTH = HealthOptions()  # its defaults, written once; the task's signature reads them


@fleet_task(
    help={
        "allow_no_gpu": "bootstrap nodes without an NVIDIA GPU; GPU steps are reported skipped",
        "venv": f"virtualenv on the node (default {DEFAULT_VENV})",
        "torch_version": f"torch version (default {DEFAULT_TORCH})",
        "torch_index": "auto (CUDA-matched), default (node's pip config) or an index URL",
        "driver_branch": "NVIDIA driver branch (default 580)",
        "force": "let mount-scratch ERASE devices that hold data (it lists them)",
        "scratch_devices": "comma-separated scratch devices instead of discovery",
        "scratch_path": "scratch mount point (default: the stack's scratch.path)",
        "fstab": f"fstab file mount-scratch updates (default {DEFAULT_FSTAB})",
        "apt_lock_timeout": "seconds to wait for an apt lock held by unattended upgrades",
        "watchdog_timer": "arm the idle watchdog's systemd timer (--no-watchdog-timer: install "
        "its files only, for images and hosts without systemd)",
        "dcgm": "install NVIDIA DCGM on GPU nodes, for fab health --deep (--no-dcgm: skip)",
        "state_dir": "the node's gpufleet state folder for the health verdict "
        f"(default {_HEALTH.state_dir})",
    },
    bounds={"apt_lock_timeout": Bound(0, example=str(DEFAULT_APT_LOCK_TIMEOUT_S))},
)
def setup(
    c: Context,
    fleet_args: FleetArgs,
    allow_no_gpu: bool = False,
    venv: str = DEFAULT_VENV,
    torch_version: str = DEFAULT_TORCH,
    torch_index: str = DEFAULT_TORCH_INDEX,
    driver_branch: str = "",
    force: bool = False,
    scratch_devices: str = "",
    scratch_path: str = "",
    fstab: str = DEFAULT_FSTAB,
    apt_lock_timeout: int = DEFAULT_APT_LOCK_TIMEOUT_S,
    watchdog_timer: bool = True,
    dcgm: bool = True,
    state_dir: str = _HEALTH.state_dir,
) -> None:
    """Driver + CUDA, DCGM, PyTorch venv, NVMe scratch, idle watchdog, a health check."""
    options = Options(
        allow_no_gpu=allow_no_gpu,
        force=force,
        venv=venv,
        torch_version=torch_version,
        torch_index=torch_index,
        driver_branch=driver_branch or None,
        apt_lock_timeout_s=apt_lock_timeout,
        scratch_devices=tuple(d.strip() for d in scratch_devices.split(",") if d.strip()),
        scratch_path=scratch_path or None,
        fstab=fstab,
        tasks=(
            WatchdogOptions(enable_timer=watchdog_timer),
            DcgmOptions(install=dcgm),
            HealthOptions(state_dir=state_dir),
        ),
    )
    fleet_run(
        c,
        "setup",
        setup_steps(),
        fleet_args,
        options=options,
    )
