"""AWS's live instance-hour price: the Price List API (GetProducts, served from us-east-1
whatever region is priced), through boto3 with the account's credentials.

Spot: EC2 DescribeSpotPriceHistory in the type's own region (:func:`live_spot`, for ``make
refresh-prices``), from StartTime now, so each Availability Zone answers its current price;
the range is the lowest and highest zone. The request and answer are botocore's
(botocore/data/ec2/2016-11-15/service-2.json: DescribeSpotPriceHistoryRequest InstanceTypes,
ProductDescriptions, StartTime, NextToken; SpotPriceHistory rows of SpotPrice with
AvailabilityZone, InstanceType, ProductDescription, SpotPrice, Timestamp; read in the
installed botocore 1.44.18, 2026-12-05). Only Linux/UNIX rows count.

AWS_ENDPOINT_URL_PRICING points the client elsewhere (tests: a local fake on 127.0.0.1),
AWS_ENDPOINT_URL_EC2 the spot history's (tests: moto).
The SDK is imported inside the functions: nothing else needs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound, Terms

# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "AWS-PRICELIST"
SPOT_SOURCE = "AWS-SPOTHISTORY"
SPOT_PRODUCTS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
MAX_PAGES = 20  # one type in one region is a few products: more pages means a bad filter


def aws_pricing_filters(instance_type: str, location: str) -> list[dict[str, str]]:
    """GetProducts filters selecting the Linux, shared-tenancy, no-licence on-demand product."""
    wanted = {
        "instanceType": instance_type,
        "location": location,
        "tenancy": "Shared",
        "operatingSystem": "Linux",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
    }
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in wanted.items()]


def parse_aws_price_list(price_list: Iterable[str | Mapping[str, Any]]) -> float:
    """The on-demand USD/hour from GetProducts' PriceList (JSON strings). Raises LookupError."""
    found: list[float] = []
    for entry in price_list:
        doc = json.loads(entry) if isinstance(entry, str) else entry
        for term in doc.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and dim.get("unit", "Hrs").lower().startswith("hr"):
                    value = float(usd)
                    if value > 0:
                        found.append(value)
    if not found:
        raise LookupError("the Price List answer holds no on-demand hourly USD price")
    return min(found)


def aws_location(region: str) -> str:
    """The Price List API's `location` for a region code ('US East (N. Virginia)')."""
    import botocore.loaders

    for partition in botocore.loaders.create_loader().load_data("endpoints")["partitions"]:
        if region in partition["regions"]:
            return str(partition["regions"][region]["description"])
    raise LivePriceError(f"region {region!r} is not known to botocore: cannot name its location")


def live_aws_price(instance_type: str, region: str) -> float:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise NoCredentials(
            "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "to compare with the Price List API"
        )
    # The Price List API is served from us-east-1 whatever region is priced.
    client = session.client("pricing", region_name="us-east-1")
    kwargs: dict[str, Any] = {
        "ServiceCode": "AmazonEC2",
        "Filters": aws_pricing_filters(instance_type, aws_location(region)),
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }
    items: list[str] = []
    try:
        for _ in range(MAX_PAGES):
            page = client.get_products(**kwargs)
            items.extend(page.get("PriceList", []))
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
        else:
            raise LivePriceError(f"AWS Price List API: still more pages after {MAX_PAGES}")
    except (BotoCoreError, ClientError) as exc:
        raise LivePriceError(f"AWS Price List API: {exc}") from None
    try:
        return parse_aws_price_list(items)
    except LookupError as exc:
        raise PriceNotFound(f"AWS Price List API: {exc} for {instance_type} in {region}") from None


def live_price(instance_type: str, region: str) -> tuple[float, str]:
    """(USD per hour, "USD"): the Price List API's currency."""
    return live_aws_price(instance_type, region), "USD"


def live_reservations(instance_type: str, region: str) -> tuple[Terms, str]:
    raise LivePriceError("no live reservation price source for aws")


def live_spot(instance_type: str, region: str) -> tuple[float, float, str]:
    """(lowest, highest, "USD") of the current Linux spot price per hour over the region's
    zones; PriceNotFound when no zone answers one. Needs the account's credentials."""
    import datetime as dt

    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise NoCredentials(
            "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "to read the spot price history"
        )
    once = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=20)
    ec2 = session.client("ec2", region_name=region, config=once)
    kwargs: dict[str, Any] = {
        "InstanceTypes": [instance_type],
        "ProductDescriptions": SPOT_PRODUCTS,
        "StartTime": dt.datetime.now(dt.UTC),
        "MaxResults": 100,
    }
    latest: dict[str, tuple[Any, float]] = {}  # zone -> (timestamp, price)
    try:
        for _ in range(MAX_PAGES):
            page = ec2.describe_spot_price_history(**kwargs)
            for row in page.get("SpotPriceHistory", []):
                if row.get("InstanceType") != instance_type:
                    continue
                if not str(row.get("ProductDescription", "")).startswith("Linux/UNIX"):
                    continue
                zone, when = str(row.get("AvailabilityZone", "")), row.get("Timestamp")
                price = float(row.get("SpotPrice", 0) or 0)
                if price > 0 and (zone not in latest or str(when) > str(latest[zone][0])):
                    latest[zone] = (when, price)
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
        else:
            raise LivePriceError(
                f"EC2 DescribeSpotPriceHistory: still more pages after {MAX_PAGES}"
            )
    except (BotoCoreError, ClientError) as exc:
        raise LivePriceError(f"EC2 DescribeSpotPriceHistory: {exc}") from None
    if not latest:
        raise PriceNotFound(
            f"EC2 DescribeSpotPriceHistory: no Linux spot price for {instance_type} in {region}"
        )
    prices = [p for _, p in latest.values()]
    return min(prices), max(prices), "USD"
