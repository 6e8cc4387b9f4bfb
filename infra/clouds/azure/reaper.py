"""Azure side of the reaper, with the official SDKs (imported lazily).

Contract with the stack (infra/clouds/azure/program.py declares the Function App with these):

  GPUFLEET_AZURE_SUBSCRIPTION_ID  the subscription that holds the stack's resource group
  GPUFLEET_AZURE_RESOURCE_GROUP   the stack's resource group: the only one the reaper lists
  GPUFLEET_AZURE_CLIENT_ID        optional: the client id of a user-assigned identity (unset:
                                  the Function App's system-assigned identity)
  GPUFLEET_AZURE_ACCESS_TOKEN     optional, never set on the function: an ARM bearer token
                                  for scripts/teardown.py on a laptop
  GPUFLEET_AZURE_POLL_S           optional: whole seconds between a deallocation's status
                                  reads when Azure's answer names no Retry-After (10)
  plus the common GPUFLEET_PROVIDER=azure, GPUFLEET_STACK, GPUFLEET_REGION (the location,
  for the report), GPUFLEET_APPLY (infra/reaper/handler.py).

The function's identity needs exactly these actions on the resource group (a custom role,
not Virtual Machine Contributor): ``Microsoft.Compute/virtualMachines/read``,
``Microsoft.Compute/virtualMachines/instanceView/read``,
``Microsoft.Compute/virtualMachines/deallocate/action``, ``Microsoft.Insights/metrics/read``
(custom metrics are read through the same metrics API) and
``Microsoft.Compute/locations/operations/read`` (the deallocation's status). See
:data:`ROLE_ACTIONS`.

What the calls are:

* scan: Virtual Machines - List in the resource group with ``$expand=instanceView`` (power
  state and the last operation's time in the same page), ``nextLink`` paging, bounded;
  the gpufleet tags are matched here (ARM's list takes no tag filter). A VM the page
  returned without an instance view gets one Instance View call.
* metrics: Metrics - List (``Microsoft.Insights/metrics``, namespace ``gpufleet``) on each
  VM's resource id through ``azure-monitor-query``'s MetricsQueryClient: Heartbeat and
  GPUUtilization, Maximum and Count per minute. The heartbeat's time is the bucket's
  timestamp as Azure Monitor stores it; the node's value is never read. Azure Monitor only
  accepts custom metrics stamped between 20 minutes in the past and 5 minutes in the future,
  which bounds how far a node's clock can move its beats.
* stop: Virtual Machines - Deallocate, a long-running operation whose
  ``Azure-AsyncOperation`` is polled a bounded number of times. Deallocation, never a power
  off: a VM that is only "Stopped" (``PowerState/stopped``, e.g. shut down from inside the
  OS) keeps its host and is still billed for compute; only ``PowerState/deallocated``
  stops the compute charge. A VM found stopped but allocated is reported and kept: its
  local NVMe may hold scratch the watchdog did not save, and deallocation erases it.

Last start: ARM has no "launch time". The TTL and the boot grace count from the newest of
the VM's ``timeCreated`` and the time of its ``ProvisioningState/succeeded`` status, which
every completed operation (a start, but also an update) moves forward: at or after the
real last start, so the TTL can only come late, never early.

Credentials: :class:`ManagedIdentityCredential` below, a small standard-library token
credential for the Functions host's managed identity endpoint (``IDENTITY_ENDPOINT`` /
``IDENTITY_HEADER``, the App Service protocol, api-version 2019-08-01). It stands in for
azure-identity's class of the same name, which would bring msal and the compiled
``cryptography`` into the function package for one GET request.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpufleet_node.fleet_names import METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE
from gpufleet_node.idle_rules import UTC
from infra.reaper import tags as T
from infra.reaper.core import (
    MAX_ATTEMPTS_ENV,
    ConfigError,
    Instance,
    Invocation,
    Metrics,
    ServiceClock,
    StartResult,
    StopResult,
    int_env,
)

# The function's settings beyond the common ones (handler.py): the stack declares them.
REQUIRED_ENV = ("GPUFLEET_AZURE_SUBSCRIPTION_ID", "GPUFLEET_AZURE_RESOURCE_GROUP")
# azure-core's ARM polling waits this long between status reads unless the answer's
# Retry-After says otherwise (it reads "Retry-After: 0" as unset)
POLL_ENV, DEFAULT_POLL_S = "GPUFLEET_AZURE_POLL_S", 10
OPTIONAL_ENV = ("GPUFLEET_AZURE_CLIENT_ID", "GPUFLEET_AZURE_ACCESS_TOKEN", POLL_ENV)
DEFAULT_MAX_ATTEMPTS = 5  # GPUFLEET_MAX_ATTEMPTS, optional like every cloud's
# The custom role's actions, scoped to the stack's resource group.
ROLE_ACTIONS = (
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/instanceView/read",
    "Microsoft.Compute/virtualMachines/deallocate/action",
    # spot recovery (infra/reaper/recovery.py): start an evicted spot VM again
    "Microsoft.Compute/virtualMachines/start/action",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Insights/metrics/read",
)
# Spot recovery. An eviction with policy Deallocate leaves the VM deallocated, and neither
# the VM nor its instance view says who deallocated it (azure-mgmt-compute's
# VirtualMachineInstanceView has power and provisioning statuses only): the record is the
# guards' tag gpufleet:stopped-by, written by the node's watchdog before its own stop
# (watchdog@<time>) and when it sees the eviction notice in Scheduled Events
# (spot-notice@<time>). Only a spot-notice record starts a VM; none at all (a person in the
# portal, or an eviction the node missed) keeps it, reported. The function writes no record
# of its own (its role holds no write): its stop leaves none, which keeps the VM too.
# A start refused for capacity is an allocation failure: "When you try to start a stopped
# Azure VM ... the common error you encounter is an allocation failure"
# (MicrosoftDocs/SupportArticles-docs, support/azure/virtual-machines/windows/
# restart-resize-error-troubleshooting.md, read 2026-12-05); codes AllocationFailed,
# ZonalAllocationFailed, OverconstrainedAllocationRequest (MicrosoftDocs/azure-docs,
# articles/cloud-services/cloud-services-troubleshoot-overconstrained-allocation-request.md)
# and SkuNotAvailable: the next run tries again.
NO_CAPACITY = (
    "AllocationFailed",
    "OverconstrainedAllocationRequest",
    "SkuNotAvailable",
)

ARM_ENDPOINT = "https://management.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"
METRIC_NAMESPACE = NAMESPACE  # custom metrics namespace the watchdog publishes under
MAX_PAGES = 200  # VM list pages (ARM's page size is its own); more is an error
MAX_INSTANCE_VIEWS = 500  # one-by-one instance view calls per scan, for VMs listed without
DEALLOCATE_POLLS = 12  # status polls per deallocation; still running after that: accepted
MAX_DELAY_S = 15.0  # cap on any Retry-After the service sends (retries and LRO polls)

POWER_STATES = {
    "running": "running",
    "starting": "pending",
    "stopping": "stopping",
    "stopped": "stopped-allocated",  # still billed: see the module docstring
    "deallocating": "stopping",
    "deallocated": "stopped",
}


class MalformedAnswer(RuntimeError):
    """An ARM answer that is not the documented shape (a proxy's HTML page, ...)."""


class StillDeallocating(Exception):
    """The deallocation was accepted and is still running after the bounded polls."""


# ---------------------------------------------------------------------------- credential


class ManagedIdentityCredential:
    """A TokenCredential for the Functions host's managed identity (stdlib only).

    The host exposes ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER``; a GET with the resource
    and ``X-IDENTITY-HEADER`` returns ``access_token`` and ``expires_on`` (Unix seconds).
    Tokens are cached until five minutes before they expire. One request per token, with a
    timeout; a failure raises (the run fails, nothing is stopped).
    """

    def __init__(
        self,
        *,
        client_id: str | None = None,
        endpoint: str | None = None,
        secret: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.client_id = client_id
        self.endpoint = endpoint or os.environ.get("IDENTITY_ENDPOINT", "")
        self.secret = secret or os.environ.get("IDENTITY_HEADER", "")
        if not (self.endpoint and self.secret):
            raise ValueError(
                "no Azure credential: IDENTITY_ENDPOINT and IDENTITY_HEADER are not set "
                "(the Function App's managed identity); on a laptop set "
                "GPUFLEET_AZURE_ACCESS_TOKEN (az account get-access-token)"
            )
        self.timeout_s = timeout_s
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        if len(scopes) != 1:
            raise ValueError(f"one scope per token, got {scopes!r}")
        resource = scopes[0].removesuffix("/.default") + "/"
        with self._lock:
            cached = self._cache.get(resource)
            if cached is not None and cached.expires_on - 300 > time.time():
                return cached
            query = {"resource": resource, "api-version": "2019-08-01"}
            if self.client_id:
                query["client_id"] = self.client_id
            request = urllib.request.Request(
                f"{self.endpoint}?{urllib.parse.urlencode(query)}",
                headers={"X-IDENTITY-HEADER": self.secret, "Metadata": "true"},
            )
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read().decode("utf-8"))
            token = body.get("access_token") if isinstance(body, dict) else None
            if not isinstance(token, str) or not token:
                raise MalformedAnswer("the managed identity endpoint returned no access_token")
            token_obj = AccessToken(token, int(body.get("expires_on") or time.time() + 300))
            self._cache[resource] = token_obj
            return token_obj


class StaticTokenCredential:
    """A bearer token given from outside (``GPUFLEET_AZURE_ACCESS_TOKEN``, e.g. from
    ``az account get-access-token``): scripts/teardown.py on a laptop."""

    def __init__(self, token: str, *, lifetime_s: int = 3000) -> None:
        self.token = token
        self.expires_on = int(time.time()) + lifetime_s

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(self.token, self.expires_on)


# ---------------------------------------------------------------------------- helpers


def _text(exc: BaseException) -> str:
    code = getattr(getattr(exc, "error", None), "code", None)
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc)
    head = " ".join(str(p) for p in (status, code) if p) or type(exc).__name__
    return f"{head}: {message}".replace("\n", " ")[:300]


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        text = value.replace("Z", "+00:00")
        # ARM writes seven fractional digits; fromisoformat takes at most six.
        if "." in text:
            head, _, rest = text.partition(".")
            digits = "".join(c for c in rest if c.isdigit())
            zone = rest[len(digits) :]
            text = f"{head}.{digits[:6]}{zone}"
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return None


