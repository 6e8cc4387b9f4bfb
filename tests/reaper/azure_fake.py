"""A protocol fake of the few Azure Resource Manager calls the reaper makes, over HTTPS.

No Azure emulator covers Compute and Monitor, so this speaks just enough of the wire format
for the official SDKs (azure-mgmt-compute, azure-monitor-query): Virtual Machines - List
(``$expand=instanceView``, ``nextLink`` paging), Instance View, Deallocate as a long-running
operation (202 with ``Azure-AsyncOperation``, ``Location`` and ``Retry-After``, then
``InProgress`` / ``Succeeded`` / ``Failed`` on the operation URL), and Metrics - List
(every minute bucket of the window, ``maximum`` and ``count``).

TLS: azure-core refuses to send a bearer token over plain HTTP, so the fake serves HTTPS
with a certificate for 127.0.0.1 that :func:`make_tls` generates per test run; the clients
trust it through ``connection_verify=<the CA file>``, the transport's documented setting.
Production code takes the same path as against Azure.

Faults, per call kind (``list``, ``view``, ``metrics``, ``deallocate``, ``operation``):
HTTP 500, 429 with ``Retry-After``, a 200 HTML page, a hang past the client's read timeout,
and a metrics answer that leaves a metric out. Each fault has a count (``None``: always).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

UTC = dt.UTC
SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"
RESOURCE_GROUP = "rg-gpufleet-azt"
LOCATION = "eastus"
TOKEN = "fake-arm-token"
VM_PAGE = 50  # ARM chooses its page size; the fake's is small so scans page


def make_tls(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 and its key: (cert = CA file, key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "fake-arm.pem", directory / "fake-arm.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def arm_time(t: dt.datetime) -> str:
    """ARM's timestamp format: seven fractional digits and a Z."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


@dataclass
class FakeVM:
    name: str
    tags: dict[str, Any]
    provisioned_at: dt.datetime  # the ProvisioningState/succeeded time (last operation)
    power: str = "running"
    size: str = "Standard_NC24ads_A100_v4"
    priority: str = "Regular"
    refuses_deallocate: bool = False  # 409 on the deallocate POST
    operation_fails: bool = False  # the async operation ends Failed
    without_view: bool = False  # the list leaves its instance view out
    polls_to_finish: int = 2  # InProgress answers before Succeeded
    # a start's operation ends Failed with ZonalAllocationFailed, an allocation failure
    # (MicrosoftDocs/SupportArticles-docs, support/azure/virtual-machines/windows/
    # restart-resize-error-troubleshooting.md: starting a stopped VM, "the common error you
    # encounter is an allocation failure"); the VM stays deallocated
    allocation_fails: bool = False


