"""The reaper through the official Tencent Cloud SDK against a local signed-protocol fake
(see tencent_fake): the common fleet cases and the fault cases, zero wrong stops."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

import pytest

from gpufleet_node.fleet_names import HEARTBEAT_OBJECT_PREFIX
from gpufleet_node.idle_rules import UTC
from infra.clouds.tencent.entry import main_handler
from infra.clouds.tencent.reaper import BUCKET_ENV, COS_ENDPOINT_ENV, TencentCloud, parse_instance
from infra.reaper import tags as T
from infra.reaper.core import Report, reap
from infra.reaper.handler import CLOUDS
from scripts import teardown
from tests.reaper.fleet import cases
from tests.reaper.tencent_fake import SECRET_ID, SECRET_KEY, FakeCvm, FakeTencent, tc3_signature

pytestmark = pytest.mark.integration

REGION = "ap-guangzhou"
STACK = "tc"
PER_CASE = 8  # x 16 cases + extras: > 100 instances, so scans page (100 per page)


def cvm_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


AGENT_MINUTES = 90  # how far back the monitoring agent has reported Gpuutil, each minute


def build(now: datetime, *, no_agent: bool = True) -> tuple[FakeTencent, dict[str, str]]:
    """The fleet cases: the node's heartbeat is its object in the bucket (Last-Modified =
    the case's heartbeat time), and the monitoring agent reports the case's GPU
    utilization every minute since launch (0 % where the case names none). ``no_agent``:
    three nodes whose agent reports nothing (their metrics are unknown: the run fails)."""
    fake = FakeTencent()
    expected: dict[str, str] = {}
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK, T.TIER: "a100x1"}
    n = 0
    for case in cases(now):
        for _ in range(PER_CASE):
            n += 1
            iid = f"ins-{case.name}-{n:04d}"
            tags = {**base, **case.tags} if case.managed else {"Name": case.name}
            fake.instances.append(
                FakeCvm(
                    iid,
                    tags,
                    cvm_time(now - timedelta(minutes=case.age_min)),
                    state="STOPPED" if case.stopped else "RUNNING",
                    charge_type="SPOTPAID" if case.spot else "POSTPAID_BY_HOUR",
                )
            )
            expected[iid] = case.expect
            if case.heartbeat_min is not None:
                beat = now - timedelta(minutes=case.heartbeat_min)
                fake.objects[f"{HEARTBEAT_OBJECT_PREFIX}{iid}"] = beat.timestamp()
            reported = range(int(min(case.age_min, AGENT_MINUTES)))
            at = int(now.timestamp())
            fake.gpu[iid] = [(at - 60 * m, case.util or 0.0) for m in reported]
    extras: dict[str, tuple[str, dict[str, object]]] = {
        # TTL long past, but started again since creation: the launch time is unknown.
        "restarted": ("keep", {"latest_operation": "StartInstances"}),
        "ttl-refuses": ("stop", {"refuses_stop": True}),
        "prepaid": ("keep", {"charge_type": "PREPAID"}),
        "other-stack": ("absent", {}),
        # An absurd limit tag keeps only its own instance (unknown) until the 14-day cap.
        "bad-tag": ("keep", {}),
        # No monitoring agent (no Gpuutil datapoint) and a stale heartbeat: unknown, kept.
        "no-agent": ("keep", {}),
    }
    for name, (want, overrides) in extras.items():
        if name == "no-agent" and not no_agent:
            continue
        for _ in range(3):
            n += 1
            iid = f"ins-{name}-{n:04d}"
            tags = {**base, T.TTL_HOURS: "12"}
            if name == "other-stack":
                tags[T.STACK] = "other"
            if name == "bad-tag":
                tags[T.IDLE_MINUTES] = "1e12"
                del tags[T.TTL_HOURS]  # the tier's 24 h: not reached at 20 h
            fake.instances.append(
                FakeCvm(iid, tags, cvm_time(now - timedelta(hours=20)), **overrides)  # type: ignore[arg-type]
            )
            expected[iid] = want
            if name == "no-agent":
                del tags[T.TTL_HOURS]  # the tier's 24 h: not reached at 20 h
                stale = now - timedelta(minutes=40)
                fake.objects[f"{HEARTBEAT_OBJECT_PREFIX}{iid}"] = stale.timestamp()
            else:
                at = int(now.timestamp())
                fake.gpu[iid] = [(at - 60 * m, 0.0) for m in range(AGENT_MINUTES)]
    return fake, expected


def cloud(url: str, **kw: object) -> TencentCloud:
    """The reaper against the fake: CVM and Cloud Monitor at ``url``, and the stack's
    bucket there too (COS's S3-compatible API, path style)."""
    settings: dict[str, object] = {"bucket": FakeTencent.bucket, "cos_endpoint": url, **kw}
    return TencentCloud(
        REGION,
        endpoint=url,
        secret_id=SECRET_ID,
        secret_key=SECRET_KEY,
        sleep=lambda _s: None,  # the retry backoff is not what these tests measure
        **settings,  # type: ignore[arg-type]
    )


def wrong_stops(report: Report, expected: dict[str, str]) -> list[tuple[str, str]]:
    return [
        (d.instance_id, d.reason)
        for d in report.decisions
        if d.action == "stop" and expected.get(d.instance_id) != "stop"
    ]


def check(report: Report, expected: dict[str, str]) -> None:
    want = {i: a for i, a in expected.items() if a != "absent"}
    got = {d.instance_id: d.action for d in report.decisions}
    assert not wrong_stops(report, expected)
    assert got == want


# ---------------------------------------------------------------------- the fake's signer


def test_fake_signature_check_matches_tencents_published_example() -> None:
    # Tencent Cloud API 3.0 "Signature v3", the CVM DescribeInstances example.
    payload = (
        '{"Limit": 1, "Filters": [{"Values": ["\\u672a\\u547d\\u540d"], "Name": "instance-name"}]}'
    )
    assert (
        hashlib.sha256(payload.encode()).hexdigest()
        == "35e9c5b0e3ae67532d3c9f17ead6c90222632e5b1ff7f6e89887f1398934f064"
    )
    sig = tc3_signature(
        "Gu5t9xGARNpq86cd98joQYCN3EXAMPLE",
        method="POST",
        uri="/",
        query="",
        headers={
            "content-type": "application/json; charset=utf-8",
            "host": "cvm.tencentcloudapi.com",
        },
        payload=payload.encode(),
        timestamp=1551113065,
        service="cvm",
    )
    assert sig == "72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"


def test_fake_refuses_a_request_signed_with_the_wrong_key() -> None:
    fake, _ = build(datetime.now(UTC))
    with fake.running() as url:
        bad = TencentCloud(
            REGION, endpoint=url, secret_id=SECRET_ID, secret_key="wrong", max_attempts=1
        )
        with pytest.raises(Exception, match=r"AuthFailure\.SignatureFailure"):
            bad.scan(STACK)
    assert fake.rejected == ["AuthFailure.SignatureFailure"]
    assert not fake.calls


def _fields(model: object) -> set[str]:
    return {name.lstrip("_") for name in vars(model)}


def test_fakes_get_monitor_data_answer_has_exactly_the_sdk_models_fields() -> None:
    """The fake answers in the SDK's own shape: every field of GetMonitorDataResponse and
    of each DataPoint (MaxValues, MinValues, AvgValues only come with SpecifyStatistics,
    which the reaper never sends), and nothing the SDK does not know."""
    from tencentcloud.monitor.v20180724 import models

    fake = FakeTencent()
    fake.gpu["ins-1"] = [(1_764_000_000, 12.5)]
    answer = fake.get_monitor_data(
        {
            "Namespace": "QCE/CVM",
            "MetricName": "Gpuutil",
            "Period": 60,
            "StartTime": "2025-11-24T00:00:00+00:00",
            "EndTime": "2025-11-24T23:00:00+00:00",
            "Instances": [{"Dimensions": [{"Name": "InstanceId", "Value": "ins-1"}]}],
        }
    )
    assert set(answer) | {"RequestId"} == _fields(models.GetMonitorDataResponse())
    statistics = {"MaxValues", "MinValues", "AvgValues"}
    point = answer["DataPoints"][0]
    assert set(point) == _fields(models.DataPoint()) - statistics
    parsed = models.GetMonitorDataResponse()
    parsed._deserialize({**answer, "RequestId": "r"})
    assert parsed.DataPoints[0].Timestamps == [1_764_000_000.0]
    assert parsed.DataPoints[0].Values == [12.5]
    assert parsed.DataPoints[0].Dimensions[0].Value == "ins-1"


def test_the_request_asks_for_the_sdks_own_fields_and_at_most_its_limits() -> None:
    from tencentcloud.monitor.v20180724 import models

    sent: list[dict[str, object]] = []

    def record(service: str, action: str, params: dict[str, object]) -> object:
        sent.append(params)
        raise RuntimeError("recorded, not sent")

    tc = cloud("http://127.0.0.1:1", max_attempts=1)
    tc._call = record  # type: ignore[method-assign]
    now = datetime(2026, 3, 1, tzinfo=UTC)
    # A day of minutes (a long idle tag's window): 7,200 points a call at most, not 50 ids.
    ids = [f"ins-{n}" for n in range(60)]
    tc.metrics(ids, start=now - timedelta(days=1), end=now)
    assert set(sent[0]) <= _fields(models.GetMonitorDataRequest())
    per_call = [len(q["Instances"]) for q in sent]  # type: ignore[arg-type]
    assert sum(per_call) == 60 and max(per_call) * (24 * 60 + 2) <= 7200


# ---------------------------------------------------------------------- fleet cases


def test_sdk_scan_pages_by_offset_and_filters_by_tags_server_side() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        found = cloud(url).scan(STACK)
    assert {i.instance_id for i in found} == {i for i, a in expected.items() if a != "absent"}
    scans = [q for action, q in fake.calls if action == "DescribeInstances"]
    assert [q["Offset"] for q in scans] == [0, 100]
    assert scans[0]["Filters"] == [
        {"Name": "tag:managed-by", "Values": ["gpufleet"]},
        {"Name": "tag:gpufleet:stack", "Values": [STACK]},
    ]
    assert not fake.rejected  # every request arrived TC3-signed and valid


def test_dry_run_decides_every_fleet_case_and_stops_nothing() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack=STACK, apply=False)
    check(report, expected)
    bad = [d for d in report.decisions if "-bad-tag-" in d.instance_id]
    assert bad and all(d.unknown and d.action == "keep" for d in bad)
    assert not [a for a, _ in fake.calls if a == "StopInstances"]
    metric_calls = [q for a, q in fake.calls if a == "GetMonitorData"]
    assert metric_calls and all(len(q["Instances"]) <= 50 for q in metric_calls)
    # Stopped for silence only where the heartbeat object went stale and the GPU was idle.
    silent = {
        d.instance_id for d in report.decisions if d.action == "stop" and "silent" in d.reason
    }
    assert silent == {i for i in expected if "-stale-heartbeat-idle-" in i or "-spot-idle-" in i}
    no_agent = [d for d in report.decisions if "-no-agent-" in d.instance_id]
    assert no_agent and all(d.unknown and "Gpuutil datapoint" in d.reason for d in no_agent)
    assert report.exit_code == 1  # the agent-less nodes: metrics unreadable, reported
    assert not fake.rejected  # every COS HEAD arrived SigV4-signed and valid


