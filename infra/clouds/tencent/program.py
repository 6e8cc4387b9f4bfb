"""Tencent Cloud: VPC + subnet, COS, CAM roles, CVM GPU nodes, an SCF reaper on a timer.

The SDK is tencentcloud-iac-pulumi (pure Python, pinned). Its provider plugin comes from the
tencentcloudstack GitHub releases and is needed only by a real `pulumi up`; under Pulumi's
mocks (tests, `make plan`) the resource classes below run as they are.

Known limits of CVM / the SDK, kept visible here:
- The system disk cannot be encrypted at creation: CVM's RunInstances (and so the SDK's
  ``instance.Instance``) takes no encryption flag for it. The scratch data disk is encrypted
  CBS; keep secrets off the system disk (docs/clouds/tencent.md, SECURITY.md).
- COS bucket names carry the account's APPID (``<name>-<appid>``); the program reads it from
  the ``user.get_info`` data source.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_random as random
import tencentcloud_iac_pulumi as tc

from gpufleet_node.fleet_names import HEARTBEAT_OBJECT_PREFIX
from infra import reaper_deploy as guard_logic
from infra.catalog import load_catalog
from infra.clouds import common
from infra.clouds.base import (
    AccessParts,
    GuardParts,
    NetworkParts,
    NodeParts,
    PlanNotes,
    StorageParts,
    catalog_notes,
)
from infra.clouds.common import child_opts
from infra.clouds.sdk_import import narrow
from infra.components.args import (
    AccessArgs,
    Billing,
    GuardArgs,
    NetworkArgs,
    NodeArgs,
    StorageArgs,
    billing_of,
)
from infra.config import ConfigError, StackConfig
from infra.nodes import NodeSpec
from infra.reaper import tags as T

# tc.cvm.Instance imports cvm's instance module, not all of tencentcloud_iac_pulumi.cvm
narrow(tc)

NAME = "tencent"
VPC_CIDR = "10.43.0.0/16"
SUBNET_CIDR = "10.43.0.0/20"
# Tencent's public Ubuntu image; the driver comes from `fab setup` (NVIDIA's apt repository).
UBUNTU_IMAGE_REGEX = "^Ubuntu Server 22.04"
PUBLIC_BANDWIDTH_MBPS = 100
ROOT_DISK_TYPE = "CLOUD_PREMIUM"
# SCF's cron has seconds and a year: "every 5 minutes, at second 0".
SCF_CRON = "0 */5 * * * * *"
SCF_TIMEOUT_S = 300
SCF_MEMORY_MB = 256
BUCKET_SUFFIX_BYTES = 4
# Where the reaper's zip is written for the SDK's zip_file (a local path it uploads): content
# addressed, so the same code gives the same path and no diff.
BUILD_DIR = guard_logic.BUILD_DIR


def bucket_name_for(stack: str, suffix: str, appid: str) -> str:
    """gpufleet-<stack>-<suffix>-<appid>: COS allows 50 characters for the name before the
    APPID; the suffix is always whole, the stack part is cut to fit."""
    room = 50 - len("gpufleet--") - len(suffix)
    return f"gpufleet-{stack[:room].rstrip('-')}-{suffix}-{appid}"


# The data-disk types whose delete_with_instance (POSTPAID_BY_HOUR) and
# delete_with_instance_prepaid (PREPAID) the provider applies: "only applied to
# `CLOUD_BASIC`, `CLOUD_SSD` and `CLOUD_PREMIUM` disk with `POSTPAID_BY_HOUR` instance"
# (tencentcloud-iac-pulumi 0.2.3, instance/_inputs.py InstanceDataDiskArgs, read
# 2026-12-01; tests/infra/test_tencent_provider.py reads the docstring). Neither flag names
# SPOTPAID, and a reclaimed spot instance is repossessed without its data (213/17816).
KEEPABLE_DATA_DISKS = ("CLOUD_BASIC", "CLOUD_SSD", "CLOUD_PREMIUM")
KEEPABLE_CHARGES = ("POSTPAID_BY_HOUR", "PREPAID")


def scratch_disk_fate(cfg: StackConfig, volume_class: str) -> str | None:
    """Why this stack's scratch data disk is not kept when its instance is released (a
    destroy, a spot reclaim), or None when it is. A stop always keeps every disk."""
    charge = charge_args(billing_of(cfg), cfg.instance_type)["instance_charge_type"]
    if charge == "SPOTPAID":
        return (
            "billing spot: Tencent repossesses a reclaimed spot instance without keeping its "
            "data (213/17816), so the scratch disk goes with it; the watchdog saves "
            "checkpoints to the bucket on the reclaim notice, within the time it names"
        )
    if not cfg.destroy_data and volume_class not in KEEPABLE_DATA_DISKS:
        return (
            f"gpufleet:scratchClass {volume_class}: the provider keeps a data disk after its "
            f"instance only for {', '.join(KEEPABLE_DATA_DISKS)}, so this scratch disk is "
            "released with the instance; choose CLOUD_SSD or CLOUD_PREMIUM to keep it, or "
            "keep what matters in the bucket"
        )
    return None


def stopped_mode() -> str:
    """The stop mode that keeps compute off the bill (the catalog's provider fact)."""
    return load_catalog().providers[NAME].stopped_mode


def charge_args(billing: Billing, instance_type: str) -> dict[str, Any]:
    """CVM billing arguments: POSTPAID_BY_HOUR, SPOTPAID with a bid cap (without one,
    ``instance_type``'s on-demand price), or PREPAID monthly."""
    if billing.mode == "subscription":
        return {
            "instance_charge_type": "PREPAID",
            "instance_charge_type_prepaid_period": billing.subscription_months,
            # A renewal nobody asked for is a surprise bill; expiry stops the node, data stays.
            "instance_charge_type_prepaid_renew_flag": "NOTIFY_AND_MANUAL_RENEW",
        }
    # Stopped pay-as-you-go instances stop billing compute (TCSTOP); disks stay billed.
    args: dict[str, Any] = {"stopped_mode": stopped_mode()}
    if billing.mode == "spot":
        args.update(
            instance_charge_type="SPOTPAID",
            spot_instance_type="ONE-TIME",
            # The SDK requires a cap with SPOTPAID; without one the on-demand price is the cap
            # (a spot bid above it buys nothing).
            spot_max_price=f"{billing.spot_max_price or _on_demand(instance_type):g}",
        )
    else:
        args["instance_charge_type"] = "POSTPAID_BY_HOUR"
    return args


def _on_demand(instance_type: str) -> float:
    price = load_catalog().instance(NAME, instance_type).price
    if price is None:  # the catalog test keeps every Tencent type priced
        raise ConfigError([f"gpufleet:spotMaxPrice: {instance_type} has no catalog price"])
    return price.on_demand


def _policy(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"version": "2.0", "statement": statements}, sort_keys=True)


