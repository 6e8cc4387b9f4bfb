"""The catalog is consistent data, and agrees with AWS's own instance-type data."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest

from infra.catalog import UnavailableError, gpu_by_nvml_name, load_catalog, provider_names
from tests.support.real import missing_real_part

CAT = load_catalog()
# moto's DescribeInstanceTypes data names GPUs by family; the catalog keys carry the memory.
MOTO_GPU_NAME = {
    "T4": "T4",
    "A10G": "A10G",
    "L4": "L4",
    "L40S": "L40S",
    "V100-16GB": "V100",
    "A100-40GB": "A100",
    "A100-80GB": "A100",
    "H100-80GB": "H100",
}


def moto_instance_types() -> dict:
    try:
        import moto
    except ImportError:
        missing_real_part("moto is not installed (pip: requirements-dev.txt)")
    path = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path) as fh:
        return json.load(fh)


def test_every_tier_resolves_on_every_provider_that_lists_it():
    for tier in CAT.tiers.values():
        assert tier.offers, f"{tier.key} is offered nowhere"
        for provider, profiles in tier.offers.items():
            for profile in profiles:
                it = CAT.resolve(tier.key, provider, profile)
                assert it.gpus == tier.gpus and it.gpu in tier.gpus_allowed


def test_the_issue_tiers_all_exist():
    wanted = {"t4x1", "a10x1", "v100x1", "a100x1", "a100x4", "a100x8", "a100-80gx8", "h100x1"}
    assert wanted | {"h100x8"} <= set(CAT.tiers)


def test_aws_has_no_four_a100_type_and_says_where_to_go_instead():
    with pytest.raises(UnavailableError) as exc:
        CAT.resolve("a100x4", "aws")
    alts = {a.instance_type for a in exc.value.alternatives}
    assert "p4d.24xlarge" in alts and "ecs.gn7-c13g1.13xlarge" in alts
    assert "alicloud" in str(exc.value) and "p4d.24xlarge" in str(exc.value)


def test_a_missing_profile_suggests_the_profiles_that_exist():
    with pytest.raises(UnavailableError) as exc:
        CAT.resolve("t4x1", "aws", "memory")
    assert exc.value.alternatives[0].instance_type == "g4dn.xlarge"


def test_every_price_is_dated_sourced_and_in_the_providers_currency():
    for (provider, name), it in CAT.instances.items():
        if it.price is None:
            assert it.note, f"{name}: unpriced types must say why"
            continue
        p = it.price
        assert p.on_demand > 0
        assert p.currency == CAT.providers[provider].currency
        assert p.source in CAT.sources and p.date <= dt.date(2026, 12, 31)
        if p.spot:
            assert 0 < p.spot[0] <= p.spot[1] < p.on_demand, f"{name}: spot above on-demand"
            assert p.spot_source in CAT.sources and p.spot_date is not None


def test_alicloud_a100_prices_fall_in_the_seed_bands():
    one = CAT.instance("alicloud", "ecs.gn7-c12g1.3xlarge").price
    four = CAT.instance("alicloud", "ecs.gn7-c13g1.13xlarge").price
    assert one and 25 <= one.on_demand <= 35
    assert four and 120 <= four.on_demand <= 180


def test_gpu_models_without_bf16_train_in_fp16():
    assert CAT.gpus["T4"].training_dtype == "float16"
    assert CAT.gpus["V100-16GB"].training_dtype == "float16"
    assert CAT.gpus["H100-80GB"].training_dtype == "bfloat16"
    assert CAT.gpus["H200"].expected_gemm_tflops == pytest.approx(788, rel=0.01)


def test_nvidia_smi_names_map_to_catalog_models():
    assert gpu_by_nvml_name(CAT, "NVIDIA A100-SXM4-40GB").key == "A100-40GB"
    assert gpu_by_nvml_name(CAT, "Tesla T4").key == "T4"
    assert gpu_by_nvml_name(CAT, "NVIDIA GeForce RTX 4090") is None


@pytest.mark.parametrize("name", sorted(n for (p, n) in CAT.instances if p == "aws"), ids=str)
def test_aws_instance_types_agree_with_describe_instance_types(name):
    data = moto_instance_types()
    it = CAT.instance("aws", name)
    if name not in data:
        # P3 (V100) is absent from the current API data: possibly retired; the catalog says so.
        assert name.startswith("p3.") and "Volta" in it.note
        pytest.skip(f"{name} not in the DescribeInstanceTypes copy (V100 may be retired)")
    row = data[name]
    gpu = row["GpuInfo"]["Gpus"][0]
    assert gpu["Name"] == MOTO_GPU_NAME[it.gpu]
    assert gpu["Count"] == it.gpus
    mem_gb = gpu["MemoryInfo"]["SizeInMiB"] / 1024
    assert mem_gb == pytest.approx(CAT.gpus[it.gpu].memory_gb, rel=0.10)
    assert row["VCpuInfo"]["DefaultVCpus"] == it.vcpus
    assert row["MemoryInfo"]["SizeInMiB"] / 1024 == pytest.approx(it.memory_gib, rel=0.02)
    net = row["NetworkInfo"]
    assert bool(net.get("EfaSupported")) == it.efa
    if it.efa:
        assert net["EfaInfo"]["MaximumEfaInterfaces"] == it.efa_interfaces
    disks = row.get("InstanceStorageInfo", {}).get("Disks", [])
    assert sum(d["Count"] for d in disks) == it.nvme_count
    if disks:
        assert disks[0]["SizeInGB"] == it.nvme_gb


def test_every_provider_has_a_default_region_and_ssh_user():
    for name in provider_names():
        info = CAT.providers[name]
        assert info.default_region and info.ssh_user and "on-demand" in info.billing


# --- the corrections of 2026-12 (catalog-corrections.md) --------------------------------------


def test_a100_80gb_sxm_bandwidth_is_the_datasheets_2039_and_the_pcie_card_has_its_own_1935():
    assert CAT.gpus["A100-80GB"].bandwidth_gbs == 2039
    assert CAT.gpus["A100-PCIE-80GB"].bandwidth_gbs == 1935


@pytest.mark.parametrize(
    ("nvml_name", "key", "form"),
    [
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB", "pcie"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", "pcie"),
        ("Tesla V100-PCIE-16GB", "V100-PCIE-16GB", "pcie"),
        ("Tesla V100-SXM2-32GB", "V100-32GB", "sxm"),
        ("NVIDIA H200 NVL", "H200-NVL", "pcie"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB", "sxm"),
        ("NVIDIA H200", "H200", "sxm"),
    ],
)
def test_pcie_and_nvl_cards_map_to_their_own_entries_not_the_sxm_ones(nvml_name, key, form):
    gpu = gpu_by_nvml_name(CAT, nvml_name)
    assert gpu is not None and gpu.key == key and gpu.form == form


def test_no_nvml_name_maps_to_two_gpu_models():
    names = [n.lower() for g in CAT.gpus.values() for n in g.nvml_names]
    assert len(names) == len(set(names))


def test_variant_peaks_are_their_own_and_unconfirmed_figures_say_unverified():
    assert CAT.gpus["V100-PCIE-16GB"].fp16_tflops < CAT.gpus["V100-16GB"].fp16_tflops
    assert CAT.gpus["V100-32GB"].memory_gb == 32
    nvl = CAT.gpus["H200-NVL"]
    assert nvl.bf16_tflops < CAT.gpus["H200"].bf16_tflops
    assert "bf16_tflops" in nvl.unverified
    assert {"bf16_tflops", "fp32_tflops"} <= set(CAT.gpus["A10G"].unverified)
    assert CAT.gpus["A100-80GB"].unverified == ()


@pytest.mark.parametrize(
    ("name", "spot", "source"),
    [
        ("p3.8xlarge", (1.41, 1.51), "SC8"),
        ("p4de.24xlarge", (8.65, 9.97), "SC8"),
        ("g5.12xlarge", (1.99, 2.73), "SC7"),
    ],
)
def test_aws_spot_ranges_are_the_observed_ones(name, spot, source):
    price = CAT.instance("aws", name).price
    assert price is not None and price.spot == spot and price.spot_source == source
