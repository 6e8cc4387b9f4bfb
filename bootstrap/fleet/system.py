"""Node facts and the remote-command helpers every step uses.

The ``preflight`` step (:func:`preflight_step`) runs first in every task: in one SSH round
trip it reads the OS, the user's sudo rights, the NVIDIA devices on the PCI bus and the driver
state, and stores them in ``ctx.facts`` for later steps. Parsing is pure and unit-tested.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabric import Connection
from invoke.runners import Result

from bootstrap.fleet.api import HostContext, StepFailed, StepResult, step

# NVIDIA's CUDA apt repository names for the distributions bootstrap supports
# (https://developer.download.nvidia.com/compute/cuda/repos/).
SUPPORTED_OS: Mapping[tuple[str, str], str] = {
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
    ("debian", "12"): "debian12",
}

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class 0x03 is "display controller": 0x0300 VGA, 0x0302 3D controller (datacenter GPUs).
# NVSwitch chips are bridges (0x0680) and must not be counted as GPUs.
_GPU_CLASS_PREFIXES = ("0x0300", "0x0302")


@dataclass(frozen=True)
class OsInfo:
    id: str
    version_id: str
    pretty_name: str
    codename: str = ""

    @property
    def cuda_repo(self) -> str | None:
        return SUPPORTED_OS.get((self.id, self.version_id))

    @property
    def supported(self) -> bool:
        return self.cuda_repo is not None


def parse_os_release(text: str) -> OsInfo:
    """/etc/os-release (shell-style KEY=value lines) to an OsInfo."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
        except ValueError:
            parts = [raw.strip("\"'")]
        values[key] = parts[0] if parts else ""
    return OsInfo(
        id=values.get("ID", "unknown").lower(),
        version_id=values.get("VERSION_ID", ""),
        pretty_name=values.get("PRETTY_NAME", values.get("NAME", "unknown OS")),
        codename=values.get("VERSION_CODENAME", ""),
    )


def supported_os_text() -> str:
    return ", ".join(f"{os_id.capitalize()} {ver}" for os_id, ver in SUPPORTED_OS)


@dataclass(frozen=True)
class PciGpu:
    slot: str
    device_id: str  # e.g. 0x20b0


def parse_pci_devices(text: str) -> list[PciGpu]:
    """GPUs from lines ``<slot> <vendor> <device> <class>`` read from /sys/bus/pci/devices."""
    gpus = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 4:
            continue
        slot, vendor, device, klass = fields
        if vendor.lower() == NVIDIA_PCI_VENDOR and klass.lower().startswith(_GPU_CLASS_PREFIXES):
            gpus.append(PciGpu(slot=slot, device_id=device.lower()))
    return gpus


def parse_lspci_gpu_names(text: str) -> list[str]:
    """Product strings of NVIDIA GPUs in ``lspci -d 10de:`` (bridges such as NVSwitch left out).

    ``00:1e.0 3D controller: NVIDIA Corporation GA100 [A100 SXM4 40GB] (rev a1)`` gives
    ``GA100 [A100 SXM4 40GB]``.
    """
    names = []
    for line in text.splitlines():
        m = re.match(r"^\S+\s+(3D controller|VGA compatible controller):\s*(.*)$", line)
        if not m:
            continue
        name = re.sub(r"\s*\(rev \w+\)$", "", m.group(2))
        names.append(name.removeprefix("NVIDIA Corporation ").strip())
    return names


@dataclass(frozen=True)
class SmiGpu:
    name: str
    driver_version: str
    memory_mib: int | None


def parse_nvidia_smi_query(text: str) -> list[SmiGpu]:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not re.match(r"^\d+\.\d+", parts[1]):
            continue  # error text such as "NVIDIA-SMI has failed because ..."
        memory = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
        gpus.append(SmiGpu(name=parts[0], driver_version=parts[1], memory_mib=memory))
    return gpus


_CUDA_RE = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")


def parse_smi_cuda_version(text: str) -> tuple[int, int] | None:
    """The highest CUDA version the loaded driver supports, from plain ``nvidia-smi``."""
    m = _CUDA_RE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def split_sections(text: str) -> dict[str, str]:
    """Output of a probe script that prints ``==name`` before each section."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("==") and len(line) > 2 and " " not in line:
            current = sections.setdefault(line[2:], [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


# One round trip for everything the other steps need to know. It must run on any Linux
# (no bash-isms beyond POSIX sh, tools probed before use) because it also diagnoses
# unsupported systems.
PROBE_SCRIPT = r"""
echo ==os; cat /etc/os-release 2>/dev/null
echo ==uid; id -u
echo ==sudo; if [ "$(id -u)" = 0 ]; then echo root; elif ! command -v sudo >/dev/null 2>&1; then
  echo missing; elif sudo -n true 2>/dev/null; then echo yes; else echo no; fi
