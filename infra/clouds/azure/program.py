"""Azure: resource groups, VNet + NSG, Blob Storage, a managed identity, GPU VMs, and a
Functions app that deallocates idle nodes every 5 minutes.

Two resource groups per stack: ``gpufleet-<stack>`` holds everything a destroy removes, and
``gpufleet-<stack>-data`` holds the storage account alone, kept on destroy (retain_on_delete
on the group, the account and the container) unless gpufleet:destroyData is true: deleting a
resource group deletes what is inside it, so the kept data cannot share the compute group.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import pulumi
import pulumi_azure_native as az
import pulumi_random as random

from gpufleet_node.fleet_names import METRIC_GPU_MEM, METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE
from infra import reaper_deploy as guard_logic
from infra.catalog import Feature, InstanceType, load_catalog
from infra.clouds.base import (
    AccessParts,
    GuardParts,
    NetworkParts,
    NodeParts,
    PlanNotes,
    StorageParts,
    catalog_notes,
)
from infra.clouds.common import ARCHIVE_AFTER_COOL_DAYS, child_opts
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

# az.compute.VirtualMachine imports one module of pulumi_azure_native.compute, not all
narrow(az)

NAME = "azure"
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
# Built-in role: Storage Blob Data Reader (the host reads the package it runs from).
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
# Built-in role: Monitoring Metrics Publisher (post custom metrics against a resource).
METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
# Every built-in role named above, by its published name (tests/data/clouds/azure_rbac.toml
# checks each id against the name Microsoft publishes for it).
BUILT_IN_ROLES = {
    BLOB_DATA_CONTRIBUTOR: "Storage Blob Data Contributor",
    BLOB_DATA_OWNER: "Storage Blob Data Owner",
    BLOB_DATA_READER: "Storage Blob Data Reader",
    METRICS_PUBLISHER: "Monitoring Metrics Publisher",
}

# A node may deallocate itself (the watchdog's power-off path: a shutdown from inside the
# OS leaves the VM "Stopped" and billed) and write its own tags (the lease, through Tags -
# Update At Scope); scoped to its own VM. Nothing else: its name, tags and events come from
# IMDS, which needs no role (tests/infra/test_azure_rbac.py maps each of the watchdog's ARM
# calls to its operation). Azure RBAC cannot limit a tag write to one key, so a process on
# the node could also change its own guard tags (SECURITY.md).
NODE_ACTIONS = (
    "Microsoft.Compute/virtualMachines/deallocate/action",
    "Microsoft.Resources/tags/write",
)
# Azure Functions NCRONTAB (seconds first): every 5 minutes.
AZURE_SCHEDULE = "0 */5 * * * *"
FUNCTION_RUNTIME = "Python|3.11"


def storage_account_name(stack: str, suffix: str) -> str:
    """3-24 lower-case letters and digits, globally unique: a prefix of the stack's name with
    its hyphens dropped, then the random suffix, always whole."""
    stem = "".join(c for c in stack if c.isalnum())
    return f"gpf{stem[: 24 - 3 - len(suffix)]}{suffix}"


def spot_args(billing: Billing) -> dict[str, Any]:
    """Spot priority that deallocates on eviction (disks and the VM stay; Delete would lose
    the OS disk and any scratch not yet synced). -1: pay up to the on-demand price."""
    if billing.mode != "spot":
        return {"priority": "Regular"}
    return {
        "priority": "Spot",
        "eviction_policy": "Deallocate",
        "billing_profile": az.compute.BillingProfileArgs(
            max_price=billing.spot_max_price if billing.spot_max_price else -1
        ),
    }


def image_for(itype: InstanceType) -> dict[str, str]:
    return UBUNTU_HPC if itype.infiniband else UBUNTU


def needs_infiniband_set(nodes: int, itype: InstanceType) -> bool:
    """InfiniBand links VMs of one availability set (or scale set): a multi-node stack of an
    InfiniBand size puts its nodes in one, inside the proximity placement group."""
    info = load_catalog().providers[NAME]
    return itype.infiniband and nodes > 1 and info.supports(Feature.INFINIBAND)


def built_in_role(subscription: pulumi.Output[str], role: str) -> pulumi.Output[str]:
    """A built-in role's definition id in the subscription (the GUIDs are Azure's own)."""
    return subscription.apply(
        lambda sub: f"/subscriptions/{sub}/providers/Microsoft.Authorization/roleDefinitions/{role}"
    )


def role_permissions(actions: tuple[str, ...]) -> list[az.authorization.PermissionArgs]:
    return [az.authorization.PermissionArgs(actions=list(actions), not_actions=[])]


def nsg_rules(ssh_cidrs: tuple[str, ...]) -> list[az.network.SecurityRuleArgs]:
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
        for i, cidr in enumerate(ssh_cidrs)
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
                                days_after_modification_greater_than=days + ARCHIVE_AFTER_COOL_DAYS
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
    """What the Azure reaper documents at the top of infra/clouds/azure/reaper.py: the settings it
    requires, and the actions its custom role must hold (read there, never copied here)."""
    from infra.clouds.azure import reaper

    return tuple(reaper.REQUIRED_ENV), tuple(reaper.ROLE_ACTIONS)


def reaper_settings(
    args: GuardArgs, subscription_id: str, resource_group: str, client_id: str
) -> dict[str, str]:
    """The reaper's environment: the common four plus what the Azure client reads (its
    subscription, the stack's resource group, and which managed identity to sign in as).
    Every setting the reaper's contract requires is set, or the program refuses."""
    settings = {
        **guard_logic.function_env(args),
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
    the custom metrics the watchdog posts against its VM (namespace from infra.reaper.core).
    Only keys Microsoft's workbook schema defines (tests/data/dashboards/azure_workbook.toml,
    checked by tests/infra/test_dashboards.py)."""

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


def scratch_disks(
    spec: NodeSpec, disk_id: pulumi.Input[str] | None
) -> list[az.compute.DataDiskArgs] | None:
    """The scratch data disk when the plan wants one (no local NVMe on the size): the
    managed disk ``disk_id`` (scratch_disk), attached. A destroy only detaches it: the disk
    itself lives in the kept data group."""
    if spec.scratch.kind != "disk" or disk_id is None:
        return None
    return [
        az.compute.DataDiskArgs(
            lun=0,
            create_option="Attach",
            caching=az.compute.CachingTypes.NONE,
            managed_disk=az.compute.ManagedDiskParametersArgs(id=disk_id),
            delete_option="Detach",
        )
    ]


def os_profile(spec: NodeSpec, ssh_key: pulumi.Input[str]) -> az.compute.OSProfileArgs:
    """Key-only SSH for the catalog's user, the first-boot script as custom data."""
    user = load_catalog().providers[NAME].ssh_user
    return az.compute.OSProfileArgs(
        computer_name=spec.name,
        admin_username=user,
        custom_data=base64.b64encode(spec.user_data.encode()).decode(),
        linux_configuration=az.compute.LinuxConfigurationArgs(
            disable_password_authentication=True,
            provision_vm_agent=True,
            ssh=az.compute.SshConfigurationArgs(
                public_keys=[
                    az.compute.SshPublicKeyArgs(
                        path=f"/home/{user}/.ssh/authorized_keys", key_data=ssh_key
                    )
                ]
            ),
        ),
    )