def _field(obj: Any, *names: str) -> Any:
    """The first present of ``names`` on an SDK model or a plain mapping."""
    for name in names:
        if isinstance(obj, dict):
            if name in obj:
                return obj[name]
            continue
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def parse_vm(vm: Any, instance_view: Any = None) -> Instance:
    """One VM (an SDK model or the REST mapping); an unreadable part makes it a kept,
    reported ``problem`` of this VM only."""
    name = str(_field(vm, "name") or "?")
    raw_tags = _field(vm, "tags")
    tags: dict[str, Any] = dict(raw_tags) if isinstance(raw_tags, dict) else {}
    hardware = _field(vm, "hardware_profile", "hardwareProfile")
    size = str(_field(hardware, "vm_size", "vmSize") or "") if hardware is not None else ""
    view = instance_view if instance_view is not None else _field(vm, "instance_view")
    problem = None
    state = "unknown"
    launched: datetime | None = None
    try:
        created = _parse_time(_field(vm, "time_created", "timeCreated"))
        statuses = list(_field(view, "statuses") or []) if view is not None else []
        power = [str(_field(s, "code") or "") for s in statuses]
        power = [c.split("/", 1)[1] for c in power if c.startswith("PowerState/")]
        if view is None:
            problem = "no instance view"
        elif len(power) != 1:
            problem = f"power state unreadable ({len(power)} PowerState statuses)"
        else:
            state = POWER_STATES.get(power[0].lower(), power[0].lower())
        provisioned = [
            _parse_time(_field(s, "time"))
            for s in statuses
            if str(_field(s, "code") or "") == "ProvisioningState/succeeded"
        ]
        stamps = [t for t in (created, *provisioned) if t is not None]
        launched = max(stamps) if stamps else None
        if launched is None and problem is None:
            problem = "neither timeCreated nor a ProvisioningState/succeeded time"
    except (TypeError, ValueError) as exc:
        problem = f"instance view unreadable: {exc}"
    # The SDK hands an enum (VirtualMachinePriorityTypes, a str Enum): str() of it is
    # "VirtualMachinePriorityTypes.SPOT", so read its value.
    raw_priority = _field(vm, "priority")
    priority = str(getattr(raw_priority, "value", raw_priority) or "Regular")
    return Instance(
        instance_id=name,
        state=state,
        instance_type=size,
        launched_at=launched,
        tags=tags,
        spot=priority.lower() in ("spot", "low"),
        # A reservation is a billing discount bought apart from the VM: nothing on the VM
        # says whether one covers it, so no Azure VM counts as prepaid here.
        prepaid=False,
        problem=problem,
    )


