"""Alibaba Cloud's preflight through the official SDK against a local fake on 127.0.0.1
(tests/preflight/alicloud_fake.py)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from alibabacloud_ecs20140526 import models

from infra import preflight
from infra.clouds.alicloud import preflight as alicloud
from infra.preflight import FAIL, INFO, OK, UNKNOWN, Need
from tests.preflight.alicloud_fake import TYPE, AlicloudFake, item, zone
from tests.preflight.bucket_fake import FREE, MINE, THEIRS, BucketFake
from tests.support.alicloud_models import wire_names

CLOSED = "127.0.0.1:9"


def need(**kw: Any) -> Need:
    base = Need(
        stack="alicloud-t4x1",
        provider="alicloud",
        region="cn-shanghai",
        zone="cn-shanghai-l",
        instance_type=TYPE,
        nodes=2,
        vcpus=4,
        gpus=1,
        billing="spot",
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[AlicloudFake]:
    with AlicloudFake().running() as f, BucketFake() as b:
        monkeypatch.setenv("ALIBABA_CLOUD_OSS_ENDPOINT", f"http://{b.host}")
        f.buckets = b  # type: ignore[attr-defined]
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIfake")
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", f.endpoint)
        monkeypatch.setenv("ALIBABA_CLOUD_STS_ENDPOINT", f.endpoint)
        yield f


def by_name(report: preflight.Report) -> dict[str, preflight.Check]:
    return {c.name: c for c in report.checks}


def test_the_fake_answers_only_fields_of_the_sdk_s_own_models():
    f = AlicloudFake()
    body = models.DescribeAccountAttributesResponseBody
    assert {"AccountAttributeItems", "RequestId"} == wire_names(body)
    row = item("max-spot-instance-vcpu-count", "8")
    item_model = getattr(models, f"{body.__name__}AccountAttributeItemsAccountAttributeItem")
    assert set(row) <= wire_names(item_model)
    value = getattr(models, f"{item_model.__name__}AttributeValuesValueItem")
    assert {"Value"} <= wire_names(value)
    assert set(f.images[0]) <= wire_names(models.DescribeImagesResponseBodyImagesImage)
    parsed = body().from_map({"AccountAttributeItems": {"AccountAttributeItem": [row]}})
    assert alicloud.attribute_values(parsed.to_map()) == {"max-spot-instance-vcpu-count": "8"}
    # the attribute names and the dry run's answer code are the SDK's own words
    source = inspect.getsource(models.DescribeAccountAttributesRequest)
    for pair in alicloud.QUOTA_ATTRIBUTES.values():
        assert all(f"- {name}:" in source for name in pair)
    assert "the DryRunOperation error code is returned" in inspect.getsource(
        models.RunInstancesRequest
    )
    assert set(zone("z", TYPE, "Available", "WithStock")) <= wire_names(
        models.DescribeAvailableResourceResponseBodyAvailableZonesAvailableZone
    )


def test_an_account_with_quota_passes(fake):
    report = preflight.run(need())
    got = by_name(report)
    assert got["identity"].state == OK and "1234567890123456" in got["identity"].detail
    assert got["quota spot"].state == OK
    assert "500 vCPUs free, the stack needs 8 (2 x 4)" in got["quota spot"].detail
    assert got["quota on-demand"].state == INFO
    assert got["image"].state == OK and "ubuntu_22_04" in got["image"].detail
    assert got["launch"].state == OK
    assert got["offered"].state == OK
    assert report.status == 0
    run = [r["query"] for r in fake.seen if r["headers"].get("x-acs-action") == "RunInstances"]
    assert run[0]["DryRun"].lower() == "true" and run[0]["SpotStrategy"] == "SpotAsPriceGo"
    assert run[0]["Amount"] == "2" and run[0]["ZoneId"] == "cn-shanghai-l"


def test_a_short_spot_quota_fails_with_the_value_to_ask_for(fake):
    fake.attributes["used-spot-instance-vcpu-count"] = "496"
    q = by_name(preflight.run(need()))["quota spot"]
    assert q.state == FAIL and "4 vCPUs free, the stack needs 8" in q.detail
    assert q.fix.startswith("raise max-spot-instance-vcpu-count to 504 ")


def test_a_short_pay_as_you_go_quota_fails_on_demand_stacks_only(fake):
    fake.attributes["max-postpaid-instance-vcpu-count"] = "0"
    got = by_name(preflight.run(need()))
    assert got["quota on-demand"].state == INFO  # a spot stack does not use it
    assert by_name(preflight.run(need(billing="on-demand")))["quota on-demand"].state == FAIL


def test_a_denied_run_instances_is_told_by_the_dry_run(fake):
    fake.denied.add("RunInstances")
    launch = by_name(preflight.run(need()))["launch"]
    assert launch.state == FAIL and launch.detail.startswith(
        "ecs:RunInstances denied (DryRun): Forbidden.RAM"
    )
    assert launch.fix.startswith("grant ecs:RunInstances")


def test_a_zone_that_sells_nothing_fails_offered(fake):
    fake.zones = [zone("cn-shanghai-l", TYPE, "SoldOut", "WithoutStock")]
    offered = by_name(preflight.run(need()))["offered"]
    assert offered.state == FAIL and "SoldOut" in offered.detail


def test_a_caller_who_may_not_read_quotas_is_one_unknown_line(fake):
    fake.denied.add("DescribeAccountAttributes")
    q = by_name(preflight.run(need()))["quota"]
    assert q.state == UNKNOWN and "Forbidden.RAM" in q.detail and "\n" not in q.detail


def test_no_image_fails_and_the_dry_run_is_not_tried(fake):
    fake.images = []
    got = by_name(preflight.run(need()))
    assert got["image"].state == FAIL and got["launch"].state == "not checked"


def test_no_credentials_is_one_line_each(fake, monkeypatch):
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID")
    got = by_name(preflight.run(need()))
    assert got["identity"].detail == "no Alibaba Cloud credentials"
    assert got["quota"].detail == "not asked: no identity" and fake.seen == []


def test_no_network_is_said_and_nothing_raises(fake, monkeypatch):
    monkeypatch.setenv("ALIBABA_CLOUD_STS_ENDPOINT", CLOSED)
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN
    assert got["identity"].detail.startswith("STS GetCallerIdentity:")


# -- the bucket name (OSS GetBucketInfo through the OSS SDK V2) and --request-quota


def test_a_free_bucket_name_passes_signed_by_the_oss_sdk(fake):
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == OK and b.detail.endswith(": free in oss-cn-shanghai")
    assert "OSS bucket gpufleet-" in b.detail
    (asked,) = fake.buckets.seen
    assert asked["method"] == "GET" and "?bucketInfo" in asked["path"]
    assert asked["path"].startswith("/gpufleet-") and asked["auth"].startswith("OSS4-HMAC")


def test_a_bucket_another_account_holds_fails_and_one_of_yours_elsewhere_too(fake):
    fake.buckets.oss = THEIRS
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == FAIL and "another account holds it (AccessDenied)" in b.detail
    fake.buckets.oss, fake.buckets.oss_region = MINE, "oss-cn-beijing"
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == FAIL and "yours already, in oss-cn-beijing, not oss-cn-shanghai" in b.detail
    fake.buckets.oss_region = "oss-cn-shanghai"
    assert by_name(preflight.run(need()))["bucket"].state == OK
    assert FREE


def test_request_quota_prints_the_console_step_and_asks_nothing(fake):
    fake.attributes["used-spot-instance-vcpu-count"] = "496"
    report = preflight.run(need())
    said: list[str] = []
    assert preflight.file_requests(report, lambda q: pytest.fail(q), said.append) == 0
    assert said == [
        "quota spot: alicloud takes this request by hand: raise "
        "max-spot-instance-vcpu-count to 504 in the ECS console's quota page (Quota Center, "
        "privileges and quotas), region cn-shanghai"
    ]
