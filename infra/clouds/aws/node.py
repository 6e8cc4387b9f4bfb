"""AWS as the node sees it: EC2 IMDSv2, CloudWatch, CreateTags, S3 (registered as "aws")."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpufleet_node import fleet_names as names
from gpufleet_node.clouds.base import (
    Credentials,
    MetadataNode,
    Metric,
    TagsUnreadable,
    register,
    sigv4_headers,
    system_poweroff,
)


@register
@dataclass
class AwsNode(MetadataNode):
    """EC2: IMDSv2 (``X-aws-ec2-metadata-token``, docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    configuring-instance-metadata-service.html; the stack sets ``http_tokens = "required"``),
    tags from IMDS, CloudWatch PutMetricData and EC2 CreateTags over the query API signed
    with SigV4, S3 for the bucket, and an instance-initiated shutdown that stops."""

    name: ClassVar[str] = "aws"
    joined: ClassVar[int] = 1  # the order messages list the clouds in
    metadata_base = "http://169.254.169.254"
    token_header = "X-aws-ec2-metadata-token"
    token_ttl_header = "X-aws-ec2-metadata-token-ttl-seconds"
    role_path = "/latest/meta-data/iam/security-credentials/"
    role_fields = ("AccessKeyId", "SecretAccessKey", "Token")
    spot_path = "/latest/meta-data/spot/instance-action"
    env_keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """From IMDS, ``/latest/meta-data/tags/instance/`` (the stack enables
        ``instance_metadata_tags``; docs.aws.amazon.com/AWSEC2/latest/UserGuide/
        work-with-tags-in-IMDS.html): no API call, no credentials."""
        del instance_id, creds
        metadata = self.metadata
        try:
            listing = metadata.get("/latest/meta-data/tags/instance")
            if listing is None:
                raise TagsUnreadable(
                    "instance tags are not in the metadata service (is InstanceMetadataTags "
                    "enabled on the instance?)"
                )
            tags: dict[str, str] = {}
            for key in (k.strip() for k in listing.splitlines()):
                if not key:
                    continue
                value = metadata.get("/latest/meta-data/tags/instance/" + urllib.parse.quote(key))
                if value is None:
                    raise TagsUnreadable(f"tag {key!r} listed but not readable")
                tags[key] = value
            return tags
        except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
            raise TagsUnreadable(f"metadata service: {exc}") from None

    def _query(self, service: str, params: dict[str, str], creds: Credentials) -> None:
        host = f"https://{service}.{self.region}.amazonaws.com"
        url = (self.endpoint_url or host).rstrip("/") + "/"
        body = urllib.parse.urlencode(params).encode()
        headers = sigv4_headers(
            method="POST",
            url=url,
            body=body,
            region=self.region,
            service=service,
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        )
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            resp.read()

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        params = {
            "Action": "CreateTags",
            "Version": "2016-11-15",
            "ResourceId.1": instance_id,
            "Tag.1.Key": key,
            "Tag.1.Value": value,
        }
        self._query("ec2", params, creds)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        params = {"Action": "PutMetricData", "Version": "2010-08-01", "Namespace": names.NAMESPACE}
        for n, (name, value, unit) in enumerate(metrics, start=1):
            prefix = f"MetricData.member.{n}"
            params.update(
                {
                    f"{prefix}.MetricName": name,
                    f"{prefix}.Value": repr(value),
                    f"{prefix}.Unit": unit,
                    f"{prefix}.Dimensions.member.1.Name": names.DIMENSION,
                    f"{prefix}.Dimensions.member.1.Value": instance_id,
                }
            )
        self._query("monitoring", params, creds)

    def bucket_endpoint(self) -> str:
        return f"https://s3.{self.region}.amazonaws.com"

    def poweroff(self) -> None:
        system_poweroff()  # the stack sets instance_initiated_shutdown_behavior = "stop"
