"""The reaper with the official Azure SDKs against a local HTTPS protocol fake (azure_fake).

The common fleet cases (tests/reaper/fleet.py ``cases``) and the fault scenarios of
tests/reaper/scenarios.py in Azure form: zero wrong stops everywhere; a missed stop only
where ARM is unreachable or its answer incomplete, and then the run fails saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node.idle_rules import UTC, format_utc
from infra.clouds.azure.reaper import (
    REQUIRED_ENV,
    ROLE_ACTIONS,
    AzureCloud,
    ManagedIdentityCredential,
    parse_vm,
)
from infra.reaper import tags as T
from infra.reaper.core import Report, reap
from infra.reaper.handler import CLOUDS, ConfigError, make_cloud, run
from scripts import teardown
from tests.reaper.azure_fake import (
    RESOURCE_GROUP,
    SUBSCRIPTION,
    FakeAzure,
    FakeCredential,
    FakeVM,
    make_tls,
)
from tests.reaper.fleet import Case, cases
from tests.reaper.scenarios import BAD_TAG_VALUES, NODES
from tests.support.stderr import problems

pytestmark = pytest.mark.integration

PER_CASE = 4  # x 16 cases + specials, in two stacks: the VM list pages (50 per page)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_tls(tmp_path_factory.mktemp("tls"))


def cloud(url: str, tls: tuple[Path, Path], **kw: Any) -> AzureCloud:
    options: dict[str, Any] = {
        "subscription_id": SUBSCRIPTION,
        "resource_group": RESOURCE_GROUP,
        "credential": FakeCredential(),
        "endpoint": url,
        "connection_verify": str(tls[0]),
        "backoff_s": 0.01,
        "max_delay_s": 0.05,  # the fake asks for Retry-After: 1; the cap must win
        "polling_interval_s": 0.01,
        "timeout_s": 1.0,
    }
    options.update(kw)
    return AzureCloud("eastus", **options)


def _beats(fake: FakeAzure, name: str, at: datetime, util: float | None) -> None:
    # A beat every 2 minutes for half an hour before the last one, like the watchdog's.
    fake.datapoints[("Heartbeat", name)] = [
        (at - timedelta(minutes=back), 1.0) for back in range(0, 30, 2)
    ]
    if util is not None:
        fake.datapoints[("GPUUtilization", name)] = [
            (at - timedelta(minutes=back), util) for back in range(0, 30, 2)
        ]


def _alive(fake: FakeAzure, now: datetime) -> None:
    """A busy node whose fresh beats prove the metrics pipeline works (else a silent node
    could be an ingestion outage, and is kept)."""
    tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "azt", T.TIER: "a100x8"}
    fake.vms.append(FakeVM("vm-alive", tags, now - timedelta(hours=3)))
    _beats(fake, "vm-alive", now - timedelta(minutes=1), 90.0)


def _vm(name: str, case: Case, tags: dict[str, Any], now: datetime) -> FakeVM:
    return FakeVM(
        name,
        tags,
        now - timedelta(minutes=case.age_min),
        power="deallocated" if case.stopped else "running",
        priority="Spot" if case.spot else "Regular",
        refuses_deallocate=case.disable_api_stop,
    )


def build(now: datetime) -> tuple[FakeAzure, dict[str, str]]:
    """The common cases x PER_CASE in stack "azt", a few in "other", specials; the truth."""
    fake = FakeAzure()
    expected: dict[str, str] = {}
    specials = [
        Case("idle-head", "stop", heartbeat_min=40, util=0, tags={T.ROLE: "head"}),
        Case("idle-worker", "stop", heartbeat_min=40, util=0),
        Case("refuses-stop", "stop", heartbeat_min=40, util=0, disable_api_stop=True),
    ]
    n = 0
    for stack, per_case in (("azt", PER_CASE), ("other", 1)):
        base = {
            T.MANAGED_BY: T.MANAGED_BY_VALUE,
            T.STACK: stack,
            T.TIER: "a100x8",
            T.TTL_HOURS: "12",
            T.ROLE: "worker",
        }
        for case, count in [(c, per_case) for c in cases(now)] + [(s, 1) for s in specials]:
            for _ in range(count):
                n += 1
                name = f"vm-{case.name}-{n:03d}"
                tags = {**base, **case.tags} if case.managed else {"Name": "hand-made"}
                fake.vms.append(_vm(name, case, tags, now))
                expected[name] = case.expect if stack == "azt" else "absent"
                if case.heartbeat_min is not None:
                    _beats(fake, name, now - timedelta(minutes=case.heartbeat_min), case.util)
    return fake, expected


def check(report: Report, expected: dict[str, str]) -> None:
    want = {i: a for i, a in expected.items() if a != "absent"}
    wrong = [
        (d.instance_id, d.action, d.reason)
        for d in report.decisions
        if d.action != want.get(d.instance_id)
    ]
    assert wrong == []
    assert {d.instance_id for d in report.decisions} == set(want)


def test_sdk_scan_pages_by_next_link_and_keeps_only_the_stacks_tagged_vms(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running(tls) as url:
        found = cloud(url, tls).scan("azt")
    assert {i.instance_id for i in found} == {i for i, a in expected.items() if a != "absent"}
    lists = [q for kind, _, q in fake.calls if kind == "list"]
    assert len(lists) == -(-len(fake.vms) // 50)  # every page, no more
    assert all(q["$expand"] == "instanceView" for q in lists)
    assert "$skiptoken" in lists[-1]


def test_dry_run_decides_every_common_case_and_deallocates_nothing(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running(tls) as url:
        report = reap(cloud(url, tls), stack="azt", apply=False)
    check(report, expected)
    assert not [k for k, _, _ in fake.calls if k == "deallocate"]
    metrics = [q for k, _, q in fake.calls if k == "metrics"]
    assert metrics
    assert all(q["metricnamespace"] == "gpufleet" for q in metrics)
    assert all(q["metricnames"] == "Heartbeat,GPUUtilization" for q in metrics)
    assert report.summary["clock"]["source"] == "service Date header"


def test_apply_deallocates_workers_before_heads_and_reports_refusals(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake, expected = build(now)
    with fake.running(tls) as url:
        report = reap(cloud(url, tls), stack="azt", apply=True)
    check(report, expected)
    power = {v.name: v.power for v in fake.vms}
    want = {i for i, a in expected.items() if a == "stop" and "refuses" not in i}
    already = {i for i in expected if "already-stopped" in i}
    assert {i for i, p in power.items() if p == "deallocated"} - already == want
    failed = {d.instance_id for d in report.decisions if d.result.startswith("failed")}
    assert failed == {i for i, a in expected.items() if "refuses" in i and a == "stop"}
    assert report.exit_code == 1
    order = [p.rsplit("/", 2)[-2] for k, p, _ in fake.calls if k == "deallocate"]
    assert "head" in order[-1]  # the head goes last
    # Every operation was polled through its Azure-AsyncOperation URL to the end.
    assert all(op["polls"] >= 3 for op in fake.operations.values())


def test_a_vm_only_stopped_from_inside_is_reported_as_still_billed_and_kept(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake = FakeAzure()
    tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "azt", T.TIER: "a100x8"}
    fake.vms.append(FakeVM("vm-os-stopped", dict(tags), now - timedelta(hours=3), "stopped"))
    with fake.running(tls) as url:
        report = reap(cloud(url, tls), stack="azt", apply=True)
    (d,) = report.decisions
    assert (d.action, d.state) == ("keep", "stopped-allocated")
    assert not [k for k, _, _ in fake.calls if k == "deallocate"]


def test_a_vm_listed_without_an_instance_view_gets_one_and_a_failed_view_keeps_only_it(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake = FakeAzure()
    tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "azt", T.TIER: "a100x8"}
    for name in ("vm-a", "vm-b", "vm-c"):
        fake.vms.append(FakeVM(name, dict(tags), now - timedelta(hours=3), without_view=True))
        _beats(fake, name, now - timedelta(minutes=45), 0.0)
    _alive(fake, now)
    fake.errors["view"] = 1  # the first view call fails (after its retries: max_attempts=1)
    with fake.running(tls) as url:
        report = reap(cloud(url, tls, max_attempts=1), stack="azt", apply=True)
    by = {d.instance_id: d for d in report.decisions}
    # Its power state is unknown, so it is not judged running: kept.
    assert (by["vm-a"].action, by["vm-a"].state) == ("keep", "unknown")
    assert (by["vm-b"].action, by["vm-c"].action) == ("stop", "stop")
    assert [k for k, _, _ in fake.calls].count("view") == 3
    assert by["vm-alive"].action == "keep"


def test_a_failed_deallocation_operation_fails_that_vm_and_the_run(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake = FakeAzure()
    tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "azt", T.TIER: "a100x8"}
    fake.vms.append(FakeVM("vm-fails", dict(tags), now - timedelta(hours=3), operation_fails=True))
    fake.vms.append(FakeVM("vm-slow", dict(tags), now - timedelta(hours=3), polls_to_finish=99))
    for vm in fake.vms:
        _beats(fake, vm.name, now - timedelta(minutes=45), 0.0)
    _alive(fake, now)
    with fake.running(tls) as url:
        report = reap(cloud(url, tls, deallocate_polls=4), stack="azt", apply=True)
    by = {d.instance_id: d for d in report.decisions}
    assert by["vm-fails"].result.startswith("failed: deallocation failed")
    # Accepted and still running after the bounded polls: counted as stopped (EC2's
    # "stopping"); the polls stopped at the bound.
    assert by["vm-slow"].result == "stopped"
    slow_op = next(op for op in fake.operations.values() if op["vm"] == "vm-slow")
    assert slow_op["polls"] == 4
    assert report.exit_code == 1


def test_parse_vm_keeps_a_vm_whose_power_state_or_times_are_unreadable() -> None:
    tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE}
    two = {"statuses": [{"code": "PowerState/running"}, {"code": "PowerState/stopped"}]}
    bad_time = {
        "statuses": [
            {"code": "PowerState/running"},
            {"code": "ProvisioningState/succeeded", "time": "yesterday"},
        ]
    }
    assert "power state" in (parse_vm({"name": "a", "tags": tags}, two).problem or "")
    assert "unreadable" in (parse_vm({"name": "b", "tags": tags}, bad_time).problem or "")
    none = parse_vm({"name": "c", "tags": tags}, {"statuses": [{"code": "PowerState/running"}]})
    assert none.launched_at is None and none.problem


# ---------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class AzScenario:
    name: str
    fault: str
    errors: dict[str, int | None] = field(default_factory=dict)
    throttle: dict[str, int | None] = field(default_factory=dict)
    html: dict[str, int | None] = field(default_factory=dict)
    hang: dict[str, int | None] = field(default_factory=dict)
    omit: str | None = None  # "util-all" | "beat-busy"
    host_skew_min: float = 0.0
    service_skew_min: float = 0.0
    node_skew_min: float = 0.0
    bad_tags: bool = False
    ingestion_down_min: float | None = None
    unreachable: bool = False


AZ_SCENARIOS = (
    AzScenario("clean", "no fault"),
    AzScenario("deallocate-throttled-always", "Deallocate answers 429 every time",
               throttle={"deallocate": None}, unreachable=True),
    AzScenario("deallocate-throttled-twice", "Deallocate answers 429 twice, then fine",
               throttle={"deallocate": 2}),
    AzScenario("operation-5xx-once", "a deallocation status poll answers 500 once",
               errors={"operation": 1}),
    AzScenario("list-fails-once", "a VM list page answers 500 once", errors={"list": 1}),
    AzScenario("list-fails-always", "every VM list page answers 500",
               errors={"list": None}, unreachable=True),
    AzScenario("list-html", "the VM list answers 200 with an HTML page",
               html={"list": None}, unreachable=True),
    AzScenario("list-times-out-once", "a VM list page hangs past the read timeout once",
               hang={"list": 1}),
    AzScenario("metrics-fail-always", "Metrics answers 500 every time",
               errors={"metrics": None}, unreachable=True),
    AzScenario("metrics-throttled-twice", "Metrics answers 429 twice, then fine",
               throttle={"metrics": 2}),
    AzScenario("metrics-time-out-once", "a Metrics call hangs past the read timeout once",
               hang={"metrics": 1}),
    AzScenario("metrics-html", "Metrics answers 200 with an HTML page",
               html={"metrics": None}, unreachable=True),
    AzScenario("metrics-partial", "every Metrics answer leaves GPUUtilization out",
               omit="util-all", unreachable=True),
    AzScenario("metrics-omit-busy", "Metrics leaves the busy nodes' Heartbeat out",
               omit="beat-busy", unreachable=True),
    AzScenario("host-clock-plus-12", "the reaper's host clock is 12 min fast", host_skew_min=12),
    AzScenario("host-clock-minus-12", "the reaper's host clock is 12 min slow",
               host_skew_min=-12),
    AzScenario("service-clock-plus-3", "ARM's clock is 3 min ahead of the host's",
               service_skew_min=3),
    AzScenario("node-clock-plus-12", "every node's clock is 12 min fast", node_skew_min=12),
    AzScenario("node-clock-minus-12", "every node's clock is 12 min slow", node_skew_min=-12),
    AzScenario("odd-tags", "bad idle-minutes/ttl/lease/protected values on extra nodes",
               bad_tags=True),
    AzScenario("ingestion-outage", "custom metrics ingestion down for 45 min",
               ingestion_down_min=45, unreachable=True),
)  # fmt: skip


@dataclass(frozen=True)
class AzOutcome:
    wrong: list[str]
    missed: list[str]
    exit_code: int
    why: str


def build_scenario(now: datetime, sc: AzScenario) -> tuple[FakeAzure, dict[str, str]]:
    fake = FakeAzure(clock_offset=timedelta(minutes=sc.service_skew_min))
    nodes = dict(NODES)
    if sc.bad_tags:
        for n, value in enumerate(BAD_TAG_VALUES):
            key = (T.IDLE_MINUTES, T.TTL_HOURS, T.KEEP_ALIVE_UNTIL, T.PROTECTED)[n % 4]
            nodes[f"bad-tag-{n}"] = ("keep", 45, 0.0, {key: value}, 180)
    truth: dict[str, str] = {}
    for name, (want, beat, util, extra, minutes) in nodes.items():
        tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "sc", T.TIER: "a100x8", **extra}
        if name == "leased":
            tags[T.KEEP_ALIVE_UNTIL] = format_utc(now + timedelta(hours=2))
        fake.vms.append(FakeVM(name, tags, now - timedelta(minutes=minutes)))
        truth[name] = want
        if beat is None:
            continue
        ago = beat if sc.ingestion_down_min is None else max(beat, sc.ingestion_down_min)
        at = now - timedelta(minutes=ago) + timedelta(minutes=sc.node_skew_min)
        _beats(fake, name, at, util or 0.0)
        if sc.omit == "util-all":
            fake.omit_metric[name] = "GPUUtilization"
        elif sc.omit == "beat-busy" and name.startswith("busy"):
            fake.omit_metric[name] = "Heartbeat"
    fake.errors, fake.throttle = dict(sc.errors), dict(sc.throttle)
    fake.html, fake.hang = dict(sc.html), dict(sc.hang)
    fake.hang_s = 2.5  # past the tests' 1 s read timeout
    return fake, truth


def run_scenario(tls: tuple[Path, Path], sc: AzScenario) -> AzOutcome:
    now = datetime.now(UTC)
    fake, truth = build_scenario(now, sc)
    with fake.running(tls) as url:
        try:
            report = reap(
                cloud(url, tls, max_attempts=3),
                stack="sc",
                apply=True,
                now=now + timedelta(minutes=sc.host_skew_min),
            )
            code, why = report.exit_code, "; ".join(report.problems)
            assert report.summary["clock"]["source"] == "service Date header"
        except AssertionError:
            raise
        except Exception as exc:  # the scan failed: teardown.py exits 2 with this line
            code, why = 2, f"scan failed, nothing stopped: {type(exc).__name__}"
    stopped = {v.name for v in fake.vms if v.power in ("deallocated", "deallocating")}
    wrong = sorted(n for n in stopped if truth[n] != "stop")
    missed = sorted(n for n, t in truth.items() if t == "stop" and n not in stopped)
    return AzOutcome(wrong, missed, code, why)


@pytest.mark.parametrize("sc", AZ_SCENARIOS, ids=[s.name for s in AZ_SCENARIOS])
def test_no_wrong_deallocation_and_no_silent_missed_one(
    tls: tuple[Path, Path], sc: AzScenario
) -> None:
    outcome = run_scenario(tls, sc)
    assert outcome.wrong == [], f"{sc.fault}: deallocated {outcome.wrong}"
    if sc.unreachable:
        assert outcome.exit_code != 0, f"{sc.fault}: the run did not fail"
        assert outcome.why
    else:
        assert outcome.missed == [], f"{sc.fault}: kept {outcome.missed} ({outcome.why})"
        assert outcome.exit_code == 0, outcome.why


def test_a_huge_retry_after_is_capped_and_attempts_are_bounded(tls: tuple[Path, Path]) -> None:
    now = datetime.now(UTC)
    fake, _ = build_scenario(now, AzScenario("x", "x", throttle={"metrics": None}))
    fake.retry_after = "3600"
    with fake.running(tls) as url:
        az = cloud(url, tls, max_attempts=3)
        got = az.metrics(["busy-1"], start=now - timedelta(hours=1), end=now)
    assert "429" in (got["busy-1"].error or "")
    assert [k for k, _, _ in fake.calls].count("metrics") == 3  # attempts, the first included


# ---------------------------------------------------------------------------- entry points


@pytest.fixture
def azure_env(tls: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    now = datetime.now(UTC)
    fake, _ = build_scenario(now, AzScenario("clean", "no fault"))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls[0]))  # requests' documented CA setting
    yield fake


def _env(url: str, **extra: str) -> dict[str, str]:
    return {
        "GPUFLEET_STACK": "sc",
        "GPUFLEET_REGION": "eastus",
        "GPUFLEET_AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
        "GPUFLEET_AZURE_RESOURCE_GROUP": RESOURCE_GROUP,
        "GPUFLEET_ENDPOINT_URL": url,
        **extra,
    }


def test_function_run_gets_its_token_from_the_managed_identity_endpoint(
    tls: tuple[Path, Path], azure_env: FakeAzure
) -> None:
    from tests.reaper.azure_identity_fake import identity_endpoint

    with azure_env.running(tls) as url, identity_endpoint() as (endpoint, secret, seen):
        env = _env(url, IDENTITY_ENDPOINT=endpoint, IDENTITY_HEADER=secret)
        out = run("azure", env)
    assert out["apply"] is False
    assert sorted(s["instance_id"] for s in out["stops"]) == [
        "dead-idle-1",
        "dead-idle-2",
        "ttl-expired",
    ]
    # One token for ARM's audience, cached for every later call.
    assert seen == [("https://management.azure.com/", "2019-08-01")]


def test_function_without_subscription_or_identity_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GPUFLEET_AZURE_SUBSCRIPTION_ID"):
        make_cloud("azure", {"GPUFLEET_REGION": "eastus"})
    env = {
        "GPUFLEET_REGION": "eastus",
        "GPUFLEET_AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
        "GPUFLEET_AZURE_RESOURCE_GROUP": RESOURCE_GROUP,
    }
    with pytest.raises(ConfigError, match="IDENTITY_ENDPOINT"):
        make_cloud("azure", env)


def test_teardown_cli_speaks_azure_with_a_given_token(
    tls: tuple[Path, Path],
    azure_env: FakeAzure,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.reaper.azure_fake import TOKEN

    monkeypatch.setenv("GPUFLEET_AZURE_SUBSCRIPTION_ID", SUBSCRIPTION)
    monkeypatch.setenv("GPUFLEET_AZURE_RESOURCE_GROUP", RESOURCE_GROUP)
    monkeypatch.setenv("GPUFLEET_AZURE_ACCESS_TOKEN", TOKEN)
    with azure_env.running(tls) as url:
        code = teardown.main(
            [
                *("--provider", "azure", "--region", "eastus", "--stack", "sc", "--json"),
                *("--endpoint-url", url),
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    stops = sorted(d["instance_id"] for d in out["decisions"] if d["action"] == "stop")
    assert stops == ["dead-idle-1", "dead-idle-2", "ttl-expired"]
    assert not [v for v in azure_env.vms if v.power != "running"]  # a dry run


def test_teardown_cli_without_azure_settings_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*REQUIRED_ENV, "IDENTITY_ENDPOINT", "GPUFLEET_AZURE_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    code = teardown.main(["--provider", "azure", "--region", "eastus"])
    err = capsys.readouterr().err
    assert code == 2
    assert "GPUFLEET_AZURE_SUBSCRIPTION_ID" in err
    assert len(problems(err)) == 1


def test_the_contract_names_the_settings_and_a_role_without_write_or_delete() -> None:
    assert REQUIRED_ENV == ("GPUFLEET_AZURE_SUBSCRIPTION_ID", "GPUFLEET_AZURE_RESOURCE_GROUP")
    assert "Microsoft.Compute/virtualMachines/deallocate/action" in ROLE_ACTIONS
    assert not [a for a in ROLE_ACTIONS if a.endswith(("/write", "/delete", "/powerOff/action"))]
    assert CLOUDS["azure"].vendor_sdk


def test_managed_identity_credential_refuses_an_answer_without_a_token() -> None:
    from infra.clouds.azure.reaper import MalformedAnswer
    from tests.reaper.azure_identity_fake import identity_endpoint

    with identity_endpoint(body={"error": "nope"}) as (endpoint, secret, _):
        cred = ManagedIdentityCredential(endpoint=endpoint, secret=secret)
        with pytest.raises(MalformedAnswer):
            cred.get_token("https://management.azure.com/.default")
