"""Cloud limits `pulumi up` would hit (infra/limits.py, infra/clouds/<cloud>/limits.toml):
each one accepted at the limit and refused one past it, in one line, before anything is made;
and the counts the data claims for each cloud's program checked against a plan under mocks."""

from __future__ import annotations

import functools
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from infra import clouds, limits
from infra.catalog import provider_names
from infra.config import (
    ConfigError,
    load_stack_file,
    max_tag_value,
    parse_config,
    refused_tag_prefixes,
)
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from infra.reaper import tags as T

ROOT = Path(__file__).resolve().parents[2]
CLOUDS = clouds.names("program.py")
# The most SSH networks each cloud's stack takes (IPv4; AWS counts IPv6 apart, 59 again), the
# longest stack name (one or two nodes) and the most tags of the user's own. Written out
# here so that a change to a limits.toml or to a program shows up as a failing test.
MOST_CIDRS = {"aws": 59, "azure": 200, "alicloud": 199, "tencent": 98}
LONGEST_STACK = {"aws": 44, "azure": 39, "alicloud": 48, "tencent": 44}
MOST_USER_TAGS = {"aws": 40, "azure": 40, "alicloud": 10, "tencent": 40}


def raw_for(cloud: str, **extra: Any) -> dict[str, Any]:
    return {
        "provider": cloud,
        "tier": "t4x1",
        "sshCidrs": ["203.0.113.0/24"],
        "sshPublicKey": PLACEHOLDER_SSH_KEY,
        **extra,
    }


def cidrs(n: int, family: int = 4) -> list[str]:
    if family == 6:
        return [f"2001:db8:{i:x}::/48" for i in range(n)]
    return [f"203.0.{i // 256}.{i % 256}/32" for i in range(n)]


def refusal(cloud: str, stack: str = "lim", **extra: Any) -> str:
    """The one line the config refuses with (it must be exactly one)."""
    with pytest.raises(ConfigError) as err:
        parse_config(raw_for(cloud, **extra), stack)
    (line,) = err.value.problems
    assert "\n" not in line
    return line


def test_every_cloud_with_a_program_has_its_limits_each_with_a_source() -> None:
    assert set(CLOUDS) <= set(clouds.names(limits.FILE))
    for cloud in CLOUDS:
        data = limits.load(cloud)
        assert data and data.rules and data.tags and data.names
        for key, source in data.sources.items():
            assert source.url.startswith("https://"), key
            assert source.says and source.retrieved, key


def test_a_limits_file_that_cites_no_source_or_misspells_a_key_is_refused() -> None:
    rules = {
        "what": "group",
        "quota": "q",
        "source": "NOPE",
        "per_family": False,
        "inbound": {"any": 1},
        "outbound": {"any": 0},
    }
    with pytest.raises(limits.LimitsError, match="source 'NOPE'"):
        limits.parse("x", {"security_group": rules})
    with pytest.raises(limits.LimitsError, match="unknown keys"):
        tags = {"source": "S", "max": 5, "key_max": 1, "value_max": 1, "mx": 1}
        limits.parse("x", {"tags": tags})


# ---------------------------------------------------------------- security-group rules


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_most_ssh_networks_a_cloud_takes_are_accepted(cloud: str) -> None:
    cfg = parse_config(raw_for(cloud, sshCidrs=cidrs(MOST_CIDRS[cloud])), "lim")
    assert len(cfg.ssh_cidrs) == MOST_CIDRS[cloud]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_one_ssh_network_more_is_refused_naming_the_limit_and_the_fix(cloud: str) -> None:
    most = MOST_CIDRS[cloud]
    line = refusal(cloud, sshCidrs=cidrs(most + 1))
    assert line.startswith("gpufleet:sshCidrs: ")
    assert f"list at most {most}" in line and "merge neighbouring networks" in line
    assert limits.load(cloud).title in line  # type: ignore[union-attr]


def test_aws_counts_ipv6_rules_apart_from_ipv4() -> None:
    both = cidrs(59) + cidrs(59, 6)
    assert len(parse_config(raw_for("aws", sshCidrs=both), "lim").ssh_cidrs) == 118
    line = refusal("aws", sshCidrs=cidrs(59) + cidrs(60, 6))
    assert "60 IPv6 networks make 61 inbound IPv6 rules" in line
    assert "AWS allows 60 (Inbound or outbound rules per security group)" in line


def test_azure_refuses_more_ssh_networks_than_priorities_below_the_intra_stack_rule() -> None:
    line = refusal("azure", sshCidrs=cidrs(201))
    assert "at most 200 SSH rules" in line and "300" in line


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_repeated_ssh_network_is_refused_on_every_cloud(cloud: str) -> None:
    line = refusal(cloud, sshCidrs=["198.51.100.0/24", "198.51.100.0/24"])
    assert line.startswith("gpufleet:sshCidrs[1]: repeats sshCidrs[0]")


# ------------------------------------------------------------------------------ tags


