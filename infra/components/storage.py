"""Storage: the stack's bucket for datasets, checkpoints and reports."""

from __future__ import annotations

import pulumi

from infra.clouds.base import CloudProvider
from infra.components.args import StorageArgs


class Storage(pulumi.ComponentResource):
    """Encrypted, private, TLS-only, versioned, archived with age; kept on destroy unless
    gpufleet:destroyData is true."""

    def __init__(
        self, name: str, args: StorageArgs, cloud: CloudProvider, opts: pulumi.ResourceOptions
    ):
        super().__init__("gpufleet:storage:Storage", name, None, opts)
        self.parts = cloud.storage(self, name, args)
        self.bucket = self.parts.bucket
        self.bucket_arn = self.parts.bucket_arn
        self.register_outputs({"bucket": self.bucket, "bucket_arn": self.bucket_arn})
