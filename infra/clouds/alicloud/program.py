"""Alibaba Cloud: VPC + VSwitch, OSS, RAM role, ECS GPU nodes, a Function Compute reaper."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pulumi
import pulumi_alicloud as ali
import pulumi_random as random

from infra import reaper_deploy as guard_logic
from infra.clouds import common
from infra.clouds.alicloud import entry
from infra.clouds.alicloud.reaper import WHEELS_RUNTIME  # the runtime its wheels are built for
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
)
from infra.config import StackConfig
from infra.nodes import NodeSpec
from infra.reaper import tags as T

# ali.ecs.Instance imports ecs's instance module, not the ~90 of pulumi_alicloud.ecs
narrow(ali)

VPC_CIDR = "10.42.0.0/16"
VSWITCH_CIDR = "10.42.0.0/20"
# Alibaba's public Ubuntu image; the driver comes from `fab setup` (NVIDIA's apt repository).
UBUNTU_IMAGE_REGEX = "^ubuntu_22_04_x64"
PUBLIC_BANDWIDTH_MBPS = 100


# ecs.Instance spot_interruption_behavior: "Terminate" (released, the default) or "Stop"
# ("stopped in economical mode"; pulumi_alicloud's InstanceArgs, ECS RunInstances).
SPOT_INTERRUPTION_BEHAVIOR = "Stop"

BUCKET_SUFFIX_BYTES = 4
RAM_VERSION = "1"


def bucket_name_for(stack: str, suffix: str) -> str:
    """gpufleet-<stack>-<suffix>: at most 63 characters (OSS), the suffix always whole."""
    return f"gpufleet-{stack[: 63 - len('gpufleet--') - len(suffix)].rstrip('-')}-{suffix}"


def charge_args(billing: Billing) -> dict[str, Any]:
    """ECS billing arguments: PostPaid (+ spot strategy) or PrePaid by the month."""
    if billing.mode == "subscription":
        return {
            "instance_charge_type": "PrePaid",
            "period": billing.subscription_months,
            "period_unit": "Month",
            # A renewal nobody asked for is a surprise bill; expiry stops the node, data stays.
            "renewal_status": "Normal",
        }
    args: dict[str, Any] = {
        "instance_charge_type": "PostPaid",
        # Stopped pay-as-you-go VPC instances stop billing compute (AC).
        "stopped_mode": "StopCharging",
    }
    if billing.mode == "spot":
        # A reclaimed spot instance is stopped in economical mode, not released (the
        # default, Terminate): its system disk and the ESSD scratch disk stay, with the
        # checkpoints on them, and it can be started again when capacity returns.
        args["spot_interruption_behavior"] = SPOT_INTERRUPTION_BEHAVIOR
        if billing.spot_max_price:
            args.update(spot_strategy="SpotWithPriceLimit", spot_price_limit=billing.spot_max_price)
        else:
            args.update(spot_strategy="SpotAsPriceGo")
    else:
        args["spot_strategy"] = "NoSpot"
    return args


def tls_only_policy(bucket: str) -> str:
    return common.policy_json(
        RAM_VERSION,
        [
            {
                "Effect": "Deny",
                "Principal": ["*"],
                "Action": ["oss:*"],
                "Resource": [f"acs:oss:*:*:{bucket}", f"acs:oss:*:*:{bucket}/*"],
                "Condition": {"Bool": {"acs:SecureTransport": ["false"]}},
            }
        ],
    )


# Every tag the watchdog or the reaper reads, except the lease the node may write itself.
GUARDED_TAG_KEYS = (
    T.MANAGED_BY,
    T.STACK,
    T.TIER,
    T.ROLE,
    T.IDLE_MINUTES,
    T.TTL_HOURS,
    T.WATCHDOG,
    T.PROTECTED,
    # The guards' stop record: ECS keeps no stop reason of its own, but CloudMonitor's
    # spot interruption event is the record there (infra/clouds/alicloud/reaper.py), so
    # no node writes one; a node that could would stop itself idle and call it a reclaim.
    T.STOPPED_BY,
)
NODE_TAG_ACTIONS = ["ecs:TagResources", "ecs:AddTags"]


def request_carries(tag_key: str) -> dict[str, dict[str, str]]:
    """A condition that holds when the request sets tag ``tag_key``, to any value.

    RAM documents five operator families (string, number, date and time, Boolean,
    IP address: help/en/ram/conditional-operator) and no ``Null``, so presence is
    StringLike ``*`` ("matches any number of characters, including an empty
    string"). A request without the tag has no acs:RequestTag/<key> value to
    match, so the condition does not hold there (a matching operator needs a
    value; tests/infra/alicloud_ram.py). Were RAM to read an absent key as a
    match instead, the Denies below would refuse every tag write and the lease
    Allow would still need the lease: both fail closed."""
    return {"StringLike": {f"acs:RequestTag/{tag_key}": "*"}}


def node_policy(bucket: str, stack: str) -> str:
    return common.policy_json(
        RAM_VERSION,
        [
            {
                "Effect": "Allow",
                "Action": ["oss:ListObjects", "oss:GetBucketInfo"],
                "Resource": [f"acs:oss:*:*:{bucket}"],
            },
            {
                "Effect": "Allow",
                "Action": [
                    "oss:GetObject",
                    "oss:PutObject",
                    "oss:DeleteObject",
                    "oss:AbortMultipartUpload",
                ],
                "Resource": [f"acs:oss:*:*:{bucket}/*"],
            },
            {"Effect": "Allow", "Action": ["cms:PutCustomMetric"], "Resource": ["*"]},
            # The watchdog reads its own tags (protected, lease, limits) with
            # ListTagResources: Alicloud's metadata service does not serve tags yet. Read
            # only; not scoped by tag, since a denied read would leave the node unguarded
            # by idleness (unknown tags count as activity) until its TTL.
            {"Effect": "Allow", "Action": ["ecs:ListTagResources"], "Resource": ["*"]},
            # Tagging is allowed per node (lease_policy, on the node's own role); never
            # with a tag the guards decide on: RAM documents only acs:RequestTag/<key>
            # for tag requests (no "these keys only" operator), so each such key gets its
            # own Deny, which wins over any Allow.
            *[
                {
                    "Effect": "Deny",
                    "Action": NODE_TAG_ACTIONS,
                    "Resource": ["*"],
                    "Condition": request_carries(key),
                }
                for key in GUARDED_TAG_KEYS
            ],
            {
                # removing a tag (the stack's, the TTL's) is never the node's business
                "Effect": "Deny",
                "Action": ["ecs:UntagResources", "ecs:RemoveTags"],
                "Resource": ["*"],
            },
        ],
    )


def lease_policy(instance_id: str, stack: str) -> str:
    """What one node may do to its own instance (by id), while it is this stack's
    managed one: tag it in a request that carries the lease, and stop it in economical
    mode (the watchdog's idle stop: ECS StopInstance, whose StoppedMode=StopCharging only
    an API call sets). Attached to that node's role alone; node_policy's Denies still
    refuse every tag the guards read. No other instance, no start, no delete."""
    own = [f"acs:ecs:*:*:instance/{instance_id}"]
    managed = {
        f"acs:ResourceTag/{T.STACK}": [stack],
        f"acs:ResourceTag/{T.MANAGED_BY}": [T.MANAGED_BY_VALUE],
    }
    return common.policy_json(
        RAM_VERSION,
        [
            {
                "Effect": "Allow",
                "Action": ["ecs:TagResources"],
                "Resource": own,
                "Condition": {
                    "StringEquals": managed,
                    **request_carries(T.KEEP_ALIVE_UNTIL),
                },
            },
            {
                "Effect": "Allow",
                "Action": ["ecs:StopInstance"],
                "Resource": own,
                "Condition": {"StringEquals": managed},
            },
        ],
    )


def reaper_policy(stack: str) -> str:
    """Describe anything, read the spot interruption events, stop and start (a reclaimed
    spot node, infra/reaper/recovery.py) only instances carrying this stack's managed tags;
    no delete."""
    return common.policy_json(
        RAM_VERSION,
        [
            {
                "Effect": "Allow",
                "Action": [
                    "ecs:DescribeInstances",
                    "cms:DescribeMetricList",
                    "cms:DescribeSystemEventAttribute",
                ],
                "Resource": ["*"],
            },
            {
                "Effect": "Allow",
                "Action": ["ecs:StopInstances", "ecs:StartInstances"],
                "Resource": ["acs:ecs:*:*:instance/*"],
                "Condition": {
                    "StringEquals": {
                        f"acs:ResourceTag/{key}": [value]
                        for key, value in common.managed_stack_tags(stack)
                    }
                },
            },
        ],
    )


def assume_role(service: str) -> str:
    return common.policy_json(
        RAM_VERSION,
        [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": [service]}}],
    )


def _role(
    parent: pulumi.Resource,
    name: str,
    role_name: str,
    service: str,
    description: str,
    tags: dict[str, str],
) -> ali.ram.Role:
    """A RAM role ``service`` assumes (``<name>-role``), with no policy yet."""
    return ali.ram.Role(
        f"{name}-role",
        role_name=role_name[:64],
        assume_role_policy_document=assume_role(service),
        description=description,
        tags=tags,
        opts=child_opts(parent),
    )


def _custom_policy(
    parent: pulumi.Resource,
    name: str,
    policy_name: str,
    document: pulumi.Input[str],
    description: str,
    tags: dict[str, str],
) -> ali.ram.Policy:
    return ali.ram.Policy(
        name,
        policy_name=policy_name[:128],
        policy_document=document,
        description=description,
        tags=tags,
        opts=child_opts(parent),
    )


def _attach(
    parent: pulumi.Resource, name: str, role_name: pulumi.Input[str], policy_name: pulumi.Input[str]
) -> None:
    """Attach a custom policy to a role (RAM has no inline kind)."""
    ali.ram.RolePolicyAttachment(
        name,
        role_name=role_name,
        policy_name=policy_name,
        policy_type="Custom",
        opts=child_opts(parent),
    )


def _role_with_policy(
    parent: pulumi.Resource,
    name: str,
    role_name: str,
    service: str,
    document: pulumi.Input[str],
    description: str,
    tags: dict[str, str],
) -> ali.ram.Role:
    """A RAM role a service assumes, with one custom policy of the same name attached."""
    role = _role(parent, name, role_name, service, description, tags)
    policy = _custom_policy(parent, f"{name}-policy", role_name, document, description, tags)
    _attach(parent, f"{name}-attach", role.role_name, policy.policy_name)
    return role


class AlicloudProvider:
    name = "alicloud"

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        return catalog_notes(cfg, today)

    def provider_resource(self, region: str) -> pulumi.ProviderResource:
        return ali.Provider("alicloud", region=region)

    def _zone(self, parent: pulumi.Resource, args: NetworkArgs) -> pulumi.Output[str]:
        def offered() -> pulumi.Output[list[str]]:
            zones = ali.get_zones_output(
                available_instance_type=args.instance_type,
                available_resource_creation="Instance",
                available_disk_category="cloud_essd",
                opts=pulumi.InvokeOutputOptions(parent=parent),
            )
            return zones.zones.apply(
                lambda found: [str(z["id"] if isinstance(z, dict) else z.id) for z in found]
            )

        return common.pinned_or_first_zone(
            args.zone,
            offered,
            f"gpufleet:region: no zone in {args.region} offers {args.instance_type} "
            "with ESSD disks now: set gpufleet:region or gpufleet:zone, or pick "
            "another profile",
        )

    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts:
        tags = args.tags
        zone = self._zone(parent, args)
        vpc = ali.vpc.Network(
            f"{name}-vpc",
            vpc_name=f"{name}-vpc",
            cidr_block=VPC_CIDR,
            tags=tags,
            opts=child_opts(parent),
        )
        vsw = ali.vpc.Switch(
            f"{name}-vsw",
            vswitch_name=f"{name}-vsw",
            vpc_id=vpc.id,
            cidr_block=VSWITCH_CIDR,
            zone_id=zone,
            tags=tags,
            opts=child_opts(parent),
        )
        sg = ali.ecs.SecurityGroup(
            f"{name}-sg",
            security_group_name=f"{name}-sg",
            vpc_id=vpc.id,
            description=f"gpufleet {args.stack}: SSH from listed networks, all between nodes",
            tags=tags,
            opts=child_opts(parent),
        )

        def accept(suffix: str, description: str, **peer: Any) -> None:
            """One inbound rule of the group: ``peer`` says which traffic."""
            ali.ecs.SecurityGroupRule(
                f"{name}-{suffix}",
                security_group_id=sg.id,
                type="ingress",
                nic_type="intranet",
                policy="accept",
                description=description,
                opts=child_opts(parent),
                **peer,
            )

        for i, cidr in enumerate(args.ssh_cidrs):
            ipv4, ipv6 = common.ipv4_or_ipv6(cidr)
            ssh = {"ip_protocol": "tcp", "port_range": "22/22"}
            accept(
                f"ssh-{i}", "SSH from an allowed network", **ssh, cidr_ip=ipv4, ipv6_cidr_ip=ipv6
            )
        accept(
            "intra",
            "all traffic between the stack's nodes (NCCL, rendezvous)",
            ip_protocol="all",
            port_range="-1/-1",
            source_security_group_id=sg.id,
        )
        return NetworkParts(vpc.id, vsw.id, sg.id, zone, None)

    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts:
        tags = args.tags
        keep = not args.destroy_data
        # OSS names are global, and a destroy keeps the bucket (retain_on_delete): a fixed name
        # would make the next `pulumi up` fail on the bucket it kept. A random suffix, held in
        # the stack's state, is stable across updates and new after a destroy.
        suffix = random.RandomId(
            f"{name}-bucket-suffix", byte_length=BUCKET_SUFFIX_BYTES, opts=child_opts(parent)
        )
        bucket_name = suffix.hex.apply(lambda h: bucket_name_for(args.stack, h))
        days = args.archive_days
        bucket = ali.oss.Bucket(
            f"{name}-bucket",
            bucket=bucket_name,
            force_destroy=args.destroy_data,
            storage_class="Standard",
            redundancy_type="LRS",
            versioning=ali.oss.BucketVersioningArgs(status="Enabled"),
            server_side_encryption_rule=ali.oss.BucketServerSideEncryptionRuleArgs(
                sse_algorithm="AES256"
            ),
            lifecycle_rules=[
                ali.oss.BucketLifecycleRuleArgs(
                    id="archive-old-objects",
                    enabled=True,
                    prefix="",
                    transitions=[
                        ali.oss.BucketLifecycleRuleTransitionArgs(days=days, storage_class="IA"),
                        ali.oss.BucketLifecycleRuleTransitionArgs(
                            days=days + common.ARCHIVE_AFTER_COOL_DAYS, storage_class="Archive"
                        ),
                    ],
                    noncurrent_version_transitions=[
                        ali.oss.BucketLifecycleRuleNoncurrentVersionTransitionArgs(
                            days=days, storage_class="IA"
                        )
                    ],
                    abort_multipart_uploads=[
                        ali.oss.BucketLifecycleRuleAbortMultipartUploadArgs(
                            days=common.ABORT_MULTIPART_DAYS
                        )
                    ],
                )
            ],
            tags=tags,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        ali.oss.BucketAcl(
            f"{name}-acl",
            bucket=bucket.bucket,
            acl="private",
            opts=child_opts(parent, retain_on_delete=keep),
        )
        ali.oss.BucketPublicAccessBlock(
            f"{name}-public-block",
            bucket=bucket.bucket,
            block_public_access=True,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        ali.oss.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.bucket,
            policy=bucket.bucket.apply(tls_only_policy),
            opts=child_opts(parent, retain_on_delete=keep),
        )
        arn = bucket.bucket.apply(lambda b: f"acs:oss:*:*:{b}")
        return StorageParts(bucket.bucket, arn)

    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts:
        tags = args.tags
        key = ali.ecs.EcsKeyPair(
            f"{name}-key",
            key_pair_name=f"gpufleet-{args.stack}",
            public_key=args.ssh_public_key,
            tags=tags,
            opts=child_opts(parent),
        )
        # One policy for the stack's nodes; each node gets its own role (node()), so that the
        # right to write a lease can name that node's instance alone.
        policy = _custom_policy(
            parent,
            f"{name}-node-policy",
            f"gpufleet-{args.stack}-node",
            storage.bucket.apply(lambda b: node_policy(b, args.stack)),
            f"gpufleet {args.stack} GPU nodes: stack bucket, custom metrics, no tags",
            tags,
        )
        return AccessParts(None, None, key.key_pair_name, policy.policy_name)

    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        images = ali.ecs.get_images_output(
            name_regex=UBUNTU_IMAGE_REGEX,
            owners="system",
            most_recent=True,
            opts=pulumi.InvokeOutputOptions(parent=parent),
        )
        image_id = images.images.apply(
            lambda xs: xs[0]["id"] if isinstance(xs[0], dict) else xs[0].id
        )
        data_disks = [
            ali.ecs.InstanceDataDiskArgs(
                name=f"{spec.name}-scratch",
                category="cloud_essd",
                performance_level=spec.scratch.volume_class,
                size=spec.scratch.size_gb,
                encrypted=True,
                delete_with_instance=args.destroy_data,
                description="gpufleet scratch (fast ESSD: no local NVMe on this family)",
            )
        ]
        role = _role(
            parent,
            spec.name,
            f"gpufleet-{spec.name}",
            "ecs.aliyuncs.com",
            f"gpufleet node {spec.name}: stack bucket, metrics, its own lease tag",
            args.tags,
        )
        if access.node_policy is not None:
            _attach(parent, f"{spec.name}-stack-policy", role.role_name, access.node_policy)
        instance = ali.ecs.Instance(
            spec.name,
            instance_name=spec.name,
            host_name=spec.name,
            instance_type=spec.instance_type.name,
            image_id=image_id,
            availability_zone=net.zone,
            vswitch_id=net.subnet_id,
            security_groups=[net.security_group_id],
            key_name=access.key_name,
            role_name=role.role_name,
            system_disk_category="cloud_essd",
            system_disk_performance_level="PL0",
            system_disk_size=args.root_disk_gb,
            system_disk_encrypted=True,
            data_disks=data_disks if spec.scratch.kind == "disk" else None,
            internet_charge_type="PayByTraffic",
            internet_max_bandwidth_out=PUBLIC_BANDWIDTH_MBPS,
            http_endpoint="enabled",
            http_tokens="required",
            user_data=spec.user_data,
            tags=spec.tags,
            volume_tags=spec.tags,
            opts=child_opts(parent, ignore_changes=["image_id"]),
            # capacityReservation: start from that elasticity assurance's or capacity
            # reservation's private pool and only there (Target: no fallback to the public pool)
            private_pool_options_match_criteria="Target" if args.capacity_reservation else None,
            private_pool_options_id=args.capacity_reservation,
            **charge_args(args.billing),
        )
        lease = _custom_policy(
            parent,
            f"{spec.name}-lease-policy",
            f"gpufleet-{spec.name}-lease",
            instance.id.apply(lambda i: lease_policy(i, args.stack)),
            f"gpufleet node {spec.name}: its own lease tag only",
            args.tags,
        )
        _attach(parent, f"{spec.name}-lease-attach", role.role_name, lease.policy_name)
        return NodeParts(instance.id, instance.public_ip, instance.primary_ip_address)

    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts:
        tags = args.tags
        role = _role_with_policy(
            parent,
            f"{name}-reaper",
            f"gpufleet-{args.stack}-reaper",
            "fc.aliyuncs.com",
            reaper_policy(args.stack),
            f"gpufleet {args.stack} idle reaper: stop-only, this stack's tags only",
            tags,
        )
        fn_name = guard_logic.function_name(args.stack)
        fn = ali.fc.V3Function(
            f"{name}-reaper",
            function_name=fn_name,
            runtime=str(WHEELS_RUNTIME["name"]),
            handler=entry.HANDLER,
            code=ali.fc.V3FunctionCodeArgs(
                zip_file=base64.b64encode(guard_logic.function_zip(self.name)).decode()
            ),
            role=role.arn,
            timeout=300,
            memory_size=256,
            cpu=0.25,
            disk_size=512,
            environment_variables=guard_logic.function_env(args),
            description=f"gpufleet {args.stack}: stop idle GPU nodes (StopCharging)",
            tags=tags,
            opts=child_opts(parent),
        )
        ali.fc.V3Trigger(
            f"{name}-timer",
            function_name=fn.function_name,
            trigger_name="every-5-minutes",
            trigger_type="timer",
            trigger_config=json.dumps(
                {"cronExpression": entry.SCHEDULE, "enable": True, "payload": "{}"}
            ),
            qualifier="LATEST",
            opts=child_opts(parent),
        )
        group = self._monitor_group(parent, name, args, nodes)
        return GuardParts(
            fn.function_name,
            entry.SCHEDULE,
            group.monitor_group_name,
            # The console's home: a group's own page address is not documented, so the
            # note names where it is (Application Groups, by its name).
            console_url="https://cloudmonitor.console.aliyun.com/",
            console_note=f"CloudMonitor > Application Groups > gpufleet-{args.stack}",
        )

    def _monitor_group(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
    ) -> ali.cms.MonitorGroup:
        """The stack's monitoring view: CloudMonitor has no dashboard resource in the
        provider (pulumi_alicloud.cms), so an application group holding the stack's ECS
        nodes, whose console page shows their metrics (the GPU ones included) and alarms
        together. category "ecs" as the SDK's own example spells a category ("vpc")."""
        group = ali.cms.MonitorGroup(
            f"{name}-monitor-group",
            monitor_group_name=f"gpufleet-{args.stack}",
            tags=args.tags,
            opts=child_opts(parent),
        )
        ali.cms.MonitorGroupInstances(
            f"{name}-monitor-group-nodes",
            group_id=group.id,
            instances=[
                ali.cms.MonitorGroupInstancesInstanceArgs(
                    category="ecs",
                    instance_id=parts.instance_id,
                    instance_name=spec.name,
                    region_id=args.region,
                )
                for spec, parts in nodes
            ],
            opts=child_opts(group),
        )
        return group


PROVIDER = AlicloudProvider()
