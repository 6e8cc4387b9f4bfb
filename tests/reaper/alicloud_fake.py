"""A protocol fake of the Alicloud ECS and CloudMonitor RPC actions the reaper uses.

No Alicloud emulator exists, so this speaks just enough of the real wire format for the
official SDKs: POST, action in the ``x-acs-action`` header, parameters in the query string,
JSON bodies shaped like the documented responses. It is a protocol fake, not an emulator:
it checks what we send and answers like the docs say, nothing more.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from alibabacloud_cms20190101 import models as cms_models
from alibabacloud_ecs20140526 import models as ecs_models

from tests.support.alicloud_models import unknown_params

# Each action's parameters are the ones its SDK request model defines; any
# other is refused, as the API refuses it.
REQUEST_MODELS: dict[str, type[Any]] = {
    "DescribeInstances": ecs_models.DescribeInstancesRequest,
    "StopInstances": ecs_models.StopInstancesRequest,
    "StartInstances": ecs_models.StartInstancesRequest,
    "DescribeMetricList": cms_models.DescribeMetricListRequest,
    "DescribeSystemEventAttribute": cms_models.DescribeSystemEventAttributeRequest,
}


@dataclass
class FakeInstance:
    instance_id: str
    tags: dict[str, str]
    start_time: str  # "2026-03-01T08:00Z", Alicloud's format
    status: str = "Running"
    instance_type: str = "ecs.gn7i-c8g1.2xlarge"
    spot_strategy: str = "NoSpot"
    charge_type: str = "PostPaid"
    refuses_stop: bool = False
    stopped_mode: str = ""  # DescribeInstances StoppedMode; StopInstances sets it
    public_ip: str = ""
    private_ip: str = "10.0.0.5"
    # Local disks: no economical mode, and "API 侧不会进行报错拦截，优先保证实例停机" (StopInstance,
    # https://help.aliyun.com/document_detail/25501.html, read 2026-12-02): stopped in
    # standard mode (StoppedMode KeepCharging), with no error.
    local_disks: bool = False
    starts: int = 0
    no_stock: bool = False  # StartInstances answers this row LackResource


@dataclass
class FakeAlicloud:
    instances: list[FakeInstance] = field(default_factory=list)
    # (metric, instance id) -> [(unix ms, value)], as PutCustomMetric stored them
    datapoints: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    throttle_rate: float = 0.0
    fail_actions: set[str] = field(default_factory=set)  # answered with an error code
    throttle_actions: set[str] = field(default_factory=set)  # always Throttling.User
    html_actions: set[str] = field(default_factory=set)  # answered 200 with an HTML page
    account_id: str = "1234567890"  # the namespace acs_customMetric_<id> it answers for
    # CloudMonitor system events: (instance id, Unix ms) of each spot interruption
    interruptions: list[tuple[str, int]] = field(default_factory=list)
    seed: int = 3
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ actions

    def describe_instances(self, q: dict[str, str]) -> dict[str, Any]:
        wanted: dict[str, str] = {}
        n = 1
        while f"Tag.{n}.Key" in q:
            wanted[q[f"Tag.{n}.Key"]] = q.get(f"Tag.{n}.Value", "")
            n += 1
        if q.get("RegionId") != "cn-beijing":
            return {"__status__": 400, "Code": "InvalidRegionId.NotFound", "Message": "region"}
        ids = json.loads(q["InstanceIds"]) if "InstanceIds" in q else None
        match = [
            i
            for i in self.instances
            if all(i.tags.get(k) == v for k, v in wanted.items())
            and (ids is None or i.instance_id in ids)
        ]
        size = int(q.get("MaxResults", "10"))
        offset = int(q.get("NextToken") or 0)
        page = match[offset : offset + size]
        token = str(offset + size) if offset + size < len(match) else ""
        return {
            "RequestId": "fake",
            "NextToken": token,
            "Instances": {
                "Instance": [
                    {
                        "InstanceId": i.instance_id,
                        "Status": i.status,
                        "InstanceType": i.instance_type,
                        "StartTime": i.start_time,
                        "CreationTime": i.start_time,
                        "SpotStrategy": i.spot_strategy,
                        "InstanceChargeType": i.charge_type,
                        **({"StoppedMode": i.stopped_mode} if i.stopped_mode else {}),
                        # the SDK's DescribeInstancesResponseBody...PublicIpAddress,
                        # EipAddress and VpcAttributes.PrivateIpAddress models
                        "PublicIpAddress": {"IpAddress": [i.public_ip] if i.public_ip else []},
                        "EipAddress": {"IpAddress": ""},
                        "VpcAttributes": {"PrivateIpAddress": {"IpAddress": [i.private_ip]}},
                        "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in i.tags.items()]},
                    }
                    for i in page
                ]
            },
        }

    def stop_instances(self, q: dict[str, str]) -> dict[str, Any]:
        if q.get("StoppedMode") != "StopCharging":
            return {"__status__": 400, "Code": "Fake.WrongMode", "Message": "want StopCharging"}
        ids = [q[k] for k in sorted(q, key=_index) if k.startswith("InstanceId.")]
        if not 1 <= len(ids) <= 100:
            return {"__status__": 400, "Code": "InvalidParameter", "Message": "1..100 ids"}
        by_id = {i.instance_id: i for i in self.instances}
        rows = []
        for iid in ids:
            inst = by_id.get(iid)
            if inst is None:
                rows.append({"InstanceId": iid, "Code": "InvalidInstanceId.NotFound"})
            elif inst.refuses_stop:
                rows.append(
                    {"InstanceId": iid, "Code": "IncorrectInstanceStatus", "Message": "locked"}
                )
            else:
                previous = inst.status
                mode = "KeepCharging" if inst.local_disks else q["StoppedMode"]
                inst.status, inst.stopped_mode = "Stopped", mode
                rows.append(
                    {
                        "InstanceId": iid,
                        "Code": "200",
                        "Message": "success",
                        "PreviousStatus": previous,
                        "CurrentStatus": "Stopping",
                    }
                )
        return {"RequestId": "fake", "InstanceResponses": {"InstanceResponse": rows}}

    def start_instances(self, q: dict[str, str]) -> dict[str, Any]:
        """StartInstances with BatchOptimization=SuccessFirst: a row per id (the SDK's
        StartInstancesResponseBody InstanceResponses.InstanceResponse: InstanceId, Code,
        Message, PreviousStatus, CurrentStatus)."""
        ids = [q[k] for k in sorted(q, key=_index) if k.startswith("InstanceId.")]
        if not 1 <= len(ids) <= 100:
            return {"__status__": 400, "Code": "InvalidParameter", "Message": "1..100 ids"}
        by_id = {i.instance_id: i for i in self.instances}
        rows = []
        for iid in ids:
            inst = by_id.get(iid)
            if inst is None:
                rows.append({"InstanceId": iid, "Code": "InvalidInstanceId.NotFound"})
            elif inst.status != "Stopped":
                rows.append({"InstanceId": iid, "Code": "IncorrectInstanceStatus"})
            elif inst.no_stock:
                # "ECS instances stopped in economical mode may fail to be started due to
                # insufficient resources" (help/en/ecs/api-startinstances); LackResource
                # is a code of StartInstance's error table (help/doc-detail/25500.htm).
                rows.append(
                    {"InstanceId": iid, "Code": "LackResource", "Message": "no enough resource"}
                )
            else:
                inst.starts += 1
                if inst.stopped_mode == "StopCharging" and inst.public_ip:
                    # "固定公网 IP 地址可能会变" in economical mode (the same page)
                    inst.public_ip = f"127.0.{inst.starts}.1"
                inst.status, inst.stopped_mode = "Running", ""
                rows.append(
                    {
                        "InstanceId": iid,
                        "Code": "200",
                        "Message": "success",
                        "PreviousStatus": "Stopped",
                        "CurrentStatus": "Starting",
                    }
                )
        return {"RequestId": "fake", "InstanceResponses": {"InstanceResponse": rows}}

    def describe_metric_list(self, q: dict[str, str]) -> dict[str, Any]:
        """Custom-metric datapoints the way DescribeMetricList answers: ``Datapoints``
        a JSON string of objects with ``timestamp`` (ms), the dimensions asked by and
        the period's Minimum/Average/Maximum, as the documented response example
        (help/en/cms/developer-reference/api-cms-2019-01-01-describemetriclist) has
        them; the window is left-open, right-closed; NextToken pages."""
        if q.get("Namespace") != f"acs_customMetric_{self.account_id}":
            return {"__status__": 400, "Code": "ParameterInvalid", "Message": "Namespace"}
        try:
            (dims,) = json.loads(q.get("Dimensions", ""))
            group, dimension = dims["groupId"], dims["dimension"]
            start, end = int(q["StartTime"]), int(q["EndTime"])
            size, offset = int(q.get("Length", "1000")), int(q.get("NextToken") or 0)
        except (ValueError, KeyError, TypeError):
            return {"__status__": 400, "Code": "ParameterInvalid", "Message": "Illegal"}
        if group != "0" or not 0 < size <= 1440 or not start < end:
            return {"__status__": 400, "Code": "ParameterInvalid", "Message": "Illegal"}
        iid = dimension.removeprefix("instanceId=")
        metric = q.get("MetricName", "")
        points = [
            {
                "timestamp": ts,
                "userId": self.account_id,
                "groupId": group,
                "dimension": dimension,
                "Minimum": value,
                "Average": value,
                "Maximum": value,
            }
            for ts, value in sorted(self.datapoints.get((metric, iid), []))
            if start < ts <= end
        ]
        chunk = points[offset : offset + size]
        token = str(offset + size) if offset + size < len(points) else None
        body: dict[str, Any] = {
            "RequestId": "fake",
            "Success": True,
            "Code": "200",
            "Period": q.get("Period", "60"),
            "Datapoints": json.dumps(chunk),
        }
        if token:
            body["NextToken"] = token
        return body

    def describe_system_event_attribute(self, q: dict[str, str]) -> dict[str, Any]:
        """CloudMonitor's system events, shaped by the SDK's
        DescribeSystemEventAttributeResponseBody (alibabacloud_cms20190101 4.0.10):
        SystemEvents.SystemEvent[] with Content (a JSON string), Name, Product,
        ResourceId (acs:ecs:<region>:<uid>:instance/<id>, as the event notification
        overview shows it: help.aliyun.com/en/ecs/user-guide/overview-35), Time (ms).
        StartTime/EndTime in Unix seconds (the request model's comment), PageNumber and
        PageSize (1 to 100)."""
        try:
            start, end = int(q["StartTime"]), int(q["EndTime"])
            page, size = int(q.get("PageNumber", "1")), int(q.get("PageSize", "10"))
        except (KeyError, ValueError):
            return {"__status__": 400, "Code": "ParameterInvalid", "Message": "Illegal"}
        if not 1 <= size <= 100 or start >= end or start > 10**11:
            return {"__status__": 400, "Code": "ParameterInvalid", "Message": "Illegal"}
        events = [
            {
                "Content": json.dumps({"instanceId": iid, "action": "stop"}),
                "GroupId": "",
                "Id": f"evt-{n}",
                "InstanceName": iid,
                "Level": "CRITICAL",
                "Name": q.get("Name", ""),
                "Product": "ECS",
                "RegionId": "cn-beijing",
                "ResourceId": f"acs:ecs:cn-beijing:{self.account_id}:instance/{iid}",
                "Status": "Normal",
                "Time": ms,
            }
            for n, (iid, ms) in enumerate(self.interruptions)
            if q.get("Product") == "ECS"
            and q.get("Name") == "Instance:PreemptibleInstanceInterruption"
            and start * 1000 <= ms <= end * 1000
        ]
        chunk = events[(page - 1) * size : page * size]
        return {
            "RequestId": "fake",
            "Code": "200",
            "Success": True,
            "SystemEvents": {"SystemEvent": chunk},
        }

    # ------------------------------------------------------------------ server

    def handle(self, action: str, q: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((action, q))
            if action in self.fail_actions:
                return 500, {"Code": "InternalError", "Message": "fault injected"}
            if action in self.throttle_actions:
                return 400, {"Code": "Throttling.User", "Message": "Request was denied"}
            if self.throttle_rate and self.rng.random() < self.throttle_rate:
                if self.rng.random() < 0.5:
                    return 400, {"Code": "Throttling.User", "Message": "Request was denied"}
                return 503, {"Code": "ServiceUnavailable", "Message": "try later"}
            fn = {
                "DescribeInstances": self.describe_instances,
                "StopInstances": self.stop_instances,
                "StartInstances": self.start_instances,
                "DescribeMetricList": self.describe_metric_list,
                "DescribeSystemEventAttribute": self.describe_system_event_attribute,
            }.get(action)
            if fn is None:
                return 400, {"Code": "InvalidAction.NotFound", "Message": action}
            unknown = unknown_params(REQUEST_MODELS[action], q)
            if unknown:
                return 400, {"Code": "InvalidParameter", "Message": f"unknown {unknown}"}
            body = fn(q)
            return int(body.pop("__status__", 200)), body

    @contextmanager
    def running(self) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if "Authorization" not in self.headers:
                    status, body = 400, {"Code": "MissingAuthorization", "Message": "unsigned"}
                else:
                    query = {k: v[-1] for k, v in parse_qs(urlparse(self.path).query).items()}
                    action = self.headers.get("x-acs-action", "")
                    if action in fake.html_actions:
                        return self._html()
                    status, body = fake.handle(action, query)
                body.setdefault("RequestId", "fake")
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json;charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _html(self) -> None:
                data = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            server.server_close()


def _index(key: str) -> int:
    try:
        return int(key.split(".")[1])
    except (IndexError, ValueError):
        return 0
