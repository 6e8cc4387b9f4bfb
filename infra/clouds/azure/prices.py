"""Azure's public Retail Prices API (no account, no key): one instance size's pay-as-you-go
Linux price per hour in a region, and its 1- and 3-year reservation prices.

https://prices.azure.com/api/retail/prices takes an OData ``$filter`` and answers pages of
``Items`` with a ``NextPageLink`` to the next page. GPUFLEET_AZURE_PRICES_URL points the
client elsewhere (the tests: a local fake on 127.0.0.1); pages are bounded.

Spot VMs have meters of their own in the same Consumption answer: rows whose ``skuName``
(and ``meterName``) end in " Spot", Linux where the productName does not end in
"Windows", beside " Low Priority" rows (the older low-priority VMs, not spot); public
recorded answers of the API show the three side by side (e.g. "D2s v5", "D2s v5 Spot",
"D2s v5 Low Priority" of "Virtual Machines Dv5 Series", read 2026-12-05).
:func:`live_spot` reads them for ``make refresh-prices``.

Reservation items (``type: "Reservation"``) carry ``reservationTerm`` ("1 Year", "3 Years")
and a ``unitPrice`` that is the total for the whole term, although their ``unitOfMeasure``
reads "1 Hour" (published answers: Standard_D8_v4 in westeurope is 0.46/h pay-as-you-go,
2377 for one year, 4594 for three). A reservation covers the VM's compute only: the
Linux rows are the ones to take.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.live import LivePriceError, PriceNotFound, Terms

DEFAULT_URL = "https://prices.azure.com/api/retail/prices"
URL_ENV = "GPUFLEET_AZURE_PRICES_URL"
# The catalog's [sources] key for this API: a price refreshed from it carries it.
SOURCE = "AZ-RETAIL"
MAX_PAGES = 10  # one size in one region is a handful of rows: more means a bad filter
TIMEOUT_S = 15.0


class RetailPricesError(LookupError):
    """The API could not answer (transport, format) or had no matching price."""


class NoRetailPrice(RetailPricesError):
    """The API answered, without a matching price."""


def retail_filter(size: str, region: str) -> str:
    """Virtual Machines, this ARM size, this region, hourly consumption prices."""
    return (
        "serviceName eq 'Virtual Machines' "
        f"and armSkuName eq '{size}' "
        f"and armRegionName eq '{region}' "
        "and priceType eq 'Consumption'"
    )


def reservation_filter(size: str, region: str) -> str:
    """Virtual Machines, this ARM size, this region, reservation (whole-term) prices."""
    return (
        "serviceName eq 'Virtual Machines' "
        f"and armSkuName eq '{size}' "
        f"and armRegionName eq '{region}' "
        "and priceType eq 'Reservation'"
    )


def first_page_url(
    size: str, region: str, base: str | None = None, odata_filter: str | None = None
) -> str:
    query = urllib.parse.urlencode({"$filter": odata_filter or retail_filter(size, region)})
    return f"{base or os.environ.get(URL_ENV) or DEFAULT_URL}?{query}"


# The API's reservationTerm values -> the cost model's term keys.
RESERVATION_TERMS = {"1 Year": "1y", "3 Years": "3y"}


def pick_linux_on_demand(items: Sequence[Mapping[str, Any]]) -> tuple[float, str]:
    """The pay-as-you-go Linux row: not Spot, not Low Priority, not Windows, per hour."""
    for item in items:
        product = str(item.get("productName", ""))
        sku = str(item.get("skuName", ""))
        if "Windows" in product or "Spot" in sku or "Low Priority" in sku:
            continue
        if str(item.get("unitOfMeasure", "")) != "1 Hour":
            continue
        price = item.get("retailPrice", item.get("unitPrice"))
        if isinstance(price, int | float) and price > 0:
            return float(price), str(item.get("currencyCode") or "USD")
    raise NoRetailPrice("no pay-as-you-go Linux hourly price in the answer")


def pick_linux_reservations(
    items: Sequence[Mapping[str, Any]], size: str
) -> dict[str, tuple[float, str]]:
    """term key ("1y", "3y") -> (total for the whole term, currency) from the Linux
    reservation rows of ``size``; a term the answer lacks is absent. Windows rows are
    skipped (a reservation covers the compute; Windows software is billed apart)."""
    found: dict[str, tuple[float, str]] = {}
    for item in items:
        if str(item.get("type", "")) != "Reservation":
            continue
        if str(item.get("armSkuName", size)) != size:
            continue
        product, sku = str(item.get("productName", "")), str(item.get("skuName", ""))
        if "Windows" in product or "Spot" in sku or "Low Priority" in sku:
            continue
        term = RESERVATION_TERMS.get(str(item.get("reservationTerm", "")))
        price = item.get("unitPrice", item.get("retailPrice"))
        if term is None or isinstance(price, bool) or not isinstance(price, int | float):
            continue
        if price <= 0:
            continue
        currency = str(item.get("currencyCode") or "USD")
        # several rows for one term (other meters of the same size): the lowest is the offer
        if term not in found or float(price) < found[term][0]:
            found[term] = (float(price), currency)
    return found


def fetch_items(url: str, max_pages: int = MAX_PAGES) -> list[Mapping[str, Any]]:
    items: list[Mapping[str, Any]] = []
    next_url: str | None = url
    for _ in range(max_pages):
        if not next_url:
            return items
        try:
            with urllib.request.urlopen(next_url, timeout=TIMEOUT_S) as response:
                page = json.load(response)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise RetailPricesError(f"Azure Retail Prices API: {exc}") from None
        except json.JSONDecodeError:
            raise RetailPricesError("Azure Retail Prices API: the answer is not JSON") from None
        if not isinstance(page, Mapping) or not isinstance(page.get("Items"), list):
            raise RetailPricesError("Azure Retail Prices API: no Items in the answer")
        items.extend(i for i in page["Items"] if isinstance(i, Mapping))
        link = page.get("NextPageLink")
        next_url = str(link) if link else None
    if next_url:
        raise RetailPricesError(
            f"Azure Retail Prices API: still more pages after {max_pages}: the filter is too wide"
        )
    return items


def pick_linux_spot(items: Sequence[Mapping[str, Any]]) -> tuple[float, float, str]:
    """(lowest, highest, currency) of the Linux Spot rows per hour; NoRetailPrice if none."""
    found: list[float] = []
    currency = "USD"
    for item in items:
        product = str(item.get("productName", ""))
        sku = str(item.get("skuName", "") or item.get("meterName", ""))
        if "Windows" in product or not sku.endswith(" Spot"):
            continue
        if str(item.get("unitOfMeasure", "")) != "1 Hour":
            continue
        if str(item.get("type", "Consumption")) != "Consumption":
            continue
        price = item.get("retailPrice", item.get("unitPrice"))
        if isinstance(price, int | float) and not isinstance(price, bool) and price > 0:
            found.append(float(price))
            currency = str(item.get("currencyCode") or currency)
    if not found:
        raise NoRetailPrice("no Linux Spot hourly price in the answer")
    return min(found), max(found), currency


def live_spot(size: str, region: str) -> tuple[float, float, str]:
    """The size's Linux Spot price per hour in ``region`` as (low, high, currency): one
    meter, so low == high. Raises PriceNotFound when the answer has no Spot row."""
    try:
        return pick_linux_spot(fetch_items(first_page_url(size, region)))
    except NoRetailPrice as exc:
        raise PriceNotFound(f"Azure Retail Prices API: {exc} for {size} in {region}") from None
    except RetailPricesError as exc:
        raise LivePriceError(str(exc)) from None


# The catalog's [sources] key a refreshed spot range carries: the same API.
SPOT_SOURCE = SOURCE


def live_azure_price(size: str, region: str) -> tuple[float, str]:
    return pick_linux_on_demand(fetch_items(first_page_url(size, region)))


def live_azure_reservations(size: str, region: str) -> dict[str, tuple[float, str]]:
    """Both terms' totals for one VM of ``size`` in ``region`` (a term may be missing);
    RetailPricesError when the answer holds none."""
    url = first_page_url(size, region, odata_filter=reservation_filter(size, region))
    found = pick_linux_reservations(fetch_items(url), size)
    if not found:
        raise RetailPricesError("no Linux reservation price in the answer")
    return found


def live_price(size: str, region: str) -> tuple[float, str]:
    try:
        return live_azure_price(size, region)
    except NoRetailPrice as exc:
        raise PriceNotFound(f"{exc} for {size} in {region}") from None
    except RetailPricesError as exc:
        raise LivePriceError(f"{exc} for {size} in {region}") from None


def live_reservations(size: str, region: str) -> tuple[Terms, str]:
    try:
        return live_azure_reservations(size, region), "Azure Retail Prices API"
    except RetailPricesError as exc:
        raise LivePriceError(f"{exc} for {size} in {region}") from None
