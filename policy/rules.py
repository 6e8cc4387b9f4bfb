"""The guardrails as pure functions over the resources a stack declares.

Every rule reads plain data: a list of :class:`policy.resources.Resource` (type token,
logical name, inputs in the engine's camelCase). The same functions run in two places:

* inside ``pulumi preview/up --policy-pack policy/`` (``policy/pack.py`` turns the engine's
  ``PolicyResource`` objects into resources), and
* offline, in ``scripts/plan.py``, on the resources Pulumi's mocks recorded
  (``policy/offline.py``).

Inputs not known yet during a preview, and how one resource refers to another, are
policy/resources.py's business.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import SSH_MIN_PREFIX
from infra.reaper import tags as T
from policy.resources import (
    UNKNOWN,
    Bill,
    Resource,
    StackFinding,
    as_list,
    attached,
    is_true,
    known,
    positive,
    refers_to,
    unencrypted,
)

PACK_NAME = "gpufleet-guardrails"
PACK_VERSION = "0.1.0"
MANDATORY = "mandatory"
ADVISORY = "advisory"
DISABLED = "disabled"
LEVELS = (MANDATORY, ADVISORY, DISABLED)


# ---------------------------------------------------------------------------------- types

AWS_INSTANCE = "aws:ec2/instance:Instance"
AWS_LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
AWS_EBS_VOLUME = "aws:ebs/volume:Volume"
AWS_SG = "aws:ec2/securityGroup:SecurityGroup"
AWS_SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
AWS_SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
AWS_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
AWS_BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
AWS_BUCKET_PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
AWS_BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
AWS_BUCKET_ACLS = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
AWS_FUNCTION = "aws:lambda/function:Function"
AWS_PERMISSION = "aws:lambda/permission:Permission"
AWS_EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
AWS_EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
AWS_METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
AWS_COMPOSITE_ALARM = "aws:cloudwatch/compositeAlarm:CompositeAlarm"

ALI_INSTANCE = "alicloud:ecs/instance:Instance"
ALI_DISKS = ("alicloud:ecs/ecsDisk:EcsDisk", "alicloud:ecs/disk:Disk")
ALI_SG_RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
ALI_BUCKET = "alicloud:oss/bucket:Bucket"
ALI_BUCKET_PAB = "alicloud:oss/bucketPublicAccessBlock:BucketPublicAccessBlock"
ALI_BUCKET_POLICY = "alicloud:oss/bucketPolicy:BucketPolicy"
ALI_BUCKET_ACL = "alicloud:oss/bucketAcl:BucketAcl"
ALI_FUNCTIONS = ("alicloud:fc/v3Function:V3Function", "alicloud:fc/function:Function")
ALI_TRIGGERS = ("alicloud:fc/v3Trigger:V3Trigger", "alicloud:fc/trigger:Trigger")

TC_INSTANCE = "tencentcloud:Instance/instance:Instance"
TC_DISK = "tencentcloud:Cbs/storage:Storage"
TC_SG_RULE_SET = "tencentcloud:Security/groupRuleSet:GroupRuleSet"
TC_SG_LITE_RULE = "tencentcloud:Security/groupLiteRule:GroupLiteRule"
TC_BUCKET = "tencentcloud:Cos/bucket:Bucket"
TC_BUCKET_POLICY = "tencentcloud:Cos/bucketPolicy:BucketPolicy"
TC_FUNCTIONS = ("tencentcloud:Scf/function:Function",)
TC_SPOT = "SPOTPAID"

AZ_VM = "azure-native:compute:VirtualMachine"
AZ_FUNCTION_APP = "azure-native:web:WebApp"
AZ_NSG = "azure-native:network:NetworkSecurityGroup"
AZ_NSG_RULE = "azure-native:network:SecurityRule"
AZ_STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
AZ_CONTAINER = "azure-native:storage:BlobContainer"

# A type token's package -> the catalog's name for that cloud, where the two differ.
PACKAGE_PROVIDERS: Mapping[str, str] = {"tencentcloud": "tencent", "azure-native": "azure"}

INSTANCES = (AWS_INSTANCE, ALI_INSTANCE, TC_INSTANCE, AZ_VM)
# Where each instance type keeps its size (Azure nests it in the hardware profile).
INSTANCE_SIZE_PATH: Mapping[str, tuple[str, ...]] = {AZ_VM: ("hardwareProfile", "vmSize")}
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
S3_SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
OSS_SSE_ALGORITHMS = ("AES256", "KMS", "SM4")
COS_SSE_ALGORITHMS = ("AES256", "KMS", "cos/kms", "SM4")
ALI_SPOT = ("SpotAsPriceGo", "SpotWithPriceLimit")
DEV_TIERS = ("t4x1",)  # "the cheap dev box"; any stack tagged purpose=dev counts too

# What the reaper reads from its environment (infra/reaper/handler.py).
ENV_STACK = "GPUFLEET_STACK"
ENV_APPLY = "GPUFLEET_APPLY"


def provider_of(resource: Resource) -> str:
    package = resource.type.split(":", 1)[0]
    return PACKAGE_PROVIDERS.get(package, package)


def instance_size(resource: Resource) -> Any:
    """The instance's type/size input (None when the resource has none)."""
    return resource.get(*INSTANCE_SIZE_PATH.get(resource.type, ("instanceType",)))


def is_gpu_instance(resource: Resource, gpu_types: Callable[[str, str], bool]) -> bool:
    if resource.type not in INSTANCES:
        return False
    itype = instance_size(resource)
    return isinstance(itype, str) and gpu_types(provider_of(resource), itype)


def catalog_gpu_types(provider: str, instance_type: str) -> bool:
    """GPU instance types: the catalog's, plus any type of a GPU family the reaper knows."""
    from infra.catalog import load_catalog
    from infra.reaper.catalog_data import load_table

    if (provider, instance_type) in load_catalog().instances:
        return True
    return load_table().gpu_family_known(instance_type)


# ---------------------------------------------------------------------------- SSH to world

