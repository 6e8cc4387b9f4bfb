"""The reaper against a moto server: >= 2,000 instances, every case, clean and under faults."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from infra.clouds.aws.reaper import AwsCloud, CallCounter
from infra.reaper.core import Report, reap
from scripts import teardown
from tests.reaper.faultproxy import FaultProxy
from tests.reaper.fleet import REGION, Fleet, build_fleet, restart
from tests.reaper.fleet import states as backend_states

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet(moto_url: str) -> Fleet:
    return build_fleet(moto_url)


def states(fleet: Fleet) -> dict[str, str]:
    return backend_states()


@dataclass(frozen=True)
class Run:
    report: Report
    counter: CallCounter


def cli(fleet: Fleet, *extra: str) -> int:
    return teardown.main(
        ["--provider", "aws", "--region", REGION, "--endpoint-url", fleet.url, *extra]
    )


@pytest.fixture(scope="module")
def all_stacks(fleet: Fleet) -> Run:
    """One dry-run pass over every stack, shared by the tests that only read it."""
    counter = CallCounter()
    with pytest.MonkeyPatch.context() as mp:  # module scope runs before the autouse isolation
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            mp.setenv(name, os.devnull)
        report = reap(
            AwsCloud(REGION, endpoint_url=fleet.url, counter=counter, timeout_s=120),
            apply=False,
            price=teardown.catalog_prices(),
        )
    return Run(report, counter)


@pytest.fixture
def restore(fleet: Fleet) -> Iterator[list[str]]:
    """Instances a test stopped are started again afterwards, with their old ages."""
    stopped: list[str] = []
    yield stopped
    restart(fleet, stopped)


def test_fleet_is_at_least_2000_instances_across_stacks(fleet: Fleet) -> None:
    assert len(fleet.expected) >= 2000
    assert {s for s in fleet.stack_of.values() if s} == {"alpha", "beta", "gamma"}


def test_dry_run_decides_every_managed_instance_exactly(fleet: Fleet, all_stacks: Run) -> None:
    got = {d.instance_id: d.action for d in all_stacks.report.decisions}
    wrong = [
        (fleet.case_of[d.instance_id], d.action, d.reason)
        for d in all_stacks.report.decisions
        if d.action != fleet.expected[d.instance_id]
    ]
    assert not wrong
    assert got == fleet.expected_for(None)  # untagged instances never appear


def test_dry_run_stops_nothing_and_prices_what_it_would_save(fleet: Fleet, all_stacks: Run) -> None:
    assert all(
        s == "running" or fleet.case_of[i] == "already-stopped" for i, s in states(fleet).items()
    )
    assert "StopInstances" not in all_stacks.counter.operations
    summary = all_stacks.report.summary
    assert summary["dry_run"] is True
    assert summary["stop"] == len(fleet.stop_ids(None))
    assert summary["stopped"] == 0
    # p4d.24xlarge: 8 GPUs each, priced from the catalog.
    assert summary["gpu_hours_saved_per_hour"] == 8 * summary["stop"]
    assert summary["saved_per_hour"]["USD"] > 0


def test_scan_and_metrics_take_at_most_5_calls_per_1000_instances(all_stacks: Run) -> None:
    ops = all_stacks.counter.operations
    per_1000 = (ops["DescribeInstances"] + ops["GetMetricData"]) / (
        len(all_stacks.report.decisions) / 1000
    )
    assert per_1000 <= 5, ops


def test_cli_prints_the_json_contract_for_one_stack(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(fleet, "--stack", "gamma", "--json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) >= {"decisions", "summary"}
    for d in out["decisions"]:
        assert {"instance_id", "stack", "action", "reason"} <= set(d)
        assert d["stack"] == "gamma"
    assert {d["instance_id"]: d["action"] for d in out["decisions"]} == fleet.expected_for("gamma")


def test_cli_text_output_has_one_line_per_instance_and_a_summary(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(fleet, "--stack", "gamma")
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert len([ln for ln in lines if ln.startswith("i-")]) == len(fleet.expected_for("gamma"))
    assert "dry run: nothing was stopped" in lines[-2]
    assert "GPU-hours per hour" in lines[-1]


def test_every_decision_carries_a_reason_naming_the_rule(fleet: Fleet, all_stacks: Run) -> None:
    by_case: dict[str, set[str]] = {}
    for d in all_stacks.report.decisions:
        by_case.setdefault(fleet.case_of[d.instance_id], set()).add(d.reason)
    assert all("hard TTL 12 h" in r for r in by_case["ttl-expired-while-busy"])
    assert all("lease until" in r for r in by_case["lease-in-the-future"])
    assert all("boot grace" in r for r in by_case["no-metrics-yet"])
    assert all("watchdog alive" in r for r in by_case["idle-watchdog-alive"])
    assert all("protected" in r for r in by_case["protected"])
    assert all("not running (stopped)" in r for r in by_case["already-stopped"])
    assert all("unknown, no heartbeat of this boot" in r for r in by_case["watchdog-gone-long-ago"])
    assert all("watchdog alive" in r for r in by_case["recently-silent"])
    assert all("GPU reached 95 %" in r for r in by_case["stale-heartbeat-but-gpu-busy"])


def test_apply_stops_exactly_the_idle_instances_of_one_stack_workers_first(
    fleet: Fleet, restore: list[str]
) -> None:
    counter = CallCounter()
    cloud = AwsCloud(REGION, endpoint_url=fleet.url, counter=counter, timeout_s=120)
    stop_calls: list[list[str]] = []
    cloud.client("ec2").meta.events.register(
        "provide-client-params.ec2.StopInstances",
        lambda params, **_: stop_calls.append(list(params["InstanceIds"])),
    )
    before = states(fleet)
    report = reap(cloud, stack="alpha", apply=True)
    restore.extend(d.instance_id for d in report.decisions if d.result == "stopped")

    want_stop = fleet.stop_ids("alpha")
    stopped = {d.instance_id for d in report.decisions if d.result == "stopped"}
    failed = {d.instance_id: d.result for d in report.decisions if d.result.startswith("failed")}
    assert stopped == want_stop - fleet.refused_in("alpha")
    assert set(failed) == fleet.refused_in("alpha")
    assert all("OperationNotPermitted" in why for why in failed.values())
    assert report.exit_code == 1

    after = states(fleet)
    changed = {i for i in after if after[i] != before[i]}
    assert changed == stopped  # nothing else moved: no other stack, no untagged, no keep
    assert all(after[i] == "stopped" for i in stopped)

    # The head is stopped in a later call than every worker of the stack.
    head = next(i for i in want_stop if fleet.role_of[i] == "head")
    head_call = next(n for n, ids in enumerate(stop_calls) if head in ids)
    worker_calls = [
        n for n, ids in enumerate(stop_calls) for i in ids if fleet.role_of[i] != "head"
    ]
    assert max(worker_calls) < head_call

    # The refused ids were isolated by bisection, in a bounded number of calls.
    batches = math.ceil(len(want_stop) / 100) + 1
    bound = batches + len(fleet.refused_in("alpha")) * 2 * math.ceil(math.log2(100))
    assert counter.operations["StopInstances"] <= bound


def test_thirty_percent_faults_give_the_same_decisions_and_no_wrong_stop(
    fleet: Fleet, all_stacks: Run, restore: list[str]
) -> None:
    clean = [d for d in all_stacks.report.decisions if d.stack == "beta"]
    proxy = FaultProxy(fleet.url, rate=0.30, seed=11)
    before = states(fleet)
    with proxy.running():
        cloud = AwsCloud(REGION, endpoint_url=proxy.url, max_attempts=10, timeout_s=120)
        faulty = reap(cloud, stack="beta", apply=True)
    restore.extend(d.instance_id for d in faulty.decisions if d.result == "stopped")
    assert proxy.faults > 0  # the faults really happened
    assert cloud.counter.attempts > sum(cloud.counter.operations.values())  # and were retried

    assert [(d.instance_id, d.action) for d in faulty.decisions] == [
        (d.instance_id, d.action) for d in clean
    ]
    after = states(fleet)
    changed = {i for i in after if after[i] != before[i]}
    assert changed <= fleet.stop_ids("beta")  # no wrong stop, whatever failed
    stopped = {d.instance_id for d in faulty.decisions if d.result == "stopped"}
    assert stopped == changed
    assert stopped == fleet.stop_ids("beta") - fleet.refused_in("beta")


def test_a_stop_that_keeps_failing_is_reported_not_retried_forever(
    fleet: Fleet, restore: list[str]
) -> None:
    target = sorted(fleet.stop_ids("gamma") - fleet.refused_in("gamma"))[0]
    proxy = FaultProxy(fleet.url, rate=0.0)
    proxy.always_fail_stop.add(target)
    with proxy.running():
        cloud = AwsCloud(REGION, endpoint_url=proxy.url, max_attempts=3, timeout_s=120)
        report = reap(cloud, stack="gamma", apply=True)
    restore.extend(d.instance_id for d in report.decisions if d.result == "stopped")
    by_id = {d.instance_id: d for d in report.decisions}
    assert by_id[target].result.startswith("failed")
    assert report.exit_code == 1
    # Bounded: every StopInstances call is retried at most max_attempts times.
    assert cloud.counter.attempts <= 3 * sum(cloud.counter.operations.values())
    assert states(fleet)[target] == "running"


def test_teardown_rejects_bad_input_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        teardown.main(["--provider", "gcp", "--region", "us-east-1"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        teardown.main(["--provider", "aws", "--region", "Virginia"])
    assert exc.value.code == 2
    assert "does not look like a region" in capsys.readouterr().err


def test_teardown_exits_2_when_the_scan_cannot_reach_the_api(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_MAX_ATTEMPTS", "1")
    code = teardown.main(
        ["--provider", "aws", "--region", REGION, "--endpoint-url", "http://127.0.0.1:9"]
    )
    assert code == 2
    assert "scan failed, nothing stopped" in capsys.readouterr().err
