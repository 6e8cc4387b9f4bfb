"""Tencent Cloud's availability signal (infra/clouds/tencent/availability.py): the official
SDK, TC3-signed, against a local fake of DescribeZoneInstanceConfigInfos on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from infra.clouds.availability import AVAILABLE, SOLD_OUT, NoSignal
from infra.clouds.tencent import availability
from tests.infra.where.fakes import serving


def quota_item(zone: str, itype: str, status: str, **extra: Any) -> dict[str, Any]:
    """One InstanceTypeQuotaItem, shaped like the recorded answer in TencentCloud/
    tencentcloud-cli tccli/examples/cvm/v20170312/DescribeZoneInstanceConfigInfos.md (fields
    trimmed to those read, plus the ones the SDK model documents: Status SELL/SOLD_OUT,
    SoldOutReason, StatusCategory)."""
    return {
        "Status": status,
        "Zone": zone,
        "InstanceType": itype,
        "InstanceChargeType": "POSTPAID_BY_HOUR",
        "SoldOutReason": "",
        "Price": {"UnitPrice": 0.15, "ChargeUnit": "HOUR"},
        **extra,
    }


ZONES = {
    "ap-guangzhou": [
        quota_item("ap-guangzhou-6", "GT4.41XLARGE948", "SELL", StatusCategory="UnderStock"),
        quota_item("ap-guangzhou-3", "GT4.41XLARGE948", "SOLD_OUT", SoldOutReason="售罄"),
    ],
    "ap-shanghai": [],
}


@pytest.fixture
def cvm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    def answer(
        method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if headers.get("x-tc-action") != "DescribeZoneInstanceConfigInfos":
            return 200, {"Response": {"Error": {"Code": "InvalidAction", "Message": "?"}}}
        rows = ZONES.get(headers.get("x-tc-region", ""))
        if rows is None:
            err = {"Code": "InvalidRegion", "Message": "region not supported"}
            return 200, {"Response": {"Error": err, "RequestId": "r"}}
        return 200, {"Response": {"InstanceTypeQuotaSet": rows, "RequestId": "r-1"}}

    with serving(answer) as (endpoint, seen):
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDfake")
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
        yield seen


def test_each_zone_says_whether_it_sells_the_type_now(cvm: list[dict[str, Any]]) -> None:
    zones = availability.live_zones("GT4.41XLARGE948", ["ap-guangzhou", "ap-shanghai"])
    assert [(z.zone, z.state) for z in zones] == [
        ("ap-guangzhou-3", SOLD_OUT),
        ("ap-guangzhou-6", AVAILABLE),
    ]
    assert zones[0].detail == "SOLD_OUT, 售罄" and zones[1].detail == "SELL, UnderStock"


def test_the_request_is_signed_and_filters_the_type_and_pay_as_you_go(
    cvm: list[dict[str, Any]],
) -> None:
    availability.live_zones("GT4.41XLARGE948", ["ap-guangzhou"])
    (req,) = cvm
    assert req["headers"]["authorization"].startswith("TC3-HMAC-SHA256 Credential=AKIDfake/")
    filters = {f["Name"]: f["Values"] for f in json.loads(req["body"])["Filters"]}
    assert filters == {
        "instance-type": ["GT4.41XLARGE948"],
        "instance-charge-type": ["POSTPAID_BY_HOUR"],
    }


def test_an_api_error_is_one_line_with_its_code(cvm: list[dict[str, Any]]) -> None:
    with pytest.raises(NoSignal, match=r"^CVM in ap-nowhere: InvalidRegion: region not"):
        availability.live_zones("GT4.41XLARGE948", ["ap-nowhere"])


def test_no_credentials_is_one_line_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID", raising=False)
    with pytest.raises(NoSignal, match=r"^no Tencent Cloud credentials .*offline rows only$"):
        availability.live_zones("GT4.41XLARGE948", ["ap-guangzhou"])
