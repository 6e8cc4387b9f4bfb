"""AWS: VPC + subnet, S3, IAM instance profile, EC2 GPU nodes, Lambda reaper on a schedule."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_aws as aws

from gpufleet_node.fleet_names import NAMESPACE
from infra import reaper_deploy as guard_logic
from infra.clouds import common
from infra.clouds.aws import dashboard, entry
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
from infra.nodes import (
    NodeSpec,
    efa_layout,
    public_ipv4_at_launch,
)
from infra.reaper import tags as T

# aws.ec2.Instance imports ec2's instance module, not the ~400 of pulumi_aws.ec2
narrow(aws)

VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDR = "10.42.0.0/20"
# Deep Learning AMIs ship driver + CUDA + EFA; Volta is not in the OSS-driver DLAMI's list,
# so P3 starts from Canonical's Ubuntu and `fab setup` installs the R580 driver.
DLAMI_PARAM = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
UBUNTU_PARAM = "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
NO_DLAMI_ARCHS = ("volta",)


def ami_parameter(arch: str) -> str:
    return UBUNTU_PARAM if arch in NO_DLAMI_ARCHS else DLAMI_PARAM


def market_options(
    billing: Billing, capacity_block: bool = False
) -> aws.ec2.InstanceInstanceMarketOptionsArgs | None:
    """Spot that stops (not terminates) on interruption keeps the root disk; this needs a
    persistent request. A Capacity Block for ML is launched with its own market type
    (pulumi_aws InstanceInstanceMarketOptionsArgs.market_type: spot, capacity-block, ...)."""
    if capacity_block:
        return aws.ec2.InstanceInstanceMarketOptionsArgs(market_type="capacity-block")
    if billing.mode != "spot":
        return None
    return aws.ec2.InstanceInstanceMarketOptionsArgs(
        market_type="spot",
        spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
            instance_interruption_behavior="stop",
            spot_instance_type="persistent",
            max_price=f"{billing.spot_max_price:g}" if billing.spot_max_price else None,
        ),
    )


def reservation_spec(
    reservation: str | None,
) -> aws.ec2.InstanceCapacityReservationSpecificationArgs | None:
    """Launch into that On-Demand Capacity Reservation or Capacity Block, and only there:
    a target, so a full reservation fails the launch instead of landing elsewhere."""
    if not reservation:
        return None
    target = aws.ec2.InstanceCapacityReservationSpecificationCapacityReservationTargetArgs
    return aws.ec2.InstanceCapacityReservationSpecificationArgs(
        capacity_reservation_target=target(capacity_reservation_id=reservation)
    )


def scratch_ebs(
    spec: NodeSpec, destroy_data: bool
) -> list[aws.ec2.InstanceEbsBlockDeviceArgs] | None:
    """The scratch EBS volume, when the plan wants a disk (the type has no local NVMe)."""
    if spec.scratch.kind != "disk":
        return None
    return [
        aws.ec2.InstanceEbsBlockDeviceArgs(
            device_name="/dev/sdf",
            volume_size=spec.scratch.size_gb,
            volume_type=spec.scratch.volume_class,
            iops=spec.scratch.iops,
            throughput=spec.scratch.throughput_mbs,
            encrypted=True,
            delete_on_termination=destroy_data,
            tags={**spec.tags, "Name": f"{spec.name}-scratch"},
        )
    ]


IAM_VERSION = "2012-10-17"


def tls_only_policy(bucket_arn: str) -> str:
    return common.policy_json(
        IAM_VERSION,
        [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    )


def node_policy(bucket_arn: str) -> str:
    """What every node of the stack may do: its own bucket and its own metrics namespace.
    Tagging is each node's own lease_policy, on its own role."""
    return common.policy_json(
        IAM_VERSION,
        [
            {
                "Sid": "StackBucketList",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": bucket_arn,
            },
            {
                "Sid": "StackBucketObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                ],
                "Resource": f"{bucket_arn}/*",
            },
            {
                "Sid": "OwnMetrics",
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
            },
        ],
    )


