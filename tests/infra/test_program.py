"""The program refuses what would go wrong at deploy time, before any resource exists."""

from __future__ import annotations

import pytest

from infra.catalog import Feature, load_catalog, provider_names
from infra.clouds.alicloud.program import charge_args
from infra.clouds.aws.program import ami_parameter, market_options
from infra.clouds.base import get_provider
from infra.components.args import billing_of
from infra.config import ConfigError, parse_config
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate

CIDRS = ["203.0.113.0/24"]


def test_deploy_needs_an_ssh_key_and_says_how_to_set_it():
    cfg = parse_config({"provider": "aws", "tier": "t4x1", "sshCidrs": CIDRS}, "dev")
    with pytest.raises(ConfigError, match="pulumi config set gpufleet:sshPublicKey"):
        evaluate(cfg)


def test_a_stack_above_its_cost_ceiling_declares_nothing(monkeypatch):
    raw = {
        "provider": "aws",
        "tier": "h100x8",
        "nodes": 2,
        "sshCidrs": CIDRS,
        "sshPublicKey": PLACEHOLDER_SSH_KEY,
    }
    import infra.offline as offline

    engines: list[offline.Mocks] = []

    class Recording(offline.Mocks):
        def __init__(self, stack: str, region: str) -> None:
            super().__init__(stack, region)
            engines.append(self)

    monkeypatch.setattr(offline, "Mocks", Recording)
    with pytest.raises(ConfigError, match=r"costs about 110.08 USD/h .* above the limit 100"):
        evaluate(parse_config({**raw, "maxHourlyCost": 100}, "big"))
    # The engine the program really ran under saw no resource and no invoke at all...
    assert len(engines) == 1
    assert engines[0].resources == [] and engines[0].invokes == []
    # ...while under a higher ceiling the same stack declares its nodes through it.
    evaluate(parse_config({**raw, "maxHourlyCost": 200}, "big"))
    assert len(engines) == 2
    assert any(r.type == "aws:ec2/instance:Instance" for r in engines[1].resources)


def test_volta_nodes_start_from_plain_ubuntu_because_the_dlami_skips_them():
    assert "canonical/ubuntu" in ami_parameter("volta")
    assert "deeplearning" in ami_parameter("hopper")


def test_spot_max_price_is_passed_as_text_and_on_demand_has_no_market_options():
    base = {"provider": "aws", "tier": "t4x1", "sshCidrs": CIDRS}
    spot = market_options(
        billing_of(parse_config({**base, "billing": "spot", "spotMaxPrice": 0.3}, "s"))
    )
    assert spot is not None and spot.market_type == "spot"
    assert spot.spot_options is not None
    # EC2 takes the price as a string; a float would be sent as 0.30000000000000004 or refused
    assert spot.spot_options.max_price == "0.3"
    assert spot.spot_options.instance_interruption_behavior == "stop"
    assert spot.spot_options.spot_instance_type == "persistent"
    no_limit = market_options(billing_of(parse_config({**base, "billing": "spot"}, "s")))
    assert no_limit is not None and no_limit.spot_options is not None
    assert no_limit.spot_options.max_price is None  # pay up to the on-demand price
    assert market_options(billing_of(parse_config(base, "s"))) is None


def test_alicloud_billing_modes_map_to_charge_types():
    base = {"provider": "alicloud", "tier": "a10x1", "sshCidrs": CIDRS}
    assert charge_args(billing_of(parse_config(base, "s")))["spot_strategy"] == "NoSpot"
    spot = charge_args(
        billing_of(parse_config({**base, "billing": "spot", "spotMaxPrice": 5}, "s"))
    )
    assert spot["spot_strategy"] == "SpotWithPriceLimit" and spot["spot_price_limit"] == 5
    assert (
        charge_args(billing_of(parse_config({**base, "billing": "spot"}, "s")))["spot_strategy"]
        == "SpotAsPriceGo"
    )
    sub = charge_args(
        billing_of(parse_config({**base, "billing": "subscription", "subscriptionMonths": 3}, "s"))
    )
    assert (sub["instance_charge_type"], sub["period"], sub["period_unit"]) == (
        "PrePaid",
        3,
        "Month",
    )
    assert "stopped_mode" not in sub


def test_capabilities_are_data_not_branches():
    assert not load_catalog().providers["aws"].supports(Feature.SUBSCRIPTION)
    assert not load_catalog().providers["alicloud"].supports(Feature.EFA)
    with pytest.raises(ValueError, match="unknown provider"):
        get_provider("gcp")


@pytest.mark.parametrize("name", provider_names())
def test_every_clouds_program_answers_its_plan_notes_itself(name: str) -> None:
    # One call on the cloud (the CloudProvider protocol), never an optional attribute.
    assert "plan_notes" in type(get_provider(name)).__dict__


def test_the_plan_notes_put_the_billing_note_first_and_the_catalogs_after_the_programs():
    import datetime as dt
    from pathlib import Path

    from infra.catalog import load_catalog, plan_notes
    from infra.clouds.base import PlanNotes
    from infra.config import load_stack_file

    stacks = Path(__file__).resolve().parents[2] / "stacks"
    path = stacks / "Pulumi.tencent-a100x4.yaml"
    cfg = load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY, "billing": "subscription"})
    today = dt.date(2026, 12, 1)
    provider = get_provider(cfg.provider)
    said = provider.plan_notes(cfg, today)
    billing = load_catalog().providers[cfg.provider].billing_notes["subscription"]
    own = provider.stack_notes(cfg)  # type: ignore[attr-defined]
    assert own  # the kept data disk's fate: the program's own note
    assert said == PlanNotes((billing,), (*own, *plan_notes(cfg.provider, cfg.stack, today)))
