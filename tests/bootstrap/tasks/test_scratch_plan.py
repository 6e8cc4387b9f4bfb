"""The scratch planner on real-shaped lsblk output: what it picks, what it refuses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bootstrap.fleet.api import ScratchSpec
from bootstrap.tasks.scratch import (
    FSTAB_OPTIONS,
    LABEL,
    MD_DEVICE,
    ScratchRefused,
    candidate_devices,
    fstab_line,
    nvme_models,
    parse_lsblk,
    plan_scratch,
    update_fstab,
)

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return data


def find(data: dict[str, Any], name: str) -> dict[str, Any]:
    for dev in data["blockdevices"]:
        if dev["name"] == name:
            return dev
    raise KeyError(name)


P4D = ScratchSpec(path="/scratch", kind="nvme", devices=8, size_gb=8000)
G5 = ScratchSpec(path="/scratch", kind="nvme", devices=1, size_gb=250)
ALI = ScratchSpec(path="/scratch", kind="disk", devices=1, size_gb=500)


def test_p4d_raid0_over_all_eight_instance_store_devices_and_never_the_root_ebs() -> None:
    plan = plan_scratch(sample("lsblk_p4d_24xlarge.json"), P4D)
    assert plan.action == "create"
    assert len(plan.devices) == 8
    assert "/dev/nvme4n1" not in plan.devices  # the EBS root, enumerated between the NVMe
    assert plan.devices == tuple(f"/dev/nvme{i}n1" for i in (0, 1, 2, 3, 5, 6, 7, 8))
    create = next(c for c in plan.commands if c.startswith("mdadm --create"))
    assert "--level=0" in create and "--raid-devices=8" in create
    assert plan.target == MD_DEVICE
    assert any(c.startswith("mkfs.ext4") and MD_DEVICE in c for c in plan.commands)
    assert plan.erase == ()  # fresh instance store: nothing to erase, no --force needed


def test_g5_single_nvme_gets_a_filesystem_without_mdadm() -> None:
    plan = plan_scratch(sample("lsblk_g5_xlarge.json"), G5, owner="ubuntu")
    assert plan.action == "create"
    assert plan.devices == ("/dev/nvme1n1",)
    assert not plan.needs_mdadm
    assert not any("mdadm" in c for c in plan.commands)
    assert f"mkfs.ext4 -q -F -m 0 -E nodiscard -L {LABEL} /dev/nvme1n1" in plan.commands
    assert "mount -o noatime /dev/nvme1n1 /scratch" in plan.commands
    assert "chown ubuntu: /scratch" in plan.commands


def test_alicloud_essd_data_disk_is_picked_and_the_system_disk_is_not() -> None:
    plan = plan_scratch(sample("lsblk_alicloud_essd.json"), ALI)
    assert plan.devices == ("/dev/vdb",)
    assert plan.action == "create"


def test_nvme_kind_finds_nothing_on_a_virtio_only_node() -> None:
    plan = plan_scratch(sample("lsblk_alicloud_essd.json"), ScratchSpec(kind="nvme"))
    assert plan.action == "none"
    assert "no instance-store NVMe" in plan.reason


def test_disk_holding_a_filesystem_is_refused_and_the_refusal_says_what_is_on_it() -> None:
    with pytest.raises(ScratchRefused) as exc:
        plan_scratch(sample("lsblk_g5_xlarge_with_fs.json"), G5)
    message = str(exc.value)
    assert "/dev/nvme1n1" in message
    assert "xfs label datasets" in message
    assert "mounted at /data" in message
    assert "--force" in message


def test_force_lists_exactly_what_it_erases_and_unmounts_first() -> None:
    plan = plan_scratch(sample("lsblk_g5_xlarge_with_fs.json"), G5, force=True)
    assert plan.erase == (
        "/dev/nvme1n1 (250 GB, Amazon EC2 NVMe Instance Storage): "
        "xfs label datasets mounted at /data",
    )
    umount = plan.commands.index("umount /data")
    wipe = plan.commands.index("wipefs --all --quiet /dev/nvme1n1")
    mkfs = next(i for i, c in enumerate(plan.commands) if c.startswith("mkfs"))
    assert umount < wipe < mkfs


def test_root_disk_is_refused_even_with_force() -> None:
    with pytest.raises(ScratchRefused, match="running system"):
        plan_scratch(
            sample("lsblk_g5_xlarge.json"), G5, explicit_devices=["/dev/nvme0n1"], force=True
        )


def test_missing_devices_compared_with_the_stack_fail_loudly() -> None:
    data = sample("lsblk_p4d_24xlarge.json")
    data["blockdevices"] = [d for d in data["blockdevices"] if d["name"] != "nvme8n1"]
    with pytest.raises(ScratchRefused, match="promises 8 scratch device"):
        plan_scratch(data, P4D)


def test_already_mounted_scratch_is_left_alone() -> None:
    data = sample("lsblk_g5_xlarge.json")
    nvme = find(data, "nvme1n1")
    nvme.update(fstype="ext4", label=LABEL, mountpoints=["/scratch"])
    plan = plan_scratch(data, G5)
    assert plan.action == "mounted"
    assert plan.commands == ()


def test_existing_array_after_reboot_is_mounted_not_recreated() -> None:
    data = sample("lsblk_p4d_24xlarge.json")
    md = {
        "name": "md127",
        "path": "/dev/md127",
        "type": "raid0",
        "size": 8 * 10**12,
        "fstype": "ext4",
        "label": LABEL,
        "mountpoints": [None],
    }
    for dev in data["blockdevices"]:
        if dev.get("model") == "Amazon EC2 NVMe Instance Storage":
            dev["fstype"] = "linux_raid_member"
            dev["children"] = [copy.deepcopy(md)]
    plan = plan_scratch(data, P4D)
    assert plan.action == "mount"
    assert plan.target == "/dev/md127"
    assert not any(c.startswith(("mkfs", "mdadm", "wipefs")) for c in plan.commands)


def test_model_from_nvme_cli_when_lsblk_has_none() -> None:
    data = sample("lsblk_g5_xlarge.json")
    for dev in data["blockdevices"]:
        dev["model"] = None  # older kernels/udev leave MODEL empty for NVMe
    models = nvme_models(sample("nvme_list_g5_xlarge.json"))
    assert models["/dev/nvme1n1"][0] == "Amazon EC2 NVMe Instance Storage"
    picked = candidate_devices(parse_lsblk(data), "nvme", models)
    assert [d.path for d in picked] == ["/dev/nvme1n1"]


def test_loop_and_snap_devices_are_never_candidates() -> None:
    devices = parse_lsblk(sample("lsblk_g5_xlarge.json"))
    assert all(not d.path.startswith("/dev/loop") for d in candidate_devices(devices, "disk"))


def test_fstab_gets_one_nofail_line_and_a_rerun_changes_nothing() -> None:
    original = "UUID=abc / ext4 defaults 0 1\n"
    once = update_fstab(original, "/scratch")
    assert once is not None
    assert once.endswith(fstab_line("/scratch") + "\n")
    assert "nofail" in FSTAB_OPTIONS
    assert update_fstab(once, "/scratch") is None


def test_fstab_replaces_a_stale_entry_for_the_same_mount_point() -> None:
    stale = "UUID=abc / ext4 defaults 0 1\n/dev/md0 /scratch xfs defaults 0 0\n"
    updated = update_fstab(stale, "/scratch")
    assert updated is not None
    assert "/dev/md0" not in updated
    assert updated.count("/scratch") == 1


def test_relative_or_system_scratch_path_is_refused() -> None:
    for bad in ("scratch", "/", "/boot"):
        with pytest.raises(ScratchRefused, match="non-system path"):
            plan_scratch(sample("lsblk_g5_xlarge.json"), ScratchSpec(path=bad))


def test_a_filesystem_only_blkid_sees_still_counts_as_data() -> None:
    # lsblk takes FSTYPE from udev; on a node where udev has not caught up it shows null.
    blkid = "==/dev/nvme1n1\nDEVNAME=/dev/nvme1n1\nLABEL=old\nTYPE=ext4\n"
    with pytest.raises(ScratchRefused, match="ext4 label old"):
        plan_scratch(sample("lsblk_g5_xlarge.json"), G5, blkid=blkid)


def test_our_label_seen_only_by_blkid_is_mounted_not_reformatted() -> None:
    blkid = f"==/dev/nvme1n1\nLABEL={LABEL}\nTYPE=ext4\n"
    plan = plan_scratch(sample("lsblk_g5_xlarge.json"), G5, blkid=blkid)
    assert plan.action == "mount"