# ---------------------------------------------------------------------------- the cloud


class AzureCloud:
    provider = "azure"

    def __init__(
        self,
        region: str,
        *,
        subscription_id: str,
        resource_group: str,
        credential: Any = None,
        client_id: str | None = None,
        endpoint: str | None = None,  # ARM base URL (tests: the local fake)
        connection_verify: str | bool = True,  # a CA bundle path (tests: the fake's CA)
        max_attempts: int = 5,  # attempts per call, the first included (1 = no retry)
        backoff_s: float = 0.8,
        max_delay_s: float = MAX_DELAY_S,
        polling_interval_s: float = 10.0,
        deallocate_polls: int = DEALLOCATE_POLLS,
        timeout_s: float = 20.0,
    ) -> None:
        if not subscription_id or not resource_group:
            raise ValueError(
                "Azure needs a subscription and a resource group: set "
                "GPUFLEET_AZURE_SUBSCRIPTION_ID and GPUFLEET_AZURE_RESOURCE_GROUP"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.region = region
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self._credential = credential
        self.client_id = client_id
        self.endpoint = (endpoint or ARM_ENDPOINT).rstrip("/")
        self.connection_verify = connection_verify
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_delay_s = max_delay_s
        self.polling_interval_s = polling_interval_s
        self.deallocate_polls = deallocate_polls
        self.timeout_s = timeout_s
        self.clock = ServiceClock()
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._compute: Any = None
        self._metrics: Any = None

    # ------------------------------------------------------------------ clients

    def credential(self) -> Any:
        if self._credential is None:
            self._credential = ManagedIdentityCredential(client_id=self.client_id)
        return self._credential

    def _on_response(self, response: Any) -> None:
        http = response.http_response
        self.clock.observe(http.headers.get("Date"))
        key = _call_kind(urllib.parse.urlparse(http.request.url).path)
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1

    def _client_kwargs(self) -> dict[str, Any]:
        return {
            "retry_policy": _bounded_retry(self.max_attempts, self.backoff_s, self.max_delay_s),
            "raw_response_hook": self._on_response,
            "connection_verify": self.connection_verify,
            "connection_timeout": self.timeout_s / 2,
            "read_timeout": self.timeout_s,
            "polling_interval": self.polling_interval_s,
            "logging_enable": False,
        }

    def compute(self) -> Any:
        if self._compute is None:
            from azure.mgmt.compute import ComputeManagementClient

            self._compute = ComputeManagementClient(
                self.credential(),
                self.subscription_id,
                base_url=self.endpoint,
                credential_scopes=[ARM_SCOPE],
                **self._client_kwargs(),
            )
        return self._compute

    def metrics_client(self) -> Any:
        if self._metrics is None:
            from azure.monitor.query import MetricsQueryClient

            self._metrics = MetricsQueryClient(
                self.credential(),
                endpoint=self.endpoint,
                audience=ARM_ENDPOINT,  # the token's audience stays ARM's with a test endpoint
                **self._client_kwargs(),
            )
        return self._metrics

    def service_time(self) -> datetime | None:
        return self.clock.now()

    def vm_id(self, name: str) -> str:
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{name}"
        )

    # ------------------------------------------------------------------ scan

    def scan(self, stack: str | None) -> list[Instance]:
        vms = self.compute().virtual_machines
        pager = vms.list(self.resource_group, expand="instanceView").by_page()
        found: list[Instance] = []
        views_fetched = 0
        for page_no, page in enumerate(pager, start=1):
            if page_no > MAX_PAGES:
                raise MalformedAnswer(f"more than {MAX_PAGES} pages of VMs: paging loops?")
            for vm in page:
                if _field(vm, "name") is None or _field(vm, "id") is None:
                    raise MalformedAnswer("a VM in the list has no name or id: not the ARM API")
                raw_tags = _field(vm, "tags")
                tags = dict(raw_tags) if isinstance(raw_tags, dict) else {}
                if tags.get(T.MANAGED_BY) != T.MANAGED_BY_VALUE:
                    continue
                if stack is not None and tags.get(T.STACK) != stack:
                    continue
                view = _field(vm, "instance_view")
                if view is None and views_fetched < MAX_INSTANCE_VIEWS:
                    views_fetched += 1
                    try:
                        view = vms.instance_view(self.resource_group, vm.name)
                    except Exception as exc:  # this VM only: kept and reported
                        found.append(_with_problem(parse_vm(vm), f"instance view: {_text(exc)}"))
                        continue
                found.append(parse_vm(vm, view))
        return found

    # ------------------------------------------------------------------ metrics

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        out: dict[str, Metrics] = {}
        for name in instance_ids:
            try:
                out[name] = self._read_metrics(name, start, end)
            except Exception as exc:  # unreadable, which counts as active
                out[name] = Metrics(error=_text(exc))
        return out

    def _read_metrics(self, name: str, start: datetime, end: datetime) -> Metrics:
        from azure.monitor.query import MetricAggregationType

        wanted = (METRIC_HEARTBEAT, METRIC_GPU_UTIL)
        result = self.metrics_client().query_resource(
            self.vm_id(name),
            metric_names=list(wanted),
            timespan=(start.astimezone(UTC), end.astimezone(UTC)),
            granularity=timedelta(minutes=1),
            aggregations=[MetricAggregationType.MAXIMUM, MetricAggregationType.COUNT],
            metric_namespace=METRIC_NAMESPACE,
        )
        metrics = getattr(result, "metrics", None)
        if not isinstance(metrics, list):
            raise MalformedAnswer("the metrics answer has no value list")
        by_name = {m.name: m for m in metrics if getattr(m, "name", None)}
        missing = [w for w in wanted if w not in by_name]
        if missing:
            raise MalformedAnswer(f"the metrics answer left out {', '.join(missing)}")
        beats = _points(by_name[METRIC_HEARTBEAT], start, end)
        util = _points(by_name[METRIC_GPU_UTIL], start, end)
        return Metrics(
            # The bucket time Azure Monitor stores, never the node's own value.
            last_heartbeat=max((t for t, _ in beats), default=None),
            max_gpu_util=max((v for _, v in util if v is not None), default=None),
        )

    # ------------------------------------------------------------------ stop

    def send_then_poll(
        self, begin: Callable[..., Any], names: Sequence[str]
    ) -> tuple[list[str], dict[str, Exception], dict[str, Exception]]:
        """Send ``begin`` (``virtual_machines.begin_start`` or ``begin_deallocate``) for
        every VM first, then poll each operation (bounded): (the VMs accepted, one still
        running after the polls included; those refused; those whose operation failed)."""
        accepted: list[str] = []
        refused: dict[str, Exception] = {}
        failed: dict[str, Exception] = {}
        started: list[tuple[str, Any]] = []
        for name in names:
            try:
                poller = begin(
                    self.resource_group,
                    name,
                    polling=_bounded_arm_polling(
                        self.polling_interval_s, self.deallocate_polls, self.max_delay_s
                    ),
                )
            except Exception as exc:
                refused[name] = exc
                continue
            started.append((name, poller))
        for name, poller in started:
            try:
                poller.result()
            except StillDeallocating:
                accepted.append(name)
            except Exception as exc:
                failed[name] = exc
            else:
                accepted.append(name)
        return accepted, refused, failed

    def start(self, instance_ids: Sequence[str]) -> StartResult:
        """Start each VM: every request is sent first, then each operation is polled
        (bounded); accepted and still starting after the polls counts as started. An
        allocation failure is "waiting for capacity" (:data:`NO_CAPACITY`)."""
        result = StartResult()
        begin = self.compute().virtual_machines.begin_start
        result.started, refused, failed = self.send_then_poll(begin, instance_ids)
        for what, errors in (("", refused), ("start failed: ", failed)):
            for name, exc in errors.items():
                text = _text(exc)
                code = next((c for c in NO_CAPACITY if c in text), None)
                if code:
                    result.capacity[name] = code
                else:
                    result.failed[name] = f"{what}{text}"
        return result

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        """Deallocate each VM: every request is sent first, then each operation is polled
        (bounded). Accepted and still running after the polls counts as stopped, as EC2's
        "stopping" does; a refusal or a failed operation fails that VM only."""
        result = StopResult()
        begin = self.compute().virtual_machines.begin_deallocate
        result.stopped, refused, failed = self.send_then_poll(begin, instance_ids)
        for name, exc in refused.items():
            result.failed[name] = _text(exc)
        for name, exc in failed.items():
            result.failed[name] = f"deallocation failed: {_text(exc)}"
        return result


