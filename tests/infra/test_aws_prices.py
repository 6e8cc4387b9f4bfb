"""AWS's live price: the Price List API answer read by infra/clouds/aws/prices.py.

The product below follows the shape of GetProducts' PriceList entries (one JSON string per
product, terms.OnDemand.<sku>.priceDimensions.<rate>.pricePerUnit.USD); the call itself,
through boto3 against a local fake, is tests/scripts/test_cost_cli_live.py.
"""

from __future__ import annotations

import json

import pytest

from infra.clouds.aws.prices import aws_pricing_filters, parse_aws_price_list


def _aws_product(usd: str, unit: str = "Hrs") -> str:
    return json.dumps(
        {
            "product": {"attributes": {"instanceType": "p4d.24xlarge"}},
            "terms": {
                "OnDemand": {
                    "SKU.JRTCKXETXF": {
                        "priceDimensions": {
                            "SKU.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": unit,
                                "pricePerUnit": {"USD": usd},
                            }
                        }
                    }
                }
            },
        }
    )


def test_aws_price_list_parser_reads_the_on_demand_hourly_usd():
    assert parse_aws_price_list([_aws_product("21.9580000000")]) == pytest.approx(21.958)
    with pytest.raises(LookupError):
        parse_aws_price_list([_aws_product("0.0000000000")])
    with pytest.raises(LookupError):
        parse_aws_price_list([])


def test_aws_pricing_filters_select_the_linux_shared_no_licence_product():
    filters = {f["Field"]: f["Value"] for f in aws_pricing_filters("p4d.24xlarge", "X")}
    assert filters["instanceType"] == "p4d.24xlarge" and filters["location"] == "X"
    assert filters["operatingSystem"] == "Linux" and filters["tenancy"] == "Shared"
