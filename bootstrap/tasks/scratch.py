"""Fast scratch: instance-store NVMe (or a cloud data disk) as one ext4 volume.

:func:`plan_scratch` is pure: ``lsblk --json`` (and optionally ``nvme list -o json``) in, a
plan out. Its safety rules:

- the root disk (anything holding ``/``, ``/boot``, swap...) is never a candidate, even with
  ``--force``;
- a device that holds a filesystem, partitions, a RAID member signature or a mount is
  refused unless ``--force``, and with ``--force`` the plan lists exactly what it erases;
- an existing gpufleet scratch volume (label ``gpufleet-scratch``) is mounted, never
  re-created, so the step is idempotent and safe to rerun after a reboot.

AWS instance store shows up as NVMe model "Amazon EC2 NVMe Instance Storage", EBS as
"Amazon Elastic Block Store" (AWS EC2 user guide, "Instance store volumes"); Alicloud data
disks are virtio (vdb...) or NVMe disks next to the system disk.
"""

from __future__ import annotations

import dataclasses
import json as jsonlib
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabric import Connection
from invoke import Context

from bootstrap.fleet.api import (
    DEFAULT_FSTAB,
    HostContext,
    Options,
    ScratchSpec,
    StepFailed,
    StepResult,
    step,
)
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.system import apt_get, check, root_sh, sh

LABEL = "gpufleet-scratch"
MD_DEVICE = f"/dev/md/{LABEL}"
FSTAB_OPTIONS = "defaults,noatime,nofail,x-systemd.device-timeout=10s"
LSBLK_COLUMNS = "NAME,PATH,TYPE,SIZE,MODEL,SERIAL,FSTYPE,LABEL,UUID,MOUNTPOINTS,RO,RM"
LSBLK_COMMAND = f"lsblk --json --bytes -o {LSBLK_COLUMNS}"

EBS_MODEL = "Amazon Elastic Block Store"
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
# Mounts that make a disk part of the running system (never scratch material).
SYSTEM_MOUNTS = ("/", "/boot", "/boot/efi", "/usr", "/var", "/home", "[SWAP]")
_NOT_DISKS = ("loop", "rom", "zram", "ram", "md", "dm", "sr")


class ScratchRefused(Exception):
    """The plan would destroy data (or cannot be made); the message says what and why."""


@dataclass(frozen=True)
class BlockDevice:
    name: str
    path: str
    type: str
    size: int
    model: str
    serial: str
    fstype: str | None
    label: str | None
    mountpoints: tuple[str, ...]
    read_only: bool
    removable: bool
    children: tuple[BlockDevice, ...] = ()

    def walk(self) -> Iterator[BlockDevice]:
        yield self
        for child in self.children:
            yield from child.walk()

    @property
    def all_mounts(self) -> tuple[str, ...]:
        return tuple(m for d in self.walk() for m in d.mountpoints)

    def describe(self) -> str:
        """A human line of what is on the device, used in refusals and erase lists."""
        parts = [f"{self.path} ({self.size / 1e9:.0f} GB{', ' + self.model if self.model else ''})"]
        for d in self.walk():
            what = []
            if d.fstype:
                what.append(d.fstype + (f" label {d.label}" if d.label else ""))
            if d is not self and d.type == "part":
                what.insert(0, f"partition {d.path}")
            if d is not self and d.type.startswith("raid"):
                what.insert(0, f"array {d.path}")
            if d.mountpoints:
                what.append("mounted at " + ", ".join(d.mountpoints))
            if what:
                parts.append(" ".join(what))
        return ": ".join([parts[0], "; ".join(parts[1:])]) if len(parts) > 1 else parts[0]


def _device(raw: Mapping[str, Any]) -> BlockDevice:
    mounts_raw = raw.get("mountpoints")
    if mounts_raw is None and raw.get("mountpoint"):
        mounts_raw = [raw["mountpoint"]]  # util-linux < 2.37 has only MOUNTPOINT
    mounts = tuple(m for m in (mounts_raw or []) if m)
    name = str(raw.get("name", ""))
    return BlockDevice(
        name=name,
        path=str(raw.get("path") or f"/dev/{name}"),
        type=str(raw.get("type", "")),
        size=int(raw.get("size") or 0),
        model=str(raw.get("model") or "").strip(),
        serial=str(raw.get("serial") or "").strip(),
        fstype=raw.get("fstype") or None,
        label=raw.get("label") or None,
        mountpoints=mounts,
        read_only=raw.get("ro") in (True, "1", 1),
        removable=raw.get("rm") in (True, "1", 1),
        children=tuple(_device(c) for c in raw.get("children", []) or []),
    )


