"""The IAM evaluator (tests/infra/aws_iam.py) on the IAM User Guide's own examples, each
with the outcome the guide states (pages read 2026-12-01; awsdocs/iam-user-guide at
e2b8637 holds the archived text)."""

from __future__ import annotations

import pytest

from tests.infra.aws_iam import Request, allowed, condition_holds, decide


def doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


# -- "Creating a condition with multiple keys or values" (multi-value-conditions) --------

CONDITION_BLOCK = {
    "StringEqualsIgnoreCase": {
        "aws:PrincipalTag/department": ["finance", "hr", "legal"],
        "aws:PrincipalTag/role": ["audit", "security"],
    },
    "StringEquals": {"aws:PrincipalAccount": "123456789012"},
}


def test_keys_and_operators_are_anded_and_a_keys_values_ored():
    ok = {
        "aws:PrincipalTag/department": "HR",
        "aws:PrincipalTag/role": "audit",
        "aws:PrincipalAccount": "123456789012",
    }
    assert condition_holds(CONDITION_BLOCK, ok)
    assert not condition_holds(CONDITION_BLOCK, {**ok, "aws:PrincipalAccount": "210987654321"})
    assert not condition_holds(CONDITION_BLOCK, {**ok, "aws:PrincipalTag/role": "admin"})
    missing = {k: v for k, v in ok.items() if k != "aws:PrincipalTag/role"}
    assert not condition_holds(CONDITION_BLOCK, missing)


def test_a_negated_operators_values_must_all_differ():
    # "the string cannot match any of the aws:PrincipalAccount values listed"
    cond = {"StringNotEquals": {"aws:PrincipalAccount": ["111122223333", "444455556666"]}}
    assert not condition_holds(cond, {"aws:PrincipalAccount": "444455556666"})
    assert condition_holds(cond, {"aws:PrincipalAccount": "777788889999"})


THREAD = "arn:aws:dynamodb:us-east-1:123456789012:table/Thread"
GET_ONLY = doc(
    {
        "Effect": "Allow",
        "Action": "dynamodb:GetItem",
        "Resource": "arn:aws:dynamodb:*:*:table/Thread",
        "Condition": {
            "ForAllValues:StringEquals": {"dynamodb:Attributes": ["ID", "Message", "Tags"]}
        },
    }
)


def test_for_all_values_allows_only_requests_whose_every_value_is_listed():
    def get(*attributes: str) -> Request:
        return Request("dynamodb:GetItem", THREAD, {"dynamodb:Attributes": list(attributes)})

    assert allowed([GET_ONLY], get("ID", "Message", "Tags"))
    assert not allowed([GET_ONLY], get("ID", "Message", "UserName"))
    # "It also returns true if there are no keys in the request" (the Warning)
    assert allowed([GET_ONLY], Request("dynamodb:GetItem", THREAD, {}))


DENY_PUT = doc(
    {
        "Effect": "Deny",
        "Action": "dynamodb:PutItem",
        "Resource": "arn:aws:dynamodb:*:*:table/Thread",
        "Condition": {"ForAnyValue:StringEquals": {"dynamodb:Attributes": ["ID", "PostDateTime"]}},
    }
)


def test_for_any_value_denies_when_one_value_is_listed_and_not_otherwise():
    def put(*attributes: str) -> Request:
        return Request("dynamodb:PutItem", THREAD, {"dynamodb:Attributes": list(attributes)})

    assert decide([DENY_PUT], put("PostDateTime", "Message")) == "Deny"
    # "not explicitly denied by this policy, but all requests are implicitly denied"
    assert decide([DENY_PUT], put("UserName")) == "ImplicitDeny"
    assert decide([DENY_PUT], Request("dynamodb:PutItem", THREAD, {})) == "ImplicitDeny"


# -- "IAM JSON policy elements: Condition operators" (elements_condition_operators) -------


def test_a_key_absent_from_the_request_matches_only_negated_operators():
    assert not condition_holds({"StringLike": {"s3:prefix": "home/*"}}, {})
    assert condition_holds({"StringNotLike": {"s3:prefix": "home/*"}}, {})
    assert condition_holds({"ArnNotLike": {"aws:SourceArn": "arn:aws:sns:*:*:t"}}, {})


def test_null_tests_whether_the_key_is_present():
    # The guide's example: EC2 only without temporary credentials.
    policy = doc(
        {
            "Action": "ec2:*",
            "Effect": "Allow",
            "Resource": "*",
            "Condition": {"Null": {"aws:TokenIssueTime": "true"}},
        }
    )
    request = Request("ec2:DescribeInstances", "*", {})
    assert allowed([policy], request)
    temporary = {"aws:TokenIssueTime": "2026-12-01T10:00:00Z"}
    assert not allowed([policy], Request("ec2:DescribeInstances", "*", temporary))


def test_if_exists_holds_on_an_absent_key_and_tests_a_present_one():
    # The guide's StringLikeIfExists example on ec2:InstanceType.
    policy = doc(
        {
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": "*",
            "Condition": {"StringLikeIfExists": {"ec2:InstanceType": ["t1.*", "t2.*", "m3.*"]}},
        }
    )
    assert allowed([policy], Request("ec2:RunInstances", "arn:aws:ec2:::image/ami-1", {}))
    small = {"ec2:InstanceType": "t2.micro"}
    assert allowed([policy], Request("ec2:RunInstances", "i", small))
    assert not allowed(
        [policy], Request("ec2:RunInstances", "i", {"ec2:InstanceType": "p5.48xlarge"})
    )


