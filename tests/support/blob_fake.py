"""A small Azure Blob Storage fake on 127.0.0.1 for the transfer layer's integrity tests:
what bucket.BlobStore calls, with the rules that matter for integrity, each from the Blob
REST reference (learn.microsoft.com/en-us/rest/api/storageservices/, read 2026-12-05):

* Put Blob / Put Block / Put Block List check Content-MD5 and answer 400 Md5Mismatch when
  the body does not match (put-blob, put-block); metadata is ``x-ms-meta-<name>`` on Put
  Blob and Put Block List, returned on Get Blob and Get Blob Properties;
* Put Blob stores the MD5 of the blob's content, returned as Content-MD5; a blob committed
  by Put Block List has none unless x-ms-blob-content-md5 was sent (put-block-list);
* each write gives the blob a new ETag, quoted in headers, unquoted in List Blobs'
  Properties/Etag (list-blobs);
* Get Blob with a Range answers 206 with Content-Range and the whole blob's MD5 in
  x-ms-blob-content-md5; If-Match that does not name the current ETag answers 412
  ConditionNotMet (get-blob, specifying-conditional-headers-for-blob-service-operations);
* errors carry their code in x-ms-error-code and an XML body.

tests/gpufleet_node/test_watchdog_azure.py keeps its own fake of the node's whole Azure
surface (IMDS, ARM, metrics and Blob); this one is only the Blob data path.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCOUNT, CONTAINER, TOKEN = "gpufleetacct", "gpufleet", "storage-token"
CREDS = {"storage": TOKEN}
_etags = itertools.count(0x8D000000000001)


@dataclass
class Blob:
    data: bytes
    meta: dict[str, str]
    md5: str  # base64, "" when none
    etag: str = field(default_factory=lambda: f"0x{next(_etags):X}")


@dataclass
class FakeBlob:
    blobs: dict[str, Blob] = field(default_factory=dict)
    blocks: dict[str, dict[str, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def replace(self, name: str, data: bytes) -> None:
        """Overwrite a blob as another writer would: new bytes, new ETag, no metadata."""
        with self.lock:
            self.blobs[name] = Blob(data, {}, _b64md5(data))

    def handle(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        q = dict(urllib.parse.parse_qsl(query))
        if headers.get("authorization") != f"Bearer {TOKEN}" or not headers.get("x-ms-version"):
            return _error(403, "AuthenticationFailed")
        root = f"/{ACCOUNT}/{CONTAINER}"
        if path == root:
            return self.list_blobs(q)
        if not path.startswith(root + "/"):
            return _error(404, "ContainerNotFound")
        name = urllib.parse.unquote(path[len(root) + 1 :])
        with self.lock:
            if method in ("GET", "HEAD"):
                return self.get(method, name, headers)
            if method == "PUT":
                return self.put(name, q, headers, body)
        return _error(405, "UnsupportedHttpVerb")

    def get(
        self, method: str, name: str, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        blob = self.blobs.get(name)
        if blob is None:
            return _error(404, "BlobNotFound")
        match = headers.get("if-match", "")
        if match and match != "*" and match.strip('"') != blob.etag:
            return _error(412, "ConditionNotMet")
        out = {"ETag": f'"{blob.etag}"', "x-ms-blob-type": "BlockBlob"}
        out.update({f"x-ms-meta-{k}": v for k, v in blob.meta.items()})
        wanted = re.match(
            r"bytes=(\d+)-(\d*)$", headers.get("range", "") or headers.get("x-ms-range", "")
        )
        if method == "HEAD" or not wanted:
            if blob.md5:
                out["Content-MD5"] = blob.md5
            out["Content-Length"] = str(len(blob.data))
            return 200, out, b"" if method == "HEAD" else blob.data
        start = int(wanted.group(1))
        end = min(len(blob.data) - 1, int(wanted.group(2) or len(blob.data) - 1))
        if start >= len(blob.data):
            return _error(416, "InvalidRange")
        if blob.md5:
            out["x-ms-blob-content-md5"] = blob.md5
        out["Content-Range"] = f"bytes {start}-{end}/{len(blob.data)}"
        return 206, out, blob.data[start : end + 1]

    def put(
        self, name: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        given = headers.get("content-md5")
        if given is not None and given != _b64md5(body):
            return _error(400, "Md5Mismatch")
        meta = {k[len("x-ms-meta-") :]: v for k, v in headers.items() if k.startswith("x-ms-meta-")}
        if q.get("comp") == "block":
            self.blocks.setdefault(name, {})[q.get("blockid", "")] = body
            return 201, {}, b""
        if q.get("comp") == "blocklist":
            ids = re.findall(r"<Latest>([^<]*)</Latest>", body.decode())
            staged = self.blocks.pop(name, {})
            if any(i not in staged for i in ids):
                return _error(400, "InvalidBlockList")
            data = b"".join(staged[i] for i in ids)
            self.blobs[name] = Blob(data, meta, headers.get("x-ms-blob-content-md5", ""))
            return 201, {"ETag": f'"{self.blobs[name].etag}"'}, b""
        if headers.get("x-ms-blob-type") != "BlockBlob":
            return _error(400, "MissingRequiredHeader")
        self.blobs[name] = Blob(body, meta, _b64md5(body))
        return 201, {"ETag": f'"{self.blobs[name].etag}"'}, b""

    def list_blobs(self, q: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if (q.get("restype"), q.get("comp")) != ("container", "list"):
            return _error(400, "InvalidQueryParameterValue")
        with self.lock:
            items = "".join(
                f"<Blob><Name>{n}</Name><Properties><Etag>{b.etag}</Etag>"
                f"<Content-Length>{len(b.data)}</Content-Length>"
                f"<Content-MD5>{b.md5}</Content-MD5></Properties></Blob>"
                for n, b in sorted(self.blobs.items())
                if n.startswith(q.get("prefix", ""))
            )
        doc = (
            '<?xml version="1.0" encoding="utf-8"?><EnumerationResults>'
            f"<Blobs>{items}</Blobs><NextMarker /></EnumerationResults>"
        )
        return 200, {"Content-Type": "application/xml"}, doc.encode()


def _b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _error(status: int, code: str) -> tuple[int, dict[str, str], bytes]:
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
        f"<Message>{code}</Message></Error>"
    )
    return status, {"x-ms-error-code": code, "Content-Type": "application/xml"}, body.encode()


@contextmanager
def blob_fake() -> Iterator[tuple[FakeBlob, str]]:
    """The fake on 127.0.0.1: (its state, its URL)."""
    fake = FakeBlob()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _serve(self) -> None:
            split = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, data = fake.handle(self.command, split.path, split.query, headers, body)
            self.send_response(status)
            out.setdefault("Content-Length", str(len(data)))
            for name, value in out.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="blob-fake", daemon=True
    )
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