SSH_PORT = 22


def _world(cidr: Any) -> bool:
    """0.0.0.0/0, ::/0, and anything as absurdly broad (0.0.0.0/1 is half the internet): the
    same per-network bound the config parser applies (infra.config.SSH_MIN_PREFIX)."""
    if not isinstance(cidr, str):
        return False
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=False)
    except ValueError:
        return False
    return net.prefixlen < SSH_MIN_PREFIX[net.version]


def _protocol(value: Any) -> str:
    text = str(value).strip().lower() if value is not None else ""
    return {"6": "tcp", "-1": "all", "all": "all"}.get(text, text)


def _covers_ssh(protocol: Any, from_port: Any, to_port: Any) -> bool:
    proto = _protocol(protocol)
    if proto == "all":
        return True  # every protocol means every port
    if proto != "tcp":
        return False
    try:
        low, high = int(from_port), int(to_port)
    except (TypeError, ValueError):
        return False
    return (low == -1 and high == -1) or low <= SSH_PORT <= high


def _ali_ports(port_range: Any) -> tuple[Any, Any]:
    if not isinstance(port_range, str) or "/" not in port_range:
        return None, None
    low, _, high = port_range.partition("/")
    return low, high


def _tc_covers_ssh(protocol: Any, port: Any) -> bool:
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
        if _covers_ssh("tcp", low, high or low):
            return True
    return False


_SSH_FIX = (
    "list only your own networks (gpufleet:sshCidrs, e.g. 203.0.113.7/32) or reach the node "
    "through a bastion/VPN"
)


def _azure_rule_opens_ssh(rule: Mapping[str, Any]) -> bool:
    """An inbound Allow rule whose destination ports include 22 (a range, a list or '*')."""
    if str(rule.get("direction")) != "Inbound" or str(rule.get("access")) != "Allow":
        return False
    if str(rule.get("protocol") or "*").lower() not in ("tcp", "*"):
        return False
    for ports in [rule.get("destinationPortRange"), *as_list(rule.get("destinationPortRanges"))]:
        text = str(ports or "")
        if text == "*":
            return True
        low, _, high = text.partition("-")
        if low.isdigit() and int(low) <= 22 <= int(high or low):
            return True
    return False


