"""Azure: resource groups, VNet + NSG, Blob Storage, a managed identity, GPU VMs, and a
Functions app that deallocates idle nodes every 5 minutes.

Two resource groups per stack: ``gpufleet-<stack>`` holds everything a destroy removes, and
``gpufleet-<stack>-data`` holds the storage account alone, kept on destroy (retain_on_delete
on the group, the account and the container) unless gpufleet:destroyData is true: deleting a
resource group deletes what is inside it, so the kept data cannot share the compute group.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_azure_native as az
import pulumi_random as random

from infra import reaper_deploy as guard_logic
from infra.catalog import InstanceType, load_catalog
from infra.config import StackConfig
from infra.nodes import NodeSpec, needs_placement_group, stack_tags
from infra.providers.base import (
    AccessParts,
    Feature,
    GuardParts,
    NetworkParts,
    NodeParts,
    StorageParts,
    unsupported_features,
)
from infra.reaper.fleet_names import METRIC_GPU_MEM, METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE

VNET_CIDR = "10.42.0.0/16"
SUBNET_CIDR = "10.42.0.0/20"
ADMIN_USER = "azureuser"  # the catalog's ssh_user for azure
CONTAINER = "gpufleet"
PACKAGE_CONTAINER = "function-releases"
# Canonical's Ubuntu 22.04 (Gen2: the NC A100 v4 and ND sizes boot Gen2 only); the driver
# comes from `fab setup`. InfiniBand sizes start from Microsoft's Ubuntu HPC image, which
# ships the InfiniBand (DOCA/MOFED) stack the NCCL IB transport needs, and NVIDIA's driver.
UBUNTU = {
    "publisher": "Canonical",
    "offer": "0001-com-ubuntu-server-jammy",
    "sku": "22_04-lts-gen2",
}
UBUNTU_HPC = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204"}

# Built-in role: Storage Blob Data Contributor (read, write, delete blobs; no account keys).
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
# Built-in role: Storage Blob Data Owner (the Functions host keeps its leases in blobs).
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
# Built-in role: Monitoring Metrics Publisher (post custom metrics against a resource).
METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"

# A node may read and deallocate itself (the watchdog's power-off path: a shutdown from
# inside the OS leaves the VM "Stopped" and billed) and write its own tags (the lease, through
# Tags - Update At Scope); scoped to its own VM. Azure RBAC cannot limit a tag write to one
# key, so a process on the node could also change its own guard tags (SECURITY.md).
NODE_ACTIONS = (
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/instanceView/read",
    "Microsoft.Compute/virtualMachines/deallocate/action",
    "Microsoft.Resources/tags/write",
)
# Azure Functions NCRONTAB (seconds first): every 5 minutes.
AZURE_SCHEDULE = "0 */5 * * * *"
FUNCTION_RUNTIME = "Python|3.11"


def _opts(parent: pulumi.Resource, **kw: object) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **kw)  # type: ignore[arg-type]


def storage_account_name(stack: str, suffix: str) -> str:
    """3-24 lower-case letters and digits, globally unique: a prefix of the stack's name with
    its hyphens dropped, then the random suffix, always whole."""
    stem = "".join(c for c in stack if c.isalnum())
    return f"gpf{stem[: 24 - 3 - len(suffix)]}{suffix}"


def spot_args(cfg: StackConfig) -> dict[str, Any]:
    """Spot priority that deallocates on eviction (disks and the VM stay; Delete would lose
    the OS disk and any scratch not yet synced). -1: pay up to the on-demand price."""
    if cfg.billing != "spot":
        return {"priority": "Regular"}
    return {
        "priority": "Spot",
        "eviction_policy": "Deallocate",
        "billing_profile": az.compute.BillingProfileArgs(
            max_price=cfg.spot_max_price if cfg.spot_max_price else -1
        ),
    }


def image_for(itype: InstanceType) -> dict[str, str]:
    return UBUNTU_HPC if itype.infiniband else UBUNTU


def needs_infiniband_set(cfg: StackConfig, itype: InstanceType) -> bool:
    """InfiniBand links VMs of one availability set (or scale set): a multi-node stack of an
    InfiniBand size puts its nodes in one, inside the proximity placement group."""
    info = load_catalog().providers[cfg.provider]
    return itype.infiniband and cfg.nodes > 1 and info.supports(Feature.INFINIBAND)


def built_in_role(subscription: pulumi.Output[str], role: str) -> pulumi.Output[str]:
    """A built-in role's definition id in the subscription (the GUIDs are Azure's own)."""
    return subscription.apply(
        lambda sub: f"/subscriptions/{sub}/providers/Microsoft.Authorization/roleDefinitions/{role}"
    )


def role_permissions(actions: tuple[str, ...]) -> list[az.authorization.PermissionArgs]:
    return [az.authorization.PermissionArgs(actions=list(actions), not_actions=[])]


def nsg_rules(cfg: StackConfig) -> list[az.network.SecurityRuleArgs]:
    """SSH from each allowed network, everything from the stack's own subnet; Azure's default
    rules deny the rest of inbound traffic."""
    rules = [
        az.network.SecurityRuleArgs(
            name=f"ssh-{i}",
            priority=100 + i,
            direction="Inbound",
            access="Allow",
            protocol="Tcp",
            source_address_prefix=cidr,
            source_port_range="*",
            destination_address_prefix="*",
            destination_port_range="22",
            description="SSH from an allowed network",
        )
        for i, cidr in enumerate(cfg.ssh_cidrs)
    ]
    rules.append(
        az.network.SecurityRuleArgs(
            name="intra-stack",
            priority=300,
            direction="Inbound",
            access="Allow",
            protocol="*",
            source_address_prefix=SUBNET_CIDR,
            source_port_range="*",
            destination_address_prefix=SUBNET_CIDR,
            destination_port_range="*",
            description="all traffic between the stack's nodes (NCCL, rendezvous)",
        )
    )
    return rules


def lifecycle_policy(days: int) -> az.storage.ManagementPolicySchemaArgs:
    """Cool after `days` without a change, archive 180 days later; old versions likewise."""
    return az.storage.ManagementPolicySchemaArgs(
        rules=[
            az.storage.ManagementPolicyRuleArgs(
                name="archive-old-objects",
                enabled=True,
                type="Lifecycle",
                definition=az.storage.ManagementPolicyDefinitionArgs(
                    filters=az.storage.ManagementPolicyFilterArgs(blob_types=["blockBlob"]),
                    actions=az.storage.ManagementPolicyActionArgs(
                        base_blob=az.storage.ManagementPolicyBaseBlobArgs(
                            tier_to_cool=az.storage.DateAfterModificationArgs(
                                days_after_modification_greater_than=days
                            ),
                            tier_to_archive=az.storage.DateAfterModificationArgs(
                                days_after_modification_greater_than=days + 180
                            ),
                        ),
                        version=az.storage.ManagementPolicyVersionArgs(
                            tier_to_cool=az.storage.DateAfterCreationArgs(
                                days_after_creation_greater_than=days
                            )
                        ),
                    ),
                ),
            )
        ]
    )


def reaper_contract() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the Azure reaper documents at the top of infra/reaper/azure.py: the settings it
    requires, and the actions its custom role must hold (read there, never copied here)."""
    from infra.reaper import azure as reaper

    return tuple(reaper.REQUIRED_ENV), tuple(reaper.ROLE_ACTIONS)


