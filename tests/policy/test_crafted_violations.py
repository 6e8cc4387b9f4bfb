"""Crafted violations: each one a small mutation of a real stack's recorded resources.

Every case must be caught by exactly the policy it targets, at its level, with a message that
names the offending resource and says how to fix it; the untouched plan passes (see
test_shipped_stacks.py), so each mutation alone is what trips the policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from infra.clouds.alicloud import rules as ali
from infra.clouds.aws import rules as aws
from infra.clouds.tencent import rules as tc
from infra.reaper import tags as T
from policy import rules as R
from policy.resources import UNKNOWN, Resource
from tests.policy.conftest import Planned, planned

Mutation = Callable[[Planned], list[Resource]]


@dataclass(frozen=True)
class Case:
    id: str
    stack: str
    mutate: Mutation
    policy: str
    names: str  # the resource the message must name
    fix: str  # a fragment of the how-to-fix
    level: str = R.MANDATORY
    config: dict[str, Any] = field(default_factory=dict)
    also: frozenset[str] = frozenset()  # other policies the same mutation rightly trips


def set_input(type_: str, suffix: str, **changes: Any) -> Mutation:
    def mutate(p: Planned) -> list[Resource]:
        def change(inputs: dict[str, Any]) -> None:
            for key, value in changes.items():
                if value is DROP:
                    inputs.pop(key, None)
                else:
                    inputs[key] = value

        return p.mutate(p.one(type_, suffix), change)

    return mutate


def edit(type_: str, suffix: str, change: Callable[[dict[str, Any]], None]) -> Mutation:
    return lambda p: p.mutate(p.one(type_, suffix), change)


def drop(type_: str, suffix: str = "") -> Mutation:
    return lambda p: p.without(p.one(type_, suffix))


DROP = object()


def _tag(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        if value is DROP:
            inputs["tags"].pop(key)
        else:
            inputs["tags"][key] = value

    return change


def _policy_doc(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def outer(inputs: dict[str, Any]) -> None:
        doc = json.loads(inputs["policy"])
        change(doc["Statement"][0])
        inputs["policy"] = json.dumps(doc)

    return outer


def _env(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        env = (
            inputs["environment"]["variables"]
            if "environment" in inputs
            else inputs["environmentVariables"]
        )
        env[key] = value

    return change


def _trigger_config(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        inputs["triggerConfig"] = json.dumps({**json.loads(inputs["triggerConfig"]), **changes})

    return change


def _extra_node(p: Planned) -> list[Resource]:
    """A third p5.48xlarge slipped into the two-node stack."""
    import dataclasses

    node = p.one(aws.INSTANCE, "-1")
    return [*p.resources, dataclasses.replace(node, name=f"{p.cfg.stack}-2", ids=frozenset())]


def _set_ebs(inputs: dict[str, Any]) -> None:
    inputs["ebsBlockDevices"] = [
        {"deviceName": "/dev/sdf", "volumeSize": 500, "volumeType": "gp3", "encrypted": False}
    ]


def _cpu_stop_alarm(action: str, key: str = "alarmActions") -> Mutation:
    """The CPU backstop gpufleet used to declare: CPU Maximum < 2 % for 24 x 5 min -> stop."""

    def mutate(p: Planned) -> list[Resource]:
        node = p.one(aws.INSTANCE, "-0")
        alarm = Resource(
            aws.METRIC_ALARM,
            f"{node.name}-cpu-backstop",
            {
                "namespace": "AWS/EC2",
                "metricName": "CPUUtilization",
                "dimensions": {"InstanceId": "i-0123456789abcdef0"},
                "statistic": "Maximum",
                "period": 300,
                "evaluationPeriods": 24,
                "threshold": 2.0,
                "comparisonOperator": "LessThanThreshold",
                key: [action],
            },
        )
        return [*p.resources, alarm]

    return mutate


def _tc_ingress(index: int, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        rule = inputs["ingresses"][index]
        for key, value in changes.items():
            if value is DROP:
                rule.pop(key, None)
            else:
                rule[key] = value

    return change


def _tc_disk_unencrypted(inputs: dict[str, Any]) -> None:
    inputs["dataDisks"][0]["encrypt"] = False


def _tc_timer_dropped(inputs: dict[str, Any]) -> None:
    inputs["triggers"] = []


def _cos_tls_spelled_as_before(inputs: dict[str, Any]) -> None:
    """The undocumented spelling the stack once wrote: operator ``bool``, key
    ``cos:secure_transport``; COS documents bool_equal on cos:secure-transport."""
    doc = json.loads(inputs["policy"])
    doc["statement"][0]["condition"] = {"bool": {"cos:secure_transport": "false"}}
    inputs["policy"] = json.dumps(doc)


def _tc_env(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        inputs["environment"][key] = value

    return change


SG_INGRESS = aws.SG_INGRESS
AWS_SSE = aws.BUCKET_SSE[0]
CASES = [
    # --- SSH never open to the world --------------------------------------------------------
    Case(
        "aws-ssh-rule-from-anywhere",
        "t4x1",
        set_input(SG_INGRESS, "-ssh-0", cidrIpv4="0.0.0.0/0"),
        "ssh-not-open-to-world",
        "t4x1-ssh-0",
        "gpufleet:sshCidrs",
    ),
    Case(
        "aws-all-protocols-from-ipv6-anywhere",
        "a100x8",
        set_input(SG_INGRESS, "-intra", referencedSecurityGroupId=DROP, cidrIpv6="::/0"),
        "ssh-not-open-to-world",
        "a100x8-intra",
        "bastion",
    ),
    Case(
        "aws-inline-ingress-on-the-security-group",
        "t4x1",
        set_input(
            aws.SG,
            "-sg",
            ingress=[
                {"protocol": "tcp", "fromPort": 0, "toPort": 65535, "cidrBlocks": ["0.0.0.0/0"]}
            ],
        ),
        "ssh-not-open-to-world",
        "t4x1-sg",
        "ingress[0]",
    ),
    Case(
        "alicloud-ssh-rule-from-anywhere",
        "a10x1",
        set_input(ali.SG_RULE, "-ssh-0", cidrIp="0.0.0.0/0"),
        "ssh-not-open-to-world",
        "a10x1-ssh-0",
        "gpufleet:sshCidrs",
    ),
    Case(
        "alicloud-every-port-from-anywhere",
        "a100x4",
        set_input(ali.SG_RULE, "-intra", sourceSecurityGroupId=DROP, cidrIp="0.0.0.0/0"),
        "ssh-not-open-to-world",
        "a100x4-intra",
        "gpufleet:sshCidrs",
    ),
    # --- IMDSv2 -------------------------------------------------------------------------------
    Case(
        "aws-instance-allows-imdsv1",
        "t4x1",
        edit(aws.INSTANCE, "-0", lambda i: i["metadataOptions"].update(httpTokens="optional")),
        "imdsv2-required",
        "t4x1-0",
        "http_tokens='required'",
    ),
    Case(
        "aws-instance-without-metadata-options",
        "a100x8",
        set_input(aws.INSTANCE, "-0", metadataOptions=DROP),
        "imdsv2-required",
        "a100x8-0",
        "InstanceMetadataOptionsArgs(http_tokens='required')",
    ),
    Case(
        "aws-launch-template-without-metadata-options",
        "h100x8x2",
        set_input(aws.LAUNCH_TEMPLATE, "-1-efa", metadataOptions=DROP),
        "imdsv2-required",
        "h100x8x2-1-efa",
        "LaunchTemplateMetadataOptionsArgs(http_tokens='required')",
    ),
    Case(
        "alicloud-instance-allows-imdsv1",
        "a100x1",
        set_input(ali.INSTANCE, "-0", httpTokens="optional"),
        "imdsv2-required",
        "a100x1-0",
        "http_tokens='required'",
    ),
    # --- disks --------------------------------------------------------------------------------
    Case(
        "aws-root-volume-unencrypted",
        "a10x1-aws",
        edit(aws.INSTANCE, "-0", lambda i: i["rootBlockDevice"].update(encrypted=False)),
        "disks-encrypted",
        "a10x1-aws-0",
        "encrypted=True",
    ),
    Case(
        "aws-root-volume-left-to-the-ami-default",
        "t4x1",
        set_input(aws.INSTANCE, "-0", rootBlockDevice=DROP),
        "disks-encrypted",
        "t4x1-0",
        "InstanceRootBlockDeviceArgs(encrypted=True",
    ),
    Case(
        "aws-scratch-volume-unencrypted",
        "t4x1",
        edit(aws.INSTANCE, "-0", _set_ebs),
        "disks-encrypted",
        "t4x1-0",
        "ebsBlockDevices[0] (/dev/sdf)",
    ),
    Case(
        "alicloud-system-disk-unencrypted",
        "a100x4",
        set_input(ali.INSTANCE, "-0", systemDiskEncrypted=False),
        "disks-encrypted",
        "a100x4-0",
        "system_disk_encrypted=True",
    ),
    Case(
        "alicloud-scratch-disk-unencrypted",
        "a10x1",
        edit(ali.INSTANCE, "-0", lambda i: i["dataDisks"][0].update(encrypted=False)),
        "disks-encrypted",
        "a10x1-0",
        "dataDisks[0] (a10x1-0-scratch)",
    ),
    # --- buckets encrypted --------------------------------------------------------------------
    Case(
        "s3-bucket-without-encryption-configuration",
        "a100x8",
        drop(AWS_SSE),
        "buckets-encrypted",
        "a100x8-bucket",
        "BucketServerSideEncryptionConfiguration",
    ),
    Case(
        "s3-encryption-configuration-for-another-bucket",
        "t4x1",
        set_input(AWS_SSE, "-sse", bucket="somebody-elses-bucket"),
        "buckets-encrypted",
        "t4x1-bucket",
        "sse_algorithm 'AES256'",
    ),
    Case(
        "oss-bucket-without-encryption",
        "a100x4",
        set_input(ali.BUCKET, "-bucket", serverSideEncryptionRule=DROP),
        "buckets-encrypted",
        "a100x4-bucket",
        "sse_algorithm='AES256'",
    ),
    # --- buckets private and TLS-only ---------------------------------------------------------
    Case(
        "s3-public-access-block-with-a-flag-off",
        "h100x8x2",
        set_input(aws.BUCKET_PAB, "", restrictPublicBuckets=False),
        "buckets-private-tls-only",
        "h100x8x2-bucket",
        "leaves restrictPublicBuckets off",
    ),
    Case(
        "s3-without-public-access-block",
        "t4x1",
        drop(aws.BUCKET_PAB),
        "buckets-private-tls-only",
        "t4x1-bucket",
        "restrict_public_buckets all True",
    ),
    Case(
        "s3-public-read-acl",
        "a10x1-aws",
        set_input(aws.BUCKETS[0], "-bucket", acl="public-read"),
        "buckets-private-tls-only",
        "a10x1-aws-bucket",
        "use 'private'",
    ),
    Case(
        "s3-policy-allows-instead-of-denying-plain-http",
        "t4x1",
        edit(aws.BUCKET_POLICY, "", _policy_doc(lambda st: st.update(Effect="Allow"))),
        "buckets-private-tls-only",
        "t4x1-bucket",
        "aws:SecureTransport is false",
    ),
    Case(
        # a principal map is read by the bucket's own cloud: IAM's key is "AWS", and COS's
        # "everyone" means nothing to S3 (each cloud's rules.py names its own)
        "s3-policy-denies-only-another-clouds-everyone",
        "t4x1",
        edit(
            aws.BUCKET_POLICY,
            "",
            _policy_doc(lambda st: st.update(Principal={"qcs": ["qcs::cam::anyone:anyone"]})),
        ),
        "buckets-private-tls-only",
        "t4x1-bucket",
        "aws:SecureTransport is false",
    ),
    Case(
        "s3-without-tls-policy",
        "a100x8",
        drop(aws.BUCKET_POLICY),
        "buckets-private-tls-only",
        "a100x8-bucket",
        "aws.s3.BucketPolicy",
    ),
    Case(
        "oss-acl-public-read-write",
        "a10x1",
        set_input(ali.BUCKET_ACL, "", acl="public-read-write"),
        "buckets-private-tls-only",
        "a10x1-acl",
        "use 'private'",
    ),
    Case(
        "oss-public-access-block-off",
        "a100x1",
        set_input(ali.BUCKET_PAB, "", blockPublicAccess=False),
        "buckets-private-tls-only",
        "a100x1-bucket",
        "block_public_access=True",
    ),
    Case(
        "oss-policy-denies-only-tls-requests",
        "a100x4",
        edit(
            ali.BUCKET_POLICY,
            "",
            _policy_doc(
                lambda st: st["Condition"]["Bool"].update({"acs:SecureTransport": ["true"]})
            ),
        ),
        "buckets-private-tls-only",
        "a100x4-bucket",
        "acs:SecureTransport is false",
    ),
    # --- GPU tags -----------------------------------------------------------------------------
    Case(
        "gpu-node-without-watchdog-tag",
        "a100x8",
        edit(aws.INSTANCE, "-0", _tag(T.WATCHDOG, DROP)),
        "gpu-instances-tagged",
        "a100x8-0",
        f"{T.WATCHDOG}=on",
        also=frozenset({"gpu-instances-idle-guarded"}),
    ),
    Case(
        "gpu-node-with-an-unknown-role",
        "h100x8x2",
        edit(aws.INSTANCE, "-1", _tag(T.ROLE, "leader")),
        "gpu-instances-tagged",
        "h100x8x2-1",
        "node_tags",
    ),
    Case(
        "gpu-node-with-unreadable-idle-minutes",
        "a10x1",
        edit(ali.INSTANCE, "-0", _tag(T.IDLE_MINUTES, "soon")),
        "gpu-instances-tagged",
        "a10x1-0",
        f"{T.IDLE_MINUTES} (minutes > 0)",
    ),
    Case(
        "gpu-node-not-marked-managed",
        "t4x1",
        edit(aws.INSTANCE, "-0", _tag(T.MANAGED_BY, "terraform")),
        "gpu-instances-tagged",
        "t4x1-0",
        "managed-by=gpufleet",
    ),
    # --- idle guard ---------------------------------------------------------------------------
    Case(
        "aws-reaper-never-scheduled",
        "a100x8",
        drop(aws.EVENT_TARGET),
        "gpu-instances-idle-guarded",
        "a100x8-0",
        "EventTarget from the rule to the function",
    ),
    Case(
        "aws-schedule-disabled",
        "t4x1",
        set_input(aws.EVENT_RULE, "", state="DISABLED"),
        "gpu-instances-idle-guarded",
        "t4x1-0",
        "schedule_expression",
    ),
    Case(
        "aws-events-may-not-invoke-the-reaper",
        "a10x1-aws",
        drop(aws.PERMISSION),
        "gpu-instances-idle-guarded",
        "a10x1-aws-0",
        "Permission for events.amazonaws.com",
    ),
    Case(
        "aws-reaper-in-dry-run",
        "h100x8x2",
        edit(aws.FUNCTION, "", _env("GPUFLEET_APPLY", "false")),
        "gpu-instances-idle-guarded",
        "h100x8x2-0",
        "GPUFLEET_APPLY=true",
    ),
    Case(
        "aws-reaper-for-another-stack",
        "t4x1",
        edit(aws.FUNCTION, "", _env("GPUFLEET_STACK", "someone-else")),
        "gpu-instances-idle-guarded",
        "t4x1-0",
        "GPUFLEET_STACK=<stack>",
    ),
    Case(
        "alicloud-reaper-without-timer",
        "a100x4",
        drop(ali.TRIGGERS[0]),
        "gpu-instances-idle-guarded",
        "a100x4-0",
        "V3Trigger of type 'timer'",
    ),
    Case(
        "alicloud-timer-disabled",
        "a10x1",
        edit(ali.TRIGGERS[0], "", _trigger_config(enable=False)),
        "gpu-instances-idle-guarded",
        "a10x1-0",
        "cronExpression",
    ),
    Case(
        "alicloud-watchdog-opted-out",
        "a100x1",
        edit(ali.INSTANCE, "-0", _tag(T.WATCHDOG, "off")),
        "gpu-instances-idle-guarded",
        "a100x1-0",
        "IdleGuard component",
        also=frozenset({"gpu-instances-tagged"}),
    ),
    # --- no alarm powers a node down ------------------------------------------------------------
    Case(
        "aws-cpu-backstop-alarm-that-stops-the-node",
        "a100x8",
        _cpu_stop_alarm("arn:aws:automate:us-east-1:ec2:stop"),
        "no-blind-stop-alarms",
        "a100x8-0-cpu-backstop",
        "leave stopping to the node watchdog and the scheduled reaper",
    ),
    Case(
        "aws-alarm-that-terminates-on-insufficient-data",
        "h100x8x2",
        _cpu_stop_alarm("ARN:AWS:AUTOMATE:us-east-1:ec2:terminate", "insufficientDataActions"),
        "no-blind-stop-alarms",
        "h100x8x2-0-cpu-backstop",
        "drop the EC2 action",
    ),
    # --- dev boxes on spot (advisory) ---------------------------------------------------------
    Case(
        "dev-box-switched-to-on-demand",
        "t4x1",
        set_input(aws.INSTANCE, "-0", instanceMarketOptions=DROP),
        "dev-stacks-use-spot",
        "t4x1-0",
        "gpufleet:billing: spot",
        R.ADVISORY,
    ),
    Case(
        "big-box-tagged-purpose-dev",
        "a100x4",
        edit(ali.INSTANCE, "-0", _tag("purpose", "dev")),
        "dev-stacks-use-spot",
        "a100x4-0",
        "tag purpose=dev",
        R.ADVISORY,
    ),
    Case(
        "dev-tiers-from-pack-config",
        "a100x8",
        lambda p: list(p.resources),
        "dev-stacks-use-spot",
        "a100x8-0",
        "tier a100x8",
        R.ADVISORY,
        {"dev-stacks-use-spot": {"devTiers": ["a100x8"]}},
    ),
    # --- Tencent Cloud ---------------------------------------------------------------------------
    Case(
        "tencent-ssh-rule-from-anywhere",
        "tencent-a100x4",
        edit(tc.SG_RULE_SET, "-rules", _tc_ingress(0, cidrBlock="0.0.0.0/0")),
        "ssh-not-open-to-world",
        "tencent-a100x4-rules",
        "gpufleet:sshCidrs",
    ),
    Case(
        "tencent-every-port-from-ipv6-anywhere",
        "tencent-t4x1",
        edit(
            tc.SG_RULE_SET,
            "-rules",
            _tc_ingress(1, sourceSecurityId=DROP, ipv6CidrBlock="::/0"),
        ),
        "ssh-not-open-to-world",
        "tencent-t4x1-rules",
        "ingresses[1]",
    ),
    Case(
        "tencent-scratch-disk-unencrypted",
        "tencent-a100x4",
        edit(tc.INSTANCE, "-0", _tc_disk_unencrypted),
        "disks-encrypted",
        "tencent-a100x4-0",
        "encrypt=True",
    ),
    Case(
        "tencent-cos-bucket-without-encryption",
        "tencent-a100x4",
        set_input(tc.BUCKET, "-bucket", encryptionAlgorithm=""),
        "buckets-encrypted",
        "tencent-a100x4-bucket",
        "encryption_algorithm='AES256'",
    ),
    Case(
        "tencent-cos-bucket-public-read",
        "tencent-a100x4",
        set_input(tc.BUCKET, "-bucket", acl="public-read"),
        "buckets-private-tls-only",
        "tencent-a100x4-bucket",
        "'private'",
    ),
    Case(
        "tencent-cos-bucket-without-tls-policy",
        "tencent-t4x1",
        drop(tc.BUCKET_POLICY, "-tls-only"),
        "buckets-private-tls-only",
        "tencent-t4x1-bucket",
        "cos:secure-transport",
    ),
    Case(
        "tencent-cos-tls-policy-in-an-undocumented-spelling",
        "tencent-t4x1",
        edit(tc.BUCKET_POLICY, "-tls-only", _cos_tls_spelled_as_before),
        "buckets-private-tls-only",
        "tencent-t4x1-bucket",
        "bool_equal",
    ),
    Case(
        "tencent-reaper-without-timer",
        "tencent-a100x4",
        edit(tc.FUNCTIONS[0], "-reaper", _tc_timer_dropped),
        "gpu-instances-idle-guarded",
        "tencent-a100x4-0",
        "trigger of type 'timer'",
    ),
    Case(
        "tencent-reaper-dry-run",
        "tencent-t4x1",
        edit(tc.FUNCTIONS[0], "-reaper", _tc_env("GPUFLEET_APPLY", "false")),
        "gpu-instances-idle-guarded",
        "tencent-t4x1-0",
        "a dry run stops nothing",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_crafted_violation_is_caught_naming_the_resource_and_the_fix(case: Case) -> None:
    p = planned(case.stack)
    resources = case.mutate(p)
    found = R.evaluate(
        resources, case.config, stack_config={"maxHourlyCost": p.cfg.max_hourly_cost}
    )
    assert {v.policy for v in found if v.level == R.MANDATORY} <= {case.policy, *case.also}
    hits = [v for v in found if v.policy == case.policy]
    assert any(v.resource_name == case.names for v in hits), f"{case.policy} missed {case.id}"
    for v in hits:  # a stack-wide fault is reported once per node it leaves exposed
        assert v.level == case.level
        assert v.resource_name is not None and v.resource_name in v.message, v.message
        assert case.fix in v.message, v.message


# --- cost ceiling: numbers from the catalog, the same as `make plan` prints ---------------------


def cost_violations(
    resources: list[Resource], config: dict[str, Any] | None = None, **stack: Any
) -> list[R.Violation]:
    return [
        v for v in R.evaluate(resources, config, stack_config=stack) if v.policy == "cost-ceiling"
    ]


def test_a_third_h100_node_breaks_the_stacks_ceiling() -> None:
    p = planned("h100x8x2")  # 2x p5.48xlarge = 110.08 USD/h, ceiling 120
    assert cost_violations(list(p.resources), maxHourlyCost=120) == []
    [v] = cost_violations(_extra_node(p), maxHourlyCost=120)
    assert v.level == R.MANDATORY and v.resource_name is None  # the stack as a whole
    assert "165.12 USD/h" in v.message and "3x p5.48xlarge on-demand" in v.message
    assert "maxHourlyCost=120" in v.message and "fewer or smaller nodes" in v.message


def test_the_pack_config_ceiling_overrides_the_stacks_own() -> None:
    p = planned("h100x8x2")
    [v] = cost_violations(
        list(p.resources), {"cost-ceiling": {"maxHourlyCost": 100}}, maxHourlyCost=120
    )
    assert "110.08 USD/h" in v.message and "maxHourlyCost=100" in v.message


def test_spot_is_priced_at_the_top_of_its_range() -> None:
    p = planned("t4x1")  # g4dn.xlarge spot: 0.1578-0.3682 USD/h
    assert cost_violations(list(p.resources), maxHourlyCost=0.4) == []
    [v] = cost_violations(list(p.resources), maxHourlyCost=0.3)
    assert "0.3682 USD/h" in v.message and "1x g4dn.xlarge spot" in v.message


def test_alicloud_ceilings_are_in_yuan() -> None:
    p = planned("a100x4")  # ecs.gn7-c13g1.13xlarge on-demand 126.33 CNY/h
    [v] = cost_violations(list(p.resources), maxHourlyCost=100)
    assert "126.33 CNY/h" in v.message


def test_a_stack_without_a_ceiling_is_reported_only_when_the_pack_requires_one() -> None:
    p = planned("a100x8")
    assert cost_violations(list(p.resources)) == []
    [v] = cost_violations(list(p.resources), {"cost-ceiling": {"requireCeiling": True}})
    assert "gpufleet:maxHourlyCost" in v.message


def test_an_unpriced_instance_type_fails_a_ceiling_closed() -> None:
    p = planned("t4x1")
    node = p.one(aws.INSTANCE, "-0")
    resources = p.mutate(node, lambda i: i.update(instanceType="g99.mystery"))
    [v] = cost_violations(resources, maxHourlyCost=1)
    assert "no catalog price for 1x g99.mystery" in v.message


# --- what must NOT be reported ------------------------------------------------------------------


def test_a_world_rule_on_another_port_or_that_drops_traffic_is_fine() -> None:
    p = planned("a10x1")
    rule = p.one(ali.SG_RULE, "-ssh-0")
    https = p.mutate(rule, lambda i: i.update(cidrIp="0.0.0.0/0", portRange="443/443"))
    drop_rule = p.mutate(rule, lambda i: i.update(cidrIp="0.0.0.0/0", policy="drop"))
    for resources in (https, drop_rule):
        assert [v for v in R.evaluate(resources) if v.policy == "ssh-not-open-to-world"] == []


def test_values_unknown_during_preview_are_not_reported() -> None:
    """The engine re-runs policies with the real values before creating anything."""
    p = planned("t4x1")
    node = p.one(aws.INSTANCE, "-0")
    unknown = p.mutate(node, lambda i: i["metadataOptions"].update(httpTokens=UNKNOWN))
    assert [v for v in R.evaluate(unknown) if v.policy == "imdsv2-required"] == []
    policy = p.one(aws.BUCKET_POLICY)
    unknown_doc = p.mutate(policy, lambda i: i.update(policy=UNKNOWN))
    assert [v for v in R.evaluate(unknown_doc) if v.level == R.MANDATORY] == []


def test_pack_config_can_downgrade_or_disable_a_policy() -> None:
    p = planned("t4x1")
    open_ssh = set_input(SG_INGRESS, "-ssh-0", cidrIpv4="0.0.0.0/0")(p)
    advisory = R.evaluate(open_ssh, {"ssh-not-open-to-world": "advisory"})
    assert [v.level for v in advisory if v.policy == "ssh-not-open-to-world"] == [R.ADVISORY]
    disabled = R.evaluate(open_ssh, {"ssh-not-open-to-world": {"enforcementLevel": "disabled"}})
    assert [v for v in disabled if v.policy == "ssh-not-open-to-world"] == []


@pytest.mark.parametrize(
    "config, complaint",
    [
        ({"ssh-open": "advisory"}, "no such policy"),
        ({"imdsv2-required": "warn"}, "not one of"),
        ({"cost-ceiling": 12}, "expected a level or an object"),
    ],
)
def test_a_wrong_pack_config_is_refused_with_the_reason(
    config: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(R.PolicyConfigError, match=complaint):
        R.evaluate(list(planned("t4x1").resources), config)


def test_an_alarm_that_only_notifies_or_recovers_is_allowed() -> None:
    p = planned("a100x8")
    for action in (
        "arn:aws:sns:us-east-1:123456789012:gpufleet-alerts",
        "arn:aws:automate:us-east-1:ec2:recover",
    ):
        found = R.evaluate(_cpu_stop_alarm(action)(p))
        assert not [v for v in found if v.policy == "no-blind-stop-alarms"], action