echo ==arch; uname -m
echo ==kernel; uname -r
echo ==lspci; command -v lspci >/dev/null 2>&1 && lspci -d 10de: 2>/dev/null
echo ==pci; for d in /sys/bus/pci/devices/*; do [ -r "$d/vendor" ] || continue;
  echo "${d##*/} $(cat $d/vendor) $(cat $d/device) $(cat $d/class)"; done
echo ==smi; if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits 2>&1;
  else echo missing; fi
echo ==smicuda; command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi 2>&1 | head -5
echo ==reboot; [ -e /var/run/reboot-required ] && echo yes || echo no
echo ==uptime; cut -d' ' -f1 /proc/uptime
"""


def facts_from_probe(text: str) -> dict[str, Any]:
    """Turn the probe script's output into ``ctx.facts`` entries (pure)."""
    sec = split_sections(text)
    os_info = parse_os_release(sec.get("os", ""))
    pci = parse_pci_devices(sec.get("pci", ""))
    smi = parse_nvidia_smi_query(sec.get("smi", ""))
    smi_text = sec.get("smi", "")
    driver_loaded = bool(smi)
    facts: dict[str, Any] = {
        "os": os_info,
        "uid": int(sec.get("uid", "-1") or -1),
        "sudo": sec.get("sudo", "no"),
        "arch": sec.get("arch", ""),
        "kernel": sec.get("kernel", ""),
        "lspci_names": parse_lspci_gpu_names(sec.get("lspci", "")),
        "pci_gpus": pci,
        "smi_gpus": smi,
        "driver_loaded": driver_loaded,
        "driver_version": smi[0].driver_version if smi else None,
        "cuda_driver_version": parse_smi_cuda_version(sec.get("smicuda", "")),
        "nvidia_smi_present": smi_text != "missing",
        "nvidia_smi_error": None if driver_loaded or smi_text == "missing" else smi_text,
        "reboot_required": sec.get("reboot") == "yes",
        "uptime_s": float(sec.get("uptime") or 0.0),
    }
    # The PCI bus is the ground truth for "is there a GPU"; nvidia-smi only works once a
    # driver is loaded. Either one seeing a GPU is enough.
    facts["gpu_count"] = max(len(pci), len(smi))
    if facts["gpu_count"]:
        facts["gpu_evidence"] = f"{facts['gpu_count']} NVIDIA GPU(s)"
    else:
        facts["gpu_evidence"] = "no NVIDIA device on the PCI bus"
    return facts


def sudo_prefix(ctx: HostContext) -> str:
    """``sudo -n`` for ordinary users, nothing for root; never prompts for a password."""
    return "" if ctx.facts.get("uid") == 0 else "sudo -n "


def sh(
    conn: Connection,
    command: str,
    *,
    timeout: float | None = None,
    out_stream: Any = None,
) -> Result:
    """Run a command, never raising on a non-zero exit (callers look at ``.ok``)."""
    kwargs: dict[str, Any] = {"warn": True, "hide": True, "in_stream": False}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if out_stream is not None:
        kwargs["out_stream"] = out_stream
    result: Result = conn.run(command, **kwargs)
    return result


def root_sh(
    conn: Connection,
    ctx: HostContext,
    command: str,
    *,
    timeout: float | None = None,
    out_stream: Any = None,
) -> Result:
    """Run ``command`` (a shell string) as root through ``sudo -n sh -c``."""
    prefix = sudo_prefix(ctx)
    full = f"{prefix}sh -c {shlex.quote(command)}" if prefix else command
    return sh(conn, full, timeout=timeout, out_stream=out_stream)


def check(result: Result, what: str) -> str:
    """stdout of a successful command, or a StepFailed naming what failed and why."""
    if result.ok:
        return str(result.stdout)
    tail = (result.stderr or result.stdout or "").strip().splitlines()[-5:]
    raise StepFailed(f"{what} failed (exit {result.exited}): {' | '.join(tail)}")