def _tag_condition(stack: str) -> dict[str, Any]:
    """CAM's resource-tag condition: only resources carrying this stack's tag.

    Tencent's tag-based authorization (CAM "Authorization by Tag", 598/47827, whose
    example is this operator and key; the COS condition-key table, 436/46206) compares
    the resource's set of ``key&value`` tags with the listed set: ``for_all_value``
    holds only when every tag of the resource is listed (an instance carries ten tags,
    so never), ``for_any_value`` when one is. So one pair is listed, the stack's: two
    pairs in one for_any_value list would admit any resource carrying either, i.e.
    every gpufleet node of every stack (they all carry managed-by&gpufleet). The
    gpufleet:stack key is written only by gpufleet and its value names the stack, so
    this one pair scopes a grant to the stack, the same scope the reaper's
    DescribeInstances filter has (tests/infra/test_tencent_provider.py decides it)."""
    return {"for_any_value:string_equal": {"qcs:resource_tag": [f"{T.STACK}&{stack}"]}}


def cos_resource(region: str, appid: str, bucket: str, objects: bool = False) -> str:
    return f"qcs::cos:{region}:uid/{appid}:{bucket}" + ("/*" if objects else "")


def cos_bucket_api_resources(region: str, appid: str, bucket: str) -> list[str]:
    """What a bucket API's grant names: COS's authorization guide (436/31923) writes
    ``<bucket>/`` for Head Bucket and List Multipart Uploads and ``<bucket>/*`` for Get
    Bucket; a bare ``<bucket>`` is neither, so a grant on it would never match."""
    root = cos_resource(region, appid, bucket)
    return [f"{root}/", f"{root}/*"]


# What the node watchdog calls besides the bucket (infra/clouds/tencent/node.py TencentNode):
# its own tags, the account uin for the lease's resource name, the lease, its own power-off.
NODE_READ_ACTIONS = ("cvm:DescribeInstances", "sts:GetCallerIdentity")
NODE_STACK_ACTIONS = ("tag:TagResources", "cvm:StopInstances")


