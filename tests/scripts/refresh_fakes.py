"""Local fakes of the price actions `make refresh-prices` asks Alibaba Cloud and Tencent Cloud,
on 127.0.0.1 only, and a fault proxy in front of them that answers each cloud's own errors.

Alibaba (ECS 2014-05-26, the wire format the official SDK speaks, as tests/preflight/
alicloud_fake.py: POST, the action in ``x-acs-action``, the parameters in the query string,
JSON answers; errors ``{"Code", "Message", "RequestId"}`` with an HTTP error status, a
throttled call 400 Throttling.User as tests/reaper/alicloud_fake.py answers it). Every
request's parameters are checked against the SDK's own request model
(tests/support/alicloud_models.unknown_params). Answers carry the members of the SDK's
response models (alibabacloud_ecs20140526 7.11.8 in .venv, read 2026-12-05):
DescribePriceResponseBody (PriceInfo.Price: Currency, OriginalPrice, TradePrice,
DetailInfos.DetailInfo[] of Resource, TradePrice) and DescribeSpotPriceHistoryResponseBody
(Currency, NextOffset, RequestId, SpotPrices.SpotPriceType[] of InstanceType, IoOptimized,
NetworkType, OriginPrice, SpotPrice, Timestamp, ZoneId), rows shaped as the JSON example of
Alibaba's API reference (SkyeYXL/ecs, cn.zh-CN/API参考/实例/DescribeSpotPriceHistory.md).

Tencent (CVM 2017-03-12, as tests/preflight/tencent_fake.py: POST /, the action in
X-TC-Action, ``{"Response": {..., "RequestId"}}``, errors as ``Response.Error`` with HTTP
200, a throttled call RequestLimitExceeded as tests/reaper/tencent_fake.py answers it).
Request members are checked against the SDK's models (tencentcloud-sdk-python-cvm 3.1.178,
tencentcloud/cvm/v20170312/models.py): a member the model lacks is refused. Answers:
DescribeZoneInstanceConfigInfos' InstanceTypeQuotaSet (Zone, InstanceType,
InstanceChargeType, Status), DescribeImages' ImageSet, InquiryPriceRunInstances' Price.
InstancePrice (ItemPrice: UnitPrice, UnitPriceDiscount, ChargeUnit HOUR by the hour and for
SPOTPAID; OriginalPrice, DiscountPrice, Discount for PREPAID). Every price is FAKE.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.infra.where.fakes import serving
from tests.support.alicloud_models import unknown_params
from tests.support.fault_proxy import LOOPBACK, Fault, FaultProxy

# ----------------------------------------------------------------------------------------------
# Alibaba Cloud ECS


@dataclass
class AliPrices:
    hour: dict[str, float] = field(default_factory=dict)  # type -> CNY/h
    month: dict[str, float] = field(default_factory=dict)  # type -> CNY a month
    # type -> (zone, timestamp, price) rows; a zone's latest row is its price now
    spot: dict[str, list[tuple[str, str, float]]] = field(default_factory=dict)
    page: int = 2  # rows per DescribeSpotPriceHistory page: the client must follow NextOffset
    seen: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = ""

    def actions(self) -> list[str]:
        return [r["headers"].get("x-acs-action", "") for r in self.seen]

    def answer(
        self, method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        from alibabacloud_ecs20140526 import models

        if "authorization" not in headers:
            return 400, {"Code": "MissingAuthorization", "Message": "unsigned", "RequestId": "f"}
        action = headers.get("x-acs-action", "")
        model = getattr(models, f"{action}Request", None)
        if model is None or action not in ("DescribePrice", "DescribeSpotPriceHistory"):
            return 400, {"Code": "InvalidAction.NotFound", "Message": action, "RequestId": "f"}
        wrong = unknown_params(model, q)
        if wrong:
            return 400, {"Code": "InvalidParameter", "Message": f"unknown {wrong}"}
        kind = q.get("InstanceType", "")
        if action == "DescribeSpotPriceHistory":
            return self.history(kind, q)
        table = self.month if q.get("PriceUnit") == "Month" else self.hour
        if kind not in table:
            return 404, {"Code": "InvalidInstanceType.NotFound", "Message": kind, "RequestId": "f"}
        price = table[kind]
        return 200, {
            "RequestId": "f",
            "PriceInfo": {
                "Price": {
                    "Currency": "CNY",
                    "OriginalPrice": price + 1.5,
                    "TradePrice": price + 1.5,
                    "DetailInfos": {
                        "DetailInfo": [
                            {"Resource": "instanceType", "TradePrice": price},
                            {"Resource": "systemDisk", "TradePrice": 1.5},
                        ]
                    },
                },
                "Rules": {"Rule": []},
            },
        }

    def history(self, kind: str, q: dict[str, str]) -> tuple[int, Any]:
        if q.get("NetworkType") != "vpc" or not q.get("RegionId"):
            return 400, {"Code": "MissingParameter", "Message": "NetworkType", "RequestId": "f"}
        if q.get("OSType") not in (None, "linux"):
            return 400, {"Code": "InvalidParams.OSType", "Message": "", "RequestId": "f"}
        rows = [
            {
                "InstanceType": kind,
                "IoOptimized": "optimized",
                "NetworkType": "vpc",
                "OriginPrice": self.hour.get(kind, 0.0),
                "SpotPrice": price,
                "Timestamp": when,
                "ZoneId": zone,
            }
            for zone, when, price in self.spot.get(kind, [])
        ]
        start = int(q.get("Offset") or 0)
        chunk = rows[start : start + self.page]
        doc: dict[str, Any] = {
            "RequestId": "f",
            "Currency": "CNY",
            "SpotPrices": {"SpotPriceType": chunk},
        }
        if start + self.page < len(rows):
            doc["NextOffset"] = start + self.page
        return 200, doc

    @contextmanager
    def running(self) -> Iterator[AliPrices]:
        with serving(self.answer) as (endpoint, seen):
            self.endpoint, self.seen = endpoint, seen
            yield self


# ----------------------------------------------------------------------------------------------
# Tencent Cloud CVM


def _unknown_members(model: Any, params: dict[str, Any], where: str = "") -> list[str]:
    """The members of ``params`` the SDK model does not define (nested ones too)."""
    from tencentcloud.cvm.v20170312 import models

    wrong = []
    for key, value in params.items():
        if not hasattr(model, f"_{key}"):
            wrong.append(where + key)
            continue
        nested = {
            "Placement": models.Placement,
            "InstanceMarketOptions": models.InstanceMarketOptionsRequest,
            "SpotOptions": models.SpotMarketOptions,
            "InstanceChargePrepaid": models.InstanceChargePrepaid,
        }.get(key)
        if nested is not None and isinstance(value, dict):
            wrong += _unknown_members(nested(), value, f"{where}{key}.")
    return wrong


class TencentPrices:
    def __init__(self) -> None:
        self.hour: dict[str, float] = {}
        self.month: dict[str, float] = {}
        self.spot: dict[tuple[str, str], float] = {}  # (type, zone) -> CNY/h
        self.selling: dict[tuple[str, str], list[str]] = {}  # (type, charge) -> zones
        self.requests: list[tuple[str, dict[str, Any]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = self.headers.get("X-TC-Action", "")
                params = json.loads(body or b"{}")
                fake.requests.append((action, params))
                if not self.headers.get("Authorization", "").startswith("TC3-HMAC-SHA256 "):
                    out = tencent_error("AuthFailure.SignatureFailure", "unsigned")
                else:
                    out = {"Response": {**fake.answer(action, params), "RequestId": "fake"}}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def actions(self) -> list[str]:
        return [a for a, _ in self.requests]

    def answer(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        from tencentcloud.cvm.v20170312 import models

        model = getattr(models, f"{action}Request", None)
        if model is None:
            return tencent_error("InvalidAction", action)["Response"]
        wrong = _unknown_members(model(), params)
        if wrong:
            return tencent_error("UnknownParameter", ", ".join(wrong))["Response"]
        if action == "DescribeZoneInstanceConfigInfos":
            wanted = {f["Name"]: f["Values"][0] for f in params.get("Filters", [])}
            kind, charge = wanted.get("instance-type", ""), wanted.get("instance-charge-type", "")
            rows = [
                {"Zone": z, "InstanceType": kind, "InstanceChargeType": charge, "Status": "SELL"}
                for z in self.selling.get((kind, charge), [])
            ]
            return {"InstanceTypeQuotaSet": rows}
        if action == "DescribeImages":
            return {"ImageSet": [{"ImageId": "img-487zeit5"}], "TotalCount": 1}
        if action == "InquiryPriceRunInstances":
            return self.inquiry(params)
        return tencent_error("UnsupportedOperation", action)["Response"]

    def inquiry(self, params: dict[str, Any]) -> dict[str, Any]:
        kind, charge = params.get("InstanceType", ""), params.get("InstanceChargeType", "")
        zone = params.get("Placement", {}).get("Zone", "")
        if zone not in self.selling.get((kind, charge), []):
            return tencent_error("ResourceInsufficient.SpecifiedInstanceType", zone)["Response"]
        if charge == "PREPAID":
            if params.get("InstanceChargePrepaid", {}).get("Period") != 1:
                return tencent_error("MissingParameter", "InstanceChargePrepaid")["Response"]
            price = self.month[kind]
            item = {"OriginalPrice": price * 1.25, "DiscountPrice": price, "Discount": 80.0}
            return {"Price": {"InstancePrice": item}}
        if charge == "SPOTPAID":
            if params.get("InstanceMarketOptions", {}).get("MarketType") != "spot":
                return tencent_error("InvalidParameter", "InstanceMarketOptions")["Response"]
            price = self.spot[(kind, zone)]
        else:
            price = self.hour[kind]
        item = {"UnitPrice": price * 1.1, "UnitPriceDiscount": price, "ChargeUnit": "HOUR"}
        return {"Price": {"InstancePrice": item}}

    def __enter__(self) -> TencentPrices:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def tencent_error(code: str, message: str) -> dict[str, Any]:
    return {"Response": {"Error": {"Code": code, "Message": message}, "RequestId": "fake"}}


# ----------------------------------------------------------------------------------------------
# The fault proxy (tests/support/fault_proxy.py), answering each cloud's own error bodies


class CloudFaultProxy(FaultProxy):
    """tests/support/fault_proxy.FaultProxy whose error answers are the cloud's JSON:
    Alibaba's ``{"Code", "Message", "RequestId"}`` at the fault's status, Tencent's
    ``Response.Error`` at HTTP 200 (its API answers errors so)."""

    cloud: str = "alibaba"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        base = super().handler()
        cloud = self.cloud

        class Handler(base):  # type: ignore[valid-type,misc]
            def _error(self, fault: Fault, message: str = "") -> None:
                text = message or fault.code
                if cloud == "tencent":
                    status, doc = 200, tencent_error(fault.code, text)
                else:
                    status, doc = fault.status, {"Code": fault.code, "Message": text}
                    doc["RequestId"] = "fault-proxy"
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def refusing(
    times: int, code: str, when: Callable[[dict[str, str], bytes], bool], status: int = 400
) -> Callable[[str, dict[str, str], bytes], tuple[int, str, str] | None]:
    """A ``refuse`` hook for the proxy: the first ``times`` requests ``when`` picks are
    answered ``code`` (a throttled or failed call), the rest forwarded."""
    left = [times]
    lock = threading.Lock()

    def refuse(method: str, headers: dict[str, str], body: bytes) -> tuple[int, str, str] | None:
        with lock:
            if left[0] > 0 and when(headers, body):
                left[0] -= 1
                return status, code, f"{code} (fault proxy)"
        return None

    return refuse


@contextmanager
def cloud_fault_proxy(
    upstream: str,
    cloud: str,
    refuse: Callable[[str, dict[str, str], bytes], tuple[int, str, str] | None] | None = None,
) -> Iterator[CloudFaultProxy]:
    """A :class:`CloudFaultProxy` in front of ``upstream`` (host:port on 127.0.0.1)."""
    proxy = CloudFaultProxy(f"http://{upstream}", timeout=30.0, refuse=refuse)
    proxy.cloud = cloud
    server = ThreadingHTTPServer((LOOPBACK, 0), proxy.handler())
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    proxy.url = f"{LOOPBACK}:{server.server_port}"
    try:
        yield proxy
    finally:
        proxy.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
