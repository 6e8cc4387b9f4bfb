"""Tencent Cloud's preflight through the official SDK against a local fake on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from tencentcloud.cvm.v20170312 import models

from infra import preflight
from infra.clouds.tencent import preflight as tencent
from infra.preflight import FAIL, INFO, OK, UNKNOWN, Need
from tests.preflight.bucket_fake import FREE, MINE, THEIRS, BucketFake
from tests.preflight.tencent_fake import TencentFake, offering, quota_row

CLOSED = "127.0.0.1:9"


def need(**kw: Any) -> Need:
    base = Need(
        stack="tencent-t4x1",
        provider="tencent",
        region="ap-guangzhou",
        zone="ap-guangzhou-3",
        instance_type="GN7.2XLARGE32",
        nodes=1,
        vcpus=8,
        gpus=1,
        billing="spot",
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[TencentFake]:
    with TencentFake() as f, BucketFake() as b:
        monkeypatch.setenv("TENCENTCLOUD_COS_DOMAIN", b.host)
        f.buckets = b  # type: ignore[attr-defined]
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtesting")
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "testing")
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", f.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_STS_ENDPOINT", f.endpoint)
        yield f


def by_name(report: preflight.Report) -> dict[str, preflight.Check]:
    return {c.name: c for c in report.checks}


def members(cls: type) -> set[str]:
    return {n[1:] for n in vars(cls()) if n.startswith("_")}


def test_the_fake_answers_only_fields_of_the_sdk_s_own_models():
    f = TencentFake()
    quota = f.answer("DescribeAccountQuota", {})
    assert set(quota) <= members(models.DescribeAccountQuotaResponse)
    assert set(quota["AccountQuotaOverview"]) <= members(models.AccountQuotaOverview)
    assert set(quota["AccountQuotaOverview"]["AccountQuota"]) <= members(models.AccountQuota)
    assert set(quota_row("z", 1, 0)) <= members(models.PostPaidQuota)
    assert set(quota_row("z", 1, 0)) <= members(models.SpotPaidQuota)
    assert set(f.images[0]) <= members(models.Image)
    assert set(f.offerings[0]) <= members(models.InstanceTypeQuotaItem)
    assert "DryRun" in inspect.getsource(models.RunInstancesRequest)
    f.server.server_close()


def test_an_account_with_quota_passes(fake):
    got = by_name(preflight.run(need()))
    assert got["identity"].state == OK and "100000000001" in got["identity"].detail
    assert got["quota spot"].state == OK
    assert "30 instances left of 30, the stack needs 1" in got["quota spot"].detail
    assert got["quota on-demand"].state == INFO
    assert got["image"].state == OK and "img-487zeit5" in got["image"].detail
    assert got["launch"].state == OK
    assert got["offered"].state == OK and "ap-guangzhou-3" in got["offered"].detail
    run = [p for a, p in fake.requests if a == "RunInstances"]
    assert run and run[0]["DryRun"] is True and run[0]["InstanceChargeType"] == "SPOTPAID"


def test_a_short_spot_quota_in_the_zone_fails_with_the_fix(fake):
    fake.spot_paid = [quota_row("ap-guangzhou-3", 2, 2)]
    report = preflight.run(need())
    q = by_name(report)["quota spot"]
    assert q.state == FAIL and "0 instances left of 2" in q.detail and q.fix
    assert report.status == 1


def test_a_denied_run_instances_is_told_by_the_dry_run(fake):
    fake.denied.add("RunInstances")
    launch = by_name(preflight.run(need()))["launch"]
    assert launch.state == FAIL and "cvm:RunInstances denied" in launch.detail
    assert launch.fix.startswith("grant cvm:RunInstances")


def test_no_credentials_is_one_line_each(fake, monkeypatch):
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN
    assert got["identity"].detail == "no Tencent Cloud credentials"
    assert got["quota"].detail == "not asked: no identity" and fake.requests == []


def test_no_network_is_said_and_nothing_raises(fake, monkeypatch):
    monkeypatch.setenv("TENCENTCLOUD_STS_ENDPOINT", CLOSED)
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN
    assert got["identity"].detail.startswith("STS GetCallerIdentity:")


def test_a_zone_whose_type_is_sold_out_fails_offered_with_the_zones_that_sell_it(fake):
    fake.offerings = [
        offering("ap-guangzhou-3", "GN7.2XLARGE32", "SOLD_OUT", SoldOutReason="sold out"),
        offering("ap-guangzhou-6", "GN7.2XLARGE32"),
    ]
    offered = by_name(preflight.run(need()))["offered"]
    assert offered.state == FAIL and "ap-guangzhou-3: sold out" in offered.detail
    assert offered.fix == "set gpufleet:zone to one of ap-guangzhou-6, or zone: auto"


def test_a_region_that_sells_the_type_nowhere_says_where_to_look(fake):
    fake.offerings = []
    offered = by_name(preflight.run(need()))["offered"]
    assert offered.state == FAIL and "make where" in offered.fix


# -- the bucket name (COS HEAD Bucket through the COS SDK) and --request-quota


def test_a_free_bucket_name_passes_with_the_account_s_appid(fake):
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == OK and b.detail.endswith(": free in ap-guangzhou"), b.detail
    assert "COS bucket gpufleet-" in b.detail
    (asked,) = fake.buckets.seen
    assert asked["method"] == "HEAD" and asked["auth"].startswith("q-sign-algorithm=sha1")


def test_a_bucket_another_account_holds_fails_and_one_of_yours_elsewhere_too(fake):
    fake.buckets.cos = THEIRS
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == FAIL and "another account holds it (403)" in b.detail
    fake.buckets.cos, fake.buckets.cos_region = MINE, "ap-beijing"
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == FAIL and "yours already, in ap-beijing, not ap-guangzhou" in b.detail
    assert FREE


def test_request_quota_prints_the_documented_step(fake):
    fake.spot_paid = [quota_row("ap-guangzhou-3", 2, 2)]
    said: list[str] = []
    report = preflight.run(need())
    assert preflight.file_requests(report, lambda q: pytest.fail(q), said.append) == 0
    assert said == [f"quota spot: tencent takes this request by hand: {tencent.QUOTA_FIX}"]
