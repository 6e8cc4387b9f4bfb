"""Every policy against every stack in stacks/ (a new stack file is picked up with no change)."""

from __future__ import annotations

import pytest

from infra.clouds.alicloud import rules as ali
from infra.clouds.aws import rules as aws
from infra.clouds.azure import rules as az
from infra.clouds.tencent import rules as tc
from infra.reaper import tags as T
from policy import rules as R
from policy.resources import as_list, refers_to
from tests.policy.conftest import Planned


@pytest.mark.parametrize("rule", R.RULES, ids=lambda r: r.name)
def test_shipped_stack_passes_every_mandatory_policy(shipped: Planned, rule: R.Rule) -> None:
    found = R.evaluate(
        shipped.resources,
        stack_config={"maxHourlyCost": shipped.cfg.max_hourly_cost},
        rules=[rule],
    )
    assert [v.message for v in found if v.level == R.MANDATORY] == []


def test_spot_advice_appears_exactly_on_on_demand_dev_boxes(shipped: Planned) -> None:
    cfg = shipped.cfg
    dev = cfg.tier in R.DEV_TIERS or cfg.tags.get("purpose") == "dev"
    expected = (
        {f"{cfg.stack}-{i}" for i in range(cfg.nodes)} if dev and cfg.billing != "spot" else set()
    )
    advised = {
        v.resource_name for v in R.evaluate(shipped.resources) if v.policy == "dev-stacks-use-spot"
    }
    assert advised == expected


def test_the_policies_had_something_to_judge_on_every_stack(shipped: Planned) -> None:
    """Guards against a vacuous pass: the stack's nodes, buckets and SSH rules are all there,
    and every bucket is linked to its public access block and TLS policy."""
    res = shipped.resources
    nodes = [r for r in res if R.is_gpu_instance(r, R.catalog_gpu_types)]
    assert len(nodes) == shipped.cfg.nodes
    assert all(n.tags[T.STACK] == shipped.cfg.stack for n in nodes)
    if shipped.cfg.provider == "azure":
        # Azure's account is private and TLS-only by its own properties, the NSG inline
        accounts = [r for r in res if r.type == az.STORAGE_ACCOUNT]
        # the data account, the Functions host's and the package's (infra/clouds/azure/program.py)
        assert len(accounts) == 3
        (nsg,) = [r for r in res if r.type == az.NSG]
        rules = nsg.get("securityRules")
        assert len(rules) >= len(shipped.cfg.ssh_cidrs) + 1
        return
    buckets = [r for r in res if R.bucket_kind(r.type)]
    assert len(buckets) == 1
    kind = R.bucket_kind(buckets[0].type)
    assert kind is not None
    # A cloud without a public-access-block resource (COS) is held to its bucket's own ACL.
    attached = (kind.policy_type,) if kind.required_acl else (kind.block_type, kind.policy_type)
    if kind.required_acl:
        assert buckets[0].get("acl") == kind.required_acl
    for attached_type in attached:
        assert [r for r in res if r.type == attached_type and refers_to(r, "bucket", buckets[0])]
    ssh_rules = [r for r in res if r.type in (aws.SG_INGRESS, ali.SG_RULE)]
    # Tencent declares its rules as one rule set: each ingress entry is a rule.
    for rule_set in (r for r in res if r.type == tc.SG_RULE_SET):
        ssh_rules += as_list(rule_set.get("ingresses"))
    assert len(ssh_rules) >= len(shipped.cfg.ssh_cidrs) + 1  # + the rule between the nodes
