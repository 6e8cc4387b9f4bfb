"""Reserved capacity: AWS Capacity Blocks for ML offerings, and targeting a reservation.

Moto 5.2.5 does not implement DescribeCapacityBlockOfferings, so boto3 asks a local EC2
fake on 127.0.0.1 whose answer is laid out by botocore's own EC2 model (the element names
are the model's serialization names for the operation's output; the xmlns is the model's
xmlNamespace), and whose request is checked against the model's input members. The stack
side is the real program under Pulumi's mocks: the typed inputs each provider SDK has for
a reservation (pulumi_aws InstanceCapacityReservationSpecificationArgs and market type
capacity-block, pulumi_azure_native CapacityReservationProfileArgs, pulumi_alicloud
Instance private_pool_options_*).
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest

from infra import reserved
from infra.clouds.aws import reserved as aws_reserved
from infra.config import ConfigError, parse_config
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
from tests.infra.where.fakes import ec2_query
from tests.support.stderr import problems

EC2 = botocore.session.get_session().get_service_model("ec2")
OP = EC2.operation_model("DescribeCapacityBlockOfferings")
ITEM = OP.output_shape.members["CapacityBlockOfferings"]


def _name(shape: Any, member: str) -> str:
    return str(shape.members[member].serialization.get("name", member))


def offering_xml(rows: list[dict[str, str]], next_token: str = "") -> str:
    """An answer in the model's shape: each row's keys are the model's member names."""
    items = "".join(
        "<item>"
        + "".join(f"<{_name(ITEM.member, k)}>{v}</{_name(ITEM.member, k)}>" for k, v in r.items())
        + "</item>"
        for r in rows
    )
    tag = _name(OP.output_shape, "NextToken")
    token = f"<{tag}>{next_token}</{tag}>" if next_token else ""
    listed = _name(OP.output_shape, "CapacityBlockOfferings")
    return (
        f'<DescribeCapacityBlockOfferingsResponse xmlns="{EC2.metadata["xmlNamespace"]}/">'
        f"<requestId>5e0a4b9c-0000-4000-8000-000000000002</requestId>"
        f"<{listed}>{items}</{listed}>{token}</DescribeCapacityBlockOfferingsResponse>"
    )


def row(fee: str, zone: str, start: str, hours: int = 168, count: int = 2) -> dict[str, str]:
    end = dt.datetime.fromisoformat(start) + dt.timedelta(hours=hours)
    return {
        "CapacityBlockOfferingId": f"cb-{zone}-{fee.replace('.', '')}",
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": zone,
        "InstanceCount": str(count),
        "StartDate": start,
        "EndDate": end.isoformat().replace("+00:00", "Z"),
        "CapacityBlockDurationHours": str(hours),
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
        "Tenancy": "default",
    }


@pytest.fixture
def fake_ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, list[str]]]]:
    """An EC2 endpoint on 127.0.0.1 answering two pages of offerings."""
    pages = [
        offering_xml([row("43000.00", "us-east-1a", "2026-12-14T11:30:00Z")], "page-2"),
        offering_xml([row("41000.00", "us-east-1b", "2026-12-15T11:30:00Z")]),
    ]
    with ec2_query(lambda form: pages[1 if "NextToken" in form else 0]) as (url, sent):
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", url)
        yield sent


START = dt.datetime(2026, 12, 14, tzinfo=dt.UTC)


def test_offerings_are_read_across_pages_cheapest_first(fake_ec2: list[Any]) -> None:
    end = START + dt.timedelta(days=14)
    found = aws_reserved.offerings("p5.48xlarge", 2, START, end, 168, "us-east-1")
    assert [o.zone for o in found] == ["us-east-1b", "us-east-1a"]
    assert found[0].upfront_fee == 41000.0 and found[0].hours == 168 and found[0].count == 2
    assert found[0].per_instance_hour() == pytest.approx(41000 / (2 * 168))
    first, second = fake_ec2
    assert first["Action"] == ["DescribeCapacityBlockOfferings"]
    assert second["NextToken"] == ["page-2"]
    asked = {k for k in first if k not in ("Action", "Version")}
    assert asked <= set(OP.input_shape.members) and set(OP.input_shape.required_members) <= asked
    assert first["CapacityDurationHours"] == ["168"] and first["InstanceCount"] == ["2"]