def test_apply_stops_with_stop_charging_and_a_refused_id_does_not_hold_the_others_back() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack=STACK, apply=True)
    check(report, expected)
    stops = [q for a, q in fake.calls if a == "StopInstances"]
    assert stops and all(q["StoppedMode"] == "STOP_CHARGING" for q in stops)
    stopped = {i.instance_id for i in fake.instances if i.state == "STOPPED"}
    already = {i for i in expected if "-already-stopped-" in i}
    want = {i for i, a in expected.items() if a == "stop" and "refuses" not in i}
    assert stopped - already == want
    failed = {d.instance_id for d in report.decisions if d.result.startswith("failed")}
    assert failed == {i for i in expected if "-ttl-refuses-" in i}
    assert all(
        "StoppedModeStopCharging" in d.result for d in report.decisions if d.instance_id in failed
    )
    assert report.exit_code == 1


def test_an_instance_started_again_since_creation_is_kept_past_the_ttl() -> None:
    raw = {
        "InstanceId": "ins-1",
        "InstanceState": "RUNNING",
        "CreatedTime": "2026-01-01T00:00:00Z",
        "LatestOperation": "StartInstances",
        "Tags": [{"Key": T.MANAGED_BY, "Value": T.MANAGED_BY_VALUE}],
    }
    inst = parse_instance(raw)
    assert inst.launched_at is None and "StartInstances" in (inst.problem or "")
    fresh = parse_instance({**raw, "LatestOperation": None})
    assert fresh.launched_at == datetime(2026, 1, 1, tzinfo=UTC) and fresh.problem is None


