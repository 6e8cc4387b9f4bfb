"""`cost.py --live` against local fakes of the two price APIs, over real HTTP on 127.0.0.1.

moto 5.2.5 does not implement the AWS Price List service (no `pricing` backend), so the AWS side
is a small fake speaking its JSON 1.1 protocol (X-Amz-Target: AWSPriceListService.GetProducts),
driven by the real boto3 client through AWS_ENDPOINT_URL_PRICING. No Alibaba Cloud emulator
exists either: the Alicloud side is a fake DescribePrice answered to the official ECS SDK.
"""

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
from urllib.parse import parse_qs, urlparse

import pytest

from tests.support.stderr import problems

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpufleet_cost_cli_live", REPO / "scripts/cost.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = _load()


def _product(instance_type: str, location: str, usd: str) -> str:
    sku = "FAKESKU" + instance_type.replace(".", "")
    return json.dumps(
        {
            "product": {
                "sku": sku,
                "attributes": {"instanceType": instance_type, "location": location},
            },
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                            }
                        }
                    }
                }
            },
        }
    )


class FakeApis(ThreadingHTTPServer):
    """Answers GetProducts (AWS JSON 1.1) and DescribePrice (Alibaba RPC) from fixed tables."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.aws_prices: dict[tuple[str, str], str] = {}
        self.ali_prices: dict[tuple[str, str], float] = {}
        self.requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApis

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict[str, Any], ctype: str = "application/json") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        target = self.headers.get("X-Amz-Target")
        if target:
            return self._aws(target, json.loads(raw or b"{}"))
        action = self.headers.get("x-acs-action")
        if action:
            query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            return self._alicloud(action, query)
        self._reply(400, {"message": "neither an AWS nor an Alibaba Cloud request"})

    def _aws(self, target: str, body: dict[str, Any]) -> None:
        self.server.requests.append({"api": "aws", "target": target, "body": body})
        if target != "AWSPriceListService.GetProducts":
            return self._reply(400, {"__type": "InvalidParameterException", "Message": target})
        filters = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        # First page empty with a token: the client must follow NextToken to find the price.
        if "NextToken" not in body:
            return self._reply(200, {"FormatVersion": "aws_v1", "PriceList": [], "NextToken": "p2"})
        key = (filters.get("instanceType", ""), filters.get("location", ""))
        usd = self.server.aws_prices.get(key)
        items = [_product(key[0], key[1], usd)] if usd else []
        self._reply(200, {"FormatVersion": "aws_v1", "PriceList": items})

    def _alicloud(self, action: str, query: dict[str, str]) -> None:
        self.server.requests.append({"api": "alicloud", "action": action, "query": query})
        if action != "DescribePrice":
            return self._reply(400, {"Code": "InvalidAction", "Message": action})
        key = (query.get("RegionId", ""), query.get("InstanceType", ""))
        price = self.server.ali_prices.get(key)
        if price is None:
            return self._reply(
                404, {"Code": "InvalidInstanceType.NotFound", "Message": "no such type"}
            )
        self._reply(
            200,
            {
                "RequestId": "fake-1",
                "PriceInfo": {
                    "Price": {
                        "Currency": "CNY",
                        "OriginalPrice": price + 1.2,
                        "TradePrice": price + 1.2,
                        "DetailInfos": {
                            "DetailInfo": [
                                {"Resource": "instanceType", "TradePrice": price},
                                {"Resource": "systemDisk", "TradePrice": 1.2},
                            ]
                        },
                    },
                    "Rules": {"Rule": []},
                },
            },
        )


@pytest.fixture
def fake() -> Iterator[FakeApis]:
    server = FakeApis()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def stack(tmp_path: Path, provider: str, tier: str) -> Path:
    path = tmp_path / f"Pulumi.{tier}.yaml"
    path.write_text(
        "config:\n"
        f"  gpufleet:provider: {provider}\n"
        f"  gpufleet:tier: {tier}\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    return path


def run(*argv: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*argv, "--json"], out=out, err=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_aws_live_price_comes_from_get_products_and_the_gap_is_reported(
    fake: FakeApis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    fake.aws_prices[("p4d.24xlarge", "US East (N. Virginia)")] = "19.9618000000"
    code, doc, err = run("--stack-file", str(stack(tmp_path, "aws", "a100x8")), "--live")
    assert code == 0, err
    live = doc["live"]
    assert live["ok"] is True
    assert live["live"] == pytest.approx(19.9618)
    assert live["off"] == pytest.approx((21.958 - 19.9618) / 19.9618, abs=1e-4)
    assert "10.0% above the live price" in live["message"]
    calls = [r for r in fake.requests if r["api"] == "aws"]
    assert len(calls) == 2  # followed NextToken
    sent = {f["Field"]: f["Value"] for f in calls[0]["body"]["Filters"]}
    assert calls[0]["body"]["ServiceCode"] == "AmazonEC2"
    assert sent["instanceType"] == "p4d.24xlarge"
    assert sent["location"] == "US East (N. Virginia)"
    assert sent["tenancy"] == "Shared" and sent["operatingSystem"] == "Linux"


def test_aws_live_with_no_matching_product_says_so_and_still_prints_the_bill(
    fake: FakeApis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    code, doc, err = run("--stack-file", str(stack(tmp_path, "aws", "t4x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert doc["live"]["ok"] is False and "no on-demand hourly USD price" in " ".join(problems(err))
    assert doc["hourly"]["on_demand"] == pytest.approx(0.526)


def test_aws_live_without_credentials_is_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, doc, err = run("--stack-file", str(stack(tmp_path, "aws", "t4x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    (line,) = problems(err)  # the JSON's message is the whole of it, on one line
    assert "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID" in line
    assert doc["live"] == {"ok": False, "message": line.split("--live: ", 1)[1]}


def test_alicloud_live_price_comes_from_describe_price(
    fake: FakeApis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIfake")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", fake.url.removeprefix("http://"))
    fake.ali_prices[("cn-shanghai", "ecs.gn7-c13g1.13xlarge")] = 118.0
    code, doc, err = run("--stack-file", str(stack(tmp_path, "alicloud", "a100x4")), "--live")
    assert code == 0, err
    assert doc["live"]["live"] == pytest.approx(118.0)  # the instance line, not the disk total
    assert doc["live"]["currency"] == "CNY"
    assert "7.1% above the live price" in doc["live"]["message"]  # 126.33 vs 118
    (call,) = [r for r in fake.requests if r["api"] == "alicloud"]
    assert call["query"]["InstanceType"] == "ecs.gn7-c13g1.13xlarge"
    assert call["query"]["PriceUnit"] == "Hour" and call["query"]["ResourceType"] == "instance"


def test_alicloud_live_without_credentials_is_a_clear_message(tmp_path: Path):
    code, doc, err = run("--stack-file", str(stack(tmp_path, "alicloud", "a100x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert "no Alibaba Cloud credentials: set ALIBABA_CLOUD_ACCESS_KEY_ID" in " ".join(
        problems(err)
    )
    assert doc["live"]["ok"] is False


def test_alicloud_api_errors_are_reported_not_raised(
    fake: FakeApis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIfake")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", fake.url.removeprefix("http://"))
    code, doc, err = run("--stack-file", str(stack(tmp_path, "alicloud", "a100x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert "DescribePrice" in " ".join(problems(err)) and doc["live"]["ok"] is False
