"""Alibaba Cloud as the node sees it: ECS metadata, CloudMonitor, ECS RPC, OSS (registered
as "alicloud")."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpufleet_node import bucket
from gpufleet_node import fleet_names as names
from gpufleet_node.clouds.base import (
    LOG,
    UTC,
    Credentials,
    MetadataNode,
    Metric,
    TagsUnreadable,
    register,
    retry_idempotent,
    system_poweroff,
)


def alicloud_rpc_query(
    params: dict[str, str],
    *,
    access_key_id: str,
    secret: str,
    token: str = "",
    method: str = "POST",
    now: dt.datetime | None = None,
) -> str:
    """Alicloud RPC signature v1 (HMAC-SHA1), as the RPC API reference describes it."""

    when = (now or dt.datetime.now(UTC)).astimezone(UTC)
    full = {
        **params,
        "Format": "JSON",
        "AccessKeyId": access_key_id,
        "SignatureMethod": "HMAC-SHA1",
        "SignatureVersion": "1.0",
        "SignatureNonce": uuid.uuid4().hex,
        "Timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if token:
        full["SecurityToken"] = token

    def enc(value: str) -> str:
        return urllib.parse.quote(value, safe="-_.~")

    canonical = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(full.items()))
    to_sign = f"{method}&{enc('/')}&{enc(canonical)}"
    digest = hmac.new(f"{secret}&".encode(), to_sign.encode(), hashlib.sha1).digest()
    full["Signature"] = base64.b64encode(digest).decode()
    return urllib.parse.urlencode(full)


@register
@dataclass
class AlicloudNode(MetadataNode):
    """ECS: the metadata service in security hardening mode (``X-aliyun-ecs-metadata-token``,
    alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata), the RAM role's STS
    credentials, tags through ListTagResources and the lease through TagResources (ECS RPC
    API), CloudMonitor PutCustomMetric, all signed with RPC signature v1; OSS through its
    S3-compatible endpoint for the bucket; power-off through StopInstance in economical
    mode (:meth:`poweroff`)."""

    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "alicloud"
    joined: ClassVar[int] = 2  # the order messages list the clouds in
    metadata_base = "http://100.100.100.200"
    token_header = "X-aliyun-ecs-metadata-token"
    token_ttl_header = "X-aliyun-ecs-metadata-token-ttl-seconds"
    role_path = "/latest/meta-data/ram/security-credentials/"
    role_fields = ("AccessKeyId", "AccessKeySecret", "SecurityToken")
    spot_path = "/latest/meta-data/instance/spot/termination-time"
    env_keys = (
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        "ALIBABA_CLOUD_SECURITY_TOKEN",
    )

    def _rpc(self, service: str, params: dict[str, str], creds: Credentials) -> bytes:
        """One signed RPC call (a POST form); the answer's body. Raises urllib's errors."""
        host = f"https://{service}.{self.region}.aliyuncs.com"
        url = (self.endpoint_url or host).rstrip("/") + "/"
        body = alicloud_rpc_query(
            params,
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        ).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return bytes(resp.read())

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """Through the ECS API (ListTagResources, signed with the node's RAM role;
        help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-listtagresources).
        Alicloud's metadata service does not offer tags to everyone yet
        (ModifyInstanceMetadataOptions: InstanceMetadataTags is "in invitational preview")."""
        if not instance_id:
            raise TagsUnreadable("no instance id (config or metadata service)")
        found = creds()
        if not found:
            raise TagsUnreadable("no credentials (instance RAM role or environment)")
        tags: dict[str, str] = {}
        token = ""
        for _page in range(5):  # 20 tags per instance at most; bounded anyway
            params = {
                "Action": "ListTagResources",
                "Version": "2014-05-26",
                "RegionId": self.region,
                "ResourceType": "instance",
                "ResourceId.1": instance_id,
            }
            if token:
                params["NextToken"] = token
            try:
                answer = json.loads(self._rpc("ecs", params, found) or b"{}")
            except urllib.error.HTTPError as exc:
                try:
                    detail = json.loads(exc.read() or b"{}").get("Code", "")
                except ValueError:
                    detail = ""
                raise TagsUnreadable(
                    f"ListTagResources: HTTP {exc.code} {detail}".strip()
                ) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise TagsUnreadable(f"ListTagResources: {exc}") from None
            if not isinstance(answer, dict) or "TagResources" not in answer:
                raise TagsUnreadable(f"ListTagResources: unexpected answer {str(answer)[:120]}")
            for item in (answer.get("TagResources") or {}).get("TagResource") or []:
                if item.get("ResourceId") in (None, instance_id) and "TagKey" in item:
                    tags[str(item["TagKey"])] = str(item.get("TagValue") or "")
            token = str(answer.get("NextToken") or "")
            if not token:
                return tags
        raise TagsUnreadable("ListTagResources: more pages than an instance can have tags")

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        params = {
            "Action": "TagResources",
            "Version": "2014-05-26",
            "RegionId": self.region,
            "ResourceType": "instance",
            "ResourceId.1": instance_id,
            "Tag.1.Key": key,
            "Tag.1.Value": value,
        }
        answer = self._rpc("ecs", params, creds)
        try:
            ok = "RequestId" in json.loads(answer or b"{}")
        except ValueError:
            ok = False
        if not ok:  # a proxy's or captive portal's 200 is not a tag written
            raise ValueError(f"TagResources: not an API answer: {answer[:120]!r}")

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        # CloudMonitor keeps custom metrics under acs_customMetric_<account>; the reaper
        # reads them there by name and dimension (infra/clouds/alicloud/reaper.py).
        params = {"Action": "PutCustomMetric", "Version": "2019-01-01", "RegionId": self.region}
        for n, (name, value, _unit) in enumerate(metrics, start=1):
            params.update(
                {
                    f"MetricList.{n}.MetricName": name,
                    f"MetricList.{n}.GroupId": names.CMS_GROUP_ID,
                    f"MetricList.{n}.Dimensions": json.dumps({names.CMS_DIMENSION: instance_id}),
                    f"MetricList.{n}.Type": "0",
                    f"MetricList.{n}.Values": json.dumps({"value": value}),
                }
            )
        answer = json.loads(self._rpc("metrics", params, creds) or b"{}")
        if str(answer.get("Code", "200")) != "200":
            raise RuntimeError(f"PutCustomMetric: {answer.get('Code')} {answer.get('Message')}")

    def bucket_endpoint(self) -> str:
        # OSS's S3-compatible API (alibabacloud.com/help/en/oss/developer-reference/
        # use-amazon-s3-sdks-to-access-oss), on the internal endpoint: traffic stays in the
        # region's network, and it is the one the March 2025 custom-domain rule for new
        # users' public endpoints does not restrict.
        return f"https://s3.oss-{self.region}-internal.aliyuncs.com"

    def stop_instance(self, instance_id: str, creds: Credentials) -> None:
        """ECS StopInstance in economical mode (StoppedMode=StopCharging): billing for
        the vCPUs, memory and GPUs ends, the disks stay. Economical mode applies only to
        a stop through the API: a shutdown from inside the OS stops the instance in the
        account's default mode, standard (still billed) unless the account turned
        economical mode on by default. Parameters as the SDK's StopInstanceRequest names
        them (it takes no RegionId). Raises AlicloudApiError for an error answer."""
        params = {
            "Action": "StopInstance",
            "Version": "2014-05-26",
            "InstanceId": instance_id,
            "StoppedMode": "StopCharging",
            "ForceStop": "false",
        }
        try:
            answer = json.loads(self._rpc("ecs", params, creds) or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                code = str(json.loads(exc.read() or b"{}").get("Code") or "")
            except ValueError:
                code = ""
            raise AlicloudApiError("StopInstance", exc.code, code) from None
        if not isinstance(answer, dict) or "RequestId" not in answer:
            raise ValueError(f"StopInstance: not an API answer: {str(answer)[:120]}")

    def poweroff(self) -> None:
        """Stop this instance through the API in economical mode, with the node's RAM
        role (its policy allows ecs:StopInstance on this instance alone). Throttling,
        5xx and network errors are retried, bounded (:func:`retry_idempotent`); when
        they persist this raises, the instance keeps running idle and the next run tries
        again. When the API refuses (no credentials, RAM denies, a 4xx) it powers off
        from inside the OS instead: the instance stops in the account's default mode,
        which bills the GPUs unless economical mode is on by default, and the reaper
        reports every instance stopped in standard mode until someone starts it and
        stops it in economical mode (docs/clouds/alicloud.md)."""
        instance_id = self.instance_id()
        creds = self.credentials()
        if not instance_id or not creds:
            LOG.error("cannot call StopInstance (no instance id or credentials): OS poweroff")
            system_poweroff()
            return
        try:
            retry_idempotent(
                lambda: self.stop_instance(instance_id, creds),
                sleep=self.sleep,
                transient=lambda exc: isinstance(exc, AlicloudApiError) and exc.transient,
            )
        except AlicloudApiError as exc:
            if exc.transient:
                raise
            LOG.error("%s: refused, so OS poweroff (standard mode: still billed)", exc)
            system_poweroff()


# Throttling and the service's own transient errors (ECS API error codes).
_ALICLOUD_TRANSIENT = ("Throttling", "ServiceUnavailable", "InternalError", "UnknownError")


class AlicloudApiError(RuntimeError):
    """An Alicloud RPC error answer: its HTTP status and ``Code``."""

    def __init__(self, action: str, status: int, code: str) -> None:
        super().__init__(f"{action}: HTTP {status} {code}".strip())
        self.status = status
        self.code = code

    @property
    def transient(self) -> bool:
        return bucket.retryable_status(self.status) or self.code.startswith(_ALICLOUD_TRANSIENT)
