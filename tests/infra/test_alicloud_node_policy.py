"""The Alicloud node role may write only its lease tag, and only on its stack's instances.

RAM has no simulator we can run here, so the document is judged by a small evaluator of the
parts of RAM's documented semantics it uses: Allow/Deny statements, Action, Resource with `*`
wildcards, the StringEquals and Null operators on acs:ResourceTag/<key> and
acs:RequestTag/<key>, and "an explicit Deny beats any Allow".
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest

from infra.providers.alicloud import GUARDED_TAG_KEYS, node_policy
from infra.reaper import tags as T

STACK = "a100x4"
OWN = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK}
ARN = "acs:ecs:cn-shanghai:123456789012:instance/i-own"
LEASE = {T.KEEP_ALIVE_UNTIL: "2026-12-01T12:00:00Z"}


def _matches(condition: dict[str, Any], resource_tags: dict[str, str], request: dict[str, str]):
    def value(key: str) -> str | None:
        if key.startswith("acs:ResourceTag/"):
            return resource_tags.get(key.split("/", 1)[1])
        if key.startswith("acs:RequestTag/"):
            return request.get(key.split("/", 1)[1])
        raise AssertionError(f"the evaluator does not know the condition key {key}")

    for operator, clauses in condition.items():
        for key, expected in clauses.items():
            actual = value(key)
            if operator == "StringEquals":
                if actual not in (expected if isinstance(expected, list) else [expected]):
                    return False
            elif operator == "Null":
                if (actual is None) != (str(expected).lower() == "true"):
                    return False
            else:
                raise AssertionError(f"the evaluator does not know the operator {operator}")
    return True


def allowed(action: str, resource: str, resource_tags: dict[str, str], request: dict[str, str]):
    doc = json.loads(node_policy("gpufleet-a100x4-abc", STACK))
    verdict = False
    for st in doc["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if not any(fnmatch.fnmatchcase(action, a) for a in actions):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in resources):
            continue
        if not _matches(st.get("Condition", {}), resource_tags, request):
            continue
        if st["Effect"] == "Deny":
            return False
        verdict = True
    return verdict


def test_the_node_may_write_its_lease_on_its_own_stacks_instance():
    assert allowed("ecs:TagResources", ARN, OWN, LEASE)


@pytest.mark.parametrize("key", GUARDED_TAG_KEYS)
def test_the_node_may_not_write_a_tag_the_guards_decide_on(key):
    assert not allowed("ecs:TagResources", ARN, OWN, {key: "x"})
    # smuggled in next to a lease, it is refused just the same
    assert not allowed("ecs:TagResources", ARN, OWN, {**LEASE, key: "x"})


def test_a_request_without_the_lease_tag_is_not_allowed():
    assert not allowed("ecs:TagResources", ARN, OWN, {"team": "ml"})


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
