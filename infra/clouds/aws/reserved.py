"""AWS Capacity Blocks for ML: the offerings for a type, count, dates and duration.

One read-only call, EC2 ``DescribeCapacityBlockOfferings`` (ec2:DescribeCapacityBlockOfferings),
through boto3 with the account's credentials: each offering's id, zone, dates, hours and
its upfront fee (the whole block: every instance for every hour, paid when bought). Moto
5.2.5 does not implement the call; its test is a local fake answering in the shape
botocore's EC2 model defines (capacityBlockOfferingSet of item, nextToken).
AWS_ENDPOINT_URL_EC2 points the client elsewhere (tests: that fake on 127.0.0.1).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from infra.reserved import NoOffering, Offering

SIGNAL = "EC2 DescribeCapacityBlockOfferings"
MAX_COUNT = 64  # instances in one Capacity Block (botocore ec2 model, InstanceCount)
MAX_PAGES = 20  # a bound on the loop, not a limit the API sets


def request_problem(days: int, count: int) -> str | None:
    """A block lasts 1-14 days in 1-day steps, then up to 182 days in 7-day steps, and holds
    1-64 instances (botocore ec2 model: CapacityDurationHours, InstanceCount)."""
    if days < 1 or days > 182 or (days > 14 and days % 7):
        return f"--days {days}: a block lasts 1-14 days, or 21-182 in whole weeks (e.g. 7, 28)"
    if not 1 <= count <= MAX_COUNT:
        return f"--nodes {count}: a block holds 1-{MAX_COUNT} instances"
    return None


def parse(page: dict[str, Any]) -> list[Offering]:
    out = []
    for o in page.get("CapacityBlockOfferings", []):
        out.append(
            Offering(
                provider="aws",
                offering_id=str(o["CapacityBlockOfferingId"]),
                instance_type=str(o["InstanceType"]),
                zone=str(o.get("AvailabilityZone", "")),
                count=int(o["InstanceCount"]),
                start=o["StartDate"],
                end=o["EndDate"],
                hours=int(o["CapacityBlockDurationHours"]),
                upfront_fee=float(o["UpfrontFee"]),
                currency=str(o.get("CurrencyCode", "USD")),
            )
        )
    return out


def ask(
    ec2: Any, instance_type: str, count: int, start: dt.datetime, end: dt.datetime, hours: int
) -> list[Offering]:
    kwargs: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": count,
        "StartDateRange": start,
        "EndDateRange": end,
        "CapacityDurationHours": hours,
    }
    found: list[Offering] = []
    for _ in range(MAX_PAGES):
        page = ec2.describe_capacity_block_offerings(**kwargs)
        found += parse(page)
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    return sorted(found, key=lambda o: (o.upfront_fee, o.start, o.zone))


def offerings(
    instance_type: str,
    count: int,
    start: dt.datetime,
    end: dt.datetime,
    hours: int,
    region: str,
) -> list[Offering]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise NoOffering(
            "no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    ec2 = session.client("ec2", region_name=region)
    try:
        return ask(ec2, instance_type, count, start, end, hours)
    except (BotoCoreError, ClientError) as exc:
        raise NoOffering(f"EC2 in {region}: {str(exc).splitlines()[0]}") from None
