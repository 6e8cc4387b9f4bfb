"""``fab setup``: the whole bootstrap, each step idempotent and also a task of its own."""

from __future__ import annotations

from fabric import Connection
from invoke import Context

import bootstrap
from bootstrap.api import HostContext, Options, Step, StepResult, step
from bootstrap.cli import COMMON_HELP, fleet_run, fleet_task
from bootstrap.driver import install_driver_step
from bootstrap.pytorch import DEFAULT_TORCH, DEFAULT_VENV, install_pytorch_step
from bootstrap.scratch import mount_scratch_step

WATCHDOG_MODULE = "bootstrap.watchdog"
WATCHDOG_STEP = "install_watchdog"


def watchdog_step() -> Step:
    """The idle watchdog install, the last step of setup, IF ``bootstrap.watchdog`` exists.

    The watchdog is delivered separately (the teardown work); until it is there, setup says
    so on every host instead of silently leaving nodes without an idle guard.
    """
    module = bootstrap.import_optional(WATCHDOG_MODULE)
    found = getattr(module, WATCHDOG_STEP, None) if module else None
    if found is not None:
        return found
    reason = (
        f"{WATCHDOG_MODULE} is not installed in this checkout"
        if module is None
        else f"{WATCHDOG_MODULE} has no {WATCHDOG_STEP} step"
    )

    @step("install-watchdog")
    def missing_watchdog(conn: Connection, ctx: HostContext) -> StepResult:
        del conn, ctx
        return StepResult.skipped(f"{reason}: no idle watchdog on this node")

    return missing_watchdog


def setup_steps() -> list[Step]:
    return [install_driver_step, install_pytorch_step, mount_scratch_step, watchdog_step()]


@fleet_task(
    help={
        **COMMON_HELP,
        "allow_no_gpu": "bootstrap nodes without an NVIDIA GPU; GPU steps are reported skipped",
        "venv": f"virtualenv on the node (default {DEFAULT_VENV})",
        "torch_version": f"torch version (default {DEFAULT_TORCH})",
        "torch_index": "auto (CUDA-matched), default (node's pip config) or an index URL",
        "driver_branch": "NVIDIA driver branch (default 580)",
        "force": "let mount-scratch ERASE devices that hold data (it lists them)",
        "scratch_devices": "comma-separated scratch devices instead of discovery",
        "scratch_path": "scratch mount point (default: the stack's scratch.path)",
        "fstab": "fstab file mount-scratch updates (default /etc/fstab)",
        "apt_lock_timeout": "seconds to wait for an apt lock held by unattended upgrades",
    }
)
def setup(
    c: Context,
    stack: str = "",
    inventory: str = "",
    json: bool = False,
    allow_no_gpu: bool = False,
    venv: str = DEFAULT_VENV,
    torch_version: str = DEFAULT_TORCH,
    torch_index: str = "auto",
    driver_branch: str = "",
    force: bool = False,
    scratch_devices: str = "",
    scratch_path: str = "",
    fstab: str = "/etc/fstab",
    apt_lock_timeout: int = 300,
    connect_timeout: float = 10.0,
) -> None:
    """Driver + CUDA, PyTorch venv, NVMe scratch, idle watchdog: the whole bootstrap."""
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
    )
    fleet_run(
        c,
        "setup",
        setup_steps(),
        stack=stack,
        inventory=inventory,
        as_json=json,
        options=options,
        connect_timeout=connect_timeout,
    )