def parse_lsblk(data: Mapping[str, Any] | str) -> list[BlockDevice]:
    if isinstance(data, str):
        data = jsonlib.loads(data)
    assert isinstance(data, Mapping)
    return [_device(d) for d in data.get("blockdevices", [])]


def parse_blkid(text: str) -> dict[str, dict[str, str]]:
    """``==/dev/x`` + ``blkid -p -o export /dev/x`` sections -> {path: {TYPE, LABEL, ...}}."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("==/dev/"):
            current = out.setdefault(line[2:].strip(), {})
        elif current is not None and "=" in line:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return out


def blkid_command(paths: Sequence[str]) -> str:
    """Probe devices directly (``-p``: no cache, no udev), as lsblk may not know yet."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return f'for d in {quoted}; do echo "==$d"; blkid -p -o export "$d" 2>/dev/null; done; true'


def _with_probe(dev: BlockDevice, probes: Mapping[str, Mapping[str, str]]) -> BlockDevice:
    probe = probes.get(dev.path) or {}
    if dev.fstype or not (probe.get("TYPE") or probe.get("PTTYPE")):
        return dev
    return dataclasses.replace(
        dev,
        fstype=probe.get("TYPE") or f"partition table ({probe['PTTYPE']})",
        label=dev.label or probe.get("LABEL") or None,
    )


def nvme_models(data: Mapping[str, Any] | str | None) -> dict[str, tuple[str, str]]:
    """{'/dev/nvme1n1': (model, serial)} from ``nvme list -o json`` (nvme-cli 1.x and 2.x)."""
    if not data:
        return {}
    if isinstance(data, str):
        data = jsonlib.loads(data)
    assert isinstance(data, Mapping)
    out: dict[str, tuple[str, str]] = {}
    for dev in data.get("Devices", []):
        if "DevicePath" in dev:  # nvme-cli 1.x: flat list of namespaces
            out[dev["DevicePath"]] = (
                str(dev.get("ModelNumber", "")).strip(),
                str(dev.get("SerialNumber", "")).strip(),
            )
            continue
        for subsystem in dev.get("Subsystems", []):  # nvme-cli 2.x: nested
            for ctrl in subsystem.get("Controllers", []):
                model = str(ctrl.get("ModelNumber", "")).strip()
                serial = str(ctrl.get("SerialNumber", "")).strip()
                for ns in ctrl.get("Namespaces", []) + subsystem.get("Namespaces", []):
                    out[f"/dev/{ns.get('NameSpace')}"] = (model, serial)
    return out


def is_system_disk(dev: BlockDevice) -> bool:
    return any(m in SYSTEM_MOUNTS for m in dev.all_mounts)


def is_ours(dev: BlockDevice) -> bool:
    return any(d.label == LABEL for d in dev.walk())


def holds_data(dev: BlockDevice) -> bool:
    return bool(dev.fstype or dev.children or dev.mountpoints)


def candidate_devices(
    devices: Sequence[BlockDevice],
    kind: str,
    models: Mapping[str, tuple[str, str]] | None = None,
) -> list[BlockDevice]:
    """Scratch candidates by kind: ``nvme`` = local NVMe that is not EBS; ``disk`` = any
    other whole data disk. The system disk and odd devices are never candidates."""
    models = models or {}
    found = []
    for dev in devices:
        if dev.type != "disk" or dev.name.startswith(_NOT_DISKS) or dev.size == 0:
            continue
        if dev.read_only or dev.removable or is_system_disk(dev):
            continue
        model = dev.model or models.get(dev.path, ("", ""))[0]
        is_nvme = dev.name.startswith("nvme")
        if kind == "nvme":
            if not is_nvme or model == EBS_MODEL:
                continue
        elif kind == "disk":
            # A data disk that is neither instance store nor the system disk.
            if model == INSTANCE_STORE_MODEL:
                continue
        else:
            raise ValueError(f"unknown scratch kind {kind!r} (nvme or disk)")
        found.append(dev)
    return sorted(found, key=lambda d: _natural_key(d.name))