def lease_policy(instance_arn: str) -> str:
    """The lease tag, on the node's own instance only, from that instance only.

    The instance is named twice, as the EC2 and IAM guides show it (read 2026-12-01):
    as the Resource, and in an ``ec2:SourceInstanceARN`` ArnEquals condition, "the ARN
    of the instance from which a request is made" (EC2 user guide, iam-policy-structure,
    "ec2:SourceInstanceARN condition key"; IAM user guide example "Amazon EC2: Attach or
    detach volumes to an EC2 instance", reference_policies_examples_ec2_volumes-instance),
    so another instance given this role cannot use it. Each node has its own role because
    one shared role cannot say "the caller's own instance": "The ec2:SourceInstanceARN key
    cannot be used as a variable to populate the ARN for the Resource element" (same EC2
    page). ``aws:TagKeys`` (ForAllValues, and Null false: ForAllValues holds on a request
    without tags) limits the request to the lease key."""
    return common.policy_json(
        IAM_VERSION,
        [
            {
                "Sid": "LeaseTagOnItself",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": instance_arn,
                "Condition": {
                    "ArnEquals": {"ec2:SourceInstanceARN": instance_arn},
                    "ForAllValues:StringEquals": {"aws:TagKeys": [T.KEEP_ALIVE_UNTIL]},
                    "Null": {"aws:TagKeys": "false"},
                },
            },
        ],
    )


def reaper_policy(stack: str, log_group_arn: str) -> str:
    """The scheduled job may read everything it needs, but stop only this stack's managed
    instances; it has no terminate permission at all."""
    return common.policy_json(
        IAM_VERSION,
        [
            {
                "Sid": "Read",
                "Effect": "Allow",
                "Action": ["ec2:DescribeInstances", "cloudwatch:GetMetricData"],
                "Resource": "*",
            },
            {
                "Sid": "StopOwnStackOnly",
                "Effect": "Allow",
                "Action": "ec2:StopInstances",
                "Resource": "arn:aws:ec2:*:*:instance/*",
                "Condition": {
                    "StringEquals": {
                        f"aws:ResourceTag/{key}": value
                        for key, value in common.managed_stack_tags(stack)
                    }
                },
            },
            {
                "Sid": "OwnLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": f"{log_group_arn}:*",
            },
        ],
    )


def assume_role(service: str) -> str:
    return common.policy_json(
        IAM_VERSION,
        [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    )


def _role_with_policy(
    parent: pulumi.Resource,
    name: str,
    service: str,
    policy: pulumi.Input[str],
    description: str,
    tags: dict[str, str],
) -> aws.iam.Role:
    """An IAM role a service assumes, with one inline policy."""
    role = aws.iam.Role(
        f"{name}-role",
        assume_role_policy=assume_role(service),
        description=description,
        tags=tags,
        opts=child_opts(parent),
    )
    aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy, opts=child_opts(parent))
    return role


# "By default, all AWS accounts are limited to five (5) Elastic IP addresses per Region"
# (EC2 user guide, elastic-ip-addresses-eip, "Elastic IP address limit"; read 2026-12-01).
EIP_QUOTA = 5


def eip_note(cfg: StackConfig) -> str | None:
    """What the plan says when the stack allocates Elastic IPs (one per EFA node)."""
    from infra.catalog import load_catalog
    from infra.nodes import efa_interfaces

    itype = load_catalog().instance("aws", cfg.instance_type)
    if public_ipv4_at_launch(efa_layout(efa_interfaces(cfg, itype))):
        return None
    return (
        f"this stack allocates {cfg.nodes} Elastic IP address(es), one per node (EFA nodes "
        "launch with several network interfaces, so EC2 gives them no public IPv4); an "
        f"account has {EIP_QUOTA} per region by default: if {cfg.region}'s are in use, ask "
        "for more (Service Quotas, EC2, 'Elastic IP addresses per Region') before `pulumi up`"
    )