def node_policy(region: str, appid: str, bucket: str, stack: str) -> str:
    """The nodes' role: the stack's bucket (list, read, write, delete, multipart); reading
    instance descriptions (CVM's metadata service serves no tags) and the caller's identity;
    tagging (the lease) and stopping (the watchdog's power-off with STOP_CHARGING) only
    instances carrying this stack's tag (_tag_condition). Never terminate, never untag. Cloud
    Monitor needs no grant: the node publishes no custom metrics (infra/clouds/tencent/reaper.py).

    CAM's resource-tag condition scopes these to the stack, not to the node itself: a node
    may tag or stop its stack's other nodes (SECURITY.md)."""
    return _policy(
        [
            {
                "effect": "allow",
                "action": ["cos:GetBucket", "cos:HeadBucket", "cos:ListMultipartUploads"],
                "resource": cos_bucket_api_resources(region, appid, bucket),
            },
            {
                "effect": "allow",
                "action": [
                    "cos:GetObject",
                    "cos:HeadObject",
                    "cos:PutObject",
                    "cos:DeleteObject",
                    "cos:InitiateMultipartUpload",
                    "cos:UploadPart",
                    "cos:CompleteMultipartUpload",
                    "cos:AbortMultipartUpload",
                    "cos:ListParts",
                ],
                "resource": [cos_resource(region, appid, bucket, objects=True)],
            },
            {"effect": "allow", "action": list(NODE_READ_ACTIONS), "resource": ["*"]},
            {
                "effect": "allow",
                "action": list(NODE_STACK_ACTIONS),
                "resource": ["*"],
                "condition": _tag_condition(stack),
            },
            {
                "effect": "deny",
                "action": ["cvm:TerminateInstances", "tag:UnTagResources", "tag:DeleteTags"],
                "resource": ["*"],
            },
        ]
    )


def reaper_actions() -> tuple[str, ...]:
    """What the reaper calls: its contract (infra/clouds/tencent/reaper.py CAM_ACTIONS)."""
    from infra.clouds.tencent.reaper import CAM_ACTIONS

    return tuple(CAM_ACTIONS)


def reaper_policy(stack: str, bucket_arn: str) -> str:
    """Describe instances and read GPU metrics anywhere; HEAD only the heartbeat objects
    in the stack's bucket (``bucket_arn``: cos_resource); stop only instances carrying
    this stack's tag; never terminate."""
    actions = reaper_actions()
    stop = [a for a in actions if a == "cvm:StopInstances"]
    cos = [a for a in actions if a.startswith("cos:")]
    reads = [a for a in actions if a not in stop and a not in cos]
    statements: list[dict[str, Any]] = [{"effect": "allow", "action": reads, "resource": ["*"]}]
    if cos:
        statements.append(
            {
                "effect": "allow",
                "action": cos,
                "resource": [f"{bucket_arn}/{HEARTBEAT_OBJECT_PREFIX}*"],
            }
        )
    statements += [
        {
            "effect": "allow",
            "action": stop,
            "resource": ["qcs::cvm::uin/*:instance/*"],
            "condition": _tag_condition(stack),
        },
        {"effect": "deny", "action": ["cvm:TerminateInstances"], "resource": ["*"]},
    ]
    return _policy(statements)


def tls_only_policy(region: str, appid: str, bucket: str) -> str:
    """COS bucket policy: refuse every request made over plain HTTP.

    The documented form (COS "Descriptions and Use Cases of Condition Keys", 436/46206,
    "denying any non-HTTPS request"): ``bool_equal`` on ``cos:secure-transport``
    "false", element names lowercase (436/46205). ``<bucket>/*`` covers the bucket's
    objects and its bucket APIs (``<bucket>/``, 436/31923)."""
    return _policy(
        [
            {
                "effect": "deny",
                "principal": {"qcs": ["qcs::cam::anyone:anyone"]},
                "action": ["name/cos:*"],
                "resource": [cos_resource(region, appid, bucket, objects=True)],
                "condition": {"bool_equal": {"cos:secure-transport": "false"}},
            }
        ]
    )


def assume_role(service: str) -> str:
    return _policy(
        [
            {
                "effect": "allow",
                "action": ["name/sts:AssumeRole"],
                "principal": {"service": [service]},
            }
        ]
    )