class ProgressStream:
    """A write()-able stream that forwards interesting lines of long commands as progress."""

    def __init__(self, ctx: HostContext, pattern: str = r".") -> None:
        self.ctx = ctx
        self.pattern = re.compile(pattern)
        self.buffer = ""

    def write(self, data: str) -> int:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            line = line.strip()
            if line and self.pattern.search(line):
                self.ctx.progress(f"  | {line[:160]}")
        return len(data)

    def flush(self) -> None:
        pass


def apt_command(args: Sequence[str], lock_timeout_s: int) -> str:
    """An apt-get command line that waits (bounded) for the dpkg lock instead of failing.

    ``DPkg::Lock::Timeout`` (apt >= 1.9.11) makes apt itself wait for the frontend lock that
    unattended-upgrades holds for minutes on a freshly booted Ubuntu instance.
    """
    quoted = " ".join(shlex.quote(a) for a in args)
    return (
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y "
        f"-o DPkg::Lock::Timeout={int(lock_timeout_s)} "
        '-o Dpkg::Options::="--force-confdef" -o Dpkg::Options::="--force-confold" '
        f"{quoted}"
    )


_LOCK_PATTERNS = ("Could not get lock", "Unable to acquire the dpkg frontend lock", "is held by")


def apt_lock_error(output: str) -> bool:
    return any(p in output for p in _LOCK_PATTERNS)


def apt_get(conn: Connection, ctx: HostContext, *args: str, what: str | None = None) -> str:
    cmd = apt_command(args, ctx.options.apt_lock_timeout_s)
    stream = ProgressStream(ctx, r"^(Get:\d|Unpacking|Setting up|Building|DKMS|Waiting for)")
    result = root_sh(conn, ctx, cmd, out_stream=stream)
    if not result.ok and apt_lock_error(result.stdout + result.stderr):
        raise StepFailed(
            f"the apt/dpkg lock was still held after {ctx.options.apt_lock_timeout_s} s "
            "(usually unattended-upgrades or cloud-init on a fresh boot); rerun later or raise "
            "--apt-lock-timeout",
            apt_lock_timeout_s=ctx.options.apt_lock_timeout_s,
        )
    return check(result, what or f"apt-get {' '.join(args)}")


def probe(conn: Connection, ctx: HostContext) -> dict[str, Any]:
    result = sh(conn, PROBE_SCRIPT, timeout=60)
    facts = facts_from_probe(str(result.stdout))
    ctx.facts.update(facts)
    return facts


def _probe_summary(facts: Mapping[str, Any]) -> str:
    os_info: OsInfo = facts["os"]
    gpu = facts["gpu_evidence"]
    if facts["driver_version"]:
        gpu += f", driver {facts['driver_version']}"
    return f"{os_info.pretty_name} ({facts['arch']}); {gpu}"


def preflight_verdict(facts: Mapping[str, Any], user: str | None) -> StepResult:
    """Can this node be bootstrapped? (pure: sudo, OS, CPU architecture)"""
    os_info: OsInfo = facts["os"]
    details = {"os": os_info.pretty_name, "gpu_count": facts["gpu_count"]}
    if facts["sudo"] == "missing":
        return StepResult.failed(
            f"sudo is not installed and user {user!r} is not root; install sudo or "
            "connect as a user with passwordless sudo",
            **details,
        )
    if facts["sudo"] == "no":
        return StepResult.failed(
            f"user {user!r} has no passwordless sudo (sudo -n true failed); "
            "bootstrap needs root: add a NOPASSWD sudoers rule or connect as another user",
            **details,
        )
    if not os_info.supported:
        return StepResult.failed(
            f"unsupported OS: {os_info.pretty_name}; bootstrap installs from NVIDIA's CUDA apt "
            f"repository and supports {supported_os_text()}",
            **details,
        )
    if facts["arch"] not in ("x86_64", "aarch64"):
        return StepResult.failed(f"unsupported CPU architecture {facts['arch']!r}", **details)
    return StepResult.ok(_probe_summary(facts), **details)


@step("preflight")
def preflight_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Facts for later steps, and the conditions every changing task needs: sudo, an OS we
    know how to install drivers on."""
    return preflight_verdict(probe(conn, ctx), conn.user)


@step("probe")
def probe_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Read-only facts for status-like tasks: works on any OS and without sudo."""
    facts = probe(conn, ctx)
    return StepResult.ok(_probe_summary(facts))