def test_bad_tags_and_charge_types_affect_only_their_own_instance() -> None:
    good = parse_instance(
        {
            "InstanceId": "ins-a",
            "InstanceState": "RUNNING",
            "CreatedTime": "2026-01-01T00:00:00Z",
            "InstanceChargeType": "SPOTPAID",
            "Tags": [{"Key": "k", "Value": "v"}],
        }
    )
    assert good.spot and not good.prepaid and good.problem is None
    bad = parse_instance(
        {
            "InstanceId": "ins-b",
            "InstanceState": "RUNNING",
            "CreatedTime": "not a time",
            "Tags": "x",
        }
    )
    assert bad.problem and bad.launched_at is None
    assert parse_instance({"InstanceId": "ins-c", "InstanceChargeType": "CDHPAID"}).prepaid


# ---------------------------------------------------------------------- faults


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_on_every_monitor_call_keeps_everything_but_the_ttl_and_fails_the_run(
    status: int,
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.status_actions["GetMonitorData"] = status
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=2), stack=STACK, apply=True)
    assert not wrong_stops(report, expected)
    stops = {d.instance_id for d in report.decisions if d.action == "stop"}
    ttl = {i for i, a in expected.items() if a == "stop" and "ttl" in i}
    assert stops == ttl  # the TTL needs no metrics; silence needs them
    assert report.exit_code == 1
    assert any("metrics unreadable" in p for p in report.problems)