def _role_with_policy(
    parent: pulumi.Resource,
    name: str,
    role_name: str,
    service: str,
    document: pulumi.Input[str],
    role_description: str,
    policy_description: str,
    tags: dict[str, str],
) -> tuple[tc.cam.Role, tc.cam.Policy]:
    """A CAM role ``service`` assumes (no console login) with one policy of the same name
    attached: ``<name>-role``, ``<name>-policy``, ``<name>-attach``."""
    role = tc.cam.Role(
        f"{name}-role",
        name=role_name,
        document=assume_role(service),
        description=role_description,
        console_login=False,
        tags=tags,
        opts=child_opts(parent),
    )
    policy = tc.cam.Policy(
        f"{name}-policy",
        name=role_name,
        document=document,
        description=policy_description,
        opts=child_opts(parent),
    )
    tc.cam.RolePolicyAttachment(
        f"{name}-attach", role_id=role.id, policy_id=policy.id, opts=child_opts(parent)
    )
    return role, policy


def function_zip_path() -> str:
    """The reaper package (infra/reaper/handler.py build_function_zip) as a file: the SDK's
    zip_file is a local path. Named by its content's digest, written once, the older ones
    removed (reaper_deploy.function_zip_file)."""
    return str(guard_logic.function_zip_file(NAME, BUILD_DIR))


def function_env(args: GuardArgs) -> dict[str, str]:
    """Exactly the variables the reaper's Tencent contract names (FUNCTION_ENV)."""
    from infra.clouds.tencent.reaper import FUNCTION_ENV

    env = guard_logic.function_env(args)
    missing = [k for k in FUNCTION_ENV if k not in env]
    if missing:  # the contract grew: the program must learn to set it
        raise RuntimeError(f"the Tencent reaper needs {missing}; infra/reaper_deploy.py sets none")
    return {k: env[k] for k in FUNCTION_ENV}


def _first(found: Any, key: str) -> Any:
    item = found[0]
    return item[key] if isinstance(item, Mapping) else getattr(item, key)


