"""An HTTP proxy between boto3 and moto that fails a share of requests, reproducibly.

Failures come in three kinds, as a real endpoint produces them: throttling answered before
the request is served, a 5xx answered before, and a 5xx answered *after* moto served the
request (the call took effect but the client never heard: retries must be idempotent).
``always_fail_stop`` makes every StopInstances request naming one of those ids fail, to
model a stop that keeps failing.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_EC2_THROTTLE = (
    b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
    b"<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message>"
    b"</Error></Errors><RequestID>fault-proxy</RequestID></Response>"
)
_EC2_5XX = _EC2_THROTTLE.replace(b"RequestLimitExceeded", b"InternalError").replace(
    b"Request limit exceeded.", b"An internal error has occurred."
)


class FaultProxy:
    def __init__(
        self, upstream: str, *, rate: float, seed: int = 1, latency_s: float = 0.0
    ) -> None:
        self.upstream = urlparse(upstream)
        self.rate = rate
        self.latency_s = latency_s  # added to every request: a network that is not loopback
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.always_fail_stop: set[str] = set()
        # Operation name -> failures left (None: every request), answered as throttling.
        self.fail_ops: dict[str, int | None] = {}
        self.requests = 0
        self.faults = 0
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _verdict(self, body: bytes, where: str = "") -> str | None:
        with self.lock:
            self.requests += 1
            for op, left in self.fail_ops.items():
                named = f"Action={op}".encode() in body or where.endswith(op)
                if named and (left is None or left > 0):
                    if left is not None:
                        self.fail_ops[op] = left - 1
                    self.faults += 1
                    return "throttle"
            if b"Action=StopInstances" in body and any(
                i.encode() in body for i in self.always_fail_stop
            ):
                self.faults += 1
                return "5xx-before"
            roll = self.rng.random()
            if roll >= self.rate:
                return None
            self.faults += 1
            return self.rng.choice(["throttle", "5xx-before", "5xx-after"])

    def handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def _reply(self, status: int, body: bytes, ctype: str = "text/xml") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname or "127.0.0.1", proxy.upstream.port, timeout=120
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                return resp.status, resp.getheaders(), data

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                target = self.headers.get("X-Amz-Target", "")
                verdict = proxy._verdict(body, target or self.path)
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                is_ec2 = b"Action=" in body  # EC2 speaks the query protocol; CloudWatch CBOR
                if verdict == "throttle" and is_ec2:
                    return self._reply(503, _EC2_THROTTLE)
                if verdict in ("throttle", "5xx-before"):
                    return self._reply(503 if verdict == "throttle" else 500, _EC2_5XX)
                status, headers, data = self._forward(body)
                if verdict == "5xx-after":
                    return self._reply(502, _EC2_5XX)
                self.send_response(status)
                for key, value in headers:
                    # Date and Server: this proxy's own (send_response adds them), not doubled.
                    skip = ("content-length", "transfer-encoding", "connection", "date", "server")
                    if key.lower() not in skip:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        return Handler

    @contextmanager
    def running(self) -> Iterator[FaultProxy]:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
