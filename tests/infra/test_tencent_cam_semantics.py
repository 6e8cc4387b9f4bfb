"""The CAM evaluator (tests/support/tencent_cam.py) against Tencent's own examples.

Each test is an example from a Tencent page (cited in its docstring; the URLs are in
tests/data/clouds/tencent_cam.toml [sources]): the policy as the page prints it, the
requests the page describes and the outcome the page states. Read 2026-12-01.
"""

from __future__ import annotations

import json

import pytest

from tests.support import tencent_cam as cam
from tests.support.tencent_cam import ALLOW, DENY, IMPLICIT_DENY, Request

COS_OBJECT = "qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/exampleobject"
SUB_USER = "qcs::cam::uin/100000000001:uin/100000000002"


def policy(*statements: dict) -> str:
    return json.dumps({"version": "2.0", "statement": list(statements)})


# COS_CONDITION_EXAMPLES, "Forcibly setting a specified bucket tag": set A (the request's
# tags) against set B (the policy's): for_any_value holds when they intersect,
# for_all_value when A is a subset of B; the page's table of three requests each.
TAG_REQUESTS = [["a&b", "c&d"], ["a&b"], ["a&b", "c&d", "e&f"]]


def put_bucket_policy(operator: str) -> str:
    return policy(
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "allow",
            "action": ["name/cos:PutBucket"],
            "resource": "*",
            "condition": {operator: {"qcs:request_tag": ["a&b", "c&d"]}},
        }
    )


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        ("for_any_value:string_equal", [ALLOW, ALLOW, ALLOW]),
        ("for_all_value:string_equal", [ALLOW, ALLOW, IMPLICIT_DENY]),
    ],
)
def test_the_cos_request_tag_table_for_any_and_for_all_value(
    operator: str, expected: list[str]
) -> None:
    doc = put_bucket_policy(operator)
    got = [
        cam.decide(
            [doc],
            Request("cos:PutBucket", "*", {"qcs:request_tag": tags}, principal=SUB_USER),
        )
        for tags in TAG_REQUESTS
    ]
    assert got == expected


def test_tag_authorization_lets_a_tagged_instance_be_stopped_and_no_other() -> None:
    """CAM_BY_TAG ("Authorization by Tag"): cvm:* and two VPC reads on resources bound with
    game&webpage; the sub-user "can start, shut down, restart ... the CVM instance". The
    instance may carry other tags besides (for_any_value)."""
    doc = policy(
        {
            "effect": "allow",
            "action": ["cvm:*", "vpc:DescribeVpcEx", "vpc:DescribeNetworkInterfaces"],
            "resource": "*",
            "condition": {"for_any_value:string_equal": {"qcs:resource_tag": ["game&webpage"]}},
        }
    )
    ins = "qcs::cvm:ap-guangzhou:uin/100000000001:instance/ins-duglsqg0"
    tagged = {"qcs:resource_tag": ["owner&ops", "game&webpage", "env&prod"]}
    untagged = {"qcs:resource_tag": ["owner&ops", "game&other"]}
    for action in ("cvm:StopInstances", "cvm:StartInstances", "cvm:RebootInstances"):
        assert cam.decide([doc], Request(action, ins, tagged)) == ALLOW
        assert cam.decide([doc], Request(action, ins, untagged)) == IMPLICIT_DENY
    assert cam.decide([doc], Request("cbs:AttachDisks", ins, tagged)) == IMPLICIT_DENY


def test_an_ip_and_a_date_clause_must_both_hold() -> None:
    """CAM_CONDITION's clause example: ip_equal qcs:ip 192.168.1.1 and date_less_than
    qcs:current_time 2022-05-31 00:00:00; a block holds only when all its clauses do."""
    doc = policy(
        {
            "effect": "allow",
            "action": "cvm:DescribeInstances",
            "resource": "*",
            "condition": {
                "ip_equal": {"qcs:ip": "192.168.1.1"},
                "date_less_than": {"qcs:current_time": "2022-05-31 00:00:00"},
            },
        }
    )

    def ask(ip: str, when: str) -> str:
        ctx = {"qcs:ip": [ip], "qcs:current_time": [when]}
        return cam.decide([doc], Request("cvm:DescribeInstances", "*", ctx))

    assert ask("192.168.1.1", "2022-05-30 12:00:00") == ALLOW
    assert ask("192.168.1.1", "2022-06-01 00:00:00") == IMPLICIT_DENY
    assert ask("192.168.1.2", "2022-05-30 12:00:00") == IMPLICIT_DENY


