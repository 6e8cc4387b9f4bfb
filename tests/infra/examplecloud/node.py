"""The throwaway cloud as its nodes see it: a metadata service of the ``/latest/meta-data/``
kind, tags read there, and an S3-compatible bucket. Shipped to the node as
gpufleet_node/clouds/examplecloud.py, like every cloud's node module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpufleet_node.clouds.base import (
    Credentials,
    MetadataNode,
    Metric,
    TagsUnreadable,
    register,
    system_poweroff,
)


@register
@dataclass
class ExampleNode(MetadataNode):
    name: ClassVar[str] = "examplecloud"
    joined: ClassVar[int] = 99
    metadata_base = "http://169.254.169.254"
    spot_path = "/latest/meta-data/spot"
    env_keys = ("EXAMPLE_KEY_ID", "EXAMPLE_SECRET", "EXAMPLE_TOKEN")

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        listed = self.metadata.read("/latest/meta-data/tags")
        if listed is None:
            raise TagsUnreadable("no tags in the metadata service")
        return dict(line.split("=", 1) for line in listed.splitlines() if "=" in line)

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        raise RuntimeError("examplecloud takes no tag writes")

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        raise RuntimeError("examplecloud keeps no metrics")

    def bucket_endpoint(self) -> str:
        return f"https://storage.{self.region}.example.invalid"

    def poweroff(self) -> None:
        system_poweroff()
