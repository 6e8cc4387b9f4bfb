#!/usr/bin/env python3
"""Benchmark: the reaper's batched scan against a naive per-instance scan, same run, same fleet.

Starts a moto server on 127.0.0.1, launches a fleet of managed instances with heartbeat and
GPU metrics (tests/reaper/fleet.py: the fleet the tests use), then reads it twice:

  batched  the reaper's own AwsCloud: tag-filtered DescribeInstances pages of 1,000 and
           GetMetricData with 500 queries per call;
  naive    what a straightforward script does: one DescribeInstances per managed instance
           (after a listing) and one GetMetricData per instance and metric.

Both pass the same decisions check; the numbers are API calls and wall time. Targets: at
most 5 calls per 1,000 instances for describe + metrics, and a 10x wall-time ratio.

    python scripts/bench_teardown.py            # 2,055 instances
    python scripts/bench_teardown.py --json
    python scripts/bench_teardown.py --scenarios   # the fault scenarios' wrong/missed stops

Note: moto answers per-resource tag lookups with a scan of every tag (O(N^2) describes);
the benchmark installs the same O(1) lookup the tests use, for both contenders alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpufleet_node.fleet_names import (  # noqa: E402
    DIMENSION,
    METRIC_GPU_UTIL,
    METRIC_HEARTBEAT,
    NAMESPACE,
)
from gpufleet_node.idle_rules import UTC  # noqa: E402
from infra.clouds.aws.reaper import AwsCloud, CallCounter, parse_instance  # noqa: E402
from infra.reaper import tags as T  # noqa: E402
from infra.reaper.core import Metrics, reap  # noqa: E402
from infra.usage import OneLineParser, real_number, whole_number  # noqa: E402


class NaiveAws(AwsCloud):
    """Per-instance calls: the shape of most hand-written idle scripts."""

    def scan(self, stack: str | None) -> list[Any]:
        ec2 = self.client("ec2")
        ids: list[str] = []
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": [T.MANAGED_BY]}]
        )
        for page in pages:
            for r in page["Reservations"]:
                ids += [i["InstanceId"] for i in r["Instances"]]
        found = []
        for iid in ids:  # then one call per instance for its details
            raw = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
            inst = parse_instance(raw)
            if inst.managed and (stack is None or inst.stack == stack):
                found.append(inst)
        return found

    def metrics(self, instance_ids: Any, *, start: Any, end: Any) -> dict[str, Metrics]:
        cw = self.client("cloudwatch")
        period = max(60, math.ceil((end - start).total_seconds() / 60) * 60)
        out = {}
        for iid in instance_ids:
            values = {}
            for metric in (METRIC_GPU_UTIL, METRIC_HEARTBEAT):
                stat = {
                    "Metric": {
                        "Namespace": NAMESPACE,
                        "MetricName": metric,
                        "Dimensions": [{"Name": DIMENSION, "Value": iid}],
                    },
                    "Period": period,
                    "Stat": "Maximum",
                }
                r = cw.get_metric_data(
                    MetricDataQueries=[{"Id": "m", "MetricStat": stat}],
                    StartTime=start,
                    EndTime=end,
                )
                values[metric] = r["MetricDataResults"][0]["Values"]
            util, beats = values[METRIC_GPU_UTIL], values[METRIC_HEARTBEAT]
            out[iid] = Metrics(
                max_gpu_util=max(util) if util else None,
                last_heartbeat=datetime.fromtimestamp(max(beats), UTC) if beats else None,
            )
        return out


def measure(cloud: AwsCloud, counter: CallCounter) -> dict[str, Any]:
    started = time.perf_counter()
    report = reap(cloud, apply=False)
    seconds = time.perf_counter() - started
    reads = counter.operations.get("DescribeInstances", 0) + counter.operations.get(
        "GetMetricData", 0
    )
    n = len(report.decisions)
    return {
        "instances": n,
        "seconds": round(seconds, 2),
        "calls": dict(counter.operations),
        "read_calls": reads,
        "calls_per_1000": round(reads / (n / 1000), 2) if n else None,
        "decisions": {d.instance_id: d.action for d in report.decisions},
    }


@contextlib.contextmanager
def _moto() -> Iterator[str]:
    """A fresh moto server on 127.0.0.1 (sped up, its per-request log lines off): its URL."""
    logging.disable(logging.INFO)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")
    from moto.server import ThreadedMotoServer

    from tests.reaper.fleet import speed_up_moto

    undo = speed_up_moto()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        undo()


def run_scenarios() -> int:
    """Every fault scenario on a fresh moto server; the table of wrong and missed stops."""
    from tests.reaper.scenarios import SCENARIOS, run, table

    with _moto() as url:
        outcomes = [run(url, sc) for sc in SCENARIOS]
    print(table(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scale", type=whole_number(1, 50), default=1, help="multiply the fleet: 1-50 (1: 2,055)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--latency-ms",
        type=real_number(0, 1000),
        default=0.0,
        help="add this much latency (0-1000) to every API request (a proxy in front of moto); "
        "loopback has none, an in-region cloud function sees a few ms per call",
    )
    parser.add_argument(
        "--scenarios",
        action="store_true",
        help="run the fault scenarios (tests/reaper/scenarios.py) and print their counts",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.scenarios:
        return run_scenarios()
    from tests.reaper.faultproxy import FaultProxy
    from tests.reaper.fleet import REGION, build_fleet

    with _moto() as url:
        t0 = time.perf_counter()
        fleet = build_fleet(url, scale=args.scale)
        build_s = time.perf_counter() - t0
        results = {}
        proxy = FaultProxy(url, rate=0.0, latency_s=args.latency_ms / 1000)
        with proxy.running():
            endpoint = proxy.url if args.latency_ms else url
            for name, cls in (("batched", AwsCloud), ("naive", NaiveAws)):
                counter = CallCounter()
                cloud = cls(REGION, endpoint_url=endpoint, counter=counter)
                results[name] = measure(cloud, counter)

    batched, naive = results["batched"], results["naive"]
    decided = batched.pop("decisions")
    same = decided == naive.pop("decisions") == fleet.expected_for(None)
    ratio = naive["seconds"] / batched["seconds"] if batched["seconds"] else math.inf
    summary = {
        "fleet": len(fleet.expected),
        "managed": batched["instances"],
        "build_seconds": round(build_s, 1),
        "latency_ms": args.latency_ms,
        "batched": batched,
        "naive": naive,
        "wall_time_ratio": round(ratio, 1),
        "same_decisions": same,
        "targets": {
            "calls_per_1000_max": 5,
            "calls_per_1000_ok": batched["calls_per_1000"] <= 5,
            "ratio_min": 10,
            "ratio_ok": ratio >= 10,
        },
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, args.latency_ms)
    return exit_status(summary)


def _print_summary(summary: dict[str, Any], latency_ms: float) -> None:
    """The human report: the fleet, each scan's calls and time, the ratio and the targets."""
    print(
        f"fleet: {summary['fleet']} instances, {summary['managed']} managed; "
        f"added latency per request: {latency_ms:g} ms"
    )
    for name in ("batched", "naive"):
        r = summary[name]
        print(
            f"{name:>8}: {r['read_calls']:>5} describe+metrics calls "
            f"({r['calls_per_1000']}/1000 instances), {r['seconds']:.1f} s  {r['calls']}"
        )
    print(f"wall-time ratio naive/batched: {summary['wall_time_ratio']}x")
    print(f"same decisions: {summary['same_decisions']}")
    t = summary["targets"]
    ratio_target = (
        f"; >=10x wall time {'met' if t['ratio_ok'] else 'MISSED'}"
        if latency_ms > 0
        else " (the wall-time ratio has a target only with --latency-ms)"
    )
    print(f"targets: <=5 calls/1000 {'met' if t['calls_per_1000_ok'] else 'MISSED'}{ratio_target}")


def exit_status(summary: dict[str, Any]) -> int:
    """1 when a target is missed (so `make bench` fails), or the two scans disagree."""
    t = summary["targets"]
    met = t["calls_per_1000_ok"] and (t["ratio_ok"] or not summary["latency_ms"])
    return 0 if summary["same_decisions"] and met else 1


if __name__ == "__main__":
    sys.exit(main())