def _call_kind(path: str) -> str:
    """The API call a request path belongs to, for the call counts."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if "/operations/" in path or "/operationResults/" in path:
        return "operation"
    return last if last in ("virtualMachines", "instanceView", "metrics", "deallocate") else path


def _with_problem(inst: Instance, problem: str) -> Instance:
    from dataclasses import replace

    return replace(inst, problem=problem)


def _points(metric: Any, start: datetime, end: datetime) -> list[tuple[datetime, float | None]]:
    """(bucket time, maximum) of every minute with at least one sample inside the window."""
    out: list[tuple[datetime, float | None]] = []
    series = getattr(metric, "timeseries", None)
    if not isinstance(series, list):
        raise MalformedAnswer(f"{metric.name}: no timeseries list")
    for element in series:
        for point in getattr(element, "data", None) or []:
            when = _parse_time(getattr(point, "timestamp", None))
            count = getattr(point, "count", None)
            top = getattr(point, "maximum", None)
            if when is None:
                raise MalformedAnswer(f"{metric.name}: a datapoint without a timestamp")
            if not count and top is None:
                continue  # an empty minute: Azure lists every bucket of the window
            if top is not None and top != top:  # NaN
                raise MalformedAnswer(f"{metric.name}: a NaN datapoint")
            if start <= when <= end:
                out.append((when, None if top is None else float(top)))
    return out


def _bounded_retry(attempts: int, backoff_s: float, max_delay_s: float) -> Any:
    """azure-core's retry policy with ``attempts`` tries in all and the server's Retry-After
    capped: a throttled answer asking for an hour must not hold the function that long."""
    from azure.core.pipeline.policies import RetryPolicy

    class BoundedRetry(RetryPolicy):
        def get_retry_after(self, response: Any) -> float | None:
            value = super().get_retry_after(response)
            return None if value is None else min(float(value), max_delay_s)

    return BoundedRetry(
        retry_total=attempts - 1,
        retry_connect=attempts - 1,
        retry_read=attempts - 1,
        retry_status=attempts - 1,
        retry_backoff_factor=backoff_s,
        retry_backoff_max=max_delay_s,
        timeout=max_delay_s * attempts + 60,
    )


def _bounded_arm_polling(interval_s: float, polls: int, max_delay_s: float) -> Any:
    from azure.mgmt.core.polling.arm_polling import ARMPolling

    class BoundedARMPolling(ARMPolling):
        """ARM's polling, with at most ``polls`` status reads and a capped Retry-After."""

        def __init__(self) -> None:
            super().__init__(interval_s)
            self._polls = 0

        def update_status(self) -> None:
            if self._polls >= polls:
                raise StillDeallocating(f"still running after {polls} status reads")
            self._polls += 1
            super().update_status()

        def _extract_delay(self) -> float:
            return float(min(super()._extract_delay(), max_delay_s))

    return BoundedARMPolling()


