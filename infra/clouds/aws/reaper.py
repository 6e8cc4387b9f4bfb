"""AWS side of the reaper: tag-filtered EC2 scan, batched CloudWatch reads, batched stops.

boto3 is imported lazily so ``import infra.reaper`` stays cheap and SDK-free.

API budget for N managed instances (the benchmark measures it):
  DescribeInstances: ceil(N / 1000) pages (tag filters run server-side);
  GetMetricData: ceil(N / 250) calls (2 queries per instance, 500 per call);
  StopInstances: ceil(stops / 100) calls, plus log2(batch) per id that AWS refuses.

Every answer must have the shape the API documents: a DescribeInstances page without
``Reservations`` or a GetMetricData answer without ``MetricDataResults`` (an HTML page from
a proxy parses as neither) is an error, never "no instances" or "no data". The service's
clock comes from the answers' Date headers (:class:`~infra.reaper.core.ServiceClock`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufleet_node.fleet_names import DIMENSION, METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE
from gpufleet_node.idle_rules import UTC
from infra.reaper import tags as T
from infra.reaper.core import (
    MAX_ATTEMPTS_ENV,
    ConfigError,
    Instance,
    Invocation,
    Metrics,
    ServiceClock,
    StopRecord,
    StopResult,
    chunks,
    int_env,
    stop_bisected,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

DESCRIBE_PAGE = 1000  # DescribeInstances MaxResults ceiling
QUERIES_PER_CALL = 500  # GetMetricData ceiling
STOP_BATCH = 100
SCANNED_STATES = ("pending", "running", "stopping", "stopped")
HEARTBEAT_PERIOD = 60  # one datapoint per minute: the newest one's timestamp is the last beat
# The function's settings beyond the common ones (handler.py), all optional.
RETRY_MODE_ENV = "GPUFLEET_RETRY_MODE"  # standard (default) | adaptive: botocore's modes
DEFAULT_MAX_ATTEMPTS = 6


# What the function package carries (infra/reaper/handler.py CloudEntry): Lambda's Python
# runtime ships boto3, so only the code and the table.
VENDOR_SDK = False
SDKS: tuple[str, ...] = ()
WHEELS = False


def from_env(region: str, env: Mapping[str, str], given: Invocation) -> AwsCloud:
    """The cloud the function runs, its settings from ``env``: the retry mode and the
    attempts per call. Credentials come from boto3's own chain (the Lambda's role), so
    the invocation's credentials and account are not read."""
    retry_mode = env.get(RETRY_MODE_ENV, "standard")
    if retry_mode not in ("standard", "adaptive"):
        raise ConfigError(f"{RETRY_MODE_ENV} must be standard or adaptive, got {retry_mode!r}")
    return AwsCloud(
        region,
        endpoint_url=given.endpoint,
        retry_mode=retry_mode,
        max_attempts=int_env(env, MAX_ATTEMPTS_ENV, DEFAULT_MAX_ATTEMPTS),
    )


class MalformedAnswer(RuntimeError):
    """An API answered 2xx with a body that is not the documented shape."""


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
        max_attempts: int = 6,  # attempts per call, the first included (1 = no retry)
        timeout_s: float = 20.0,
        counter: CallCounter | None = None,
        session: Any = None,
    ) -> None:
        if retry_mode not in {"standard", "adaptive"}:
            raise ValueError(f"retry_mode must be 'standard' or 'adaptive', got {retry_mode!r}")
        self.region = region
        self.endpoint_url = endpoint_url
        self.counter = counter or CallCounter()
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        # botocore's "max_attempts" counts retries only; "total_max_attempts" counts attempts.
        self._retry = {"mode": retry_mode, "total_max_attempts": max_attempts}
        self.clock = ServiceClock()
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
            client.meta.events.register("after-call.*", self._on_answer)
            self._clients[service] = client
        return self._clients[service]

    def _on_answer(self, http_response: Any = None, **_: Any) -> None:
        headers = getattr(http_response, "headers", None) or {}
        self.clock.observe(headers.get("Date") or headers.get("date"))

    def service_time(self) -> datetime | None:
        return self.clock.now()

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
            if not isinstance(page.get("Reservations"), list):
                raise MalformedAnswer(
                    "DescribeInstances answered without a reservation list "
                    f"({_content_type(page)}): not the EC2 API, or a proxy's error page"
                )
            for reservation in page["Reservations"]:
                for raw in reservation.get("Instances", []):
                    found.append(parse_instance(raw))
        return found

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        """Heartbeat and GPU utilization for every id, 250 instances per GetMetricData call.

        A batch whose call fails (after botocore's retries) marks its instances unreadable,
        which the policy counts as active; so does a result missing from an answer, or one
        whose status is not Complete.
        """
        window = max(60, math.ceil((end - start).total_seconds() / 60) * 60)
        out: dict[str, Metrics] = {}
        per_call = QUERIES_PER_CALL // 2
        for batch in chunks(list(instance_ids), per_call):
            try:
                out.update(self._metrics_batch(batch, start, end, window))
            except Exception as exc:  # any failure of the batch: unreadable, never "idle"
                why = _error_text(exc)
                out.update({iid: Metrics(error=why) for iid in batch})
        return out

    def _metrics_batch(
        self, ids: Sequence[str], start: datetime, end: datetime, window: int
    ) -> dict[str, Metrics]:
        queries = []
        for n, iid in enumerate(ids):
            dims = [{"Name": DIMENSION, "Value": iid}]
            # Utilization: one Maximum over the window. Heartbeat: per minute, so the newest
            # datapoint's timestamp (the service's record, not the node's value) is the beat.
            for prefix, metric, period in (
                ("u", METRIC_GPU_UTIL, window),
                ("h", METRIC_HEARTBEAT, HEARTBEAT_PERIOD),
            ):
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
        stamps: dict[str, list[datetime]] = {}
        status: dict[str, str] = {}
        token: str | None = None
        cw = self.client("cloudwatch")
        for _page in range(1000):  # bounded: 1,000 pages is far beyond any real answer
            kwargs: dict[str, Any] = {
                "MetricDataQueries": queries,
                "StartTime": start,
                "EndTime": end,
                "ScanBy": "TimestampDescending",
            }
            if token:
                kwargs["NextToken"] = token
            response = cw.get_metric_data(**kwargs)
            results = response.get("MetricDataResults")
            if not isinstance(results, list):
                raise MalformedAnswer(
                    "GetMetricData answered without MetricDataResults "
                    f"({_content_type(response)}): not the CloudWatch API, or an error page"
                )
            for result in results:
                rid = str(result.get("Id", ""))
                values.setdefault(rid, []).extend(result.get("Values", []))
                stamps.setdefault(rid, []).extend(result.get("Timestamps", []))
                status[rid] = str(result.get("StatusCode", "Complete"))
            token = response.get("NextToken")
            if not token:
                break
        else:
            raise MalformedAnswer("GetMetricData kept answering NextToken for 1,000 pages")
        out: dict[str, Metrics] = {}
        for n, iid in enumerate(ids):
            problems = [
                f"{what} {status.get(rid, 'missing from the answer')}"
                for what, rid in (("GPU utilization", f"u{n}"), ("heartbeat", f"h{n}"))
                if status.get(rid) != "Complete"
            ]
            if problems:
                out[iid] = Metrics(error="CloudWatch: " + ", ".join(problems))
                continue
            util = values.get(f"u{n}", [])
            beats = [_aware(t) for t in stamps.get(f"h{n}", [])]
            out[iid] = Metrics(
                max_gpu_util=max(util) if util else None,
                # The datapoint covers [t, t + period): its end is the latest the beat can be.
                last_heartbeat=max(beats) + timedelta(seconds=HEARTBEAT_PERIOD) if beats else None,
            )
        return out

    # ------------------------------------------------------------------ stop

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        """Stop in batches; a batch refused for an id is bisected to isolate that id."""
        return stop_bisected(
            instance_ids,
            STOP_BATCH,
            lambda ids: self.client("ec2").stop_instances(InstanceIds=list(ids)),
            _stopped,
            bisect=lambda exc: _error_code(exc).startswith(_ID_ERRORS),
            why=_error_text,
        )