def reaper_settings(
    cfg: StackConfig, subscription_id: str, resource_group: str, client_id: str
) -> dict[str, str]:
    """The reaper's environment: the common four plus what the Azure client reads (its
    subscription, the stack's resource group, and which managed identity to sign in as).
    Every setting the reaper's contract requires is set, or the program refuses."""
    settings = {
        **guard_logic.function_env(cfg),
        "GPUFLEET_AZURE_SUBSCRIPTION_ID": subscription_id,
        "GPUFLEET_AZURE_RESOURCE_GROUP": resource_group,
        "GPUFLEET_AZURE_CLIENT_ID": client_id,  # the user-assigned identity to sign in as
        # what the package's timer trigger runs on (function_app.py); the policy reads it
        "GPUFLEET_SCHEDULE": AZURE_SCHEDULE,
    }
    required, _ = reaper_contract()
    missing = [name for name in required if name not in settings]
    if missing:
        raise ValueError(f"the Azure reaper requires settings this program lacks: {missing}")
    return settings


def workbook_body(stack: str, vm_ids: list[str]) -> dict[str, Any]:
    """An Azure Monitor workbook: GPU utilisation, GPU memory and heartbeat per node, from
    the custom metrics the watchdog posts against its VM (namespace from infra.reaper.core)."""

    def chart(title: str, metric: str, aggregation: int) -> dict[str, Any]:
        return {
            "type": 10,  # a metrics item
            "name": metric,
            "content": {
                "version": "MetricsItem/2.0",
                "size": 0,
                "chartType": 2,
                "resourceType": "microsoft.compute/virtualmachines",
                "resourceIds": vm_ids,
                "timeContext": {"durationMs": 3_600_000},
                "metrics": [
                    {
                        "namespace": NAMESPACE,
                        "metric": f"{NAMESPACE}--{metric}",
                        "aggregation": aggregation,
                    }
                ],
                "title": title,
                "gridSettings": {"rowLimit": 10000},
            },
        }

    return {
        "version": "Notebook/1.0",
        "items": [
            {"type": 1, "content": {"json": f"## gpufleet {stack}: GPU nodes"}},
            chart("GPU utilisation (%), max per node", METRIC_GPU_UTIL, 3),
            chart("GPU memory used (%), max per node", METRIC_GPU_MEM, 3),
            chart("Watchdog heartbeat (samples)", METRIC_HEARTBEAT, 7),
        ],
        "isLocked": False,
    }