def check_ssh_not_world(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == AWS_SG_INGRESS:
        if _covers_ssh(r.get("ipProtocol"), r.get("fromPort"), r.get("toPort")):
            for key in ("cidrIpv4", "cidrIpv6"):
                if _world(r.get(key)):
                    found.append(f"{r.label} lets {r.get(key)} reach SSH (port 22): {_SSH_FIX}")
    elif r.type == AWS_SG_RULE:
        if str(r.get("type")) == "ingress" and _covers_ssh(
            r.get("protocol"), r.get("fromPort"), r.get("toPort")
        ):
            for cidr in as_list(r.get("cidrBlocks")) + as_list(r.get("ipv6CidrBlocks")):
                if _world(cidr):
                    found.append(f"{r.label} lets {cidr} reach SSH (port 22): {_SSH_FIX}")
    elif r.type == AWS_SG:
        for i, rule in enumerate(as_list(r.get("ingress"))):
            if not isinstance(rule, Mapping):
                continue
            if not _covers_ssh(rule.get("protocol"), rule.get("fromPort"), rule.get("toPort")):
                continue
            for cidr in as_list(rule.get("cidrBlocks")) + as_list(rule.get("ipv6CidrBlocks")):
                if _world(cidr):
                    found.append(
                        f"{r.label}: inline ingress[{i}] lets {cidr} reach SSH (port 22): "
                        f"{_SSH_FIX}; prefer separate aws.vpc.SecurityGroupIngressRule resources"
                    )
    elif r.type == TC_SG_RULE_SET:
        for i, rule in enumerate(as_list(r.get("ingresses"))):
            if not isinstance(rule, Mapping):
                continue
            if str(rule.get("action") or "").upper() != "ACCEPT":
                continue
            if not _tc_covers_ssh(rule.get("protocol"), rule.get("port")):
                continue
            for key in ("cidrBlock", "ipv6CidrBlock"):
                if _world(rule.get(key)):
                    found.append(
                        f"{r.label}: ingresses[{i}] lets {rule.get(key)} reach SSH (port 22): "
                        f"{_SSH_FIX}"
                    )
    elif r.type == TC_SG_LITE_RULE:
        for i, text in enumerate(as_list(r.get("ingresses"))):
            # ACTION#CIDR#PORT#PROTOCOL, e.g. ACCEPT#10.0.0.0/16#22#TCP
            parts = str(text).split("#")
            accept = len(parts) == 4 and parts[0].upper() == "ACCEPT"
            if accept and _world(parts[1]) and _tc_covers_ssh(parts[3], parts[2]):
                found.append(
                    f"{r.label}: ingresses[{i}] lets {parts[1]} reach SSH (port 22): {_SSH_FIX}"
                )
    elif r.type in (AZ_NSG, AZ_NSG_RULE):
        rules = as_list(r.get("securityRules")) if r.type == AZ_NSG else [r.inputs]
        for rule in rules:
            if not isinstance(rule, Mapping) or not _azure_rule_opens_ssh(rule):
                continue
            sources = [rule.get("sourceAddressPrefix"), *as_list(rule.get("sourceAddressPrefixes"))]
            for cidr in sources:
                if _world(cidr) or str(cidr).lower() in ("*", "internet", "any"):
                    found.append(
                        f"{r.label}: rule {rule.get('name')} lets {cidr} reach SSH (port 22): "
                        f"{_SSH_FIX}"
                    )
    elif r.type == ALI_SG_RULE:
        accept = str(r.get("policy") or "accept").lower() == "accept"
        low, high = _ali_ports(r.get("portRange"))
        if (
            str(r.get("type")) == "ingress"
            and accept
            and _covers_ssh(r.get("ipProtocol"), low, high)
        ):
            for key in ("cidrIp", "ipv6CidrIp"):
                if _world(r.get(key)):
                    found.append(f"{r.label} lets {r.get(key)} reach SSH (port 22): {_SSH_FIX}")
    return found


# ---------------------------------------------------------------------------------- IMDSv2


def check_imdsv2(r: Resource) -> list[str]:
    if r.type in (AWS_INSTANCE, AWS_LAUNCH_TEMPLATE):
        endpoint, tokens = (
            r.get("metadataOptions", "httpEndpoint"),
            r.get("metadataOptions", "httpTokens"),
        )
        fix = (
            "set metadata_options=aws.ec2.%s(http_tokens='required') so only IMDSv2 session "
            "tokens can read the instance's role credentials"
            % (
                "InstanceMetadataOptionsArgs"
                if r.type == AWS_INSTANCE
                else "LaunchTemplateMetadataOptionsArgs"
            )
        )
    elif r.type == ALI_INSTANCE:
        endpoint, tokens = r.get("httpEndpoint"), r.get("httpTokens")
        fix = "set http_tokens='required' (and http_endpoint='enabled') on the ecs.Instance"
    else:
        return []
    if not known(endpoint) or not known(tokens) or endpoint == "disabled":
        return []  # a disabled metadata service has no IMDSv1 either
    if tokens != "required":
        shown = "not set (IMDSv1 allowed)" if tokens is None else repr(tokens)
        return [f"{r.label}: metadata httpTokens is {shown}; {fix}"]
    return []


# ---------------------------------------------------------------------------- disk encryption


def check_disks_encrypted(r: Resource) -> list[str]:
    found: list[str] = []
    if r.type == AZ_VM:
        # managed disks are always encrypted at rest with platform keys; encryption at host
        # adds the temp disk, the disk caches and local NVMe, which hold scratch
        at_host = r.get("securityProfile", "encryptionAtHost")
        if known(at_host) and at_host is not True:
            found.append(
                f"{r.label}: encryption at host is off, so the temp disk, caches and local NVMe "
                "are not encrypted; set security_profile=SecurityProfileArgs("
                "encryption_at_host=True)"
            )
    if r.type == AWS_INSTANCE:
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
    elif r.type == AWS_LAUNCH_TEMPLATE:
        for i, mapping in enumerate(as_list(r.get("blockDeviceMappings"))):
            ebs = mapping.get("ebs") if isinstance(mapping, Mapping) else None
            if isinstance(ebs, Mapping) and unencrypted(ebs.get("encrypted")):
                found.append(
                    f"{r.label}: blockDeviceMappings[{i}] EBS volume is not encrypted; set "
                    "encrypted='true' on the LaunchTemplateBlockDeviceMappingEbsArgs"
                )
    elif r.type == AWS_EBS_VOLUME:
        if unencrypted(r.get("encrypted")):
            found.append(f"{r.label}: the EBS volume is not encrypted; set encrypted=True")
    elif r.type == ALI_INSTANCE:
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
    elif r.type == TC_INSTANCE:
        # CVM takes no encryption flag for the system disk (SECURITY.md, section 12): only the
        # data disks can be held to it.
        for i, disk in enumerate(as_list(r.get("dataDisks"))):
            if isinstance(disk, Mapping) and unencrypted(disk.get("encrypt")):
                found.append(
                    f"{r.label}: dataDisks[{i}] ({disk.get('dataDiskName')}) is not "
                    "encrypted; set encrypt=True on the InstanceDataDiskArgs"
                )
    elif r.type == TC_DISK and unencrypted(r.get("encrypt")):
        found.append(f"{r.label}: the CBS disk is not encrypted; set encrypt=True")
    elif r.type in ALI_DISKS and unencrypted(r.get("encrypted")):
        found.append(f"{r.label}: the disk is not encrypted; set encrypted=True")
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


def check_buckets_encrypted(resources: Sequence[Resource]) -> list[StackFinding]:
    found: list[StackFinding] = []
    for b in resources:
        if b.type in AWS_BUCKETS:
            inline = b.get("serverSideEncryptionConfiguration", "rule")
            verdicts = [_s3_sse_ok([inline])] if isinstance(inline, Mapping) else []
            verdicts += [_s3_sse_ok(c.get("rules")) for c in attached(resources, AWS_BUCKET_SSE, b)]
            if not any(v is not False for v in verdicts):
                found.append(
                    (
                        b,
                        f"{b.label} has no default encryption: declare an "
                        "aws.s3.BucketServerSideEncryptionConfiguration for it with "
                        "sse_algorithm 'AES256' or 'aws:kms'",
                    )
                )
        elif b.type == TC_BUCKET:
            algorithm = b.get("encryptionAlgorithm")
            if known(algorithm) and algorithm not in COS_SSE_ALGORITHMS:
                found.append(
                    (
                        b,
                        f"{b.label} has no server-side encryption: set "
                        "encryption_algorithm='AES256' on the tencentcloud.cos.Bucket",
                    )
                )
        elif b.type == ALI_BUCKET:
            algorithm = b.get("serverSideEncryptionRule", "sseAlgorithm")
            if known(algorithm) and algorithm not in OSS_SSE_ALGORITHMS:
                found.append(
                    (
                        b,
                        f"{b.label} has no server-side encryption: set server_side_encryption_rule="
                        "ali.oss.BucketServerSideEncryptionRuleArgs(sse_algorithm='AES256')",
                    )
                )
    return found


def _statements(document: Any) -> list[Mapping[str, Any]] | None:
    """A policy document's statements; None when the document is not known yet."""
    if not known(document):
        return None
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    if not isinstance(document, Mapping):
        return []
    return [s for s in as_list(_element(document, "Statement")) if isinstance(s, Mapping)]


def _element(node: Mapping[str, Any], name: str) -> Any:
    """A policy element by its name in any letter case: IAM and RAM write ``Statement``,
    Tencent CAM and COS ``statement`` (their element names are lowercase only)."""
    return next((v for k, v in node.items() if str(k).lower() == name.lower()), None)


ANYONE_QCS = "qcs::cam::anyone:anyone"  # COS bucket policies' "every principal"


def _denies_insecure_transport(statements: list[Mapping[str, Any]], kind: _BucketKind) -> bool:
    key, service, operator = kind.tls_key.lower(), kind.service, kind.tls_operator.lower()
    for s in statements:
        if str(_element(s, "Effect")).lower() != "deny":
            continue
        principal = _element(s, "Principal")
        if isinstance(principal, Mapping):
            principal = principal.get("AWS", principal.get("RAM", principal.get("qcs")))
        if not {"*", ANYONE_QCS} & {str(x) for x in as_list(principal)}:
            continue
        actions = as_list(_element(s, "Action"))
        if f"{service}:*" not in actions and "*" not in actions:
            continue
        conditions = _element(s, "Condition")
        bool_block = (
            next((v for k, v in conditions.items() if str(k).lower() == operator), None)
            if isinstance(conditions, Mapping)
            else None
        )
        if not isinstance(bool_block, Mapping):
            continue
        for k, v in bool_block.items():
            if str(k).lower() == key and "false" in [str(x).lower() for x in as_list(v)]:
                return True
    return False


@dataclass(frozen=True)
class _BucketKind:
    """How one cloud spells "private and TLS-only" for its buckets."""

    service: str  # action prefix in bucket policies
    block_type: str
    block_flags: tuple[str, ...]  # every one must be true
    block_fix: str
    policy_type: str
    policy_fix: str
    tls_key: str  # the condition key that is false on plain HTTP
    acl_types: tuple[str, ...]
    # A cloud with no public-access-block resource (COS): the bucket's own ACL must be this.
    required_acl: str | None = None
    # the Boolean operator: IAM and RAM "Bool", CAM "bool_equal" (598/58420)
    tls_operator: str = "Bool"


_S3 = _BucketKind(
    "s3",
    AWS_BUCKET_PAB,
    ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"),
    "declare an aws.s3.BucketPublicAccessBlock for it with block_public_acls, "
    "block_public_policy, ignore_public_acls and restrict_public_buckets all True",
    AWS_BUCKET_POLICY,
    "aws.s3.BucketPolicy",
    "aws:SecureTransport",
    AWS_BUCKET_ACLS,
)
_OSS = _BucketKind(
    "oss",
    ALI_BUCKET_PAB,
    ("blockPublicAccess",),
    "declare an ali.oss.BucketPublicAccessBlock for it with block_public_access=True",
    ALI_BUCKET_POLICY,
    "ali.oss.BucketPolicy",
    "acs:SecureTransport",
    (ALI_BUCKET_ACL,),
)
_COS = _BucketKind(
    "name/cos",
    "",
    (),
    "",
    TC_BUCKET_POLICY,
    "tencentcloud.cos.BucketPolicy",
    # COS "Conditions" (436/46205) and its deny-non-HTTPS example (436/46206)
    "cos:secure-transport",
    (),
    required_acl="private",
    tls_operator="bool_equal",
)
BUCKET_KINDS: Mapping[str, _BucketKind] = {
    **{t: _S3 for t in AWS_BUCKETS},
    ALI_BUCKET: _OSS,
    TC_BUCKET: _COS,
}


def _azure_storage_problems(resources: Sequence[Resource]) -> list[StackFinding]:
    """A storage account is private and TLS-only by its own properties; a container must not
    allow anonymous reads."""
    found: list[StackFinding] = []
    for a in resources:
        if a.type == AZ_STORAGE_ACCOUNT:
            public = a.get("allowBlobPublicAccess")
            if known(public) and public is not False:
                found.append(
                    (
                        a,
                        f"{a.label} may serve blobs anonymously: set "
                        "allow_blob_public_access=False",
                    )
                )
            https = a.get("enableHttpsTrafficOnly")
            if known(https) and https is False:
                found.append(
                    (a, f"{a.label} accepts plain HTTP: set enable_https_traffic_only=True")
                )
            tls = a.get("minimumTlsVersion")
            if known(tls) and tls not in ("TLS1_2", "TLS1_3"):
                found.append(
                    (
                        a,
                        f"{a.label} accepts TLS below 1.2 ({tls}): set "
                        "minimum_tls_version='TLS1_2'",
                    )
                )
        elif a.type == AZ_CONTAINER:
            access = a.get("publicAccess")
            if known(access) and access not in (None, "None"):
                found.append(
                    (a, f"{a.label} allows anonymous {access} reads: set public_access='None'")
                )
    return found


def check_buckets_private_tls(resources: Sequence[Resource]) -> list[StackFinding]:
    found: list[StackFinding] = _azure_storage_problems(resources)
    for b in resources:
        kind = BUCKET_KINDS.get(b.type)
        if kind is None:
            continue
        # Public access blocked: some block attached to the bucket with every flag on (a flag
        # not known yet during preview is given the benefit of the doubt).
        blocks = attached(resources, (kind.block_type,), b)
        if kind.required_acl is not None:
            acl = b.get("acl")
            if known(acl) and acl != kind.required_acl:
                found.append(
                    (b, f"{b.label} may become public: its ACL is {acl!r}; set acl='private'")
                )
        elif not any(
            all(is_true(blk.get(f)) or not known(blk.get(f)) for f in kind.block_flags)
            for blk in blocks
        ):
            if blocks:
                off = [f for f in kind.block_flags if not is_true(blocks[0].get(f))]
                why = f"its public access block leaves {', '.join(off)} off"
            else:
                why = "it has no public access block"
            found.append((b, f"{b.label} may become public: {why}; {kind.block_fix}"))
        # No public canned ACL, neither on the bucket nor as a separate ACL resource.
        for holder in [b, *attached(resources, kind.acl_types, b)]:
            acl = holder.get("acl")
            if isinstance(acl, str) and acl in PUBLIC_ACLS:
                found.append(
                    (
                        holder,
                        f"{holder.label} sets the canned ACL {acl!r} on {b.name}: use 'private'",
                    )
                )
        # TLS only: some attached policy denies everything when the request is plain HTTP.
        documents = [
            _statements(p.get("policy")) for p in attached(resources, (kind.policy_type,), b)
        ]
        if not any(d is None or _denies_insecure_transport(d, kind) for d in documents):
            found.append(
                (
                    b,
                    f"{b.label} accepts plain HTTP: declare a {kind.policy_fix} for it with a "
                    f"statement that denies {kind.service}:* to every principal when "
                    f"{kind.tls_key} is false ({kind.tls_operator})",
                )
            )
    return found


# ------------------------------------------------------------------------- GPU instance tags

# What the watchdog and the reaper read (infra/reaper/tags.py; docs/stacks.md, "Contract: tags").
_TTL_OPT_OUT = ("0", "off", "none", "never", "false", "no")


def _positive_number(text: Any) -> bool:
    try:
        value = float(str(text))
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def tag_problems(tags: Mapping[str, Any]) -> list[str]:
    problems = []
    if tags.get(T.MANAGED_BY) != T.MANAGED_BY_VALUE:
        problems.append(f"{T.MANAGED_BY}={T.MANAGED_BY_VALUE}")
    for key in (T.STACK, T.TIER):
        if not isinstance(tags.get(key), str) or not tags[key].strip():
            problems.append(f"{key} (the stack/tier name)")
    if tags.get(T.ROLE) not in ("head", "worker"):
        problems.append(f"{T.ROLE}=head|worker")
    if not _positive_number(tags.get(T.IDLE_MINUTES)):
        problems.append(f"{T.IDLE_MINUTES} (minutes > 0)")
    ttl = tags.get(T.TTL_HOURS)
    if not (
        isinstance(ttl, str) and (ttl.strip().lower() in _TTL_OPT_OUT or _positive_number(ttl))
    ):
        problems.append(f"{T.TTL_HOURS} (hours, or 'off')")
    if tags.get(T.WATCHDOG) != "on":
        problems.append(f"{T.WATCHDOG}=on")
    return problems


def check_gpu_tags(r: Resource, gpu_types: Callable[[str, str], bool]) -> list[str]:
    if not is_gpu_instance(r, gpu_types) or not known(r.inputs.get("tags")):
        return []
    problems = tag_problems(r.tags)
    if not problems:
        return []
    return [
        f"{r.label} ({instance_size(r)}) lacks the gpufleet tags the watchdog and "
        f"the reaper read: {', '.join(problems)}; declare it with infra.nodes.node_tags(...) "
        "as its tags"
    ]


# ------------------------------------------------------------------------------ idle guard


def _env(fn: Resource) -> Mapping[str, Any] | None:
    """The function's environment; None when not known yet."""
    if fn.type == AZ_FUNCTION_APP:
        settings = fn.get("siteConfig", "appSettings")
        if not known(settings):
            return None
        return {
            str(s.get("name")): s.get("value") for s in as_list(settings) if isinstance(s, Mapping)
        }
    if fn.type == AWS_FUNCTION:
        env = fn.get("environment", "variables")
    elif fn.type in TC_FUNCTIONS:
        env = fn.get("environment")
    else:
        env = fn.get("environmentVariables")

    if not known(env):
        return None
    return env if isinstance(env, Mapping) else {}


def _function_problem(fn: Resource, stack: str) -> str | None:
    """Why this function does not guard `stack`, or None when it does (or cannot tell yet)."""
    env = _env(fn)
    if env is None:
        return None
    if known(env.get(ENV_STACK)) and env.get(ENV_STACK) != stack:
        return f"{fn.label} reaps stack {env.get(ENV_STACK)!r}, not {stack!r} ({ENV_STACK})"
    if known(env.get(ENV_APPLY)) and str(env.get(ENV_APPLY)).lower() != "true":
        return f"{fn.label} only logs ({ENV_APPLY} is not 'true'): a dry run stops nothing"
    return None


def _aws_schedules(resources: Sequence[Resource], fn: Resource) -> bool:
    for target in resources:
        if target.type != AWS_EVENT_TARGET or not refers_to(target, "arn", fn):
            continue
        for rule in resources:
            if (
                rule.type == AWS_EVENT_RULE
                and refers_to(target, "rule", rule)
                and rule.get("scheduleExpression")
                and str(rule.get("state") or "ENABLED").upper() != "DISABLED"
                and rule.get("isEnabled") is not False
            ):
                invocable = any(
                    p.type == AWS_PERMISSION
                    and refers_to(p, "function", fn)
                    and p.get("principal") in ("events.amazonaws.com", UNKNOWN)
                    and p.get("action") in ("lambda:InvokeFunction", UNKNOWN)
                    for p in resources
                )
                if invocable:
                    return True
    return False


def _ali_schedules(resources: Sequence[Resource], fn: Resource) -> bool:
    for trigger in resources:
        if trigger.type not in ALI_TRIGGERS or not refers_to(trigger, "functionName", fn):
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


def _tc_schedules(resources: Sequence[Resource], fn: Resource) -> bool:
    """An SCF function is scheduled by an inline timer trigger with a cron expression."""
    for trigger in as_list(fn.get("triggers")):
        if not isinstance(trigger, Mapping):
            continue
        if trigger.get("type") == "timer" and (
            not known(trigger.get("triggerDesc")) or str(trigger.get("triggerDesc")).strip()
        ):
            return True
    return False


def _azure_schedules(resources: Sequence[Resource], fn: Resource) -> bool:
    """An Azure Functions app runs the reaper on its package's timer trigger, which reads
    its NCRONTAB from the GPUFLEET_SCHEDULE setting: a Linux function app with a package and
    a schedule set is scheduled (the trigger itself lives in the package, not the program)."""
    kind = fn.get("kind")
    if known(kind) and "functionapp" not in str(kind):
        return False
    if fn.get("enabled") is False:
        return False
    env = _env(fn)
    if env is None:
        return True
    return bool(env.get("GPUFLEET_SCHEDULE")) and bool(env.get("WEBSITE_RUN_FROM_PACKAGE"))


GUARD_FIX = {
    "aws": (
        "declare the reaper (aws.lambda_.Function with GPUFLEET_STACK=<stack> and "
        "GPUFLEET_APPLY=true), an aws.cloudwatch.EventRule with a schedule_expression, an "
        "EventTarget from the rule to the function and a lambda Permission for "
        "events.amazonaws.com: the IdleGuard component does all of this"
    ),
    "alicloud": (
        "declare the reaper (ali.fc.V3Function with GPUFLEET_STACK=<stack> and "
        "GPUFLEET_APPLY=true) and an ali.fc.V3Trigger of type 'timer' with a cronExpression "
        "for it: the IdleGuard component does all of this"
    ),
    "tencent": (
        "declare the reaper (tencentcloud.scf.Function with GPUFLEET_STACK=<stack> and "
        "GPUFLEET_APPLY=true in its environment) with a trigger of type 'timer' and a cron "
        "trigger_desc: the IdleGuard component does all of this"
    ),
    "azure": (
        "declare the reaper (an azure-native web.WebApp of kind functionapp,linux with "
        "GPUFLEET_STACK=<stack>, GPUFLEET_APPLY=true, GPUFLEET_SCHEDULE and "
        "WEBSITE_RUN_FROM_PACKAGE in its app settings): the IdleGuard component does all of this"
    ),
}


def _no_schedules(resources: Sequence[Resource], fn: Resource) -> bool:
    return False


# Each cloud's reaper function resource types, and how to tell that one is scheduled:
# provider (the type token's package) -> (function types, is-scheduled check).
GUARD_FUNCTIONS: Mapping[
    str, tuple[tuple[str, ...], Callable[[Sequence[Resource], Resource], bool]]
] = {
    "aws": ((AWS_FUNCTION,), _aws_schedules),
    "alicloud": (ALI_FUNCTIONS, _ali_schedules),
    "tencent": (TC_FUNCTIONS, _tc_schedules),
    "azure": ((AZ_FUNCTION_APP,), _azure_schedules),
}


def check_idle_guard(
    resources: Sequence[Resource], gpu_types: Callable[[str, str], bool]
) -> list[StackFinding]:
    found: list[StackFinding] = []
    for inst in resources:
        if not is_gpu_instance(inst, gpu_types):
            continue
        provider = provider_of(inst)
        tags = inst.inputs.get("tags")
        if not known(tags):
            continue
        tags = tags if isinstance(tags, Mapping) else {}
        stack = tags.get(T.STACK)
        why: list[str] = []
        if tags.get(T.WATCHDOG) != "on":
            why.append(f"its {T.WATCHDOG} tag is not 'on', so nothing expects a node watchdog")
        fn_types, schedules = GUARD_FUNCTIONS.get(provider, ((), _no_schedules))
        functions = [r for r in resources if r.type in fn_types]
        guarding = []
        for fn in functions:
            problem = _function_problem(fn, str(stack))
            if problem:
                why.append(problem)
                continue
            scheduled = schedules(resources, fn)
            if scheduled:
                guarding.append(fn)
            else:
                why.append(f"{fn.label} has no enabled schedule that can invoke it")
        if not functions:
            why.append("the stack declares no scheduled reaper function")
        if not isinstance(stack, str) or not stack:
            why.append(f"it has no {T.STACK} tag, so no reaper would find it")
        covered = tags.get(T.WATCHDOG) == "on" and isinstance(stack, str) and stack and guarding
        if not covered:
            found.append(
                (
                    inst,
                    f"{inst.label} is not covered by an idle guard: {'; '.join(why)}; "
                    f"{GUARD_FIX.get(provider, GUARD_FIX['aws'])}",
                )
            )
    return found


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


def check_no_blind_stop_alarms(r: Resource) -> list[str]:
    if r.type not in (AWS_METRIC_ALARM, AWS_COMPOSITE_ALARM):
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


def instance_bill(r: Resource) -> Bill | None:
    itype = instance_size(r)
    if r.type not in INSTANCES or not isinstance(itype, str):
        return None
    if r.type == AZ_VM:
        if r.get("priority") == "Spot":
            cap = positive(r.get("billingProfile", "maxPrice"))  # -1: up to on-demand
            return Bill("azure", itype, "spot", cap)
        return Bill("azure", itype, "on-demand")
    if r.type == AWS_INSTANCE:
        market = r.get("instanceMarketOptions", "marketType")
        if market == "spot":
            cap = positive(r.get("instanceMarketOptions", "spotOptions", "maxPrice"))
            return Bill("aws", itype, "spot", cap)
        return Bill("aws", itype, "on-demand")
    if r.type == TC_INSTANCE:
        charge = r.get("instanceChargeType") or "POSTPAID_BY_HOUR"
        if charge == "PREPAID":
            months = r.get("instanceChargeTypePrepaidPeriod")
            count = int(months) if isinstance(months, int | float) and months > 0 else 1
            return Bill("tencent", itype, "subscription", None, count)
        if charge == TC_SPOT:
            return Bill("tencent", itype, "spot", positive(r.get("spotMaxPrice")))
        return Bill("tencent", itype, "on-demand")
    if r.get("instanceChargeType") == "PrePaid":
        months = r.get("period")
        unit = r.get("periodUnit") or "Month"
        count = int(months) if isinstance(months, int | float) and months > 0 else 1
        return Bill("alicloud", itype, "subscription", None, count if unit == "Month" else 1)
    if r.get("spotStrategy") in ALI_SPOT:
        return Bill("alicloud", itype, "spot", positive(r.get("spotPriceLimit")))
    return Bill("alicloud", itype, "on-demand")


def is_spot(r: Resource) -> bool:
    bill = instance_bill(r)
    return bill is not None and bill.billing == "spot"


# (bill, count) -> (amount per hour for `count` such instances, currency)
Pricer = Callable[[Bill, int], tuple[float, str]]


def catalog_pricer(bill: Bill, count: int) -> tuple[float, str]:
    """The catalog's price, the same figure `make plan` and `make cost` print."""
    from infra.pricing.cost import hourly_estimate

    est = hourly_estimate(
        bill.provider,
        bill.instance_type,
        count,
        bill.billing,
        spot_max_price=bill.spot_max_price,
        subscription_months=bill.months,
    )
    return float(est["amount"]), str(est["currency"])


def stack_cost(
    resources: Sequence[Resource], pricer: Pricer
) -> tuple[dict[str, float], list[str], list[str]]:
    """({currency: amount per hour}, what was priced, what could not be priced and why)."""
    groups: dict[Bill, int] = {}
    for r in resources:
        bill = instance_bill(r)
        if bill is not None:
            groups[bill] = groups.get(bill, 0) + 1
    totals: dict[str, float] = {}
    priced: list[str] = []
    unpriced: list[str] = []
    for bill, count in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        try:
            amount, currency = pricer(bill, count)
        except (KeyError, ValueError) as exc:
            unpriced.append(f"{count}x {bill.instance_type} ({exc})")
            continue
        totals[currency] = round(totals.get(currency, 0.0) + amount, 4)
        priced.append(f"{count}x {bill.instance_type} {bill.billing}")
    return totals, priced, unpriced


def check_cost_ceiling(
    resources: Sequence[Resource], config: Mapping[str, Any], pricer: Pricer
) -> list[StackFinding]:
    ceiling = positive(config.get("maxHourlyCost"))
    if ceiling is None:
        if is_true(config.get("requireCeiling")) and any(instance_bill(r) for r in resources):
            return [
                (
                    None,
                    "the stack sets no hourly cost ceiling: set gpufleet:maxHourlyCost in the "
                    "stack file (or maxHourlyCost in this policy's pack config)",
                )
            ]
        return []
    totals, priced, unpriced = stack_cost(resources, pricer)
    found: list[StackFinding] = []
    if unpriced:
        found.append(
            (
                None,
                f"cannot check the cost ceiling {ceiling:g}/h: no catalog price for "
                f"{'; '.join(unpriced)}; add the type to infra/catalog or remove the ceiling",
            )
        )
    if len(totals) > 1:
        found.append(
            (
                None,
                f"instances are priced in several currencies ({', '.join(sorted(totals))}): "
                "one ceiling cannot cover them; split the stack per provider",
            )
        )
    for currency, amount in totals.items():
        if amount > ceiling:
            found.append(
                (
                    None,
                    f"the stack costs about {amount:g} {currency}/h ({', '.join(priced)}, catalog "
                    f"price), above the ceiling maxHourlyCost={ceiling:g}: use fewer or smaller "
                    "nodes, spot billing, or raise gpufleet:maxHourlyCost deliberately",
                )
            )
    return found


# ------------------------------------------------------------------------------- dev spot


def check_dev_spot(
    r: Resource, config: Mapping[str, Any], gpu_types: Callable[[str, str], bool]
) -> list[str]:
    if not is_gpu_instance(r, gpu_types) or not known(r.inputs.get("tags")):
        return []
    dev_tiers = [str(t) for t in as_list(config.get("devTiers"))] or list(DEV_TIERS)
    tier = r.tags.get(T.TIER)
    purpose = str(r.tags.get("purpose", "")).strip().lower()
    if tier not in dev_tiers and purpose != "dev":
        return []
    bill = instance_bill(r)
    if bill is None or bill.billing == "spot":
        return []
    why = f"tier {tier}" if tier in dev_tiers else "tag purpose=dev"
    return [
        f"{r.label} is a dev box ({why}) billed {bill.billing}: set gpufleet:billing: spot in "
        "its stack file (typically 30-70 % cheaper; gpufleet's spot nodes stop, not terminate, "
        "on interruption)"
    ]


# ---------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    level: str
    scope: str  # "resource" | "stack"
    # resource rules: (resource, config) -> messages; stack rules: (resources, config) -> findings
    check: Callable[..., Any]
    config_schema: Mapping[str, Any] = field(default_factory=dict)


def _rules(
    gpu_types: Callable[[str, str], bool] = catalog_gpu_types, pricer: Pricer = catalog_pricer
) -> tuple[Rule, ...]:
    return (
        Rule(
            "ssh-not-open-to-world",
            "SSH (port 22) must never be reachable from 0.0.0.0/0 or ::/0.",
            MANDATORY,
            "resource",
            lambda r, c: check_ssh_not_world(r),
        ),
        Rule(
            "imdsv2-required",
            "Instances and launch templates must require IMDSv2 session tokens.",
            MANDATORY,
            "resource",
            lambda r, c: check_imdsv2(r),
        ),
        Rule(
            "disks-encrypted",
            "Every root, data and scratch disk must be encrypted.",
            MANDATORY,
            "resource",
            lambda r, c: check_disks_encrypted(r),
        ),
        Rule(
            "buckets-encrypted",
            "Every bucket must have default server-side encryption.",
            MANDATORY,
            "stack",
            lambda rs, c: check_buckets_encrypted(rs),
        ),
        Rule(
            "buckets-private-tls-only",
            "Buckets must block public access and deny requests without TLS.",
            MANDATORY,
            "stack",
            lambda rs, c: check_buckets_private_tls(rs),
        ),
        Rule(
            "gpu-instances-tagged",
            "GPU instances must carry the gpufleet tags the watchdog and the reaper read.",
            MANDATORY,
            "resource",
            lambda r, c: check_gpu_tags(r, gpu_types),
        ),
        Rule(
            "gpu-instances-idle-guarded",
            "Every GPU instance must be covered by the node watchdog and a scheduled reaper.",
            MANDATORY,
            "stack",
            lambda rs, c: check_idle_guard(rs, gpu_types),
        ),
        Rule(
            "no-blind-stop-alarms",
            "No CloudWatch alarm may stop, terminate or reboot an instance: only the guards "
            "that honour protected, leases and GPU use stop nodes.",
            MANDATORY,
            "resource",
            lambda r, c: check_no_blind_stop_alarms(r),
        ),
        Rule(
            "cost-ceiling",
            "The stack's GPU instances must cost no more per hour than gpufleet:maxHourlyCost.",
            MANDATORY,
            "stack",
            lambda rs, c: check_cost_ceiling(rs, c, pricer),
            {
                "maxHourlyCost": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "ceiling in the provider's currency per hour; overrides "
                    "the stack's gpufleet:maxHourlyCost",
                },
                "requireCeiling": {
                    "type": "boolean",
                    "description": "report stacks with GPU instances that set no ceiling",
                },
            },
        ),
        Rule(
            "dev-stacks-use-spot",
            "Dev boxes (tiers t4x1/a10x1, or tagged purpose=dev) should use spot billing.",
            ADVISORY,
            "resource",
            lambda r, c: check_dev_spot(r, c, gpu_types),
            {
                "devTiers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "tiers that count as dev boxes (default t4x1, a10x1)",
                }
            },
        ),
    )