class AwsProvider:
    name = "aws"

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        return catalog_notes(cfg, today, self.stack_notes(cfg))

    def stack_notes(self, cfg: StackConfig) -> list[str]:
        """What the plan must tell people about this stack on AWS (its Elastic IPs)."""
        note = eip_note(cfg)
        return [note] if note else []

    def provider_resource(self, region: str) -> pulumi.ProviderResource:
        return aws.Provider("aws", region=region)

    # -- network ----------------------------------------------------------------------------
    def _zone(self, parent: pulumi.Resource, args: NetworkArgs) -> pulumi.Output[str]:
        def offered() -> pulumi.Output[list[str]]:
            return aws.ec2.get_instance_type_offerings_output(
                location_type="availability-zone",
                filters=[
                    aws.ec2.GetInstanceTypeOfferingsFilterArgs(
                        name="instance-type", values=[args.instance_type]
                    )
                ],
                opts=pulumi.InvokeOutputOptions(parent=parent),
            ).locations

        return common.pinned_or_first_zone(
            args.zone,
            offered,
            f"gpufleet:region: no availability zone in {args.region} offers "
            f"{args.instance_type}: set gpufleet:region to another region or pick "
            "another tier/profile",
        )

    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts:
        zone = self._zone(parent, args)
        vpc, subnet = self._vpc(parent, name, args.tags, zone)
        sg = self._security_group(parent, name, args, vpc.id)
        pg = None
        if args.placement_group:
            pg = aws.ec2.PlacementGroup(
                f"{name}-pg", strategy="cluster", tags=args.tags, opts=child_opts(parent)
            ).name
        return NetworkParts(vpc.id, subnet.id, sg.id, zone, pg)

    def _vpc(
        self, parent: pulumi.Resource, name: str, tags: dict[str, str], zone: pulumi.Output[str]
    ) -> tuple[aws.ec2.Vpc, aws.ec2.Subnet]:
        """The VPC with its internet gateway and default route, and the nodes' public
        subnet in ``zone``."""
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=VPC_CIDR,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={**tags, "Name": f"{name}-vpc"},
            opts=child_opts(parent),
        )
        igw = aws.ec2.InternetGateway(
            f"{name}-igw",
            vpc_id=vpc.id,
            tags={**tags, "Name": f"{name}-igw"},
            opts=child_opts(parent),
        )
        subnet = aws.ec2.Subnet(
            f"{name}-subnet",
            vpc_id=vpc.id,
            cidr_block=SUBNET_CIDR,
            availability_zone=zone,
            map_public_ip_on_launch=True,
            tags={**tags, "Name": f"{name}-subnet"},
            # An Elastic IP can be associated only in a VPC with its internet gateway
            # (the provider's Eip docs: "EIP may require IGW to exist prior to
            # association"); nodes and their addresses come after the subnet.
            opts=child_opts(parent, depends_on=[igw]),
        )
        rt = aws.ec2.RouteTable(
            f"{name}-rt",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags={**tags, "Name": f"{name}-rt"},
            opts=child_opts(parent),
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-rta", subnet_id=subnet.id, route_table_id=rt.id, opts=child_opts(parent)
        )
        return vpc, subnet

    def _security_group(
        self, parent: pulumi.Resource, name: str, args: NetworkArgs, vpc_id: pulumi.Output[str]
    ) -> aws.ec2.SecurityGroup:
        """SSH from each allowed network, every port between the stack's own nodes (both
        ways: EFA needs egress to the group itself), and any egress out."""
        tags = args.tags
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc_id,
            description=f"gpufleet {args.stack}: SSH from listed networks, all between nodes",
            tags={**tags, "Name": f"{name}-sg"},
            opts=child_opts(parent),
        )

        def rule(kind: Callable[..., object], suffix: str, description: str, **peer: Any) -> None:
            """One rule of the group: ``peer`` says which traffic, the rest is the same."""
            kind(
                f"{name}-{suffix}",
                security_group_id=sg.id,
                description=description,
                tags=tags,
                opts=child_opts(parent),
                **peer,
            )

        ingress, egress = aws.vpc.SecurityGroupIngressRule, aws.vpc.SecurityGroupEgressRule
        for i, cidr in enumerate(args.ssh_cidrs):
            ipv4, ipv6 = common.ipv4_or_ipv6(cidr)
            rule(
                ingress,
                f"ssh-{i}",
                "SSH from an allowed network",
                ip_protocol="tcp",
                from_port=22,
                to_port=22,
                cidr_ipv6=ipv6,
                cidr_ipv4=ipv4,
            )
        # NCCL, torchrun rendezvous and EFA need every port between the stack's own nodes.
        own = {"ip_protocol": "-1", "referenced_security_group_id": sg.id}  # the group itself
        rule(ingress, "intra", "all traffic between the stack's nodes", **own)
        out = {"ip_protocol": "-1", "cidr_ipv4": "0.0.0.0/0"}
        rule(egress, "egress", "package mirrors, object storage, metrics", **out)
        rule(egress, "egress-intra", "EFA requires egress to the group itself", **own)
        return sg

    # -- storage ----------------------------------------------------------------------------
    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts:
        tags = args.tags
        keep = not args.destroy_data
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket_prefix=f"gpufleet-{args.stack}-"[:37],
            force_destroy=args.destroy_data,
            tags=tags,
            opts=child_opts(parent, retain_on_delete=keep, protect=False),
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-block",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-sse",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child_opts(parent, retain_on_delete=keep),
        )
        aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                status="Enabled"
            ),
            opts=child_opts(parent, retain_on_delete=keep),
        )
        days = args.archive_days
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="archive-old-objects",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    transitions=[
                        aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(
                            days=days, storage_class="GLACIER_IR"
                        ),
                        aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(
                            days=days + common.ARCHIVE_AFTER_COOL_DAYS, storage_class="DEEP_ARCHIVE"
                        ),
                    ],
                    noncurrent_version_transitions=[
                        aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionTransitionArgs(
                            noncurrent_days=days, storage_class="GLACIER_IR"
                        )
                    ],
                ),
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-stale-multipart-uploads",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=common.ABORT_MULTIPART_DAYS
                    ),
                ),
            ],
            opts=child_opts(parent, retain_on_delete=keep),
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            opts=child_opts(parent, retain_on_delete=keep),
        )
        return StorageParts(bucket.bucket, bucket.arn)

    # -- access -----------------------------------------------------------------------------
    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts:
        tags = args.tags
        key = aws.ec2.KeyPair(
            f"{name}-key",
            key_name_prefix=f"gpufleet-{args.stack}-",
            public_key=args.ssh_public_key,
            tags=tags,
            opts=child_opts(parent),
        )
        # One role per node (node()), so that each may tag only itself: the stack's share
        # is this managed policy, attached to every node's role.
        policy = aws.iam.Policy(
            f"{name}-node-policy",
            description=f"gpufleet {args.stack} GPU nodes: the stack's bucket and metrics",
            policy=storage.bucket_arn.apply(node_policy),
            tags=tags,
            opts=child_opts(parent),
        )
        return AccessParts(None, None, key.key_name, policy.arn)

    # -- nodes ------------------------------------------------------------------------------
    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        role, profile = self._node_role(parent, spec, access)
        ami = aws.ssm.get_parameter_output(
            name=ami_parameter(spec.gpu.arch), opts=pulumi.InvokeOutputOptions(parent=parent)
        ).value
        launch_template = self._efa_launch_template(parent, spec, net)
        instance = aws.ec2.Instance(
            spec.name,
            ami=ami,
            instance_type=spec.instance_type.name,
            availability_zone=net.zone,
            subnet_id=None if launch_template else net.subnet_id,
            vpc_security_group_ids=None if launch_template else [net.security_group_id],
            launch_template=launch_template,
            placement_group=net.placement_group,
            key_name=access.key_name,
            iam_instance_profile=profile.name,
            instance_initiated_shutdown_behavior="stop",
            instance_market_options=market_options(args.billing, args.capacity_block),
            capacity_reservation_specification=reservation_spec(args.capacity_reservation),
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=2,  # containers on the node still reach IMDS
                instance_metadata_tags="enabled",  # the watchdog reads its own tags
            ),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_size=args.root_disk_gb,
                volume_type="gp3",
                encrypted=True,
                delete_on_termination=True,
                tags={**spec.tags, "Name": f"{spec.name}-root"},
            ),
            ebs_block_devices=scratch_ebs(spec, args.destroy_data),
            ebs_optimized=True,
            monitoring=True,
            user_data=spec.user_data,
            user_data_replace_on_change=False,
            tags=spec.tags,
            volume_tags=None,
            # a newer DLAMI must not replace a node
            opts=child_opts(parent, ignore_changes=["ami"]),
        )
        aws.iam.RolePolicy(
            f"{spec.name}-lease",
            role=role.id,
            policy=instance.arn.apply(lease_policy),
            opts=child_opts(parent),
        )
        public_ip = self._public_ip(parent, spec, instance)
        return NodeParts(instance.id, public_ip, instance.private_ip)

    def _node_role(
        self, parent: pulumi.Resource, spec: NodeSpec, access: AccessParts
    ) -> tuple[aws.iam.Role, aws.iam.InstanceProfile]:
        """The node's own role (its lease policy names its instance alone), holding the
        stack's node policy, and the instance profile that hands it to the node."""
        role = aws.iam.Role(
            f"{spec.name}-role",
            assume_role_policy=assume_role("ec2.amazonaws.com"),
            description=f"gpufleet node {spec.name}",
            tags=spec.tags,
            opts=child_opts(parent),
        )
        if access.node_policy is not None:
            aws.iam.RolePolicyAttachment(
                f"{spec.name}-stack-policy",
                role=role.name,
                policy_arn=access.node_policy,
                opts=child_opts(parent),
            )
        profile = aws.iam.InstanceProfile(
            f"{spec.name}-profile", role=role.name, tags=spec.tags, opts=child_opts(parent)
        )
        return role, profile

    def _efa_launch_template(
        self, parent: pulumi.Resource, spec: NodeSpec, net: NetworkParts
    ) -> aws.ec2.InstanceLaunchTemplateArgs | None:
        """The launch template of a node with EFA interfaces (None without)."""
        launch_template = None
        if spec.efa_interfaces:
            # EFA needs one interface per network card; only a launch template can say that.
            lt = aws.ec2.LaunchTemplate(
                f"{spec.name}-efa",
                description=f"{spec.efa_interfaces} EFA interfaces for {spec.instance_type.name}",
                network_interfaces=[
                    aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                        network_card_index=card,
                        device_index=device,
                        interface_type=None if kind == "interface" else kind,
                        subnet_id=net.subnet_id,
                        security_groups=[net.security_group_id],
                        delete_on_termination="true",  # typed as a string in the SDK
                    )
                    for card, device, kind in efa_layout(spec.efa_interfaces)
                ],
                # The instance's own metadata_options override these at launch; the template
                # must not hand IMDSv1 to anyone who launches from it directly.
                metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                    http_endpoint="enabled",
                    http_tokens="required",
                    http_put_response_hop_limit=2,
                    instance_metadata_tags="enabled",
                ),
                tags=spec.tags,
                opts=child_opts(parent),
            )
            launch_template = aws.ec2.InstanceLaunchTemplateArgs(
                id=lt.id, version=lt.latest_version.apply(str)
            )
        return launch_template

    def _public_ip(
        self, parent: pulumi.Resource, spec: NodeSpec, instance: aws.ec2.Instance
    ) -> pulumi.Output[str]:
        """The node's public IPv4: EC2's own, or an Elastic IP where EC2 gives none."""
        public_ip: pulumi.Output[str] = instance.public_ip
        if not public_ipv4_at_launch(efa_layout(spec.efa_interfaces)):
            # Launched with several interfaces, the node gets no public IPv4 from EC2; an
            # address for it must name an interface (the ENA primary).
            eip = aws.ec2.Eip(
                f"{spec.name}-eip",
                domain="vpc",
                network_interface=instance.primary_network_interface_id,
                tags=spec.tags,
                opts=child_opts(parent),
            )
            public_ip = eip.public_ip
        return public_ip

    # -- idle guard -------------------------------------------------------------------------
    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts:
        tags = args.tags
        fn_name = guard_logic.function_name(args.stack)
        logs = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/lambda/{fn_name}",
            retention_in_days=30,
            tags=tags,
            opts=child_opts(parent),
        )
        role = _role_with_policy(
            parent,
            f"{name}-reaper",
            "lambda.amazonaws.com",
            logs.arn.apply(lambda arn: reaper_policy(args.stack, arn)),
            f"gpufleet {args.stack} idle reaper: stop-only, this stack's tags only",
            tags,
        )
        fn = aws.lambda_.Function(
            f"{name}-reaper",
            name=fn_name,
            runtime="python3.12",
            handler=entry.HANDLER,
            role=role.arn,
            code=guard_logic.function_archive(self.name),
            timeout=300,
            memory_size=256,
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables=guard_logic.function_env(args)
            ),
            tags=tags,
            opts=child_opts(parent, depends_on=[logs]),
        )
        rule = aws.cloudwatch.EventRule(
            f"{name}-schedule",
            description=f"gpufleet {args.stack}: look for idle GPU nodes",
            schedule_expression=entry.SCHEDULE,
            tags=tags,
            opts=child_opts(parent),
        )
        aws.cloudwatch.EventTarget(
            f"{name}-target", rule=rule.name, arn=fn.arn, opts=child_opts(parent)
        )
        aws.lambda_.Permission(
            f"{name}-invoke",
            action="lambda:InvokeFunction",
            function=fn.name,
            principal="events.amazonaws.com",
            source_arn=rule.arn,
            opts=child_opts(parent),
        )
        # No CloudWatch alarm with an `ec2:stop` action: an alarm reads no tags (protected,
        # leases) and no GPU, so it would stop busy or protected nodes (SECURITY.md,
        # "No alarm stops a node"). The watchdog and this reaper are the only stop paths.
        ids = pulumi.Output.all(*[p.instance_id for _, p in nodes])
        dash = aws.cloudwatch.Dashboard(
            f"{name}-dashboard",
            dashboard_name=f"gpufleet-{args.stack}",
            dashboard_body=ids.apply(
                lambda xs: json.dumps(dashboard.dashboard_body(args.region, list(xs)))
            ),
            opts=child_opts(parent),
        )
        return GuardParts(
            fn.name,
            entry.SCHEDULE,
            dash.dashboard_name,
            console_url=dash.dashboard_name.apply(
                lambda n: dashboard.cloudwatch_console_url(args.region, n)
            ),
        )


PROVIDER = AwsProvider()
