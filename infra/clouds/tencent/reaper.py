"""Tencent Cloud side of the reaper, with the official SDK (imported lazily).

Contract with the SCF function the stack declares (``tencent-infra`` reads it from here):

- Handler ``handler.main_handler`` (entry.py ``HANDLER``; SCF's Python convention:
  ``main_handler(event, context)``), runtime :data:`SCF_RUNTIME`, a timer trigger every 5
  minutes, and the environment
  variables in :data:`FUNCTION_ENV` (the same four as every cloud's function; see
  infra/reaper/handler.py ``run``), plus :data:`BUCKET_ENV`, the stack's bucket where the
  nodes beat (the stack sets it; without it no heartbeat is read). GPUFLEET_MAX_ATTEMPTS
  is optional (default 5); :data:`COS_ENDPOINT_ENV` is for tests and private endpoints.
- Credentials come from the function's execution role: SCF puts the role's temporary keys
  in the environment (:data:`CREDENTIAL_ENV`, first spelling that is set wins). Only a real
  SCF invocation proves the names; the tests set them as documented.
- The role needs exactly :data:`CAM_ACTIONS` (cvm:StopInstances limited to the stack's tagged
  instances by a ``qcs:resource_tag`` condition where the account supports it).

What it calls (CVM API 2017-03-12 and Cloud Monitor 2018-07-24, TC3-HMAC-SHA256 signed by
the SDK; COS through its S3-compatible API, SigV4):

- ``DescribeInstances`` with ``Filters`` ``tag:managed-by=gpufleet`` (and
  ``tag:gpufleet:stack``), paged with ``Offset``/``Limit`` (100, the documented ceiling;
  https://cloud.tencent.com/document/api/213/15728), at most :data:`MAX_PAGES` pages.
- ``StopInstances`` with ``StoppedMode=STOP_CHARGING`` and ``StopType=SOFT_FIRST``, at most
  100 ids a call (https://cloud.tencent.com/document/api/213/15743). The call is all or
  nothing, so a refusal naming an id (not found, wrong state, STOP_CHARGING not supported
  for that instance) is bisected down to that id and the others are stopped. A refused
  STOP_CHARGING is reported, never retried as KEEP_CHARGING (that stop would save nothing).
- ``GetMonitorData`` (https://cloud.tencent.com/document/api/248/31014, CAM action
  monitor:GetMonitorData), namespace ``QCE/CVM``, metric ``Gpuutil``: the GPU utilization
  the CVM monitoring agent (BaseAgent, with its GPU component) reports per instance
  (Tencent doc 248/6843 "CVM monitoring metrics"), with the service's timestamps; up to 50
  instances and 7,200 datapoints a call (the SDK's GetMonitorDataRequest docstrings,
  tencentcloud-sdk-python-monitor 3.1.189). Instances whose window would pass 7,200 points
  go in smaller batches.
- COS ``HEAD`` of each node's heartbeat object, ``<bucket>/gpufleet/heartbeat/<instance
  id>`` (fleet_names.HEARTBEAT_OBJECT_PREFIX; CAM action cos:HeadObject), through COS's
  S3-compatible API with the node's own SigV4 client (gpufleet_node/bucket.py, which the
  function zip packs). The heartbeat's time is the object's
  ``Last-Modified``, which COS stamps on its own clock: the same evidence as a datapoint's
  timestamp elsewhere. Custom metrics are no option: ``PutMonitorData`` (API 2018-07-24) is
  disused ("its related console features and backend services were deactivated", planned
  disuse 2023-06-26: https://www.tencentcloud.com/document/api/248/35974); the successor is
  the managed Prometheus service, not a TC3-signed API.

So the rule is the other clouds' (gpufleet_node/idle_rules.py ``decide_cloud``): a node is
stopped for silence only when its heartbeat object was written this boot and then went
stale while another node's heartbeat still arrived, with no GPU use in the window. No
Gpuutil datapoint in the window (the agent is not installed or not reporting) is unknown,
never idle: the instance is kept and the run fails, as for a Gpuutil answer that is
missing, partial or failed. Without a bucket setting (:data:`BUCKET_ENV`) no heartbeat is
read: only the TTL and the lease cap apply.

Launch time: CVM reports ``CreatedTime`` only, not the last start. The TTL counts from
creation only for an instance whose ``LatestOperation`` shows nothing since (none, or
``RunInstances``); any other latest operation (a StartInstances, or something after one)
makes the launch time unknown: that instance is kept and reported, the TTL is the
watchdog's (node uptime).

"Now" is the service's ``Date`` header, read from every answer (core.ServiceClock).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlparse

from gpufleet_node.fleet_names import HEARTBEAT_OBJECT_PREFIX
from gpufleet_node.idle_rules import UTC, parse_utc
from infra.reaper import tags as T
from infra.reaper.core import (
    MAX_ATTEMPTS_ENV,
    Instance,
    Invocation,
    Metrics,
    ServiceClock,
    StopResult,
    chunks,
    int_env,
    stop_bisected,
)

# The SCF function's settings (tencent-infra declares exactly these) and its runtime.
FUNCTION_ENV = (
    "GPUFLEET_PROVIDER",
    "GPUFLEET_STACK",
    "GPUFLEET_REGION",
    "GPUFLEET_APPLY",
    "GPUFLEET_RESTART_RECLAIMED",
    "GPUFLEET_NODES",
)
SCF_RUNTIME = "Python3.10"
# The execution role's temporary keys as SCF sets them; then the SDK's own variable names.
CREDENTIAL_ENV = (
    ("TENCENTCLOUD_SECRETID", "TENCENTCLOUD_SECRETKEY", "TENCENTCLOUD_SESSIONTOKEN"),
    ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN"),
)
CAM_ACTIONS = (
    "cvm:DescribeInstances",
    "cvm:StopInstances",
    "monitor:GetMonitorData",
    "cos:HeadObject",  # the heartbeat objects in the stack's bucket
)
# The stack's COS bucket, where the nodes write their heartbeat objects (the stack sets it);
# an override of COS's endpoint for tests and private endpoints (the bucket then goes in
# the path).
BUCKET_ENV = "GPUFLEET_TENCENT_BUCKET"
COS_ENDPOINT_ENV = "GPUFLEET_TENCENT_COS_ENDPOINT"

PAGE = 100  # DescribeInstances Limit ceiling
MAX_PAGES = 200  # 20,000 instances: more is an error, never a silent cut
STOP_BATCH = 100  # StopInstances InstanceIds ceiling
METRIC_BATCH = 50  # GetMonitorData Instances ceiling
METRIC_POINTS = 7200  # GetMonitorData datapoints ceiling, per request
METRIC_NAMESPACE = "QCE/CVM"
# Spelt as Tencent's CVM metrics page spells it ("Gpuutil | GPU utilization | Returned by
# the nvmlDeviceGetUtilizationRates API ... | % | InstanceId", 60 s period with avg):
# tencentyun/intlcloud-documents, yehe_doc/管理工具/云监控/云产品指标/云服务器监控指标_intl_en.md
# at d209dde3, read 2026-12-01; only reported once the CVM agent (248/6211) is installed.
# The pages spell other names in two cases (CPUUsage, CpuUsage); DescribeBaseMetrics on an
# account gives the canonical one.
METRIC_GPU = "Gpuutil"
METRIC_PERIOD = 60
STOPPED_MODE = "STOP_CHARGING"
REQUEST_TIMEOUT_S = 20

_STATES = {
    "PENDING": "pending",
    "STARTING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "STOPPED": "stopped",
    "REBOOTING": "rebooting",
    "SHUTDOWN": "shutdown",
    "TERMINATING": "terminating",
    "LAUNCH_FAILED": "launch-failed",
}
_NOTHING_SINCE_CREATION = {"", "RunInstances"}
_PREPAID = {"PREPAID", "CDHPAID", "PREPAID_BY_DEDICATED_HOST"}
_RETRYABLE = (
    "RequestLimitExceeded",
    "InternalError",
    "ServerNetworkError",
    "ClientNetworkError",
    "ResourceUnavailable",
)
# Refusals that name an instance: bisect so that the other ids of the batch still stop.
_ID_ERRORS = (
    "InvalidInstanceId",
    "InvalidInstance",
    "UnsupportedOperation",
    "OperationDenied",
    "InvalidParameterValue",
    "ResourceNotFound",
)


def _code(exc: BaseException) -> str:
    getter = getattr(exc, "get_code", None)
    code = getter() if callable(getter) else getattr(exc, "code", None)
    return str(code or type(exc).__name__)


def _text(exc: BaseException) -> str:
    getter = getattr(exc, "get_message", None)
    message = getter() if callable(getter) else str(exc)
    return f"{_code(exc)}: {str(message)[:240]}"


def _retryable(exc: BaseException) -> bool:
    return _code(exc).startswith(_RETRYABLE)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def credentials_from(env: Mapping[str, str]) -> tuple[str, str, str]:
    """(secret id, secret key, token) from the first complete spelling in ``env``."""
    for sid, skey, token in CREDENTIAL_ENV:
        if env.get(sid) and env.get(skey):
            return env[sid], env[skey], env.get(token, "")
    return "", "", ""


DEFAULT_MAX_ATTEMPTS = 5


# What the function package carries (infra/reaper/handler.py CloudEntry): SCF's runtime is
# not relied on (no source says which SDK version its Python runtime bundles, if any), so
# the per-product SDKs travel with the code, from this venv's pure-Python closure.
VENDOR_SDK = True
SDKS: tuple[str, ...] = (
    "tencentcloud-sdk-python-common",
    "tencentcloud-sdk-python-cvm",
    "tencentcloud-sdk-python-monitor",
)
WHEELS = False


def from_env(region: str, env: Mapping[str, str], given: Invocation) -> TencentCloud:
    """The cloud the function runs: the role's keys from the invocation or else ``env``
    (:data:`CREDENTIAL_ENV`), and the attempts per call; the account is not read."""
    secret_id, secret_key, token = credentials_from(given.credentials or env)
    return TencentCloud(
        region,
        endpoint=given.endpoint,
        secret_id=secret_id or None,
        secret_key=secret_key or None,
        token=token or None,
        max_attempts=int_env(env, MAX_ATTEMPTS_ENV, DEFAULT_MAX_ATTEMPTS),
        bucket=env.get(BUCKET_ENV, "").strip(),
        cos_endpoint=env.get(COS_ENDPOINT_ENV, "").strip(),
    )


class TencentCloud:
    provider = "tencent"

    def __init__(
        self,
        region: str,
        *,
        endpoint: str | None = None,
        secret_id: str | None = None,
        secret_key: str | None = None,
        token: str | None = None,
        max_attempts: int = 5,  # attempts per call, the first included (1 = no retry)
        backoff_s: float = 0.5,
        timeout_s: int = REQUEST_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        bucket: str = "",
        cos_endpoint: str = "",
    ) -> None:
        env_id, env_key, env_token = credentials_from(os.environ)
        self.bucket = bucket
        self.cos_endpoint = cos_endpoint
        self._store: Any = None
        self.region = region
        self.endpoint = endpoint
        self.secret_id = secret_id or env_id
        self.secret_key = secret_key or env_key
        self.token = token if token is not None else env_token
        if not (self.secret_id and self.secret_key):
            raise ValueError(
                "Tencent Cloud credentials missing: set TENCENTCLOUD_SECRET_ID and "
                "TENCENTCLOUD_SECRET_KEY (or run in SCF with an execution role)"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._sleep = sleep
        self.clock = ServiceClock()
        self._clients: dict[str, Any] = {}
        self.calls: dict[str, int] = {}

    # ------------------------------------------------------------------ clients

    def _profile(self, service: str) -> Any:
        from tencentcloud.common.profile.client_profile import ClientProfile
        from tencentcloud.common.profile.http_profile import HttpProfile

        http = HttpProfile(reqTimeout=self.timeout_s)
        if self.endpoint:
            parsed = urlparse(self.endpoint if "://" in self.endpoint else f"//{self.endpoint}")
            http.endpoint = parsed.netloc or parsed.path
            http.protocol = http.scheme = parsed.scheme or "https"
        else:
            http.endpoint = f"{service}.tencentcloudapi.com"
        # TC3-HMAC-SHA256 is the SDK's default; said here so no profile change weakens it.
        return ClientProfile(signMethod="TC3-HMAC-SHA256", httpProfile=http)

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            from tencentcloud.common.credential import Credential

            cred = Credential(self.secret_id, self.secret_key, self.token or None)
            if service == "cvm":
                from tencentcloud.cvm.v20170312.cvm_client import CvmClient as Client
            else:
                from tencentcloud.monitor.v20180724.monitor_client import (
                    MonitorClient as Client,
                )
            client = Client(cred, self.region, self._profile(service))
            self._observe_dates(client)
            self._clients[service] = client
        return self._clients[service]

    def _observe_dates(self, client: Any) -> None:
        """Read the Date header of every answer: the SDK's calls return only the body."""
        request = client.request
        send = request.send_request
        clock = self.clock

        def send_and_observe(req: Any) -> Any:
            resp = send(req)
            headers = getattr(resp, "headers", None) or {}
            clock.observe(headers.get("Date"))
            return resp

        request.send_request = send_and_observe

    def service_time(self) -> datetime | None:
        return self.clock.now()

    def _call(self, service: str, action: str, params: dict[str, Any]) -> Any:
        """One API action through the SDK's typed client, with bounded retries and jittered
        backoff on throttling (RequestLimitExceeded), 5xx and network errors."""
        if service == "cvm":
            from tencentcloud.cvm.v20170312 import models
        else:
            from tencentcloud.monitor.v20180724 import models
        for attempt in range(1, self.max_attempts + 1):
            self.calls[action] = self.calls.get(action, 0) + 1
            request = getattr(models, f"{action}Request")()
            request.from_json_string(json.dumps(params))
            try:
                return getattr(self._client(service), action)(request)
            except Exception as exc:
                if attempt == self.max_attempts or not _retryable(exc):
                    raise
                delay = min(8.0, self.backoff_s * 2 ** (attempt - 1))
                self._sleep(delay * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ scan

    def scan(self, stack: str | None) -> list[Instance]:
        filters = [{"Name": f"tag:{T.MANAGED_BY}", "Values": [T.MANAGED_BY_VALUE]}]
        if stack:
            filters.append({"Name": f"tag:{T.STACK}", "Values": [stack]})
        found: list[Instance] = []
        for page in range(MAX_PAGES):
            params = {"Filters": filters, "Offset": page * PAGE, "Limit": PAGE}
            response = self._call("cvm", "DescribeInstances", params)
            listed = response.InstanceSet
            total = response.TotalCount
            if not isinstance(listed, list) or not isinstance(total, int) or not response.RequestId:
                raise ValueError(
                    "DescribeInstances answered without InstanceSet, TotalCount and RequestId: "
                    "not the CVM API, or a proxy's page"
                )
            found.extend(parse_instance(json.loads(raw.to_json_string())) for raw in listed)
            if not listed or (page + 1) * PAGE >= total:
                return found
        raise ValueError(f"DescribeInstances: more than {MAX_PAGES * PAGE} instances")

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        out: dict[str, Metrics] = {}
        points = max(1, int((end - start).total_seconds() // METRIC_PERIOD) + 2)
        batch_size = max(1, min(METRIC_BATCH, METRIC_POINTS // points))
        for batch in chunks(list(instance_ids), batch_size):
            try:
                util = self._gpu_util(batch, start, end)
            except Exception as exc:  # unreadable, which counts as active
                out.update({iid: Metrics(error=_text(exc)) for iid in batch})
                continue
            for iid in batch:
                if iid not in util:
                    out[iid] = Metrics(error="missing from the GetMonitorData answer")
                elif util[iid] is None:
                    out[iid] = Metrics(
                        error=f"no {METRIC_GPU} datapoint in the window: the monitoring "
                        "agent (BaseAgent) is not reporting GPU metrics (`fab setup` "
                        "installs it); counts as active"
                    )
                else:
                    out[iid] = self._with_heartbeat(iid, util[iid], start, end)
        return out

    def _with_heartbeat(
        self, iid: str, util: float | None, start: datetime, end: datetime
    ) -> Metrics:
        """The GPU maximum and the newest heartbeat object's Last-Modified in the window."""
        if not self.bucket:
            return Metrics(last_heartbeat=None, max_gpu_util=util)
        try:
            headers = self._bucket().head(f"{HEARTBEAT_OBJECT_PREFIX}{iid}")
        except Exception as exc:  # unreadable, which counts as active
            return Metrics(error=f"heartbeat object unreadable: {str(exc)[:240]}")
        if headers is None:
            return Metrics(last_heartbeat=None, max_gpu_util=util)
        try:
            beat = parsedate_to_datetime(headers.get("last-modified", ""))
        except (TypeError, ValueError, IndexError):
            beat = None
        if beat is None or beat.tzinfo is None:
            return Metrics(error="heartbeat object without a readable Last-Modified")
        beat = beat.astimezone(UTC)
        return Metrics(last_heartbeat=beat if start <= beat <= end else None, max_gpu_util=util)

    def _bucket(self) -> Any:
        """The stack's bucket through COS's S3-compatible API (SigV4, the role's keys)."""
        if self._store is None:
            from gpufleet_node import bucket as bucket_store

            def keys() -> dict[str, str]:
                return {
                    "access_key_id": self.secret_id,
                    "secret": self.secret_key,
                    "token": self.token or "",
                }

            store = bucket_store.Store.for_node(
                endpoint=f"https://cos.{self.region}.myqcloud.com",
                region=self.region,
                bucket=self.bucket,
                credentials=keys,
                endpoint_url=self.cos_endpoint,
            )
            store.timeout = float(self.timeout_s)
            store.attempts = self.max_attempts
            store.retry_sleep = self._sleep
            self._store = store
        return self._store

    def _gpu_util(
        self, ids: Sequence[str], start: datetime, end: datetime
    ) -> dict[str, float | None]:
        params = {
            "Namespace": METRIC_NAMESPACE,
            "MetricName": METRIC_GPU,
            "Period": METRIC_PERIOD,
            "StartTime": _iso(start),
            "EndTime": _iso(end),
            "Instances": [{"Dimensions": [{"Name": "InstanceId", "Value": i}]} for i in ids],
        }
        response = self._call("monitor", "GetMonitorData", params)
        points = response.DataPoints
        if not isinstance(points, list) or not response.RequestId:
            raise ValueError("GetMonitorData answered without DataPoints and RequestId")
        out: dict[str, float | None] = {}
        lo, hi = start - timedelta(seconds=METRIC_PERIOD), end
        for point in points:
            dims = {d.Name: d.Value for d in (point.Dimensions or [])}
            iid = dims.get("InstanceId")
            stamps, values = point.Timestamps, point.Values
            if not isinstance(stamps, list) or not isinstance(values, list):
                raise ValueError(f"GetMonitorData: data point for {iid!r} without arrays")
            if len(stamps) != len(values):
                raise ValueError(
                    f"GetMonitorData: {iid!r} has {len(stamps)} times, {len(values)} values"
                )
            best: float | None = None
            for stamp, value in zip(stamps, values, strict=True):
                when = datetime.fromtimestamp(float(stamp), UTC)
                number = float(value)
                if number != number:  # NaN
                    raise ValueError(f"GetMonitorData: NaN for {iid!r}")
                if lo <= when <= hi:
                    best = number if best is None else max(best, number)
            if iid in ids:
                out[str(iid)] = best
        return out

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
        params = {"InstanceIds": list(ids), "StopType": "SOFT_FIRST", "StoppedMode": STOPPED_MODE}
        return self._call("cvm", "StopInstances", params)


def _stopped(ids: Sequence[str], response: Any) -> StopResult:
    if not response.RequestId:
        return StopResult(failed={iid: "StopInstances answered without RequestId" for iid in ids})
    # The call is accepted as a whole (the stop itself runs asynchronously).
    return StopResult(stopped=list(ids))


def _launched(raw: Mapping[str, Any]) -> tuple[datetime | None, str | None]:
    created = raw.get("CreatedTime")
    latest = raw.get("LatestOperation") or ""
    if not isinstance(latest, str):
        return None, f"LatestOperation {latest!r:.40} unreadable"
    if latest not in _NOTHING_SINCE_CREATION:
        return None, (
            f"launch time unknown (CVM reports creation only; latest operation {latest}): "
            "the reaper applies no TTL, the node watchdog's uptime TTL does"
        )
    if not created:
        return None, "no CreatedTime"
    try:
        return parse_utc(str(created)), None
    except ValueError as exc:
        return None, f"CreatedTime unreadable: {exc}"


def parse_instance(raw: Mapping[str, Any]) -> Instance:
    """One CVM instance; a part that cannot be read makes it a kept, reported ``problem``."""
    tags: dict[str, Any] = {}
    problem = None
    listed = raw.get("Tags")
    if listed is not None and not isinstance(listed, list):
        problem = "Tags is not a list"
    for t in listed if isinstance(listed, list) else []:
        if isinstance(t, dict) and isinstance(t.get("Key"), str):
            tags[t["Key"]] = t.get("Value")
    launched, why = _launched(raw)
    problem = problem or why
    state = str(raw.get("InstanceState") or "unknown")
    charge = str(raw.get("InstanceChargeType") or "")
    return Instance(
        instance_id=str(raw.get("InstanceId", "?")),
        state=_STATES.get(state, state.lower()),
        instance_type=str(raw.get("InstanceType", "")),
        launched_at=launched,
        tags=tags,
        spot=charge == "SPOTPAID",
        prepaid=charge in _PREPAID,
        problem=problem,
    )
