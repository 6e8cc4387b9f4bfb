"""Regions and zones: a name the cloud does not have is refused with the ones it has, and
letter case never matters for tier and currency names."""

from __future__ import annotations

import boto3
import pytest

from infra.catalog import load_catalog, provider_names
from infra.config import ConfigError, parse_config
from infra.pricing.compare import compare_tier

AWS = {"provider": "aws", "tier": "t4x1", "sshCidrs": ["203.0.113.0/24"]}
ALI = {**AWS, "provider": "alicloud"}


def problems(raw: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "test")
    return err.value.problems


def test_an_unknown_aws_region_is_refused_with_a_suggestion_and_the_known_regions():
    (msg,) = problems({**AWS, "region": "us-east-7"})
    assert msg.startswith("gpufleet:region: AWS has no region 'us-east-7' (did you mean")
    assert "; its regions are af-south-1," in msg and msg.endswith("us-west-2")


def test_an_unknown_alicloud_region_lists_alicloud_regions_not_aws_ones():
    (msg,) = problems({**ALI, "region": "cn-xian"})
    assert "Alicloud has no region 'cn-xian'" in msg and "cn-shanghai" in msg
    assert "us-east-2" not in msg


def test_a_zone_of_another_region_is_refused_with_an_example_of_the_right_shape():
    (msg,) = problems({**AWS, "region": "us-east-1", "zone": "us-west-2a"})
    assert msg == (
        "gpufleet:zone: 'us-west-2a' is not a zone of region 'us-east-1': AWS zones are "
        "the region's name and a suffix, e.g. us-east-1a"
    )


def test_a_region_name_used_as_a_zone_is_refused():
    (msg,) = problems({**ALI, "region": "cn-shanghai", "zone": "cn-shanghai"})
    assert "e.g. cn-shanghai-b" in msg


def test_zones_of_the_region_are_accepted_on_both_clouds():
    assert parse_config({**AWS, "zone": "us-east-1b"}, "t").zone == "us-east-1b"
    cfg = parse_config({**ALI, "zone": "cn-shanghai-l"}, "t")
    assert (cfg.region, cfg.zone) == ("cn-shanghai", "cn-shanghai-l")


def test_an_unknown_region_does_not_also_blame_the_zone():
    found = problems({**AWS, "region": "mars-1", "zone": "mars-1a"})
    assert [p.split(":")[1] for p in found] == ["region"]


def test_the_aws_regions_are_the_ones_botocore_lists_for_ec2():
    listed = set(boto3.session.Session().get_available_regions("ec2"))
    assert set(load_catalog().providers["aws"].regions) == listed


def test_every_cloud_with_a_region_list_cites_it_and_contains_its_own_defaults():
    cat = load_catalog()
    for name in provider_names():
        info = cat.providers[name]
        if info.regions:
            assert {info.default_region, info.price_region} <= set(info.regions)


def test_tier_names_in_a_stack_are_case_blind():
    assert parse_config({**AWS, "tier": "T4x1"}, "t").tier == "t4x1"


def test_compare_takes_tier_and_currency_in_any_case():
    upper = compare_tier("A100x8", currency="cny")
    lower = compare_tier("a100x8", currency="CNY")
    assert (upper.tier, upper.currency) == ("a100x8", "CNY")
    assert [o.to_json() for o in upper.offers] == [o.to_json() for o in lower.offers]
