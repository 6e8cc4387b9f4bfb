"""One billing rule, one set of words: the stack config, the cost model and the sizing filters
refuse a wrong billing mode with the same line."""

from __future__ import annotations

import pytest

from infra.catalog import load_catalog
from infra.config import ConfigError, parse_config
from infra.pricing.billing_modes import BILLING_MODES, billing_problem
from infra.pricing.cost import CostError, CostInputs, estimate_cost
from infra.pricing.sizing import Filters, size
from infra.pricing.workload import SizingError, Workload

STACK = {"provider": "aws", "tier": "a100x8", "sshCidrs": ["203.0.113.0/24"]}


def config_problems(billing: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config({**STACK, "billing": billing}, "test")
    return exc.value.problems


def cost_problems(billing: str) -> list[str]:
    inputs = CostInputs(provider="aws", instance_type="p4d.24xlarge", billing=billing)
    with pytest.raises(CostError) as exc:
        estimate_cost(inputs)
    return exc.value.problems


def sizing_problems(billing: str) -> list[str]:
    with pytest.raises(SizingError) as exc:
        size(Workload(params=1e9, tokens=1e9), filters=Filters(billings=(billing,)))
    return exc.value.problems


def test_an_unknown_mode_is_named_with_the_modes_and_the_nearest_one():
    assert billing_problem("spt") == (
        "'spt' is not a billing mode: use one of on-demand, spot, subscription "
        "(did you mean 'spot'?)"
    )


def test_a_mode_the_cloud_does_not_sell_names_what_it_sells_and_who_sells_it():
    cat = load_catalog()
    sellers = [p for p, i in cat.providers.items() if "subscription" in i.billing]
    assert sellers and "aws" not in sellers
    assert billing_problem("subscription", "aws") == (
        "aws sells no subscription billing here: use on-demand or spot, "
        f"or a cloud that sells it: {', '.join(sellers)}"
    )


@pytest.mark.parametrize("mode", BILLING_MODES)
def test_every_mode_a_cloud_sells_passes(mode: str):
    for name, info in load_catalog().providers.items():
        if mode in info.billing:
            assert billing_problem(mode, name) is None


def test_config_cost_and_sizing_refuse_an_unknown_mode_in_the_same_words():
    words = billing_problem("spt")
    assert words is not None
    assert config_problems("spt") == [f"gpufleet:billing: {words}"]
    assert cost_problems("spt") == [words]
    assert sizing_problems("spt") == [words]


def test_config_and_cost_refuse_a_mode_the_cloud_does_not_sell_in_the_same_words():
    words = billing_problem("subscription", "aws")
    assert words is not None
    assert config_problems("subscription") == [f"gpufleet:billing: {words}"]
    assert cost_problems("subscription") == [words]


def test_the_config_still_reads_a_mode_in_any_letter_case():
    assert parse_config({**STACK, "billing": "Spot"}, "test").billing == "spot"
