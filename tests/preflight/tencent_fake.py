"""A local fake of the four Tencent Cloud API 3.0 actions the preflight asks, on 127.0.0.1.

The wire format as tests/reaper/tencent_fake.py speaks it (POST /, the action in
X-TC-Action, answers ``{"Response": {..., "RequestId"}}``, errors as ``Response.Error``
with HTTP 200); the signature is only required to be TC3-HMAC-SHA256 here (the reaper's
fake checks it in full). Answers carry the fields of the SDK's own models
(tencentcloud-sdk-python-cvm 3.1.178, tencentcloud/cvm/v20170312/models.py, read
2026-12-05): DescribeAccountQuotaResponse (AppId, AccountQuotaOverview of Region and
AccountQuota, whose PostPaidQuotaSet / SpotPaidQuotaSet rows have UsedQuota,
RemainingQuota, TotalQuota, Zone), DescribeImagesResponse (ImageSet of ImageId,
ImageName; TotalCount); RunInstances with DryRun answers a RequestId only, as the SDK's
RunInstancesRequest.DryRun says a passed check does. DescribeZoneInstanceConfigInfos (for
the shared offered check): InstanceTypeQuotaSet rows of the SDK's InstanceTypeQuotaItem
(Zone, InstanceType, InstanceChargeType, Status SELL / SOLD_OUT, SoldOutReason,
StatusCategory), shaped as tests/infra/where/test_live_tencent.py's recorded example,
filtered by the request's instance-type and instance-charge-type. STS GetCallerIdentity: Arn,
AccountId, UserId, PrincipalId, Type (the STS 2018-08-13 API's documented output,
https://cloud.tencent.com/document/api/1312/48210; that page was not opened here, and no
STS SDK model is installed to check these names against).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def offering(zone: str, itype: str, status: str = "SELL", **extra: Any) -> dict[str, Any]:
    """One InstanceTypeQuotaItem of DescribeZoneInstanceConfigInfos."""
    return {
        "Zone": zone,
        "InstanceType": itype,
        "InstanceChargeType": "POSTPAID_BY_HOUR",
        "Status": status,
        "SoldOutReason": "",
        **extra,
    }


def quota_row(zone: str, total: int, used: int) -> dict[str, Any]:
    return {"UsedQuota": used, "RemainingQuota": total - used, "TotalQuota": total, "Zone": zone}


class TencentFake:
    def __init__(self) -> None:
        self.post_paid: list[dict[str, Any]] = [quota_row("ap-guangzhou-3", 30, 0)]
        self.spot_paid: list[dict[str, Any]] = [quota_row("ap-guangzhou-3", 30, 0)]
        self.images = [{"ImageId": "img-487zeit5", "ImageName": "Ubuntu Server 22.04 LTS 64bit"}]
        self.offerings = [offering("ap-guangzhou-3", "GN7.2XLARGE32", StatusCategory="EnoughStock")]
        self.denied: set[str] = set()  # actions answered UnauthorizedOperation
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
                    out = fake.error("AuthFailure.SignatureFailure", "unsigned")
                elif action in fake.denied:
                    out = fake.error("UnauthorizedOperation", "CAM denied the action")
                else:
                    out = {"Response": {**fake.answer(action, params), "RequestId": "fake"}}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def error(code: str, message: str) -> dict[str, Any]:
        return {"Response": {"Error": {"Code": code, "Message": message}, "RequestId": "fake"}}

    def answer(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        if action == "GetCallerIdentity":
            return {
                "Arn": "qcs::cam::uin/100000000001:uin/100000000001",
                "AccountId": "100000000001",
                "UserId": "100000000001",
                "PrincipalId": "100000000001",
                "Type": "RootAccount",
            }
        if action == "DescribeAccountQuota":
            zones = [
                v for f in params.get("Filters", []) if f["Name"] == "zone" for v in f["Values"]
            ]

            def keep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return [r for r in rows if not zones or r["Zone"] in zones]

            return {
                "AppId": 1250000000,
                "AccountQuotaOverview": {
                    "Region": "ap-guangzhou",
                    "AccountQuota": {
                        "PostPaidQuotaSet": keep(self.post_paid),
                        "SpotPaidQuotaSet": keep(self.spot_paid),
                        "PrePaidQuotaSet": [],
                        "ImageQuotaSet": [],
                        "DisasterRecoverGroupQuotaSet": [],
                    },
                },
            }
        if action == "DescribeZoneInstanceConfigInfos":
            wanted = {f["Name"]: set(f["Values"]) for f in params.get("Filters", [])}

            def kept(row: dict[str, Any]) -> bool:
                return all(
                    row.get(key) in wanted[name]
                    for name, key in (
                        ("zone", "Zone"),
                        ("instance-type", "InstanceType"),
                        ("instance-charge-type", "InstanceChargeType"),
                    )
                    if name in wanted
                )

            return {"InstanceTypeQuotaSet": [r for r in self.offerings if kept(r)]}
        if action == "DescribeImages":
            return {"ImageSet": self.images, "TotalCount": len(self.images)}
        if action == "RunInstances" and params.get("DryRun"):
            return {}
        return self.error("UnsupportedOperation", action)["Response"]

    def __enter__(self) -> TencentFake:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