# What the function package carries (infra/reaper/handler.py CloudEntry): the Azure Functions
# Python runtime ships no Azure SDK; package.py lays the package out and vendors a
# pure-Python closure (its AZURE_SDKS).
VENDOR_SDK = True
SDKS: tuple[str, ...] = ()
WHEELS = False


def from_env(region: str, env: Mapping[str, str], given: Invocation) -> AzureCloud:
    """The cloud the function runs: its settings from ``env`` (see the module docstring)
    and the attempts per call; it signs in as the managed identity unless ``env`` holds a
    token (the invocation's credentials and account are not read). Anything missing or
    wrong is a ConfigError."""
    max_attempts = int_env(env, MAX_ATTEMPTS_ENV, DEFAULT_MAX_ATTEMPTS)
    poll_s = int_env(env, POLL_ENV, DEFAULT_POLL_S)
    missing = [name for name in REQUIRED_ENV if not str(env.get(name, "")).strip()]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} not set: the Function App's settings")
    client_id = (env.get("GPUFLEET_AZURE_CLIENT_ID") or "").strip() or None
    try:
        token = (env.get("GPUFLEET_AZURE_ACCESS_TOKEN") or "").strip()
        credential = (
            StaticTokenCredential(token)
            if token
            else ManagedIdentityCredential(
                client_id=client_id,
                endpoint=env.get("IDENTITY_ENDPOINT"),
                secret=env.get("IDENTITY_HEADER"),
            )
        )
        return AzureCloud(
            region,
            subscription_id=env["GPUFLEET_AZURE_SUBSCRIPTION_ID"].strip(),
            resource_group=env["GPUFLEET_AZURE_RESOURCE_GROUP"].strip(),
            client_id=client_id,
            credential=credential,
            endpoint=given.endpoint,
            max_attempts=max_attempts,
            polling_interval_s=float(poll_s),
        )
    except ValueError as exc:  # the credential's or the client's own refusal
        raise ConfigError(str(exc)) from None