class TencentProvider:
    name = NAME

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        return catalog_notes(cfg, today, self.stack_notes(cfg))

    def stack_notes(self, cfg: StackConfig) -> list[str]:
        """What the plan must tell people about this stack on Tencent (a disk it keeps)."""
        from infra.nodes import plan_scratch

        itype = load_catalog().instance(NAME, cfg.instance_type)
        scratch = plan_scratch(cfg, itype)
        fate = (
            scratch_disk_fate(cfg, scratch.volume_class or "") if scratch.kind == "disk" else None
        )
        return [fate] if fate else []

    def provider_resource(self, region: str) -> pulumi.ProviderResource:
        return tc.Provider("tencentcloud", region=region)

    def _appid(self, parent: pulumi.Resource) -> pulumi.Output[str]:
        info = tc.user.get_info_output(opts=pulumi.InvokeOutputOptions(parent=parent))
        return info.app_id

    def _zone(self, parent: pulumi.Resource, args: NetworkArgs) -> pulumi.Output[str]:
        def offered() -> pulumi.Output[list[str]]:
            # The data source filters by family only (zone, instance-family, charge type).
            family = args.instance_type.split(".", 1)[0]
            types = tc.instance.get_types_output(
                filters=[tc.instance.GetTypesFilterArgs(name="instance-family", values=[family])],
                exclude_sold_out=True,
                opts=pulumi.InvokeOutputOptions(parent=parent),
            )
            return types.instance_types.apply(
                lambda found: [
                    zone
                    for zone in {
                        str(_first([t], "availability_zone"))
                        for t in found
                        if _first([t], "instance_type") == args.instance_type
                    }
                    if zone.startswith(args.region)
                ]
            )

        return common.pinned_or_first_zone(
            args.zone,
            offered,
            f"gpufleet:region: no zone in {args.region} sells {args.instance_type} "
            "now: set gpufleet:region or gpufleet:zone, or pick another profile",
        )

    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts:
        tags = args.tags
        zone = self._zone(parent, args)
        vpc = tc.vpc.Instance(
            f"{name}-vpc",
            name=f"{name}-vpc"[:60],
            cidr_block=VPC_CIDR,
            tags=tags,
            opts=child_opts(parent),
        )
        subnet = tc.subnet.Instance(
            f"{name}-subnet",
            name=f"{name}-subnet"[:60],
            vpc_id=vpc.id,
            cidr_block=SUBNET_CIDR,
            availability_zone=zone,
            tags=tags,
            opts=child_opts(parent),
        )
        sg = tc.security.Group(
            f"{name}-sg",
            name=f"{name}-sg"[:60],
            description=f"gpufleet {args.stack}: SSH from listed networks, all between nodes",
            tags=tags,
            opts=child_opts(parent),
        )
        ssh = [
            tc.security.GroupRuleSetIngressArgs(
                action="ACCEPT",
                protocol="TCP",
                port="22",
                cidr_block=ipv4,
                ipv6_cidr_block=ipv6,
                description="SSH from an allowed network",
            )
            for ipv4, ipv6 in map(common.ipv4_or_ipv6, args.ssh_cidrs)
        ]
        tc.security.GroupRuleSet(
            f"{name}-rules",
            security_group_id=sg.id,
            ingresses=[
                *ssh,
                tc.security.GroupRuleSetIngressArgs(
                    action="ACCEPT",
                    protocol="ALL",
                    port="all",
                    source_security_id=sg.id,
                    description="all traffic between the stack's nodes (NCCL, rendezvous)",
                ),
            ],
            egresses=[
                tc.security.GroupRuleSetEgressArgs(
                    action="ACCEPT",
                    protocol="ALL",
                    port="all",
                    cidr_block="0.0.0.0/0",
                    description="packages, the bucket, the cloud APIs",
                )
            ],
            opts=child_opts(parent),
        )
        return NetworkParts(vpc.id, subnet.id, sg.id, zone, None)

    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts:
        tags = args.tags
        keep = not args.destroy_data
        appid = self._appid(parent)
        # COS names are account-wide and a destroy keeps the bucket: a random suffix held in
        # the stack's state is stable across updates and new after a destroy.
        suffix = random.RandomId(
            f"{name}-bucket-suffix", byte_length=BUCKET_SUFFIX_BYTES, opts=child_opts(parent)
        )
        bucket_name = pulumi.Output.all(suffix.hex, appid).apply(
            lambda a: bucket_name_for(args.stack, a[0], a[1])
        )
        days = args.archive_days
        bucket = tc.cos.Bucket(
            f"{name}-bucket",
            bucket=bucket_name,
            acl="private",
            versioning_enable=True,
            encryption_algorithm="AES256",
            force_clean=args.destroy_data,
            lifecycle_rules=[
                tc.cos.BucketLifecycleRuleArgs(
                    id="archive-old-objects",
                    filter_prefix="",
                    transitions=[
                        tc.cos.BucketLifecycleRuleTransitionArgs(
                            days=days, storage_class="STANDARD_IA"
                        ),
                        tc.cos.BucketLifecycleRuleTransitionArgs(
                            days=days + common.ARCHIVE_AFTER_COOL_DAYS, storage_class="ARCHIVE"
                        ),
                    ],
                    non_current_transitions=[
                        tc.cos.BucketLifecycleRuleNonCurrentTransitionArgs(
                            non_current_days=days, storage_class="STANDARD_IA"
                        )
                    ],
                    abort_incomplete_multipart_upload=(
                        tc.cos.BucketLifecycleRuleAbortIncompleteMultipartUploadArgs(
                            days_after_initiation=common.ABORT_MULTIPART_DAYS
                        )
                    ),
                )
            ],
            tags=tags,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        tc.cos.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.bucket,
            policy=pulumi.Output.all(bucket.bucket, appid).apply(
                lambda a: tls_only_policy(args.region, a[1], a[0])
            ),
            opts=child_opts(parent, retain_on_delete=keep),
        )
        arn = pulumi.Output.all(bucket.bucket, appid).apply(
            lambda a: cos_resource(args.region, a[1], a[0])
        )
        return StorageParts(bucket.bucket, arn)

    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts:
        tags = args.tags
        key = tc.key.Pair(
            f"{name}-key",
            # CVM key names: letters, digits and underscores, at most 25 characters.
            key_name=("gpufleet_" + "".join(c if c.isalnum() else "_" for c in args.stack))[:25],
            public_key=args.ssh_public_key,
            tags=tags,
            opts=child_opts(parent),
        )
        appid = self._appid(parent)
        document = pulumi.Output.all(storage.bucket, appid).apply(
            lambda a: node_policy(args.region, a[1], a[0], args.stack)
        )
        role, policy = _role_with_policy(
            parent,
            f"{name}-node",
            f"gpufleet-{args.stack}-node"[:128],
            "cvm.qcloud.com",
            document,
            f"gpufleet {args.stack} GPU nodes: stack bucket, own tags, lease, stop",
            f"gpufleet {args.stack} GPU nodes: bucket, tags, lease, stop (stack only)",
            tags,
        )
        return AccessParts(role.name, None, key.id, policy.name)

    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        images = tc.images.get_instance_output(
            image_types=["PUBLIC_IMAGE"],
            image_name_regex=UBUNTU_IMAGE_REGEX,
            instance_type=spec.instance_type.name,
            opts=pulumi.InvokeOutputOptions(parent=parent),
        )
        data_disks = None
        if spec.scratch.kind == "disk":
            data_disks = [
                tc.instance.InstanceDataDiskArgs(
                    data_disk_name=f"{spec.name}-scratch"[:60],
                    data_disk_type=spec.scratch.volume_class or "CLOUD_HSSD",
                    data_disk_size=spec.scratch.size_gb,
                    encrypt=True,
                    # Asked to stay after the instance unless the stack says data may go;
                    # the provider applies it to some types and charges only
                    # (KEEPABLE_DATA_DISKS; the plan says when: stack_notes).
                    delete_with_instance=args.destroy_data,
                    delete_with_instance_prepaid=args.destroy_data,
                )
            ]
        instance = tc.instance.Instance(
            spec.name,
            instance_name=spec.name[:60],
            hostname=spec.name[:60],
            instance_type=spec.instance_type.name,
            image_id=images.image_id,
            availability_zone=net.zone,
            vpc_id=net.vpc_id,
            subnet_id=net.subnet_id,
            orderly_security_groups=[net.security_group_id],
            key_ids=[access.key_name],
            cam_role_name=access.role_name,
            system_disk_type=ROOT_DISK_TYPE,
            system_disk_size=args.root_disk_gb,
            data_disks=data_disks,
            allocate_public_ip=True,
            internet_charge_type="TRAFFIC_POSTPAID_BY_HOUR",
            internet_max_bandwidth_out=PUBLIC_BANDWIDTH_MBPS,
            user_data_raw=spec.user_data,
            # A stack that keeps its data never loses an instance to a stray destroy.
            disable_api_termination=not args.destroy_data,
            tags=spec.tags,
            opts=child_opts(parent, ignore_changes=["imageId"]),
            **charge_args(args.billing, spec.instance_type.name),
        )
        return NodeParts(instance.id, instance.public_ip, instance.private_ip)

    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts:
        from infra.clouds.tencent.entry import HANDLER as SCF_HANDLER
        from infra.clouds.tencent.reaper import BUCKET_ENV, SCF_RUNTIME

        tags = args.tags
        role, _ = _role_with_policy(
            parent,
            f"{name}-reaper",
            f"gpufleet-{args.stack}-reaper"[:128],
            "scf.qcloud.com",
            storage.bucket_arn.apply(lambda arn: reaper_policy(args.stack, arn)),
            f"gpufleet {args.stack} idle reaper: stop-only, this stack's tags only",
            f"gpufleet {args.stack} idle reaper: describe, metrics, stop tagged",
            tags,
        )
        # SCF names: letters, digits, - and _, starting with a letter, 2-60 characters.
        fn_name = guard_logic.function_name(args.stack)[:60].rstrip("-_")
        fn = tc.scf.Function(
            f"{name}-reaper",
            name=fn_name,
            runtime=SCF_RUNTIME,
            handler=SCF_HANDLER,
            zip_file=function_zip_path(),
            role=role.name,
            timeout=SCF_TIMEOUT_S,
            mem_size=SCF_MEMORY_MB,
            # The bucket the nodes write their heartbeat objects to (the reaper reads them).
            environment={**function_env(args), BUCKET_ENV: storage.bucket},
            description=f"gpufleet {args.stack}: stop idle GPU nodes ({stopped_mode()})",
            triggers=[
                tc.scf.FunctionTriggerArgs(
                    name="every_5_minutes", type="timer", trigger_desc=SCF_CRON
                )
            ],
            tags=tags,
            opts=child_opts(parent),
        )
        return GuardParts(fn.name, SCF_CRON, None, console_note=NO_DASHBOARD)


# Why a Tencent stack declares no monitoring view (docs/monitoring.md says the same): the
# provider (tencentcloud-iac-pulumi 0.2.3, tencentcloud_iac_pulumi.monitor) declares alarm
# policies and managed Grafana, no Cloud Monitor dashboard; the CVM console's own
# monitoring tab shows the QCE/CVM GPU metrics per instance without one.
NO_DASHBOARD = (
    "none declared: tencentcloud-iac-pulumi has no Cloud Monitor dashboard resource; the CVM "
    "console's Monitoring tab shows each node's GPU metrics"
)

PROVIDER = TencentProvider()
