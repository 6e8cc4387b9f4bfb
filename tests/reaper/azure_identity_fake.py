"""A local stand-in for the Functions host's managed identity endpoint (IDENTITY_ENDPOINT).

The App Service protocol: GET ``?resource=<audience>&api-version=2019-08-01`` with the
``X-IDENTITY-HEADER`` secret; the answer is JSON with ``access_token`` and ``expires_on``.
The host serves it on a local plain-HTTP port, as this fake does on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.reaper.azure_fake import TOKEN

SECRET = "fake-identity-header"


@contextmanager
def identity_endpoint(
    body: dict[str, Any] | None = None,
) -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """(endpoint URL, the header secret, the (resource, api-version) of every request)."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            q = {k: v[-1] for k, v in parse_qs(urlparse(self.path).query).items()}
            seen.append((q.get("resource", ""), q.get("api-version", "")))
            if self.headers.get("X-IDENTITY-HEADER") != SECRET:
                status, answer = 401, {"error": "missing X-IDENTITY-HEADER"}
            else:
                status = 200
                answer = body or {
                    "access_token": TOKEN,
                    "expires_on": str(int(time.time()) + 3600),
                    "resource": q.get("resource"),
                    "token_type": "Bearer",
                }
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/msi/token", SECRET, seen
    finally:
        server.shutdown()
        server.server_close()