def _stopped(ids: Sequence[str], response: Any) -> StopResult:
    """What StopInstances' answer says of each id: stopping, or left out."""
    done = {s["InstanceId"] for s in response.get("StoppingInstances", [])}
    return StopResult(
        stopped=[i for i in ids if i in done],
        failed={i: "not in the StopInstances response" for i in ids if i not in done},
    )


def _content_type(response: dict[str, Any]) -> str:
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return f"content-type {headers.get('content-type', 'unknown')!r}"


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def parse_instance(raw: dict[str, Any]) -> Instance:
    """One EC2 instance; a part that cannot be read makes it a kept, reported ``problem``."""
    tags: dict[str, Any] = {}
    for t in raw.get("Tags") or []:
        if isinstance(t, dict) and isinstance(t.get("Key"), str):
            tags[t["Key"]] = t.get("Value")
    problem = None
    launched: datetime | None = None
    try:
        launched = _aware(raw["LaunchTime"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f"LaunchTime unreadable ({type(exc).__name__})"
    state = raw.get("State") or {}
    name = str(state.get("Name", "unknown") if isinstance(state, dict) else "unknown")
    return Instance(
        instance_id=str(raw.get("InstanceId", "?")),
        state=name,
        instance_type=str(raw.get("InstanceType", "")),
        launched_at=launched,
        tags=tags,
        spot=raw.get("InstanceLifecycle") == "spot",
        problem=problem,
        stop_record=stop_record(raw.get("StateReason")) if name == "stopped" else None,
    )


# StateReason codes of a stop (EC2 API Reference, StateReason, read 2026-12-05:
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html):
# Server.SpotInstanceShutdown "the instance was stopped because the number of Spot requests
# with a maximum price equal to or higher than the Spot price exceeded available capacity
# or because of an increase in the Spot price"; Client.UserInitiatedShutdown "shut down
# using the Amazon EC2 API" (a person, fab stop, or this function's StopInstances);
# Client.InstanceInitiatedShutdown "shut down from the operating system of the instance"
# (the watchdog's poweroff, or a person's). The stack's spot nodes come from a persistent
# request with interruption behavior stop, and "Only Amazon EC2 can restart an interrupted
# stopped Spot Instance ... Amazon EC2 restarts the stopped instance when capacity is
# available" (EC2 User Guide, interruption-behavior.html, read 2026-12-05): the function
# never starts one, it reports it. AwsCloud has no ``start``.
SPOT_RECLAIM = "Server.SpotInstanceShutdown"


def stop_record(reason: Any) -> StopRecord:
    """The cloud's record of why a stopped instance stopped, from its StateReason."""
    code = reason.get("Code") if isinstance(reason, dict) else None
    if not isinstance(code, str) or not code:
        return StopRecord(None, "no StateReason", error="StateReason missing or unreadable")
    if code == SPOT_RECLAIM:
        return StopRecord(True, f"StateReason {code}: EC2 restarts it", cloud_restarts=True)
    return StopRecord(False, f"StateReason {code}")
