"""GpuNode: one GPU instance with its scratch, billing mode, tags and first-boot script."""

from __future__ import annotations

import pulumi

from infra.clouds.base import AccessParts, CloudProvider, NetworkParts
from infra.components.args import NodeArgs
from infra.nodes import NodeSpec


class GpuNode(pulumi.ComponentResource):
    """IMDSv2 only, encrypted disks, shutdown = stop, tagged for the watchdog and the reaper."""

    def __init__(
        self,
        spec: NodeSpec,
        args: NodeArgs,
        cloud: CloudProvider,
        net: NetworkParts,
        access: AccessParts,
        opts: pulumi.ResourceOptions,
    ):
        super().__init__("gpufleet:node:GpuNode", spec.name, None, opts)
        self.spec = spec
        self.parts = cloud.node(self, spec, args, net, access)
        self.instance_id = self.parts.instance_id
        self.public_ip = self.parts.public_ip
        self.private_ip = self.parts.private_ip
        self.register_outputs(
            {
                "instance_id": self.instance_id,
                "public_ip": self.public_ip,
                "private_ip": self.private_ip,
            }
        )

    def output(self) -> pulumi.Output[dict[str, str]]:
        """This node's entry in the stack's `nodes` output."""
        return pulumi.Output.all(self.instance_id, self.public_ip, self.private_ip).apply(
            lambda v: {
                "name": self.spec.name,
                "role": self.spec.role,
                "instance_id": v[0],
                "public_ip": v[1],
                "private_ip": v[2],
            }
        )
