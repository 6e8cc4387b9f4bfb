"""The AWS program under Pulumi's mocks, for instance types and node counts the shipped stacks
do not all reach: every EFA type in the catalog, one node and two."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest

from infra import limits
from infra.catalog import load_catalog
from infra.config import StackConfig, parse_config
from infra.nodes import efa_interfaces, efa_layout, public_ipv4_at_launch
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate

CAT = load_catalog()
EFA_TYPES = sorted(name for (cloud, name), it in CAT.instances.items() if cloud == "aws" and it.efa)
INSTANCE = "aws:ec2/instance:Instance"
EIP = "aws:ec2/eip:Eip"


def aws_cfg(instance_type: str, nodes: int) -> StackConfig:
    """An AWS stack of `nodes` x `instance_type` (a type no tier offers is set directly)."""
    raw = {
        "provider": "aws",
        "tier": "a10x4",
        "nodes": nodes,
        "sshCidrs": ["203.0.113.0/24"],
        "sshPublicKey": PLACEHOLDER_SSH_KEY,
    }
    stack = f"efa-{instance_type.replace('.', '-')}-x{nodes}"
    return dataclasses.replace(parse_config(raw, stack), instance_type=instance_type)


@functools.cache
def planned(instance_type: str, nodes: int) -> tuple[StackConfig, PlanResult]:
    cfg = aws_cfg(instance_type, nodes)
    return cfg, evaluate(cfg)


def test_the_catalog_has_efa_types_with_one_interface_and_with_several():
    counts = {CAT.instance("aws", t).efa_interfaces for t in EFA_TYPES}
    assert 1 in counts and any(n > 1 for n in counts)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("instance_type", EFA_TYPES)
def test_every_node_is_reachable_at_the_address_the_plan_shows(instance_type, nodes):
    cfg, result = planned(instance_type, nodes)
    layout = efa_layout(efa_interfaces(cfg, CAT.instance("aws", instance_type)))
    eips = {e.name: e for e in result.of_type(EIP)}
    by_name = {i.name: i for i in result.of_type(INSTANCE)}
    assert len(result.outputs["nodes"]) == nodes
    for node in result.outputs["nodes"]:
        instance = by_name[node["name"]]
        if public_ipv4_at_launch(layout):
            assert f"{node['name']}-eip" not in eips
            assert node["public_ip"] == instance.outputs["publicIp"] != ""
        else:
            eip = eips[f"{node['name']}-eip"]
            assert eip.inputs["networkInterface"] == instance.outputs["primaryNetworkInterfaceId"]
            assert node["public_ip"] == eip.outputs["publicIp"] != ""


def test_the_mocks_give_no_public_address_to_an_instance_with_several_interfaces():
    # What makes the test above able to fail: the mock engine follows EC2's rule.
    _, result = planned("g5.12xlarge", 2)
    assert all(i.outputs["publicIp"] == "" for i in result.of_type(INSTANCE))
    _, single = planned("g5.12xlarge", 1)
    assert all(i.outputs["publicIp"] for i in single.of_type(INSTANCE))


def depends_on(result: PlanResult, resource: object, urn: str) -> bool:
    """Whether `resource` waits for the resource at `urn`, directly or through others."""
    by_urn = {r.urn: r for r in result.resources}
    todo, seen = list(resource.dependencies), set()  # type: ignore[attr-defined]
    while todo:
        current = todo.pop()
        if current == urn:
            return True
        if current not in seen and current in by_urn:
            seen.add(current)
            todo.extend(by_urn[current].dependencies)
    return False


@pytest.mark.parametrize("instance_type", ["g5.12xlarge", "p5.48xlarge"])
def test_every_elastic_ip_is_associated_after_the_internet_gateway_exists(instance_type):
    # The provider's Eip docs: "EIP may require IGW to exist prior to association."
    _, result = planned(instance_type, 2)
    (igw,) = result.of_type("aws:ec2/internetGateway:InternetGateway")
    eips = result.of_type(EIP)
    assert eips and all(depends_on(result, eip, igw.urn) for eip in eips)


@pytest.mark.parametrize("key", ["team/ml", "cost center", "_index", ".."])
def test_a_tag_key_ec2_refuses_with_tags_in_metadata_is_refused_in_one_line(key):
    # The nodes' tags are in IMDS (the watchdog reads them): EC2 then refuses such keys.
    from infra.config import ConfigError

    raw = {"provider": "aws", "tier": "t4x1", "sshCidrs": ["203.0.113.0/24"], "tags": {key: "x"}}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "s")
    (line,) = [ln for ln in str(err.value).splitlines() if "gpufleet:tags" in ln]
    assert "rename it" in line


def test_every_tag_key_the_stack_puts_on_a_node_is_one_ec2_takes_in_metadata():
    info = CAT.providers["aws"]
    _, result = planned("p5.48xlarge", 2)
    for instance in result.of_type(INSTANCE):
        assert instance.inputs["metadataOptions"]["instanceMetadataTags"] == "enabled"
        for key in instance.inputs["tags"]:
            assert re.fullmatch(f"[{info.tag_key_chars}]+", key), key
            assert key not in info.refused_tag_keys


# Types Pulumi names "<logical name>-" plus 7 random characters, and the botocore shape
# that says how long AWS lets that name be.
NAME_SHAPES = {
    "aws:iam/role:Role": ("iam", "roleNameType"),
    "aws:iam/instanceProfile:InstanceProfile": ("iam", "instanceProfileNameType"),
    "aws:iam/policy:Policy": ("iam", "policyNameType"),
    "aws:iam/rolePolicy:RolePolicy": ("iam", "policyNameType"),
    "aws:cloudwatch/eventRule:EventRule": ("events", "RuleName"),
}


def test_the_longest_stack_name_aws_takes_fits_every_name_pulumi_generates():
    import botocore.session

    session = botocore.session.get_session()
    longest = limits.longest_stack_name("aws", 2)
    result = evaluate(dataclasses.replace(aws_cfg("p5.48xlarge", 2), stack="s" * longest))
    slack = []
    for r in result.resources:
        if r.type in NAME_SHAPES:
            service, shape = NAME_SHAPES[r.type]
            cap = session.get_service_model(service).shape_for(shape).metadata["max"]
            slack.append(cap - (len(r.name) + 1 + 7))
    assert len(slack) > len(NAME_SHAPES) and min(slack) == 0  # one more character fails


def test_a_longer_stack_name_is_refused_in_one_line_before_anything_is_made():
    from infra.config import ConfigError

    longest = limits.longest_stack_name("aws", 1)
    raw = {"provider": "aws", "tier": "t4x1", "sshCidrs": ["203.0.113.0/24"]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "s" * (longest + 1))
    (line,) = [ln for ln in str(err.value).splitlines() if "gpufleet:stack" in ln]
    assert f"at most {longest}" in line and "rename the stack" in line


@pytest.mark.parametrize("instance_type", EFA_TYPES)
def test_the_plan_says_how_many_elastic_ips_a_stack_needs_against_the_default_quota(
    instance_type,
):
    from infra.clouds.aws.program import EIP_QUOTA, PROVIDER

    for nodes in (1, 2):
        cfg, result = planned(instance_type, nodes)
        notes = PROVIDER.stack_notes(cfg)
        eips = len(result.of_type(EIP))
        if eips:
            (note,) = notes
            assert f"allocates {eips} Elastic IP" in note and f"has {EIP_QUOTA} per region" in note
        else:
            assert notes == []
    assert PROVIDER.stack_notes(aws_cfg("g4dn.xlarge", 1)) == []  # one interface: no EIP