def user_tags(n: int) -> dict[str, str]:
    return {f"team{i}": "x" for i in range(n)}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_most_tags_a_cloud_takes_are_accepted(cloud: str) -> None:
    cfg = parse_config(raw_for(cloud, tags=user_tags(MOST_USER_TAGS[cloud])), "lim")
    assert len(cfg.tags) == MOST_USER_TAGS[cloud]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_one_tag_more_is_refused_with_how_many_to_drop(cloud: str) -> None:
    line = refusal(cloud, tags=user_tags(MOST_USER_TAGS[cloud] + 1))
    top = limits.load(cloud).tags.max  # type: ignore[union-attr]
    assert line.startswith("gpufleet:tags: ")
    assert f"make {top + 1} on each node" in line and f"allows {top} per resource" in line
    assert f"drop 1 (at most {MOST_USER_TAGS[cloud]} of your own)" in line


def test_a_user_tag_named_like_one_of_gpufleets_own_adds_nothing() -> None:
    tags = {**user_tags(MOST_USER_TAGS["alicloud"]), "Name": "mine"}
    assert "Name" in parse_config(raw_for("alicloud", tags=tags), "lim").tags


def test_no_cloud_takes_a_shorter_tag_value_than_the_config_allows_everywhere() -> None:
    longest = max_tag_value()
    assert longest is not None
    for cloud in CLOUDS:
        assert limits.load(cloud).tags.value_max >= longest  # type: ignore[union-attr]


def test_the_config_takes_the_strictest_tag_value_any_cloud_declares() -> None:
    # Alibaba Cloud's Function Compute takes 128 (FC_TAGS); the others 255 or 256
    assert max_tag_value() == 128 == limits.load("alicloud").tags.value_max  # type: ignore[union-attr]
    assert limits.tag_value_max(["aws", "azure"]) == 256
    assert limits.tag_value_max([]) is None


def test_refused_tag_key_prefixes_are_gpufleets_then_each_clouds_own() -> None:
    # the same list, in the same order, the config held before the clouds declared them
    assert refused_tag_prefixes() == ("gpufleet:", "aws:", "acs:", "aliyun", "http://", "https://")
    for cloud in provider_names():
        cloud_limits = limits.load(cloud)
        if cloud_limits and cloud_limits.tags:
            assert set(cloud_limits.tags.refused_key_prefixes) <= set(refused_tag_prefixes())
    assert limits.refused_tag_key_prefixes(["aws"]) == ("aws:",)
    assert limits.refused_tag_key_prefixes(["azure", "tencent"]) == ()


def test_a_key_another_cloud_reserves_is_refused_on_every_cloud() -> None:
    # a stack's tags stay valid wherever it moves: aliyun... is refused on AWS too
    for cloud in CLOUDS:
        for key in ("aws:team", "ALIYUN-x", "acs:y", "https://z"):
            line = refusal(cloud, tags={key: "v"})
            assert line.startswith(f"gpufleet:tags.{key}: ") and "is reserved" in line


def test_a_clouds_refused_key_prefixes_are_read_in_lower_case() -> None:
    tags = {"source": "T", "max": 5, "key_max": 9, "value_max": 9}
    parsed = limits.parse(
        "x",
        {
            "sources": {"T": {"url": "u", "says": "s", "retrieved": "r"}},
            "tags": {**tags, "refused_key_prefixes": ["Qcs:", "project:"]},
        },
    )
    assert parsed.tags is not None and parsed.tags.refused_key_prefixes == ("qcs:", "project:")


def test_alicloud_refuses_a_tag_key_longer_than_function_compute_takes() -> None:
    assert parse_config(raw_for("alicloud", tags={"k" * 64: "v"}), "lim").tags
    line = refusal("alicloud", tags={"k" * 65: "v"})
    assert line.startswith("gpufleet:tags.kkk") and "65 characters" in line
    assert "at most 64: shorten it" in line


def test_tencent_refuses_an_empty_tag_value_other_clouds_keep() -> None:
    line = refusal("tencent", tags={"team": ""})
    assert line.startswith("gpufleet:tags.team: ") and "empty tag value" in line
    assert parse_config(raw_for("aws", tags={"team": ""}), "lim").tags == {"team": ""}


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_longest_stack_name_a_cloud_takes_is_accepted(cloud: str) -> None:
    assert limits.longest_stack_name(cloud, 2) == LONGEST_STACK[cloud]
    assert parse_config(raw_for(cloud, nodes=2), "s" * LONGEST_STACK[cloud]).stack


@pytest.mark.parametrize("cloud", CLOUDS)
def test_one_character_more_is_refused_saying_the_longest_that_works(cloud: str) -> None:
    longest = LONGEST_STACK[cloud]
    line = refusal(cloud, "s" * (longest + 1), nodes=2)
    assert line.startswith(f"gpufleet:stack: stack name 's{'s' * longest}' is {longest + 1}")
    assert f"stacks take at most {longest} (" in line and line.endswith("rename the stack")


def test_a_60_character_stack_name_on_azure_names_the_function_app_limit() -> None:
    line = refusal("azure", "s" * 60)
    assert "App Service plan (Microsoft.Web/serverfarms) gpufleet-<stack>-reaper-plan" in line
    assert "may be 60 characters" in line


