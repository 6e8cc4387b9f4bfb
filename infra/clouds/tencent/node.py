"""Tencent Cloud as the node sees it: CVM metadata, the TC3 signer, CVM and tag APIs, COS
(registered as "tencent")."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet_node.clouds.base import (
    UTC,
    Credentials,
    MetadataNode,
    Metric,
    TagsUnreadable,
    register,
    retry_idempotent,
)


def tc3_headers(
    *,
    service: str,
    host: str,
    action: str,
    version: str,
    region: str,
    payload: bytes,
    secret_id: str,
    secret_key: str,
    token: str = "",
    timestamp: int | None = None,
) -> dict[str, str]:
    """Tencent Cloud API 3.0 headers for a JSON POST to ``/``, signed TC3-HMAC-SHA256 as the
    "Signature v3" steps describe (cloud.tencent.com/document/api/213/30654): canonical
    request over content-type and host, string to sign with the UTC date's credential scope,
    the key derived TC3+secret -> date -> service -> "tc3_request"."""
    stamp = int(time.time()) if timestamp is None else timestamp
    date = dt.datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d")
    content_type = "application/json"
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            f"content-type:{content_type}\nhost:{host}\n",
            "content-type;host",
            hashlib.sha256(payload).hexdigest(),
        ]
    )
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(
        ["TC3-HMAC-SHA256", str(stamp), scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )

    def mac(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = mac(mac(mac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers = {
        "Authorization": (
            f"TC3-HMAC-SHA256 Credential={secret_id}/{scope}, "
            f"SignedHeaders=content-type;host, Signature={signature}"
        ),
        "Content-Type": content_type,
        "Host": host,
        "X-TC-Action": action,
        "X-TC-Version": version,
        "X-TC-Timestamp": str(stamp),
        "X-TC-Region": region,
    }
    if token:
        headers["X-TC-Token"] = token
    return headers


_TENCENT_RETRYABLE = ("RequestLimitExceeded", "InternalError", "ResourceUnavailable")


class TencentApiError(RuntimeError):
    """A Tencent Cloud API answer with ``Response.Error`` (HTTP 200, as the API answers)."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action}: {code}: {message}"[:300])
        self.code = code


