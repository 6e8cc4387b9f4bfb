"""What the guards rely on, decided by the RAM evaluator (tests/infra/alicloud_ram.py) on
the documents a shipped Alicloud stack declares under Pulumi's mocks, role by role as the
stack attaches them: the node may stop itself and write its own lease and nothing more,
the reaper may stop only its stack's instances and delete nothing, and the bucket refuses
plain HTTP."""

from __future__ import annotations

import functools
import json
from typing import Any

from infra.offline import PlanResult
from infra.reaper import tags as T
from tests.infra.alicloud_ram import Request, allowed, decide
from tests.infra.conftest import STACKS, planned

ARN = "acs:ecs:cn-shanghai:123456789012:instance/{}"


@functools.cache
def _plan() -> tuple[str, PlanResult]:
    cfg, result = planned(STACKS / "Pulumi.a100x4.yaml")
    return cfg.stack, result


def _documents_of_role(role_name: str) -> list[dict[str, Any]]:
    _, result = _plan()
    policies = {
        p.inputs["policyName"]: json.loads(p.inputs["policyDocument"])
        for p in result.of_type("alicloud:ram/policy:Policy")
    }
    attached = [
        a.inputs["policyName"]
        for a in result.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
        if a.inputs["roleName"] == role_name
    ]
    assert attached, role_name
    return [policies[name] for name in attached]


def _node() -> tuple[str, list[dict[str, Any]]]:
    _, result = _plan()
    (instance,) = result.of_type("alicloud:ecs/instance:Instance")
    return instance.id, _documents_of_role(instance.inputs["roleName"])


def _context(stack: str, **request_tags: str) -> dict[str, str]:
    own = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: stack}
    context = {f"acs:ResourceTag/{k}": v for k, v in own.items()}
    context.update({f"acs:RequestTag/{k}": v for k, v in request_tags.items()})
    return context


def test_the_planned_node_may_stop_itself_and_write_its_own_lease() -> None:
    stack, _ = _plan()
    iid, docs = _node()
    assert allowed(docs, Request("ecs:StopInstance", ARN.format(iid), _context(stack)))
    lease = {T.KEEP_ALIVE_UNTIL: "2026-12-01T12:00:00Z"}
    assert allowed(docs, Request("ecs:TagResources", ARN.format(iid), _context(stack, **lease)))
    # what the watchdog reads and writes besides: its tags, its metrics, its bucket only
    assert allowed(docs, Request("ecs:ListTagResources", ARN.format(iid)))
    assert allowed(docs, Request("cms:PutCustomMetric", "*"))
    _, result = _plan()
    (bucket,) = result.of_type("alicloud:oss/bucket:Bucket")
    name = bucket.inputs["bucket"]
    assert allowed(docs, Request("oss:PutObject", f"acs:oss:*:*:{name}/checkpoints/x.pt"))
    assert not allowed(docs, Request("oss:PutObject", "acs:oss:*:*:someone-else/x.pt"))
    assert not allowed(docs, Request("oss:DeleteBucket", f"acs:oss:*:*:{name}"))


def test_the_planned_node_may_not_protect_itself_delete_itself_or_stop_others() -> None:
    stack, _ = _plan()
    iid, docs = _node()
    own = ARN.format(iid)
    protect = _context(stack, **{T.PROTECTED: "true", T.KEEP_ALIVE_UNTIL: "x"})
    assert decide(docs, Request("ecs:TagResources", own, protect)) == "Deny"
    for action in ("ecs:DeleteInstance", "ecs:DeleteInstances", "ecs:ModifyInstanceAttribute"):
        assert not allowed(docs, Request(action, own, _context(stack))), action
    assert not allowed(docs, Request("ecs:StopInstance", ARN.format("i-other"), _context(stack)))
    assert not allowed(docs, Request("ecs:StopInstances", own, _context(stack)))


def test_the_planned_reaper_may_stop_only_its_stacks_managed_instances() -> None:
    stack, _ = _plan()
    docs = _documents_of_role(f"gpufleet-{stack}-reaper")
    target = ARN.format("i-any")
    assert allowed(docs, Request("ecs:StopInstances", target, _context(stack)))
    assert not allowed(docs, Request("ecs:StopInstances", target, _context("other")))
    unmanaged = {f"acs:ResourceTag/{T.STACK}": stack}
    assert not allowed(docs, Request("ecs:StopInstances", target, unmanaged))
    for action in ("ecs:DeleteInstance", "ecs:StartInstance", "ecs:TagResources"):
        assert not allowed(docs, Request(action, target, _context(stack))), action
    assert allowed(docs, Request("cms:DescribeMetricList", "*"))
    assert allowed(docs, Request("ecs:DescribeInstances", "*"))


def test_the_planned_bucket_refuses_plain_http_and_only_plain_http() -> None:
    _, result = _plan()
    (policy,) = result.of_type("alicloud:oss/bucketPolicy:BucketPolicy")
    doc = json.loads(policy.inputs["policy"])
    bucket = policy.inputs["bucket"]
    obj = f"acs:oss:*:*:{bucket}/checkpoints/x.pt"
    plain = Request("oss:GetObject", obj, {"acs:SecureTransport": "false"})
    tls = Request("oss:GetObject", obj, {"acs:SecureTransport": "true"})
    assert decide([doc], plain) == "Deny"
    assert decide([doc], tls) == "ImplicitDeny"  # not denied: the node's role allows it
