"""pricing.toml: every figure dated and sourced, cross-checked against the catalog on load."""

from __future__ import annotations

import copy
import datetime as dt
import tomllib
from typing import Any

import pytest

from infra.catalog import CatalogError, load_catalog
from infra.catalog.pricing import PRICING_FILE, Pricing, load_pricing, parse_pricing
from infra.cost import CostInputs, compare_tier, estimate_cost, hourly_estimate

TODAY = dt.date(2026, 11, 29)


@pytest.fixture
def raw() -> dict[str, Any]:
    with PRICING_FILE.open("rb") as fh:
        return tomllib.load(fh)


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
            rates += [pp.subscription.monthly_factor, *pp.subscription.monthly.values()]
    assert rates
    for r in rates:
        assert r.source in sources
        assert dt.date(2020, 1, 1) <= r.date <= TODAY


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
    with pytest.raises(CatalogError, match="no section for alicloud"):
        parse(bad)


def test_a_quoted_monthly_price_wins_over_the_factor_estimate(raw: dict[str, Any]):
    quoted = copy.deepcopy(raw)
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
    assert e.to_dict()["subscription"]["estimated"] is False
    assert (
        hourly_estimate(
            "alicloud", "ecs.gn7-c12g1.3xlarge", billing="subscription", pricing=p, today=TODAY
        )["estimate"]
        is False
    )
    offers = compare_tier("a100x1", currency="CNY", pricing=p, today=TODAY).offers
    month = next(o for o in offers if o.billing == "subscription-month")
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
