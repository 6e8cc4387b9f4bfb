"""What the policy pack knows about AWS's resource types: SSH in security groups, IMDSv2,
EBS and S3 encryption, S3's public access block and TLS-only policy, the Lambda reaper
and its EventBridge schedule, alarms that stop instances, and how an EC2 instance is
billed. policy/rules.py finds this module by its folder and asks it about the resources
whose type token starts with ``aws:``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.reaper import tags as T
from policy.resources import (
    SSH_FIX,
    UNKNOWN,
    Bill,
    BucketKind,
    CloudFacts,
    Resource,
    StackFinding,
    as_list,
    attached,
    covers_ssh,
    imds_tokens_problem,
    known,
    mapping_at,
    positive,
    refers_to,
    unencrypted,
    world,
)

NAME = "aws"

INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EBS_VOLUME = "aws:ebs/volume:Volume"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
BUCKET_ACLS = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
FUNCTION = "aws:lambda/function:Function"
PERMISSION = "aws:lambda/permission:Permission"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
COMPOSITE_ALARM = "aws:cloudwatch/compositeAlarm:CompositeAlarm"

S3_SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")


# ---------------------------------------------------------------------------- SSH to world


def ssh_findings(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == SG_INGRESS:
        if covers_ssh(r.get("ipProtocol"), r.get("fromPort"), r.get("toPort")):
            for key in ("cidrIpv4", "cidrIpv6"):
                if world(r.get(key)):
                    found.append(f"{r.label} lets {r.get(key)} reach SSH (port 22): {SSH_FIX}")
    elif r.type == SG_RULE:
        if str(r.get("type")) == "ingress" and covers_ssh(
            r.get("protocol"), r.get("fromPort"), r.get("toPort")
        ):
            for cidr in as_list(r.get("cidrBlocks")) + as_list(r.get("ipv6CidrBlocks")):
                if world(cidr):
                    found.append(f"{r.label} lets {cidr} reach SSH (port 22): {SSH_FIX}")
    elif r.type == SG:
        for i, rule in enumerate(as_list(r.get("ingress"))):
            if not isinstance(rule, Mapping):
                continue
            if not covers_ssh(rule.get("protocol"), rule.get("fromPort"), rule.get("toPort")):
                continue
            for cidr in as_list(rule.get("cidrBlocks")) + as_list(rule.get("ipv6CidrBlocks")):
                if world(cidr):
                    found.append(
                        f"{r.label}: inline ingress[{i}] lets {cidr} reach SSH (port 22): "
                        f"{SSH_FIX}; prefer separate aws.vpc.SecurityGroupIngressRule resources"
                    )
    return found


# ---------------------------------------------------------------------------------- IMDSv2


def imdsv2_findings(r: Resource) -> list[str]:
    if r.type not in (INSTANCE, LAUNCH_TEMPLATE):
        return []
    args = (
        "InstanceMetadataOptionsArgs" if r.type == INSTANCE else "LaunchTemplateMetadataOptionsArgs"
    )
    fix = (
        f"set metadata_options=aws.ec2.{args}(http_tokens='required') so only IMDSv2 session "
        "tokens can read the instance's role credentials"
    )
    endpoint = r.get("metadataOptions", "httpEndpoint")
    return imds_tokens_problem(r, endpoint, r.get("metadataOptions", "httpTokens"), fix)


# ---------------------------------------------------------------------------- disk encryption


def disk_findings(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == INSTANCE:
        root = r.get("rootBlockDevice")
        if root is None or (isinstance(root, Mapping) and unencrypted(root.get("encrypted"))):
            found.append(
                f"{r.label}: the root EBS volume is not encrypted; set "
                "root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(encrypted=True, ...)"
            )
        for i, disk in enumerate(as_list(r.get("ebsBlockDevices"))):
            if isinstance(disk, Mapping) and unencrypted(disk.get("encrypted")):
                found.append(
                    f"{r.label}: ebsBlockDevices[{i}] ({disk.get('deviceName')}) is not "
                    "encrypted; set encrypted=True on the InstanceEbsBlockDeviceArgs"
                )
    elif r.type == LAUNCH_TEMPLATE:
        for i, mapping in enumerate(as_list(r.get("blockDeviceMappings"))):
            ebs = mapping.get("ebs") if isinstance(mapping, Mapping) else None
            if isinstance(ebs, Mapping) and unencrypted(ebs.get("encrypted")):
                found.append(
                    f"{r.label}: blockDeviceMappings[{i}] EBS volume is not encrypted; set "
                    "encrypted='true' on the LaunchTemplateBlockDeviceMappingEbsArgs"
                )
    elif r.type == EBS_VOLUME and unencrypted(r.get("encrypted")):
        found.append(f"{r.label}: the EBS volume is not encrypted; set encrypted=True")
    return found


# ------------------------------------------------------------------------------- buckets


def _s3_sse_ok(rules: Any) -> bool | None:
    """True/False when the encryption rules are readable, None when not known yet."""
    if not known(rules):
        return None
    for rule in as_list(rules):
        if not isinstance(rule, Mapping):
            continue
        default = rule.get("applyServerSideEncryptionByDefault")
        if not known(default):
            return None
        if isinstance(default, Mapping):
            algorithm = default.get("sseAlgorithm")
            if not known(algorithm):
                return None
            if algorithm in S3_SSE_ALGORITHMS:
                return True
    return False


def bucket_encryption(resources: Sequence[Resource], b: Resource) -> list[StackFinding]:
    if b.type not in BUCKETS:
        return []
    inline = b.get("serverSideEncryptionConfiguration", "rule")
    verdicts = [_s3_sse_ok([inline])] if isinstance(inline, Mapping) else []
    verdicts += [_s3_sse_ok(c.get("rules")) for c in attached(resources, BUCKET_SSE, b)]
    if any(v is not False for v in verdicts):
        return []
    return [
        (
            b,
            f"{b.label} has no default encryption: declare an "
            "aws.s3.BucketServerSideEncryptionConfiguration for it with "
            "sse_algorithm 'AES256' or 'aws:kms'",
        )
    ]


S3 = BucketKind(
    "s3",
    BUCKET_PAB,
    ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"),
    "declare an aws.s3.BucketPublicAccessBlock for it with block_public_acls, "
    "block_public_policy, ignore_public_acls and restrict_public_buckets all True",
    BUCKET_POLICY,
    "aws.s3.BucketPolicy",
    "aws:SecureTransport",
    BUCKET_ACLS,
    principal_key="AWS",
)


# ------------------------------------------------------------------------------ idle guard

GUARD_FIX = (
    "declare the reaper (aws.lambda_.Function with GPUFLEET_STACK=<stack> and "
    "GPUFLEET_APPLY=true), an aws.cloudwatch.EventRule with a schedule_expression, an "
    "EventTarget from the rule to the function and a lambda Permission for "
    "events.amazonaws.com: the IdleGuard component does all of this"
)


def guard_env(fn: Resource) -> Mapping[str, Any] | None:
    """The Lambda function's environment; None when not known yet."""
    return mapping_at(fn, "environment", "variables")