@register
@dataclass
class TencentNode(MetadataNode):
    """CVM: the metadata service (metadata.tencentyun.com, cloud.tencent.com/document/
    product/213/4934) for the instance id and the CAM role's temporary keys
    (``cam/security-credentials/<role>``: TmpSecretId, TmpSecretKey, Token), the spot
    reclaim notice at ``/latest/meta-data/spot/termination-time`` (404 while there is none;
    tencentcloud.com/document/product/213/32487), its tags through CVM DescribeInstances and
    the lease through the Tag API's TagResources (account uin from STS GetCallerIdentity),
    every call TC3-HMAC-SHA256 signed (:func:`tc3_headers`); COS through its S3-compatible
    API for the bucket; power-off through StopInstances with STOP_CHARGING.

    No custom metrics: Cloud Monitor's report action (PutMonitorData) is disused
    (tencentcloud.com/document/api/248/35974). The heartbeat is an object in the stack's
    bucket (:class:`BucketHeartbeat`), and the GPU utilization the reaper reads is the
    monitoring agent's own (QCE/CVM Gpuutil; `fab setup` installs the agent), see
    infra/clouds/tencent/reaper.py.
    """

    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "tencent"
    joined: ClassVar[int] = 3  # the order messages list the clouds in
    publishes_metrics: ClassVar[bool] = False
    heartbeat_in_bucket: ClassVar[bool] = True
    metadata_base = "http://metadata.tencentyun.com"  # plain GETs: no session token
    role_path = "/latest/meta-data/cam/security-credentials/"
    role_fields = ("TmpSecretId", "TmpSecretKey", "Token")
    spot_path = "/latest/meta-data/spot/termination-time"
    # The notice's text: the repossession time, "2018-08-18 12:05:33", on the instance's
    # own clock in UTC+8 (tencentcloud.com/document/product/213/32487, read 2026-12-01).
    spot_time_format: ClassVar[str] = "%Y-%m-%d %H:%M:%S"
    spot_zone: ClassVar[dt.timezone] = dt.timezone(dt.timedelta(hours=8))
    env_keys = ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN")

    def spot_deadline(self, notice: str) -> dt.datetime | None:
        """When the instance is repossessed, from the notice; None when it is no such time
        (the watchdog then takes its fixed budget)."""
        try:
            when = dt.datetime.strptime(notice.strip(), self.spot_time_format)
        except ValueError:
            return None
        return when.replace(tzinfo=self.spot_zone).astimezone(UTC)

    def api(
        self, service: str, action: str, version: str, params: dict[str, Any], creds: Credentials
    ) -> dict[str, Any]:
        """One signed API 3.0 call; its ``Response`` object. Raises urllib's errors for the
        network and HTTP, TencentApiError for an error answer, ValueError for a non-API one."""
        host = f"{service}.tencentcloudapi.com"
        url = "https://" + host + "/"
        if self.endpoint_url:
            url = self.endpoint_url.rstrip("/") + "/"
            host = urllib.parse.urlsplit(url).netloc
        body = json.dumps(params).encode()
        headers = tc3_headers(
            service=service,
            host=host,
            action=action,
            version=version,
            region=self.region,
            payload=body,
            secret_id=creds["access_key_id"],
            secret_key=creds["secret"],
            token=creds.get("token", ""),
        )
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            raw = resp.read()
        answer = json.loads(raw or b"{}")
        response = answer.get("Response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or "RequestId" not in response:
            raise ValueError(f"{action}: not an API answer: {raw[:120]!r}")
        error = response.get("Error")
        if isinstance(error, dict):
            raise TencentApiError(action, str(error.get("Code")), str(error.get("Message")))
        return response

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """Through CVM DescribeInstances for this one instance (its ``Tags``); the metadata
        service does not list tags."""
        if not instance_id:
            raise TagsUnreadable("no instance id (config or metadata service)")
        found = creds()
        if not found:
            raise TagsUnreadable("no credentials (instance CAM role or environment)")
        params = {"InstanceIds": [instance_id], "Limit": 1}
        try:
            answer = self.api("cvm", "DescribeInstances", "2017-03-12", params, found)
        except urllib.error.HTTPError as exc:
            raise TagsUnreadable(f"DescribeInstances: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError, TencentApiError) as exc:
            raise TagsUnreadable(f"DescribeInstances: {exc}") from None
        listed = answer.get("InstanceSet")
        if not isinstance(listed, list) or len(listed) != 1:
            raise TagsUnreadable(f"DescribeInstances: {instance_id} not in the answer")
        raw = listed[0].get("Tags") if isinstance(listed[0], dict) else None
        if raw is None:
            return {}
        if not isinstance(raw, list):
            raise TagsUnreadable("DescribeInstances: Tags is not a list")
        return {
            str(t["Key"]): str(t.get("Value") or "")
            for t in raw
            if isinstance(t, dict) and isinstance(t.get("Key"), str)
        }

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        who = self.api("sts", "GetCallerIdentity", "2018-08-13", {}, creds)
        uin = str(who.get("AccountId") or "")
        if not uin.isdigit():
            raise ValueError(f"GetCallerIdentity: no account uin in {str(who)[:120]}")
        resource = f"qcs::cvm:{self.region}:uin/{uin}:instance/{instance_id}"
        params = {"ResourceList": [resource], "Tags": [{"TagKey": key, "TagValue": value}]}
        self.api("tag", "TagResources", "2018-08-13", params, creds)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        raise RuntimeError(
            "Tencent Cloud Monitor has no custom-metric report action (PutMonitorData is "
            "disused): the heartbeat is an object in the bucket (BucketHeartbeat)"
        )

    def bucket_endpoint(self) -> str:
        # COS's S3-compatible API (cloud.tencent.com/document/product/436/37421), SigV4 with
        # the region as the signing region; from a CVM in the same region the request stays
        # on Tencent's internal network.
        return f"https://cos.{self.region}.myqcloud.com"

    def poweroff(self) -> None:
        """StopInstances with STOP_CHARGING: a shutdown from inside the OS would leave the
        charging mode to the account's default. Raises when the stop is not accepted (the
        next run tries again); never falls back to a stop that keeps charging."""
        instance_id = self.instance_id()
        creds = self.credentials()
        if not instance_id or not creds:
            raise RuntimeError("cannot stop: no instance id or no credentials")
        params = {
            "InstanceIds": [instance_id],
            "StopType": "SOFT_FIRST",
            "StoppedMode": "STOP_CHARGING",
        }

        def stop() -> None:
            self.api("cvm", "StopInstances", "2017-03-12", params, creds)

        # Bounded; throttling, 5xx and the API's own transient error codes are retried.
        retry_idempotent(
            stop,
            sleep=self.sleep,
            transient=lambda exc: (
                isinstance(exc, TencentApiError) and exc.code.startswith(_TENCENT_RETRYABLE)
            ),
        )
