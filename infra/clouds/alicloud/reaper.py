"""Alicloud side of the reaper, with the official SDKs (imported lazily).

ECS DescribeInstances filters by our tags server-side and pages with NextToken; StopInstances
uses StoppedMode=StopCharging (compute billing stops) and BatchOptimization=SuccessFirst, so
one bad id cannot hold the others back; a whole-call refusal is still bisected.

Metrics: the watchdog reports with CloudMonitor PutCustomMetric (GroupId 0, Dimensions
``{"instanceId": <id>}``), and the datapoints are read with DescribeMetricList (RAM action
cms:DescribeMetricList) on namespace ``acs_customMetric_<account id>``, the way Alibaba's own
CloudMonitor samples read custom metrics (Dimensions
``[{"groupId": "<group>", "dimension": "instanceId=<id>"}]``, keys in ascending order).
DescribeCustomMetricList, which this module used before, lists the metrics that exist, not
their datapoints (its Result's ``list`` holds metric descriptions). One call per instance and
metric over the window, StartTime/EndTime in ms (left-open, right-closed), Period 60,
NextToken paging, bounded. Its ``Datapoints`` is a JSON string of objects with ``timestamp``
(ms) and the period's ``Minimum``/``Average``/``Maximum`` (the documented example:
help/en/cms/developer-reference/api-cms-2019-01-01-describemetriclist); the parser takes
``Maximum`` and counts anything else as unreadable: a surprise in the real answer keeps
the instance, it never stops it.

Spot recovery (infra/reaper/recovery.py): ECS keeps no stop reason on the instance, but
CloudMonitor keeps the spot interruption as a system event: DescribeSystemEventAttribute
(RAM action cms:DescribeSystemEventAttribute) with Product ECS and Name
``Instance:PreemptibleInstanceInterruption`` (ECS, "Detect and handle spot instance
interruptions", help/en/ecs/user-guide/query-the-interruption-events-of-preemptible-instances,
and "Event notification overview", help.aliyun.com/en/ecs/user-guide/overview-35, read
2026-12-05; request fields StartTime/EndTime in Unix seconds, PageNumber, PageSize <= 100
and the answer's SystemEvents.SystemEvent[] Content, ResourceId, Time from the SDK's models,
alibabacloud_cms20190101 4.0.10 describe_system_event_attribute_*). A stopped spot node
with such an event since its last start (DescribeInstances StartTime) was reclaimed, and
an economical-mode stop is one it can be started from ("the system stops the instance in
economical mode. You can restart the instance", help/en/ecs/user-guide/
preemptible-instance-data-retention-and-data-recovery-after-interrupt-reclamation): the
function starts it (StartInstances, SuccessFirst; a row's code such as
OperationDenied.NoStock is "waiting for capacity"). A stopped spot node without one was
stopped by someone (a person, the watchdog, the reaper): kept. The events cannot be read:
no node is started.

Alicloud limits tag filtering to 1,000 matching resources: scan per stack (the cloud function
always does) when a region holds more managed instances than that.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlparse

from gpufleet_node.fleet_names import CMS_DIMENSION, CMS_GROUP_ID, METRIC_GPU_UTIL, METRIC_HEARTBEAT
from gpufleet_node.idle_rules import UTC, parse_utc
from infra.reaper import tags as T
from infra.reaper.core import (
    MAX_ATTEMPTS_ENV,
    Instance,
    Invocation,
    Metrics,
    ServiceClock,
    StartResult,
    StopRecord,
    StopResult,
    chunks,
    int_env,
    stop_bisected,
)

PAGE = 100  # DescribeInstances MaxResults ceiling
START_BATCH = 100  # StartInstances InstanceId.N ceiling
EVENT_NAME = "Instance:PreemptibleInstanceInterruption"
EVENT_PAGE = 100  # DescribeSystemEventAttribute PageSize ceiling
EVENT_MAX_PAGES = 10  # bounded paging; more is reported as unreadable
EVENT_LOOKBACK_H = 26.0  # the recovery's 24 h window plus margin
# StartInstances codes that mean "no capacity now": tried again next run. "ECS instances
# stopped in economical mode may fail to be started due to insufficient resources"
# (StartInstances, alibabacloud.com/help/en/ecs/api-startinstances, read 2026-12-05); the
# StartInstance error table (alibabacloud.com/help/doc-detail/25500.htm) names
# LackResource and ...NoStock codes for it. Matched as substrings of the row's Code.
NO_CAPACITY = ("NoStock", "LackResource")
STOP_BATCH = 100  # StopInstances InstanceId.N ceiling
METRIC_PAGE = 1440  # DescribeMetricList Length ceiling
METRIC_PERIOD_S = 60  # the finest Period custom metrics keep for 31 days
METRIC_MAX_PAGES = 20  # bounded paging; more is reported as unreadable
TAG_FILTER_LIMIT = 1000

# The function's settings beyond the common ones (handler.py), all optional.
ACCOUNT_ID_ENV = "GPUFLEET_ALICLOUD_ACCOUNT_ID"  # default: the FC context's account id
DEFAULT_MAX_ATTEMPTS = 5


# What the function package carries (infra/reaper/handler.py CloudEntry): Function Compute's
# runtime ships none of the Alibaba Cloud SDKs used here; their closure has compiled modules
# (cryptography, cffi, aiohttp...), so it comes from wheels built for the runtime
# (infra/reaper/wheelhouse.py; `make fc-wheels` fetches them), pinned whole in
# function-requirements.txt beside this file.
VENDOR_SDK = True
SDKS: tuple[str, ...] = ("alibabacloud-ecs20140526", "alibabacloud-cms20190101")
WHEELS = True
# The runtime program.py declares for the function: Function Compute's python3.10 is CPython
# 3.10 on Debian 10 "buster" (so glibc 2.28), x86_64 (Alibaba Cloud, Function Compute >
# Python > Overview, runtime table).
WHEELS_RUNTIME = {"name": "python3.10", "python": (3, 10), "glibc": (2, 28), "arch": "x86_64"}
# Pinned releases that PyPI has as an sdist only, each pure Python (no extension module):
# built into a py3-none-any wheel by the venv's setuptools (scripts/fc_wheels.py).
WHEELS_SDIST_ONLY = ("alibabacloud-tea",)


def from_env(region: str, env: Mapping[str, str], given: Invocation) -> AlicloudCloud:
    """The cloud the function runs: the role's keys from the invocation (Function
    Compute's context: ``access_key_id``, ``access_key_secret``, ``security_token``), the
    account from ``env`` or else the invocation's, and the attempts per call."""
    creds = given.credentials or {}
    return AlicloudCloud(
        region,
        endpoint=given.endpoint,
        access_key_id=creds.get("access_key_id"),
        access_key_secret=creds.get("access_key_secret"),
        security_token=creds.get("security_token"),
        account_id=env.get(ACCOUNT_ID_ENV) or given.account_id,
        max_attempts=int_env(env, MAX_ATTEMPTS_ENV, DEFAULT_MAX_ATTEMPTS),
    )