def storage_profile(
    spec: NodeSpec, root_disk_gb: int, scratch_id: pulumi.Input[str] | None = None
) -> az.compute.StorageProfileArgs:
    """The size's image, a Premium OS disk that goes with the VM, and the scratch disk."""
    return az.compute.StorageProfileArgs(
        image_reference=az.compute.ImageReferenceArgs(
            version="latest", **image_for(spec.instance_type)
        ),
        os_disk=az.compute.OSDiskArgs(
            name=f"{spec.name}-os",
            create_option="FromImage",
            disk_size_gb=root_disk_gb,
            caching=az.compute.CachingTypes.READ_WRITE,
            managed_disk=az.compute.ManagedDiskParametersArgs(storage_account_type="Premium_LRS"),
            delete_option="Delete",
        ),
        data_disks=scratch_disks(spec, scratch_id),
    )


def function_app_settings(
    args: GuardArgs,
    subscription_id: str,
    resource_group: str,
    client_id: str,
    account_name: str,
    package_url: str,
    identity_id: str,
) -> list[az.web.NameValuePairArgs]:
    """The Function App's settings, sorted by name: the reaper's (reaper_settings), the
    Functions runtime's, host storage through the identity (no connection string, no key)
    and the package it runs from."""
    settings = {
        **reaper_settings(args, subscription_id, resource_group, client_id),
        "FUNCTIONS_EXTENSION_VERSION": "~4",
        "FUNCTIONS_WORKER_RUNTIME": "python",
        "AzureWebJobsStorage__accountName": account_name,
        "AzureWebJobsStorage__credential": "managedidentity",
        "AzureWebJobsStorage__clientId": client_id,
        "WEBSITE_RUN_FROM_PACKAGE": package_url,
        "WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID": identity_id,
    }
    return [az.web.NameValuePairArgs(name=k, value=v) for k, v in sorted(settings.items())]


