"""What the policy pack knows about Alibaba Cloud's resource types: SSH in security group
rules, the ECS metadata tokens, ECS disk and OSS encryption, OSS's public access block
and TLS-only policy, the Function Compute reaper and its timer trigger, and how an ECS
instance is billed. policy/rules.py finds this module by its folder and asks it about
the resources whose type token starts with ``alicloud:``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from policy.resources import (
    SSH_FIX,
    Bill,
    BucketKind,
    CloudFacts,
    Resource,
    StackFinding,
    as_list,
    covers_ssh,
    imds_tokens_problem,
    known,
    mapping_at,
    positive,
    prepaid_months,
    refers_to,
    unencrypted,
    world,
)

NAME = "alicloud"

INSTANCE = "alicloud:ecs/instance:Instance"
DISKS = ("alicloud:ecs/ecsDisk:EcsDisk", "alicloud:ecs/disk:Disk")
SG_RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
BUCKET = "alicloud:oss/bucket:Bucket"
BUCKET_PAB = "alicloud:oss/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_POLICY = "alicloud:oss/bucketPolicy:BucketPolicy"
BUCKET_ACL = "alicloud:oss/bucketAcl:BucketAcl"
FUNCTIONS = ("alicloud:fc/v3Function:V3Function", "alicloud:fc/function:Function")
TRIGGERS = ("alicloud:fc/v3Trigger:V3Trigger", "alicloud:fc/trigger:Trigger")

OSS_SSE_ALGORITHMS = ("AES256", "KMS", "SM4")
SPOT = ("SpotAsPriceGo", "SpotWithPriceLimit")


def _ports(port_range: Any) -> tuple[Any, Any]:
    """A rule's port range, '22/22' or '-1/-1', as (low, high)."""
    if not isinstance(port_range, str) or "/" not in port_range:
        return None, None
    low, _, high = port_range.partition("/")
    return low, high


def ssh_findings(r: Resource) -> list[str]:
    if r.type != SG_RULE:
        return []
    accept = str(r.get("policy") or "accept").lower() == "accept"
    low, high = _ports(r.get("portRange"))
    if not (
        str(r.get("type")) == "ingress" and accept and covers_ssh(r.get("ipProtocol"), low, high)
    ):
        return []
    return [
        f"{r.label} lets {r.get(key)} reach SSH (port 22): {SSH_FIX}"
        for key in ("cidrIp", "ipv6CidrIp")
        if world(r.get(key))
    ]


def imdsv2_findings(r: Resource) -> list[str]:
    if r.type != INSTANCE:
        return []
    fix = "set http_tokens='required' (and http_endpoint='enabled') on the ecs.Instance"
    return imds_tokens_problem(r, r.get("httpEndpoint"), r.get("httpTokens"), fix)


def disk_findings(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == INSTANCE:
        if unencrypted(r.get("systemDiskEncrypted")):
            found.append(
                f"{r.label}: the system disk is not encrypted; set system_disk_encrypted=True"
            )
        for i, disk in enumerate(as_list(r.get("dataDisks"))):
            if isinstance(disk, Mapping) and unencrypted(disk.get("encrypted")):
                found.append(
                    f"{r.label}: dataDisks[{i}] ({disk.get('name')}) is not encrypted; set "
                    "encrypted=True on the InstanceDataDiskArgs"
                )
    elif r.type in DISKS and unencrypted(r.get("encrypted")):
        found.append(f"{r.label}: the disk is not encrypted; set encrypted=True")
    return found


def bucket_encryption(resources: Sequence[Resource], b: Resource) -> list[StackFinding]:
    if b.type != BUCKET:
        return []
    algorithm = b.get("serverSideEncryptionRule", "sseAlgorithm")
    if not known(algorithm) or algorithm in OSS_SSE_ALGORITHMS:
        return []
    return [
        (
            b,
            f"{b.label} has no server-side encryption: set server_side_encryption_rule="
            "ali.oss.BucketServerSideEncryptionRuleArgs(sse_algorithm='AES256')",
        )
    ]


OSS = BucketKind(
    "oss",
    BUCKET_PAB,
    ("blockPublicAccess",),
    "declare an ali.oss.BucketPublicAccessBlock for it with block_public_access=True",
    BUCKET_POLICY,
    "ali.oss.BucketPolicy",
    "acs:SecureTransport",
    (BUCKET_ACL,),
    principal_key="RAM",
)

GUARD_FIX = (
    "declare the reaper (ali.fc.V3Function with GPUFLEET_STACK=<stack> and "
    "GPUFLEET_APPLY=true) and an ali.fc.V3Trigger of type 'timer' with a cronExpression "
    "for it: the IdleGuard component does all of this"
)


def guard_env(fn: Resource) -> Mapping[str, Any] | None:
    """The function's environment variables; None when not known yet."""
    return mapping_at(fn, "environmentVariables")


def guard_scheduled(resources: Sequence[Resource], fn: Resource) -> bool:
    """A timer trigger with a cron expression, not disabled, points at the function."""
    for trigger in resources:
        if trigger.type not in TRIGGERS or not refers_to(trigger, "functionName", fn):
            continue
        if trigger.get("triggerType") != "timer":
            continue
        config = trigger.get("triggerConfig")
        if not known(config):
            return True
        try:
            parsed = json.loads(config) if isinstance(config, str) else config
        except json.JSONDecodeError:
            continue
        if (
            isinstance(parsed, Mapping)
            and parsed.get("enable") is not False
            and (parsed.get("cronExpression"))
        ):
            return True
    return False


def bill(r: Resource, itype: str) -> Bill:
    if r.get("instanceChargeType") == "PrePaid":
        unit = r.get("periodUnit") or "Month"
        months = prepaid_months(r.get("period")) if unit == "Month" else 1
        return Bill(NAME, itype, "subscription", None, months)
    if r.get("spotStrategy") in SPOT:
        return Bill(NAME, itype, "spot", positive(r.get("spotPriceLimit")))
    return Bill(NAME, itype, "on-demand")


FACTS = CloudFacts(
    name=NAME,
    package="alicloud",
    instances={INSTANCE: ("instanceType",)},
    bill=bill,
    guard_fix=GUARD_FIX,
    guard_functions=FUNCTIONS,
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh_findings,
    imdsv2=imdsv2_findings,
    disks=disk_findings,
    bucket_encryption=bucket_encryption,
    bucket_kinds={BUCKET: OSS},
    # a function is named by its functionName, which the timer trigger refers to
    own_names={BUCKET: "bucket", **{t: "functionName" for t in FUNCTIONS}},
)
