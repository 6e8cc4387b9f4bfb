"""Each cloud's power.py (``fab start`` / ``fab stop``'s cloud calls) against moto (EC2) and
the SDK fakes the reaper tests use (Alicloud ECS, Tencent CVM, Azure ARM), on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import clouds
from infra.clouds.azure.power import AzurePower
from infra.clouds.tencent.power import NO_STOP_CHARGING
from infra.reaper import tags as T

pytestmark = pytest.mark.integration

STACK = "pw"


def tagged(stack: str = STACK) -> dict[str, str]:
    return {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: stack}


# ------------------------------------------------------------------ AWS (moto)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from tests.support.moto_server import moto_server

    with moto_server(warm=()) as url:
        yield url


def ec2_instances(url: str, count: int, stack: str) -> list[str]:
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
    tags = [{"Key": k, "Value": v} for k, v in tagged(stack).items()]
    made = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=count,
        MaxCount=count,
        InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return [i["InstanceId"] for i in made["Instances"]]


@pytest.fixture
def aws_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_ec2_nodes_stop_and_start_and_report_their_tags_and_addresses(
    moto_url: str, aws_keys: None
) -> None:
    ours = ec2_instances(moto_url, 2, STACK)
    power = clouds.module("aws", "power").connect("us-east-1", STACK, {}, moto_url)
    seen = power.describe([*ours, "i-00000000000000000"])
    assert sorted(seen) == sorted(ours)  # an unknown id is left out, not an error
    assert {n.state for n in seen.values()} == {"running"}
    assert {n.instance.stack for n in seen.values()} == {STACK}
    assert all(n.private_ip for n in seen.values())

    assert power.stop(ours) == {}
    assert {n.state for n in power.describe(ours).values()} == {"stopped"}
    assert power.start(ours) == {}
    states = {n.state for n in power.describe(ours).values()}
    assert states <= {"pending", "running"}


def test_an_ec2_start_the_api_refuses_fails_each_id_with_the_apis_words(
    moto_url: str, aws_keys: None
) -> None:
    power = clouds.module("aws", "power").connect("us-east-1", STACK, {}, moto_url)
    failed = power.start(["i-00000000000000001"])
    assert list(failed) == ["i-00000000000000001"]
    assert "InvalidInstanceID" in failed["i-00000000000000001"]


# ------------------------------------------------------------------ Alicloud


ALI_ENV = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "fake-id", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "fake"}


def test_ecs_stops_in_economical_mode_and_a_local_disk_one_reads_as_still_billed() -> None:
    from tests.reaper.alicloud_fake import FakeAlicloud, FakeInstance

    plain = FakeInstance("i-plain", tagged(), "2026-12-01T08:00Z", public_ip="127.0.9.9")
    local = FakeInstance(
        "i-local", tagged(), "2026-12-01T08:00Z", instance_type="ecs.i2g.2xlarge", local_disks=True
    )
    fake = FakeAlicloud(instances=[plain, local])
    with fake.running() as url:
        power = clouds.module("alicloud", "power").connect("cn-beijing", STACK, ALI_ENV, url)
        assert power.describe(["i-plain", "i-gone"])["i-plain"].public_ip == "127.0.9.9"
        assert power.stop(["i-plain", "i-local"]) == {}
        after = power.describe(["i-plain", "i-local"])
        assert after["i-plain"].state == after["i-local"].state == "stopped"
        # The documented fallback: no error, but the compute keeps billing.
        assert not after["i-plain"].instance.billed_while_stopped
        assert after["i-local"].instance.billed_while_stopped

        assert power.start(["i-plain", "i-local"]) == {}
        again = power.describe(["i-plain", "i-local"])
    assert {n.state for n in again.values()} == {"running"}
    assert again["i-plain"].public_ip != "127.0.9.9"  # economical mode gave a new address
    stops = [q for action, q in fake.calls if action == "StopInstances"]
    assert stops and all(q["StoppedMode"] == "StopCharging" for q in stops)


def test_ecs_start_reports_the_ids_the_api_refused() -> None:
    from tests.reaper.alicloud_fake import FakeAlicloud, FakeInstance

    fake = FakeAlicloud(instances=[FakeInstance("i-run", tagged(), "2026-12-01T08:00Z")])
    with fake.running() as url:
        power = clouds.module("alicloud", "power").connect("cn-beijing", STACK, ALI_ENV, url)
        failed = power.start(["i-run"])
    assert failed == {"i-run": "IncorrectInstanceStatus: "}


def test_ecs_without_keys_is_a_one_line_refusal_before_any_call() -> None:
    with pytest.raises(ValueError, match="ALIBABA_CLOUD_ACCESS_KEY_ID"):
        clouds.module("alicloud", "power").connect("cn-beijing", STACK, {}, "http://127.0.0.1:9")


# ------------------------------------------------------------------ Tencent


def tencent_env() -> dict[str, str]:
    from tests.reaper.tencent_fake import SECRET_ID, SECRET_KEY

    return {"TENCENTCLOUD_SECRET_ID": SECRET_ID, "TENCENTCLOUD_SECRET_KEY": SECRET_KEY}


def test_cvm_stops_without_charging_and_starts_again() -> None:
    from tests.reaper.tencent_fake import FakeCvm, FakeTencent

    fake = FakeTencent(instances=[FakeCvm("ins-a", tagged(), "2026-12-01T08:00:00Z")])
    with fake.running() as url:
        power = clouds.module("tencent", "power").connect("ap-guangzhou", STACK, tencent_env(), url)
        assert power.describe(["ins-a"])["ins-a"].private_ip == "10.0.0.7"
        assert power.stop(["ins-a"]) == {}
        assert power.describe(["ins-a"])["ins-a"].state == "stopped"
        assert power.start(["ins-a"]) == {}
        assert power.describe(["ins-a"])["ins-a"].state == "running"
    stops = [q for action, q in fake.calls if action == "StopInstances"]
    assert [q["StoppedMode"] for q in stops] == ["STOP_CHARGING"]


def test_a_cvm_that_cannot_stop_without_charging_is_named_in_one_line_and_left_running() -> None:
    from tests.reaper.tencent_fake import FakeCvm, FakeTencent

    cvm = FakeCvm("ins-l", tagged(), "2026-12-01T08:00:00Z", refuses_stop=True)
    fake = FakeTencent(instances=[cvm])
    with fake.running() as url:
        power = clouds.module("tencent", "power").connect("ap-guangzhou", STACK, tencent_env(), url)
        assert power.stop(["ins-l"]) == {"ins-l": NO_STOP_CHARGING}
    assert cvm.state == "RUNNING"
    assert "\n" not in NO_STOP_CHARGING


# ------------------------------------------------------------------ Azure


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.reaper.azure_fake import make_tls

    return make_tls(tmp_path_factory.mktemp("tls"))


def azure_power(url: str, tls: tuple[Path, Path]) -> AzurePower:
    from tests.reaper.test_azure_reaper import cloud

    return AzurePower(cloud(url, tls, timeout_s=2.0), STACK)


def test_azure_vms_deallocate_and_start_as_long_running_operations(
    tls: tuple[Path, Path],
) -> None:
    import datetime as dt

    from tests.reaper.azure_fake import FakeAzure, FakeVM

    now = dt.datetime.now(dt.UTC)
    fake = FakeAzure(vms=[FakeVM("pw-0", tagged(), now), FakeVM("other", tagged("x"), now)])
    with fake.running(tls) as url:
        power = azure_power(url, tls)
        seen = power.describe(["pw-0"])
        assert list(seen) == ["pw-0"] and seen["pw-0"].public_ip is None  # a static IP
        assert power.stop(["pw-0"]) == {}
        assert power.describe(["pw-0"])["pw-0"].state == "stopped"
        assert power.start(["pw-0"]) == {}
        assert power.describe(["pw-0"])["pw-0"].state == "running"
    kinds = [kind for kind, _path, _q in fake.calls]
    assert "start" in kinds and "deallocate" in kinds


def test_azure_without_a_token_or_subscription_is_a_one_line_refusal() -> None:
    connect = clouds.module("azure", "power").connect
    with pytest.raises(ValueError, match="GPUFLEET_AZURE_SUBSCRIPTION_ID"):
        connect("eastus", STACK, {}, None)
    with pytest.raises(ValueError, match="GPUFLEET_AZURE_ACCESS_TOKEN"):
        connect("eastus", STACK, {"GPUFLEET_AZURE_SUBSCRIPTION_ID": "s"}, None)


# ------------------------------------------------------------------ the laptop's permissions


def test_the_ec2_actions_the_laptop_needs_are_in_the_service_reference() -> None:
    from tests.infra.aws_iam import actions_named

    actions = clouds.module("aws", "power").LAPTOP_ACTIONS
    assert [a for a in actions if actions_named(a) != [a]] == []


def test_the_ecs_actions_the_laptop_needs_are_rams_own() -> None:
    from tests.infra.alicloud_ram import action_known

    actions = clouds.module("alicloud", "power").LAPTOP_ACTIONS
    assert [a for a in actions if not action_known(a)] == []


def test_the_cvm_actions_the_laptop_needs_are_cams_own() -> None:
    import tomllib

    snapshot = Path(__file__).resolve().parents[1] / "data" / "clouds" / "tencent_cam.toml"
    listed = tomllib.loads(snapshot.read_text())["services"]["cvm"]["actions"]
    actions = clouds.module("tencent", "power").LAPTOP_ACTIONS
    assert [a for a in actions if a.removeprefix("cvm:") not in listed] == []


def test_the_azure_operations_the_laptop_needs_are_microsofts_own() -> None:
    import tomllib

    snapshot = Path(__file__).resolve().parents[1] / "data" / "clouds" / "azure_rbac.toml"
    listed = tomllib.loads(snapshot.read_text())["operations"]["Microsoft.Compute"]["actions"]
    actions = clouds.module("azure", "power").LAPTOP_ACTIONS
    assert [a for a in actions if a not in listed] == []