def first_private_ip(configs: Any) -> str:
    """The primary IP configuration's private address (typed or plain, as the engine gives)."""
    if not configs:
        return ""
    first = configs[0]
    if isinstance(first, dict):
        value = first.get("private_ip_address") or first.get("privateIPAddress")
    else:
        value = getattr(first, "private_ip_address", None)
    return str(value or "")


def _package_asset(provider: str) -> pulumi.FileAsset:
    """The reaper zip as a file asset: Blob sources are assets, and the zip holds binary
    wheels. Written once per content under the repository's build folder (not the shared
    temp directory, where another user could swap it before the upload), the older removed."""
    return pulumi.FileAsset(str(guard_logic.function_zip_file(provider)))


class AzureProvider:
    name = "azure"
    UNSUPPORTED: Mapping[Feature, str] = unsupported_features("azure")

    def __init__(self) -> None:
        # The compute resource group of the stack being declared: network() creates it and
        # the later steps of the same build put their resources in it.
        self._groups: dict[str, az.resources.ResourceGroup] = {}
        self._ib_sets: dict[str, pulumi.Output[str]] = {}

    def provider_resource(self, cfg: StackConfig) -> pulumi.ProviderResource:
        return az.Provider("azure-native", location=cfg.region)

    def _group(self, cfg: StackConfig) -> az.resources.ResourceGroup:
        return self._groups[cfg.stack]

    # -- network ----------------------------------------------------------------------------
    def network(self, parent: pulumi.Resource, name: str, cfg: StackConfig) -> NetworkParts:
        tags = stack_tags(cfg)
        rg = az.resources.ResourceGroup(
            f"{name}-rg",
            resource_group_name=f"gpufleet-{cfg.stack}",
            location=cfg.region,
            tags=tags,
            opts=_opts(parent),
        )
        self._groups[cfg.stack] = rg
        self._ib_sets.pop(cfg.stack, None)
        nsg = az.network.NetworkSecurityGroup(
            f"{name}-nsg",
            resource_group_name=rg.name,
            location=cfg.region,
            security_rules=nsg_rules(cfg),
            tags=tags,
            opts=_opts(parent),
        )
        vnet = az.network.VirtualNetwork(
            f"{name}-vnet",
            resource_group_name=rg.name,
            location=cfg.region,
            address_space=az.network.AddressSpaceArgs(address_prefixes=[VNET_CIDR]),
            tags=tags,
            # the subnet is its own resource; the VNet must not fight it over `subnets`
            opts=_opts(parent, ignore_changes=["subnets"]),
        )
        subnet = az.network.Subnet(
            f"{name}-subnet",
            resource_group_name=rg.name,
            virtual_network_name=vnet.name,
            address_prefix=SUBNET_CIDR,
            network_security_group=az.network.NetworkSecurityGroupArgs(id=nsg.id),
            opts=_opts(parent),
        )
        itype = load_catalog().instance(cfg.provider, cfg.instance_type)
        ppg = None
        if needs_placement_group(cfg, itype):
            ppg = az.compute.ProximityPlacementGroup(
                f"{name}-ppg",
                resource_group_name=rg.name,
                location=cfg.region,
                proximity_placement_group_type="Standard",
                intent=az.compute.ProximityPlacementGroupPropertiesIntentArgs(
                    vm_sizes=[itype.name]
                ),
                zones=[cfg.zone] if cfg.zone else None,
                tags=tags,
                opts=_opts(parent),
            ).id
        # no zone pinned: the VMs are regional, and the output names the region
        zone = pulumi.Output.from_input(cfg.zone or cfg.region)
        return NetworkParts(vnet.id, subnet.id, nsg.id, zone, ppg)

    # -- storage ----------------------------------------------------------------------------
    def storage(self, parent: pulumi.Resource, name: str, cfg: StackConfig) -> StorageParts:
        tags = stack_tags(cfg)
        keep = not cfg.destroy_data
        data_rg = az.resources.ResourceGroup(
            f"{name}-data-rg",
            resource_group_name=f"gpufleet-{cfg.stack}-data",
            location=cfg.region,
            tags=tags,
            opts=_opts(parent, retain_on_delete=keep),
        )
        # Account names are global and a destroy keeps the account: a random suffix, held in
        # the stack's state, is stable across updates and new after a destroy.
        suffix = random.RandomId(f"{name}-account-suffix", byte_length=3, opts=_opts(parent))
        account = az.storage.StorageAccount(
            f"{name}-account",
            account_name=suffix.hex.apply(lambda h: storage_account_name(cfg.stack, h)),
            resource_group_name=data_rg.name,
            location=cfg.region,
            kind="StorageV2",
            sku=az.storage.SkuArgs(name="Standard_LRS"),
            access_tier=az.storage.AccessTier.HOT,
            allow_blob_public_access=False,
            allow_shared_key_access=False,  # Entra ID (managed identity) only: no account keys
            enable_https_traffic_only=True,
            minimum_tls_version="TLS1_2",
            encryption=az.storage.EncryptionArgs(
                key_source="Microsoft.Storage",  # platform-managed keys
                services=az.storage.EncryptionServicesArgs(
                    blob=az.storage.EncryptionServiceArgs(enabled=True, key_type="Account")
                ),
                require_infrastructure_encryption=True,
            ),
            tags=tags,
            opts=_opts(parent, retain_on_delete=keep),
        )
        az.storage.BlobServiceProperties(
            f"{name}-blob-service",
            account_name=account.name,
            resource_group_name=data_rg.name,
            blob_services_name="default",
            is_versioning_enabled=True,
            delete_retention_policy=az.storage.DeleteRetentionPolicyArgs(enabled=True, days=7),
            container_delete_retention_policy=az.storage.DeleteRetentionPolicyArgs(
                enabled=True, days=7
            ),
            opts=_opts(parent, retain_on_delete=keep),
        )
        container = az.storage.BlobContainer(
            f"{name}-container",
            account_name=account.name,
            resource_group_name=data_rg.name,
            container_name=CONTAINER,
            public_access=az.storage.PublicAccess.NONE,
            opts=_opts(parent, retain_on_delete=keep),
        )
        az.storage.ManagementPolicy(
            f"{name}-lifecycle",
            account_name=account.name,
            resource_group_name=data_rg.name,
            management_policy_name="default",
            policy=lifecycle_policy(cfg.bucket_archive_days),
            opts=_opts(parent, retain_on_delete=keep),
        )
        # `bucket` is what bootstrap and verify-gpu address: <account>/<container>.
        bucket = pulumi.Output.concat(account.name, "/", CONTAINER)
        return StorageParts(bucket, container.id)

    # -- access -----------------------------------------------------------------------------
    def access(
        self, parent: pulumi.Resource, name: str, cfg: StackConfig, storage: StorageParts
    ) -> AccessParts:
        # Azure takes the SSH key on the VM itself (osProfile): `key_name` carries it there.
        # Each node gets its own identity (node()), so that its roles name that VM alone;
        # `node_policy` carries the container they may reach.
        key = pulumi.Output.from_input(cfg.ssh_public_key or "")
        return AccessParts(None, None, key, storage.bucket_arn)

    # -- nodes ------------------------------------------------------------------------------
    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        cfg: StackConfig,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        rg = self._group(cfg)
        itype = spec.instance_type
        zones = [cfg.zone] if cfg.zone else None
        pip = az.network.PublicIPAddress(
            f"{spec.name}-ip",
            resource_group_name=rg.name,
            location=cfg.region,
            public_ip_allocation_method="Static",
            sku=az.network.PublicIPAddressSkuArgs(name="Standard"),
            zones=zones,
            tags=spec.tags,
            opts=_opts(parent),
        )
        nic = az.network.NetworkInterface(
            f"{spec.name}-nic",
            resource_group_name=rg.name,
            location=cfg.region,
            enable_accelerated_networking=True,
            ip_configurations=[
                az.network.NetworkInterfaceIPConfigurationArgs(
                    name="primary",
                    primary=True,
                    subnet=az.network.SubnetArgs(id=net.subnet_id),
                    public_ip_address=az.network.PublicIPAddressArgs(id=pip.id),
                    private_ip_allocation_method="Dynamic",
                )
            ],
            network_security_group=az.network.NetworkSecurityGroupArgs(id=net.security_group_id),
            tags=spec.tags,
            opts=_opts(parent),
        )
        availability_set = None
        if needs_infiniband_set(cfg, itype):
            availability_set = self._infiniband_set(parent, cfg, net)
        data_disks = None
        if spec.scratch.kind == "disk":
            data_disks = [
                az.compute.DataDiskArgs(
                    lun=0,
                    name=f"{spec.name}-scratch",
                    create_option="Empty",
                    disk_size_gb=spec.scratch.size_gb,
                    caching=az.compute.CachingTypes.NONE,
                    managed_disk=az.compute.ManagedDiskParametersArgs(
                        storage_account_type=spec.scratch.volume_class
                    ),
                    # a destroy keeps the scratch disk (detached) unless destroyData
                    delete_option="Delete" if cfg.destroy_data else "Detach",
                )
            ]
        image = image_for(itype)
        identity = az.managedidentity.UserAssignedIdentity(
            f"{spec.name}-identity",
            resource_name_=f"gpufleet-{spec.name}",
            resource_group_name=rg.name,
            location=cfg.region,
            tags=spec.tags,
            opts=_opts(parent),
        )
        subscription = az.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        ).subscription_id
        if access.node_policy is not None:
            # the node reaches the stack's container and nothing else in the account
            az.authorization.RoleAssignment(
                f"{spec.name}-blob",
                principal_id=identity.principal_id,
                principal_type="ServicePrincipal",
                role_definition_id=built_in_role(subscription, BLOB_DATA_CONTRIBUTOR),
                scope=access.node_policy,  # the container's resource id
                description=f"gpufleet {spec.name}: the stack's blob container only",
                opts=_opts(parent),
            )
        user = load_catalog().providers[cfg.provider].ssh_user
        vm = az.compute.VirtualMachine(
            spec.name,
            vm_name=spec.name,
            resource_group_name=rg.name,
            location=cfg.region,
            zones=zones,
            hardware_profile=az.compute.HardwareProfileArgs(vm_size=itype.name),
            os_profile=az.compute.OSProfileArgs(
                computer_name=spec.name,
                admin_username=user,
                custom_data=base64.b64encode(spec.user_data.encode()).decode(),
                linux_configuration=az.compute.LinuxConfigurationArgs(
                    disable_password_authentication=True,
                    provision_vm_agent=True,
                    ssh=az.compute.SshConfigurationArgs(
                        public_keys=[
                            az.compute.SshPublicKeyArgs(
                                path=f"/home/{user}/.ssh/authorized_keys",
                                key_data=access.key_name,
                            )
                        ]
                    ),
                ),
            ),
            storage_profile=az.compute.StorageProfileArgs(
                image_reference=az.compute.ImageReferenceArgs(version="latest", **image),
                os_disk=az.compute.OSDiskArgs(
                    name=f"{spec.name}-os",
                    create_option="FromImage",
                    disk_size_gb=cfg.root_disk_gb,
                    caching=az.compute.CachingTypes.READ_WRITE,
                    managed_disk=az.compute.ManagedDiskParametersArgs(
                        storage_account_type="Premium_LRS"
                    ),
                    delete_option="Delete",
                ),
                data_disks=data_disks,
            ),
            network_profile=az.compute.NetworkProfileArgs(
                network_interfaces=[
                    az.compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)
                ]
            ),
            # Disks are encrypted at rest with platform-managed keys (always on in Azure);
            # encryption at host also covers the temp disk, caches and local NVMe.
            security_profile=az.compute.SecurityProfileArgs(encryption_at_host=True),
            identity=az.compute.VirtualMachineIdentityArgs(
                type=az.compute.ResourceIdentityType.USER_ASSIGNED,
                user_assigned_identities=[identity.id],
            ),
            proximity_placement_group=(
                az.compute.SubResourceArgs(id=net.placement_group) if net.placement_group else None
            ),
            availability_set=(
                az.compute.SubResourceArgs(id=availability_set) if availability_set else None
            ),
            # Spot eviction and platform maintenance show up in Scheduled Events (IMDS), which
            # the watchdog reads to sync scratch before the VM goes.
            scheduled_events_profile=az.compute.ScheduledEventsProfileArgs(
                terminate_notification_profile=az.compute.TerminateNotificationProfileArgs(
                    enable=True, not_before_timeout="PT5M"
                )
            ),
            tags=spec.tags,
            opts=_opts(parent, ignore_changes=["storageProfile.imageReference"]),
            **spot_args(cfg),
        )
        # The node's own power: read and deallocate itself, post metrics against itself.
        node_role = az.authorization.RoleDefinition(
            f"{spec.name}-self-role",
            role_name=f"gpufleet {spec.name} self-deallocate",
            description=f"gpufleet node {spec.name}: read and deallocate this VM only",
            scope=vm.id,
            assignable_scopes=[vm.id],
            permissions=role_permissions(NODE_ACTIONS),
            role_type="CustomRole",
            opts=_opts(parent),
        )
        az.authorization.RoleAssignment(
            f"{spec.name}-self",
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=node_role.id,
            scope=vm.id,
            opts=_opts(parent),
        )
        az.authorization.RoleAssignment(
            f"{spec.name}-metrics",
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=built_in_role(subscription, METRICS_PUBLISHER),
            scope=vm.id,
            opts=_opts(parent),
        )
        private_ip = nic.ip_configurations.apply(first_private_ip)
        return NodeParts(vm.name, pip.ip_address.apply(lambda a: a or ""), private_ip)

    def _infiniband_set(
        self, parent: pulumi.Resource, cfg: StackConfig, net: NetworkParts
    ) -> pulumi.Output[str]:
        """One availability set per stack (declared with its first node), aligned to the
        proximity placement group, so InfiniBand connects the nodes."""
        if cfg.stack not in self._ib_sets:
            self._ib_sets[cfg.stack] = az.compute.AvailabilitySet(
                f"{cfg.stack}-ib-set",
                resource_group_name=self._group(cfg).name,
                location=cfg.region,
                platform_fault_domain_count=1,
                platform_update_domain_count=1,
                sku=az.compute.SkuArgs(name="Aligned"),
                proximity_placement_group=(
                    az.compute.SubResourceArgs(id=net.placement_group)
                    if net.placement_group
                    else None
                ),
                tags=stack_tags(cfg),
                opts=_opts(parent),
            ).id
        return self._ib_sets[cfg.stack]

    # -- idle guard -------------------------------------------------------------------------
    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        cfg: StackConfig,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts:
        tags = stack_tags(cfg)
        rg = self._group(cfg)
        client = az.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        )
        identity = az.managedidentity.UserAssignedIdentity(
            f"{name}-reaper-identity",
            resource_name_=f"gpufleet-{cfg.stack}-reaper",
            resource_group_name=rg.name,
            location=cfg.region,
            tags=tags,
            opts=_opts(parent),
        )
        role = az.authorization.RoleDefinition(
            f"{name}-reaper-role",
            role_name=f"gpufleet {cfg.stack} reaper",
            description=f"gpufleet {cfg.stack} idle reaper: read and deallocate this "
            "stack's VMs, read their metrics; no delete",
            scope=rg.id,
            assignable_scopes=[rg.id],
            permissions=role_permissions(reaper_contract()[1]),
            role_type="CustomRole",
            opts=_opts(parent),
        )
        az.authorization.RoleAssignment(
            f"{name}-reaper-assignment",
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=role.id,
            scope=rg.id,
            description=f"gpufleet {cfg.stack} reaper: this stack's resource group only",
            opts=_opts(parent),
        )
        # The Functions host's own storage (leases, the code package): a separate account,
        # reached with the reaper's identity, never the data account.
        suffix = random.RandomId(f"{name}-fn-suffix", byte_length=3, opts=_opts(parent))
        fn_account = az.storage.StorageAccount(
            f"{name}-fn-account",
            account_name=suffix.hex.apply(lambda h: storage_account_name(f"fn{cfg.stack}", h)),
            resource_group_name=rg.name,
            location=cfg.region,
            kind="StorageV2",
            sku=az.storage.SkuArgs(name="Standard_LRS"),
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            enable_https_traffic_only=True,
            minimum_tls_version="TLS1_2",
            tags=tags,
            opts=_opts(parent),
        )
        releases = az.storage.BlobContainer(
            f"{name}-fn-releases",
            account_name=fn_account.name,
            resource_group_name=rg.name,
            container_name=PACKAGE_CONTAINER,
            public_access=az.storage.PublicAccess.NONE,
            opts=_opts(parent),
        )
        package = az.storage.Blob(
            f"{name}-fn-package",
            account_name=fn_account.name,
            container_name=releases.name,
            resource_group_name=rg.name,
            blob_name="reaper.zip",
            type=az.storage.BlobType.BLOCK,
            source=_package_asset(self.name),
            opts=_opts(parent),
        )
        az.authorization.RoleAssignment(
            f"{name}-fn-storage",
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=built_in_role(client.subscription_id, BLOB_DATA_OWNER),
            scope=fn_account.id,
            opts=_opts(parent),
        )
        plan = az.web.AppServicePlan(
            f"{name}-plan",
            name=f"gpufleet-{cfg.stack}-reaper-plan",
            resource_group_name=rg.name,
            location=cfg.region,
            kind="functionapp",
            reserved=True,  # Linux
            sku=az.web.SkuDescriptionArgs(name="Y1", tier="Dynamic"),  # consumption
            tags=tags,
            opts=_opts(parent),
        )
        fn_name = guard_logic.function_name(cfg.stack)
        settings = pulumi.Output.all(
            client.subscription_id,
            rg.name,
            identity.client_id,
            fn_account.name,
            package.url,
            identity.id,
        ).apply(
            lambda v: [
                az.web.NameValuePairArgs(name=k, value=val)
                for k, val in sorted(
                    {
                        **reaper_settings(cfg, v[0], v[1], v[2]),
                        "FUNCTIONS_EXTENSION_VERSION": "~4",
                        "FUNCTIONS_WORKER_RUNTIME": "python",
                        # host storage through the identity: no connection string, no key
                        "AzureWebJobsStorage__accountName": v[3],
                        "AzureWebJobsStorage__credential": "managedidentity",
                        "AzureWebJobsStorage__clientId": v[2],
                        "WEBSITE_RUN_FROM_PACKAGE": v[4],
                        "WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID": v[5],
                    }.items()
                )
            ]
        )
        app = az.web.WebApp(
            f"{name}-reaper",
            name=fn_name,
            resource_group_name=rg.name,
            location=cfg.region,
            kind="functionapp,linux",
            reserved=True,
            server_farm_id=plan.id,
            https_only=True,
            identity=az.web.ManagedServiceIdentityArgs(
                type=az.web.ManagedServiceIdentityType.USER_ASSIGNED,
                user_assigned_identities=[identity.id],
            ),
            site_config=az.web.SiteConfigArgs(
                linux_fx_version=FUNCTION_RUNTIME,
                app_settings=settings,
                ftps_state="Disabled",
                min_tls_version="1.2",
            ),
            tags=tags,
            opts=_opts(parent),
        )
        vm_ids = pulumi.Output.all(rg.id, *[p.instance_id for _, p in nodes]).apply(
            lambda v: [f"{v[0]}/providers/Microsoft.Compute/virtualMachines/{n}" for n in v[1:]]
        )
        workbook = az.applicationinsights.Workbook(
            f"{name}-workbook",
            resource_name_=str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet/{cfg.stack}/workbook")),
            resource_group_name=rg.name,
            location=cfg.region,
            kind="shared",
            category="workbook",
            display_name=f"gpufleet {cfg.stack}: GPU nodes",
            source_id=rg.id,
            serialized_data=vm_ids.apply(lambda ids: json.dumps(workbook_body(cfg.stack, ids))),
            tags=tags,
            opts=_opts(parent),
        )
        return GuardParts(app.name, AZURE_SCHEDULE, workbook.display_name)


PROVIDER = AzureProvider()