def test_a_key_with_several_values_holds_when_any_of_them_matches() -> None:
    """COS_CONDITIONS' example: cos:PutObject only from 10.217.182.3/24 or
    111.21.33.72/24; "if the user's IP is in any of the ranges, the condition is true"."""
    doc = policy(
        {
            "principal": {"qcs": ["qcs::cam::uin/1250000000:uin/1250000001"]},
            "effect": "allow",
            "action": ["name/cos:PutObject"],
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
            "condition": {"ip_equal": {"qcs:ip": ["10.217.182.3/24", "111.21.33.72/24"]}},
        }
    )
    who = "qcs::cam::uin/1250000000:uin/1250000001"

    def put_from(ip: str) -> str:
        return cam.decide([doc], Request("cos:PutObject", COS_OBJECT, {"qcs:ip": [ip]}, who))

    assert put_from("111.21.33.9") == ALLOW
    assert put_from("10.217.182.200") == ALLOW
    assert put_from("10.217.183.1") == IMPLICIT_DENY


def test_a_deny_of_plain_http_wins_over_an_allow() -> None:
    """COS_CONDITION_EXAMPLES "Example 2: denying any non-HTTPS request" (bool_equal on
    cos:secure-transport "false"), beside an allow; CAM_EVAL: a matching deny wins."""
    deny = policy(
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "deny",
            "action": ["*"],
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
            "condition": {"bool_equal": {"cos:secure-transport": "false"}},
        }
    )
    allow = policy(
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "allow",
            "action": ["name/cos:GetObject"],
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
        }
    )

    def get(https: str) -> str:
        ctx = {"cos:secure-transport": [https]}
        return cam.decide([allow, deny], Request("cos:GetObject", COS_OBJECT, ctx, SUB_USER))

    assert get("false") == DENY
    assert get("true") == ALLOW


def test_if_exist_holds_when_the_request_lacks_the_key() -> None:
    """COS_CONDITION_EXAMPLES cos:versionid Example 2: allow string_equal_if_exist "" and
    deny string_not_equal "": no versionid or an empty one reads the latest version; any
    other version is refused."""
    doc = policy(
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "allow",
            "action": ["name/cos:GetObject"],
            "condition": {"string_equal_if_exist": {"cos:versionid": ""}},
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
        },
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "deny",
            "action": ["name/cos:GetObject"],
            "condition": {"string_not_equal": {"cos:versionid": ""}},
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
        },
    )

    def get(ctx: dict) -> str:
        return cam.decide([doc], Request("cos:GetObject", COS_OBJECT, ctx, SUB_USER))

    assert get({}) == ALLOW
    assert get({"cos:versionid": [""]}) == ALLOW
    assert get({"cos:versionid": ["MTg0NDUxNTc1NjIzMTQ1MDAwODg"]}) == DENY


def test_a_numeric_cap_with_a_deny_if_exist_refuses_bigger_and_missing_lengths() -> None:
    """COS_CONDITION_EXAMPLES cos:content-length Example 1: allow numeric_less_than_equal
    10, deny numeric_greater_than_if_exist 10."""
    doc = policy(
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "allow",
            "action": ["name/cos:PutObject"],
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
            "condition": {"numeric_less_than_equal": {"cos:content-length": 10}},
        },
        {
            "principal": {"qcs": [SUB_USER]},
            "effect": "deny",
            "action": ["name/cos:PutObject"],
            "resource": ["qcs::cos:ap-guangzhou:uid/1250000000:examplebucket-1250000000/*"],
            "condition": {"numeric_greater_than_if_exist": {"cos:content-length": 10}},
        },
    )

    def put(ctx: dict) -> str:
        return cam.decide([doc], Request("cos:PutObject", COS_OBJECT, ctx, SUB_USER))

    assert put({"cos:content-length": ["10"]}) == ALLOW
    assert put({"cos:content-length": ["11"]}) == DENY
    assert put({}) == DENY


def test_nothing_matching_is_denied_by_default() -> None:
    """CAM_EVAL step 1: all requests are denied by default."""
    doc = policy({"effect": "allow", "action": "cvm:DescribeInstances", "resource": "*"})
    assert cam.decide([doc], Request("cvm:StopInstances", "*")) == IMPLICIT_DENY


