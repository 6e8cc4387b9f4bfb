"""Fault scenarios for the reaper: a small fleet on moto, one fault each, wrong and missed stops.

Each scenario builds a fresh fleet whose truth is known (which nodes are really idle with a
dead watchdog, which one is past its TTL), injects one fault (the fault proxy for HTTP
failures, a botocore hook for answers that are well-formed but incomplete, shifted clocks,
odd tags), runs one applied reaper pass and counts:

  wrong stop   a node stopped that the truth says to keep (busy, protected, leased, ...);
  missed stop  a node the truth says to stop that is still running.

Shared by tests/reaper/test_fault_scenarios.py and scripts/bench_teardown.py --scenarios.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufleet_node.fleet_names import DIMENSION, METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE
from gpufleet_node.idle_rules import UTC, format_utc
from infra.clouds.aws.reaper import AwsCloud
from infra.reaper import tags as T
from infra.reaper.core import reap
from tests.reaper.faultproxy import FaultProxy
from tests.reaper.fleet import AMI, REGION, age, client, states

# name: (truth, minutes since the last heartbeat or None, GPU %, extra tags, age minutes)
NODES: dict[str, tuple[str, float | None, float | None, dict[str, str], float]] = {
    "busy-1": ("keep", 1, 95.0, {}, 180),
    "busy-2": ("keep", 2, 60.0, {}, 180),
    "idle-alive": ("keep", 2, 0.0, {}, 180),
    "dead-idle-1": ("stop", 45, 0.0, {}, 180),
    "dead-idle-2": ("stop", 50, 1.0, {}, 180),
    "never-seen": ("keep", None, None, {}, 180),
    "protected": ("keep", 45, 0.0, {T.PROTECTED: "true"}, 180),
    "leased": ("keep", 45, 0.0, {}, 180),  # lease tag added at build time
    "ttl-expired": ("stop", 1, 99.0, {T.TTL_HOURS: "12"}, 13 * 60),
    "booting": ("keep", None, None, {}, 10),
}
BAD_TAG_VALUES = (
    "1e12",
    "NaN",
    "-5",
    "99999999999",
    "\uff11\uff15",  # full-width digits, which float() would take
    "15\u200b",  # zero-width space
    "'; DROP TABLE --",
    "<script>",
    "\u00e9\u00e8 \U0001f525",
    "5h",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # one line: what goes wrong
    ops: dict[str, int | None] = field(default_factory=dict)  # proxy throttling per operation
    answer: str | None = None  # "partial" | "omit-busy" | "omit-all": rewrite GetMetricData
    host_skew_min: float = 0.0
    node_skew_min: float = 0.0
    bad_tags: bool = False
    ingestion_down_min: float | None = None  # every node's heartbeats stopped this long ago
    unreachable: bool = False  # missed stops are allowed (and must fail the run)


SCENARIOS = (
    Scenario("clean", "no fault"),
    Scenario("stop-throttled-always", "StopInstances throttled on every attempt",
             ops={"StopInstances": None}, unreachable=True),
    Scenario("stop-throttled-twice", "StopInstances throttled twice, then fine",
             ops={"StopInstances": 2}),
    Scenario("describe-fails-once", "a DescribeInstances page fails once",
             ops={"DescribeInstances": 1}),
    Scenario("describe-fails-always", "every DescribeInstances page fails",
             ops={"DescribeInstances": None}, unreachable=True),
    Scenario("metrics-fail-always", "GetMetricData fails on every attempt",
             ops={"GetMetricData": None}, unreachable=True),
    Scenario("metrics-fail-twice", "GetMetricData fails twice, then fine",
             ops={"GetMetricData": 2}),
    Scenario("metrics-partial", "GetMetricData answers PartialData for every result",
             answer="partial", unreachable=True),
    Scenario("metrics-omit-busy", "GetMetricData leaves the busy nodes' results out",
             answer="omit-busy", unreachable=True),
    Scenario("metrics-omit-all", "GetMetricData answers no results at all",
             answer="omit-all", unreachable=True),
    Scenario("host-clock-plus-12", "the reaper's host clock is 12 min fast", host_skew_min=12),
    Scenario("host-clock-minus-12", "the reaper's host clock is 12 min slow", host_skew_min=-12),
    Scenario("node-clock-plus-12", "every node's clock is 12 min fast", node_skew_min=12),
    Scenario("node-clock-minus-12", "every node's clock is 12 min slow", node_skew_min=-12),
    Scenario("odd-tags", "bad idle-minutes/ttl/lease/protected values on extra nodes",
             bad_tags=True),
    Scenario("put-metric-outage", "PutMetricData down for 45 min: no node's beat arrives",
             ingestion_down_min=45, unreachable=True),
)  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    wrong: list[str]  # node names
    missed: list[str]
    exit_code: int
    why: str  # the run's problems, or the error that ended it
    bad_values: int  # bad tag values tried

    @property
    def ok(self) -> bool:
        if self.wrong:
            return False
        if self.missed:
            return self.scenario.unreachable and self.exit_code != 0 and bool(self.why)
        return True


def _reset(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST")).read()


def build(url: str, now: datetime, sc: Scenario) -> tuple[dict[str, str], dict[str, str]]:
    """The fleet on moto; returns (instance id -> node name, node name -> truth)."""
    _reset(url)
    ec2, cw = client("ec2", url), client("cloudwatch", url)
    nodes = dict(NODES)
    if sc.bad_tags:
        for n, value in enumerate(BAD_TAG_VALUES):
            key = (T.IDLE_MINUTES, T.TTL_HOURS, T.KEEP_ALIVE_UNTIL, T.PROTECTED)[n % 4]
            # A stale heartbeat: judged normally these would stop. Kept: their tag is bad.
            nodes[f"bad-tag-{n}"] = ("keep", 45, 0.0, {key: value}, 180)
    names: dict[str, str] = {}
    truth: dict[str, str] = {}
    data: list[dict[str, Any]] = []
    for name, (want, beat, util, extra, minutes) in nodes.items():
        tags = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "sc", T.TIER: "a100x8", "Name": name}
        tags |= extra
        if name == "leased":
            tags[T.KEEP_ALIVE_UNTIL] = format_utc(now + timedelta(hours=2))
        iid = ec2.run_instances(
            ImageId=AMI,
            InstanceType="p4d.24xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
        )["Instances"][0]["InstanceId"]
        age([iid], minutes, now)
        names[iid], truth[name] = name, want
        if beat is None:
            continue
        ago = beat if sc.ingestion_down_min is None else max(beat, sc.ingestion_down_min)
        for back in range(0, 30, 2):  # a beat every 2 minutes before the last one
            at = now - timedelta(minutes=ago + back) + timedelta(minutes=sc.node_skew_min)
            dims = [{"Name": DIMENSION, "Value": iid}]
            data.append({"MetricName": METRIC_HEARTBEAT, "Dimensions": dims, "Timestamp": at,
                         "Value": float(int(at.timestamp()))})  # fmt: skip
            data.append({"MetricName": METRIC_GPU_UTIL, "Dimensions": dims, "Timestamp": at,
                         "Value": util or 0.0})  # fmt: skip
    for start in range(0, len(data), 500):
        cw.put_metric_data(Namespace=NAMESPACE, MetricData=data[start : start + 500])
    return names, truth


def _rewrite(sc: Scenario, busy_ids: set[str]) -> Callable[..., None]:
    """A botocore after-call hook that makes a GetMetricData answer incomplete."""

    def hook(parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name != "GetMetricData":
            return
        results = parsed.get("MetricDataResults", [])
        if sc.answer == "partial":
            for r in results:
                r["StatusCode"] = "PartialData"
        elif sc.answer == "omit-all":
            results.clear()
        elif sc.answer == "omit-busy":
            ids = hook.ids  # type: ignore[attr-defined]
            results[:] = [r for r in results if ids.get(r["Id"]) not in busy_ids]

    hook.ids = {}  # type: ignore[attr-defined]
    return hook


def run(url: str, sc: Scenario) -> Outcome:
    now = datetime.now(UTC)
    names, truth = build(url, now, sc)
    before = states()
    proxy = FaultProxy(url, rate=0.0)
    proxy.fail_ops = dict(sc.ops)
    busy = {iid for iid, n in names.items() if n.startswith("busy")}
    with proxy.running():
        cloud = AwsCloud(REGION, endpoint_url=proxy.url, max_attempts=3)
        hook = _rewrite(sc, busy)
        if sc.answer:
            cw = cloud.client("cloudwatch")

            def remember(params: dict[str, Any], **_: Any) -> None:
                for q in params.get("MetricDataQueries", []):
                    dims = q["MetricStat"]["Metric"]["Dimensions"]
                    hook.ids[q["Id"]] = dims[0]["Value"]  # type: ignore[attr-defined]

            cw.meta.events.register("provide-client-params.cloudwatch.GetMetricData", remember)
            cw.meta.events.register("after-call.cloudwatch.GetMetricData", hook)
        try:
            report = reap(
                cloud, stack="sc", apply=True, now=now + timedelta(minutes=sc.host_skew_min)
            )
            code, why = report.exit_code, "; ".join(report.problems)
            # Every proxied answer carries a Date: the decisions must have used it.
            assert report.summary["clock"]["source"] == "service Date header", report.summary
        except Exception as exc:  # the scan failed: teardown.py exits 2 with this line
            code, why = 2, f"scan failed, nothing stopped: {type(exc).__name__}"
    after = states()
    stopped = {names[i] for i in names if after[i] == "stopped" and before[i] != "stopped"}
    wrong = sorted(n for n in stopped if truth[n] != "stop")
    missed = sorted(n for n, t in truth.items() if t == "stop" and n not in stopped)
    bad = len(BAD_TAG_VALUES) if sc.bad_tags else 0
    return Outcome(sc, wrong, missed, code, why, bad)


def table(outcomes: list[Outcome]) -> str:
    """The counts, one line per scenario, 80 columns."""
    lines = [f"{'scenario':<22} {'wrong':>5} {'missed':>6} {'exit':>4}  why (when not 0)"]
    for o in outcomes:
        why = o.why if o.exit_code else ""
        lines.append(
            f"{o.scenario.name:<22} {len(o.wrong):>5} {len(o.missed):>6} {o.exit_code:>4}  "
            f"{why[:38]}"
        )
    total_wrong = sum(len(o.wrong) for o in outcomes)
    total_missed = sum(len(o.missed) for o in outcomes)
    lines.append(
        f"{len(outcomes)} scenarios: {total_wrong} wrong stops, {total_missed} missed stops "
        f"(all in unreachable-API scenarios, each with a non-zero exit: "
        f"{all(o.ok for o in outcomes)})"
    )
    return "\n".join(lines)
