"""Pure node planning: scratch, EFA, placement, tags and the first-boot script."""

from __future__ import annotations

import json
import subprocess

import pytest

from infra.catalog import load_catalog
from infra.config import parse_config
from infra.nodes import (
    NODE_INFO_PATH,
    efa_interfaces,
    efa_layout,
    infiniband,
    needs_placement_group,
    plan_nodes,
    plan_scratch,
    public_ipv4_at_launch,
    tier_summary,
)
from infra.reaper import tags as T

CAT = load_catalog()
CIDRS = ["203.0.113.0/24"]


def cfg(stack: str = "test", **kw: object):
    raw = {"provider": "aws", "tier": "a100x8", "sshCidrs": CIDRS, **kw}
    return parse_config(raw, stack)


def test_instance_nvme_becomes_scratch_with_all_devices():
    c = cfg()
    plan = plan_scratch(c, CAT.instance("aws", "p4d.24xlarge"))
    assert (plan.kind, plan.devices, plan.size_gb) == ("nvme", 8, 8000)


def test_types_without_nvme_get_a_provisioned_fast_disk():
    c = cfg(tier="v100x1", scratchGb=800)
    plan = plan_scratch(c, CAT.instance("aws", "p3.2xlarge"))
    assert (plan.kind, plan.volume_class, plan.iops, plan.throughput_mbs) == (
        "disk",
        "gp3",
        16000,
        1000,
    )
    io2 = plan_scratch(
        cfg(tier="v100x1", scratchGb=800, scratchClass="io2"), CAT.instance("aws", "p3.2xlarge")
    )
    assert (io2.volume_class, io2.iops) == ("io2", 64000)


def test_alicloud_scratch_is_an_essd_at_the_configured_level():
    c = parse_config(
        {
            "provider": "alicloud",
            "tier": "a100x4",
            "sshCidrs": CIDRS,
            "scratchClass": "PL2",
            "scratchGb": 600,
        },
        "s",
    )
    plan = plan_scratch(c, CAT.instance("alicloud", c.instance_type))
    assert (plan.kind, plan.volume_class, plan.size_gb) == ("disk", "PL2", 600)


def test_efa_on_clusters_and_on_multi_card_training_types():
    p5 = CAT.instance("aws", "p5.48xlarge")
    assert efa_interfaces(cfg(tier="h100x8"), p5) == 32
    assert efa_interfaces(cfg(tier="h100x8", nodes=2), p5) == 32
    g5 = CAT.instance("aws", "g5.12xlarge")
    assert efa_interfaces(cfg(tier="a10x4"), g5) == 0
    assert efa_interfaces(cfg(tier="a10x4", nodes=2), g5) == 1
    assert efa_interfaces(cfg(tier="a10x1", nodes=2), CAT.instance("aws", "g5.xlarge")) == 0


def test_ec2_gives_a_public_ipv4_only_to_an_instance_launched_with_one_interface():
    import botocore.session

    # The rule as EC2's own API model states it (RunInstances' AssociatePublicIpAddress).
    ec2 = botocore.session.get_session().get_service_model("ec2")
    spec = ec2.shape_for("InstanceNetworkInterfaceSpecification")
    doc = spec.members["AssociatePublicIpAddress"].documentation
    assert "cannot specify more than one network interface" in doc
    assert public_ipv4_at_launch(efa_layout(0))
    for n in (1, 4, 32):
        assert len(efa_layout(n)) > 1 and not public_ipv4_at_launch(efa_layout(n))


def test_efa_layout_puts_an_ena_primary_first_and_one_efa_only_per_card():
    assert efa_layout(0) == []
    assert efa_layout(1) == [(0, 0, "interface"), (0, 1, "efa-only")]
    layout = efa_layout(4)
    assert layout[:2] == [(0, 0, "interface"), (0, 1, "efa-only")]
    assert layout[2:] == [(1, 0, "efa-only"), (2, 0, "efa-only"), (3, 0, "efa-only")]
    assert len({(card, device) for card, device, _ in efa_layout(32)}) == 33