def test_object_resources_match_by_prefix_and_bucket_apis_name_the_bucket_with_a_slash() -> None:
    """COS_API_POLICY: objects under a prefix are ``<bucket>/doc/*``; bucket APIs (Head
    Bucket, List Multipart Uploads) name ``<bucket>/``; ``<bucket>/*`` covers both."""
    bucket = "qcs::cos:ap-beijing:uid/1250000000:examplebucket-1250000000"
    assert cam.resource_matches(f"{bucket}/doc/*", f"{bucket}/doc/audio.mp3")
    assert not cam.resource_matches(f"{bucket}/doc/*", f"{bucket}/doc2/audio.mp3")
    assert cam.resource_matches(f"{bucket}/", f"{bucket}/")
    assert cam.resource_matches(f"{bucket}/*", f"{bucket}/")
    assert not cam.resource_matches(bucket, f"{bucket}/")


def test_an_empty_region_in_a_resource_means_every_region() -> None:
    """CAM_RESOURCE: region "值为空的时候表示所有地域" (empty: all regions)."""
    assert cam.resource_matches(
        "qcs::cvm::uin/*:instance/*", "qcs::cvm:ap-guangzhou:uin/100000000001:instance/ins-1"
    )
    assert not cam.resource_matches(
        "qcs::cvm::uin/*:instance/*", "qcs::cvm:ap-guangzhou:uin/100000000001:keypair/skey-1"
    )


def test_actions_match_with_or_without_the_name_prefix_and_by_wildcard_only() -> None:
    """CAM_ELEMENTS: an API is named with the ``name`` prefix; the examples also write
    ``cvm:RebootInstances``; COS_API_POLICY: action names are case-sensitive."""
    assert cam.action_matches("name/cos:GetObject", "cos:GetObject")
    assert cam.action_matches("cos:Get*", "name/cos:GetObject")
    assert not cam.action_matches("cos:getobject", "cos:GetObject")
    assert not cam.action_matches("cos:GetObject", "cos:GetObjectACL")


@pytest.mark.parametrize("element", ["Statement", "Version"])
def test_element_names_in_another_letter_case_are_refused(element: str) -> None:
    """CAM_ELEMENTS: "These elements must be lowercase"."""
    doc = {"version": "2.0", "statement": [{"effect": "allow", "action": "*", "resource": "*"}]}
    doc[element] = doc.pop(element.lower())
    with pytest.raises(cam.PolicyError, match="lowercase"):
        cam.load(doc)


def on_everything(effect: str, condition: dict) -> str:
    return policy({"effect": effect, "action": "*", "resource": "*", "condition": condition})


def test_an_operator_cam_does_not_document_is_refused() -> None:
    """CAM_OPERATORS lists bool_equal for Booleans; there is no ``bool``."""
    doc = on_everything("deny", {"bool": {"cos:secure-transport": "false"}})
    with pytest.raises(cam.PolicyError, match="not a CAM operator"):
        cam.load(doc)


def test_undocumented_cases_raise_instead_of_guessing() -> None:
    unqualified = on_everything("allow", {"string_equal": {"qcs:resource_tag": ["a&b"]}})
    two_tags = {"qcs:resource_tag": ["a&b", "c&d"]}
    with pytest.raises(cam.Undocumented):
        cam.decide([unqualified], Request("cvm:StopInstances", "*", two_tags))
    qualified = on_everything("allow", {"for_any_value:string_equal": {"qcs:request_tag": ["a&b"]}})
    with pytest.raises(cam.Undocumented):
        cam.decide([qualified], Request("cvm:StopInstances", "*", {}))


def test_condition_keys_are_case_sensitive() -> None:
    """CAM_OPERATORS: "Condition keys are case sensitive"; a key in another case is
    another key, which the request lacks."""
    doc = on_everything("allow", {"ip_equal": {"qcs:IP": "192.168.1.1"}})
    request = Request("cvm:DescribeInstances", "*", {"qcs:ip": ["192.168.1.1"]})
    assert cam.decide([doc], request) == IMPLICIT_DENY
    doc = on_everything("allow", {"ip_equal": {"qcs:ip": "192.168.1.1"}})
    assert cam.decide([doc], request) == ALLOW