@dataclass
class FakeAzure:
    vms: list[FakeVM] = field(default_factory=list)
    # (metric, vm name) -> [(time as the service stores it, value)]
    datapoints: dict[tuple[str, str], list[tuple[dt.datetime, float]]] = field(default_factory=dict)
    errors: dict[str, int | None] = field(default_factory=dict)  # kind -> 500 n times
    throttle: dict[str, int | None] = field(default_factory=dict)  # kind -> 429 n times
    html: dict[str, int | None] = field(default_factory=dict)  # kind -> 200 HTML n times
    hang: dict[str, int | None] = field(default_factory=dict)  # kind -> sleep past timeout
    omit_metric: dict[str, str] = field(default_factory=dict)  # vm name -> metric left out
    retry_after: str = "1"
    hang_s: float = 3.0
    clock_offset: dt.timedelta = dt.timedelta(0)  # the service's clock vs this host's
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC) + self.clock_offset

    def by_name(self) -> dict[str, FakeVM]:
        return {v.name: v for v in self.vms}

    # ------------------------------------------------------------------ answers

    def _vm_json(self, vm: FakeVM, with_view: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": vm.name,
            "id": f"{self.rg_path()}/providers/Microsoft.Compute/virtualMachines/{vm.name}",
            "type": "Microsoft.Compute/virtualMachines",
            "location": LOCATION,
            "tags": vm.tags,
            "properties": {
                "vmId": str(uuid.uuid5(uuid.NAMESPACE_DNS, vm.name)),
                "hardwareProfile": {"vmSize": vm.size},
                "priority": vm.priority,
                "provisioningState": "Succeeded",
                "timeCreated": arm_time(vm.provisioned_at - dt.timedelta(days=3)),
            },
        }
        if vm.priority == "Spot":
            out["properties"]["evictionPolicy"] = "Deallocate"
        if with_view and not vm.without_view:
            out["properties"]["instanceView"] = self._view_json(vm)
        return out

    def _view_json(self, vm: FakeVM) -> dict[str, Any]:
        return {
            "computerName": vm.name,
            "statuses": [
                {
                    "code": "ProvisioningState/succeeded",
                    "level": "Info",
                    "displayStatus": "Provisioning succeeded",
                    "time": arm_time(vm.provisioned_at),
                },
                {
                    "code": f"PowerState/{vm.power}",
                    "level": "Info",
                    "displayStatus": f"VM {vm.power}",
                },
            ],
        }

    def rg_path(self) -> str:
        return f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}"

    def list_vms(self, q: dict[str, str], base: str) -> tuple[int, Any, dict[str, str]]:
        skip = int(q.get("$skiptoken") or 0)
        page = self.vms[skip : skip + VM_PAGE]
        body: dict[str, Any] = {
            "value": [self._vm_json(v, q.get("$expand") == "instanceView") for v in page]
        }
        if skip + VM_PAGE < len(self.vms):
            body["nextLink"] = (
                f"{base}{self.rg_path()}/providers/Microsoft.Compute/virtualMachines"
                f"?api-version={q.get('api-version')}&$expand={q.get('$expand', '')}"
                f"&$skiptoken={skip + VM_PAGE}"
            )
        return 200, body, {}

    def instance_view(self, name: str) -> tuple[int, Any, dict[str, str]]:
        vm = self.by_name().get(name)
        if vm is None:
            return 404, _error("ResourceNotFound", name), {}
        return 200, self._view_json(vm), {}

    def deallocate(self, name: str, base: str) -> tuple[int, Any, dict[str, str]]:
        vm = self.by_name().get(name)
        if vm is None:
            return 404, _error("ResourceNotFound", name), {}
        if vm.refuses_deallocate:
            return 409, _error("OperationNotAllowed", "locked by the fake"), {}
        return self._operation_started(vm, "deallocating", "deallocated", base)

    def start(self, name: str, base: str) -> tuple[int, Any, dict[str, str]]:
        """Virtual Machines - Start (POST .../virtualMachines/{vmName}/start), a long-running
        operation answered like Deallocate (azure-mgmt-compute begin_start)."""
        vm = self.by_name().get(name)
        if vm is None:
            return 404, _error("ResourceNotFound", name), {}
        return self._operation_started(vm, "starting", "running", base)

    def _operation_started(
        self, vm: FakeVM, during: str, ends: str, base: str
    ) -> tuple[int, Any, dict[str, str]]:
        op = uuid.uuid4().hex
        self.operations[op] = {"vm": vm.name, "polls": 0, "ends": ends}
        vm.power = during
        sub = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/{LOCATION}"
        return (
            202,
            None,
            {
                "Azure-AsyncOperation": f"{base}{sub}/operations/{op}?api-version=2026-04-01",
                "Location": f"{base}{sub}/operationResults/{op}?api-version=2026-04-01",
                "Retry-After": "0",
            },
        )

    def operation(self, op: str, result: bool) -> tuple[int, Any, dict[str, str]]:
        state = self.operations.get(op)
        if state is None:
            return 404, _error("NotFound", op), {}
        vm = self.by_name()[state["vm"]]
        if result:
            return 200, None, {}
        state["polls"] += 1
        # the shape of azure-mgmt-compute's recorded operation answers
        # (tests/reaper/azure_recorded.py OPERATION_IN_PROGRESS / OPERATION_SUCCEEDED)
        began = {"startTime": state.setdefault("started", arm_time(dt.datetime.now(UTC)))}
        if state["polls"] <= vm.polls_to_finish:
            return 200, {**began, "status": "InProgress", "name": op}, {"Retry-After": "0"}
        ended = {**began, "endTime": arm_time(dt.datetime.now(UTC))}
        if state.get("ends") == "running" and vm.allocation_fails:
            vm.power = "deallocated"
            error = _error(
                "ZonalAllocationFailed",
                "Allocation failed. We do not have "
                "sufficient capacity for the requested VM size in this zone.",
            )
            return 200, {**ended, "status": "Failed", "name": op, **error}, {}
        if vm.operation_fails:
            vm.power = "running"
            failed = {**ended, "status": "Failed", "name": op, **_error("Conflict", "no")}
            return 200, failed, {}
        vm.power = state.get("ends", "deallocated")
        return 200, {**ended, "status": "Succeeded", "name": op}, {}

    def metrics(self, name: str, q: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        if q.get("metricnamespace") != "gpufleet":
            return 400, _error("BadRequest", f"namespace {q.get('metricnamespace')!r}"), {}
        start_s, _, end_s = q.get("timespan", "").partition("/")
        start, end = _iso(start_s), _iso(end_s)
        if q.get("interval") != "PT1M" or start is None or end is None:
            return 400, _error("BadRequest", "timespan/interval"), {}
        aggs = set(q.get("aggregation", "").lower().split(","))
        value = []
        for metric in q.get("metricnames", "").split(","):
            if self.omit_metric.get(name) == metric:
                continue
            buckets: dict[dt.datetime, list[float]] = {}
            for when, v in self.datapoints.get((metric, name), []):
                if start <= when < end:
                    minute = when.replace(second=0, microsecond=0)
                    buckets.setdefault(minute, []).append(v)
            data = []
            minute = start.replace(second=0, microsecond=0)
            while minute < end:
                point: dict[str, Any] = {"timeStamp": minute.strftime("%Y-%m-%dT%H:%M:%SZ")}
                if minute in buckets:
                    if "maximum" in aggs:
                        point["maximum"] = max(buckets[minute])
                    if "count" in aggs:
                        point["count"] = float(len(buckets[minute]))
                data.append(point)
                minute += dt.timedelta(minutes=1)
            value.append(
                {
                    "id": f"{self.rg_path()}/providers/Microsoft.Compute/virtualMachines/"
                    f"{name}/providers/Microsoft.Insights/metrics/{metric}",
                    "type": "Microsoft.Insights/metrics",
                    "name": {"value": metric, "localizedValue": metric},
                    "unit": "Percent" if metric != "Heartbeat" else "Count",
                    "timeseries": [{"metadatavalues": [], "data": data}],
                    "errorCode": "Success",
                }
            )
        return (
            200,
            {
                "cost": 0,
                "timespan": q.get("timespan"),
                "interval": "PT1M",
                "value": value,
                "namespace": "gpufleet",
                "resourceregion": LOCATION,
            },
            {},
        )

    # ------------------------------------------------------------------ routing

    def route(self, method: str, path: str, q: dict[str, str], base: str) -> tuple[str, Any]:
        """(kind, handler) for a request, or ("unknown", None)."""
        vms = f"{self.rg_path()}/providers/Microsoft.Compute/virtualMachines"
        ops = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/{LOCATION}"
        if method == "GET" and path == vms:
            return "list", lambda: self.list_vms(q, base)
        m = re.fullmatch(re.escape(vms) + r"/([^/]+)/instanceView", path)
        if method == "GET" and m:
            return "view", lambda: self.instance_view(m.group(1))
        m = re.fullmatch(re.escape(vms) + r"/([^/]+)/deallocate", path)
        if method == "POST" and m:
            return "deallocate", lambda: self.deallocate(m.group(1), base)
        m = re.fullmatch(re.escape(vms) + r"/([^/]+)/start", path)
        if method == "POST" and m:
            return "start", lambda: self.start(m.group(1), base)
        m = re.fullmatch(re.escape(ops) + r"/(operations|operationResults)/([^/]+)", path)
        if method == "GET" and m:
            return "operation", lambda: self.operation(m.group(2), m.group(1) != "operations")
        m = re.fullmatch(re.escape(vms) + r"/([^/]+)/providers/Microsoft\.Insights/metrics", path)
        if method == "GET" and m:
            return "metrics", lambda: self.metrics(m.group(1), q)
        return "unknown", None

    def _take(self, faults: dict[str, int | None], kind: str) -> bool:
        if kind not in faults:
            return False
        left = faults[kind]
        if left is None:
            return True
        if left <= 0:
            return False
        faults[kind] = left - 1
        return True

    @contextmanager
    def running(self, tls: tuple[Path, Path]) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def date_time_string(self, timestamp: float | None = None) -> str:
                return format_datetime(fake.now(), usegmt=True)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                url = urlparse(self.path)
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                base = f"https://127.0.0.1:{self.server.server_address[1]}"
                kind, handler = fake.route(method, url.path, q, base)
                with fake.lock:
                    fake.calls.append((kind, url.path, q))
                    hang = fake._take(fake.hang, kind)
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        answer: tuple[int, Any, dict[str, str]] = (
                            401,
                            _error("AuthenticationFailed", "no bearer token"),
                            {},
                        )
                    elif handler is None:
                        answer = (404, _error("InvalidResourceType", url.path), {})
                    elif fake._take(fake.errors, kind):
                        answer = (500, _error("InternalServerError", "fault injected"), {})
                    elif fake._take(fake.throttle, kind):
                        answer = (
                            429,
                            _error("TooManyRequests", "throttled"),
                            {"Retry-After": fake.retry_after},
                        )
                    elif fake._take(fake.html, kind):
                        answer = (200, "<html><body><h1>Welcome</h1></body></html>", {})
                    else:
                        answer = handler()
                if hang:
                    time.sleep(fake.hang_s)
                self._answer(*answer)

            def _answer(self, status: int, body: Any, headers: dict[str, str]) -> None:
                if isinstance(body, str):
                    data, kind = body.encode(), "text/html"
                elif body is None:
                    data, kind = b"", "application/json"
                else:
                    data, kind = json.dumps(body).encode(), "application/json; charset=utf-8"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("x-ms-request-id", uuid.uuid4().hex)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    return  # the client gave up on a hung answer

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"https://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _iso(text: str) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class FakeCredential:
    """A TokenCredential that hands out the fake's token and records the scopes asked."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken(TOKEN, int(time.time()) + 3600)