def _natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class ScratchPlan:
    action: str  # "mounted" | "mount" | "create" | "none"
    reason: str
    path: str
    devices: tuple[str, ...] = ()
    target: str | None = None  # the block device that carries the filesystem
    commands: tuple[str, ...] = ()
    erase: tuple[str, ...] = ()  # what --force destroys, one line per device
    fstab_line: str = ""
    needs_mdadm: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


def fstab_line(path: str) -> str:
    # nofail: instance store is empty after a stop/start; the node must still boot.
    return f"LABEL={LABEL} {path} ext4 {FSTAB_OPTIONS} 0 2"


def update_fstab(text: str, path: str) -> str | None:
    """fstab text with our line for ``path`` (replacing any other entry for that mount
    point), or None when it is already exactly there."""
    wanted = fstab_line(path)
    lines = text.splitlines()
    kept: list[str] = []
    present = False
    for line in lines:
        fields = line.split()
        if fields and not fields[0].startswith("#") and len(fields) >= 2 and fields[1] == path:
            if line.strip() == wanted and not present:
                present = True
                kept.append(line)
            continue
        kept.append(line)
    if present and len(kept) == len(lines):
        return None
    if not present:
        kept.append(wanted)
    return "\n".join(kept) + "\n"


def _mount_commands(target: str, path: str, owner: str | None) -> list[str]:
    q = shlex.quote
    cmds = [f"mkdir -p {q(path)}", f"mount -o noatime {q(target)} {q(path)}"]
    if owner:
        cmds.append(f"chown {q(owner)}: {q(path)}")
    return cmds


def plan_scratch(
    lsblk: Mapping[str, Any] | str,
    spec: ScratchSpec,
    *,
    explicit_devices: Sequence[str] = (),
    force: bool = False,
    nvme_list: Mapping[str, Any] | str | None = None,
    owner: str | None = None,
    blkid: str = "",
) -> ScratchPlan:
    """What mount-scratch must do; raises ScratchRefused rather than risk data.

    ``blkid`` (output of :func:`blkid_command`) adds what a direct probe of the devices
    found: lsblk reads filesystem types from udev, which can lag or be absent, and a
    filesystem it does not report must still count as data.
    """
    probes = parse_blkid(blkid)
    devices = [_with_probe(d, probes) for d in parse_lsblk(lsblk)]
    path = spec.path
    if not path.startswith("/") or path in SYSTEM_MOUNTS:
        raise ScratchRefused(f"scratch path {path!r} must be an absolute, non-system path")
    # 1. Already mounted where it belongs: nothing to do (the step still checks fstab).
    mounted = _already_mounted(devices, path, force)
    if mounted is not None:
        return mounted
    if explicit_devices:
        chosen = _named_devices(devices, explicit_devices)
    else:
        chosen = candidate_devices(devices, spec.kind, nvme_models(nvme_list))
    if not chosen:
        what = "instance-store NVMe devices" if spec.kind == "nvme" else "data disks"
        if spec.devices:
            raise ScratchRefused(
                f"the stack promises {spec.devices} scratch device(s) but no {what} were found"
            )
        return ScratchPlan("none", f"no {what} on this node", path)
    warnings: list[str] = []
    if spec.devices and not explicit_devices and len(chosen) != spec.devices:
        if len(chosen) < spec.devices:
            raise ScratchRefused(
                f"the stack promises {spec.devices} scratch device(s), found {len(chosen)}: "
                + ", ".join(d.path for d in chosen)
            )
        warnings.append(f"found {len(chosen)} devices, the stack expected {spec.devices}")
    names = tuple(d.path for d in chosen)
    # 2. Our volume exists (after a reboot, or a rerun): mount it, never re-create it.
    ours = [d for d in chosen if is_ours(d)]
    if ours and not force:
        arrays = [c for d in ours for c in d.children if c.label == LABEL]
        target = arrays[0].path if arrays else ours[0].path
        return ScratchPlan(
            "mount",
            f"existing gpufleet scratch volume {target}: mounting it at {path}",
            path,
            devices=names,
            target=target,
            commands=tuple(_mount_commands(target, path, owner)),
            fstab_line=fstab_line(path),
            warnings=tuple(warnings),
        )
    # 3. Build it. Anything on the devices is data until proven otherwise.
    busy = [d for d in chosen if holds_data(d)]
    if busy and not force:
        raise ScratchRefused(
            "refusing to format device(s) that hold data: "
            + " | ".join(d.describe() for d in busy)
            + ". Rerun with --force to ERASE them."
        )
    return _create_plan(chosen, busy, path, owner, warnings)


