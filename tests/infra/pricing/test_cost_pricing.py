"""pricing.toml: every figure dated and sourced, cross-checked against the catalog on load."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from infra.catalog import CatalogError, load_catalog
from infra.pricing.compare import compare_tier
from infra.pricing.cost import CostError, CostInputs, estimate_cost, hourly_estimate
from infra.pricing.price_sheet import Pricing, load_pricing, parse_pricing, shipped_pricing_data

TODAY = dt.date(2026, 11, 29)


@pytest.fixture
def raw() -> dict[str, Any]:
    return shipped_pricing_data()


def parse(data: dict[str, Any]) -> Pricing:
    return parse_pricing(data, load_catalog())


def test_the_shipped_pricing_loads_and_covers_what_the_issue_lists():
    p = load_pricing()
    assert set(p.providers["aws"].block) >= {"gp3", "io2"}
    assert set(p.providers["alicloud"].block) >= {"PL0", "PL1", "PL2", "PL3", "cloud_efficiency"}
    assert set(p.providers["aws"].bucket) >= {"STANDARD", "GLACIER_IR", "DEEP_ARCHIVE"}
    assert set(p.providers["alicloud"].bucket) >= {"Standard", "IA", "Archive", "ColdArchive"}
    assert p.providers["alicloud"].subscription is not None
    assert p.providers["aws"].subscription is None
    assert p.fx_rate("USD", "CNY")[0] == pytest.approx(7.15)
    assert p.fx_rate("CNY", "USD")[0] == pytest.approx(1 / 7.15)


def test_every_pricing_figure_names_a_known_source_and_a_date():
    p = load_pricing()
    sources = load_catalog().sources
    rates = [p.spot_band_rate, *p.fx.values()]
    for pp in p.providers.values():
        rates += [*pp.block.values(), *pp.bucket.values(), pp.egress.rate, pp.snapshot]
        if pp.subscription:
            rates += [pp.subscription.yearly, *pp.subscription.monthly.values()]
            if pp.subscription.monthly_factor is not None:
                rates.append(pp.subscription.monthly_factor)
    assert rates
    for r in rates:
        assert r.source in sources
        assert dt.date(2020, 1, 1) <= r.date <= dt.date.today()  # never dated in the future


def test_figures_from_memory_are_marked_as_estimates(raw: dict[str, Any]):
    p = parse(raw)
    for pp in p.providers.values():
        for r in [*pp.block.values(), *pp.bucket.values(), pp.egress.rate, pp.snapshot]:
            if r.source == "MEM":
                assert r.estimate, f"{pp.provider}: a MEM figure must say estimate = true"


def test_an_unknown_source_key_is_a_catalog_error(raw: dict[str, Any]):
    bad = copy.deepcopy(raw)
    bad["aws"]["block"]["gp3"]["source"] = "BLOG"
    with pytest.raises(CatalogError, match=r"pricing\.aws\.block\.gp3: source 'BLOG'"):
        parse(bad)


def test_a_missing_date_or_negative_price_is_a_catalog_error(raw: dict[str, Any]):
    undated = copy.deepcopy(raw)
    del undated["alicloud"]["snapshot"]["date"]
    with pytest.raises(CatalogError, match="'date' is required"):
        parse(undated)
    negative = copy.deepcopy(raw)
    negative["aws"]["egress"]["per_gb"] = -0.09
    with pytest.raises(CatalogError, match="must be a number >= 0"):
        parse(negative)


def test_a_currency_that_disagrees_with_the_catalog_is_refused(raw: dict[str, Any]):
    bad = copy.deepcopy(raw)
    bad["alicloud"]["currency"] = "USD"
    with pytest.raises(CatalogError, match="differs from the catalog's 'CNY'"):
        parse(bad)


def test_a_provider_section_is_required_for_every_catalog_provider(raw: dict[str, Any]):
    bad = copy.deepcopy(raw)
    del bad["alicloud"]
    with pytest.raises(CatalogError, match=r"no \[pricing\] table in clouds/alicloud/catalog.toml"):
        parse(bad)


def test_the_shipped_monthly_quotes_are_the_ach_figures_not_one_factor():
    p = load_pricing()
    cat = load_catalog()
    sub = p.providers["alicloud"].subscription
    assert sub is not None and sub.monthly_factor is None  # no guessed discount any more
    a100x4_name = "ecs.gn7-c13g1.13xlarge"
    assert sub.monthly[a100x4_name].amount == 60640
    # the quotes over on-demand x 730 h: 0.658 for gn7/gn7e/ebmgn7e/gn7i, 0.394 for gn6v/gn6i
    for name, quote in sub.monthly.items():
        price = cat.instance("alicloud", name).price
        assert price is not None and quote.source == "ACH"
        ratio = quote.amount / (price.on_demand * 730)
        family = name.split(".")[1].split("-")[0]
        want = 0.394 if family in ("gn6v", "gn6i") else 0.658
        assert ratio == pytest.approx(want, abs=0.002), name
    # the old 0.45 factor priced a100x4 32 % under its quote (126.33 x 730 x 0.45 = 41,499)
    a100x4 = cat.instance("alicloud", "ecs.gn7-c13g1.13xlarge").price
    assert a100x4 is not None
    old = a100x4.on_demand * 730 * 0.45
    assert old / sub.monthly[a100x4_name].amount == pytest.approx(0.684, abs=0.001)


def test_a_type_without_a_quote_has_no_subscription_unless_a_factor_is_given(
    raw: dict[str, Any],
):
    unquoted = copy.deepcopy(raw)
    del unquoted["alicloud"]["subscription"]["monthly"]["ecs.gn7-c12g1.3xlarge"]
    p = parse(unquoted)
    inputs = CostInputs("alicloud", "ecs.gn7-c12g1.3xlarge", billing="subscription")
    with pytest.raises(
        CostError,
        match=r"no subscription quote: .*\[pricing\.subscription\.monthly\] in .*clouds/alicloud",
    ):
        estimate_cost(inputs, pricing=p, today=TODAY)
    offers = compare_tier("a100x1", currency="CNY", pricing=p, today=TODAY).offers
    ali = [o for o in offers if o.provider == "alicloud"]
    assert ali and not any(o.billing.startswith("subscription") for o in ali)
    unquoted["alicloud"]["subscription"].update(monthly_factor=0.5)
    e = estimate_cost(inputs, pricing=parse(unquoted), today=TODAY)
    assert e.subscription_month == pytest.approx(31.58 * 730 * 0.5)
    assert e.subscription_estimated


def test_a_quoted_monthly_price_wins_over_a_factor_estimate(raw: dict[str, Any]):
    quoted = copy.deepcopy(raw)
    quoted["alicloud"]["subscription"]["monthly_factor"] = 0.3
    quoted["alicloud"]["subscription"]["monthly"] = {
        "ecs.gn7-c12g1.3xlarge": {"price": 9000.0, "date": "2026-11-20", "source": "AC"}
    }
    p = parse(quoted)
    e = estimate_cost(
        CostInputs("alicloud", "ecs.gn7-c12g1.3xlarge", billing="subscription", root_disk_gb=0),
        pricing=p,
        today=TODAY,
    )
    assert e.subscription_month == pytest.approx(9000.0)
    assert e.break_even is not None
    assert e.break_even.hours_per_month == pytest.approx(9000.0 / 31.58)
    assert not any("subscription: an estimate" in w for w in e.warnings)
    assert e.to_json()["subscription"]["estimated"] is False
    assert (
        hourly_estimate(
            "alicloud", "ecs.gn7-c12g1.3xlarge", billing="subscription", pricing=p, today=TODAY
        )["estimate"]
        is False
    )
    offers = compare_tier("a100x1", currency="CNY", pricing=p, today=TODAY).offers
    month = next(
        o for o in offers if o.billing == "subscription-month" and o.provider == "alicloud"
    )
    assert month.per_gpu_hour == pytest.approx(9000.0 / 730) and not month.estimate


def test_a_quote_for_an_unknown_instance_type_is_refused(raw: dict[str, Any]):
    bad = copy.deepcopy(raw)
    bad["alicloud"]["subscription"]["monthly"] = {
        "ecs.gn99.xlarge": {"price": 1.0, "date": "2026-11-20", "source": "AC"}
    }
    with pytest.raises(CatalogError, match=r"unknown type 'ecs\.gn99\.xlarge'"):
        parse(bad)


def test_a_fresher_exchange_rate_silences_the_fx_warning(raw: dict[str, Any]):
    fresh = copy.deepcopy(raw)
    fresh["fx"]["USD_CNY"].update(rate=7.0, date="2026-11-20", source="AC", estimate=False)
    p = parse(fresh)
    e = estimate_cost(
        CostInputs("alicloud", "ecs.gn7-c12g1.3xlarge", root_disk_gb=0),
        currency="USD",
        pricing=p,
        today=TODAY,
    )
    assert e.hourly.on_demand == pytest.approx(31.58 / 7.0)
    assert not any("exchange rate" in w for w in e.warnings)


def test_the_spot_band_must_be_a_fraction_range(raw: dict[str, Any]):
    bad = copy.deepcopy(raw)
    bad["meta"]["spot_band"]["high"] = 1.3
    with pytest.raises(CatalogError, match="0 < low <= high <= 1"):
        parse(bad)
