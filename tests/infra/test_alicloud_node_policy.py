"""The Alicloud node role may write only its lease tag, and only on its own instance.

RAM has no simulator we can run here, so the documents are judged by the evaluator of
RAM's documented semantics in tests/infra/alicloud_ram.py (its own tests are RAM's
documentation examples): Allow/Deny, Action and Resource with `*` wildcards, the
condition operators RAM documents on acs:ResourceTag/<key> and acs:RequestTag/<key>,
and "an explicit Deny overrides any Allow".
"""

from __future__ import annotations

import json

import pytest

from infra.clouds.alicloud.program import GUARDED_TAG_KEYS, lease_policy, node_policy
from infra.reaper import tags as T
from tests.infra.alicloud_ram import Request
from tests.infra.alicloud_ram import allowed as ram_allows

STACK = "a100x4"
OWN = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK}
ARN = "acs:ecs:cn-shanghai:123456789012:instance/i-own"
LEASE = {T.KEEP_ALIVE_UNTIL: "2026-12-01T12:00:00Z"}


def allowed(action: str, resource: str, resource_tags: dict[str, str], request: dict[str, str]):
    # what the node's own role carries: the stack's node policy plus its own lease policy
    documents = [
        json.loads(node_policy("gpufleet-a100x4-abc", STACK)),
        json.loads(lease_policy("i-own", STACK)),
    ]
    context = {f"acs:ResourceTag/{k}": v for k, v in resource_tags.items()}
    context.update({f"acs:RequestTag/{k}": v for k, v in request.items()})
    return ram_allows(documents, Request(action, resource, context))


def test_the_node_may_write_its_lease_on_its_own_stacks_instance():
    assert allowed("ecs:TagResources", ARN, OWN, LEASE)


@pytest.mark.parametrize("key", GUARDED_TAG_KEYS)
def test_the_node_may_not_write_a_tag_the_guards_decide_on(key):
    assert not allowed("ecs:TagResources", ARN, OWN, {key: "x"})
    # smuggled in next to a lease, it is refused just the same
    assert not allowed("ecs:TagResources", ARN, OWN, {**LEASE, key: "x"})


def test_a_request_without_the_lease_tag_is_not_allowed():
    assert not allowed("ecs:TagResources", ARN, OWN, {"team": "ml"})


def test_the_node_may_not_write_a_lease_on_a_sibling_node_of_its_stack():
    sibling = "acs:ecs:cn-shanghai:123456789012:instance/i-sibling"
    assert not allowed("ecs:TagResources", sibling, OWN, LEASE)


def test_the_node_may_not_tag_another_stacks_or_an_unmanaged_instance():
    assert not allowed("ecs:TagResources", ARN, {**OWN, T.STACK: "other"}, LEASE)
    assert not allowed("ecs:TagResources", ARN, {T.STACK: STACK}, LEASE)
    assert not allowed("ecs:TagResources", "acs:ecs:*:*:disk/d-1", OWN, LEASE)


def test_the_node_may_never_remove_tags():
    for action in ("ecs:UntagResources", "ecs:RemoveTags"):
        assert not allowed(action, ARN, OWN, {T.PROTECTED: "true"})
        assert not allowed(action, ARN, OWN, LEASE)


def test_every_tag_in_the_contract_but_the_lease_is_guarded():
    contract = {
        v
        for k, v in vars(T).items()
        if k.isupper() and isinstance(v, str) and k != "MANAGED_BY_VALUE"
    }
    assert set(GUARDED_TAG_KEYS) == contract - {T.KEEP_ALIVE_UNTIL}


def test_each_alicloud_node_runs_as_its_own_role_whose_lease_policy_names_its_instance():
    from tests.infra.conftest import STACKS, planned

    cfg, result = planned(STACKS / "Pulumi.a100x4.yaml")
    (node,) = result.of_type("alicloud:ecs/instance:Instance")
    roles = {r.inputs["roleName"] for r in result.of_type("alicloud:ram/role:Role")}
    assert node.inputs["roleName"] == f"gpufleet-{cfg.stack}-0" and node.inputs["roleName"] in roles
    policies = {p.inputs["policyName"]: p for p in result.of_type("alicloud:ram/policy:Policy")}
    lease = json.loads(policies[f"gpufleet-{cfg.stack}-0-lease"].inputs["policyDocument"])
    assert lease["Statement"][0]["Resource"] == [f"acs:ecs:*:*:instance/{node.id}"]
    attached = {
        (a.inputs["roleName"], a.inputs["policyName"])
        for a in result.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert (node.inputs["roleName"], f"gpufleet-{cfg.stack}-0-lease") in attached
    assert (node.inputs["roleName"], f"gpufleet-{cfg.stack}-node") in attached
    # no other policy of the stack lets anything tag an instance
    for name, p in policies.items():
        if name != f"gpufleet-{cfg.stack}-0-lease":
            for st in json.loads(p.inputs["policyDocument"])["Statement"]:
                assert st["Effect"] == "Deny" or "ecs:TagResources" not in st["Action"], name
