"""Bad stack config is refused with one clear line per problem, before anything is declared."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, StackConfig, load_stack_file, parse_config

GOOD = {"provider": "alicloud", "tier": "a100x4", "sshCidrs": ["203.0.113.0/24"]}


def problems(**changes: object) -> list[str]:
    raw = {**GOOD, **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "test")
    return exc.value.problems


def one(**changes: object) -> str:
    found = problems(**changes)
    assert len(found) == 1, found
    return found[0]


def test_a_good_config_parses_with_defaults_written_once():
    cfg = parse_config(GOOD, "a100x4")
    assert isinstance(cfg, StackConfig)
    assert cfg.instance_type == "ecs.gn7-c13g1.13xlarge"
    assert (cfg.nodes, cfg.billing, cfg.profile, cfg.region) == (
        1,
        "on-demand",
        "general",
        "cn-shanghai",
    )
    assert cfg.idle_minutes == 15 and cfg.ttl_hours == 24 and cfg.destroy_data is False


def test_config_is_frozen():
    cfg = parse_config(GOOD, "a100x4")
    with pytest.raises(AttributeError):
        cfg.nodes = 3  # type: ignore[misc]


def test_unknown_tier_suggests_the_closest():
    msg = one(tier="a100x44")
    assert msg.startswith("gpufleet:tier:") and "did you mean 'a100x4'" in msg


def test_unknown_provider_suggests_the_closest():
    msg = one(provider="alicoud")
    assert "gpufleet:provider" in msg and "did you mean 'alicloud'" in msg


def test_unknown_key_suggests_the_closest():
    msg = one(nodse=2)
    assert "gpufleet:nodse" in msg and "did you mean 'nodes'" in msg


def test_tier_not_offered_names_alternatives():
    msg = one(provider="aws")
    assert "aws does not offer tier 'a100x4'" in msg
    assert "p4d.24xlarge" in msg and "alicloud" in msg


def test_nodes_below_one_is_refused():
    assert "gpufleet:nodes: must be >= 1" in one(nodes=0)


def test_missing_ssh_cidrs_is_refused():
    assert "gpufleet:sshCidrs: required" in one(sshCidrs=None)


def test_world_open_ssh_needs_an_explicit_allow():
    msg = one(sshCidrs=["0.0.0.0/0"])
    assert "whole internet" in msg and "allowWorldSsh" in msg
    cfg = parse_config({**GOOD, "sshCidrs": ["0.0.0.0/0"], "allowWorldSsh": True}, "t")
    assert cfg.ssh_cidrs == ("0.0.0.0/0",)


def test_malformed_cidr_is_refused():
    assert "gpufleet:sshCidrs[1]: '10.0.0.300/8' is not a valid CIDR" in one(
        sshCidrs=["10.0.0.0/8", "10.0.0.300/8"]
    )


def test_cidr_with_host_bits_is_refused():
    assert "sshCidrs[0]" in one(sshCidrs=["10.0.0.1/8"])


def test_spot_and_subscription_together_are_refused():
    assert "exclude each other" in one(billing="spot", subscriptionMonths=3)


def test_subscription_on_aws_is_refused_and_points_at_alicloud():
    msg = one(provider="aws", tier="a100x8", billing="subscription")
    assert "aws has no subscription billing" in msg and "alicloud" in msg


def test_non_numeric_max_price_is_refused():
    assert "gpufleet:spotMaxPrice: 'cheap' is not a number" in one(
        billing="spot", spotMaxPrice="cheap"
    )


def test_spot_max_price_above_on_demand_is_refused():
    assert "above the on-demand price" in one(billing="spot", spotMaxPrice=500)


def test_root_disk_too_small_is_refused():
    assert "rootDiskGb: 50 GB is too small" in one(rootDiskGb=50)


def test_essd_level_below_its_minimum_size_is_refused():
    assert "PL3 starts at 1261 GiB" in one(scratchClass="PL3", scratchGb=500)


def test_scratch_class_must_belong_to_the_provider():
    assert "did you mean" in one(scratchClass="PL11") or "not one of" in one(scratchClass="PL11")
    assert "'io2' is not one of" in one(scratchClass="io2")


def test_all_problems_are_reported_together():
    found = problems(tier="a100x44", nodes=0, sshCidrs=["nope"], rootDiskGb="big", colour="red")
    keys = [p.split(":")[1] for p in found]
    assert keys == ["colour", "tier", "nodes", "sshCidrs[0]", "rootDiskGb"]


def test_values_from_the_engine_arrive_as_text_and_parse_the_same():
    raw = {**GOOD, "sshCidrs": '["203.0.113.0/24"]', "nodes": "2", "destroyData": "false"}
    cfg = parse_config(raw, "t")
    assert cfg.nodes == 2 and cfg.ssh_cidrs == ("203.0.113.0/24",) and not cfg.destroy_data


def test_reserved_tag_keys_are_refused():
    assert "tags.managed-by" in one(tags={"managed-by": "me"})
    assert "tags.gpufleet:stack" in one(tags={"gpufleet:stack": "x"})


def test_ttl_zero_is_an_explicit_opt_out():
    assert parse_config({**GOOD, "ttlHours": 0}, "t").ttl_hours == 0


def test_stack_files_must_be_named_like_pulumi_stacks(tmp_path):
    bad = tmp_path / "mystack.yaml"
    bad.write_text("config: {}\n")
    with pytest.raises(ConfigError, match=r"Pulumi\.<stack>\.yaml"):
        load_stack_file(bad)


def test_a_stack_file_that_is_not_yaml_is_refused(tmp_path):
    bad = tmp_path / "Pulumi.x.yaml"
    bad.write_text("config: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_stack_file(bad)
