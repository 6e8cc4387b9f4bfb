"""Network: VPC, subnet/VSwitch, the security group and, where it helps, a placement group."""

from __future__ import annotations

import pulumi

from infra.clouds.base import CloudProvider
from infra.components.args import NetworkArgs


class Network(pulumi.ComponentResource):
    """SSH only from the stack's sshCidrs; every port open between the stack's own nodes."""

    def __init__(
        self, name: str, args: NetworkArgs, cloud: CloudProvider, opts: pulumi.ResourceOptions
    ):
        super().__init__("gpufleet:network:Network", name, None, opts)
        parts = cloud.network(self, name, args)
        self.parts = parts
        self.vpc_id = parts.vpc_id
        self.subnet_id = parts.subnet_id
        self.security_group_id = parts.security_group_id
        self.zone = parts.zone
        self.placement_group = parts.placement_group
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "subnet_id": self.subnet_id,
                "security_group_id": self.security_group_id,
                "zone": self.zone,
                "placement_group": self.placement_group,
            }
        )
