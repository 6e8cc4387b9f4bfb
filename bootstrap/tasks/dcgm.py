"""NVIDIA DCGM (datacenter-gpu-manager) from NVIDIA's CUDA apt repository, with its host
engine service, so ``fab health --deep N`` can run ``dcgmi diag -r N``.

Source: NVIDIA's DCGM installation guide,
https://docs.nvidia.com/datacenter/dcgm/latest/installation.html (read 2026-12-02): on
Ubuntu, with the CUDA network repository set up (cuda-keyring, as install-driver adds it),
``apt-get install --install-recommends datacenter-gpu-manager-4-cuda<major>`` where
``<major>`` is the CUDA version the loaded driver reports (nvidia-smi's "CUDA Version"),
then ``systemctl --now enable nvidia-dcgm``. DCGM 4 ships one package per CUDA major
(11, 12, 13: the -cuda11/-cuda12/-cuda13 packages of NVIDIA's repository).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric import Connection

from bootstrap.fleet.api import HostContext, StepFailed, StepResult, step
from bootstrap.fleet.system import apt_get, check, parse_smi_cuda_version, root_sh, sh
from bootstrap.tasks.driver import ensure_keyring, keyring_url

SERVICE = "nvidia-dcgm"
CUDA_MAJORS = (11, 12, 13)


@dataclass(frozen=True)
class DcgmPlan:
    action: str  # install | start | keep | skip
    reason: str
    package: str | None = None


def dcgm_package(cuda: tuple[int, int]) -> str:
    """The DCGM 4 package built for the driver's CUDA major (ValueError for one it lacks)."""
    if cuda[0] not in CUDA_MAJORS:
        raise ValueError(
            f"no DCGM 4 package for CUDA {cuda[0]}.{cuda[1]} (NVIDIA ships cuda"
            f"{', cuda'.join(map(str, CUDA_MAJORS))}): update the driver or skip with --no-dcgm"
        )
    return f"datacenter-gpu-manager-4-cuda{cuda[0]}"


def plan_dcgm(
    *, cuda: tuple[int, int] | None, installed: bool, active: bool, reboot_required: bool
) -> DcgmPlan:
    """What install-dcgm must do (pure)."""
    if reboot_required or cuda is None:
        return DcgmPlan("skip", "no loaded driver yet: DCGM follows after the reboot")
    package = dcgm_package(cuda)
    if installed and active:
        return DcgmPlan("keep", f"{package} installed, {SERVICE} active", package)
    if installed:
        return DcgmPlan("start", f"{package} installed, {SERVICE} not active", package)
    return DcgmPlan("install", f"installing {package} for CUDA {cuda[0]}", package)


@dataclass(frozen=True)
class DcgmOptions:
    """fab setup's --dcgm / --no-dcgm, read by the install-dcgm step."""

    install: bool = True


@step("install-dcgm", needs_gpu=True)
def install_dcgm_step(conn: Connection, ctx: HostContext) -> StepResult:
    """NVIDIA DCGM and its host engine, for dcgmi diag."""
    if not (ctx.options.of(DcgmOptions) or DcgmOptions()).install:
        return StepResult.skipped("--no-dcgm")
    cuda = ctx.facts.get("cuda_driver_version")
    if cuda is None and ctx.facts.get("driver_version"):
        # install-driver just loaded a driver: the probe ran before it could say its CUDA.
        cuda = parse_smi_cuda_version(str(sh(conn, "nvidia-smi 2>&1 | head -5").stdout))
    try:
        package = dcgm_package(cuda) if cuda else None
    except ValueError as exc:
        raise StepFailed(str(exc)) from None
    query = f"dpkg-query -W -f='${{Status}}' {package} 2>/dev/null"
    plan = plan_dcgm(
        cuda=cuda,
        installed=bool(package) and sh(conn, query).stdout.startswith("install ok installed"),
        active=bool(package) and sh(conn, f"systemctl is-active --quiet {SERVICE}").ok,
        reboot_required=bool(ctx.facts.get("reboot_required")),
    )
    if plan.action == "skip":
        return StepResult.skipped(plan.reason)
    if plan.action == "keep":
        return StepResult.ok(plan.reason, package=plan.package)
    if plan.action == "install":
        assert plan.package is not None
        ensure_keyring(conn, ctx, keyring_url(ctx.facts["os"], ctx.facts.get("arch", "x86_64")))
        ctx.progress(plan.reason)
        apt_get(conn, ctx, "install", "--install-recommends", plan.package)
    check(
        root_sh(conn, ctx, f"systemctl --now enable {SERVICE}", timeout=120),
        f"systemctl --now enable {SERVICE}",
    )
    return StepResult.changed(f"{plan.package}: {SERVICE} running", package=plan.package)
