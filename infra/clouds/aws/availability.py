"""AWS's availability signal for one instance type, zone by zone (``where.py --live``).

Per region, two read-only EC2 calls through boto3 with the account's credentials:

1. ``DescribeInstanceTypeOfferings`` (LocationType ``availability-zone``, filter
   ``instance-type``): the zones that offer the type to this account. EC2 gives no stock
   signal here: a zone listed may still answer InsufficientInstanceCapacity at launch.
2. ``DescribeSpotPriceHistory`` (the type, ``Linux/UNIX``, from now): the latest spot price
   in each zone.

``GetSpotPlacementScores`` (a 1-10 likelihood of getting spot capacity per region or zone) is
not asked: moto 5.2.5, the only EC2 these tests can reach, does not implement it, so no test
could prove the call. AWS_ENDPOINT_URL_EC2 points the client elsewhere (tests: moto on
127.0.0.1). The SDK is imported inside the function.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from infra.clouds.availability import OFFERED, NoSignal, ZoneSignal

SIGNAL = "EC2 DescribeInstanceTypeOfferings by zone, DescribeSpotPriceHistory per zone"
MAX_PAGES = 20  # a region lists a type in at most a handful of zones: a bound, not a limit


def _pages(call: Any, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        page = call(**kwargs)
        items.extend(page.get(key, []))
        token = page.get("NextToken")
        if not token:
            return items
        kwargs["NextToken"] = token
    return items


def latest_spot(history: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Zone -> the newest spot price in a DescribeSpotPriceHistory answer."""
    newest: dict[str, tuple[Any, float]] = {}
    for h in history:
        zone, when = h.get("AvailabilityZone", ""), h.get("Timestamp")
        if zone and (zone not in newest or str(when) > str(newest[zone][0])):
            newest[zone] = (when, float(h["SpotPrice"]))
    return {zone: price for zone, (_, price) in newest.items()}


def live_zones(instance_type: str, regions: Sequence[str]) -> list[ZoneSignal]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise NoSignal(
            "no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY): "
            "offline rows only"
        )
    found: list[ZoneSignal] = []
    for region in regions:
        ec2 = session.client("ec2", region_name=region)
        try:
            offered = _pages(
                ec2.describe_instance_type_offerings,
                "InstanceTypeOfferings",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}],
            )
            history = _pages(
                ec2.describe_spot_price_history,
                "SpotPriceHistory",
                InstanceTypes=[instance_type],
                ProductDescriptions=["Linux/UNIX"],
                StartTime=dt.datetime.now(dt.UTC),
            )
        except (BotoCoreError, ClientError) as exc:
            raise NoSignal(f"EC2 in {region}: {str(exc).splitlines()[0]}") from None
        spot = latest_spot(history)
        for o in sorted(offered, key=lambda o: str(o.get("Location"))):
            zone = str(o["Location"])
            found.append(
                ZoneSignal(region, zone, OFFERED, spot.get(zone), "in the type's offerings")
            )
    return found
