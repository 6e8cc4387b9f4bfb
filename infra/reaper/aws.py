"""AWS side of the reaper: tag-filtered EC2 scan, batched CloudWatch reads, batched stops.

boto3 is imported lazily so ``import infra.reaper`` stays cheap and SDK-free.

API budget for N managed instances (the benchmark measures it):
  DescribeInstances: ceil(N / 1000) pages (tag filters run server-side);
  GetMetricData: ceil(N / 250) calls (2 queries per instance, 500 per call);
  StopInstances: ceil(stops / 100) calls, plus log2(batch) per id that AWS refuses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import tags as T
from .core import (
    DIMENSION,
    METRIC_GPU_UTIL,
    METRIC_HEARTBEAT,
    NAMESPACE,
    Instance,
    Metrics,
    StopResult,
    chunks,
)
from .policy import UTC

if TYPE_CHECKING:
    from botocore.client import BaseClient

DESCRIBE_PAGE = 1000  # DescribeInstances MaxResults ceiling
QUERIES_PER_CALL = 500  # GetMetricData ceiling
STOP_BATCH = 100
SCANNED_STATES = ("pending", "running", "stopping", "stopped")

# Errors that name a problem with the request's ids or their state: bisecting isolates them.
# Anything else (throttling, 5xx after botocore's retries, auth) fails the whole batch at once:
# splitting it would only multiply calls that fail for the same reason.
_ID_ERRORS = (
    "InvalidInstanceID",
    "IncorrectInstanceState",
    "UnsupportedOperation",
    "OperationNotPermitted",
    "InvalidParameterCombination",
)


@dataclass
class CallCounter:
    """API operations and HTTP attempts (retries included), per operation name."""

    operations: dict[str, int] = field(default_factory=dict)
    attempts: int = 0

    @property
    def total(self) -> int:
        return sum(self.operations.values())

    def _on_call(self, model: Any, **_: Any) -> None:
        self.operations[model.name] = self.operations.get(model.name, 0) + 1

    def _on_send(self, **_: Any) -> None:
        self.attempts += 1

    def attach(self, client: BaseClient) -> None:
        client.meta.events.register("before-call.*", self._on_call)
        client.meta.events.register("before-send.*", self._on_send)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", type(exc).__name__))
    return type(exc).__name__


def _error_text(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', type(exc).__name__)}: {err.get('Message', '')}".strip(": ")
    return f"{type(exc).__name__}: {exc}"


class AwsCloud:
    provider = "aws"

    def __init__(
        self,
        region: str,
        *,
        endpoint_url: str | None = None,
        retry_mode: str = "standard",
        max_attempts: int = 6,
        timeout_s: float = 20.0,
        counter: CallCounter | None = None,
        session: Any = None,
    ) -> None:
        if retry_mode not in {"standard", "adaptive"}:
            raise ValueError(f"retry_mode must be 'standard' or 'adaptive', got {retry_mode!r}")
        self.region = region
        self.endpoint_url = endpoint_url
        self.counter = counter or CallCounter()
        self._retry = {"mode": retry_mode, "max_attempts": max_attempts}
        self._timeout_s = timeout_s
        self._session = session
        self._clients: dict[str, BaseClient] = {}

    def client(self, service: str) -> BaseClient:
        if service not in self._clients:
            import boto3
            from botocore.config import Config

            session = self._session or boto3.session.Session()
            client = session.client(
                service,
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                config=Config(
                    retries=self._retry,
                    connect_timeout=self._timeout_s,
                    read_timeout=self._timeout_s,
                    user_agent_extra="gpufleet-reaper",
                ),
            )
            self.counter.attach(client)
            self._clients[service] = client
        return self._clients[service]

    # ------------------------------------------------------------------ scan

    def scan(self, stack: str | None) -> list[Instance]:
        filters = [
            {"Name": f"tag:{T.MANAGED_BY}", "Values": [T.MANAGED_BY_VALUE]},
            {"Name": "instance-state-name", "Values": list(SCANNED_STATES)},
        ]
        if stack:
            filters.append({"Name": f"tag:{T.STACK}", "Values": [stack]})
        paginator = self.client("ec2").get_paginator("describe_instances")
        found: list[Instance] = []
        pages = paginator.paginate(Filters=filters, PaginationConfig={"PageSize": DESCRIBE_PAGE})
        for page in pages:
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    found.append(parse_instance(raw))
        return found

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        """Heartbeat and GPU utilization for every id, 250 instances per GetMetricData call.

        A batch whose call fails (after botocore's retries) marks its instances unreadable,
        which the policy counts as active.
        """
        period = max(60, math.ceil((end - start).total_seconds() / 60) * 60)
        out: dict[str, Metrics] = {}
        per_call = QUERIES_PER_CALL // 2
        for batch in chunks(list(instance_ids), per_call):
            try:
                out.update(self._metrics_batch(batch, start, end, period))
            except Exception as exc:  # any failure of the batch: unreadable, never "idle"
                why = _error_text(exc)
                out.update({iid: Metrics(error=why) for iid in batch})
        return out

    def _metrics_batch(
        self, ids: Sequence[str], start: datetime, end: datetime, period: int
    ) -> dict[str, Metrics]:
        queries = []
        for n, iid in enumerate(ids):
            dims = [{"Name": DIMENSION, "Value": iid}]
            for prefix, metric in (("u", METRIC_GPU_UTIL), ("h", METRIC_HEARTBEAT)):
                queries.append(
                    {
                        "Id": f"{prefix}{n}",
                        "MetricStat": {
                            "Metric": {
                                "Namespace": NAMESPACE,
                                "MetricName": metric,
                                "Dimensions": dims,
                            },
                            "Period": period,
                            "Stat": "Maximum",
                        },
                        "ReturnData": True,
                    }
                )
        values: dict[str, list[float]] = {}
        incomplete: set[str] = set()
        token: str | None = None
        cw = self.client("cloudwatch")
        while True:
            kwargs: dict[str, Any] = {
                "MetricDataQueries": queries,
                "StartTime": start,
                "EndTime": end,
                "ScanBy": "TimestampDescending",
            }
            if token:
                kwargs["NextToken"] = token
            response = cw.get_metric_data(**kwargs)
            for result in response.get("MetricDataResults", []):
                values.setdefault(result["Id"], []).extend(result.get("Values", []))
                if result.get("StatusCode") not in (None, "Complete", "PartialData"):
                    incomplete.add(result["Id"])
            token = response.get("NextToken")
            if not token:
                break
        out: dict[str, Metrics] = {}
        for n, iid in enumerate(ids):
            if f"u{n}" in incomplete or f"h{n}" in incomplete:
                out[iid] = Metrics(error="CloudWatch returned an incomplete result")
                continue
            util = values.get(f"u{n}", [])
            beats = values.get(f"h{n}", [])
            out[iid] = Metrics(
                max_gpu_util=max(util) if util else None,
                last_heartbeat=datetime.fromtimestamp(max(beats), UTC) if beats else None,
            )
        return out

    # ------------------------------------------------------------------ stop

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        """Stop in batches; a batch refused for an id is bisected to isolate that id."""
        result = StopResult()
        for batch in chunks(list(instance_ids), STOP_BATCH):
            result.merge(self._stop_bisect(batch))
        return result

    def _stop_bisect(self, ids: Sequence[str]) -> StopResult:
        try:
            response = self.client("ec2").stop_instances(InstanceIds=list(ids))
        except Exception as exc:
            code = _error_code(exc)
            why = _error_text(exc)
            if len(ids) == 1 or not code.startswith(_ID_ERRORS):
                return StopResult(failed={iid: why for iid in ids})
            half = len(ids) // 2
            left = self._stop_bisect(ids[:half])
            left.merge(self._stop_bisect(ids[half:]))
            return left
        done = {s["InstanceId"] for s in response.get("StoppingInstances", [])}
        return StopResult(
            stopped=[i for i in ids if i in done],
            failed={i: "not in the StopInstances response" for i in ids if i not in done},
        )


def parse_instance(raw: dict[str, Any]) -> Instance:
    tags = {t["Key"]: t.get("Value", "") for t in raw.get("Tags", [])}
    launched = raw["LaunchTime"]
    if isinstance(launched, str):
        launched = datetime.fromisoformat(launched.replace("Z", "+00:00"))
    if launched.tzinfo is None:
        launched = launched.replace(tzinfo=UTC)
    return Instance(
        instance_id=raw["InstanceId"],
        state=raw.get("State", {}).get("Name", "unknown"),
        instance_type=raw.get("InstanceType", ""),
        launched_at=launched.astimezone(UTC),
        tags=tags,
        spot=raw.get("InstanceLifecycle") == "spot",
    )
