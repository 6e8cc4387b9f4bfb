"""The Azure Retail Prices client against a local fake of the API on 127.0.0.1.

The fake serves pages shaped like the real API's answer (Items, NextPageLink, Count): the
Linux pay-as-you-go row sits on the second page beside Spot, Low Priority and Windows rows,
so the client must follow NextPageLink and pick the right one. Asked for priceType
'Reservation', it serves reservation rows shaped like the published answers (reservationTerm
"1 Year" / "3 Years", unitPrice the total for the term, unitOfMeasure "1 Hour"), the Linux
3-year row on the second page after a Windows one.

Every price here is FAKE (round numbers, easy to check): 3.40/h pay-as-you-go, 17,520 for a
1-year reservation (2.00/h over 8,760 h), 35,040 for 3 years (1.3333/h over 26,280 h).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from infra.clouds.azure.prices import (
    RetailPricesError,
    fetch_items,
    live_azure_price,
    live_azure_reservations,
    pick_linux_on_demand,
    pick_linux_reservations,
    reservation_filter,
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


SIZE = "Standard_NC24ads_A100_v4"


def _reservation(term: str, product: str, total: float, size: str = SIZE) -> dict[str, Any]:
    row = _row(size.removeprefix("Standard_").replace("_", " "), product, total)
    return {**row, "armSkuName": size, "type": "Reservation", "reservationTerm": term}


RESERVATION_PAGES = [
    [
        _reservation("3 Years", "Virtual Machines NCads A100 v4 Series Windows", 52000.0),
        _reservation("1 Year", "Virtual Machines NCads A100 v4 Series", 17520.0),
    ],
    [
        _reservation("1 Year", "Virtual Machines NCads A100 v4 Series Windows", 30000.0),
        _reservation("3 Years", "Virtual Machines NCads A100 v4 Series", 35040.0),
    ],
]

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
    """Serves ``pages`` for any filter, or ``reservation_pages`` when the filter asks for
    priceType 'Reservation'."""

    def __init__(
        self,
        pages: list[list[dict[str, Any]]],
        endless: bool = False,
        reservation_pages: list[list[dict[str, Any]]] | None = None,
    ):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pages, self.endless = pages, endless
        self.reservation_pages = reservation_pages
        self.requests: list[dict[str, Any]] = []

    def pages_for(self, query: dict[str, Any]) -> list[list[dict[str, Any]]]:
        wanted = "priceType eq 'Reservation'" in query.get("$filter", [""])[0]
        if wanted and self.reservation_pages is not None:
            return self.reservation_pages
        return self.pages

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
        pages = self.server.pages_for(query)
        items = pages[page] if page < len(pages) else []
        more = self.server.endless or page + 1 < len(pages)
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
    server = FakeRetailPrices(PAGES, reservation_pages=RESERVATION_PAGES)
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


# --- reservations -----------------------------------------------------------------------------


def test_reservations_follow_next_page_link_and_take_both_linux_terms(fake: FakeRetailPrices):
    assert live_azure_reservations(SIZE, "eastus") == {
        "1y": (17520.0, "USD"),
        "3y": (35040.0, "USD"),  # on the second page, after a Windows row
    }
    assert len(fake.requests) == 2
    sent = [q["$filter"][0] for q in fake.requests]
    assert sent[0] == reservation_filter(SIZE, "eastus")
    assert "priceType eq 'Reservation'" in sent[0] and "Consumption" not in sent[0]


def test_reservation_rows_are_taken_by_term_never_windows_consumption_or_another_size():
    rows = [
        _reservation("1 Year", "Virtual Machines NCads A100 v4 Series Windows", 30000.0),
        _row("NC24ads A100 v4", "Virtual Machines NCads A100 v4 Series", 3.40),  # Consumption
        _reservation("1 Year", "Virtual Machines NCads A100 v4 Series", 9.0, size="Standard_X"),
        _reservation("5 Years", "Virtual Machines NCads A100 v4 Series", 1.0),
        _reservation("3 Years", "Virtual Machines NCads A100 v4 Series", 0.0),
    ]
    assert pick_linux_reservations(rows, SIZE) == {}
    good = _reservation("1 Year", "Virtual Machines NCads A100 v4 Series", 17520.0)
    assert pick_linux_reservations([*rows, good], SIZE) == {"1y": (17520.0, "USD")}


def test_the_reservation_price_is_the_unit_price_the_total_for_the_term():
    # unitOfMeasure says "1 Hour", yet unitPrice is the whole term's price: taken as it is
    row = _reservation("3 Years", "Virtual Machines NCads A100 v4 Series", 35040.0)
    assert row["unitOfMeasure"] == "1 Hour"
    assert pick_linux_reservations([row], SIZE)["3y"][0] == 35040.0


def test_an_answer_without_reservation_rows_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    server = FakeRetailPrices(PAGES, reservation_pages=[[]])
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", server.url)
    for _ in _serve(server):
        with pytest.raises(RetailPricesError, match="no Linux reservation price"):
            live_azure_reservations(SIZE, "eastus")


def test_an_unreachable_api_is_a_clear_error_for_reservations_too():
    # the autouse fixture points the API at a closed port on 127.0.0.1
    with pytest.raises(RetailPricesError, match="Azure Retail Prices API"):
        live_azure_reservations(SIZE, "eastus")
