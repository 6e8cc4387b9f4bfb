"""The small interface every cloud's program implements, and how a stack's cloud is found.

Components own the resource graph's shape (one ComponentResource per concern); a provider
module only knows how its cloud spells each concern. Capabilities are data: a provider lists
what it cannot do with the reason, in its catalog file's ``[provider.unsupported]`` table,
and every caller (the config's validation, the node plan, the program) consults that data
through ``infra.catalog`` (which imports no SDK) instead of branching on the provider's
name; the program module keeps no copy of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pulumi

from infra import clouds
from infra.catalog import load_catalog, plan_notes
from infra.components.args import AccessArgs, GuardArgs, NetworkArgs, NodeArgs, StorageArgs
from infra.config import StackConfig
from infra.nodes import NodeSpec


@dataclass
class NetworkParts:
    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    zone: pulumi.Output[str]
    placement_group: pulumi.Output[str] | None


@dataclass
class StorageParts:
    bucket: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]


@dataclass
class AccessParts:
    role_name: pulumi.Output[str] | None  # None: each node gets its own role (Alicloud)
    instance_profile: pulumi.Output[str] | None
    key_name: pulumi.Output[str]
    node_policy: pulumi.Output[str] | None = None  # the stack's node policy: name or ARN


@dataclass
class NodeParts:
    instance_id: pulumi.Output[str]
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]


@dataclass
class GuardParts:
    function_name: pulumi.Output[str]
    schedule: str
    dashboard: pulumi.Output[str] | None  # the monitoring view's name, where one is declared
    # Its console address, and a note: where in the console, or why the cloud has none
    # (the stack's `dashboard` output).
    console_url: pulumi.Input[str] | None = None
    console_note: str = ""


@dataclass(frozen=True)
class PlanNotes:
    """What a plan tells people about the stack's cloud, in the plan's order: ``billing``
    before the bill's own warnings, ``stack`` after them."""

    billing: tuple[str, ...] = ()
    stack: tuple[str, ...] = ()


def catalog_notes(cfg: StackConfig, today: dt.date, own: Sequence[str] = ()) -> PlanNotes:
    """A cloud's plan notes from its catalog file around its program's ``own``: the billing
    mode's note ([provider.billing_notes]); then ``own``, the [plan] notes and each deadline
    near its date."""
    note = load_catalog().providers[cfg.provider].billing_notes.get(cfg.billing)
    return PlanNotes(
        billing=(note,) if note else (),
        stack=(*own, *plan_notes(cfg.provider, cfg.stack, today)),
    )


class CloudProvider(Protocol):
    """A cloud's program. Each component's call takes that component's narrow args
    (infra/components/args.py), never the whole StackConfig; only plan_notes, which
    speaks about the whole stack, reads the config itself."""

    name: str

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        """What the plan must tell people about this stack on this cloud (scripts/plan.py):
        most clouds answer :func:`catalog_notes` with what their program knows."""
        ...

    def provider_resource(self, region: str) -> pulumi.ProviderResource: ...

    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts: ...

    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts: ...

    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts: ...

    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts: ...

    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts: ...


def get_provider(name: str) -> CloudProvider:
    """The cloud's program (its folder's program.py, declaring PROVIDER), imported only when
    a stack asks for it (its SDK is large)."""
    try:
        module = clouds.module(name, "program")
    except LookupError:
        known = ", ".join(clouds.names("program.py"))
        raise ValueError(f"unknown provider {name!r}; known: {known}") from None
    provider: CloudProvider = module.PROVIDER
    return provider
