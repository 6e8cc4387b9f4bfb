"""Alibaba Cloud's live instance-hour price: ECS DescribePrice (one pay-as-you-go
instance for one hour), through the official ECS SDK with the account's keys.

ALIBABA_CLOUD_ECS_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
The SDK is imported inside the function: nothing else needs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound, Terms

# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "ALI-DESCRIBEPRICE"


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


def live_price(instance_type: str, region: str) -> tuple[float, str]:
    key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID") or os.environ.get("ALICLOUD_ACCESS_KEY")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET") or os.environ.get(
        "ALICLOUD_SECRET_KEY"
    )
    if not key or not secret:
        raise NoCredentials(
            "no Alibaba Cloud credentials: set ALIBABA_CLOUD_ACCESS_KEY_ID and "
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET to compare with DescribePrice"
        )
    from alibabacloud_ecs20140526 import models as ecs_models
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import models as api_models

    # ALIBABA_CLOUD_ECS_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
    endpoint = os.environ.get("ALIBABA_CLOUD_ECS_ENDPOINT") or f"ecs.{region}.aliyuncs.com"
    local = endpoint.startswith(("127.0.0.1", "localhost"))
    client = Client(
        api_models.Config(
            access_key_id=key,
            access_key_secret=secret,
            region_id=region,
            endpoint=endpoint,
            protocol="http" if local else "https",
        )
    )
    request = ecs_models.DescribePriceRequest(
        region_id=region,
        resource_type="instance",
        instance_type=instance_type,
        price_unit="Hour",
        period=1,
    )
    try:
        body = client.describe_price(request).body.to_map()
    except Exception as exc:  # the Tea SDK raises its own hierarchy plus transport errors
        code = getattr(exc, "code", None)
        text = str(getattr(exc, "message", None) or exc).split(" request id:")[0]
        raise LivePriceError(
            f"Alibaba Cloud DescribePrice: {code + ': ' if code else ''}{text}"
        ) from None
    try:
        return parse_alicloud_price(body)
    except LookupError as exc:
        raise PriceNotFound(f"Alibaba Cloud DescribePrice: {exc}") from None


def live_reservations(instance_type: str, region: str) -> tuple[Terms, str]:
    raise LivePriceError("no live reservation price source for alicloud")
