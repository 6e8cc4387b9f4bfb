"""The plan refuses a pinned zone that is not one of its region's zones in the shipped
snapshot (each cloud's zones.toml), naming the zones it knows."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infra.zones import load_zone_data, region_zones
from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "scripts" / "plan.py"


def plan(tmp_path: Path, provider: str, tier: str, region: str, zone: str):
    stack = tmp_path / "Pulumi.zone.yaml"
    stack.write_text(
        "config:\n"
        f"  gpufleet:provider: {provider}\n"
        f"  gpufleet:tier: {tier}\n"
        f"  gpufleet:region: {region}\n"
        f"  gpufleet:zone: '{zone}'\n"
        "  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, str(PLAN), "--stack-file", str(stack), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )


def test_a_zone_the_region_does_not_have_is_refused_with_the_zones_it_has(tmp_path):
    proc = plan(tmp_path, "aws", "t4x1", "us-east-1", "us-east-1zz")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert line.startswith("gpufleet:zone: 'us-east-1zz' is not a zone of us-east-1")
    assert "(MOTO-AZ)" in line
    assert line.endswith(
        "its zones: us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1e, us-east-1f"
    )


def test_a_zone_the_region_has_plans_even_where_no_gpu_type_is_offered_in_it(tmp_path):
    # us-east-1e offers no catalog type in moto's offerings, but it is a zone of us-east-1
    proc = plan(tmp_path, "aws", "t4x1", "us-east-1", "us-east-1e")
    assert proc.returncode == 0, proc.stderr


def test_a_zone_in_a_region_with_no_zones_is_refused(tmp_path):
    proc = plan(tmp_path, "azure", "t4x1", "westus", "1")
    assert proc.returncode == 2
    (line,) = problems(proc.stderr)
    assert line == (
        "gpufleet:zone: westus has no availability zones (AZ-AZREGIONS): leave gpufleet:zone out"
    )


def test_an_alicloud_zone_outside_the_snapshot_is_refused(tmp_path):
    proc = plan(tmp_path, "alicloud", "t4x1", "cn-shanghai", "cn-shanghai-q")
    assert proc.returncode == 2
    (line,) = problems(proc.stderr)
    assert "'cn-shanghai-q' is not a zone of cn-shanghai" in line and "cn-shanghai-n" in line


def test_a_sold_out_zone_is_a_real_zone_a_stack_may_pin_but_never_a_place_to_try():
    zones, source = region_zones("tencent", "ap-guangzhou") or ((), "")
    assert "ap-guangzhou-4" in zones and source == "TCAZ"
    data = load_zone_data()["tencent"]
    assert "ap-guangzhou-4" not in data.regions["ap-guangzhou"]


def test_a_region_the_snapshot_does_not_list_is_not_judged():
    assert region_zones("tencent", "ap-singapore") is None


@pytest.mark.parametrize("provider", ["aws", "azure", "alicloud", "tencent"])
def test_every_offered_zone_is_one_of_its_regions_zones(provider):
    with (ROOT / "infra" / "clouds" / provider / "zones.toml").open("rb") as fh:
        raw = tomllib.load(fh)
    for name, by_region in raw.get("offerings", {}).items():
        if name == "source":
            continue
        for region, zones in by_region.items():
            assert set(zones) <= set(raw["regions"][region]), (name, region)


def test_the_aws_regions_zones_are_moto_s():
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    data = load_zone_data()["aws"]
    for region, zones in data.regions.items():
        assert zones == tuple(z.name for z in RegionsAndZonesBackend.zones[region])
