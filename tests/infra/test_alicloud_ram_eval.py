"""The RAM evaluator (tests/infra/alicloud_ram.py) decides RAM's own examples
the way RAM's documentation says they are decided.

Each policy below is an example from the page named above it (read
2026-12-01), written again here in our own layout; the requests are ours.
"""

from __future__ import annotations

import pytest

from tests.infra.alicloud_ram import Request, Undocumented, allowed, condition_holds, decide

# "Conditional operators", StringEquals: manage only ECS instances tagged team:dev.
TEAM_DEV = {
    "Version": "1",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "ecs:*",
            "Resource": "*",
            "Condition": {"StringEquals": {"acs:ResourceTag/team": ["dev"]}},
        }
    ],
}

# "Conditional operators", StringLike: list only objects under hangzhou/2015/.
PHOTOS = {
    "Version": "1",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["oss:GetObject"],
            "Resource": ["acs:oss:*:*:myphotos/hangzhou/2015/*"],
        },
        {
            "Effect": "Allow",
            "Action": ["oss:ListObjects"],
            "Resource": ["acs:oss:*:*:myphotos"],
            "Condition": {"StringLike": {"oss:Prefix": "hangzhou/2015/*"}},
        },
    ],
}

# "Access Alibaba Cloud in a specified period of time": ECS until a moment.
UNTIL = {
    "Version": "1",
    "Statement": [
        {
            "Action": "ecs:*",
            "Effect": "Allow",
            "Resource": "*",
            "Condition": {"DateLessThan": {"acs:CurrentTime": "2019-08-12T17:00:00+08:00"}},
        }
    ],
}

# "Policy elements", Action example and the Resource ARN examples.
ELEMENTS = {
    "Version": "1",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["oss:ListBuckets", "ecs:Describe*", "rds:Describe*"],
            "Resource": [
                "acs:ecs:*:*:instance/inst-001",
                "acs:ecs:*:*:instance/inst-002",
                "acs:oss:*:*:mybucket",
                "acs:oss:*:*:mybucket/*",
            ],
        }
    ],
}

# "Policy elements", NotAction example: everything except RAM.
NOT_RAM = {
    "Version": "1",
    "Statement": [{"Effect": "Allow", "NotAction": "ram:*", "Resource": "*"}],
}

INSTANCE = "acs:ecs:cn-hangzhou:123456789012****:instance/i-1"


def test_string_equals_allows_only_the_tagged_instances() -> None:
    dev = Request("ecs:StopInstance", INSTANCE, {"acs:ResourceTag/team": "dev"})
    ops = Request("ecs:StopInstance", INSTANCE, {"acs:ResourceTag/team": "ops"})
    untagged = Request("ecs:StopInstance", INSTANCE)
    assert allowed([TEAM_DEV], dev)
    assert not allowed([TEAM_DEV], ops)
    assert not allowed([TEAM_DEV], untagged)


def test_string_like_limits_the_listing_to_its_prefix() -> None:
    bucket = "acs:oss:*:*:myphotos"
    assert allowed([PHOTOS], Request("oss:ListObjects", bucket, {"oss:Prefix": "hangzhou/2015/"}))
    assert allowed([PHOTOS], Request("oss:ListObjects", bucket, {"oss:Prefix": "hangzhou/2015/a"}))
    assert not allowed([PHOTOS], Request("oss:ListObjects", bucket, {"oss:Prefix": "beijing/"}))
    photo = "acs:oss:*:*:myphotos/hangzhou/2015/cat.jpg"
    assert allowed([PHOTOS], Request("oss:GetObject", photo))
    assert not allowed([PHOTOS], Request("oss:GetObject", "acs:oss:*:*:myphotos/x.jpg"))


def test_string_like_star_matches_any_run_of_characters_the_empty_one_included() -> None:
    condition = {"StringLike": {"acs:RequestTag/k": "*"}}
    assert condition_holds(condition, {"acs:RequestTag/k": ""})
    assert condition_holds(condition, {"acs:RequestTag/k": "2026-12-01T12:00:00Z"})
    assert condition_holds({"StringLike": {"k": "a?c"}}, {"k": "abc"})
    assert not condition_holds({"StringLike": {"k": "a?c"}}, {"k": "abbc"})


