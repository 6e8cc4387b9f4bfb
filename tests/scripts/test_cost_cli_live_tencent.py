"""`cost.py --live` for Tencent Cloud: the official SDK (tencentcloud-sdk-python, TC3-signed
requests) against a local fake of the three CVM actions, over real HTTP on 127.0.0.1. No
Tencent emulator exists; what only a real account can prove is in docs/clouds/tencent.md."""

from __future__ import annotations

import importlib.util
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from infra.clouds.tencent.prices import first_selling_zone, parse_tencent_price
from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_cli_tc", ROOT / "scripts" / "cost.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = _load()


class FakeCvm(ThreadingHTTPServer):
    """DescribeZoneInstanceConfigInfos, DescribeImages and InquiryPriceRunInstances."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.selling: dict[str, list[str]] = {}  # instance type -> zones on sale
        self.prices: dict[tuple[str, str], float] = {}  # (zone, type) -> CNY/h
        self.error: tuple[str, str] | None = None  # (code, message) for the inquiry

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeCvm

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, response: dict[str, Any]) -> None:
        data = json.dumps({"Response": {**response, "RequestId": "fake-1"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        action = self.headers.get("X-TC-Action", "")
        self.server.requests.append(
            {
                "action": action,
                "region": self.headers.get("X-TC-Region"),
                "auth": self.headers.get("Authorization", ""),
                "body": body,
            }
        )
        filters = {f["Name"]: f["Values"] for f in body.get("Filters", [])}
        if action == "DescribeZoneInstanceConfigInfos":
            itype = filters["instance-type"][0]
            rows = [
                {"Zone": z, "InstanceType": itype, "Status": "SELL"}
                for z in self.server.selling.get(itype, [])
            ]
            self._reply({"InstanceTypeQuotaSet": rows})
        elif action == "DescribeImages":
            self._reply({"ImageSet": [{"ImageId": "img-fake0001"}], "TotalCount": 1})
        elif action == "InquiryPriceRunInstances":
            if self.server.error:
                code, message = self.server.error
                self._reply({"Error": {"Code": code, "Message": message}})
                return
            key = (body["Placement"]["Zone"], body["InstanceType"])
            price = self.server.prices[key]
            self._reply(
                {
                    "Price": {
                        "InstancePrice": {
                            "UnitPrice": price * 1.25,
                            "UnitPriceDiscount": price,
                            "ChargeUnit": "HOUR",
                            "Discount": 80,
                        },
                        "BandwidthPrice": {"UnitPriceDiscount": 0.8, "ChargeUnit": "GB"},
                    }
                }
            )
        else:
            self._reply({"Error": {"Code": "InvalidAction", "Message": action}})


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCvm]:
    server = FakeCvm()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDfake")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
    monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", server.endpoint)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def stack(tmp_path: Path, tier: str) -> Path:
    path = tmp_path / f"Pulumi.tencent-{tier}.yaml"
    path.write_text(
        "config:\n"
        "  gpufleet:provider: tencent\n"
        f"  gpufleet:tier: {tier}\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    return path


def run(*argv: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*argv, "--json"], out=out, err=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_the_discounted_unit_price_is_the_live_price() -> None:
    body = {"Price": {"InstancePrice": {"UnitPrice": 40.0, "UnitPriceDiscount": 32.5}}}
    assert parse_tencent_price(body) == 32.5


def test_a_price_by_the_month_is_not_read_as_an_hourly_one() -> None:
    body = {"Price": {"InstancePrice": {"OriginalPrice": 9000, "ChargeUnit": "MONTH"}}}
    with pytest.raises(LookupError, match="MONTH"):
        parse_tencent_price(body)


def test_the_first_zone_on_sale_is_chosen_and_sold_out_zones_are_skipped() -> None:
    body = {
        "InstanceTypeQuotaSet": [
            {"Zone": "ap-guangzhou-6", "InstanceType": "GT4.4XLARGE96", "Status": "SELL"},
            {"Zone": "ap-guangzhou-3", "InstanceType": "GT4.4XLARGE96", "Status": "SOLD_OUT"},
            {"Zone": "ap-guangzhou-4", "InstanceType": "GT4.4XLARGE96", "Status": "SELL"},
        ]
    }
    assert first_selling_zone(body, "GT4.4XLARGE96") == "ap-guangzhou-4"


def test_tencent_live_price_comes_from_inquiry_price_run_instances(
    fake: FakeCvm, tmp_path: Path
) -> None:
    fake.selling["GT4.20XLARGE474"] = ["ap-guangzhou-6", "ap-guangzhou-4"]
    fake.prices[("ap-guangzhou-4", "GT4.20XLARGE474")] = 125.0
    code, doc, err = run("--stack-file", str(stack(tmp_path, "a100x4")), "--live")
    assert code == 0, err
    live = doc["live"]
    assert live["ok"] is True and live["currency"] == "CNY"
    assert live["live"] == pytest.approx(125.0)  # the instance's discounted unit price
    assert "20.0% above the live price" in live["message"]  # catalog estimate 150
    actions = [r["action"] for r in fake.requests]
    assert actions == [
        "DescribeZoneInstanceConfigInfos",
        "DescribeImages",
        "InquiryPriceRunInstances",
    ]
    inquiry = fake.requests[-1]
    assert inquiry["region"] == "ap-guangzhou"
    assert inquiry["body"]["InstanceChargeType"] == "POSTPAID_BY_HOUR"
    assert inquiry["body"]["ImageId"] == "img-fake0001"
    # every request was signed by the SDK with the account's key id
    assert all(r["auth"].startswith("TC3-HMAC-SHA256 Credential=AKIDfake/") for r in fake.requests)


def test_tencent_live_when_no_zone_sells_the_type_says_so(fake: FakeCvm, tmp_path: Path) -> None:
    code, doc, err = run("--stack-file", str(stack(tmp_path, "t4x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert doc["live"]["ok"] is False
    assert "no zone sells GN7.2XLARGE32 pay-as-you-go now" in " ".join(problems(err))
    assert doc["hourly"]["on_demand"] == pytest.approx(8.68)  # the bill is still printed


def test_tencent_api_errors_are_reported_in_one_line_not_raised(
    fake: FakeCvm, tmp_path: Path
) -> None:
    fake.selling["GT4.4XLARGE96"] = ["ap-guangzhou-4"]
    fake.error = ("AuthFailure.SignatureFailure", "The provided credentials could not be validated")
    code, doc, err = run("--stack-file", str(stack(tmp_path, "a100x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert doc["live"]["ok"] is False
    assert "InquiryPriceRunInstances: AuthFailure.SignatureFailure" in " ".join(problems(err))
    assert "Traceback" not in err


def test_tencent_live_without_credentials_is_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID", raising=False)
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY", raising=False)
    code, doc, err = run("--stack-file", str(stack(tmp_path, "a100x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert "no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID" in " ".join(problems(err))
    assert doc["live"]["ok"] is False


def test_a_closed_port_is_one_line_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on, on loopback only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDfake")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
    monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", f"127.0.0.1:{port}")
    code, doc, err = run("--stack-file", str(stack(tmp_path, "a100x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert doc["live"]["ok"] is False
    assert "DescribeZoneInstanceConfigInfos" in " ".join(problems(err)) and "Traceback" not in err
