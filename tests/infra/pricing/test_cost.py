"""The cost model against hand-checked arithmetic (figures from the shipped catalog/pricing.toml).

Every expected number below is worked out by hand in the comment next to it, so a change in the
model's arithmetic (not in the data) fails here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from infra.catalog import load_catalog
from infra.pricing.cost import CostError, CostEstimate, CostInputs, estimate_cost, hourly_estimate

TODAY = dt.date(2026, 11, 29)


def est(currency: str | None = None, today: dt.date = TODAY, **kw: Any) -> CostEstimate:
    return estimate_cost(CostInputs(**kw), currency=currency, today=today)


# --- one hand-checked case per billing mode -------------------------------------------------


def test_on_demand_two_aws_nodes_add_up_compute_and_root_disks():
    e = est(
        provider="aws",
        instance_type="p4d.24xlarge",
        nodes=2,
        hours_per_month=100,
        root_disk_gb=200,
        scratch_gb=500,  # p4d has local NVMe: no scratch disk is bought
    )
    assert e.currency == "USD"
    assert e.hourly.on_demand == pytest.approx(43.916)  # 21.958 x 2
    assert e.compute_monthly.on_demand == pytest.approx(4391.6)  # x 100 h
    assert [i.item.split(" (")[0] for i in e.storage] == ["root disks"]
    assert e.storage_monthly == pytest.approx(32.0)  # 2 x 200 GB x 0.08 gp3
    assert e.selected(e.monthly_total) == pytest.approx(4423.6)
    assert e.subscription_month is None and e.break_even is None  # not sold on AWS


def test_spot_uses_the_catalogs_observed_range_times_nodes():
    e = est(provider="aws", instance_type="p4d.24xlarge", nodes=3, billing="spot", root_disk_gb=0)
    assert e.hourly.spot == pytest.approx((7.41, 24.57))  # [2.47, 8.19] x 3
    assert not e.hourly.spot_estimated
    assert e.compute_monthly.spot == pytest.approx((7.41 * 730, 24.57 * 730))
    assert e.selected(e.hourly) == pytest.approx((7.41, 24.57))
    saving = e.spot_saving
    assert saving is not None
    # 1 - 8.19/21.958 = 0.62701, 1 - 2.47/21.958 = 0.88751
    assert saving.fraction == pytest.approx((0.62701, 0.88751), abs=1e-5)
    assert "2-minute" in saving.caveat


def test_spot_without_a_catalog_range_is_the_30_to_70_percent_band_and_says_so():
    e = est(provider="alicloud", instance_type="ecs.gn7-c12g1.3xlarge", billing="spot")
    assert e.hourly.spot == pytest.approx((9.474, 22.106))  # 31.58 x 0.3, 31.58 x 0.7
    assert e.hourly.spot_estimated
    assert any("spot: no observed range" in w and "30%-70%" in w for w in e.warnings)
    assert e.to_json()["hourly"]["spot_estimated"] is True


def test_spot_max_price_caps_what_spot_can_cost():
    e = est(
        provider="aws", instance_type="p4d.24xlarge", billing="spot", spot_max_price=5.0, nodes=2
    )
    assert e.hourly.spot == pytest.approx((4.94, 10.0))  # [2.47, min(8.19, 5)] x 2


def test_subscription_month_is_the_quoted_monthly_price_with_break_even():
    e = est(provider="alicloud", instance_type="ecs.gn7-c12g1.3xlarge", billing="subscription")
    assert e.currency == "CNY"
    assert e.subscription_month == pytest.approx(15160.0)  # ACH's monthly quote
    assert not e.subscription_estimated
    assert e.hourly.subscription == pytest.approx(20.7671, abs=1e-4)  # 15160 / 730
    # fixed whatever the hours: the month is paid for
    short = est(
        provider="alicloud",
        instance_type="ecs.gn7-c12g1.3xlarge",
        billing="subscription",
        hours_per_month=50,
    )
    assert short.compute_monthly.subscription == pytest.approx(15160.0)
    assert short.compute_monthly.on_demand == pytest.approx(1579.0)  # 31.58 x 50
    be = e.break_even
    assert be is not None
    assert be.hours_per_month == pytest.approx(480.05, abs=0.01)  # 15160 / 31.58
    assert be.utilisation == pytest.approx(0.6576, abs=1e-4)  # 480.05 / 730


def test_a_whole_number_of_years_gets_the_yearly_rate():
    e = est(
        provider="alicloud",
        instance_type="ecs.gn7-c12g1.3xlarge",
        billing="subscription",
        subscription_months=12,
        nodes=2,
    )
    assert e.subscription_month == pytest.approx(2 * 15160 * 0.85)  # 25772
    assert e.subscription_year == pytest.approx(2 * 15160 * 12 * 0.85)  # 309264
    assert e.subscription_estimated  # the yearly 0.85 is not a quote
    assert e.break_even is not None
    assert e.break_even.hours_per_month == pytest.approx(480.05 * 0.85, abs=0.01)


def test_subscription_on_a_provider_that_does_not_sell_it_is_refused():
    with pytest.raises(CostError, match="aws sells no subscription billing here"):
        est(provider="aws", instance_type="p4d.24xlarge", billing="subscription")


# --- storage, transfer, snapshots ------------------------------------------------------------


def test_alicloud_scratch_is_an_essd_disk_per_node_at_its_performance_level():
    e = est(
        provider="alicloud",
        instance_type="ecs.gn7-c13g1.13xlarge",
        nodes=2,
        root_disk_gb=200,
        scratch_gb=500,
        scratch_class="PL1",
    )
    amounts = {i.item: i.amount for i in e.storage}
    assert amounts == {
        "root disks (PL0, 2x 200 GB)": pytest.approx(200.0),  # 400 GB x 0.5
        "scratch disks (PL1, 2x 500 GB)": pytest.approx(1000.0),  # 1000 GB x 1.0
    }


def test_api_spellings_of_disk_classes_are_accepted():
    e = est(
        provider="alicloud",
        instance_type="ecs.gn7-c12g1.3xlarge",
        scratch_gb=1261,
        scratch_class="cloud_essd_pl3",
    )
    assert any(i.item.startswith("scratch disks (PL3") for i in e.storage)


def test_bucket_classes_egress_free_tier_and_snapshots_are_priced_per_gb():
    e = est(
        provider="aws",
        instance_type="g5.xlarge",
        root_disk_gb=0,
        bucket_gb=1000,
        bucket_class="DEEP_ARCHIVE",
        egress_gb=250,
        snapshot_gb=40,
    )
    amounts = {i.item: i.amount for i in e.storage}
    assert amounts["bucket (DEEP_ARCHIVE)"] == pytest.approx(0.99)  # 1000 x 0.00099
    assert amounts["data transfer out"] == pytest.approx(13.5)  # (250 - 100 free) x 0.09
    assert amounts["snapshots"] == pytest.approx(2.0)  # 40 x 0.05
    inside_free_tier = est(provider="aws", instance_type="g5.xlarge", egress_gb=50)
    assert {i.item: i.amount for i in inside_free_tier.storage}["data transfer out"] == 0


def test_oss_storage_classes_step_down_in_price():
    prices = [
        {
            i.item: i.unit_price
            for i in est(
                provider="alicloud",
                instance_type="ecs.gn7-c12g1.3xlarge",
                bucket_gb=100,
                bucket_class=cls,
            ).storage
        }[f"bucket ({cls})"]
        for cls in ("Standard", "IA", "Archive", "ColdArchive")
    ]
    assert prices == [0.12, 0.08, 0.033, 0.015]


# --- currency --------------------------------------------------------------------------------


def test_cny_prices_convert_to_usd_at_the_dated_rate_and_say_so():
    e = est(currency="USD", provider="alicloud", instance_type="ecs.gn7-c12g1.3xlarge")
    assert e.currency == "USD" and e.native_currency == "CNY"
    assert e.hourly.on_demand == pytest.approx(31.58 / 7.15)  # 4.41678
    assert e.fx is not None and e.fx.date == dt.date(2025, 9, 1)
    doc = e.to_json()
    assert doc["fx"] == {
        "from": "CNY",
        "to": "USD",
        "rate": 7.15,
        "date": "2025-09-01",
        "source": "MEM",
    }
    assert any(w.startswith("exchange rate CNY->USD") for w in e.warnings)


def test_usd_prices_convert_to_cny_including_storage():
    e = est(currency="CNY", provider="aws", instance_type="p4d.24xlarge", root_disk_gb=100)
    assert e.hourly.on_demand == pytest.approx(21.958 * 7.15)  # 157.0
    assert e.storage_monthly == pytest.approx(100 * 0.08 * 7.15)  # 57.2


# --- the seed's price bands ------------------------------------------------------------------


@pytest.mark.parametrize(("tier", "low", "high"), [("a100x1", 25, 35), ("a100x4", 120, 180)])
def test_alicloud_a100_on_demand_falls_in_the_seed_band(tier: str, low: float, high: float):
    itype = load_catalog().resolve(tier, "alicloud").name
    e = est(provider="alicloud", instance_type=itype)
    assert e.currency == "CNY"
    assert low <= e.hourly.on_demand <= high


# --- stale and estimated prices --------------------------------------------------------------


def test_alicloud_2023_prices_warn_as_stale_but_not_when_they_were_fresh():
    args: dict[str, Any] = {
        "provider": "alicloud",
        "instance_type": "ecs.gn7-c12g1.3xlarge",
        "root_disk_gb": 0,
    }
    now = est(**args)
    assert any(
        "on-demand: figure from ACH dated 2023-06-01" in w and "> 180" in w for w in now.warnings
    )
    back_then = est(today=dt.date(2023, 7, 1), **args)
    assert not any("days old" in w for w in back_then.warnings)


def test_a_fresh_aws_price_carries_no_stale_warning_but_an_old_disk_price_does():
    e = est(provider="aws", instance_type="g5.xlarge", root_disk_gb=100)
    assert not any("on-demand" in w for w in e.warnings)  # KP, 2026-07-20: 132 days
    assert any(w.startswith("root disks (gp3") and "318 days old" in w for w in e.warnings)


def test_estimated_figures_are_flagged_only_when_they_feed_the_bill():
    quiet = est(provider="aws", instance_type="g5.xlarge", root_disk_gb=0, egress_gb=0)
    assert not any("estimate" in w for w in quiet.warnings)
    loud = est(provider="aws", instance_type="g5.xlarge", root_disk_gb=0, egress_gb=500)
    assert any(w.startswith("data transfer out: an estimate (MEM)") for w in loud.warnings)


def test_a_region_other_than_the_price_region_is_called_out():
    e = est(provider="aws", instance_type="g5.xlarge", region="eu-west-1")
    assert any("us-east-1; eu-west-1 may differ" in w for w in e.warnings)


# --- bad inputs ------------------------------------------------------------------------------


def test_negative_hours_are_refused_with_the_valid_range():
    with pytest.raises(CostError, match=r"between 0 and 744.*got -5"):
        est(provider="aws", instance_type="g5.xlarge", hours_per_month=-5)


def test_unknown_currency_names_the_known_ones():
    with pytest.raises(CostError, match=r"unknown currency 'EUR': use one of CNY, USD"):
        est(currency="EUR", provider="aws", instance_type="g5.xlarge")


def test_every_problem_is_reported_at_once_with_suggestions():
    with pytest.raises(CostError) as info:
        est(
            provider="aws",
            instance_type="p4d.24xlarg",
            billing="spott",
            nodes=0,
            egress_gb=-1,
            bucket_class="GLACIER",
        )
    text = "\n".join(info.value.problems)
    assert len(info.value.problems) == 5
    assert "did you mean 'p4d.24xlarge'" in text
    assert "did you mean 'spot'" in text
    assert "nodes must be a whole number >= 1" in text
    assert "egress GB must be >= 0" in text
    assert "bucket class 'GLACIER'" in text


def test_unknown_provider_and_unpriced_types_are_refused():
    with pytest.raises(CostError, match="did you mean 'aws'"):
        est(provider="awss", instance_type="g5.xlarge")
    with pytest.raises(CostError, match=r"ecs\.ebmgn7\.26xlarge has no price"):
        est(provider="alicloud", instance_type="ecs.ebmgn7.26xlarge")


# --- the stack output ------------------------------------------------------------------------


def test_hourly_estimate_has_the_stack_output_shape():
    out = hourly_estimate("aws", "p4d.24xlarge", 2, "on-demand", today=TODAY)
    assert out["currency"] == "USD" and out["billing"] == "on-demand"
    assert out["amount"] == pytest.approx(43.916)
    assert out["nodes"] == 2 and out["price_date"] == "2026-07-20" and out["source"] == "KP"
    assert out["estimate"] is False


def test_hourly_estimate_for_spot_budgets_the_top_of_the_range():
    out = hourly_estimate("aws", "p4d.24xlarge", 2, "spot", today=TODAY)
    assert (out["low"], out["high"], out["amount"]) == (4.94, 16.38, 16.38)


def test_a_spot_range_is_dated_and_sourced_as_the_range_itself():
    out = hourly_estimate("aws", "p4d.24xlarge", 1, "spot", today=TODAY)
    spot = load_catalog().instance("aws", "p4d.24xlarge").price
    assert spot is not None and spot.spot_date is not None
    assert (out["price_date"], out["source"]) == (spot.spot_date.isoformat(), spot.spot_source)
    assert (out["price_date"], out["source"]) != (spot.date.isoformat(), spot.source)


def test_an_estimated_spot_range_keeps_the_on_demand_date_it_derives_from():
    out = hourly_estimate("aws", "g4dn.xlarge", 1, "spot", today=TODAY)
    price = load_catalog().instance("aws", "g4dn.xlarge").price
    assert price is not None and price.spot is None and out["estimate"] is True
    assert (out["price_date"], out["source"]) == (price.date.isoformat(), price.source)


def test_hourly_estimate_for_subscription_spreads_the_month_over_730_hours():
    out = hourly_estimate("alicloud", "ecs.gn7-c12g1.3xlarge", 1, "subscription", today=TODAY)
    assert out["amount"] == pytest.approx(20.7671, abs=1e-4)  # 15160 / 730
    assert out["estimate"] is False and out["currency"] == "CNY"  # a quoted price


def test_hourly_estimate_warns_when_the_stack_region_is_not_the_price_region():
    out = hourly_estimate("aws", "g5.xlarge", region="ap-northeast-1", today=TODAY)
    assert any("ap-northeast-1 may differ" in w for w in out["warnings"])