def _identity(
    parent: pulumi.Resource,
    name: str,
    resource_name: str,
    rg: az.resources.ResourceGroup,
    region: str,
    tags: dict[str, str],
) -> az.managedidentity.UserAssignedIdentity:
    return az.managedidentity.UserAssignedIdentity(
        name,
        resource_name_=resource_name,
        resource_group_name=rg.name,
        location=region,
        tags=tags,
        opts=child_opts(parent),
    )


def _custom_role(
    parent: pulumi.Resource,
    name: str,
    role_name: str,
    description: str,
    scope: pulumi.Input[str],
    actions: tuple[str, ...],
) -> az.authorization.RoleDefinition:
    """A custom role holding ``actions``, defined at ``scope`` and assignable there alone."""
    return az.authorization.RoleDefinition(
        name,
        role_name=role_name,
        description=description,
        scope=scope,
        assignable_scopes=[scope],
        permissions=role_permissions(actions),
        role_type="CustomRole",
        opts=child_opts(parent),
    )


def _assign(
    parent: pulumi.Resource,
    name: str,
    principal_id: pulumi.Input[str],
    role_definition_id: pulumi.Input[str],
    scope: pulumi.Input[str],
    description: str | None = None,
) -> None:
    """A role on ``scope`` for a managed identity (a service principal)."""
    az.authorization.RoleAssignment(
        name,
        principal_id=principal_id,
        principal_type="ServicePrincipal",
        role_definition_id=role_definition_id,
        scope=scope,
        description=description,
        opts=child_opts(parent),
    )


def package_account_args() -> dict[str, Any]:
    """The package account's settings: private, HTTPS and TLS 1.2 only, like the others,
    but with shared keys allowed, because the provider's Blob upload signs with the
    account key (see AzureProvider._function_package). The cost: whoever may list this
    account's keys (Owner, Contributor, Storage Account Contributor on the stack's group)
    could replace the package, i.e. run code as the reaper's identity, which may only read
    and deallocate this stack's VMs; they could change the Function App itself anyway."""
    return {
        "kind": "StorageV2",
        "sku": az.storage.SkuArgs(name="Standard_LRS"),
        "allow_blob_public_access": False,
        "allow_shared_key_access": True,
        "enable_https_traffic_only": True,
        "minimum_tls_version": "TLS1_2",
        # the portal and the az CLI default to Entra ID here, not to the key
        "default_to_o_auth_authentication": True,
    }


def package_blob_name(package: Path) -> str:
    """The package blob's name: the zip's own content-addressed file name
    (``azure-reaper-<sha256[:16]>.zip``, reaper_deploy.function_zip_file). Microsoft:
    "When you change the contents of the package file and not the URL itself, you must
    also restart your function app to sync triggers" (functions-deployment-technologies,
    External package URL); a new name is a new URL, a new app setting, and a restart."""
    return package.name