_RETRYABLE = ("Throttling", "ServiceUnavailable", "InternalError", "UnknownError")
_ID_ERRORS = ("InvalidInstanceId", "IncorrectInstanceStatus", "InvalidParameter")


def custom_namespace(account_id: str) -> str:
    return f"acs_customMetric_{account_id}"


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", None) or type(exc).__name__)


def _text(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return f"{_code(exc)}: {message}"[:300]


def _retryable(exc: BaseException) -> bool:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status >= 500 or status == 429):
        return True
    if _code(exc).startswith(_RETRYABLE):
        return True
    # Connection problems surface as plain exceptions without an API error code.
    return getattr(exc, "code", None) is None and not isinstance(exc, ValueError | TypeError)


class AlicloudCloud:
    provider = "alicloud"

    def __init__(
        self,
        region: str,
        *,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        security_token: str | None = None,
        account_id: str | None = None,
        max_attempts: int = 5,  # attempts per call, the first included (1 = no retry)
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import os

        self.region = region
        self.endpoint = endpoint
        self.access_key_id = access_key_id or os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
        self.access_key_secret = access_key_secret or os.environ.get(
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
        )
        self.security_token = security_token or os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN")
        self.account_id = account_id or os.environ.get(ACCOUNT_ID_ENV)
        if not (self.access_key_id and self.access_key_secret):
            raise ValueError(
                "Alicloud credentials missing: set ALIBABA_CLOUD_ACCESS_KEY_ID and "
                "ALIBABA_CLOUD_ACCESS_KEY_SECRET (or run in Function Compute with a role)"
            )
        if not self.account_id:
            # Custom metrics live in namespace acs_customMetric_<account id>: without it
            # every node would be unreadable, kept and reported, on every run.
            raise ValueError(
                f"Alicloud account id missing: set {ACCOUNT_ID_ENV} (the cloud function "
                "takes it from its context); custom metrics are read from "
                "acs_customMetric_<account id>"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.clock = ServiceClock()
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._ecs: Any = None
        self._cms: Any = None
        self.calls: dict[str, int] = {}

    # ------------------------------------------------------------------ clients

    def _config(self, service: str) -> Any:
        from alibabacloud_tea_openapi import models as open_api_models

        endpoint = f"{service}.{self.region}.aliyuncs.com"
        protocol = "https"
        if self.endpoint:
            parsed = urlparse(self.endpoint if "://" in self.endpoint else f"//{self.endpoint}")
            endpoint = parsed.netloc or parsed.path
            protocol = parsed.scheme or "https"
        return open_api_models.Config(
            access_key_id=self.access_key_id,
            access_key_secret=self.access_key_secret,
            security_token=self.security_token,
            region_id=self.region,
            endpoint=endpoint,
            protocol=protocol,
            read_timeout=20000,
            connect_timeout=10000,
        )

    def ecs(self) -> Any:
        if self._ecs is None:
            from alibabacloud_ecs20140526.client import Client

            self._ecs = Client(self._config("ecs"))
        return self._ecs

    def cms(self) -> Any:
        if self._cms is None:
            from alibabacloud_cms20190101.client import Client

            self._cms = Client(self._config("metrics"))
        return self._cms

    def _call(self, client: Callable[[], Any], action: str, request: Any) -> Any:
        """``<action>_with_options`` with bounded retries and jittered exponential backoff on
        throttling, 5xx and network errors."""
        method = re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower() + "_with_options"
        for attempt in range(1, self.max_attempts + 1):
            self.calls[action] = self.calls.get(action, 0) + 1
            try:
                response = getattr(client(), method)(request, self._runtime())
                headers = getattr(response, "headers", None) or {}
                self.clock.observe(headers.get("date") or headers.get("Date"))
                if getattr(response, "body", None) is None:
                    raise ValueError(f"{action}: the answer has no body")
                return response
            except Exception as exc:
                if attempt == self.max_attempts or not _retryable(exc):
                    raise
                delay = min(8.0, self.backoff_s * 2 ** (attempt - 1))
                self._sleep(delay * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def service_time(self) -> datetime | None:
        return self.clock.now()

    @staticmethod
    def _runtime() -> Any:
        from darabonba.runtime import RuntimeOptions

        # Our own retry loop (above) decides what is worth retrying; the SDK's stays off.
        return RuntimeOptions(autoretry=False, read_timeout=20000, connect_timeout=10000)

    # ------------------------------------------------------------------ scan

    def scan(self, stack: str | None) -> list[Instance]:
        from alibabacloud_ecs20140526 import models as ecs_models

        tag_filter = [
            ecs_models.DescribeInstancesRequestTag(key=T.MANAGED_BY, value=T.MANAGED_BY_VALUE)
        ]
        if stack:
            tag_filter.append(ecs_models.DescribeInstancesRequestTag(key=T.STACK, value=stack))
        found: list[Instance] = []
        token: str | None = None
        while True:
            request = ecs_models.DescribeInstancesRequest(
                region_id=self.region, tag=tag_filter, max_results=PAGE, next_token=token
            )
            response = self._call(self.ecs, "DescribeInstances", request)
            body = response.body.to_map()
            listed = (body.get("Instances") or {}).get("Instance")
            if not isinstance(listed, list) or "RequestId" not in body:
                raise ValueError(
                    "DescribeInstances answered without Instances.Instance and RequestId: "
                    "not the ECS API, or a proxy's page"
                )
            for raw in listed:
                found.append(parse_instance(raw))
            token = body.get("NextToken") or None
            if not token:
                break
        return self._with_stop_records(found)

    # ------------------------------------------------------------------ spot recovery

    def _with_stop_records(self, found: list[Instance]) -> list[Instance]:
        """The stopped spot nodes with the cloud's record: a spot interruption event since
        their last start, or none (someone stopped them); unreadable events: unknown."""
        stopped = [i for i in found if i.state == "stopped" and i.spot]
        if not stopped:
            return found
        try:
            events = self.interruptions()
            records = {
                i.instance_id: interruption_record(i, events.get(i.instance_id)) for i in stopped
            }
        except Exception as exc:  # never "no event": nothing is started
            why = _text(exc)
            unread = StopRecord(None, "spot interruption events", error=why)
            records = {i.instance_id: unread for i in stopped}
        return [
            replace(i, stop_record=records[i.instance_id]) if i.instance_id in records else i
            for i in found
        ]

    def interruptions(self) -> dict[str, datetime]:
        """The newest spot interruption event per instance id over the lookback."""
        from alibabacloud_cms20190101 import models as cms_models

        end = datetime.now(UTC)
        start = end - timedelta(hours=EVENT_LOOKBACK_H)
        newest: dict[str, datetime] = {}
        for page in range(1, EVENT_MAX_PAGES + 1):
            request = cms_models.DescribeSystemEventAttributeRequest(
                product="ECS",
                name=EVENT_NAME,
                start_time=str(int(start.timestamp())),
                end_time=str(int(end.timestamp())),
                page_number=str(page),
                page_size=str(EVENT_PAGE),
            )
            body = self._call(self.cms, "DescribeSystemEventAttribute", request).body.to_map()
            events = parse_system_events(body)
            for iid, when in events:
                if iid not in newest or when > newest[iid]:
                    newest[iid] = when
            if len(events) < EVENT_PAGE:
                return newest
        raise ValueError(f"DescribeSystemEventAttribute: more than {EVENT_MAX_PAGES} pages")

    def start(self, instance_ids: Sequence[str]) -> StartResult:
        """StartInstances with SuccessFirst: one row per id; a no-stock row waits."""
        result = StartResult()
        for batch in chunks(list(instance_ids), START_BATCH):
            self._start_batch(batch, result)
        return result

    def _start_batch(self, ids: Sequence[str], result: StartResult) -> None:
        from alibabacloud_ecs20140526 import models as ecs_models

        request = ecs_models.StartInstancesRequest(
            region_id=self.region, instance_id=list(ids), batch_optimization="SuccessFirst"
        )
        try:
            response = self._call(self.ecs, "StartInstances", request)
        except Exception as exc:  # the call as a whole: every id, tried again next run
            for iid in ids:
                if no_capacity(_code(exc)):
                    result.capacity[iid] = _code(exc)
                else:
                    result.failed[iid] = _text(exc)
            return
        rows = (response.body.to_map().get("InstanceResponses") or {}).get("InstanceResponse")
        seen = set()
        for row in rows or []:
            iid = str(row.get("InstanceId"))
            seen.add(iid)
            code = str(row.get("Code", "200"))
            if code == "200":
                result.started.append(iid)
            elif no_capacity(code):
                result.capacity[iid] = code
            else:
                result.failed[iid] = f"{code}: {row.get('Message', '')}"
        for iid in ids:
            if iid not in seen:
                result.failed[iid] = "not in the StartInstances answer"

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        out: dict[str, Metrics] = {}
        for iid in instance_ids:
            try:
                util = self._custom_points(METRIC_GPU_UTIL, iid, start, end)
                beats = self._custom_points(METRIC_HEARTBEAT, iid, start, end)
            except Exception as exc:  # unreadable, which counts as active
                out[iid] = Metrics(error=_text(exc))
                continue
            out[iid] = Metrics(
                max_gpu_util=max((v for _, v in util), default=None),
                # The time CloudMonitor stores for the datapoint, never the node's value.
                last_heartbeat=max((t for t, _ in beats), default=None),
            )
        return out

    def _custom_points(
        self, metric: str, iid: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, float]]:
        from alibabacloud_cms20190101 import models as cms_models

        if not self.account_id:
            raise ValueError(
                f"no account id for namespace acs_customMetric_<id>: set {ACCOUNT_ID_ENV}"
            )
        points: list[tuple[datetime, float]] = []
        token: str | None = None
        for _page in range(METRIC_MAX_PAGES):
            request = cms_models.DescribeMetricListRequest(
                namespace=custom_namespace(self.account_id),
                metric_name=metric,
                dimensions=custom_dimensions(iid),
                start_time=str(int(start.timestamp() * 1000)),
                end_time=str(int(end.timestamp() * 1000)),
                period=str(METRIC_PERIOD_S),
                length=str(METRIC_PAGE),
                next_token=token,
            )
            response = self._call(self.cms, "DescribeMetricList", request)
            page, token = parse_metric_list(response.body.to_map(), metric, iid)
            points.extend((when, value) for when, value in page if start < when <= end)
            if not token:
                return points
        raise ValueError(f"DescribeMetricList {metric}: more than {METRIC_MAX_PAGES} pages")

    # ------------------------------------------------------------------ stop

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        return stop_bisected(
            instance_ids,
            STOP_BATCH,
            self._stop_call,
            _stopped,
            bisect=lambda exc: _code(exc).startswith(_ID_ERRORS),
            why=_text,
        )

    def _stop_call(self, ids: Sequence[str]) -> Any:
        from alibabacloud_ecs20140526 import models as ecs_models

        request = ecs_models.StopInstancesRequest(
            region_id=self.region,
            instance_id=list(ids),
            stopped_mode="StopCharging",
            batch_optimization="SuccessFirst",
            force_stop=False,
        )
        return self._call(self.ecs, "StopInstances", request)


def _stopped(ids: Sequence[str], response: Any) -> StopResult:
    """What StopInstances' answer says of each id: its own code, or left out."""
    body = response.body.to_map()
    rows = body.get("InstanceResponses", {}).get("InstanceResponse", []) or []
    result = StopResult()
    seen = set()
    for row in rows:
        iid = row.get("InstanceId")
        seen.add(iid)
        if str(row.get("Code", "200")) == "200":
            result.stopped.append(iid)
        else:
            result.failed[iid] = f"{row.get('Code')}: {row.get('Message', '')}"
    for iid in ids:
        if iid not in seen:
            result.failed[iid] = "not in the StopInstances response"
    return result


def no_capacity(code: str) -> bool:
    return any(part in code for part in NO_CAPACITY)


def parse_system_events(body: Mapping[str, Any]) -> list[tuple[str, datetime]]:
    """(instance id, event time) of one DescribeSystemEventAttribute page; ValueError or
    RuntimeError when it is not one. The id from Content's instanceId, else the
    ResourceId's ``instance/<id>`` tail; Time in ms (seconds when it is that small)."""
    if str(body.get("Code", "")) != "200" or body.get("Success") in (False, "false"):
        raise RuntimeError(
            f"DescribeSystemEventAttribute: {body.get('Code')} {body.get('Message')}"
        )
    listed = (body.get("SystemEvents") or {}).get("SystemEvent")
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise ValueError("DescribeSystemEventAttribute: SystemEvents.SystemEvent is not a list")
    out = []
    for event in listed:
        if not isinstance(event, dict) or event.get("Name", EVENT_NAME) != EVENT_NAME:
            continue
        iid = ""
        content = event.get("Content")
        try:
            doc = json.loads(content) if isinstance(content, str) else content
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("instanceId"), str):
            iid = doc["instanceId"]
        elif "instance/" in str(event.get("ResourceId", "")):
            iid = str(event["ResourceId"]).rsplit("instance/", 1)[1]
        stamp = event.get("Time")
        if not iid or isinstance(stamp, bool) or not isinstance(stamp, int | float | str):
            raise ValueError(f"spot interruption event unreadable: {str(event)[:80]}")
        value = float(stamp)
        out.append((iid, datetime.fromtimestamp(value / 1000 if value > 1e11 else value, UTC)))
    return out


def interruption_record(inst: Instance, event_at: datetime | None) -> StopRecord:
    """The cloud's record for one stopped spot node: reclaimed when an interruption event
    came after its last start (DescribeInstances StartTime)."""
    if event_at is not None and (inst.launched_at is None or event_at >= inst.launched_at):
        when = event_at.strftime("%Y-%m-%d %H:%M UTC")
        return StopRecord(True, f"CloudMonitor {EVENT_NAME} at {when}", at=event_at)
    return StopRecord(False, f"no {EVENT_NAME} event since its last start")


def custom_dimensions(iid: str) -> str:
    """The Dimensions of one node's custom metrics, as Alibaba's CloudMonitor samples
    write them for acs_customMetric_<id>: the group and the reported dimensions as
    ``key=value`` pairs joined by ``&`` in ascending key order (we report one)."""
    return json.dumps([{"groupId": str(CMS_GROUP_ID), "dimension": f"{CMS_DIMENSION}={iid}"}])


def parse_metric_list(
    body: Mapping[str, Any], metric: str, iid: str
) -> tuple[list[tuple[datetime, float]], str | None]:
    """(datapoints, next token) of one DescribeMetricList answer; ValueError or
    RuntimeError when it is not one (the caller counts that as unreadable)."""
    if str(body.get("Code", "")) != "200" or body.get("Success") is False:
        raise RuntimeError(f"DescribeMetricList {metric}: {body.get('Code')} {body.get('Message')}")
    raw = body.get("Datapoints")
    if raw in (None, ""):
        entries: Any = []  # a window without datapoints
    elif isinstance(raw, str):
        entries = json.loads(raw)
    else:
        raise ValueError(f"DescribeMetricList {metric}: Datapoints is not a JSON string")
    if not isinstance(entries, list):
        raise ValueError(f"DescribeMetricList {metric}: Datapoints is not a list")
    points = [_datapoint(entry, iid) for entry in entries]
    return points, str(body.get("NextToken") or "") or None


def _datapoint(entry: Any, iid: str) -> tuple[datetime, float]:
    """(time CloudMonitor stored, the period's Maximum) of one datapoint."""
    if not isinstance(entry, dict):
        raise ValueError(f"datapoint is not an object: {entry!r:.60}")
    named = entry.get(CMS_DIMENSION)
    dimension = entry.get("dimension")
    if named is None and isinstance(dimension, str):
        pairs = dict(p.split("=", 1) for p in dimension.split("&") if "=" in p)
        named = pairs.get(CMS_DIMENSION)
    if named is not None and named != iid:
        raise ValueError(f"datapoint for {named!r}, asked for {iid!r}")
    stamp, value = entry.get("timestamp"), entry.get("Maximum")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise ValueError(f"datapoint without a timestamp: {entry!r:.80}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"datapoint without a Maximum: {entry!r:.80}")
    return datetime.fromtimestamp(stamp / 1000, UTC), float(value)


def parse_instance(raw: dict[str, Any]) -> Instance:
    """One ECS instance; a part that cannot be read makes it a kept, reported ``problem``."""
    tags: dict[str, Any] = {}
    listed = (raw.get("Tags") or {}).get("Tag") if isinstance(raw.get("Tags"), dict) else None
    for t in listed or []:
        if isinstance(t, dict) and isinstance(t.get("TagKey"), str):
            tags[t["TagKey"]] = t.get("TagValue")
    problem = None
    launched: datetime | None = None
    started = raw.get("StartTime") or raw.get("CreationTime")
    try:
        launched = parse_utc(str(started)) if started else None
        if launched is None:
            problem = "neither StartTime nor CreationTime"
    except ValueError as exc:
        problem = f"StartTime unreadable: {exc}"
    state = str(raw.get("Status", "unknown")).lower()
    return Instance(
        instance_id=str(raw.get("InstanceId", "?")),
        state=state,
        instance_type=str(raw.get("InstanceType", "")),
        launched_at=launched,
        tags=tags,
        spot=raw.get("SpotStrategy", "NoSpot") not in ("", "NoSpot"),
        prepaid=raw.get("InstanceChargeType") == "PrePaid",
        problem=problem,
        # Standard stop mode keeps billing vCPUs, memory and GPUs (DescribeInstances
        # StoppedMode: KeepCharging | StopCharging | Not-applicable). Only a start and a
        # new stop in economical mode end that; the reaper never starts anything.
        billed_while_stopped=state == "stopped" and raw.get("StoppedMode") == "KeepCharging",
    )
