"""infra/placement.py: `zone: auto` resolved at plan time from the catalog's zones."""

from __future__ import annotations

from typing import Any

import pytest

from infra import zones
from infra.catalog import load_catalog
from infra.config import ConfigError, parse_config

CAT = load_catalog()
BASE = {
    "provider": "aws",
    "tier": "a100x8",
    "region": "us-east-1",
    "zone": "auto",
    "sshCidrs": ["203.0.113.0/24"],
}


def auto(**extra: Any) -> Any:
    return parse_config({**BASE, **extra}, "auto-test")


def refused(**extra: Any) -> list[str]:
    with pytest.raises(ConfigError) as err:
        auto(**extra)
    return err.value.problems


def test_zone_auto_takes_the_first_zone_the_source_lists_for_the_type() -> None:
    cfg = auto()
    offered = zones.load_zone_data()["aws"].offerings
    assert offered is not None
    assert cfg.zone == offered["p4d.24xlarge"]["us-east-1"][0]
    assert cfg.placement.choice.basis == zones.OFFERED
    assert cfg.placement.choice.source == "MOTO-OFFER"


def test_the_candidates_go_zone_then_sibling_type_then_region_then_cloud() -> None:
    cfg = parse_config(
        {
            **BASE,
            "tier": "a10x1",
            "allowedClouds": ["aws", "azure"],
            "allowedRegions": ["us-east-1", "us-west-2", "eastus"],
        },
        "auto-test",
    )
    keys = [(c.provider, c.region, c.instance_type) for c in cfg.placement.candidates]
    firsts = list(dict.fromkeys(keys))
    aws_types = list(dict.fromkeys(CAT.tiers["a10x1"].offers["aws"].values()))
    assert len(aws_types) > 1  # the test needs a sibling type
    assert firsts[: len(aws_types)] == [("aws", "us-east-1", t) for t in aws_types]
    assert firsts[len(aws_types)] == ("aws", "us-west-2", aws_types[0])
    assert firsts[-1][0] == "azure" and [k[0] for k in keys].index("azure") > len(aws_types)
    # every zone of one (region, type) comes before the next type
    assert keys == sorted(keys, key=firsts.index)


def test_a_multi_node_stack_gets_one_zone_for_all_its_nodes() -> None:
    cfg = auto(nodes=2, tier="h100x8")
    assert cfg.nodes == 2 and cfg.zone == cfg.placement.choice.zone
    assert all(c.zone for c in cfg.placement.candidates)


def test_the_cost_ceiling_leaves_out_the_dearer_candidates_and_says_so() -> None:
    both = {"allowedClouds": ["aws", "azure"], "allowedRegions": ["us-east-1", "eastus"]}
    cheap_aws = auto(**both).placement.candidates[0].hourly
    cfg = auto(**both, maxHourlyCost=cheap_aws + 1)
    assert {c.provider for c in cfg.placement.candidates} == {"aws"}
    assert any("above maxHourlyCost" in r for r in cfg.placement.rejected)


def test_no_candidate_under_the_ceiling_is_one_line_naming_the_ceiling() -> None:
    (line,) = refused(maxHourlyCost=1)
    assert line.startswith(
        "gpufleet:zone: auto: no candidate for a100x8: aws us-east-1 p4d.24xlarge"
    )
    assert "above maxHourlyCost 1" in line


def test_a_candidate_another_cloud_refuses_is_left_out_with_its_reason() -> None:
    cfg = auto(
        allowedClouds=["aws", "alicloud"],
        allowedRegions=["us-east-1", "cn-shanghai"],
        scratchClass="io2",
    )
    assert {c.provider for c in cfg.placement.candidates} == {"aws"}
    assert any(
        r.startswith("alicloud cn-shanghai") and "scratchClass" in r for r in cfg.placement.rejected
    )


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        ({"zone": None, "allowedRegions": ["us-east-1"]}, "allowedRegions: only with zone: auto"),
        ({"allowedClouds": ["azur"]}, "allowedClouds[0]: 'azur' is not a cloud of the catalog"),
        ({"allowedRegions": ["us-east-9"]}, "allowedRegions[0]: 'us-east-9' is not a region"),
        ({"allowedTypes": ["p4de.24xlarge"]}, "allowedTypes[0]: 'p4de.24xlarge' is no type"),
        ({"allowedRegions": ["us-east-1", "us-east-1"]}, "allowedRegions[1]: 'us-east-1' is"),
        ({"allowedRegions": []}, "allowedRegions: expected a non-empty list"),
        ({"placement": "us-east-1a"}, "placement: 'us-east-1a' is not provider/region"),
    ],
)
def test_a_bad_placement_key_is_one_line_naming_it(extra: dict[str, Any], start: str) -> None:
    (line,) = refused(**extra)
    assert line.startswith(f"gpufleet:{start}") and "\n" not in line


def test_a_did_you_mean_comes_with_a_misspelt_name() -> None:
    assert "did you mean 'azure'" in refused(allowedClouds=["azur"])[0]
    assert "did you mean 'p4d.24xlarge'" in refused(allowedTypes=["p4de.24xlarge"])[0]


def test_the_recorded_placement_is_chosen_and_the_failover_order_starts_there() -> None:
    first = auto(allowedRegions=["us-east-1", "us-west-2"])
    third = first.placement.candidates[2]
    cfg = auto(allowedRegions=["us-east-1", "us-west-2"], placement=third.key)
    assert cfg.placement.choice == third and cfg.zone == third.zone
    assert cfg.placement.order()[0] == third and len(cfg.placement.order()) == len(
        first.placement.candidates
    )
    assert "make up" in cfg.placement.why


def test_a_pinned_zone_has_no_placement() -> None:
    assert auto(zone="us-east-1b").placement is None


OFFERED = [(t, p) for t in CAT.tiers for p in CAT.providers if p in CAT.tiers[t].offers]


@pytest.mark.parametrize(("tier", "provider"), OFFERED)
def test_the_plan_line_fits_80_columns_for_every_tier_and_cloud(tier: str, provider: str) -> None:
    info = CAT.providers[provider]
    raw = {**BASE, "provider": provider, "tier": tier, "region": info.default_region}
    try:
        cfg = parse_config(raw, "auto-test")
    except ConfigError as exc:  # a tier its default region's zones do not list
        assert exc.problems[0].startswith("gpufleet:zone: auto: no candidate"), exc.problems
        return
    line = cfg.placement.line()
    assert len(line) <= 80 and line.startswith(f"placed: {provider} "), line
