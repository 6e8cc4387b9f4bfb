"""Alibaba Cloud's live price: DescribePrice's answer read by infra/clouds/alicloud/prices.py.

The body follows DescribePrice's response (PriceInfo.Price with its DetailInfos); the call
itself, through the ECS SDK against a local fake, is tests/scripts/test_cost_cli_live.py.
"""

from __future__ import annotations

from infra.clouds.alicloud.prices import parse_alicloud_price


def test_alicloud_price_parser_prefers_the_instance_line_over_the_total():
    body = {
        "PriceInfo": {
            "Price": {
                "Currency": "CNY",
                "TradePrice": 33.1,
                "DetailInfos": {
                    "DetailInfo": [
                        {"Resource": "systemDisk", "TradePrice": 1.52},
                        {"Resource": "instanceType", "TradePrice": 31.58},
                    ]
                },
            }
        }
    }
    assert parse_alicloud_price(body) == (31.58, "CNY")
    del body["PriceInfo"]["Price"]["DetailInfos"]
    assert parse_alicloud_price(body) == (33.1, "CNY")
