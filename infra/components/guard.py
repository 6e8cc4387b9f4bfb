"""IdleGuard: the cloud half of "never pay for an idle GPU" (the watchdog is the node half).

A scheduled function runs the reaper (infra/reaper) with a stop-only role scoped to this
stack's tags; on AWS a CloudWatch dashboard comes with it. No alarm can stop a node: alarms
read neither tags nor GPUs (SECURITY.md).
"""

from __future__ import annotations

import pulumi

from infra.clouds.base import CloudProvider, NodeParts, StorageParts
from infra.components.args import GuardArgs
from infra.nodes import NodeSpec


class IdleGuard(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        args: GuardArgs,
        cloud: CloudProvider,
        nodes: list[tuple[NodeSpec, NodeParts]],
        storage: StorageParts,
        opts: pulumi.ResourceOptions,
    ):
        super().__init__("gpufleet:guard:IdleGuard", name, None, opts)
        self.parts = cloud.guard(self, name, args, nodes, storage)
        self.function_name = self.parts.function_name
        self.schedule = self.parts.schedule
        self.register_outputs({"function_name": self.function_name, "schedule": self.schedule})
