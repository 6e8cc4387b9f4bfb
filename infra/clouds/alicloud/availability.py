"""Alibaba Cloud's availability signal for one instance type, zone by zone (``where.py --live``).

Per region, one signed read-only ECS call through the official SDK (alibabacloud_ecs20140526):
``DescribeAvailableResource`` (DestinationResource InstanceType, the type, PostPaid,
IoOptimized optimized). Each AvailableZone carries ``Status`` (Available or SoldOut) and
``StatusCategory`` (WithStock, ClosedWithStock, WithoutStock, ClosedWithoutStock), and so does
the type's SupportedResource inside it: the stock status per zone. A zone absent from the
answer does not sell the type.

Credentials: ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET.
ALIBABA_CLOUD_ECS_ENDPOINT points the client elsewhere (tests: a local fake on 127.0.0.1).
The SDK is imported inside the function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.alicloud.prices import ecs_client
from infra.clouds.availability import AVAILABLE, SOLD_OUT, NoSignal, ZoneSignal

SIGNAL = "ECS DescribeAvailableResource (stock status per zone, pay-as-you-go)"
NO_STOCK = ("SoldOut", "WithoutStock", "ClosedWithoutStock")


def parse_available_resource(
    body: Mapping[str, Any], region: str, instance_type: str
) -> list[ZoneSignal]:
    """The zones of one DescribeAvailableResource answer (as a map) that list the type."""
    out = []
    for zone in (body.get("AvailableZones") or {}).get("AvailableZone") or []:
        for resource in (zone.get("AvailableResources") or {}).get("AvailableResource") or []:
            if resource.get("Type") != "InstanceType":
                continue
            supported = (resource.get("SupportedResources") or {}).get("SupportedResource") or []
            for item in supported:
                if item.get("Value") != instance_type:
                    continue
                words = [
                    str(w)
                    for w in (item.get("Status"), item.get("StatusCategory"))
                    if w is not None
                ]
                gone = any(w in NO_STOCK for w in words) or zone.get("Status") == "SoldOut"
                out.append(
                    ZoneSignal(
                        region,
                        str(zone.get("ZoneId", "")),
                        SOLD_OUT if gone else AVAILABLE,
                        None,
                        ", ".join(words),
                    )
                )
    return sorted(out, key=lambda z: z.zone)


def live_zones(instance_type: str, regions: Sequence[str]) -> list[ZoneSignal]:
    key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", "")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "")
    if not key or not secret:
        raise NoSignal(
            "no Alibaba Cloud credentials (set ALIBABA_CLOUD_ACCESS_KEY_ID and "
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET): offline rows only"
        )
    from alibabacloud_ecs20140526 import models as ecs_models

    found: list[ZoneSignal] = []
    for region in regions:
        client = ecs_client(region, key, secret, connect_timeout_ms=10_000)
        request = ecs_models.DescribeAvailableResourceRequest(
            region_id=region,
            destination_resource="InstanceType",
            instance_type=instance_type,
            instance_charge_type="PostPaid",
            io_optimized="optimized",
        )
        try:
            body = client.describe_available_resource(request).body.to_map()
        except Exception as exc:  # the Tea SDK raises its own hierarchy plus transport errors
            code = getattr(exc, "code", None)
            text = str(getattr(exc, "message", None) or exc).split(" request id:")[0]
            first = text.splitlines()[0] if text else type(exc).__name__
            raise NoSignal(f"ECS in {region}: {code + ': ' if code else ''}{first}") from None
        found += parse_available_resource(body, region, instance_type)
    return found
