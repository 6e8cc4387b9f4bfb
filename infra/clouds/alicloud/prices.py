"""Alibaba Cloud's live instance prices, through the official ECS SDK with the account's keys
(alibabacloud_ecs20140526 7.11.8, the models read in .venv 2026-12-05):

- the hour, pay-as-you-go: DescribePrice (one instance for one hour, PriceUnit Hour);
- the month, subscription (:func:`live_monthly`): the same DescribePrice with PriceUnit
  Month and Period 1 (models/_describe_price_request.py: ``price_unit`` "Month", ``period``);
- spot (:func:`live_spot`): DescribeSpotPriceHistory in the region with NetworkType vpc and
  OSType linux (models/_describe_spot_price_history_request.py: InstanceType, NetworkType
  and RegionId required, ZoneId left out so every zone answers, StartTime empty = 3 hours
  before now, Offset); its body (models/_describe_spot_price_history_response_body.py)
  holds Currency, NextOffset and SpotPrices.SpotPriceType[] rows of InstanceType,
  NetworkType, ZoneId, SpotPrice, OriginPrice, Timestamp. Each zone's latest SpotPrice
  counts: the range is the lowest and highest zone. Alibaba's own page of the action (its
  Chinese API reference as mirrored in SkyeYXL/ecs, cn.zh-CN/API参考/实例/
  DescribeSpotPriceHistory.md, read 2026-12-05) answers rows of one zone per hour.

Every call is tried at most MAX_TRIES times: again only after a throttled answer
(Throttling.*) or the service's own transient error (ServiceUnavailable, InternalError, an
HTTP 5xx), after 0.5 s then 1 s; a refused connection is said at once.
ALIBABA_CLOUD_ECS_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
The SDK is imported inside the functions: nothing else needs it.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound, Terms

# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "ALI-DESCRIBEPRICE"
SPOT_SOURCE = "ALI-SPOTHISTORY"
MONTHLY_SOURCE = "ALI-DESCRIBEPRICE-MONTH"
# The catalog has no observed spot range for Alibaba yet: a refresh gives a line its first.
SPOT_ADDS_RANGES = True
MAX_TRIES = 3  # per call: a throttled or 5xx answer is asked again, twice at most
MAX_PAGES = 20  # DescribeSpotPriceHistory's Offset pages: one type's 3 hours is a few rows
_TRANSIENT = ("Throttling", "ServiceUnavailable", "InternalError", "UnknownError")


def parse_alicloud_price(body: Mapping[str, Any]) -> tuple[float, str]:
    """Instance-hour price and currency from DescribePrice's response body (as a map).

    Prefers the instanceType detail line (the total also carries the system disk)."""
    info = body.get("PriceInfo", {}).get("Price", {})
    currency = str(info.get("Currency", "CNY"))
    details = info.get("DetailInfos", {}).get("DetailInfo", []) or []
    for d in details:
        if str(d.get("Resource", "")).lower() == "instancetype":
            value = d.get("TradePrice", d.get("OriginalPrice"))
            if value is not None:
                return float(value), currency
    for key in ("TradePrice", "OriginalPrice"):
        if info.get(key) is not None:
            return float(info[key]), currency
    raise LookupError("the DescribePrice answer holds no price")


def _keys(what: str) -> tuple[str, str]:
    key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID") or os.environ.get("ALICLOUD_ACCESS_KEY")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET") or os.environ.get(
        "ALICLOUD_SECRET_KEY"
    )
    if not key or not secret:
        raise NoCredentials(
            "no Alibaba Cloud credentials: set ALIBABA_CLOUD_ACCESS_KEY_ID and "
            f"ALIBABA_CLOUD_ACCESS_KEY_SECRET to {what}"
        )
    return key, secret


def _client(region: str, what: str) -> Any:
    key, secret = _keys(what)
    return ecs_client(region, key, secret)


def ecs_client(region: str, key: str, secret: str, connect_timeout_ms: int = 5_000) -> Any:
    """The ECS SDK client for ``region`` (read timeout 20 s)."""
    from alibabacloud_ecs20140526.client import Client

    # ALIBABA_CLOUD_ECS_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
    endpoint = os.environ.get("ALIBABA_CLOUD_ECS_ENDPOINT") or f"ecs.{region}.aliyuncs.com"
    return Client(tea_config(key, secret, region, endpoint, connect_timeout_ms))


def tea_config(
    key: str, secret: str, region: str, endpoint: str, connect_timeout_ms: int = 5_000
) -> Any:
    """The Tea SDK's client settings: plain HTTP to a local endpoint (tests), read timeout 20 s."""
    from alibabacloud_tea_openapi import models as api_models

    local = endpoint.startswith(("127.0.0.1", "localhost"))
    return api_models.Config(
        access_key_id=key,
        access_key_secret=secret,
        region_id=region,
        endpoint=endpoint,
        protocol="http" if local else "https",
        read_timeout=20_000,
        connect_timeout=connect_timeout_ms,
    )


