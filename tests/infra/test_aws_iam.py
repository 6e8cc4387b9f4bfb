"""Every IAM document and action the AWS stacks declare, checked against AWS's own
definitions: the Service Authorization Reference (parliament's packaged copy) and the IAM
User Guide's operators and keys (tests/data/clouds/aws_iam.toml). A misspelt action,
condition key or operator, a key the action does not have, an operator that does not
take the key, or a resource the action cannot act on, fails."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest

from infra.config import StackConfig, load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from tests.infra import aws_iam as iam
from tests.infra.conftest import STACK_FILES, stack_id

# The shipped AWS stacks, and each as a two-node and as a spot stack.
VARIANTS = {"as shipped": {}, "two nodes": {"nodes": 2}, "spot": {"billing": "spot"}}
AWS_STACKS = [p for p in STACK_FILES if "gpufleet:provider: aws" in p.read_text()]


@functools.cache
def planned(path: Path, variant: str) -> tuple[StackConfig, PlanResult]:
    cfg = load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY, **VARIANTS[variant]})
    return cfg, evaluate(cfg)


@pytest.fixture(
    params=[(p, v) for p in AWS_STACKS for v in VARIANTS],
    ids=lambda pv: f"{stack_id(pv[0])}-{pv[1].replace(' ', '-')}",
)
def aws_plan(request: pytest.FixtureRequest) -> tuple[StackConfig, PlanResult]:
    return planned(*request.param)


def test_the_aws_stacks_are_all_checked():
    assert len(AWS_STACKS) >= 4


def test_every_policy_document_names_only_what_iam_defines(aws_plan):
    cfg, result = aws_plan
    docs = dict(iam.documents_of(result))
    # The bucket's, the stack's node policy, the reaper's, and each node's role and lease.
    names = {name.split(" (")[0].removeprefix(f"{cfg.stack}-") for name in docs}
    nodes = {f"{i}-{kind}" for i in range(cfg.nodes) for kind in ("role", "lease")}
    assert names == {"tls-only", "node-policy", "reaper-role", "reaper-policy"} | nodes
    problems = {name: iam.document_problems(doc) for name, doc in docs.items()}
    assert {k: v for k, v in problems.items() if v} == {}


def test_the_lambda_permission_grants_an_action_lambda_has(aws_plan):
    _, result = aws_plan
    for permission in result.of_type("aws:lambda/permission:Permission"):
        assert iam.actions_named(permission.inputs["action"]) == [permission.inputs["action"]]


NODE = "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0"
LEASE = {
    "Sid": "Lease",
    "Effect": "Allow",
    "Action": "ec2:CreateTags",
    "Resource": NODE,
    "Condition": {
        "ArnEquals": {"ec2:SourceInstanceARN": NODE},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["gpufleet:keep-alive-until"]},
        "Null": {"aws:TagKeys": "false"},
    },
}


def _with(**changes: object) -> dict:
    st = copy.deepcopy(LEASE)
    st.update(changes)
    return st


def test_a_correct_statement_passes_the_check():
    assert iam.statement_problems(LEASE) == []


@pytest.mark.parametrize(
    "statement",
    [
        _with(Action="ec2:CreateTag"),  # misspelt action
        _with(Action="ec2:DescribeInstances"),  # takes "*" only, and no aws:TagKeys
        _with(Resource="arn:aws:ec2:us-east-1:123456789012:instances/i-0"),  # no such type
        _with(Resource="arn:aws:s3:::bucket"),  # another service's resource
        _with(Effect="allow"),
        _with(Condition={"ArnEqual": {"ec2:SourceInstanceARN": "arn:aws:ec2:*:*:instance/i"}}),
        _with(Condition={"ArnEquals": {"ec2:SourceInstanceArm": "arn:aws:ec2:*:*:instance/i"}}),
        _with(Condition={"ForAllValues:StringEquals": {"aws:TagKey": ["k"]}}),
        _with(Condition={"ForAllValue:StringEquals": {"aws:TagKeys": ["k"]}}),
        _with(Condition={"StringEquals": {"aws:TagKeys": ["k"]}}),  # multivalued: set op
        _with(Condition={"ForAnyValue:StringEquals": {"aws:ResourceTag/k": "v"}}),  # single
        _with(Condition={"StringEquals": {"cloudwatch:namespace": "gpufleet"}}),  # not EC2's
        _with(Condition={"NumericEquals": {"aws:ResourceTag/k": "1"}}),  # a string key
        _with(Condition={"Bool": {"ec2:SourceInstanceARN": "true"}}),  # an ARN key
        _with(Condition={"NullIfExists": {"aws:TagKeys": "false"}}),  # Null takes no IfExists
        _with(Condition={"Null": {"aws:TagKeys": "${aws:username}"}}),  # no variable there
        _with(Resource="${ec2:SourceInstanceARN}"),  # the shared-role shortcut IAM refuses
        _with(Resource="arn:aws:ec2:*:*:instance/${ec2:SourceInstanceARN}"),
        _with(Resource="arn:aws:ec2:${aws:RequestedRegion}:*:instance/*"),  # before part 6
    ],
)
def test_a_misspelt_or_unsupported_statement_fails_the_check(statement):
    assert iam.statement_problems(statement) != []


def test_a_document_of_another_policy_language_version_fails():
    assert iam.document_problems({"Version": "2008-10-17", "Statement": [LEASE]}) != []


def test_resource_patterns_match_the_references_arn_formats_part_by_part():
    fmt = (
        "arn:${Partition}:logs:${Region}:${Account}:log-group:${LogGroupName}"
        ":log-stream:${LogStreamName}"
    )
    assert iam.arn_fits("arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/f:*", fmt)
    assert not iam.arn_fits("arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/f", fmt)
    assert not iam.arn_fits("arn:aws:ec2:us-east-1:123456789012:log-group:x:*", fmt)
    assert iam.arn_fits("*", fmt)
