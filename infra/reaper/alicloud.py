"""Alicloud side of the reaper, with the official SDKs (imported lazily).

ECS DescribeInstances filters by our tags server-side and pages with NextToken; StopInstances
uses StoppedMode=StopCharging (compute billing stops) and BatchOptimization=SuccessFirst, so
one bad id cannot hold the others back; a whole-call refusal is still bisected. Metrics come
from CloudMonitor DescribeMetricList on the custom-metric namespace
``acs_customMetric_<account id>`` (PutCustomMetric with GroupId 0 lands there), 50 instances
per call (the API's limit), NextToken paging.

Alicloud limits tag filtering to 1,000 matching resources: scan per stack (the cloud function
always does) when a region holds more managed instances than that.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from . import tags as T
from .core import METRIC_GPU_UTIL, METRIC_HEARTBEAT, Instance, Metrics, StopResult, chunks
from .policy import UTC, parse_utc

PAGE = 100  # DescribeInstances MaxResults ceiling
STOP_BATCH = 100  # StopInstances InstanceId.N ceiling
METRIC_DIMENSIONS_PER_CALL = 50  # DescribeMetricList: at most 50 instances per request
METRIC_PAGE = 1440  # DescribeMetricList Length ceiling
TAG_FILTER_LIMIT = 1000
CMS_DIMENSION = "instanceId"

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
        max_attempts: int = 5,
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
        self.account_id = account_id or os.environ.get("GPUFLEET_ALICLOUD_ACCOUNT_ID")
        if not (self.access_key_id and self.access_key_secret):
            raise ValueError(
                "Alicloud credentials missing: set ALIBABA_CLOUD_ACCESS_KEY_ID and "
                "ALIBABA_CLOUD_ACCESS_KEY_SECRET (or run in Function Compute with a role)"
            )
        self.max_attempts = max_attempts
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
                return getattr(client(), method)(request, self._runtime())
            except Exception as exc:
                if attempt == self.max_attempts or not _retryable(exc):
                    raise
                delay = min(8.0, self.backoff_s * 2 ** (attempt - 1))
                self._sleep(delay * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

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
            for raw in body.get("Instances", {}).get("Instance", []) or []:
                found.append(parse_instance(raw))
            token = body.get("NextToken") or None
            if not token:
                break
        return found

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        if not self.account_id:
            why = "GPUFLEET_ALICLOUD_ACCOUNT_ID unset: cannot name the custom-metric namespace"
            return {iid: Metrics(error=why) for iid in instance_ids}
        out: dict[str, Metrics] = {}
        for batch in chunks(list(instance_ids), METRIC_DIMENSIONS_PER_CALL):
            try:
                util = self._metric_max(METRIC_GPU_UTIL, batch, start, end)
                beats = self._metric_max(METRIC_HEARTBEAT, batch, start, end)
            except Exception as exc:  # the batch is unreadable, which counts as active
                out.update({iid: Metrics(error=_text(exc)) for iid in batch})
                continue
            for iid in batch:
                beat = beats.get(iid)
                out[iid] = Metrics(
                    max_gpu_util=util.get(iid),
                    last_heartbeat=None if beat is None else datetime.fromtimestamp(beat, UTC),
                )
        return out

    def _metric_max(
        self, metric: str, ids: Sequence[str], start: datetime, end: datetime
    ) -> dict[str, float]:
        from alibabacloud_cms20190101 import models as cms_models

        best: dict[str, float] = {}
        wanted = set(ids)
        token: str | None = None
        while True:
            request = cms_models.DescribeMetricListRequest(
                namespace=custom_namespace(str(self.account_id)),
                metric_name=metric,
                dimensions=json.dumps([{CMS_DIMENSION: iid} for iid in ids]),
                period="60",
                start_time=str(int(start.timestamp() * 1000)),
                end_time=str(int(end.timestamp() * 1000)),
                length=str(METRIC_PAGE),
                next_token=token,
            )
            response = self._call(self.cms, "DescribeMetricList", request)
            body = response.body.to_map()
            if str(body.get("Success", "true")).lower() == "false" or str(
                body.get("Code", "200")
            ) not in {"200", ""}:
                raise RuntimeError(
                    f"DescribeMetricList {metric}: {body.get('Code')} {body.get('Message')}"
                )
            for point in json.loads(body.get("Datapoints") or "[]"):
                iid = point.get(CMS_DIMENSION) or point.get("InstanceId")
                if iid not in wanted:
                    continue
                value = next(
                    (point[k] for k in ("Maximum", "Value", "Average") if k in point), None
                )
                if value is None:
                    continue
                best[iid] = max(float(value), best.get(iid, float("-inf")))
            token = body.get("NextToken") or None
            if not token:
                break
        return best

    # ------------------------------------------------------------------ stop

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        result = StopResult()
        for batch in chunks(list(instance_ids), STOP_BATCH):
            result.merge(self._stop_bisect(batch))
        return result

    def _stop_bisect(self, ids: Sequence[str]) -> StopResult:
        from alibabacloud_ecs20140526 import models as ecs_models

        request = ecs_models.StopInstancesRequest(
            region_id=self.region,
            instance_id=list(ids),
            stopped_mode="StopCharging",
            batch_optimization="SuccessFirst",
            force_stop=False,
        )
        try:
            response = self._call(self.ecs, "StopInstances", request)
        except Exception as exc:
            if len(ids) == 1 or not _code(exc).startswith(_ID_ERRORS):
                return StopResult(failed={iid: _text(exc) for iid in ids})
            half = len(ids) // 2
            left = self._stop_bisect(ids[:half])
            left.merge(self._stop_bisect(ids[half:]))
            return left
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


def parse_instance(raw: dict[str, Any]) -> Instance:
    tags = {t.get("TagKey", ""): t.get("TagValue", "") for t in raw.get("Tags", {}).get("Tag", [])}
    started = raw.get("StartTime") or raw.get("CreationTime")
    if not started:
        raise ValueError(f"instance {raw.get('InstanceId')} has neither StartTime nor CreationTime")
    return Instance(
        instance_id=raw["InstanceId"],
        state=str(raw.get("Status", "unknown")).lower(),
        instance_type=raw.get("InstanceType", ""),
        launched_at=parse_utc(started),
        tags=tags,
        spot=raw.get("SpotStrategy", "NoSpot") not in ("", "NoSpot"),
        prepaid=raw.get("InstanceChargeType") == "PrePaid",
    )