RULES: tuple[Rule, ...] = _rules()


def build_rules(
    gpu_types: Callable[[str, str], bool] = catalog_gpu_types, pricer: Pricer = catalog_pricer
) -> tuple[Rule, ...]:
    """The rules with other lookups plugged in (tests price without the catalog)."""
    return _rules(gpu_types, pricer)


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str
    description: str
    message: str
    resource_type: str | None = None  # None: the stack as a whole
    resource_name: str | None = None
    urn: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "level": self.level,
            "description": self.description,
            "resource_type": self.resource_type,
            "resource_name": self.resource_name,
            "urn": self.urn,
            "message": self.message,
        }


class PolicyConfigError(ValueError):
    """The pack configuration (Pulumi's policy config format) names or sets something wrong."""


def normalise_config(
    raw: Mapping[str, Any], rules: Sequence[Rule] = RULES
) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """Pulumi's pack config ({policy: level | {"enforcementLevel": level, prop: value}}) ->
    {policy: (level or None, properties)}; unknown policies or levels are errors."""
    names = {r.name for r in rules}
    out: dict[str, tuple[str | None, dict[str, Any]]] = {}
    for name, value in raw.items():
        if name == "all":
            if not isinstance(value, str) or value not in LEVELS:
                raise PolicyConfigError(f"all: expected one of {', '.join(LEVELS)}")
            for n in names:
                out.setdefault(n, (value, {}))
            continue
        if name not in names:
            raise PolicyConfigError(
                f"{name}: no such policy (policies: {', '.join(sorted(names))})"
            )
        level: Any
        if isinstance(value, str):
            level, props = value, {}
        elif isinstance(value, Mapping):
            props = {k: v for k, v in value.items() if k != "enforcementLevel"}
            level = value.get("enforcementLevel")
        else:
            raise PolicyConfigError(f"{name}: expected a level or an object, got {value!r}")
        if level is not None and level not in LEVELS:
            raise PolicyConfigError(f"{name}: enforcementLevel {level!r} is not one of {LEVELS}")
        schema = next(r.config_schema for r in rules if r.name == name)
        for prop, prop_value in props.items():
            problem = _schema_problem(prop_value, schema.get(prop))
            if prop not in schema:
                known_props = ", ".join(sorted(schema)) or "none"
                problem = f"no such setting (settings of {name}: {known_props})"
            if problem:
                raise PolicyConfigError(f"{name}.{prop}: {problem}")
        out[name] = (level, props)
    return out