def test_arn_like_matches_each_colon_separated_part_on_its_own():
    # The guide's example: StringLike matches, ArnLike does not.
    pattern = "arn:aws:someservice:*:111122223333:finance/*"
    value = "arn:aws:someservice:us-east-2:999999999999:store/abc:111122223333:finance/document.txt"
    assert condition_holds({"StringLike": {"aws:SourceArn": pattern}}, {"aws:SourceArn": value})
    assert not condition_holds({"ArnLike": {"aws:SourceArn": pattern}}, {"aws:SourceArn": value})
    ok = "arn:aws:someservice:us-east-2:111122223333:finance/document.txt"
    assert condition_holds({"ArnLike": {"aws:SourceArn": pattern}}, {"aws:SourceArn": ok})


def test_arn_equals_names_one_instance_as_the_ec2_guides_source_instance_example():
    # EC2 user guide, "Allow a specific instance to view resources in other AWS services".
    arn = "arn:aws:ec2:us-east-1:123456789012:instance/i-093452212644b0dd6"
    policy = doc(
        {
            "Effect": "Allow",
            "Action": ["ec2:DescribeVolumes", "s3:ListAllMyBuckets"],
            "Resource": ["*"],
            "Condition": {"ArnEquals": {"ec2:SourceInstanceARN": arn}},
        }
    )
    assert allowed([policy], Request("ec2:DescribeVolumes", "*", {"ec2:SourceInstanceARN": arn}))
    other = {"ec2:SourceInstanceARN": arn.replace("093452212644b0dd6", "0aaaaaaaaaaaaaaaa")}
    assert not allowed([policy], Request("ec2:DescribeVolumes", "*", other))
    assert not allowed([policy], Request("ec2:DescribeVolumes", "*", {}))  # not an instance


# -- "Policy evaluation logic": an explicit Deny wins ---------------------------------------


def test_an_explicit_deny_overrides_any_allow_and_nothing_allowed_is_denied():
    allow = doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})
    deny = doc({"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "*"})
    assert decide([allow, deny], Request("s3:DeleteObject", "arn:aws:s3:::b/k")) == "Deny"
    assert decide([allow, deny], Request("s3:GetObject", "arn:aws:s3:::b/k")) == "Allow"
    assert decide([deny], Request("s3:GetObject", "arn:aws:s3:::b/k")) == "ImplicitDeny"


def test_actions_match_with_wildcards_and_without_case():
    policy = doc({"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"})
    assert allowed([policy], Request("ec2:describeinstances", "*"))
    assert not allowed([policy], Request("ec2:StopInstances", "*"))


# -- "IAM policy elements: Variables and tags" (reference_policies_variables) -------------

HOME = doc(
    {
        "Action": ["s3:ListBucket"],
        "Effect": "Allow",
        "Resource": ["arn:aws:s3:::mybucket"],
        "Condition": {"StringLike": {"s3:prefix": ["${aws:username}/*"]}},
    },
    {
        "Action": ["s3:GetObject", "s3:PutObject"],
        "Effect": "Allow",
        "Resource": ["arn:aws:s3:::mybucket/${aws:username}/*"],
    },
)


def test_a_variable_in_a_resource_names_the_callers_own_objects():
    david = {"aws:username": "David"}
    assert allowed([HOME], Request("s3:GetObject", "arn:aws:s3:::mybucket/David/a.txt", david))
    assert not allowed([HOME], Request("s3:GetObject", "arn:aws:s3:::mybucket/Adele/a.txt", david))
    listing = {**david, "s3:prefix": "David/photos"}
    assert allowed([HOME], Request("s3:ListBucket", "arn:aws:s3:::mybucket", listing))
    # "the resource that includes a policy variable with no value will not match any resource"
    assert not allowed([HOME], Request("s3:GetObject", "arn:aws:s3:::mybucket/David/a.txt", {}))


def test_a_variable_with_no_value_matches_nothing_but_negated_operators_match_it():
    # The guide's Deny example: Team must equal the principal's Team tag.
    deny = doc(
        {
            "Effect": "Deny",
            "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::example-bucket/*",
            "Condition": {
                "StringNotEquals": {"s3:ExistingObjectTag/Team": "${aws:PrincipalTag/Team}"}
            },
        }
    )
    obj = "arn:aws:s3:::example-bucket/report"
    same = {"s3:ExistingObjectTag/Team": "blue", "aws:PrincipalTag/Team": "blue"}
    assert decide([deny], Request("s3:GetObject", obj, same)) == "ImplicitDeny"
    untagged = {"s3:ExistingObjectTag/Team": "blue"}
    assert decide([deny], Request("s3:GetObject", obj, untagged)) == "Deny"
    equal = {"StringEquals": {"s3:ExistingObjectTag/Team": "${aws:PrincipalTag/Team}"}}
    assert not condition_holds(equal, untagged)


def test_a_variables_default_value_stands_in_when_the_key_is_absent():
    policy = doc(
        {
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::DOC-EXAMPLE-BUCKET-${aws:PrincipalTag/team, 'company-wide'}",
        }
    )
    shared = "arn:aws:s3:::DOC-EXAMPLE-BUCKET-company-wide"
    assert allowed([policy], Request("s3:GetObject", shared, {}))
    yellow = {"aws:PrincipalTag/team": "yellow"}
    assert allowed(
        [policy], Request("s3:GetObject", "arn:aws:s3:::DOC-EXAMPLE-BUCKET-yellow", yellow)
    )
    assert not allowed([policy], Request("s3:GetObject", shared, yellow))


@pytest.mark.parametrize(("special", "value"), [("${*}", "a*b"), ("${?}", "a?b"), ("${$}", "a$b")])
def test_special_variables_stand_for_the_characters_themselves(special, value):
    cond = {"StringLike": {"s3:prefix": f"a{special}b"}}
    assert condition_holds(cond, {"s3:prefix": value})
    if special != "${$}":
        assert not condition_holds(cond, {"s3:prefix": "axxb"})
