"""The throwaway cloud's program: a firewall, a bucket, a key, each node and the reaper
function with its schedule, declared as resources of its own Pulumi package (no SDK: plain
``pulumi.CustomResource`` with its type tokens; its mocks.py answers for them offline)."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import pulumi

from infra import reaper_deploy
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
from infra.components.args import AccessArgs, GuardArgs, NetworkArgs, NodeArgs, StorageArgs
from infra.config import StackConfig
from infra.nodes import NodeSpec

from . import entry

NAME = "examplecloud"


class _Resource(pulumi.CustomResource):
    """One resource of this cloud's package; the outputs named in ``props`` as None are
    filled by the engine (offline: by mocks.py)."""

    def __init__(
        self, kind: str, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions
    ) -> None:
        super().__init__(f"{NAME}:{kind}", name, props, opts)


class ExampleProvider:
    name = NAME

    def plan_notes(self, cfg: StackConfig, today: dt.date) -> PlanNotes:
        return catalog_notes(cfg, today)

    def provider_resource(self, region: str) -> pulumi.ProviderResource:
        return pulumi.ProviderResource(NAME, f"{NAME}-{region}", {"region": region})

    def network(self, parent: pulumi.Resource, name: str, args: NetworkArgs) -> NetworkParts:
        props = {"sshFrom": list(args.ssh_cidrs), "tags": args.tags, "zone": None}
        firewall = _Resource("network:Firewall", f"{name}-fw", props, common.child_opts(parent))
        zone = pulumi.Output.from_input(args.zone) if args.zone else firewall.zone  # type: ignore[attr-defined]
        return NetworkParts(firewall.id, firewall.id, firewall.id, zone, None)

    def storage(self, parent: pulumi.Resource, name: str, args: StorageArgs) -> StorageParts:
        props = {"bucketName": f"gpufleet-{args.stack}", "tags": args.tags}
        bucket = _Resource("storage:Bucket", f"{name}-bucket", props, common.child_opts(parent))
        return StorageParts(bucket.bucketName, bucket.id)  # type: ignore[attr-defined]

    def access(
        self, parent: pulumi.Resource, name: str, args: AccessArgs, storage: StorageParts
    ) -> AccessParts:
        props = {"publicKey": args.ssh_public_key, "bucket": storage.bucket}
        key = _Resource("access:Key", f"{name}-key", props, common.child_opts(parent))
        return AccessParts(None, None, key.id)

    def node(
        self,
        parent: pulumi.Resource,
        spec: NodeSpec,
        args: NodeArgs,
        net: NetworkParts,
        access: AccessParts,
    ) -> NodeParts:
        props = {
            "size": spec.instance_type.name,
            "tags": spec.tags,
            "userData": spec.user_data,
            "firewall": net.security_group_id,
            "key": access.key_name,
            "address": None,
            "privateAddress": None,
        }
        node = _Resource("compute:Instance", spec.name, props, common.child_opts(parent))
        return NodeParts(node.id, node.address, node.privateAddress)  # type: ignore[attr-defined]

    def guard(
        self,
        parent: pulumi.Resource,
        name: str,
        args: GuardArgs,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
    ) -> GuardParts:
        code = reaper_deploy.function_zip(NAME)  # its entry.py on top, the reaper beside it
        props = {
            "functionName": reaper_deploy.function_name(args.stack),
            "handler": entry.HANDLER,
            "env": reaper_deploy.function_env(args),
            "schedule": entry.SCHEDULE,
            "codeSha256": hashlib.sha256(code).hexdigest(),
        }
        fn = _Resource("compute:Function", f"{name}-reaper", props, common.child_opts(parent))
        return GuardParts(
            fn.functionName,  # type: ignore[attr-defined]
            entry.SCHEDULE,
            None,
            console_note="examplecloud has no monitoring console",
        )


PROVIDER = ExampleProvider()
