"""Access: the SSH key pair and the role the nodes run as (stack bucket + own metrics only)."""

from __future__ import annotations

import pulumi

from infra.clouds.base import CloudProvider, StorageParts
from infra.components.args import AccessArgs


class Access(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        args: AccessArgs,
        cloud: CloudProvider,
        storage: StorageParts,
        opts: pulumi.ResourceOptions,
    ):
        super().__init__("gpufleet:access:Access", name, None, opts)
        self.parts = cloud.access(self, name, args, storage)
        self.role_name = self.parts.role_name
        self.key_name = self.parts.key_name
        self.register_outputs({"role_name": self.role_name, "key_name": self.key_name})
