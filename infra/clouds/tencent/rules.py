"""What the policy pack knows about Tencent Cloud's resource types: SSH in security group
rule sets and lite rules, CBS and COS encryption, COS's private ACL and TLS-only policy,
the SCF reaper and its timer trigger, and how a CVM instance is billed. policy/rules.py
finds this module by its folder and asks it about the resources whose type token starts
with ``tencentcloud:``."""

from __future__ import annotations

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
    known,
    mapping_at,
    positive,
    prepaid_months,
    unencrypted,
    world,
)

NAME = "tencent"

INSTANCE = "tencentcloud:Instance/instance:Instance"
DISK = "tencentcloud:Cbs/storage:Storage"
SG_RULE_SET = "tencentcloud:Security/groupRuleSet:GroupRuleSet"
SG_LITE_RULE = "tencentcloud:Security/groupLiteRule:GroupLiteRule"
BUCKET = "tencentcloud:Cos/bucket:Bucket"
BUCKET_POLICY = "tencentcloud:Cos/bucketPolicy:BucketPolicy"
FUNCTIONS = ("tencentcloud:Scf/function:Function",)
SPOT = "SPOTPAID"

COS_SSE_ALGORITHMS = ("AES256", "KMS", "cos/kms", "SM4")
ANYONE_QCS = "qcs::cam::anyone:anyone"  # COS bucket policies' "every principal"


def _covers_ssh(protocol: Any, port: Any) -> bool:
    """Tencent rules: protocol TCP/UDP/ICMP/ALL; port 'all', '22', '20-30' or '22,80'."""
    proto = str(protocol or "ALL").strip().upper()
    if proto == "ALL":
        return True
    if proto != "TCP":
        return False
    for piece in str(port if port is not None else "all").replace(" ", "").split(","):
        if piece.lower() in ("all", "", "-1"):
            return True
        low, _, high = piece.partition("-")
        if covers_ssh("tcp", low, high or low):
            return True
    return False


def _rule_set_findings(r: Resource) -> list[str]:
    found: list[str] = []
    for i, rule in enumerate(as_list(r.get("ingresses"))):
        if not isinstance(rule, Mapping):
            continue
        if str(rule.get("action") or "").upper() != "ACCEPT":
            continue
        if not _covers_ssh(rule.get("protocol"), rule.get("port")):
            continue
        for key in ("cidrBlock", "ipv6CidrBlock"):
            if world(rule.get(key)):
                found.append(
                    f"{r.label}: ingresses[{i}] lets {rule.get(key)} reach SSH (port 22): {SSH_FIX}"
                )
    return found


def _lite_rule_findings(r: Resource) -> list[str]:
    found: list[str] = []
    for i, text in enumerate(as_list(r.get("ingresses"))):
        # ACTION#CIDR#PORT#PROTOCOL, e.g. ACCEPT#10.0.0.0/16#22#TCP
        parts = str(text).split("#")
        accept = len(parts) == 4 and parts[0].upper() == "ACCEPT"
        if accept and world(parts[1]) and _covers_ssh(parts[3], parts[2]):
            found.append(
                f"{r.label}: ingresses[{i}] lets {parts[1]} reach SSH (port 22): {SSH_FIX}"
            )
    return found


def ssh_findings(r: Resource) -> list[str]:
    if r.type == SG_RULE_SET:
        return _rule_set_findings(r)
    if r.type == SG_LITE_RULE:
        return _lite_rule_findings(r)
    return []


def disk_findings(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == INSTANCE:
        # CVM takes no encryption flag for the system disk (SECURITY.md, section 12): only
        # the data disks can be held to it.
        for i, disk in enumerate(as_list(r.get("dataDisks"))):
            if isinstance(disk, Mapping) and unencrypted(disk.get("encrypt")):
                found.append(
                    f"{r.label}: dataDisks[{i}] ({disk.get('dataDiskName')}) is not "
                    "encrypted; set encrypt=True on the InstanceDataDiskArgs"
                )
    elif r.type == DISK and unencrypted(r.get("encrypt")):
        found.append(f"{r.label}: the CBS disk is not encrypted; set encrypt=True")
    return found


def bucket_encryption(resources: Sequence[Resource], b: Resource) -> list[StackFinding]:
    if b.type != BUCKET:
        return []
    algorithm = b.get("encryptionAlgorithm")
    if not known(algorithm) or algorithm in COS_SSE_ALGORITHMS:
        return []
    return [
        (
            b,
            f"{b.label} has no server-side encryption: set "
            "encryption_algorithm='AES256' on the tencentcloud.cos.Bucket",
        )
    ]


COS = BucketKind(
    "name/cos",
    "",
    (),
    "",
    BUCKET_POLICY,
    "tencentcloud.cos.BucketPolicy",
    # COS "Conditions" (436/46205) and its deny-non-HTTPS example (436/46206)
    "cos:secure-transport",
    (),
    # COS has no public-access-block resource: the bucket's own ACL must be private
    required_acl="private",
    # the Boolean operator: CAM "bool_equal" (598/58420)
    tls_operator="bool_equal",
    principal_key="qcs",
    anyone=("*", ANYONE_QCS),
)

GUARD_FIX = (
    "declare the reaper (tencentcloud.scf.Function with GPUFLEET_STACK=<stack> and "
    "GPUFLEET_APPLY=true in its environment) with a trigger of type 'timer' and a cron "
    "trigger_desc: the IdleGuard component does all of this"
)


def guard_env(fn: Resource) -> Mapping[str, Any] | None:
    """The SCF function's environment; None when not known yet."""
    return mapping_at(fn, "environment")


def guard_scheduled(resources: Sequence[Resource], fn: Resource) -> bool:
    """An SCF function is scheduled by an inline timer trigger with a cron expression."""
    for trigger in as_list(fn.get("triggers")):
        if not isinstance(trigger, Mapping):
            continue
        if trigger.get("type") == "timer" and (
            not known(trigger.get("triggerDesc")) or str(trigger.get("triggerDesc")).strip()
        ):
            return True
    return False


def bill(r: Resource, itype: str) -> Bill:
    charge = r.get("instanceChargeType") or "POSTPAID_BY_HOUR"
    if charge == "PREPAID":
        months = prepaid_months(r.get("instanceChargeTypePrepaidPeriod"))
        return Bill(NAME, itype, "subscription", None, months)
    if charge == SPOT:
        return Bill(NAME, itype, "spot", positive(r.get("spotMaxPrice")))
    return Bill(NAME, itype, "on-demand")


FACTS = CloudFacts(
    name=NAME,
    package="tencentcloud",
    instances={INSTANCE: ("instanceType",)},
    bill=bill,
    guard_fix=GUARD_FIX,
    guard_functions=FUNCTIONS,
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh_findings,
    disks=disk_findings,
    bucket_encryption=bucket_encryption,
    bucket_kinds={BUCKET: COS},
    own_names={BUCKET: "bucket"},
)
