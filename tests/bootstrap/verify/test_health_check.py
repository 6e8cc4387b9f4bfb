"""The health check's laptop side: the node commands it sends (pure), how it judges a
snapshot against the tier, how old a verdict is, and the URN that replaces a failed node."""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex

import pytest

from bootstrap.fleet.api import TierInfo
from bootstrap.verify.health import check as hr
from bootstrap.verify.health import verdict as nh
from bootstrap.verify.replace import instance_urns, replace_command
from gpufleet_node import verify_health as vh

TAKEN = "2026-12-02T01:00:00Z"


def saved_verdict(cmd: str) -> dict[str, object]:
    blob = shlex.split(cmd.split("|")[0])[2]
    data: dict[str, object] = json.loads(base64.b64decode(blob))
    return data


def test_the_snapshot_runs_the_shipped_file_with_the_dcgm_level_and_the_extra_path() -> None:
    fast = hr.snapshot_command("/tmp/gpufleet-verify.x", hr.HealthOptions())
    assert fast == ("env PYTHONPATH=/tmp/gpufleet-verify.x python3 -m gpufleet_node.verify_health")
    deep = hr.snapshot_command("/tmp/d", hr.HealthOptions(dcgm_level=2, node_path="/opt/fake"))
    assert deep == (
        'PATH=/opt/fake:"$PATH" env PYTHONPATH=/tmp/d python3 -m gpufleet_node.verify_health '
        "--dcgm-level=2"
    )


def test_the_verdict_is_stored_as_root_with_the_stacks_bucket() -> None:
    hexp = hr.HealthExpect(bucket="b", provider="aws", region="us-east-1")
    verdict = {"status": "healthy", "host": "n"}
    cmd = hr.save_command("/tmp/d", verdict, hr.HealthOptions(), hexp, "sudo -n ")
    assert saved_verdict(cmd) == verdict
    # -B: no root-owned __pycache__ in the SSH user's folder, which it must remove after
    assert (
        "&& sudo -n env PYTHONPATH=/tmp/d python3 -B -m gpufleet_node.verify_health "
        "--save=/tmp/d/verdict.json" in cmd
    )
    assert "--bucket=b --provider=aws --region=us-east-1" in cmd
    assert "--quarantine" not in cmd


@pytest.mark.parametrize(("status", "quarantined"), [("failed", True), ("degraded", False)])
def test_quarantine_sets_aside_a_failed_node_only(status: str, quarantined: bool) -> None:
    opts = hr.HealthOptions(quarantine=True)
    cmd = hr.save_command("/tmp/d", {"status": status}, opts, hr.HealthExpect(), "")
    assert ("--quarantine" in cmd) is quarantined


def test_the_tier_gives_the_gpu_count_and_the_infiniband_share_per_port() -> None:
    doc = vh.snapshot(taken_at=TAKEN, ibstat=open_fixture("ibstat_ndr.txt"))
    # 3 InfiniBand ports and a size of 1,200 Gb/s: 400 each; the 200 Gb/s port degrades.
    v = hr.judge_snapshot(doc, "n", hr.HealthExpect(infiniband_gbps=1200.0))
    assert ("infiniband", nh.DEGRADED) in [(r.check, r.level) for r in v.reasons]
    assert any("200 of 400 Gb/s" in r.text for r in v.reasons)


def test_without_a_verify_expectation_the_stack_tier_and_outputs_are_used() -> None:
    tier = TierInfo(gpu_count=8, nvswitch=True)
    hexp = hr.expect_from(None, tier, {"bucket": "b", "provider": "aws", "region": "r"})
    assert (hexp.gpu_count, hexp.nvswitch, hexp.bucket) == (8, True, "b")


def test_verify_findings_join_the_health_verdict_as_one_record() -> None:
    health = nh.HealthVerdict("n", TAKEN, (nh.Reason("ecc", nh.DEGRADED, "x"),), ("ecc",))
    other = nh.HealthVerdict(
        "n", TAKEN, (nh.Reason("gemm", nh.FAILED, "40%"),), ("gemm",), "verify-gpu"
    )
    both = hr.merged(health, other)
    assert both.status == nh.FAILED and both.origin == "verify-gpu"
    assert [r.check for r in both.reasons] == ["ecc", "gemm"]


def test_a_verdict_age_is_read_from_its_time_and_shown_short() -> None:
    now = dt.datetime(2026, 12, 2, 7, 30, tzinfo=dt.UTC)
    assert hr.age_hours(TAKEN, now) == pytest.approx(6.5)
    assert hr.age_hours("yesterday", now) is None
    assert [hr.format_age(h) for h in (0.25, 6.5, 72.0, None)] == ["15m", "6h", "3d", "?"]


def open_fixture(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / "fixtures" / "health" / name).read_text()


# --- pulumi up --replace ----------------------------------------------------------------------

# One stack per cloud: the instance is the GpuNode's child that bears the node's name.
STACK_URNS = {
    "t4x1": "urn:pulumi:t4x1::gpufleet::gpufleet:node:GpuNode$aws:ec2/instance:Instance::t4x1-0",
    "a100x1": "urn:pulumi:a100x1::gpufleet::gpufleet:node:GpuNode"
    "$alicloud:ecs/instance:Instance::a100x1-0",
    "azure-t4x1": "urn:pulumi:azure-t4x1::gpufleet::gpufleet:node:GpuNode"
    "$azure-native:compute:VirtualMachine::azure-t4x1-0",
    "tencent-t4x1": "urn:pulumi:tencent-t4x1::gpufleet::gpufleet:node:GpuNode"
    "$tencentcloud:Instance/instance:Instance::tencent-t4x1-0",
}


@pytest.mark.parametrize("stack", sorted(STACK_URNS))
def test_a_failed_node_is_replaced_by_its_instance_urn_as_the_plan_builds_it(stack: str) -> None:
    assert instance_urns(stack, [f"{stack}-0"]) == {f"{stack}-0": STACK_URNS[stack]}
    cmd = replace_command(stack, STACK_URNS[stack])
    assert shlex.split(cmd) == ["pulumi", "up", "--stack", stack, "--replace", STACK_URNS[stack]]


def test_only_the_failed_nodes_of_a_cluster_are_named() -> None:
    urns = instance_urns("h100x8x2", ["h100x8x2-1"])
    assert list(urns) == ["h100x8x2-1"] and urns["h100x8x2-1"].endswith("::h100x8x2-1")


def test_a_stack_that_is_not_there_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="cannot build the node URNs of stack 'nope'"):
        instance_urns("nope", ["nope-0"])