@pytest.mark.parametrize("cloud", ["alicloud", "tencent"])
@pytest.mark.parametrize("stack", ["gpu--dev", "gpu-dev-"])
def test_a_stack_name_that_makes_a_host_name_with_two_hyphens_in_a_row_is_refused(
    cloud: str, stack: str
) -> None:
    line = refusal(cloud, stack)
    assert line.startswith(f"gpufleet:stack: stack name {stack!r} gives the ")
    assert "host name (Linux)" in line and "no two hyphens in a row" in line
    assert line.endswith("rename the stack, e.g. 'gpu-dev'")
    assert parse_config(raw_for(cloud), "gpu-dev").stack == "gpu-dev"


def test_clouds_whose_names_take_two_hyphens_in_a_row_keep_such_a_stack_name() -> None:
    for cloud in ("aws", "azure"):
        assert parse_config(raw_for(cloud), "gpu-dev-").stack == "gpu-dev-"


# ------------------------------------------------------ the data against the programs


def _family(value: Any) -> str:
    return f"ipv{ipaddress.ip_network(value).version}"


def planned_rules(cloud: str, plan: PlanResult) -> dict[tuple[str, str], int]:
    """The rules each program really declares, counted the way the cloud counts them."""
    counts: dict[tuple[str, str], int] = {}

    def add(direction: str, family: str) -> None:
        counts[direction, family] = counts.get((direction, family), 0) + 1

    for r in plan.resources:
        i = r.inputs
        if r.type.startswith("aws:vpc/securityGroup"):
            direction = "inbound" if "Ingress" in r.type else "outbound"
            if i.get("referencedSecurityGroupId"):
                add(direction, "ipv4")
                add(direction, "ipv6")
            else:
                add(direction, _family(i.get("cidrIpv4") or i.get("cidrIpv6")))
        elif r.type == "azure-native:network:NetworkSecurityGroup":
            for rule in i.get("securityRules", []):
                add("inbound" if rule["direction"] == "Inbound" else "outbound", "any")
        elif r.type == "alicloud:ecs/securityGroupRule:SecurityGroupRule":
            add("inbound" if i["type"] == "ingress" else "outbound", "any")
        elif r.type == "tencentcloud:Security/groupRuleSet:GroupRuleSet":
            for _ in i.get("ingresses", []):
                add("inbound", "any")
            for _ in i.get("egresses", []):
                add("outbound", "any")
    return counts


def all_strings(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(all_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(all_strings(v) for v in value)) if value else set()
    return set()


@functools.cache
def plan_at_the_limits(cloud: str) -> tuple[list[str], PlanResult]:
    """Two nodes, the longest stack name, three SSH networks (two IPv6 on AWS) and the most
    user tags the cloud takes."""
    nets = cidrs(3) + (cidrs(2, 6) if cloud == "aws" else [])
    raw = raw_for(cloud, nodes=2, sshCidrs=nets, tags=user_tags(MOST_USER_TAGS[cloud]))
    cfg = parse_config(raw, "s" * LONGEST_STACK[cloud])
    return nets, evaluate(cfg)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_rules_each_program_declares_are_the_ones_its_limits_count(cloud: str) -> None:
    nets, plan = plan_at_the_limits(cloud)
    expected = limits.rule_counts(limits.load(cloud).rules, nets)  # type: ignore[union-attr,arg-type]
    assert planned_rules(cloud, plan) == {k: v for k, v in expected.items() if v}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_most_tagged_resource_reaches_the_limit_once_the_lease_tags_are_set(
    cloud: str,
) -> None:
    _, plan = plan_at_the_limits(cloud)
    tagged = [r.inputs["tags"] for r in plan.resources if isinstance(r.inputs.get("tags"), dict)]
    most = max(tagged, key=len)
    ours = set(most) - set(user_tags(MOST_USER_TAGS[cloud]))
    assert limits.OWN_TAGS - ours == {T.KEEP_ALIVE_UNTIL, T.PROTECTED}
    assert len(most) + 2 == limits.load(cloud).tags.max  # type: ignore[union-attr]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_limited_name_is_in_the_plan_whole_at_the_longest_stack_name(cloud: str) -> None:
    _, plan = plan_at_the_limits(cloud)
    stack = "s" * LONGEST_STACK[cloud]
    inputs = set().union(*(all_strings(r.inputs) for r in plan.resources))
    logical = {r.name for r in plan.resources}
    for name in limits.load(cloud).names:  # type: ignore[union-attr]
        rendered = name.template.format(stack=stack, node=1)
        assert rendered in (logical if name.random_suffix else inputs), (cloud, rendered)
        assert name.length(stack, 2) <= name.max


# ------------------------------------------------------------------ the real stacks


@pytest.mark.parametrize("path", sorted((ROOT / "stacks").glob("Pulumi.*.yaml")), ids=str)
def test_every_stack_file_in_the_repo_is_within_its_clouds_limits(path: Path) -> None:
    cfg = load_stack_file(path)
    assert not limits.problems(cfg.provider, cfg.stack, cfg.nodes, cfg.ssh_cidrs, cfg.tags)