def test_throttling_and_503s_are_retried_to_the_same_decisions() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.throttle_rate = 0.3
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=12), stack=STACK, apply=True)
    check(report, expected)
    assert any(a == "DescribeInstances" for a, _ in fake.calls)
    stopped = {i.instance_id for i in fake.instances if i.state == "STOPPED"}
    assert all(expected[i] == "stop" or "-already-stopped-" in i for i in stopped)


def test_request_limit_exceeded_on_every_stop_stops_nothing_and_fails_the_run() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        tc = cloud(url, max_attempts=3)
        fake.fail_actions.clear()
        original = fake.stop_instances
        fake.stop_instances = lambda q: {"Error": {"Code": "RequestLimitExceeded", "Message": "x"}}  # type: ignore[method-assign]
        report = reap(tc, stack=STACK, apply=True)
        fake.stop_instances = original  # type: ignore[method-assign]
    assert not wrong_stops(report, expected)
    assert all(i.state != "STOPPED" or "-already-stopped-" in i.instance_id for i in fake.instances)
    assert report.exit_code == 1
    assert tc.calls["StopInstances"] == 3  # one batch of 11 ids, three bounded attempts


def test_metrics_answer_that_leaves_instances_out_keeps_them_and_fails_the_run() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    dropped = {i for i in expected if i.startswith("ins-busy-")}
    fake.drop_metrics |= dropped
    with fake.running() as url:
        report = reap(cloud(url), stack=STACK, apply=False)
    assert not wrong_stops(report, expected)
    unknown = {d.instance_id for d in report.decisions if d.unknown and "missing" in d.reason}
    assert unknown == dropped
    assert report.exit_code == 1