def _already_mounted(devices: Sequence[BlockDevice], path: str, force: bool) -> ScratchPlan | None:
    """The plan when something is mounted at ``path`` already (ours or not), else None."""
    for dev in (d for top in devices for d in top.walk()):
        if path in dev.mountpoints:
            if dev.label != LABEL and not force:
                return ScratchPlan(
                    "mounted",
                    f"{path} is already a mount of {dev.path} ({dev.fstype or 'unknown fs'}), "
                    "not a gpufleet scratch volume; left as it is",
                    path,
                    target=dev.path,
                    warnings=("foreign mount at the scratch path",),
                )
            return ScratchPlan(
                "mounted",
                f"{dev.path} already mounted at {path}",
                path,
                target=dev.path,
                fstab_line=fstab_line(path),
            )
    return None


def _named_devices(devices: Sequence[BlockDevice], names: Sequence[str]) -> list[BlockDevice]:
    """The --devices the person named, each a whole disk that does not hold the system."""
    by_path = {d.path: d for d in devices}
    chosen = []
    for p in names:
        found = by_path.get(p)
        if found is None:
            raise ScratchRefused(f"{p} is not a whole block device on this node (lsblk)")
        if is_system_disk(found):
            raise ScratchRefused(f"{p} holds the running system ({found.describe()}); refusing")
        chosen.append(found)
    return chosen


def _create_plan(
    chosen: Sequence[BlockDevice],
    busy: Sequence[BlockDevice],
    path: str,
    owner: str | None,
    warnings: Sequence[str],
) -> ScratchPlan:
    """Erase ``busy`` (already allowed by --force), then one ext4 volume over ``chosen``."""
    q = shlex.quote
    names = tuple(d.path for d in chosen)
    commands: list[str] = []
    erase = tuple(f"{d.describe()}" for d in busy)
    for dev in busy:
        for mount in sorted({m for m in dev.all_mounts if m != "[SWAP]"}, reverse=True):
            commands.append(f"umount {q(mount)}")
        for child in dev.children:
            if child.type.startswith("raid"):
                commands.append(f"mdadm --stop {q(child.path)}")
        if dev.fstype == "linux_raid_member":
            commands.append(f"mdadm --zero-superblock {q(dev.path)}")
        commands.append(f"wipefs --all --quiet {q(dev.path)}")
    needs_mdadm = len(chosen) > 1
    if needs_mdadm:
        target = MD_DEVICE
        commands.append(
            f"mdadm --create {MD_DEVICE} --run --level=0 --raid-devices={len(chosen)} "
            f"--name={LABEL} " + " ".join(q(n) for n in names)
        )
    else:
        target = names[0]
    # -m 0: no blocks reserved for root on a scratch volume. nodiscard: new instance store
    # is already trimmed, and discarding terabytes makes mkfs take minutes.
    commands.append(f"mkfs.ext4 -q -F -m 0 -E nodiscard -L {LABEL} {q(target)}")
    commands += _mount_commands(target, path, owner)
    layout = f"RAID 0 over {len(chosen)} devices" if needs_mdadm else "single device"
    return ScratchPlan(
        "create",
        f"creating ext4 ({layout}: {', '.join(names)}) at {path}",
        path,
        devices=names,
        target=target,
        commands=tuple(commands),
        erase=erase,
        fstab_line=fstab_line(path),
        needs_mdadm=needs_mdadm,
        warnings=tuple(warnings),
    )


