"""The reaper with the official Alicloud SDKs against a local protocol fake (see alicloud_fake)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from gpufleet_node.idle_rules import UTC
from infra.clouds.alicloud.entry import fc_handler
from infra.clouds.alicloud.reaper import AlicloudCloud
from infra.reaper import tags as T
from infra.reaper.core import Report, reap
from scripts import teardown
from tests.reaper.alicloud_fake import FakeAlicloud, FakeInstance

pytestmark = pytest.mark.integration

REGION = "cn-beijing"
ACCOUNT = "1234567890"
PER_CASE = 12  # x 15 cases: 180 instances, so scans page (100 per page)


def ali_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def build(now: datetime) -> tuple[FakeAlicloud, dict[str, str]]:
    fake = FakeAlicloud()
    expected: dict[str, str] = {}
    lease = (now + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "ali", T.TIER: "a10x1"}
    # name: (expect, age min, heartbeat min ago, util, extra tags, fake instance overrides)
    cases: dict[str, tuple[str, float, float | None, float | None, dict[str, str], dict]] = {
        "busy": ("keep", 180, 1, 90, {}, {}),
        "idle-alive": ("keep", 180, 2, 0, {}, {}),
        "stale-idle": ("stop", 180, 40, 1, {}, {}),
        "recently-silent": ("keep", 180, 20, 1, {}, {}),  # under stale + skew (25 min)
        "gone": ("keep", 180, None, None, {}, {}),  # never seen: unknown, only the TTL
        "booting": ("keep", 10, None, None, {}, {}),
        "lease": ("keep", 180, None, None, {T.KEEP_ALIVE_UNTIL: lease}, {}),
        "protected": ("keep", 180, None, None, {T.PROTECTED: "true"}, {}),
        "ttl": ("stop", 25 * 60, 1, 100, {}, {}),
        "spot-idle": ("stop", 180, 40, 0, {}, {"spot_strategy": "SpotAsPriceGo"}),
        "stopped": ("keep", 180, None, None, {}, {"status": "Stopped"}),
        "prepaid-idle": ("keep", 180, None, None, {}, {"charge_type": "PrePaid"}),
        "refuses": ("stop", 180, 40, 0, {}, {"refuses_stop": True}),
        "other-stack": ("absent", 180, None, None, {T.STACK: "other"}, {}),
        "untagged": ("absent", 180, None, None, {"__untagged__": "1"}, {}),
    }
    n = 0
    for name, (expect, age, beat, util, extra, overrides) in cases.items():
        for _ in range(PER_CASE):
            n += 1
            iid = f"i-{name}-{n:04d}"
            tags = {"Name": name} if "__untagged__" in extra else {**base, **extra}
            fake.instances.append(
                FakeInstance(iid, tags, ali_time(now - timedelta(minutes=age)), **overrides)
            )
            expected[iid] = expect
            if beat is not None:
                at = now - timedelta(minutes=beat)
                ms = int(at.timestamp() * 1000)
                fake.datapoints[("Heartbeat", iid)] = [(ms, float(int(at.timestamp())))]
                if util is not None:
                    fake.datapoints[("GPUUtilization", iid)] = [(ms, util)]
    return fake, expected


def cloud(url: str, **kw: object) -> AlicloudCloud:
    return AlicloudCloud(
        REGION,
        endpoint=url,
        access_key_id="fake-id",
        access_key_secret="fake-secret",
        account_id=ACCOUNT,
        sleep=lambda _s: None,  # the retry backoff is not what these tests measure
        **kw,  # type: ignore[arg-type]
    )


def check(report: Report, expected: dict[str, str]) -> None:
    want = {i: a for i, a in expected.items() if a != "absent"}
    got = {d.instance_id: d.action for d in report.decisions}
    wrong = [
        (d.instance_id, d.action, d.reason)
        for d in report.decisions
        if d.action != want[d.instance_id]
    ]
    assert not wrong
    assert got == want


def test_sdk_scan_pages_by_next_token_and_filters_by_tags_server_side() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        found = cloud(url).scan("ali")
    assert {i.instance_id for i in found} == {i for i, a in expected.items() if a != "absent"}
    scans = [q for action, q in fake.calls if action == "DescribeInstances"]
    assert len(scans) == 2  # 156 matching instances, 100 per page
    assert scans[0]["Tag.1.Key"] == "managed-by"
    assert scans[0]["Tag.2.Value"] == "ali"
    assert "NextToken" in scans[1]


def test_dry_run_decides_exactly_and_stops_nothing() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack="ali", apply=False)
    check(report, expected)
    assert not [a for a, _ in fake.calls if a == "StopInstances"]
    metric_calls = [q for a, q in fake.calls if a == "DescribeMetricList"]
    assert metric_calls
    assert all(q["Namespace"] == f"acs_customMetric_{ACCOUNT}" for q in metric_calls)
    for q in metric_calls:
        (dims,) = json.loads(q["Dimensions"])
        assert dims["groupId"] == "0" and dims["dimension"].startswith("instanceId=i-")
        assert int(q["StartTime"]) < int(q["EndTime"])
    assert not [a for a, _ in fake.calls if a == "DescribeCustomMetricList"]


def test_apply_stops_with_stop_charging_and_reports_refusals() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack="ali", apply=True)
    check(report, expected)
    stops = [q for a, q in fake.calls if a == "StopInstances"]
    assert stops
    assert all(q["StoppedMode"] == "StopCharging" for q in stops)
    stopped = {i.instance_id for i in fake.instances if i.status == "Stopped"}
    want = {i for i, a in expected.items() if a == "stop" and "refuses" not in i}
    already = {i for i in expected if "-stopped-" in i}
    assert stopped - already == want
    failed = {d.instance_id for d in report.decisions if d.result.startswith("failed")}
    assert failed == {i for i in expected if "refuses" in i}
    assert report.exit_code == 1


def test_prepaid_instances_are_kept_because_stopping_saves_nothing() -> None:
    now = datetime.now(UTC)
    fake, _ = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack="ali")
    reasons = {d.reason for d in report.decisions if "prepaid" in d.instance_id}
    assert reasons == {"subscription (prepaid) billing: stopping would save nothing"}


def test_throttling_and_5xx_are_retried_to_the_same_decisions() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.throttle_rate = 0.3
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=10), stack="ali", apply=True)
    check(report, expected)
    stopped = {i.instance_id for i in fake.instances if i.status == "Stopped"}
    assert all(expected[i] == "stop" or "-stopped-" in i for i in stopped)


def test_cloudmonitor_error_keeps_everything_but_the_ttl_and_fails_the_run() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    fake.fail_actions.add("DescribeMetricList")
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=1), stack="ali", apply=False)
    stops = {d.instance_id for d in report.decisions if d.action == "stop"}
    # Only the TTL (which needs no metrics) still stops.
    assert stops == {i for i in expected if "-ttl-" in i}
    assert report.exit_code == 1
    assert "metrics unreadable" in report.problems[0]


def test_teardown_cli_speaks_alicloud(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.setenv("GPUFLEET_ALICLOUD_ACCOUNT_ID", ACCOUNT)
    with fake.running() as url:
        code = teardown.main(
            [
                *("--provider", "alicloud", "--region", REGION, "--stack", "ali"),
                "--json",
                "--endpoint-url",
                url,
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    got = {d["instance_id"]: d["action"] for d in out["decisions"]}
    assert got == {i: a for i, a in expected.items() if a != "absent"}


def test_teardown_cli_without_alicloud_credentials_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = teardown.main(["--provider", "alicloud", "--region", REGION])
    assert code == 2
    assert "ALIBABA_CLOUD_ACCESS_KEY_ID" in capsys.readouterr().err


class _Creds:
    access_key_id = "fake-id"
    access_key_secret = "fake-secret"
    security_token = "fake-token"


class _Context:
    credentials = _Creds()
    region = REGION
    account_id = ACCOUNT


def test_function_compute_handler_reaps_its_stack_with_the_context_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        monkeypatch.setenv("GPUFLEET_STACK", "ali")
        monkeypatch.setenv("GPUFLEET_APPLY", "false")
        monkeypatch.setenv("GPUFLEET_ENDPOINT_URL", url)
        out = json.loads(fc_handler(b"{}", _Context()))
    assert out["apply"] is False
    assert {s["instance_id"] for s in out["stops"]} == {
        i for i, a in expected.items() if a == "stop"
    }


# The success response example of DescribeMetricList, as Alibaba's API reference
# prints it (help/en/cms/developer-reference/api-cms-2019-01-01-describemetriclist,
# read 2026-12-01): Datapoints is a JSON string.
DOCUMENTED_ANSWER = {
    "NextToken": "xxxxxx",
    "RequestId": "021472A6-25E3-4094-8D00-BA4B6A5486C3",
    "Success": True,
    "Datapoints": (
        '[{"timestamp":1548777660000,"userId":"123456789876****",'
        '"instanceId":"i-abcdefgh12****","Minimum":93.1,"Average":99.52,"Maximum":100}]'
    ),
    "Code": "200",
    "Message": "The specified resource is not found.",
    "Period": "60",
}


def test_the_parser_reads_the_documented_describe_metric_list_example() -> None:
    from alibabacloud_cms20190101 import models

    from infra.clouds.alicloud.reaper import parse_metric_list

    # what the SDK hands the reaper: its own model, read back as a map
    body = models.DescribeMetricListResponseBody().from_map(DOCUMENTED_ANSWER).to_map()
    points, token = parse_metric_list(body, "cpu_idle", "i-abcdefgh12****")
    assert points == [(datetime(2019, 1, 29, 16, 1, tzinfo=UTC), 100.0)]
    assert token == "xxxxxx"
    with pytest.raises(ValueError, match="asked for 'i-other'"):
        parse_metric_list(body, "cpu_idle", "i-other")


def test_an_answer_the_parser_cannot_read_is_an_error_never_an_idle_node() -> None:
    from infra.clouds.alicloud.reaper import parse_metric_list

    for broken in (
        {**DOCUMENTED_ANSWER, "Code": "403", "Success": False},
        {**DOCUMENTED_ANSWER, "Datapoints": '{"not": "a list"}'},
        {**DOCUMENTED_ANSWER, "Datapoints": '[{"timestamp": 1548777660000}]'},
        {**DOCUMENTED_ANSWER, "Datapoints": '[{"Maximum": 1}]'},
    ):
        with pytest.raises((ValueError, RuntimeError)):
            parse_metric_list(broken, "Heartbeat", "i-abcdefgh12****")
    empty, token = parse_metric_list({**DOCUMENTED_ANSWER, "Datapoints": "[]"}, "m", "i-1")
    assert empty == [] and token == "xxxxxx"


def test_the_fakes_answer_is_the_documented_shape_the_sdk_model_reads() -> None:
    from alibabacloud_cms20190101 import models

    fake = FakeAlicloud(account_id=ACCOUNT)
    fake.datapoints[("Heartbeat", "i-1")] = [(1548777660000, 1.0)]
    answer = fake.describe_metric_list(
        {
            "Namespace": f"acs_customMetric_{ACCOUNT}",
            "MetricName": "Heartbeat",
            "Dimensions": '[{"groupId": "0", "dimension": "instanceId=i-1"}]',
            "StartTime": "1548777600000",
            "EndTime": "1548777720000",
            "Period": "60",
        }
    )
    body = models.DescribeMetricListResponseBody().from_map(answer)
    assert set(answer) <= set(body.to_map())  # every key is one the SDK model knows
    (point,) = json.loads(body.datapoints)
    documented = json.loads(DOCUMENTED_ANSWER["Datapoints"])[0]  # type: ignore[arg-type]
    assert {"timestamp", "Minimum", "Average", "Maximum", "userId"} <= set(point)
    assert set(point) - set(documented) == {"groupId", "dimension"}  # the dims asked by


def test_the_fake_refuses_a_parameter_the_sdk_request_model_does_not_define() -> None:
    fake = FakeAlicloud()
    status, body = fake.handle("DescribeMetricList", {"Dimension": "instanceId=i-1"})
    assert status == 400 and "Dimension" in body["Message"]


def test_the_reaper_role_grants_exactly_the_actions_the_reaper_calls() -> None:
    from infra.clouds.alicloud.program import reaper_policy
    from tests.infra.alicloud_ram import SDK_PACKAGES
    from tests.reaper.alicloud_fake import REQUEST_MODELS

    ram_code = {package: code for code, package in SDK_PACKAGES.items()}

    now = datetime.now(UTC)
    fake, _ = build(now)
    with fake.running() as url:
        reap(cloud(url), stack="ali", apply=True)
    # the RAM code of each action is its SDK's (ecs, cms)
    called = {f"{ram_code[REQUEST_MODELS[a].__module__.split('.')[0]]}:{a}" for a, _ in fake.calls}
    assert called == {"ecs:DescribeInstances", "cms:DescribeMetricList", "ecs:StopInstances"}
    doc = json.loads(reaper_policy("ali"))
    granted = {a for st in doc["Statement"] if st["Effect"] == "Allow" for a in st["Action"]}
    # and the spot recovery's (test_spot_recovery_alicloud checks it calls them)
    recovery = {"cms:DescribeSystemEventAttribute", "ecs:StartInstances"}
    assert granted == called | recovery


def test_a_node_stopped_in_standard_mode_is_reported_every_run_and_never_started() -> None:
    """An OS power-off (the watchdog's fallback) stops in standard mode, which still bills
    the GPUs. A stopped instance cannot be stopped again in economical mode, and the reaper
    starts nothing: it reports the instance and fails the run, so someone acts."""
    now = datetime.now(UTC)
    fake = FakeAlicloud()
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "ali", T.TIER: "a10x1"}
    start = ali_time(now - timedelta(hours=3))
    for iid, mode in (("i-billed", "KeepCharging"), ("i-saving", "StopCharging")):
        fake.instances.append(FakeInstance(iid, base, start, status="Stopped", stopped_mode=mode))
    with fake.running() as url:
        report = reap(cloud(url), stack="ali", apply=True)
    by_id = {d.instance_id: d for d in report.decisions}
    assert by_id["i-billed"].action == "keep" and by_id["i-billed"].unknown
    assert "still billed" in by_id["i-billed"].reason
    assert by_id["i-saving"].reason == "not running (stopped)"
    assert report.problems == ["1 stopped instance(s) still billed for their compute"]
    assert report.exit_code == 1
    assert {a for a, _ in fake.calls} == {"DescribeInstances"}


def test_the_reapers_stop_leaves_the_instance_in_economical_mode() -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running() as url:
        reap(cloud(url), stack="ali", apply=True)
        again = reap(cloud(url), stack="ali", apply=False)
    stopped = [
        i for i in fake.instances if expected[i.instance_id] == "stop" and not i.refuses_stop
    ]
    assert stopped and all(i.stopped_mode == "StopCharging" for i in stopped)
    assert again.summary["billed_while_stopped"] == 0


def test_teardown_cli_without_the_account_id_exits_2_before_any_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.delenv("GPUFLEET_ALICLOUD_ACCOUNT_ID", raising=False)
    fake = FakeAlicloud()
    with fake.running() as url:
        code = teardown.main(["--provider", "alicloud", "--region", REGION, "--endpoint-url", url])
    err = capsys.readouterr().err
    assert code == 2 and "GPUFLEET_ALICLOUD_ACCOUNT_ID" in err and "Traceback" not in err
    assert not fake.calls


# One instance of DescribeInstances' documented success example, the fields the parser
# reads, in our own fixture (help/en/ecs/developer-reference/
# api-ecs-2014-05-26-describeinstances, JSON example; read 2026-12-01).
DOCUMENTED_INSTANCE = {
    "InstanceId": "i-bp67acfmxazb4p****",
    "InstanceChargeType": "PostPaid",
    "InstanceType": "ecs.g5.large",
    "Status": "Running",
    "StoppedMode": "KeepCharging",
    "StartTime": "2017-12-10T04:04Z",
    "CreationTime": "2017-12-10T04:04Z",
    "SpotStrategy": "NoSpot",
    "Tags": {"Tag": [{"TagKey": "TestKey", "TagValue": "TestValue"}]},
}


def test_the_scan_parser_reads_the_documented_describe_instances_example() -> None:
    from alibabacloud_ecs20140526 import models

    from infra.clouds.alicloud.reaper import parse_instance

    def through_the_sdk(raw: dict[str, object]) -> dict[str, object]:
        body = {"RequestId": "r", "Instances": {"Instance": [raw]}}
        read = models.DescribeInstancesResponseBody().from_map(body).to_map()
        return read["Instances"]["Instance"][0]  # type: ignore[no-any-return]

    assert through_the_sdk(DOCUMENTED_INSTANCE) == DOCUMENTED_INSTANCE  # the SDK's names
    running = parse_instance(through_the_sdk(DOCUMENTED_INSTANCE))
    assert (running.state, running.instance_type, running.tags) == (
        "running",
        "ecs.g5.large",
        {"TestKey": "TestValue"},
    )
    assert running.launched_at == datetime(2017, 12, 10, 4, 4, tzinfo=UTC)
    assert not (running.spot or running.prepaid or running.problem)
    assert not running.billed_while_stopped  # running: the stop mode does not apply yet
    stopped = parse_instance(through_the_sdk({**DOCUMENTED_INSTANCE, "Status": "Stopped"}))
    assert stopped.billed_while_stopped
    saving = {**DOCUMENTED_INSTANCE, "Status": "Stopped", "StoppedMode": "StopCharging"}
    assert not parse_instance(through_the_sdk(saving)).billed_while_stopped
