"""Tencent Cloud's live instance prices, through tencentcloud-sdk-python (CVM 2017-03-12).

Signed (TC3-HMAC-SHA256) calls, all read-only:

1. ``DescribeZoneInstanceConfigInfos`` (filters instance-type, instance-charge-type): the
   zones of the region that sell the type now, for that way of paying;
2. ``DescribeImages`` (a public Ubuntu image): InquiryPriceRunInstances wants an image id;
3. ``InquiryPriceRunInstances`` for one instance there: ``Price.InstancePrice``.

The hour (:func:`live_price`): POSTPAID_BY_HOUR in the first selling zone, ``UnitPriceDiscount``
per ``ChargeUnit`` HOUR. Spot (:func:`live_spot`): InstanceChargeType SPOTPAID with
InstanceMarketOptions (MarketType "spot", SpotOptions.SpotInstanceType "one-time", no
MaxPrice: the market's price is asked, not a bid) in every zone that sells the type as
SPOTPAID (at most MAX_ZONES), the range the lowest and highest zone. The month
(:func:`live_monthly`): PREPAID with InstanceChargePrepaid.Period 1 in the first zone selling
it PREPAID, ``DiscountPrice`` (what the account pays for the month) else ``OriginalPrice``.
Shapes: the installed tencentcloud-sdk-python-cvm 3.1.178, tencentcloud/cvm/v20170312/
models.py (InquiryPriceRunInstancesRequest, InstanceMarketOptionsRequest, SpotMarketOptions,
InstanceChargePrepaid, Price, ItemPrice), read 2026-12-05.

Every call is tried at most MAX_TRIES times: again only after RequestLimitExceeded or the
service's InternalError / ServerNetworkError, after 0.5 s then 1 s; a refused connection is
said at once. Tencent answers this only with an account's keys (TENCENTCLOUD_SECRET_ID /
_SECRET_KEY). TENCENTCLOUD_CVM_ENDPOINT points the client elsewhere (tests: a local fake on
127.0.0.1). The SDK is imported inside the functions: nothing else needs it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound, Terms

# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "TC-INQUIRYPRICE"
SPOT_SOURCE = "TC-INQUIRYPRICE-SPOT"
MONTHLY_SOURCE = "TC-INQUIRYPRICE-PREPAID"
# The catalog has no observed spot range for Tencent yet: a refresh gives a line its first.
SPOT_ADDS_RANGES = True
MAX_TRIES = 3  # per call: a throttled answer is asked again, twice at most
MAX_ZONES = 10  # spot is asked zone by zone: a region has a handful
_TRANSIENT = ("RequestLimitExceeded", "InternalError", "ServerNetworkError")


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


def parse_tencent_month(body: Mapping[str, Any]) -> float:
    """The price of one month from a PREPAID InquiryPriceRunInstances' Response (as a map):
    the discounted price (what the account pays), then the list price."""
    price = (body.get("Price") or {}).get("InstancePrice") or {}
    for key in ("DiscountPrice", "OriginalPrice"):
        value = price.get(key)
        if value is not None and float(value) > 0:
            return float(value)
    raise LookupError("the InquiryPriceRunInstances answer holds no monthly price")


def selling_zones(
    body: Mapping[str, Any], instance_type: str, charge: str = "POSTPAID_BY_HOUR"
) -> list[str]:
    """The zones (by name) whose quota item for the type is on sale, paid that way (an item
    without InstanceChargeType, null in the SDK's JSON, counts: the request's filter chose
    it)."""
    return sorted(
        {
            str(item.get("Zone"))
            for item in body.get("InstanceTypeQuotaSet") or []
            if item.get("InstanceType") == instance_type
            and item.get("Status") == "SELL"
            and (item.get("InstanceChargeType") or charge) == charge
        }
    )


def first_selling_zone(
    body: Mapping[str, Any], instance_type: str, charge: str = "POSTPAID_BY_HOUR"
) -> str:
    """The first zone (by name) whose quota item for the type is on sale."""
    zones = selling_zones(body, instance_type, charge)
    if not zones:
        how = {"POSTPAID_BY_HOUR": "pay-as-you-go", "SPOTPAID": "as spot"}.get(charge, charge)
        raise LookupError(f"no zone sells {instance_type} {how} now")
    return zones[0]


def _credentials(what: str = "compare with InquiryPriceRunInstances") -> tuple[str, str]:
    key = os.environ.get("TENCENTCLOUD_SECRET_ID", "")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    if not key or not secret:
        raise NoCredentials(
            "no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and "
            f"TENCENTCLOUD_SECRET_KEY to {what}"
        )
    return key, secret


class _Cvm:
    """The CVM client of one region, each action tried at most MAX_TRIES times."""

    def __init__(self, region: str, what: str, sleep: Callable[[float], None] = time.sleep):
        key, secret = _credentials(what)
        from tencentcloud.common import credential
        from tencentcloud.common.profile.client_profile import ClientProfile
        from tencentcloud.common.profile.http_profile import HttpProfile
        from tencentcloud.cvm.v20170312 import cvm_client, models

        endpoint = os.environ.get("TENCENTCLOUD_CVM_ENDPOINT") or "cvm.tencentcloudapi.com"
        local = endpoint.startswith(("127.0.0.1", "localhost"))
        http = HttpProfile(endpoint=endpoint, protocol="http" if local else "https", reqTimeout=20)
        self.client = cvm_client.CvmClient(
            credential.Credential(key, secret), region, ClientProfile(httpProfile=http)
        )
        self.models = models
        self.sleep = sleep

    def call(self, action: str, request: Any) -> dict[str, Any]:
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
            TencentCloudSDKException,
        )

        for attempt in range(1, MAX_TRIES + 1):
            try:
                answer = getattr(self.client, action)(request)
            except TencentCloudSDKException as exc:
                code = str(exc.get_code() or "")
                if attempt < MAX_TRIES and code.startswith(_TRANSIENT):
                    self.sleep(0.5 * 2 ** (attempt - 1))
                    continue
                tries = f" (after {attempt} tries)" if attempt > 1 else ""
                raise LivePriceError(
                    f"Tencent Cloud {action}: {code or 'error'}: {exc.get_message()}{tries}"
                ) from None
            except OSError as exc:  # the transport (refused, reset) below the SDK
                raise LivePriceError(f"Tencent Cloud {action}: {exc}") from None
            doc: dict[str, Any] = json.loads(answer.to_json_string())
            return doc
        raise AssertionError("unreachable")

    def zones(self, instance_type: str, charge: str) -> dict[str, Any]:
        request = self.models.DescribeZoneInstanceConfigInfosRequest()
        request.Filters = [
            _filter(self.models, "instance-type", instance_type),
            _filter(self.models, "instance-charge-type", charge),
        ]
        return self.call("DescribeZoneInstanceConfigInfos", request)

    def image(self) -> str:
        images = self.models.DescribeImagesRequest()
        images.Filters = [
            _filter(self.models, "image-type", "PUBLIC_IMAGE"),
            _filter(self.models, "platform", "Ubuntu"),
        ]
        images.Limit = 1
        found = self.call("DescribeImages", images).get("ImageSet") or []
        if not found:
            raise LivePriceError(
                "Tencent Cloud DescribeImages: no public Ubuntu image to price with"
            )
        return str(found[0].get("ImageId"))

    def inquiry(self, instance_type: str, zone: str, image: str, charge: str) -> Any:
        inquiry = self.models.InquiryPriceRunInstancesRequest()
        placement = self.models.Placement()
        placement.Zone = zone
        inquiry.Placement = placement
        inquiry.ImageId = image
        inquiry.InstanceType = instance_type
        inquiry.InstanceChargeType = charge
        inquiry.InstanceCount = 1
        return inquiry


def _first_zone(cvm: _Cvm, instance_type: str, charge: str) -> str:
    try:
        return first_selling_zone(cvm.zones(instance_type, charge), instance_type, charge)
    except LookupError as exc:
        raise PriceNotFound(f"Tencent Cloud DescribeZoneInstanceConfigInfos: {exc}") from None


def live_price(instance_type: str, region: str) -> tuple[float, str]:
    """(CNY per hour, "CNY") for one pay-as-you-go instance of the type in the region."""
    cvm = _Cvm(region, "compare with InquiryPriceRunInstances")
    zone = _first_zone(cvm, instance_type, "POSTPAID_BY_HOUR")
    inquiry = cvm.inquiry(instance_type, zone, cvm.image(), "POSTPAID_BY_HOUR")
    try:
        return parse_tencent_price(cvm.call("InquiryPriceRunInstances", inquiry)), "CNY"
    except LookupError as exc:
        raise PriceNotFound(f"Tencent Cloud InquiryPriceRunInstances: {exc}") from None


def live_spot(instance_type: str, region: str) -> tuple[float, float, str]:
    """(lowest, highest, "CNY") of the spot price per hour over the zones selling the type
    as SPOTPAID now (each asked with InstanceMarketOptions MarketType spot)."""
    cvm = _Cvm(region, "read spot prices with InquiryPriceRunInstances")
    zones = selling_zones(cvm.zones(instance_type, "SPOTPAID"), instance_type, "SPOTPAID")
    if not zones:
        raise PriceNotFound(
            f"Tencent Cloud DescribeZoneInstanceConfigInfos: no zone sells {instance_type} "
            "as spot now"
        )
    image = cvm.image()
    prices: list[float] = []
    for zone in zones[:MAX_ZONES]:
        inquiry = cvm.inquiry(instance_type, zone, image, "SPOTPAID")
        market = cvm.models.InstanceMarketOptionsRequest()
        market.MarketType = "spot"
        market.SpotOptions = cvm.models.SpotMarketOptions()
        market.SpotOptions.SpotInstanceType = "one-time"
        inquiry.InstanceMarketOptions = market
        try:
            prices.append(parse_tencent_price(cvm.call("InquiryPriceRunInstances", inquiry)))
        except LookupError as exc:
            raise PriceNotFound(f"Tencent Cloud InquiryPriceRunInstances (spot): {exc}") from None
    return min(prices), max(prices), "CNY"


def live_monthly(instance_type: str, region: str) -> tuple[float, str]:
    """(CNY for one month, "CNY"): a PREPAID instance of one month in the first zone selling
    the type that way."""
    cvm = _Cvm(region, "read monthly prices with InquiryPriceRunInstances")
    zone = _first_zone(cvm, instance_type, "PREPAID")
    inquiry = cvm.inquiry(instance_type, zone, cvm.image(), "PREPAID")
    prepaid = cvm.models.InstanceChargePrepaid()
    prepaid.Period = 1
    inquiry.InstanceChargePrepaid = prepaid
    try:
        return parse_tencent_month(cvm.call("InquiryPriceRunInstances", inquiry)), "CNY"
    except LookupError as exc:
        raise PriceNotFound(f"Tencent Cloud InquiryPriceRunInstances (a month): {exc}") from None


def _filter(models: Any, name: str, value: str) -> Any:
    f = models.Filter()
    f.Name, f.Values = name, [value]
    return f


def live_reservations(instance_type: str, region: str) -> tuple[Terms, str]:
    raise LivePriceError("no live reservation price source for tencent")
