"""NVIDIA driver (+ fabric manager, CUDA toolkit) from NVIDIA's CUDA apt repository.

What to install is decided by :func:`plan_driver`, a pure function of what the probe saw:

- a loaded driver whose CUDA version is new enough for the GPU (the Deep Learning AMI case)
  is left alone;
- the branch defaults to R580: the last branch that supports Volta (V100), and a production
  branch for Turing through Blackwell, so one fleet runs one driver;
- Turing and newer get NVIDIA's open kernel modules (``nvidia-open-<branch>``); Volta cannot
  run them and gets the proprietary ``cuda-drivers-<branch>``;
- NVSwitch nodes (p4d/p5, 8-GPU gn7/ebmgn7) also need ``nvidia-fabricmanager-<branch>``,
  whose version must match the driver; without it CUDA init fails on those nodes.

Sources: NVIDIA driver installation guide (Ubuntu, cuda-keyring), fabric manager packaging
(github.com/NVIDIA/apt-packaging-fabric-manager), and the team's notes on GPU facts (gpu-facts.md,
not in this repository).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fabric import Connection
from invoke import Context

from bootstrap.fleet.api import (
    DEFAULT_APT_LOCK_TIMEOUT_S,
    HostContext,
    Options,
    StepFailed,
    StepResult,
    step,
)
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.system import OsInfo, apt_get, check, root_sh, sh

DEFAULT_BRANCH = "580"
VOLTA_LAST_BRANCH = 580

# Architecture of a GPU from its chip code (lspci) or product name (nvidia-smi, the catalog).
# Ordered: the first pattern that matches wins, so "A100" is tested before "A10".
_ARCH_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bGV10\d|V100", "volta"),
    (r"\bTU10\d|\bT4\b|T4G|RTX 20\d\d|Quadro RTX", "turing"),
    (r"\bGB[12]\d\d|\bB[12]00\b|GB200|GB300|B300", "blackwell"),
    (r"\bGH100|H100|H200|H800|\bH20\b|GH200", "hopper"),
    (r"\bAD10\d|\bL4\b|L40S?|RTX 40\d\d|RTX 6000 Ada", "ada"),
    (r"\bGA10\d|A100|A800|\bA10G?\b|\bA30\b|\bA40\b|A16|RTX 30\d\d|RTX A\d000", "ampere"),
)

# The oldest CUDA version (as reported by the loaded driver) that bootstrap accepts as-is,
# per architecture: the oldest CUDA the matching PyTorch wheels run on. Blackwell needs 12.8.
_MIN_DRIVER_CUDA: dict[str, tuple[int, int]] = {
    "volta": (12, 6),
    "turing": (12, 6),
    "ampere": (12, 6),
    "ada": (12, 6),
    "hopper": (12, 6),
    "blackwell": (12, 8),
}


def gpu_architecture(names: Sequence[str]) -> str | None:
    """Architecture of the first recognised name, e.g. 'NVIDIA A100-SXM4-40GB' -> 'ampere'."""
    for name in names:
        for pattern, arch in _ARCH_PATTERNS:
            if re.search(pattern, name, flags=re.IGNORECASE):
                return arch
    return None


def choose_branch(arch: str | None, override: str | None) -> str:
    if override:
        if not override.isdigit():
            raise ValueError(f"driver branch must be a number such as 580, got {override!r}")
        if arch == "volta" and int(override) > VOLTA_LAST_BRANCH:
            raise ValueError(
                f"Volta GPUs (V100) are supported up to driver branch R{VOLTA_LAST_BRANCH}; "
                f"R{override} would leave the node without a working GPU"
            )
        return override
    return DEFAULT_BRANCH


def cuda_toolkit_for(arch: str | None) -> str:
    """The toolkit package suffix: CUDA 13 dropped Volta, so V100 nodes stay on 12.6."""
    return "12-6" if arch == "volta" else "12-8"


@dataclass(frozen=True)
class DriverPlan:
    action: str  # "keep" | "install" | "fabric-manager" | "none"
    reason: str
    arch: str | None = None
    branch: str | None = None
    packages: tuple[str, ...] = ()
    keyring_url: str | None = None
    services: tuple[str, ...] = field(default_factory=tuple)


def keyring_url(os_info: OsInfo, machine: str) -> str:
    repo = os_info.cuda_repo
    if repo is None:
        raise ValueError(f"no CUDA repository for {os_info.pretty_name}")
    # NVIDIA names the aarch64 server repositories "sbsa".
    arch = "sbsa" if machine == "aarch64" else "x86_64"
    return (
        f"https://developer.download.nvidia.com/compute/cuda/repos/{repo}/{arch}/"
        "cuda-keyring_1.1-1_all.deb"
    )


def plan_driver(
    *,
    gpu_names: Sequence[str],
    gpu_count: int,
    driver_version: str | None,
    cuda_version: tuple[int, int] | None,
    os_info: OsInfo,
    machine: str,
    kernel: str,
    nvswitch: bool,
    fabric_manager_active: bool,
    branch_override: str | None = None,
    tier_gpu_model: str | None = None,
) -> DriverPlan:
    """What install-driver must do on a node (pure; see the module docstring for the rules)."""
    if gpu_count == 0:
        return DriverPlan("none", "no NVIDIA GPU on this node")
    arch = gpu_architecture([*gpu_names, *([tier_gpu_model] if tier_gpu_model else [])])
    branch = choose_branch(arch, branch_override)
    minimum = _MIN_DRIVER_CUDA.get(arch or "", (12, 6))
    if driver_version and cuda_version and cuda_version >= minimum:
        loaded_branch = driver_version.split(".")[0]
        if arch == "volta" and int(loaded_branch) > VOLTA_LAST_BRANCH:
            pass  # impossible in practice (the driver would not load); reinstall to be sure
        elif nvswitch and not fabric_manager_active:
            return DriverPlan(
                "fabric-manager",
                f"driver {driver_version} is fine but this NVSwitch node has no running "
                "fabric manager",
                arch=arch,
                branch=loaded_branch,
                packages=(f"nvidia-fabricmanager-{loaded_branch}",),
                keyring_url=keyring_url(os_info, machine),
                services=("nvidia-fabricmanager",),
            )
        else:
            cuda = f"{cuda_version[0]}.{cuda_version[1]}"
            return DriverPlan(
                "keep",
                f"driver {driver_version} (CUDA {cuda}) already loaded",
                arch=arch,
                branch=loaded_branch,
            )
    if arch is None:
        raise ValueError(
            f"cannot tell the GPU architecture from {list(gpu_names)!r}; pass --driver-branch "
            "and check the GPU model"
        )
    driver_pkg = f"cuda-drivers-{branch}" if arch == "volta" else f"nvidia-open-{branch}"
    packages = [f"linux-headers-{kernel}", driver_pkg, f"cuda-toolkit-{cuda_toolkit_for(arch)}"]
    services: list[str] = ["nvidia-persistenced"]
    if nvswitch:
        packages.append(f"nvidia-fabricmanager-{branch}")
        services.append("nvidia-fabricmanager")
    if driver_version and cuda_version:
        have = f"driver {driver_version} (CUDA {cuda_version[0]}.{cuda_version[1]})"
        reason = f"{have} is older than CUDA {minimum[0]}.{minimum[1]} needs"
    elif driver_version:
        reason = f"driver {driver_version} found but its CUDA version is unknown"
    else:
        reason = "no NVIDIA driver loaded"
    return DriverPlan(
        "install",
        reason,
        arch=arch,
        branch=branch,
        packages=tuple(packages),
        keyring_url=keyring_url(os_info, machine),
        services=tuple(services),
    )


def ensure_keyring(conn: Connection, ctx: HostContext, url: str) -> bool:
    """Install cuda-keyring (NVIDIA's apt signing key + repo entry); True when it changed."""
    if sh(conn, "dpkg-query -W -f='${Status}' cuda-keyring 2>/dev/null").stdout.startswith(
        "install ok installed"
    ):
        return False
    ctx.progress(f"adding NVIDIA's CUDA apt repository ({url})")
    check(
        root_sh(
            conn,
            ctx,
            f"curl -fsSL --retry 3 -o /tmp/cuda-keyring.deb {url} && "
            "dpkg -i /tmp/cuda-keyring.deb && rm -f /tmp/cuda-keyring.deb",
            timeout=300,
        ),
        "installing cuda-keyring",
    )
    apt_get(conn, ctx, "update", what="apt-get update")
    return True


@step("install-driver", needs_gpu=True)
def install_driver_step(conn: Connection, ctx: HostContext) -> StepResult:
    f = ctx.facts
    fm_active = False
    if ctx.tier.nvswitch:
        fm_active = sh(conn, "systemctl is-active --quiet nvidia-fabricmanager").ok
    try:
        plan = plan_driver(
            gpu_names=[g.name for g in f.get("smi_gpus", [])] + f.get("lspci_names", []),
            gpu_count=f.get("gpu_count", 0),
            driver_version=f.get("driver_version"),
            cuda_version=f.get("cuda_driver_version"),
            os_info=f["os"],
            machine=f.get("arch", "x86_64"),
            kernel=f.get("kernel", ""),
            nvswitch=ctx.tier.nvswitch,
            fabric_manager_active=fm_active,
            branch_override=ctx.options.driver_branch,
            tier_gpu_model=ctx.tier.gpu_model,
        )
    except ValueError as exc:
        raise StepFailed(str(exc)) from None
    details = {"arch": plan.arch, "branch": plan.branch, "packages": list(plan.packages)}
    if plan.action == "none":
        return StepResult.skipped(plan.reason, **details)
    if plan.action == "keep":
        return StepResult.ok(plan.reason, **details)
    assert plan.keyring_url is not None
    ensure_keyring(conn, ctx, plan.keyring_url)
    ctx.progress(
        f"{plan.reason}: installing {' '.join(plan.packages)} (DKMS builds take several minutes)"
    )
    apt_get(conn, ctx, "install", "--no-install-recommends", *plan.packages)
    for service in plan.services:
        check(root_sh(conn, ctx, f"systemctl enable {service}"), f"systemctl enable {service}")
    # A freshly installed module may load without a reboot (no nouveau on cloud images);
    # when it does not, nvidia-smi below says so, and the REBOOT REQUIRED result carries
    # modprobe's reason.
    modprobe = root_sh(conn, ctx, "modprobe nvidia")
    smi = sh(conn, "nvidia-smi --query-gpu=driver_version --format=csv,noheader", timeout=60)
    if smi.ok and smi.stdout.strip():
        ctx.facts["driver_version"] = smi.stdout.split()[0]
        # The services need the loaded driver, so they start only now; one that will not
        # start (a fabric manager of another version than the driver) fails the step.
        for service in plan.services:
            _start_service(conn, ctx, service, ctx.facts["driver_version"])
        return StepResult.changed(
            f"installed {' '.join(plan.packages)}; driver {ctx.facts['driver_version']} loaded",
            **details,
        )
    ctx.facts["reboot_required"] = True
    why = (str(modprobe.stderr) or str(modprobe.stdout)).strip().splitlines()[-1:]
    return StepResult.changed(
        f"installed {' '.join(plan.packages)}; REBOOT REQUIRED to load the driver "
        "(sudo reboot, then rerun fab setup)",
        reboot_required=True,
        **details,
        **({"modprobe": why[0]} if not modprobe.ok and why else {}),
    )


def _start_service(conn: Connection, ctx: HostContext, service: str, driver: str) -> None:
    """Start an enabled service now, or end the step saying why it did not start."""
    result = root_sh(conn, ctx, f"systemctl start {service}", timeout=120)
    if result.ok:
        return
    tail = (str(result.stderr) or str(result.stdout)).strip().splitlines()[-3:]
    hint = (
        f"its version must match the driver's ({driver})"
        if service == "nvidia-fabricmanager"
        else "it needs the loaded driver"
    )
    raise StepFailed(
        f"{service} did not start (systemctl start exit {result.exited}): "
        f"{' | '.join(tail) or 'no output'}; {hint}; see journalctl -u {service}",
        service=service,
    )


@fleet_task(
    help={
        "allow_no_gpu": "report GPU steps as skipped on nodes without an NVIDIA GPU",
        "driver_branch": "driver branch, e.g. 580 (default: R580, the last with Volta support)",
        "apt_lock_timeout": "seconds to wait for the apt lock held by unattended upgrades",
    },
    bounds={"apt_lock_timeout": Bound(0, example=str(DEFAULT_APT_LOCK_TIMEOUT_S))},
)
def install_driver(
    c: Context,
    fleet_args: FleetArgs,
    allow_no_gpu: bool = False,
    driver_branch: str = "",
    apt_lock_timeout: int = DEFAULT_APT_LOCK_TIMEOUT_S,
) -> None:
    """Install the NVIDIA driver + CUDA from NVIDIA's apt repo (skipped when one works)."""
    options = Options(
        allow_no_gpu=allow_no_gpu,
        driver_branch=driver_branch or None,
        apt_lock_timeout_s=apt_lock_timeout,
    )
    fleet_run(
        c,
        "install-driver",
        [install_driver_step],
        fleet_args,
        options=options,
    )
