"""A fault-injecting HTTP proxy on 127.0.0.1, between a bucket client and a local fake store.

The faults are the ones S3, OSS, COS and Blob produce every day, switched on per request
(matched by method, path and query) for a bounded number of requests, then passed through:

* ``status``: answer an error instead of forwarding (503 SlowDown as S3 writes it, Blob's
  503 ServerBusy with x-ms-error-code, 403 AccessDenied, ...), with Retry-After if asked;
* ``cut``: forward, then send the answer's headers and only ``after`` bytes of its body,
  and close the connection (a connection reset mid-body);
* ``trickle``: forward, then send the body one byte every ``interval`` seconds;
* ``flip_response``: flip one byte of the answer's body at ``after`` (damage where TLS ends
  at a gateway: nothing below HTTP notices);
* ``flip_request``: flip one byte of the request's body at ``after`` before forwarding (the
  store must refuse it: Content-MD5 / x-amz-content-sha256);
* ``replace``: run ``action`` (e.g. overwrite the object) before forwarding the request.

Everything is bounded: each fault applies ``times`` times; a trickle stops after
``max_seconds`` or when the proxy stops; upstream requests have a timeout. ``seen`` records
every request (method, path, query, the fault applied, the status sent). Binds 127.0.0.1
only, never another address.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
S3_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
)
BLOB_ERROR = (
    '<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error>"
)
# Each store's own words for its errors: S3's SlowDown "Please reduce your request rate."
# (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html), Blob's ServerBusy
# "The server is currently unable to receive requests. Please retry your request." and
# OperationTimedOut (learn.microsoft.com/en-us/rest/api/storageservices/
# common-rest-api-error-codes); read 2026-12-05.
MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "ServerBusy": "The server is currently unable to receive requests. Please retry your request.",
    "OperationTimedOut": "The operation could not be completed within the permitted time.",
    "AccessDenied": "Access Denied",
    "AuthorizationPermissionMismatch": "This request is not authorized to perform this "
    "operation using this permission.",
    "InternalError": "We encountered an internal error. Please try again.",
}


@dataclass
class Fault:
    """One fault: which requests it matches and what it does to them.

    ``path`` and ``query`` are regular expressions searched in the request's path (without
    the query) and its raw query; "" matches anything. ``method`` "" matches any method."""

    kind: str  # status | cut | trickle | flip_response | flip_request | replace
    method: str = ""
    path: str = ""
    query: str = ""
    times: int = 1
    status: int = 503
    code: str = "SlowDown"
    flavour: str = "s3"  # s3 | blob: how an error answer is written
    retry_after: str = ""
    after: int = 0  # bytes sent before a cut; the offset of a flipped byte
    interval: float = 1.0  # seconds between a trickle's bytes
    max_seconds: float = 120.0  # a trickle gives up after this long
    action: Callable[[], None] | None = None  # replace: what to do before forwarding
    used: int = 0

    def matches(self, method: str, path: str, query: str) -> bool:
        return (
            self.used < self.times
            and (not self.method or self.method == method)
            and (not self.path or re.search(self.path, path) is not None)
            and (not self.query or re.search(self.query, query) is not None)
        )


@dataclass
class Seen:
    method: str
    path: str
    query: str
    fault: str  # the fault kind applied, "" when passed through
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # the request's, lower-cased


@dataclass
class FaultProxy:
    """Forwards to ``upstream`` (http://127.0.0.1:PORT) and injects the faults in
    ``faults`` (the first one that matches a request applies). Use :func:`fault_proxy`."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    timeout: float = 60.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    # A front's own rule (tests/support/strict_s3.py): given (method, headers, body) of a
    # request as it arrives here, an error answer (status, code, message) or None to forward.
    refuse: Callable[[str, dict[str, str], bytes], tuple[int, str, str] | None] | None = None

    def add(self, *faults: Fault) -> FaultProxy:
        with self.lock:
            self.faults.extend(faults)
        return self

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()
            self.seen.clear()

    def take(self, method: str, path: str, query: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, path, query):
                    fault.used += 1
                    return fault
        return None

    def record(self, seen: Seen) -> None:
        with self.lock:
            self.seen.append(seen)

    def requests(self, method: str = "", fault: str | None = None) -> list[Seen]:
        with self.lock:
            return [
                s
                for s in self.seen
                if (not method or s.method == method) and (fault is None or s.fault == fault)
            ]

    def handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _serve(self) -> None:
                split = urllib.parse.urlsplit(self.path)
                method = self.command
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                fault = proxy.take(method, split.path, split.query)
                kind = fault.kind if fault else ""
                if fault and kind == "status":
                    proxy.record(Seen(method, split.path, split.query, kind, fault.status, headers))
                    self._error(fault)  # recorded first: the client may look as soon as it reads
                    return
                if fault and kind == "flip_request" and body:
                    body = _flip(body, fault.after)
                if fault and kind == "replace" and fault.action is not None:
                    fault.action()
                refused = proxy.refuse(method, headers, body) if proxy.refuse else None
                if refused is not None:
                    status, code, message = refused
                    proxy.record(Seen(method, split.path, split.query, "refused", status, headers))
                    self._error(Fault("status", status=status, code=code), message)
                    return
                try:
                    status, reason, answer_headers, data = proxy.forward(
                        method, body, headers, self.path
                    )
                except OSError:
                    self.send_error(502)
                    proxy.record(
                        Seen(method, split.path, split.query, "upstream-down", 502, headers)
                    )
                    return
                proxy.record(Seen(method, split.path, split.query, kind, status, headers))
                if fault and kind == "flip_response" and data:
                    data = _flip(data, fault.after)
                self.send_response(status, reason)
                for name, value in answer_headers:
                    lower = name.lower()
                    if lower not in HOP_BY_HOP and (lower != "content-length" or method == "HEAD"):
                        self.send_header(name, value)  # a HEAD keeps the object's length
                if method != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                if fault and kind in ("cut", "trickle"):
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if method == "HEAD":
                    return
                if fault and kind == "cut":
                    self.wfile.write(data[: fault.after])
                    self.wfile.flush()
                    with suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault and kind == "trickle":
                    self._trickle(data, fault)
                    return
                self.wfile.write(data)

            def _error(self, fault: Fault, message: str = "") -> None:
                template = BLOB_ERROR if fault.flavour == "blob" else S3_ERROR
                message = message or MESSAGES.get(fault.code, fault.code)
                data = template.format(code=fault.code, message=message).encode()
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                if fault.flavour == "blob":
                    self.send_header("x-ms-error-code", fault.code)
                if fault.retry_after:
                    self.send_header("Retry-After", fault.retry_after)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _trickle(self, data: bytes, fault: Fault) -> None:
                ends = time.monotonic() + fault.max_seconds
                for i in range(len(data)):
                    if proxy.stopping.is_set() or time.monotonic() > ends:
                        break
                    try:
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                    except OSError:
                        return  # the client gave up: what the test wants
                    proxy.stopping.wait(fault.interval)
                with suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        return Handler

    def forward(
        self, method: str, body: bytes, headers: dict[str, str], target: str
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        parts = urllib.parse.urlsplit(self.upstream)
        conn = http.client.HTTPConnection(
            parts.hostname or LOOPBACK, parts.port, timeout=self.timeout
        )
        try:
            sent = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
            sent["content-length"] = str(len(body))
            conn.request(method, target, body=body or None, headers=sent)
            resp = conn.getresponse()
            data = resp.read() if method != "HEAD" else b""
            return resp.status, resp.reason, list(resp.getheaders()), data
        finally:
            conn.close()


def _flip(data: bytes, offset: int) -> bytes:
    offset = min(max(0, offset), len(data) - 1)
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


@contextmanager
def fault_proxy(
    upstream: str,
    timeout: float = 60.0,
    refuse: Callable[[str, dict[str, str], bytes], tuple[int, str, str] | None] | None = None,
) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of ``upstream`` on 127.0.0.1, its ``url`` set; stopped
    (trickles ended, threads joined) on exit."""
    host = urllib.parse.urlsplit(upstream).hostname
    if host != LOOPBACK:
        raise ValueError(f"the fault proxy only forwards to {LOOPBACK}, not {host!r}")
    proxy = FaultProxy(upstream, timeout=timeout, refuse=refuse)
    server = ThreadingHTTPServer((LOOPBACK, 0), proxy.handler())
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="fault-proxy", daemon=True
    )
    thread.start()
    proxy.url = f"http://{LOOPBACK}:{server.server_port}"
    try:
        yield proxy
    finally:
        proxy.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
