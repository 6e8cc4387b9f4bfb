"""The comparison across clouds, and the catalog against a live price, on the shipped data.

Expected figures are the catalog's own prices, worked out in the comment beside them.
"""

from __future__ import annotations

import datetime as dt

import pytest

from infra.pricing.compare import LiveCheck, compare_tier
from infra.pricing.cost import CostError

TODAY = dt.date(2026, 11, 29)


# --- comparison ------------------------------------------------------------------------------


def test_comparison_is_sorted_cheapest_gpu_hour_first_across_providers_and_modes():
    cmp = compare_tier("a100x8", today=TODAY)
    costs = [o.per_gpu_hour for o in cmp.offers]
    assert costs == sorted(costs)
    kinds = {(o.provider, o.billing) for o in cmp.offers}
    assert kinds == {
        ("aws", "on-demand"),
        ("aws", "spot"),
        ("alicloud", "on-demand"),
        ("alicloud", "spot"),
        ("alicloud", "subscription-month"),
        ("alicloud", "subscription-year"),
        ("tencent", "on-demand"),
        ("tencent", "spot"),
        ("tencent", "subscription-month"),
        ("tencent", "subscription-year"),
        ("azure", "on-demand"),
        ("azure", "spot"),
    }
    p4d = next(
        o for o in cmp.offers if o.instance_type == "p4d.24xlarge" and o.billing == "on-demand"
    )
    assert p4d.per_gpu_hour == pytest.approx(21.958 / 8)
    assert p4d.per_tflop_hour == pytest.approx(21.958 / 8 / 312)  # A100 bf16 dense peak
    assert any("ecs.ebmgn7.26xlarge (memory) has no price" in w for w in cmp.warnings)


def test_sorting_by_tflop_hour_can_reverse_the_gpu_hour_order():
    # A10G (AWS, 70 TF) is cheaper per GPU-hour than Alicloud's A10 (125 TF) but dearer per TFLOP
    by_gpu = compare_tier("a10x1", today=TODAY)
    by_tf = compare_tier("a10x1", sort_by="tflop-hour", today=TODAY)
    od = [o.instance_type for o in by_gpu.offers if o.billing == "on-demand"]
    od_tf = [o.instance_type for o in by_tf.offers if o.billing == "on-demand"]
    assert od.index("g5.xlarge") < od.index("ecs.gn7i-c8g1.2xlarge")
    assert od_tf.index("g5.xlarge") > od_tf.index("ecs.gn7i-c8g1.2xlarge")
    tf = [o.per_tflop_hour for o in by_tf.offers]
    assert tf == sorted(tf)


def test_comparison_in_cny_keeps_cny_prices_unconverted():
    cmp = compare_tier("a100x4", currency="CNY", today=TODAY)
    od = next(o for o in cmp.offers if o.billing == "on-demand" and o.provider == "alicloud")
    assert od.per_gpu_hour == pytest.approx(126.33 / 4)
    # only the USD rows (Azure's NC96ads_A100_v4) went through an exchange rate
    (rate,) = cmp.fx
    azure = next(o for o in cmp.offers if o.billing == "on-demand" and o.provider == "azure")
    assert azure.per_gpu_hour == pytest.approx(14.692 * rate.amount / 4)


def test_unknown_tier_and_currency_in_a_comparison_are_clear_errors():
    with pytest.raises(CostError) as info:
        compare_tier("a100x3", currency="EUR")
    text = " ".join(info.value.problems)
    assert "unknown tier 'a100x3' (did you mean" in text and "known tiers are" in text
    assert "unknown currency 'EUR'" in text


# --- the catalog against a live price ------------------------------------------------------


def test_live_check_says_how_far_the_catalog_is_off():
    check = LiveCheck("alicloud", "ecs.gn7-c12g1.3xlarge", "cn-shanghai", "CNY", 31.58, 28.71)
    assert check.off == pytest.approx(0.09997, abs=1e-4)
    assert "10.0% above the live price" in check.message()
    same = LiveCheck("aws", "p4d.24xlarge", "us-east-1", "USD", 21.958, 21.958)
    assert same.message().endswith("the catalog is current")
