"""AWS's availability signal for one instance type, zone by zone (``where.py --live``).

Per region, two read-only EC2 calls through boto3 with the account's credentials:

1. ``DescribeInstanceTypeOfferings`` (LocationType ``availability-zone``, filter
   ``instance-type``): the zones that offer the type to this account. EC2 gives no stock
   signal here: a zone listed may still answer InsufficientInstanceCapacity at launch.
2. ``DescribeSpotPriceHistory`` (the type, ``Linux/UNIX``, from now): the latest spot price
   in each zone.

Once for all the regions asked, ``GetSpotPlacementScores`` (one spot instance of the type,
per region): a 1-10 likelihood that a spot request succeeds there now, added to each zone's
words. Moto 5.2.5 does not implement it; its test is a local fake answering in the shape
botocore's EC2 model defines (spotPlacementScoreSet of region, availabilityZoneId, score).
When it cannot be had (no permission, not implemented), each zone says so instead.
AWS_ENDPOINT_URL_EC2 points the clients elsewhere (tests: moto or that fake on 127.0.0.1).
The SDK is imported inside the function.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from infra.clouds.availability import OFFERED, NoSignal, ZoneSignal

SIGNAL = (
    "EC2 DescribeInstanceTypeOfferings by zone, DescribeSpotPriceHistory per zone, "
    "GetSpotPlacementScores per region"
)
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


def placement_scores(ec2: Any, instance_type: str, regions: Sequence[str]) -> dict[str, int]:
    """Region -> GetSpotPlacementScores' score (1-10) for one spot instance of the type."""
    scores: dict[str, int] = {}
    for item in _pages(
        ec2.get_spot_placement_scores,
        "SpotPlacementScores",
        InstanceTypes=[instance_type],
        TargetCapacity=1,
        TargetCapacityUnitType="units",
        SingleAvailabilityZone=False,
        RegionNames=list(regions),
    ):
        scores[str(item["Region"])] = int(item["Score"])
    return scores


def _scores_or_why(session: Any, instance_type: str, regions: Sequence[str]) -> dict[str, str]:
    """Region -> the words for its spot placement score, or for why there is none."""
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    once = Config(retries={"max_attempts": 1, "mode": "standard"})
    ec2 = session.client("ec2", region_name=regions[0], config=once)
    try:
        scores = placement_scores(ec2, instance_type, regions)
    except ClientError as exc:
        why = exc.response.get("Error", {}).get("Code") or "refused"
        return {r: f"no spot placement score ({why})" for r in regions}
    except (BotoCoreError, ResponseParserError) as exc:  # moto: not implemented (HTML 500)
        return {r: f"no spot placement score ({type(exc).__name__})" for r in regions}
    return {
        r: f"spot placement score {scores[r]}/10" if r in scores else "no spot placement score"
        for r in regions
    }


def live_zones(instance_type: str, regions: Sequence[str]) -> list[ZoneSignal]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

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
        except (BotoCoreError, ClientError, ResponseParserError) as exc:
            raise NoSignal(f"EC2 in {region}: {str(exc).splitlines()[0]}") from None
        spot = latest_spot(history)
        for o in sorted(offered, key=lambda o: str(o.get("Location"))):
            zone = str(o["Location"])
            found.append(ZoneSignal(region, zone, OFFERED, spot.get(zone), ""))
    if found:
        words = _scores_or_why(session, instance_type, list(dict.fromkeys(regions)))
        found = [
            ZoneSignal(z.region, z.zone, z.state, z.spot_price, f"offered; {words[z.region]}")
            for z in found
        ]
    return found
