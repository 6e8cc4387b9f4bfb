"""Parsing what the probe reads on a node: os-release, PCI bus, nvidia-smi, lspci."""

from __future__ import annotations

from bootstrap.fleet.system import (
    apt_command,
    apt_lock_error,
    facts_from_probe,
    parse_lspci_gpu_names,
    parse_nvidia_smi_query,
    parse_os_release,
    parse_pci_devices,
    parse_smi_cuda_version,
    preflight_verdict,
)

UBUNTU_2204 = """PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
"""
AMAZON_LINUX = """NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PRETTY_NAME="Amazon Linux 2023.6.20241010"
"""

# /sys/bus/pci/devices on a p4d.24xlarge (excerpt): 8 A100 (10de:20b0, class 0x030200),
# 6 NVSwitch bridges (10de:1af1, class 0x068000), the ENA NIC and an NVMe controller.
P4D_PCI = """0000:10:1c.0 0x10de 0x20b0 0x030200
0000:10:1d.0 0x10de 0x20b0 0x030200
0000:20:1c.0 0x10de 0x20b0 0x030200
0000:20:1d.0 0x10de 0x20b0 0x030200
0000:90:1c.0 0x10de 0x20b0 0x030200
0000:90:1d.0 0x10de 0x20b0 0x030200
0000:a0:1c.0 0x10de 0x20b0 0x030200
0000:a0:1d.0 0x10de 0x20b0 0x030200
0000:11:00.0 0x10de 0x1af1 0x068000
0000:12:00.0 0x10de 0x1af1 0x068000
0000:00:05.0 0x1d0f 0xefa1 0x020000
0000:00:04.0 0x1d0f 0x8061 0x010802
"""


def test_os_release_ubuntu_is_supported_with_its_cuda_repo() -> None:
    info = parse_os_release(UBUNTU_2204)
    assert (info.id, info.version_id, info.codename) == ("ubuntu", "22.04", "jammy")
    assert info.cuda_repo == "ubuntu2204"


def test_amazon_linux_is_not_supported() -> None:
    info = parse_os_release(AMAZON_LINUX)
    assert not info.supported
    assert info.pretty_name == "Amazon Linux 2023.6.20241010"


def test_pci_counts_gpus_but_not_nvswitch_bridges() -> None:
    gpus = parse_pci_devices(P4D_PCI)
    assert len(gpus) == 8
    assert {g.device_id for g in gpus} == {"0x20b0"}


def test_nvidia_smi_query_and_cuda_version() -> None:
    text = "NVIDIA A100-SXM4-40GB, 570.133.20, 40960\nNVIDIA A100-SXM4-40GB, 570.133.20, 40960\n"
    gpus = parse_nvidia_smi_query(text)
    assert [g.driver_version for g in gpus] == ["570.133.20"] * 2
    assert gpus[0].memory_mib == 40960
    header = "| NVIDIA-SMI 570.133.20   Driver Version: 570.133.20   CUDA Version: 12.8     |"
    assert parse_smi_cuda_version(header) == (12, 8)


def test_nvidia_smi_failure_text_is_not_a_gpu() -> None:
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    assert parse_nvidia_smi_query(text) == []


def test_lspci_names_skip_bridges_and_revision() -> None:
    text = (
        "10:1c.0 3D controller: NVIDIA Corporation GA100 [A100 SXM4 40GB] (rev a1)\n"
        "11:00.0 Bridge: NVIDIA Corporation Device 1af1 (rev a1)\n"
    )
    assert parse_lspci_gpu_names(text) == ["GA100 [A100 SXM4 40GB]"]


def test_probe_facts_on_a_node_without_gpu_or_driver() -> None:
    text = (
        "==os\n" + UBUNTU_2204 + "==uid\n1000\n==sudo\nyes\n==arch\nx86_64\n==kernel\n"
        "6.8.0-1015-aws\n==lspci\n==pci\n0000:00:04.0 0x1d0f 0x8061 0x010802\n==smi\nmissing\n"
        "==smicuda\n==reboot\nno\n==uptime\n123.45\n"
    )
    facts = facts_from_probe(text)
    assert facts["gpu_count"] == 0
    assert facts["gpu_evidence"] == "no NVIDIA device on the PCI bus"
    assert facts["kernel"] == "6.8.0-1015-aws"
    assert facts["driver_version"] is None and not facts["nvidia_smi_present"]
    assert facts["uptime_s"] == 123.45


def test_probe_facts_with_gpus_but_driver_not_loaded_keep_the_error() -> None:
    text = (
        "==os\n" + UBUNTU_2204 + "==uid\n0\n==sudo\nroot\n==arch\nx86_64\n==kernel\nk\n"
        "==pci\n" + P4D_PCI + "==smi\nNVIDIA-SMI has failed because it couldn't communicate"
        " with the NVIDIA driver.\n==reboot\nyes\n==uptime\n5\n"
    )
    facts = facts_from_probe(text)
    assert facts["gpu_count"] == 8
    assert not facts["driver_loaded"]
    assert "couldn't communicate" in facts["nvidia_smi_error"]
    assert facts["reboot_required"]


def test_apt_waits_for_the_lock_with_a_bound() -> None:
    cmd = apt_command(["install", "nvidia-open-580"], 120)
    assert "-o DPkg::Lock::Timeout=120" in cmd
    assert cmd.startswith("DEBIAN_FRONTEND=noninteractive apt-get")
    assert cmd.endswith("install nvidia-open-580")


def test_apt_lock_messages_are_recognised() -> None:
    assert apt_lock_error(
        "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1234 "
        "(unattended-upgr)"
    )
    assert not apt_lock_error("E: Unable to locate package nvidia-open-999")


def probe_text(os_release: str, sudo: str = "yes", arch: str = "x86_64") -> str:
    return (
        f"==os\n{os_release}==uid\n1000\n==sudo\n{sudo}\n==arch\n{arch}\n==kernel\nk\n"
        "==pci\n==smi\nmissing\n==reboot\nno\n==uptime\n60\n"
    )


def test_preflight_rejects_an_unsupported_os_and_names_the_supported_ones() -> None:
    result = preflight_verdict(facts_from_probe(probe_text(AMAZON_LINUX)), "ec2-user")
    assert result.status == "failed"
    assert "unsupported OS: Amazon Linux 2023" in result.message
    assert "Ubuntu 22.04" in result.message and "Ubuntu 24.04" in result.message


def test_preflight_rejects_a_user_without_passwordless_sudo() -> None:
    result = preflight_verdict(facts_from_probe(probe_text(UBUNTU_2204, sudo="no")), "bob")
    assert result.status == "failed" and "'bob' has no passwordless sudo" in result.message


def test_preflight_passes_ubuntu_with_sudo() -> None:
    result = preflight_verdict(facts_from_probe(probe_text(UBUNTU_2204)), "ubuntu")
    assert result.status == "ok" and result.message.startswith("Ubuntu 22.04.5 LTS (x86_64)")
