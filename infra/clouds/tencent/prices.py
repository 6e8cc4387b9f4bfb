"""Tencent Cloud's live instance-hour price, through tencentcloud-sdk-python (CVM 2017-03-12).

Three signed (TC3-HMAC-SHA256) calls, all read-only:

1. ``DescribeZoneInstanceConfigInfos`` (filters instance-type, instance-charge-type
   POSTPAID_BY_HOUR): the first zone of the region that sells the type now;
2. ``DescribeImages`` (a public Ubuntu image): InquiryPriceRunInstances wants an image id;
3. ``InquiryPriceRunInstances`` for one pay-as-you-go instance there: ``Price.InstancePrice``.

Tencent answers this only with an account's keys (TENCENTCLOUD_SECRET_ID / _SECRET_KEY).
TENCENTCLOUD_CVM_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
The SDK is imported inside the function: nothing else needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound, Terms

# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "TC-INQUIRYPRICE"


def parse_tencent_price(body: Mapping[str, Any]) -> float:
    """The hourly price from InquiryPriceRunInstances' Response (as a map).

    Prefers the discounted unit price (what the account pays), then the list unit price."""
    price = (body.get("Price") or {}).get("InstancePrice") or {}
    unit = str(price.get("ChargeUnit") or "HOUR").upper()
    if unit != "HOUR":
        raise LookupError(f"the answer prices by {unit}, not by the hour")
    for key in ("UnitPriceDiscount", "UnitPrice"):
        value = price.get(key)
        if value is not None and float(value) > 0:
            return float(value)
    raise LookupError("the InquiryPriceRunInstances answer holds no hourly unit price")


def first_selling_zone(body: Mapping[str, Any], instance_type: str) -> str:
    """The first zone (by name) whose quota item for the type is on sale."""
    zones = sorted(
        str(item.get("Zone"))
        for item in body.get("InstanceTypeQuotaSet") or []
        if item.get("InstanceType") == instance_type and item.get("Status") == "SELL"
    )
    if not zones:
        raise LookupError(f"no zone sells {instance_type} pay-as-you-go now")
    return zones[0]


def _credentials() -> tuple[str, str]:
    key = os.environ.get("TENCENTCLOUD_SECRET_ID", "")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if not key or not secret:
        raise NoCredentials(
            "no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and "
            "TENCENTCLOUD_SECRET_KEY to compare with InquiryPriceRunInstances"
        )
    return key, secret


def live_price(instance_type: str, region: str) -> tuple[float, str]:
    """(CNY per hour, "CNY") for one pay-as-you-go instance of the type in the region."""
    key, secret = _credentials()
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
    client = cvm_client.CvmClient(
        credential.Credential(key, secret), region, ClientProfile(httpProfile=http)
    )

    def call(action: str, request: Any) -> dict[str, Any]:
        try:
            answer = getattr(client, action)(request)
        except TencentCloudSDKException as exc:
            raise LivePriceError(
                f"Tencent Cloud {action}: {exc.get_code() or 'error'}: {exc.get_message()}"
            ) from None
        except OSError as exc:  # the transport (refused, reset) below the SDK
            raise LivePriceError(f"Tencent Cloud {action}: {exc}") from None
        doc: dict[str, Any] = json.loads(answer.to_json_string())
        return doc

    zones = models.DescribeZoneInstanceConfigInfosRequest()
    zones.Filters = [
        _filter(models, "instance-type", instance_type),
        _filter(models, "instance-charge-type", "POSTPAID_BY_HOUR"),
    ]
    try:
        zone = first_selling_zone(call("DescribeZoneInstanceConfigInfos", zones), instance_type)
    except LookupError as exc:
        raise PriceNotFound(f"Tencent Cloud DescribeZoneInstanceConfigInfos: {exc}") from None

    images = models.DescribeImagesRequest()
    images.Filters = [
        _filter(models, "image-type", "PUBLIC_IMAGE"),
        _filter(models, "platform", "Ubuntu"),
    ]
    images.Limit = 1
    found = call("DescribeImages", images).get("ImageSet") or []
    if not found:
        raise LivePriceError("Tencent Cloud DescribeImages: no public Ubuntu image to price with")

    inquiry = models.InquiryPriceRunInstancesRequest()
    placement = models.Placement()
    placement.Zone = zone
    inquiry.Placement = placement
    inquiry.ImageId = str(found[0].get("ImageId"))
    inquiry.InstanceType = instance_type
    inquiry.InstanceChargeType = "POSTPAID_BY_HOUR"
    inquiry.InstanceCount = 1
    try:
        return parse_tencent_price(call("InquiryPriceRunInstances", inquiry)), "CNY"
    except LookupError as exc:
        raise PriceNotFound(f"Tencent Cloud InquiryPriceRunInstances: {exc}") from None


def _filter(models: Any, name: str, value: str) -> Any:
    f = models.Filter()
    f.Name, f.Values = name, [value]
    return f


def live_reservations(instance_type: str, region: str) -> tuple[Terms, str]:
    raise LivePriceError("no live reservation price source for tencent")