def test_placement_group_for_clusters_on_aws_only():
    p4d = CAT.instance("aws", "p4d.24xlarge")
    assert needs_placement_group(cfg(), p4d)  # EFA interfaces: ready to grow
    g5 = CAT.instance("aws", "g5.xlarge")
    assert not needs_placement_group(cfg(tier="a10x1"), g5)
    assert needs_placement_group(cfg(tier="a10x1", nodes=2), g5)
    ali = parse_config(
        {"provider": "alicloud", "tier": "a100x8", "sshCidrs": CIDRS, "nodes": 2}, "s"
    )
    assert not needs_placement_group(ali, CAT.instance("alicloud", ali.instance_type))


def test_node_zero_is_the_head_and_the_rest_are_workers():
    specs = plan_nodes(cfg(nodes=3, stack="big"))
    assert [(s.name, s.role) for s in specs] == [
        ("big-0", "head"),
        ("big-1", "worker"),
        ("big-2", "worker"),
    ]
    assert all(s.tags[T.ROLE] == s.role for s in specs)


def test_user_tags_never_override_the_managed_tags():
    (spec,) = plan_nodes(cfg(tags={"team": "nlp", "Name": "mine"}))
    assert spec.tags["team"] == "nlp"
    assert spec.tags[T.MANAGED_BY] == "gpufleet" and spec.tags["Name"] == "test-0"


def test_ttl_zero_is_tagged_as_an_explicit_off():
    (spec,) = plan_nodes(cfg(ttlHours=0))
    assert spec.tags[T.TTL_HOURS] == "off"


def test_user_data_is_valid_bash_that_records_the_node(tmp_path):
    (spec,) = plan_nodes(cfg())
    script = tmp_path / "user-data.sh"
    script.write_text(spec.user_data)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    body = spec.user_data.split("<<'GPUFLEET_EOF'\n")[1].split("\nGPUFLEET_EOF")[0]
    info = json.loads(body)
    assert info["gpu_model"] == "A100-40GB" and info["gpu_count"] == 8 and info["role"] == "head"
    assert NODE_INFO_PATH in spec.user_data


def test_user_data_refuses_names_that_are_not_hostnames():
    with pytest.raises(ValueError, match="hostname"):
        plan_nodes(cfg(stack="Bad_Name"))


def test_tier_summary_says_infiniband_for_every_nd_stack_and_keeps_efa_for_aws():
    h100 = cfg(provider="azure", tier="h100x8", region="eastus", maxHourlyCost=1000)
    a100 = cfg(provider="azure", tier="a100x8", region="eastus", nodes=2, maxHourlyCost=1000)
    p4d = cfg(nodes=2)
    t4 = cfg(provider="azure", tier="t4x1", region="eastus")
    assert {k: tier_summary(h100)[k] for k in ("efa", "infiniband", "infiniband_gbps")} == {
        "efa": False,
        "infiniband": True,
        "infiniband_gbps": 3200,
    }
    assert (tier_summary(a100)["infiniband"], tier_summary(a100)["infiniband_gbps"]) == (True, 1600)
    assert (tier_summary(p4d)["efa"], tier_summary(p4d)["infiniband"]) == (True, False)
    assert (tier_summary(t4)["infiniband"], tier_summary(t4)["infiniband_gbps"]) == (False, 0)


def test_infiniband_follows_the_catalog_type_not_the_node_count():
    one = cfg(provider="azure", tier="h100x8", region="eastus", maxHourlyCost=1000)
    nd = CAT.instance("azure", "Standard_ND96isr_H100_v5")
    nc = CAT.instance("azure", "Standard_NC24ads_A100_v4")
    assert infiniband(one, nd) is True
    assert infiniband(one, nc) is False
    # A cloud whose catalog says it cannot do InfiniBand never gets it, whatever the type says.
    assert infiniband(cfg(nodes=2), nd) is False
