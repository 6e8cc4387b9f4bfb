"""Small local HTTP fakes of the clouds' availability APIs, on 127.0.0.1 only.

Each answers one action with a body the test gives, shaped like the cloud's own recorded
example (cited where the test builds it), and keeps what it was asked."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

# (method, path, query, headers, body) -> (status, JSON answer)
Answer = Callable[[str, str, dict[str, str], dict[str, str], bytes], tuple[int, Any]]


@contextmanager
def serving(
    answer: Answer, tls: tuple[Path, Path] | None = None
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(the fake's host:port, the requests it got), while the block runs; with ``tls``
    (certificate, key), over HTTPS."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append(
                {
                    "method": self.command,
                    "path": url.path,
                    "query": query,
                    "headers": headers,
                    "body": body,
                }
            )
            status, doc = answer(self.command, url.path, query, headers, body)
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        host, port = str(server.server_address[0]), int(server.server_address[1])
        yield f"{host}:{port}", seen
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def ec2_query(answer: Callable[[dict[str, list[str]]], str]) -> Iterator[tuple[str, list[Any]]]:
    """An EC2 Query API endpoint on 127.0.0.1: each POSTed form (parsed) -> the XML ``answer``
    gives; yields (its URL, the forms it got)."""
    sent: list[dict[str, list[str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            sent.append(form)
            data = answer(form).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", sent
    finally:
        server.shutdown()
        server.server_close()
