"""Which driver (and PyTorch build) a node gets, decided without touching a node."""

from __future__ import annotations

from typing import Any

import pytest

from bootstrap.fleet.system import OsInfo
from bootstrap.tasks.driver import choose_branch, gpu_architecture, plan_driver
from bootstrap.tasks.pytorch import installed_matches, torch_build_tag, torch_index_url

JAMMY = OsInfo("ubuntu", "22.04", "Ubuntu 22.04.5 LTS", "jammy")


def plan(**overrides: Any) -> Any:
    args: dict[str, Any] = {
        "gpu_names": ["GA100 [A100 SXM4 40GB]"],
        "gpu_count": 8,
        "driver_version": None,
        "cuda_version": None,
        "os_info": JAMMY,
        "machine": "x86_64",
        "kernel": "6.8.0-1015-aws",
        "nvswitch": False,
        "fabric_manager_active": False,
    }
    args.update(overrides)
    return plan_driver(**args)


@pytest.mark.parametrize(
    ("name", "arch"),
    [
        ("Tesla V100-SXM2-16GB", "volta"),
        ("GV100GL [Tesla V100 SXM2 16GB]", "volta"),
        ("Tesla T4", "turing"),
        ("NVIDIA A10G", "ampere"),
        ("NVIDIA A100-SXM4-80GB", "ampere"),
        ("NVIDIA L4", "ada"),
        ("NVIDIA L40S", "ada"),
        ("NVIDIA H100 80GB HBM3", "hopper"),
        ("GH100 [H200 SXM 141GB]", "hopper"),
        ("NVIDIA B200", "blackwell"),
    ],
)
def test_architecture_from_names(name: str, arch: str) -> None:
    assert gpu_architecture([name]) == arch


def test_deep_learning_ami_driver_is_kept() -> None:
    p = plan(driver_version="570.133.20", cuda_version=(12, 8))
    assert p.action == "keep"
    assert "570.133.20" in p.reason and p.packages == ()


def test_fresh_ampere_node_gets_open_modules_toolkit_and_headers() -> None:
    p = plan()
    assert p.action == "install"
    assert p.packages == ("linux-headers-6.8.0-1015-aws", "nvidia-open-580", "cuda-toolkit-12-8")
    assert p.keyring_url == (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
        "cuda-keyring_1.1-1_all.deb"
    )


def test_volta_gets_the_proprietary_r580_driver_and_cuda_12_6() -> None:
    p = plan(gpu_names=["Tesla V100-SXM2-16GB"])
    assert "cuda-drivers-580" in p.packages
    assert "cuda-toolkit-12-6" in p.packages
    assert not any(pkg.startswith("nvidia-open") for pkg in p.packages)


def test_volta_refuses_a_branch_that_dropped_it() -> None:
    with pytest.raises(ValueError, match="up to driver branch R580"):
        choose_branch("volta", "590")


def test_nvswitch_node_gets_the_matching_fabric_manager() -> None:
    p = plan(nvswitch=True)
    assert "nvidia-fabricmanager-580" in p.packages
    assert "nvidia-fabricmanager" in p.services


def test_working_driver_without_fabric_manager_on_nvswitch_installs_only_that() -> None:
    p = plan(driver_version="570.133.20", cuda_version=(12, 8), nvswitch=True)
    assert p.action == "fabric-manager"
    assert p.packages == ("nvidia-fabricmanager-570",)


def test_old_driver_is_replaced_and_the_reason_says_why() -> None:
    p = plan(driver_version="535.183.01", cuda_version=(12, 2))
    assert p.action == "install"
    assert "older than CUDA 12.6" in p.reason


def test_no_gpu_means_nothing_to_do() -> None:
    assert plan(gpu_count=0, gpu_names=[]).action == "none"


def test_arm_nodes_use_nvidias_sbsa_repository() -> None:
    p = plan(machine="aarch64", gpu_names=["GH100 [H100]"])
    assert "/ubuntu2204/sbsa/" in (p.keyring_url or "")


def test_unknown_gpu_needs_an_explicit_branch() -> None:
    with pytest.raises(ValueError, match="cannot tell the GPU architecture"):
        plan(gpu_names=["Device 2bff"])


@pytest.mark.parametrize(
    ("gpus", "cuda", "arch", "tag"),
    [
        (0, None, None, "cpu"),
        (8, (12, 8), "ampere", "cu128"),
        (8, (13, 0), "hopper", "cu130"),
        (8, (12, 6), "ampere", "cu126"),
        (4, (13, 0), "volta", "cu126"),  # CUDA 13 dropped Volta
        (1, (12, 8), "blackwell", "cu128"),
    ],
)
def test_torch_build_matches_driver_cuda_and_gpu(
    gpus: int, cuda: tuple[int, int] | None, arch: str | None, tag: str
) -> None:
    assert torch_build_tag(gpu_count=gpus, cuda_version=cuda, arch=arch) == tag


def test_blackwell_on_an_old_driver_has_no_usable_torch_build() -> None:
    with pytest.raises(ValueError, match="older than any PyTorch build"):
        torch_build_tag(gpu_count=1, cuda_version=(12, 6), arch="blackwell")


def test_torch_index_choices() -> None:
    common: dict[str, Any] = {"gpu_count": 1, "cuda_version": (12, 8), "arch": "ampere"}
    assert torch_index_url("auto", **common) == "https://download.pytorch.org/whl/cu128"
    assert torch_index_url("default", **common) is None
    assert torch_index_url("https://mirror/whl/cu128", **common) == "https://mirror/whl/cu128"
    with pytest.raises(ValueError, match="auto, default or a URL"):
        torch_index_url("cu128", **common)


def test_installed_torch_matches_pin_and_build() -> None:
    assert installed_matches("2.13.0+cpu", "2.13.0", None)
    assert installed_matches("2.13.0+cu128", "2.13.0", "https://download.pytorch.org/whl/cu128")
    assert not installed_matches("2.13.0+cpu", "2.13.0", "https://download.pytorch.org/whl/cu128")
    assert not installed_matches("2.12.1+cu128", "2.13.0", None)
    assert not installed_matches(None, "2.13.0", None)