def test_date_less_than_allows_until_the_moment_only() -> None:
    before = Request("ecs:DescribeInstances", "*", {"acs:CurrentTime": "2019-08-12T08:59:59Z"})
    after = Request("ecs:DescribeInstances", "*", {"acs:CurrentTime": "2019-08-12T09:00:01Z"})
    assert allowed([UNTIL], before)
    assert not allowed([UNTIL], after)


def test_action_wildcards_and_case_and_resource_arns_follow_the_elements_page() -> None:
    assert allowed([ELEMENTS], Request("ecs:DescribeInstances", "acs:ecs:*:*:instance/inst-001"))
    assert allowed([ELEMENTS], Request("ECS:describeinstances", "acs:ecs:*:*:instance/inst-002"))
    assert not allowed([ELEMENTS], Request("ecs:StopInstance", "acs:ecs:*:*:instance/inst-001"))
    assert not allowed([ELEMENTS], Request("ecs:DescribeInstances", "acs:ecs:*:*:instance/i-3"))
    assert allowed([ELEMENTS], Request("oss:ListBuckets", "acs:oss:*:*:mybucket/a/b.jpg"))


def test_not_action_allows_everything_but_the_named_service() -> None:
    assert allowed([NOT_RAM], Request("ecs:StopInstance", INSTANCE))
    assert not allowed([NOT_RAM], Request("ram:CreateUser", "*"))


def test_an_explicit_deny_overrides_any_allow_and_nothing_is_allowed_by_default() -> None:
    deny = {
        "Version": "1",
        "Statement": [{"Effect": "Deny", "Action": "ecs:StopInstance", "Resource": "*"}],
    }
    request = Request("ecs:StopInstance", INSTANCE, {"acs:ResourceTag/team": "dev"})
    assert decide([TEAM_DEV, deny], request) == "Deny"
    assert decide([deny, TEAM_DEV], request) == "Deny"
    assert decide([], request) == "ImplicitDeny"


def test_conditions_are_anded_across_keys_and_ored_across_one_keys_values() -> None:
    condition = {
        "StringEquals": {"acs:ResourceTag/team": ["dev", "ml"], "acs:ResourceTag/env": "prod"}
    }
    both = {"acs:ResourceTag/team": "ml", "acs:ResourceTag/env": "prod"}
    assert condition_holds(condition, both)
    assert not condition_holds(condition, {**both, "acs:ResourceTag/env": "test"})
    assert not condition_holds(condition, {"acs:ResourceTag/team": "ml"})
    two_operators = {**condition, "Bool": {"acs:SecureTransport": "true"}}
    assert not condition_holds(two_operators, {**both, "acs:SecureTransport": "false"})
    assert condition_holds(two_operators, {**both, "acs:SecureTransport": "true"})


def test_a_matching_operator_on_a_key_the_request_lacks_does_not_hold() -> None:
    assert not condition_holds({"StringLike": {"acs:RequestTag/k": "*"}}, {})
    assert not condition_holds({"Bool": {"acs:SecureTransport": "false"}}, {})


def test_a_negated_operator_on_an_absent_key_is_refused_as_undocumented() -> None:
    with pytest.raises(Undocumented):
        condition_holds({"StringNotEquals": {"acs:RequestTag/k": "v"}}, {})
    assert condition_holds({"StringNotEquals": {"k": "v"}}, {"k": "w"})
    assert not condition_holds({"StringNotEquals": {"k": ["v", "w"]}}, {"k": "w"})


def test_ip_address_matches_inside_the_network_only() -> None:
    condition = {"IpAddress": {"acs:SourceIp": ["203.0.113.0/24"]}}
    assert condition_holds(condition, {"acs:SourceIp": "203.0.113.7"})
    assert not condition_holds(condition, {"acs:SourceIp": "198.51.100.7"})
    assert condition_holds({"NotIpAddress": condition["IpAddress"]}, {"acs:SourceIp": "1.2.3.4"})


def test_an_operator_ram_does_not_document_is_refused() -> None:
    with pytest.raises(AssertionError, match="Null is not an operator RAM documents"):
        condition_holds({"Null": {"acs:RequestTag/k": "false"}}, {"acs:RequestTag/k": "v"})
