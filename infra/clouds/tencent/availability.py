"""Tencent Cloud's availability signal for one instance type, zone by zone (``where.py --live``).

Per region, one signed (TC3-HMAC-SHA256) read-only CVM call through tencentcloud-sdk-python:
``DescribeZoneInstanceConfigInfos`` (filters instance-type, instance-charge-type
POSTPAID_BY_HOUR). Each InstanceTypeQuotaItem has ``Status`` (SDK model: "SELL: 表示实例可购买;
SOLD_OUT: 表示实例已售罄"), ``SoldOutReason`` and, where given, ``StatusCategory``
(EnoughStock, NormalStock, UnderStock, WithoutStock). A zone absent from the answer does not
sell the type at all.

Credentials: TENCENTCLOUD_SECRET_ID / TENCENTCLOUD_SECRET_KEY. TENCENTCLOUD_CVM_ENDPOINT
points the client elsewhere (tests: a local fake on 127.0.0.1). The SDK is imported inside
the function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.availability import AVAILABLE, SOLD_OUT, NoSignal, ZoneSignal

SIGNAL = "CVM DescribeZoneInstanceConfigInfos (Status per zone, pay-as-you-go)"


def parse_quota_set(body: Mapping[str, Any], region: str, instance_type: str) -> list[ZoneSignal]:
    """The zones of one DescribeZoneInstanceConfigInfos answer (its Response) for the type."""
    out = []
    for item in body.get("InstanceTypeQuotaSet") or []:
        if item.get("InstanceType") != instance_type:
            continue
        status = str(item.get("Status", ""))
        words = [w for w in (status, item.get("StatusCategory"), item.get("SoldOutReason")) if w]
        state = AVAILABLE if status == "SELL" else SOLD_OUT
        out.append(ZoneSignal(region, str(item.get("Zone", "")), state, None, ", ".join(words)))
    return sorted(out, key=lambda z: z.zone)


def live_zones(instance_type: str, regions: Sequence[str]) -> list[ZoneSignal]:
    key = os.environ.get("TENCENTCLOUD_SECRET_ID", "")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if not key or not secret:
        raise NoSignal(
            "no Tencent Cloud credentials (set TENCENTCLOUD_SECRET_ID and "
            "TENCENTCLOUD_SECRET_KEY): offline rows only"
        )
    from tencentcloud.common import credential
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
        TencentCloudSDKException,
    )
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile
    from tencentcloud.cvm.v20170312 import cvm_client, models

    endpoint = os.environ.get("TENCENTCLOUD_CVM_ENDPOINT") or "cvm.tencentcloudapi.com"
    local = endpoint.startswith(("127.0.0.1", "localhost"))
    http = HttpProfile(endpoint=endpoint, protocol="http" if local else "https", reqTimeout=20)
    found: list[ZoneSignal] = []
    for region in regions:
        client = cvm_client.CvmClient(
            credential.Credential(key, secret), region, ClientProfile(httpProfile=http)
        )
        request = models.DescribeZoneInstanceConfigInfosRequest()
        request.Filters = []
        for name, value in (
            ("instance-type", instance_type),
            ("instance-charge-type", "POSTPAID_BY_HOUR"),
        ):
            f = models.Filter()
            f.Name, f.Values = name, [value]
            request.Filters.append(f)
        try:
            answer = client.DescribeZoneInstanceConfigInfos(request)
        except TencentCloudSDKException as exc:
            raise NoSignal(
                f"CVM in {region}: {exc.get_code() or 'error'}: {exc.get_message()}"
            ) from None
        except OSError as exc:  # the transport (refused, reset) below the SDK
            raise NoSignal(f"CVM in {region}: {exc}") from None
        found += parse_quota_set(json.loads(answer.to_json_string()), region, instance_type)
    return found
