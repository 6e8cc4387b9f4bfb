"""What the AWS stacks' roles allow, judged by an evaluator of IAM's documented semantics
(tests/infra/aws_iam.py) on the documents the program declares under Pulumi's mocks: each
node may write its own lease tag and nothing else of EC2, the reaper may stop only its own
stack's managed instances."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from infra.reaper import tags as T
from tests.infra.aws_iam import Request, allowed, decide, instance_role_documents, role_documents

STACKS = Path(__file__).resolve().parents[2] / "stacks"
INSTANCE = "aws:ec2/instance:Instance"
LEASE_VALUE = "2026-12-02T10:00:00Z"


@functools.cache
def planned(name: str, **overrides: Any) -> PlanResult:
    raw = {"sshPublicKey": PLACEHOLDER_SSH_KEY, **overrides}
    return evaluate(load_stack_file(STACKS / f"Pulumi.{name}.yaml", raw))


@pytest.fixture(params=[("h100x8x2", 2), ("t4x1", 2)], ids=lambda p: f"{p[0]}-x{p[1]}")
def plan(request: pytest.FixtureRequest) -> PlanResult:
    name, nodes = request.param
    return planned(name, nodes=nodes)


def nodes_of(plan: PlanResult) -> list[Any]:
    return sorted(plan.of_type(INSTANCE), key=lambda i: i.name)


def tag_request(caller: Any, target: Any, tags: dict[str, str]) -> Request:
    """CreateTags from `caller`'s role credentials on `target`: the request context EC2
    gives it (the target's tags, the request's tags and keys, the source instance)."""
    context: dict[str, Any] = {
        "ec2:SourceInstanceARN": caller.outputs["arn"],
        "aws:TagKeys": list(tags),
        **{f"aws:RequestTag/{k}": v for k, v in tags.items()},
        **{f"aws:ResourceTag/{k}": v for k, v in target.inputs["tags"].items()},
    }
    return Request("ec2:CreateTags", target.outputs["arn"], context)


def test_each_node_may_write_its_own_lease(plan):
    for node in nodes_of(plan):
        docs = instance_role_documents(plan, node)
        assert allowed(docs, tag_request(node, node, {T.KEEP_ALIVE_UNTIL: LEASE_VALUE}))


def test_a_node_may_not_write_a_siblings_lease(plan):
    head, worker = nodes_of(plan)[:2]
    for caller, target in ((head, worker), (worker, head)):
        docs = instance_role_documents(plan, caller)
        request = tag_request(caller, target, {T.KEEP_ALIVE_UNTIL: LEASE_VALUE})
        assert decide(docs, request) == "ImplicitDeny"


def test_another_instance_given_a_nodes_role_may_not_write_its_lease(plan):
    node = nodes_of(plan)[0]
    stranger = f"{node.outputs['arn'].rsplit('/', 1)[0]}/i-0fffffffffffffff0"
    request = tag_request(node, node, {T.KEEP_ALIVE_UNTIL: LEASE_VALUE})
    request = Request(
        request.action, request.resource, {**request.context, "ec2:SourceInstanceARN": stranger}
    )
    assert not allowed(instance_role_documents(plan, node), request)


@pytest.mark.parametrize(
    "tags",
    [
        {T.PROTECTED: "true"},
        {T.KEEP_ALIVE_UNTIL: LEASE_VALUE, T.PROTECTED: "true"},
        {T.KEEP_ALIVE_UNTIL: LEASE_VALUE, T.TTL_HOURS: "off"},
        {T.STACK: "another"},
        {T.MANAGED_BY: "someone"},
        {"team": "ml"},
        {},
    ],
    ids=lambda tags: "+".join(tags) or "no-tags",
)
def test_a_node_may_not_write_any_other_tag_on_itself(plan, tags):
    node = nodes_of(plan)[0]
    assert not allowed(instance_role_documents(plan, node), tag_request(node, node, tags))


@pytest.mark.parametrize(
    "action", ["ec2:StopInstances", "ec2:TerminateInstances", "ec2:DeleteTags", "ec2:RunInstances"]
)
def test_a_node_may_not_act_on_any_instance_through_the_api(plan, action):
    for caller in nodes_of(plan):
        docs = instance_role_documents(plan, caller)
        for target in nodes_of(plan):
            context = {"ec2:SourceInstanceARN": caller.outputs["arn"]}
            assert not allowed(docs, Request(action, target.outputs["arn"], context))


def test_a_node_stops_itself_by_shutting_down_which_stops_and_needs_no_permission(plan):
    # watchdog AwsNode.poweroff is `systemctl poweroff`; EC2 stops the instance on it.
    for node in nodes_of(plan):
        assert node.inputs["instanceInitiatedShutdownBehavior"] == "stop"


def test_a_node_may_use_its_stacks_bucket_and_metrics_namespace_only(plan):
    node = nodes_of(plan)[0]
    docs = instance_role_documents(plan, node)
    (bucket,) = plan.of_type("aws:s3/bucket:Bucket")
    arn = bucket.outputs["arn"]
    assert allowed(docs, Request("s3:PutObject", f"{arn}/checkpoints/step-10.pt"))
    assert allowed(docs, Request("s3:ListBucket", arn))
    assert not allowed(docs, Request("s3:PutObject", "arn:aws:s3:::someone-elses/x"))
    assert not allowed(docs, Request("s3:DeleteBucket", arn))
    put = "cloudwatch:PutMetricData"
    assert allowed(docs, Request(put, "*", {"cloudwatch:namespace": "gpufleet"}))
    assert not allowed(docs, Request(put, "*", {"cloudwatch:namespace": "AWS/EC2"}))


def reaper_documents(plan: PlanResult) -> list[dict[str, Any]]:
    (fn,) = plan.of_type("aws:lambda/function:Function")
    (role,) = [
        r for r in plan.of_type("aws:iam/role:Role") if r.outputs["arn"] == fn.inputs["role"]
    ]
    return role_documents(plan, role.outputs["name"])


def stop_request(arn: str, tags: dict[str, str]) -> Request:
    context = {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
    return Request("ec2:StopInstances", arn, context)


def test_the_reaper_may_stop_each_of_its_stacks_nodes(plan):
    docs = reaper_documents(plan)
    for node in nodes_of(plan):
        assert allowed(docs, stop_request(node.outputs["arn"], node.inputs["tags"]))


def test_the_reaper_may_not_stop_another_stacks_or_an_unmanaged_instance(plan):
    docs = reaper_documents(plan)
    node = nodes_of(plan)[0]
    tags = dict(node.inputs["tags"])
    other = "arn:aws:ec2:us-east-1:123456789012:instance/i-0eeeeeeeeeeeeeee0"
    assert not allowed(docs, stop_request(other, {**tags, T.STACK: "another-stack"}))
    assert not allowed(
        docs, stop_request(other, {k: v for k, v in tags.items() if k != T.MANAGED_BY})
    )
    assert not allowed(docs, stop_request(other, {}))


@pytest.mark.parametrize(
    "action", ["ec2:TerminateInstances", "ec2:CreateTags", "ec2:DeleteTags", "ec2:StartInstances"]
)
def test_the_reaper_may_not_terminate_start_or_tag(plan, action):
    docs = reaper_documents(plan)
    for node in nodes_of(plan):
        context = {f"aws:ResourceTag/{k}": v for k, v in node.inputs["tags"].items()}
        assert not allowed(docs, Request(action, node.outputs["arn"], context))
