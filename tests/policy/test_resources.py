"""The shared policy helpers clouds' rules build on: a subscription's prepaid period, read
the same way for every cloud that sells one."""

from __future__ import annotations

from typing import Any

import pytest

from infra.clouds.alicloud import rules as alicloud_rules
from infra.clouds.tencent import rules as tencent_rules
from policy.resources import UNKNOWN, Resource, prepaid_months


@pytest.mark.parametrize(("period", "months"), [(12, 12), (3.0, 3), (1, 1)])
def test_a_known_prepaid_period_is_its_count_of_months(period: Any, months: int) -> None:
    assert prepaid_months(period) == months


@pytest.mark.parametrize("period", [None, 0, -2, "12", UNKNOWN])
def test_a_period_not_known_yet_or_none_bills_as_one_month(period: Any) -> None:
    assert prepaid_months(period) == 1


def instance(**inputs: Any) -> Resource:
    return Resource(type="t", name="n", inputs=inputs)


def test_each_subscription_cloud_reads_its_own_period_input() -> None:
    ali = alicloud_rules.bill(instance(instanceChargeType="PrePaid", period=6), "ecs.x")
    assert (ali.billing, ali.months) == ("subscription", 6)
    weeks = instance(instanceChargeType="PrePaid", period=6, periodUnit="Week")
    assert alicloud_rules.bill(weeks, "ecs.x").months == 1
    tc = instance(instanceChargeType="PREPAID", instanceChargeTypePrepaidPeriod=3)
    tencent = tencent_rules.bill(tc, "GN7.x")
    assert (tencent.billing, tencent.months) == ("subscription", 3)