def test_reserve_prices_each_offering_per_gpu_hour_against_on_demand(
    fake_ec2: list[Any],
) -> None:
    from scripts import reserve

    out = io.StringIO()
    code = reserve.main(
        ["h100x8", "--start", "2026-12-14", "--days", "7", "--nodes", "2", "--json"], out
    )
    assert code == 0
    doc = json.loads(out.getvalue())
    cheapest = doc["offerings"][0]
    assert cheapest["per_gpu_hour"] == pytest.approx(41000 / (2 * 168) / 8, abs=1e-4)
    assert cheapest["on_demand_per_hour"] > 0
    # the clouds without such an API say what they sell instead
    assert any("capacity reservation groups" in n for n in doc["notes"])


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["h100x8", "--start", "2026-12-14", "--days", "20"], "--days 20: a block lasts"),
        (["h100x9", "--start", "2026-12-14", "--days", "7"], "'h100x9' is not a tier"),
        (["h100x8", "--start", "2026-12-14", "--days", "7", "--nodes", "65"], "--nodes 65"),
    ],
)
def test_reserve_refuses_bad_input_in_one_line(argv: list[str], start: str) -> None:
    from scripts import reserve

    err = io.StringIO()
    assert reserve.main(argv, io.StringIO(), err) == 2
    (line,) = problems(err.getvalue())
    assert line.startswith(f"reserve.py: {start}")


def test_reserve_without_credentials_says_so_and_exits_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scripts import reserve

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    out = io.StringIO()
    assert reserve.main(["h100x8", "--start", "2026-12-14", "--days", "7"], out) == 1
    assert "no AWS credentials" in out.getvalue()


def test_every_duration_botocore_documents_is_accepted_and_no_other() -> None:
    ok = [d for d in range(1, 190) if reserved.request_problem("aws", d, 1) is None]
    assert ok == [*range(1, 15), *range(21, 183, 7)]


# -------------------------------------------------------------- targeting a reservation

BASE = {"sshCidrs": ["203.0.113.0/24"], "sshPublicKey": PLACEHOLDER_SSH_KEY}
AZ_GROUP = (
    "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/"
    "capacityReservationGroups/gpus"
)
NODE = {
    "aws": "aws:ec2/instance:Instance",
    "azure": "azure-native:compute:VirtualMachine",
    "alicloud": "alicloud:ecs/instance:Instance",
}


def node_inputs(provider: str, tier: str, **extra: Any) -> dict[str, Any]:
    cfg = parse_config({**BASE, "provider": provider, "tier": tier, **extra}, "res-t")
    (node,) = [
        r.to_json() for r in evaluate(cfg).resources if r.to_json()["type"] == NODE[provider]
    ]
    return dict(node["inputs"])


def test_an_aws_stack_launches_only_into_its_capacity_block() -> None:
    i = node_inputs("aws", "h100x8", capacityReservation="cr-0123456789abcdef0", capacityBlock=True)
    assert i["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
    }
    assert i["instanceMarketOptions"] == {"marketType": "capacity-block"}


def test_an_aws_capacity_reservation_is_targeted_without_a_market_type() -> None:
    i = node_inputs("aws", "a10x1", capacityReservation="cr-0123456789abcdef0")
    assert i["capacityReservationSpecification"]["capacityReservationTarget"]
    assert "instanceMarketOptions" not in i


def test_an_azure_vm_is_allocated_from_its_capacity_reservation_group() -> None:
    i = node_inputs("azure", "a100x8", capacityReservation=AZ_GROUP)
    assert i["capacityReservation"] == {"capacityReservationGroup": {"id": AZ_GROUP}}


def test_an_alicloud_instance_starts_from_its_private_pool_only() -> None:
    i = node_inputs("alicloud", "a100x8", capacityReservation="eap-bp67acfmxazb4ph")
    assert i["privatePoolOptionsMatchCriteria"] == "Target"
    assert i["privatePoolOptionsId"] == "eap-bp67acfmxazb4ph"


def test_a_stack_without_a_reservation_declares_none() -> None:
    for provider, tier in (("aws", "a10x1"), ("azure", "a100x8"), ("alicloud", "a100x8")):
        i = node_inputs(provider, tier)
        assert not {"capacityReservationSpecification", "capacityReservation"} & set(i)
        assert "privatePoolOptionsId" not in i


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        ({"provider": "aws", "capacityReservation": "cr-12"}, "capacityReservation: 'cr-12' is"),
        ({"provider": "aws", "capacityBlock": True}, "capacityBlock: needs capacityReservation"),
        (
            {"provider": "aws", "capacityReservation": "cr-0123456789abcdef0", "billing": "spot"},
            "capacityReservation: a reservation is used by on-demand nodes",
        ),
        (
            {"provider": "aws", "capacityReservation": "cr-0123456789abcdef0", "zone": "auto"},
            "capacityReservation: holds capacity in one zone",
        ),
        (
            {"provider": "azure", "capacityReservation": AZ_GROUP, "capacityBlock": True},
            "capacityBlock: Azure: Capacity Blocks are EC2's",
        ),
        (
            {"provider": "tencent", "capacityReservation": "x"},
            "capacityReservation: Tencent Cloud: tencentcloud-iac-pulumi",
        ),
    ],
)
def test_a_reservation_the_cloud_cannot_take_is_one_line(extra: dict[str, Any], start: str) -> None:
    raw = {**BASE, "tier": "a100x8" if extra["provider"] != "aws" else "a10x1", **extra}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "res-t")
    (line,) = err.value.problems
    assert line.startswith(f"gpufleet:{start}"), line