class AzureProvider:
    name = NAME

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        return catalog_notes(cfg, today)

    def __init__(self) -> None:
        # The compute resource group of the stack being declared: network() creates it and
        # the later steps of the same build put their resources in it.
        self._groups: dict[str, az.resources.ResourceGroup] = {}
        # The kept data group of the same build (storage() creates it): what a destroy
        # keeps (the account, the scratch disks) lives there, never in the compute group.
        self._data_groups: dict[str, az.resources.ResourceGroup] = {}
        self._ib_sets: dict[str, pulumi.Output[str]] = {}

    def provider_resource(self, region: str) -> pulumi.ProviderResource:
        return az.Provider("azure-native", location=region)

    def _group(self, stack: str) -> az.resources.ResourceGroup:
        return self._groups[stack]

    # -- network ----------------------------------------------------------------------------
    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts:
        tags = args.tags
        rg = az.resources.ResourceGroup(
            f"{name}-rg",
            resource_group_name=f"gpufleet-{args.stack}",
            location=args.region,
            tags=tags,
            opts=child_opts(parent),
        )
        self._groups[args.stack] = rg
        self._ib_sets.pop(args.stack, None)
        nsg = az.network.NetworkSecurityGroup(
            f"{name}-nsg",
            resource_group_name=rg.name,
            location=args.region,
            security_rules=nsg_rules(args.ssh_cidrs),
            tags=tags,
            opts=child_opts(parent),
        )
        vnet = az.network.VirtualNetwork(
            f"{name}-vnet",
            resource_group_name=rg.name,
            location=args.region,
            address_space=az.network.AddressSpaceArgs(address_prefixes=[VNET_CIDR]),
            tags=tags,
            # the subnet is its own resource; the VNet must not fight it over `subnets`
            opts=child_opts(parent, ignore_changes=["subnets"]),
        )
        subnet = az.network.Subnet(
            f"{name}-subnet",
            resource_group_name=rg.name,
            virtual_network_name=vnet.name,
            address_prefix=SUBNET_CIDR,
            network_security_group=az.network.NetworkSecurityGroupArgs(id=nsg.id),
            opts=child_opts(parent),
        )
        itype = load_catalog().instance(NAME, args.instance_type)
        ppg = None
        if args.placement_group:
            ppg = az.compute.ProximityPlacementGroup(
                f"{name}-ppg",
                resource_group_name=rg.name,
                location=args.region,
                proximity_placement_group_type="Standard",
                intent=az.compute.ProximityPlacementGroupPropertiesIntentArgs(
                    vm_sizes=[itype.name]
                ),
                zones=[args.zone] if args.zone else None,
                tags=tags,
                opts=child_opts(parent),
            ).id
        # no zone pinned: the VMs are regional, and the output names the region
        zone = pulumi.Output.from_input(args.zone or args.region)
        return NetworkParts(vnet.id, subnet.id, nsg.id, zone, ppg)

    # -- storage ----------------------------------------------------------------------------
    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts:
        tags = args.tags
        keep = not args.destroy_data
        data_rg = az.resources.ResourceGroup(
            f"{name}-data-rg",
            resource_group_name=f"gpufleet-{args.stack}-data",
            location=args.region,
            tags=tags,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        self._data_groups[args.stack] = data_rg
        # Account names are global and a destroy keeps the account: a random suffix, held in
        # the stack's state, is stable across updates and new after a destroy.
        suffix = random.RandomId(f"{name}-account-suffix", byte_length=3, opts=child_opts(parent))
        account = az.storage.StorageAccount(
            f"{name}-account",
            account_name=suffix.hex.apply(lambda h: storage_account_name(args.stack, h)),
            resource_group_name=data_rg.name,
            location=args.region,
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
            opts=child_opts(parent, retain_on_delete=keep),
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
            opts=child_opts(parent, retain_on_delete=keep),
        )
        container = az.storage.BlobContainer(
            f"{name}-container",
            account_name=account.name,
            resource_group_name=data_rg.name,
            container_name=CONTAINER,
            public_access=az.storage.PublicAccess.NONE,
            opts=child_opts(parent, retain_on_delete=keep),
        )
        az.storage.ManagementPolicy(
            f"{name}-lifecycle",
            account_name=account.name,
            resource_group_name=data_rg.name,
            management_policy_name="default",
            policy=lifecycle_policy(args.archive_days),
            opts=child_opts(parent, retain_on_delete=keep),
        )
        # `bucket` is what bootstrap and verify-gpu address: <account>/<container>.
        bucket = pulumi.Output.concat(account.name, "/", CONTAINER)
        return StorageParts(bucket, container.id)

    # -- access -----------------------------------------------------------------------------
    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts:
        # Azure takes the SSH key on the VM itself (osProfile): `key_name` carries it there.
        # Each node gets its own identity (node()), so that its roles name that VM alone;
        # `node_policy` carries the container they may reach.
        key = pulumi.Output.from_input(args.ssh_public_key)
        return AccessParts(None, None, key, storage.bucket_arn)

    # -- nodes ------------------------------------------------------------------------------
    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        zones = [args.zone] if args.zone else None
        pip, nic = self._node_interface(parent, spec, args, net, zones)
        availability_set = None
        if needs_infiniband_set(args.nodes, spec.instance_type):
            availability_set = self._infiniband_set(parent, args, net)
        identity = _identity(
            parent,
            f"{spec.name}-identity",
            f"gpufleet-{spec.name}",
            self._group(args.stack),
            args.region,
            spec.tags,
        )
        subscription = az.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        ).subscription_id
        if access.node_policy is not None:
            # the node reaches the stack's container and nothing else in the account
            _assign(
                parent,
                f"{spec.name}-blob",
                identity.principal_id,
                built_in_role(subscription, BLOB_DATA_CONTRIBUTOR),
                access.node_policy,  # the container's resource id
                description=f"gpufleet {spec.name}: the stack's blob container only",
            )
        scratch = self._scratch_disk(parent, spec, args, zones)
        vm = self._vm(
            parent, spec, args, net, access, zones, nic, identity, availability_set, scratch
        )
        self._node_self_roles(parent, spec, vm, identity, subscription)
        private_ip = nic.ip_configurations.apply(first_private_ip)
        return NodeParts(vm.name, pip.ip_address.apply(lambda a: a or ""), private_ip)

    def _scratch_disk(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        zones: list[str] | None,
    ) -> pulumi.Output[str] | None:
        """The scratch managed disk, in the kept data group: deleting a resource group
        deletes every disk in it, attached or not, so a disk the VM only detaches on destroy
        would still go with the compute group. Kept on destroy unless destroyData."""
        if spec.scratch.kind != "disk":
            return None
        return az.compute.Disk(
            f"{spec.name}-scratch",
            disk_name=f"{spec.name}-scratch",
            resource_group_name=self._data_groups[args.stack].name,
            location=args.region,
            zones=zones,
            sku=az.compute.DiskSkuArgs(name=spec.scratch.volume_class),
            disk_size_gb=spec.scratch.size_gb,
            creation_data=az.compute.CreationDataArgs(
                create_option=az.compute.DiskCreateOption.EMPTY
            ),
            tags=spec.tags,
            opts=child_opts(parent, retain_on_delete=not args.destroy_data),
        ).id

    def _node_interface(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        zones: list[str] | None,
    ) -> tuple[az.network.PublicIPAddress, az.network.NetworkInterface]:
        """The node's static public address and its accelerated NIC in the stack's subnet."""
        rg = self._group(args.stack)
        pip = az.network.PublicIPAddress(
            f"{spec.name}-ip",
            resource_group_name=rg.name,
            location=args.region,
            public_ip_allocation_method="Static",
            sku=az.network.PublicIPAddressSkuArgs(name="Standard"),
            zones=zones,
            tags=spec.tags,
            opts=child_opts(parent),
        )
        nic = az.network.NetworkInterface(
            f"{spec.name}-nic",
            resource_group_name=rg.name,
            location=args.region,
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
            opts=child_opts(parent),
        )
        return pip, nic

    def _vm(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
        zones: list[str] | None,
        nic: az.network.NetworkInterface,
        identity: az.managedidentity.UserAssignedIdentity,
        availability_set: pulumi.Output[str] | None,
        scratch: pulumi.Output[str] | None = None,
    ) -> az.compute.VirtualMachine:
        """The VM: its key, disks and NIC, encryption at host, the node's identity, its
        placement, and the Scheduled Events notice the watchdog syncs scratch on."""
        return az.compute.VirtualMachine(
            spec.name,
            vm_name=spec.name,
            resource_group_name=self._group(args.stack).name,
            location=args.region,
            zones=zones,
            hardware_profile=az.compute.HardwareProfileArgs(vm_size=spec.instance_type.name),
            os_profile=os_profile(spec, access.key_name),
            storage_profile=storage_profile(spec, args.root_disk_gb, scratch),
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
            # an existing capacity reservation group the VM is allocated from (capacityReservation)
            capacity_reservation=(
                az.compute.CapacityReservationProfileArgs(
                    capacity_reservation_group=az.compute.SubResourceArgs(
                        id=args.capacity_reservation
                    )
                )
                if args.capacity_reservation
                else None
            ),
            # Spot eviction and platform maintenance show up in Scheduled Events (IMDS), which
            # the watchdog reads to sync scratch before the VM goes.
            scheduled_events_profile=az.compute.ScheduledEventsProfileArgs(
                terminate_notification_profile=az.compute.TerminateNotificationProfileArgs(
                    enable=True, not_before_timeout="PT5M"
                )
            ),
            tags=spec.tags,
            opts=child_opts(parent, ignore_changes=["storageProfile.imageReference"]),
            **spot_args(args.billing),
        )

    def _node_self_roles(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        vm: az.compute.VirtualMachine,
        identity: az.managedidentity.UserAssignedIdentity,
        subscription: pulumi.Output[str],
    ) -> None:
        """The node's own power: deallocate and tag itself, post metrics against itself."""
        node_role = _custom_role(
            parent,
            f"{spec.name}-self-role",
            f"gpufleet {spec.name} self-deallocate",
            f"gpufleet node {spec.name}: deallocate and tag this VM only",
            vm.id,
            NODE_ACTIONS,
        )
        _assign(parent, f"{spec.name}-self", identity.principal_id, node_role.id, vm.id)
        _assign(
            parent,
            f"{spec.name}-metrics",
            identity.principal_id,
            built_in_role(subscription, METRICS_PUBLISHER),
            vm.id,
        )

    def _infiniband_set(
        self, parent: pulumi.Resource, args: NodeArgs, net: NetworkParts
    ) -> pulumi.Output[str]:
        """One availability set per stack (declared with its first node), aligned to the
        proximity placement group, so InfiniBand connects the nodes."""
        if args.stack not in self._ib_sets:
            self._ib_sets[args.stack] = az.compute.AvailabilitySet(
                f"{args.stack}-ib-set",
                resource_group_name=self._group(args.stack).name,
                location=args.region,
                platform_fault_domain_count=1,
                platform_update_domain_count=1,
                sku=az.compute.SkuArgs(name="Aligned"),
                proximity_placement_group=(
                    az.compute.SubResourceArgs(id=net.placement_group)
                    if net.placement_group
                    else None
                ),
                tags=args.tags,
                opts=child_opts(parent),
            ).id
        return self._ib_sets[args.stack]

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
        client = az.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        )
        identity = self._reaper_identity(parent, name, args, tags)
        fn_account, package = self._function_package(
            parent, name, args, identity, client.subscription_id, tags
        )
        app = self._function_app(
            parent, name, args, identity, client.subscription_id, fn_account, package, tags
        )
        workbook = self._workbook(parent, name, args, nodes, tags)
        return GuardParts(
            app.name,
            AZURE_SCHEDULE,
            workbook.display_name,
            # The portal's deep link to a resource: /#resource + its ARM id.
            console_url=workbook.id.apply(lambda i: f"https://portal.azure.com/#resource{i}"),
        )

    def _reaper_identity(
        self, parent: pulumi.Resource, name: str, args: GuardArgs, tags: dict[str, str]
    ) -> az.managedidentity.UserAssignedIdentity:
        """The reaper's identity, holding the reaper's custom role on the stack's resource
        group alone (its contract's actions: read and deallocate VMs, read metrics)."""
        rg = self._group(args.stack)
        identity = _identity(
            parent,
            f"{name}-reaper-identity",
            f"gpufleet-{args.stack}-reaper",
            rg,
            args.region,
            tags,
        )
        role = _custom_role(
            parent,
            f"{name}-reaper-role",
            f"gpufleet {args.stack} reaper",
            f"gpufleet {args.stack} idle reaper: read and deallocate this "
            "stack's VMs, read their metrics; no delete",
            rg.id,
            reaper_contract()[1],
        )
        _assign(
            parent,
            f"{name}-reaper-assignment",
            identity.principal_id,
            role.id,
            rg.id,
            description=f"gpufleet {args.stack} reaper: this stack's resource group only",
        )
        return identity

    def _function_package(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        identity: az.managedidentity.UserAssignedIdentity,
        subscription: pulumi.Output[str],
        tags: dict[str, str],
    ) -> tuple[az.storage.StorageAccount, az.storage.Blob]:
        """The Functions host's own storage (leases) and the code package, in two accounts
        of their own, never the data account.

        The host account refuses shared keys (the host reaches it as the reaper's
        identity). The package account must allow them: pulumi-azure-native uploads a Blob
        with the account's key (its custom_storage_azidentity.go: ListKeys, then
        NewClientWithSharedKeyCredential; issue 2015, KeyBasedAuthenticationNotPermitted,
        still open), and it holds nothing but the package (package_account). The host
        reads the package with the reaper's identity (Storage Blob Data Reader on that
        container), never a key or a SAS."""
        rg = self._group(args.stack)
        suffix = random.RandomId(f"{name}-fn-suffix", byte_length=3, opts=child_opts(parent))
        fn_account = az.storage.StorageAccount(
            f"{name}-fn-account",
            account_name=suffix.hex.apply(lambda h: storage_account_name(f"fn{args.stack}", h)),
            resource_group_name=rg.name,
            location=args.region,
            kind="StorageV2",
            sku=az.storage.SkuArgs(name="Standard_LRS"),
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            enable_https_traffic_only=True,
            minimum_tls_version="TLS1_2",
            tags=tags,
            opts=child_opts(parent),
        )
        _assign(
            parent,
            f"{name}-fn-storage",
            identity.principal_id,
            built_in_role(subscription, BLOB_DATA_OWNER),
            fn_account.id,
        )
        pkg_account = az.storage.StorageAccount(
            f"{name}-pkg-account",
            account_name=suffix.hex.apply(lambda h: storage_account_name(f"pk{args.stack}", h)),
            resource_group_name=rg.name,
            location=args.region,
            **package_account_args(),
            tags=tags,
            opts=child_opts(parent),
        )
        releases = az.storage.BlobContainer(
            f"{name}-fn-releases",
            account_name=pkg_account.name,
            resource_group_name=rg.name,
            container_name=PACKAGE_CONTAINER,
            public_access=az.storage.PublicAccess.NONE,
            opts=child_opts(parent),
        )
        package_file = guard_logic.function_zip_file(self.name)
        package = az.storage.Blob(
            f"{name}-fn-package",
            account_name=pkg_account.name,
            container_name=releases.name,
            resource_group_name=rg.name,
            # the file's name carries its content's digest: a new package is a new URL,
            # so the app setting changes and the app restarts on it (package_blob_name)
            blob_name=package_blob_name(package_file),
            type=az.storage.BlobType.BLOCK,
            source=pulumi.FileAsset(str(package_file)),
            opts=child_opts(parent),
        )
        _assign(
            parent,
            f"{name}-pkg-read",
            identity.principal_id,
            built_in_role(subscription, BLOB_DATA_READER),
            releases.id,
            description=f"gpufleet {args.stack} reaper: reads its package only",
        )
        return fn_account, package

    def _function_app(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        identity: az.managedidentity.UserAssignedIdentity,
        subscription: pulumi.Output[str],
        fn_account: az.storage.StorageAccount,
        package: az.storage.Blob,
        tags: dict[str, str],
    ) -> az.web.WebApp:
        """The Linux consumption plan and the Function App on it, running the package as
        the reaper's identity."""
        rg = self._group(args.stack)
        plan = az.web.AppServicePlan(
            f"{name}-plan",
            name=f"gpufleet-{args.stack}-reaper-plan",
            resource_group_name=rg.name,
            location=args.region,
            kind="functionapp",
            reserved=True,  # Linux
            sku=az.web.SkuDescriptionArgs(name="Y1", tier="Dynamic"),  # consumption
            tags=tags,
            opts=child_opts(parent),
        )
        settings = pulumi.Output.all(
            subscription, rg.name, identity.client_id, fn_account.name, package.url, identity.id
        ).apply(lambda v: function_app_settings(args, *v))
        return az.web.WebApp(
            f"{name}-reaper",
            name=guard_logic.function_name(args.stack),
            resource_group_name=rg.name,
            location=args.region,
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
            opts=child_opts(parent),
        )

    def _workbook(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        tags: dict[str, str],
    ) -> az.applicationinsights.Workbook:
        """The stack's GPU dashboard (workbook_body), one chart per metric over its VMs."""
        rg = self._group(args.stack)
        vm_ids = pulumi.Output.all(rg.id, *[p.instance_id for _, p in nodes]).apply(
            lambda v: [f"{v[0]}/providers/Microsoft.Compute/virtualMachines/{n}" for n in v[1:]]
        )
        return az.applicationinsights.Workbook(
            f"{name}-workbook",
            resource_name_=str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet/{args.stack}/workbook")),
            resource_group_name=rg.name,
            location=args.region,
            kind="shared",
            category="workbook",
            display_name=f"gpufleet {args.stack}: GPU nodes",
            source_id=rg.id,
            serialized_data=vm_ids.apply(lambda ids: json.dumps(workbook_body(args.stack, ids))),
            tags=tags,
            opts=child_opts(parent),
        )


PROVIDER = AzureProvider()
