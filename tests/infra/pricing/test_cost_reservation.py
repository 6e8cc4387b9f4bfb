"""Reservations in the cost model: a commitment for a whole term, priced against pay-as-you-go.

The numbers here are made up to be easy to check by hand (not real Azure prices): a VM at
4.00/h pay-as-you-go, a 1-year reservation of 17,520 for the term (8,760 h: 2.00/h).
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

import pytest

from infra.catalog import CatalogError, load_catalog
from infra.pricing.cost import (
    CostError,
    CostInputs,
    ReservationCost,
    ReservationQuote,
    catalog_reservation_quote,
    check_cost_inputs,
    estimate_cost,
    term_words,
)
from infra.pricing.price_sheet import Pricing, load_pricing, parse_pricing, shipped_pricing_data

TODAY = dt.date(2026, 12, 1)
SIZE = "Standard_NC24ads_A100_v4"  # catalog: 3.673 USD/h pay-as-you-go (SCAZ 2024-06-01)


def _cost(**kw: Any) -> ReservationCost:
    base: dict[str, Any] = {
        "term": "1y",
        "months": 12,
        "term_hours": 8760.0,
        "nodes": 1,
        "total": 17520.0,
        "payg_hourly": 4.0,
        "run_hours": 200.0,
        "month_hours": 730.0,
        "date": TODAY,
        "source": "test",
        "estimate": False,
        "live": False,
        "payg_source": "test",
        "bought_with": "a shop",
        "covers": "compute only",
    }
    return ReservationCost(**{**base, **kw})


def test_the_effective_rate_is_the_terms_total_over_the_terms_hours():
    r = _cost()
    assert r.effective_hourly == pytest.approx(2.0)  # 17,520 / 8,760
    assert r.per_month == pytest.approx(1460.0)  # 17,520 / 12
    assert r.saving_at_full_use == pytest.approx(0.5)


def test_break_even_is_the_share_of_the_term_the_vm_must_run_to_beat_pay_as_you_go():
    r = _cost()
    # 2.00 reserved / 4.00 pay-as-you-go: the VM must run half of the term's hours
    assert r.break_even_utilisation == pytest.approx(0.5)
    assert r.break_even_hours_per_month == pytest.approx(365.0)
    # 3-year: 26,280 h for 35,040 -> 1.3333/h, a third of 4.00 -> 243.3 h a month
    three = _cost(term="3y", months=36, term_hours=26280.0, total=35040.0)
    assert three.effective_hourly == pytest.approx(4 / 3)
    assert three.break_even_utilisation == pytest.approx(1 / 3)
    assert three.break_even_hours_per_month == pytest.approx(730 / 3)


def test_the_whole_month_is_owed_and_unused_reserved_hours_are_lost():
    r = _cost(run_hours=200.0)
    assert r.run_share == pytest.approx(400.0)  # 200 h at 2.00
    assert r.unused_per_month == pytest.approx(1060.0)  # 1,460 owed - 400 used
    assert r.payg_month == pytest.approx(800.0)  # the same 200 h at 4.00: cheaper
    full = _cost(run_hours=730.0)
    assert full.unused_per_month == pytest.approx(0.0)
    assert full.per_month < full.payg_month  # 1,460 against 2,920


def test_the_json_form_carries_the_figures_and_says_it_is_bought_separately():
    doc = _cost(nodes=2, total=35040.0, payg_hourly=8.0).to_json()
    assert doc["committed"] == doc["total"] == 35040.0
    assert doc["effective_hourly"] == 4.0
    assert doc["break_even"] == {"utilisation": 0.5, "hours_per_month": 365.0}
    assert doc["run_share_per_month"] == 800.0 and doc["unused_per_month"] == 2120.0
    assert doc["bought_separately"] is True


def test_terms_are_named_in_years():
    assert term_words("1y") == "1-year" and term_words("3y") == "3-year"


# --- estimate_cost ----------------------------------------------------------------------------


def _quote(**kw: Any) -> ReservationQuote:
    return ReservationQuote(**{"term": "1y", "total": 17520.0, "date": TODAY, "source": "X", **kw})


def test_a_quote_is_priced_for_every_node_against_the_catalogs_pay_as_you_go():
    est = estimate_cost(
        CostInputs("azure", SIZE, nodes=2, reservation="1y", hours_per_month=200),
        today=TODAY,
        reservation_quote=_quote(),
    )
    r = est.reservation
    assert r is not None
    assert r.total == pytest.approx(35040.0)
    assert r.effective_hourly == pytest.approx(4.0)  # both nodes
    assert r.payg_hourly == pytest.approx(2 * 3.673)
    assert r.break_even_utilisation == pytest.approx(2.0 / 3.673)
    assert r.run_hours == 200
    assert "SCAZ" in r.payg_source
    # the rest of the bill is the pay-as-you-go one the stack deploys
    plain = estimate_cost(CostInputs("azure", SIZE, nodes=2, hours_per_month=200), today=TODAY)
    assert est.hourly == plain.hourly and est.storage == plain.storage


def test_a_live_quote_is_compared_with_the_live_pay_as_you_go_price_when_it_has_one():
    est = estimate_cost(
        CostInputs("azure", SIZE, reservation="1y"),
        today=TODAY,
        reservation_quote=_quote(live=True, payg_node_hour=4.0, payg_source="live, eastus"),
    )
    assert est.reservation is not None
    assert est.reservation.break_even_utilisation == pytest.approx(0.5)
    assert est.reservation.payg_source == "live, eastus"
    assert est.reservation.live
    assert not any("reservation" in w for w in est.warnings)


def test_a_live_quote_against_the_catalogs_pay_as_you_go_says_so():
    est = estimate_cost(
        CostInputs("azure", SIZE, reservation="1y"),
        today=TODAY,
        reservation_quote=_quote(live=True),
    )
    assert any("against the catalog's pay-as-you-go price" in w for w in est.warnings)


def test_reservations_convert_at_the_dated_rate_like_the_rest_of_the_bill():
    est = estimate_cost(
        CostInputs("azure", SIZE, reservation="1y"),
        currency="CNY",
        today=TODAY,
        reservation_quote=_quote(),
    )
    assert est.reservation is not None
    assert est.reservation.total == pytest.approx(17520.0 * 7.15)
    assert est.reservation.break_even_utilisation == pytest.approx(2.0 / 3.673)


def test_without_a_catalog_quote_an_offline_reservation_names_the_size_and_live():
    with pytest.raises(CostError) as exc:
        estimate_cost(CostInputs("azure", SIZE, reservation="3y"), today=TODAY)
    assert exc.value.problems == [
        f"azure {SIZE}: the catalog carries no dated 3-year reservation price; "
        "add --live to fetch it from Azure's Retail Prices API (no account needed)"
    ]


def test_the_shipped_catalog_carries_no_reservation_price_for_any_azure_size():
    # none was found in a dated public source (2026-12): none is made up
    res = load_pricing().providers["azure"].reservations
    assert res is not None and res.terms == ("1y", "3y") and dict(res.quotes) == {}
    assert catalog_reservation_quote("azure", SIZE, "1y") is None


@pytest.mark.parametrize("provider", ["aws", "alicloud", "tencent"])
def test_a_cloud_whose_catalog_sells_no_reservations_is_refused_in_one_line(provider: str):
    it = next(i for (p, _), i in load_catalog().instances.items() if p == provider and i.price)
    with pytest.raises(CostError) as exc:
        check_cost_inputs(CostInputs(provider, it.name, reservation="1y"))
    assert exc.value.problems == [
        f"{provider} sells no reservations through this tool (its catalog file, "
        f"infra/clouds/{provider}/catalog.toml, has no [pricing.reservations])"
    ]


def test_a_reservation_on_spot_billing_is_refused_because_it_discounts_pay_as_you_go():
    with pytest.raises(CostError) as exc:
        check_cost_inputs(CostInputs("azure", SIZE, billing="spot", reservation="1y"))
    assert exc.value.problems == [
        "azure reservations discount on-demand VMs, not spot: set billing to on-demand "
        "(the reservation is bought separately)"
    ]


def test_an_unknown_term_is_refused_with_the_known_ones():
    with pytest.raises(CostError, match=r"reservation term '5y' is unknown: use one of 1y, 3y"):
        check_cost_inputs(CostInputs("azure", SIZE, reservation="5y"))


def test_a_reservation_problem_is_reported_with_the_others():
    with pytest.raises(CostError) as exc:
        check_cost_inputs(CostInputs("azure", SIZE, nodes=0, billing="spot", reservation="1y"))
    assert len(exc.value.problems) == 2


def test_the_json_has_a_reservation_key_only_when_one_is_asked_for():
    plain = estimate_cost(CostInputs("azure", SIZE), today=TODAY).to_json()
    assert "reservation" not in plain
    asked = estimate_cost(
        CostInputs("azure", SIZE, reservation="1y"), today=TODAY, reservation_quote=_quote()
    ).to_json()
    assert asked["reservation"]["term"] == "1y"
    assert asked["billing"] == "on-demand"  # the VMs stay pay-as-you-go


# --- the catalog's [pricing.reservations] -----------------------------------------------------


@pytest.fixture
def raw() -> dict[str, Any]:
    return copy.deepcopy(shipped_pricing_data())


def _parse(data: dict[str, Any]) -> Pricing:
    return parse_pricing(data, load_catalog())


def test_a_dated_catalog_quote_prices_the_reservation_offline(raw: dict[str, Any]):
    raw["azure"]["reservations"]["quotes"] = {
        SIZE: {"1y": {"total": 17520.0, "date": "2026-11-01", "source": "MEM", "estimate": True}}
    }
    prc = _parse(raw)
    est = estimate_cost(CostInputs("azure", SIZE, reservation="1y"), pricing=prc, today=TODAY)
    assert est.reservation is not None and est.reservation.total == pytest.approx(17520.0)
    assert est.reservation.estimate
    assert any("1-year reservation: an estimate (MEM)" in w for w in est.warnings)
    with pytest.raises(CostError, match="no dated 3-year reservation price"):
        estimate_cost(CostInputs("azure", SIZE, reservation="3y"), pricing=prc, today=TODAY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(terms=["2y"]), "terms: use some of 1y, 3y"),
        (lambda r: r.update(discounts="spot-ish"), "is not a billing it sells"),
        (lambda r: r.update(source="NOPE"), "is not in sources.toml"),
        (lambda r: r.update(colour="blue"), "unknown keys"),
        (lambda r: r.pop("bought_with"), "bought_with required"),
        (
            lambda r: r.update(quotes={"Standard_X": {"1y": {}}}),
            "unknown type 'Standard_X'",
        ),
        (
            lambda r: r.update(
                terms=["1y"],
                quotes={SIZE: {"3y": {"total": 1, "date": "2026-01-01", "source": "MEM"}}},
            ),
            "terms ['3y'] are not in terms",
        ),
    ],
)
def test_bad_reservation_data_is_a_catalog_error(raw: dict[str, Any], change: Any, message: str):
    change(raw["azure"]["reservations"])
    with pytest.raises(CatalogError, match=re.escape(message)):
        _parse(raw)