def test_a_timeout_on_the_metrics_call_keeps_the_nodes_and_fails_the_run() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.slow_actions["GetMonitorData"] = 2.5
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=1, timeout_s=1), stack=STACK, apply=True)
    assert not wrong_stops(report, expected)
    reasons = [d.reason for d in report.decisions if d.unknown and "metrics unreadable" in d.reason]
    assert reasons and all("ClientNetworkError" in r for r in reasons)
    assert report.exit_code == 1


def test_an_html_page_from_the_endpoint_is_an_error_not_an_empty_fleet() -> None:
    fake, _ = build(datetime.now(UTC))
    fake.html_actions.add("DescribeInstances")
    with fake.running() as url, pytest.raises(Exception, match=r"JSONDecodeError|not the CVM"):
        reap(cloud(url, max_attempts=1), stack=STACK)


def test_decisions_use_the_services_date_header_not_this_hosts_clock() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.date_offset_s = 0.0
    with fake.running() as url:
        # This host's clock two hours ahead: the TTL and lease rules must not move with it.
        report = reap(cloud(url), stack=STACK, now=now + timedelta(hours=2))
    check(report, expected)
    assert report.summary["clock"]["source"] == "service Date header"
    assert report.summary["clock"]["skew_minutes"] == pytest.approx(120, abs=1)


# ---------------------------------------------------------------------- entry points


def test_registry_vendors_the_per_product_sdks_for_scf() -> None:
    entry = CLOUDS["tencent"]
    assert entry.vendor_sdk
    assert set(entry.sdks) == {
        "tencentcloud-sdk-python-common",
        "tencentcloud-sdk-python-cvm",
        "tencentcloud-sdk-python-monitor",
    }


def test_teardown_cli_speaks_tencent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now, no_agent=False)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv(BUCKET_ENV, FakeTencent.bucket)
    with fake.running() as url:
        monkeypatch.setenv(COS_ENDPOINT_ENV, url)
        code = teardown.main(
            [
                "--provider",
                "tencent",
                "--region",
                REGION,
                "--stack",
                STACK,
                "--json",
                "--endpoint-url",
                url,
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    got = {d["instance_id"]: d["action"] for d in out["decisions"]}
    assert got == {i: a for i, a in expected.items() if a != "absent"}


def test_teardown_cli_without_tencent_credentials_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRETID"):
        monkeypatch.delenv(name, raising=False)
    code = teardown.main(["--provider", "tencent", "--region", REGION])
    assert code == 2
    assert "TENCENTCLOUD_SECRET_ID" in capsys.readouterr().err


def test_scf_main_handler_reaps_its_stack_with_the_execution_roles_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now, no_agent=False)
    with fake.running() as url:
        for key, value in {
            "GPUFLEET_STACK": STACK,
            "GPUFLEET_APPLY": "false",
            "GPUFLEET_REGION": REGION,
            "GPUFLEET_ENDPOINT_URL": url,
            BUCKET_ENV: FakeTencent.bucket,
            COS_ENDPOINT_ENV: url,
            "TENCENTCLOUD_SECRETID": SECRET_ID,
            "TENCENTCLOUD_SECRETKEY": SECRET_KEY,
            "TENCENTCLOUD_SESSIONTOKEN": "fake-token",
        }.items():
            monkeypatch.setenv(key, value)
        out = json.loads(main_handler({}, None))
    assert out["apply"] is False
    assert {s["instance_id"] for s in out["stops"]} == {
        i for i, a in expected.items() if a == "stop"
    }