def _invocable(resources: Sequence[Resource], fn: Resource) -> bool:
    return any(
        p.type == PERMISSION
        and refers_to(p, "function", fn)
        and p.get("principal") in ("events.amazonaws.com", UNKNOWN)
        and p.get("action") in ("lambda:InvokeFunction", UNKNOWN)
        for p in resources
    )


def guard_scheduled(resources: Sequence[Resource], fn: Resource) -> bool:
    """An enabled EventBridge rule with a schedule targets the function, which lets
    events.amazonaws.com invoke it."""
    for target in resources:
        if target.type != EVENT_TARGET or not refers_to(target, "arn", fn):
            continue
        for rule in resources:
            if (
                rule.type == EVENT_RULE
                and refers_to(target, "rule", rule)
                and rule.get("scheduleExpression")
                and str(rule.get("state") or "ENABLED").upper() != "DISABLED"
                and rule.get("isEnabled") is not False
                and _invocable(resources, fn)
            ):
                return True
    return False


# A CloudWatch alarm action that powers an instance down (AWS's "EC2 actions" for alarms,
# arn:aws:automate:<region>:ec2:stop|terminate|reboot; :recover moves a healthy instance to
# new hardware and stays allowed). An alarm reads neither tags nor GPUs: it would stop a busy
# GPU node whose CPU is quiet, and a protected or leased one, without the watchdog's sync.
_EC2_POWER_ACTIONS = (":ec2:stop", ":ec2:terminate", ":ec2:reboot")
_ALARM_ACTION_KEYS = ("alarmActions", "okActions", "insufficientDataActions")


def _power_action(action: Any) -> bool:
    return (
        isinstance(action, str)
        and action.strip().lower().startswith("arn:aws:automate:")
        and action.strip().lower().endswith(_EC2_POWER_ACTIONS)
    )


def stop_alarm_findings(r: Resource) -> list[str]:
    if r.type not in (METRIC_ALARM, COMPOSITE_ALARM):
        return []
    found = []
    for key in _ALARM_ACTION_KEYS:
        for action in as_list(r.get(key)):
            if _power_action(action):
                found.append(
                    f"{r.label} has the {key} {action}: an alarm reads neither "
                    f"{T.PROTECTED} nor leases nor GPU use, so it would stop busy or protected "
                    "nodes without syncing scratch; drop the EC2 action and leave stopping to "
                    "the node watchdog and the scheduled reaper (an SNS notification is fine)"
                )
    return found


# ------------------------------------------------------------------------------------ cost


def bill(r: Resource, itype: str) -> Bill:
    if r.get("instanceMarketOptions", "marketType") == "spot":
        cap = positive(r.get("instanceMarketOptions", "spotOptions", "maxPrice"))
        return Bill(NAME, itype, "spot", cap)
    return Bill(NAME, itype, "on-demand")


FACTS = CloudFacts(
    name=NAME,
    package="aws",
    instances={INSTANCE: ("instanceType",)},
    bill=bill,
    guard_fix=GUARD_FIX,
    guard_functions=(FUNCTION,),
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh_findings,
    imdsv2=imdsv2_findings,
    disks=disk_findings,
    stop_alarms=stop_alarm_findings,
    bucket_encryption=bucket_encryption,
    bucket_kinds={t: S3 for t in BUCKETS},
    own_names={t: "bucket" for t in BUCKETS},
)