def _schema_problem(value: Any, schema: Mapping[str, Any] | None) -> str | None:
    """What is wrong with a pack setting, for the few JSON-schema forms the rules declare (the
    CLI checks the same schema before it runs a pack)."""
    if schema is None:
        return None
    kind = schema.get("type")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {value!r}"
        if not math.isfinite(value):
            return f"expected a finite number, got {value!r}"
        low = schema.get("exclusiveMinimum")
        if low is not None and not value > low:
            return f"must be above {low}, got {value!r}"
    elif kind == "boolean" and not isinstance(value, bool):
        return f"expected true or false, got {value!r}"
    elif kind == "array":
        if not isinstance(value, list):
            return f"expected a list, got {value!r}"
        if schema.get("items", {}).get("type") == "string" and not all(
            isinstance(v, str) for v in value
        ):
            return f"expected a list of strings, got {value!r}"
    return None


def evaluate(
    resources: Sequence[Resource],
    config: Mapping[str, Any] | None = None,
    *,
    stack_config: Mapping[str, Any] | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Violation]:
    """Run every rule over the stack's resources, as `pulumi preview --policy-pack` would.

    `config` is the pack config in Pulumi's format; `stack_config` holds the stack's own
    `gpufleet:*` values (namespace stripped) that policies fall back on (maxHourlyCost).
    """
    settings = normalise_config(config or {}, rules)
    stack_config = stack_config or {}
    violations: list[Violation] = []
    for rule in rules:
        level_override, props = settings.get(rule.name, (None, {}))
        level = level_override or rule.level
        if level == DISABLED:
            continue
        merged = {**fallback_config(rule.name, stack_config), **props}
        if rule.scope == "resource":
            for r in resources:
                for message in rule.check(r, merged):
                    violations.append(
                        Violation(
                            rule.name,
                            level,
                            rule.description,
                            message,
                            r.type,
                            r.name,
                            r.urn or None,
                        )
                    )
        else:
            for target, message in rule.check(resources, merged):
                violations.append(
                    Violation(
                        rule.name,
                        level,
                        rule.description,
                        message,
                        target.type if target else None,
                        target.name if target else None,
                        (target.urn or None) if target else None,
                    )
                )
    return violations


def fallback_config(policy: str, stack_config: Mapping[str, Any]) -> dict[str, Any]:
    """Policy settings that come from the stack's own config when the pack sets none."""
    if policy == "cost-ceiling" and stack_config.get("maxHourlyCost") not in (None, ""):
        return {"maxHourlyCost": stack_config["maxHourlyCost"]}
    return {}
