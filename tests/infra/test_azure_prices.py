"""The Azure Retail Prices client against a local fake of the API on 127.0.0.1.

The fake serves pages shaped like the real API's answer (Items, NextPageLink, Count): the
Linux pay-as-you-go row sits on the second page beside Spot, Low Priority and Windows rows,
so the client must follow NextPageLink and pick the right one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from infra.azure_prices import (
    RetailPricesError,
    fetch_items,
    live_azure_price,
    pick_linux_on_demand,
    retail_filter,
)

pytestmark = pytest.mark.integration


def _row(sku: str, product: str, price: float, unit: str = "1 Hour") -> dict[str, Any]:
    return {
        "currencyCode": "USD",
        "retailPrice": price,
        "unitPrice": price,
        "armRegionName": "eastus",
        "armSkuName": "Standard_NC24ads_A100_v4",
        "serviceName": "Virtual Machines",
        "productName": product,
        "skuName": sku,
        "unitOfMeasure": unit,
        "type": "Consumption",
    }


PAGES = [
    [
        _row("NC24ads A100 v4 Spot", "Virtual Machines NCads A100 v4 Series", 0.51),
        _row("NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series Windows", 4.02),
    ],
    [
        _row("NC24ads A100 v4 Low Priority", "Virtual Machines NCads A100 v4 Series", 0.73),
        _row("NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series", 3.40),
    ],
]


class FakeRetailPrices(ThreadingHTTPServer):
    def __init__(self, pages: list[list[dict[str, Any]]], endless: bool = False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pages, self.endless = pages, endless
        self.requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/retail/prices"


class _Handler(BaseHTTPRequestHandler):
    server: FakeRetailPrices

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        self.server.requests.append(query)
        page = int(query.get("page", ["0"])[0])
        items = self.server.pages[page] if page < len(self.server.pages) else []
        more = self.server.endless or page + 1 < len(self.server.pages)
        link = None
        if more:
            link = (
                f"{self.server.url}?{urlparse(self.path).query.split('&page=')[0]}&page={page + 1}"
            )
        body = json.dumps(
            {
                "BillingCurrency": "USD",
                "CustomerEntityId": "Default",
                "CustomerEntityType": "Retail",
                "Items": items,
                "NextPageLink": link,
                "Count": len(items),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(server: FakeRetailPrices) -> Iterator[FakeRetailPrices]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRetailPrices]:
    server = FakeRetailPrices(PAGES)
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", server.url)
    yield from _serve(server)


def test_the_client_follows_next_page_link_to_the_linux_pay_as_you_go_row(
    fake: FakeRetailPrices,
):
    assert live_azure_price("Standard_NC24ads_A100_v4", "eastus") == (3.40, "USD")
    assert len(fake.requests) == 2
    assert fake.requests[0]["$filter"][0] == retail_filter("Standard_NC24ads_A100_v4", "eastus")


def test_an_unreachable_api_is_a_clear_error_not_a_traceback():
    # the autouse fixture points the API at a closed port on 127.0.0.1
    with pytest.raises(RetailPricesError, match="Azure Retail Prices API"):
        live_azure_price("Standard_NC4as_T4_v3", "eastus")


def test_pagination_is_bounded_when_the_api_never_stops_linking(
    monkeypatch: pytest.MonkeyPatch,
):
    server = FakeRetailPrices([[]], endless=True)
    for running in _serve(server):
        with pytest.raises(RetailPricesError, match="still more pages after 3"):
            fetch_items(running.url + "?x=1", max_pages=3)
        assert len(running.requests) == 3


def test_spot_low_priority_windows_and_non_hourly_rows_are_never_taken():
    rows = [
        _row("X Spot", "Virtual Machines X Series", 0.1),
        _row("X Low Priority", "Virtual Machines X Series", 0.2),
        _row("X", "Virtual Machines X Series Windows", 0.3),
        _row("X", "Virtual Machines X Series", 9.0, unit="1 Month"),
    ]
    with pytest.raises(RetailPricesError, match="no pay-as-you-go Linux hourly price"):
        pick_linux_on_demand(rows)
    assert pick_linux_on_demand([*rows, _row("X", "Virtual Machines X Series", 1.5)]) == (
        1.5,
        "USD",
    )
