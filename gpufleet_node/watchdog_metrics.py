"""What the watchdog publishes each run for the cloud reaper: heartbeat, GPU metrics and
the unsynced file count, through the node cloud's metrics service or, where the cloud
takes none, as a heartbeat object in the stack's bucket.

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from . import bucket, idle_rules
from . import fleet_names as names
from .clouds.base import Credentials, Metric, NodeCloud


class Publisher(Protocol):
    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None: ...


@dataclass
class MetricsPublisher:
    """Heartbeat + GPU metrics + the unsynced file count, through the node's cloud.

    No datapoint carries the node's clock as its time: both services then stamp it with the
    time they received it ("If not specified, the default value is the time the metric data
    was received", CloudWatch MetricDatum.Timestamp; CloudMonitor PutCustomMetric's ``Time``
    is optional), so the reaper judges staleness on the service's clock and a node whose
    clock is off cannot look fresh or stale. The heartbeat's *value* is still the node's Unix
    time: the difference to the datapoint's timestamp shows the node's clock skew.
    """

    cloud: NodeCloud
    instance_id: str
    credentials: Callable[[], Credentials | None]

    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None:
        creds = self.credentials()
        if not creds:
            raise RuntimeError("no credentials for metrics (instance role or environment)")
        values: list[Metric] = [(names.METRIC_HEARTBEAT, float(int(at.timestamp())), "None")]
        if gpu_util is not None:
            values.append((names.METRIC_GPU_UTIL, gpu_util, "Percent"))
        if gpu_mem is not None:
            values.append((names.METRIC_GPU_MEM, gpu_mem, "Percent"))
        if unsynced is not None:
            values.append((names.METRIC_UNSYNCED, float(unsynced), "Count"))
        self.cloud.put_metrics(self.instance_id, values, creds)


@dataclass
class BucketHeartbeat:
    """The heartbeat where the cloud's metrics service takes none (Tencent: PutMonitorData
    is disused): this node's object ``<HEARTBEAT_OBJECT_PREFIX><instance id>`` in the
    stack's bucket, written again every run. The reaper reads only its Last-Modified, which
    the storage service stamps on its own clock; the body (this node's clock and last
    values) is for people. GPU utilization reaches the reaper through the cloud's own agent
    (infra/clouds/tencent/reaper.py)."""

    store: Callable[[], bucket.BucketStore | None]
    instance_id: str
    timeout_s: float = 30.0

    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None:
        store = self.store()
        if store is None:
            raise RuntimeError("no bucket configured: no heartbeat object written")
        body = {
            "node_time": idle_rules.format_utc(at),
            "gpu_util": gpu_util,
            "gpu_mem": gpu_mem,
            "unsynced": unsynced,
        }
        key = names.HEARTBEAT_OBJECT_PREFIX + self.instance_id
        store.put(key, json.dumps(body).encode(), deadline=time.monotonic() + self.timeout_s)
