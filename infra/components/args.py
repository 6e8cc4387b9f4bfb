"""What each component needs from the stack's config, and nothing more.

A component (infra/components/) and the cloud call that declares its resources take one
of these, as pulumi/examples pair each ComponentResource with its own args: a node never
sees the bucket's lifecycle, a bucket never sees the SSH networks. They are built from
the StackConfig in one place, :func:`component_args`; everything derived from several
config fields (the stack's tags, whether it wants a placement group) is decided there
once, so no cloud re-derives it.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import Catalog
from infra.config import StackConfig
from infra.nodes import needs_placement_group, node_name, stack_tags


@dataclass(frozen=True)
class Billing:
    """How the stack's instances are bought: on-demand, spot (with an optional cap per
    hour) or subscription (for this many months)."""

    mode: str
    spot_max_price: float | None
    subscription_months: int | None


@dataclass(frozen=True)
class NetworkArgs:
    """The network: where (region, a pinned zone or none), for which instance type (the
    zone must offer it), SSH from which networks, and whether the stack wants a
    placement group (nodes.needs_placement_group)."""

    stack: str
    region: str
    zone: str | None
    instance_type: str
    ssh_cidrs: tuple[str, ...]
    placement_group: bool
    tags: dict[str, str]


@dataclass(frozen=True)
class StorageArgs:
    """The bucket: its region, when objects are archived, whether a destroy removes it."""

    stack: str
    region: str
    archive_days: int
    destroy_data: bool
    tags: dict[str, str]


@dataclass(frozen=True)
class AccessArgs:
    """The SSH key and the nodes' shared grant ("" when no key is set: plan only)."""

    stack: str
    region: str
    ssh_public_key: str
    tags: dict[str, str]


@dataclass(frozen=True)
class NodeArgs:
    """What every node of the stack shares; the node's own part is its NodeSpec."""

    stack: str
    region: str
    zone: str | None
    nodes: int
    billing: Billing
    root_disk_gb: int
    destroy_data: bool
    tags: dict[str, str]
    # an existing capacity reservation to launch into (infra/config.py capacityReservation)
    capacity_reservation: str | None = None
    capacity_block: bool = False


@dataclass(frozen=True)
class GuardArgs:
    """The idle reaper: which cloud, stack and region it watches."""

    provider: str
    stack: str
    region: str
    tags: dict[str, str]
    # spot recovery (infra/reaper/recovery.py): start a reclaimed node again; the nodes'
    # names (their Name tag), so one the cloud deleted is reported as lost
    restart_reclaimed: bool = True
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ComponentArgs:
    network: NetworkArgs
    storage: StorageArgs
    access: AccessArgs
    node: NodeArgs
    guard: GuardArgs


def billing_of(cfg: StackConfig) -> Billing:
    return Billing(cfg.billing, cfg.spot_max_price, cfg.subscription_months)


def network_args(cfg: StackConfig, catalog: Catalog) -> NetworkArgs:
    itype = catalog.instance(cfg.provider, cfg.instance_type)
    return NetworkArgs(
        stack=cfg.stack,
        region=cfg.region,
        zone=cfg.zone,
        instance_type=cfg.instance_type,
        ssh_cidrs=cfg.ssh_cidrs,
        placement_group=needs_placement_group(cfg, itype),
        tags=stack_tags(cfg),
    )


def storage_args(cfg: StackConfig) -> StorageArgs:
    return StorageArgs(
        stack=cfg.stack,
        region=cfg.region,
        archive_days=cfg.bucket_archive_days,
        destroy_data=cfg.destroy_data,
        tags=stack_tags(cfg),
    )


def access_args(cfg: StackConfig) -> AccessArgs:
    return AccessArgs(
        stack=cfg.stack,
        region=cfg.region,
        ssh_public_key=cfg.ssh_public_key or "",
        tags=stack_tags(cfg),
    )


def node_args(cfg: StackConfig) -> NodeArgs:
    return NodeArgs(
        stack=cfg.stack,
        region=cfg.region,
        zone=cfg.zone,
        nodes=cfg.nodes,
        billing=billing_of(cfg),
        root_disk_gb=cfg.root_disk_gb,
        destroy_data=cfg.destroy_data,
        tags=stack_tags(cfg),
        capacity_reservation=cfg.capacity_reservation,
        capacity_block=cfg.capacity_block,
    )


def guard_args(cfg: StackConfig) -> GuardArgs:
    return GuardArgs(
        provider=cfg.provider,
        stack=cfg.stack,
        region=cfg.region,
        tags=stack_tags(cfg),
        restart_reclaimed=cfg.restart_reclaimed,
        nodes=tuple(node_name(cfg, i) for i in range(cfg.nodes)),
    )


def component_args(cfg: StackConfig, catalog: Catalog) -> ComponentArgs:
    """Every component's args from the stack's config: the one place that reads it."""
    return ComponentArgs(
        network=network_args(cfg, catalog),
        storage=storage_args(cfg),
        access=access_args(cfg),
        node=node_args(cfg),
        guard=guard_args(cfg),
    )