def transient(exc: BaseException) -> bool:
    """A throttled answer or the service's own passing failure: worth asking again."""
    status = getattr(exc, "status_code", None) or getattr(exc, "statusCode", None)
    if isinstance(status, int) and status >= 500:
        return True
    return str(getattr(exc, "code", "") or "").startswith(_TRANSIENT)


def call(
    action: str, send: Callable[[], Any], sleep: Callable[[float], None] = time.sleep
) -> dict[str, Any]:
    """``send()``'s answer body as a map, tried at most MAX_TRIES times (again only when
    :func:`transient`); any failure as one LivePriceError line naming the action."""
    for attempt in range(1, MAX_TRIES + 1):
        try:
            body: dict[str, Any] = send().body.to_map()
            return body
        except Exception as exc:  # the Tea SDK raises its own hierarchy plus transport errors
            if attempt < MAX_TRIES and transient(exc):
                sleep(0.5 * 2 ** (attempt - 1))
                continue
            code = getattr(exc, "code", None)
            text = str(getattr(exc, "message", None) or exc).split(" request id:")[0]
            text = re.sub(r"^code: \d+, ", "", text)  # the SDK's prefix: the code says it
            tries = f" (after {attempt} tries)" if attempt > 1 else ""
            raise LivePriceError(
                f"Alibaba Cloud {action}: {code + ': ' if code else ''}{text}{tries}"
            ) from None
    raise AssertionError("unreachable")


def _describe_price(
    instance_type: str, region: str, unit: str, what: str, label: str
) -> tuple[float, str]:
    """(price of one unit, currency): DescribePrice for one Hour or one Month of the type."""
    from alibabacloud_ecs20140526 import models as ecs_models

    client = _client(region, what)
    request = ecs_models.DescribePriceRequest(
        region_id=region,
        resource_type="instance",
        instance_type=instance_type,
        price_unit=unit,
        period=1,
    )
    body = call("DescribePrice", lambda: client.describe_price(request))
    try:
        return parse_alicloud_price(body)
    except LookupError as exc:
        raise PriceNotFound(f"Alibaba Cloud {label}: {exc}") from None


def live_price(instance_type: str, region: str) -> tuple[float, str]:
    return _describe_price(
        instance_type, region, "Hour", "compare with DescribePrice", "DescribePrice"
    )


def live_monthly(instance_type: str, region: str) -> tuple[float, str]:
    """(price of one month, currency): DescribePrice for a subscription of one month."""
    return _describe_price(
        instance_type,
        region,
        "Month",
        "read monthly prices with DescribePrice",
        "DescribePrice (a month)",
    )


def latest_per_zone(rows: list[Mapping[str, Any]], instance_type: str) -> dict[str, float]:
    """Each zone's latest SpotPrice among DescribeSpotPriceHistory's SpotPriceType rows of
    the type on a VPC (a row without a positive price does not count)."""
    latest: dict[str, tuple[str, float]] = {}
    for row in rows:
        if row.get("InstanceType", instance_type) != instance_type:
            continue
        if str(row.get("NetworkType", "vpc")).lower() != "vpc":
            continue
        zone, when = str(row.get("ZoneId", "")), str(row.get("Timestamp", ""))
        price = float(row.get("SpotPrice") or 0)
        if zone and price > 0 and (zone not in latest or when > latest[zone][0]):
            latest[zone] = (when, price)
    return {zone: price for zone, (_, price) in latest.items()}


def live_spot(instance_type: str, region: str) -> tuple[float, float, str]:
    """(lowest, highest, currency) of the current Linux VPC spot price per hour over the
    region's zones; PriceNotFound when no zone answers one."""
    from alibabacloud_ecs20140526 import models as ecs_models

    client = _client(region, "read the spot price history")
    rows: list[Mapping[str, Any]] = []
    currency, offset = "CNY", 0
    for _ in range(MAX_PAGES):
        request = ecs_models.DescribeSpotPriceHistoryRequest(
            region_id=region,
            instance_type=instance_type,
            network_type="vpc",
            ostype="linux",
            offset=offset or None,
        )
        send = functools.partial(client.describe_spot_price_history, request)
        body = call("DescribeSpotPriceHistory", send)
        currency = str(body.get("Currency") or currency)
        page = (body.get("SpotPrices") or {}).get("SpotPriceType") or []
        rows.extend(page)
        following = int(body.get("NextOffset") or 0)
        if not page or following <= offset:
            break
        offset = following
    else:
        raise LivePriceError(f"Alibaba Cloud DescribeSpotPriceHistory: more than {MAX_PAGES} pages")
    zones = latest_per_zone(rows, instance_type)
    if not zones:
        raise PriceNotFound(
            f"Alibaba Cloud DescribeSpotPriceHistory: no Linux VPC spot price for "
            f"{instance_type} in {region}"
        )
    return min(zones.values()), max(zones.values()), currency


def live_reservations(instance_type: str, region: str) -> tuple[Terms, str]:
    raise LivePriceError("no live reservation price source for alicloud")