def _write_fstab(conn: Connection, ctx: HostContext, fstab: str, path: str) -> bool:
    current = sh(conn, f"cat {shlex.quote(fstab)} 2>/dev/null").stdout
    updated = update_fstab(current, path)
    if updated is None:
        return False
    q = shlex.quote
    # Write a sibling file, then rename: a half-written fstab can leave a node unbootable.
    tmp = f"{fstab}.gpufleet.tmp"
    cmd = f"printf %s {q(updated)} > {q(tmp)} && mv {q(tmp)} {q(fstab)}"
    if sh(conn, f"test -e {q(fstab)}").ok:
        cmd = f"cp -p {q(fstab)} {q(tmp)} && " + cmd
    check(root_sh(conn, ctx, cmd), f"updating {fstab}")
    return True


@step("mount-scratch")
def mount_scratch_step(conn: Connection, ctx: HostContext) -> StepResult:
    opts = ctx.options
    lsblk = check(sh(conn, LSBLK_COMMAND), "lsblk")
    nvme = sh(conn, "command -v nvme >/dev/null && nvme list -o json 2>/dev/null")
    disks = [d.path for d in parse_lsblk(lsblk) if d.type in ("disk", "loop")]
    blkid = root_sh(conn, ctx, blkid_command(disks)).stdout if disks else ""
    owner = conn.user if conn.user and conn.user != "root" else None
    try:
        plan = plan_scratch(
            lsblk,
            ctx.scratch,
            explicit_devices=opts.scratch_devices,
            force=opts.force,
            nvme_list=nvme.stdout if nvme.ok and nvme.stdout.strip() else None,
            owner=owner,
            blkid=blkid,
        )
    except ScratchRefused as exc:
        raise StepFailed(str(exc)) from None
    details: dict[str, object] = {
        "path": plan.path,
        "devices": list(plan.devices),
        "target": plan.target,
        "warnings": list(plan.warnings),
    }
    if plan.action == "none":
        return StepResult.skipped(plan.reason, **details)
    if plan.action == "mounted" and not plan.fstab_line:
        return StepResult.ok(plan.reason, **details)
    changed = False
    if plan.erase:
        details["erased"] = list(plan.erase)
        ctx.progress("--force: ERASING " + " | ".join(plan.erase))
    if plan.commands:
        if plan.needs_mdadm and not sh(conn, "command -v mdadm").ok:
            ctx.progress("installing mdadm")
            apt_get(conn, ctx, "install", "--no-install-recommends", "mdadm")
        ctx.progress(plan.reason)
        for command in plan.commands:
            check(root_sh(conn, ctx, command, timeout=1800), command)
        changed = True
    if _write_fstab(conn, ctx, opts.fstab, plan.path):
        changed = True
    df = sh(conn, f"df -B1 --output=size,avail {shlex.quote(plan.path)} | tail -1").stdout.split()
    if len(df) == 2:
        details.update(size_bytes=int(df[0]), free_bytes=int(df[1]))
    if not changed:
        return StepResult.ok(plan.reason, **details)
    verb = {"create": "created", "mount": "mounted"}.get(plan.action, "updated fstab for")
    return StepResult.changed(f"{verb} {plan.target} at {plan.path} (fstab: nofail)", **details)


@fleet_task(
    help={
        "force": "ERASE devices that hold a filesystem or are mounted (lists them first)",
        "devices": "comma-separated devices to use instead of discovery (e.g. /dev/nvme1n1)",
        "path": "mount point (default: the stack's scratch.path, else /scratch)",
        "fstab": f"fstab file to update (default {DEFAULT_FSTAB})",
    }
)
def mount_scratch(
    c: Context,
    fleet_args: FleetArgs,
    force: bool = False,
    devices: str = "",
    path: str = "",
    fstab: str = DEFAULT_FSTAB,
) -> None:
    """RAID 0 + ext4 over the instance-store NVMe (or data disk), mounted with nofail."""
    options = Options(
        force=force,
        scratch_devices=tuple(d.strip() for d in devices.split(",") if d.strip()),
        fstab=fstab,
        scratch_path=path or None,
    )
    fleet_run(
        c,
        "mount-scratch",
        [mount_scratch_step],
        fleet_args,
        options=options,
    )
