"""Local servers the node watchdog talks to in the tests, all on 127.0.0.1.

* :class:`FakeIMDS`: the instance metadata service of AWS (IMDSv2) or Alicloud (security
  hardening mode): session token, instance id, instance tags, role credentials, spot notice.
* :class:`FakeEcs`: the few Alicloud RPC actions the watchdog calls (ListTagResources,
  TagResources, PutCustomMetric, StopInstance). Every request's signature is checked with
  the official Alibaba Cloud SDK's own signer
  (``alibabacloud_tea_openapi.utils.Utils.get_rpcsignature``), and every parameter against
  the SDK's request model of its action: one the API does not define is refused.
* moto itself (S3, CloudWatch, EC2 over real HTTP): tests/support/moto_server.py.
* :func:`closed_port`: a port on 127.0.0.1 that refuses connections.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

INSTANCE_ID = "i-0123456789abcdef0"


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return

    def _send(self, status: int, body: str | bytes, ctype: str = "text/plain") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def closed_port() -> str:
    """A loopback URL nothing listens on (bound, then released: connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class FakeIMDS:
    provider: str = "aws"
    tags: dict[str, str] | None = field(default_factory=dict)  # None: tags not enabled
    notice: str | None = None
    credentials: bool = True
    down: bool = False  # every read fails with HTTP 500
    tokens: int = 0
    tag_reads: int = 0
    # moto keeps one store per process, shared by every moto server the tests start: a test
    # that counts datapoints gives its node an id of its own.
    instance_id: str = INSTANCE_ID

    @property
    def token_header(self) -> str:
        vendor = "aws-ec2" if self.provider == "aws" else "aliyun-ecs"
        return f"X-{vendor}-metadata-token"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(_Quiet):
            def do_PUT(self) -> None:
                if self.path != "/latest/api/token" or not self.headers.get(
                    imds.token_header + "-ttl-seconds"
                ):
                    return self._send(400, "")
                imds.tokens += 1
                self._send(200, "token-1")

            def do_GET(self) -> None:
                if self.headers.get(imds.token_header) != "token-1":
                    return self._send(401, "")
                if imds.down:
                    return self._send(500, "")
                path = urllib.parse.unquote(self.path)
                role = (
                    "/latest/meta-data/iam/security-credentials/"
                    if imds.provider == "aws"
                    else "/latest/meta-data/ram/security-credentials/"
                )
                creds = (
                    {"AccessKeyId": "testing", "SecretAccessKey": "testing", "Token": "t"}
                    if imds.provider == "aws"
                    else {"AccessKeyId": "ak", "AccessKeySecret": "secret", "SecurityToken": "st"}
                )
                routes = {"/latest/meta-data/instance-id": imds.instance_id}
                if imds.credentials:
                    routes[role] = "gpufleet-node"
                    routes[role + "gpufleet-node"] = json.dumps(creds)
                if imds.tags is not None:
                    routes["/latest/meta-data/tags/instance"] = "\n".join(imds.tags)
                    for key, value in imds.tags.items():
                        routes[f"/latest/meta-data/tags/instance/{key}"] = value
                if path.startswith("/latest/meta-data/tags/instance"):
                    imds.tag_reads += 1
                spot = (
                    "/latest/meta-data/spot/instance-action"
                    if imds.provider == "aws"
                    else "/latest/meta-data/instance/spot/termination-time"
                )
                if path == spot and imds.notice:
                    return self._send(200, imds.notice)
                if path in routes:
                    return self._send(200, routes[path])
                return self._send(404, "")

        return Handler


def _ecs_request_models() -> dict[str, type[Any]]:
    from alibabacloud_cms20190101 import models as cms
    from alibabacloud_ecs20140526 import models as ecs

    return {
        "ListTagResources": ecs.ListTagResourcesRequest,
        "TagResources": ecs.TagResourcesRequest,
        "StopInstance": ecs.StopInstanceRequest,
        "PutCustomMetric": cms.PutCustomMetricRequest,
    }


@dataclass
class FakeEcs:
    """Alicloud ECS + CloudMonitor RPC, signature-checked with the official SDK's signer."""

    secret: str = "secret"
    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> tags
    fail: int = 0  # answer HTTP <fail> to every request (0: answer normally)
    # StopInstance answers, in order, before it succeeds: (HTTP status, error Code)
    stop_errors: list[tuple[int, str]] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)  # instance -> StoppedMode
    calls: list[dict[str, str]] = field(default_factory=list)
    metrics: list[dict[str, str]] = field(default_factory=list)
    bad_signatures: int = 0

    def handler(self) -> type[BaseHTTPRequestHandler]:
        from alibabacloud_tea_openapi.utils import Utils

        from tests.support.alicloud_models import unknown_params

        fake = self
        models = _ecs_request_models()

        class Handler(_Quiet):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                params = {**query, **form}
                fake.calls.append(params)
                signature = params.pop("Signature", "")
                if signature != Utils.get_rpcsignature(params, "POST", fake.secret):
                    fake.bad_signatures += 1
                    return self._json(400, {"Code": "IncompleteSignature"})
                if fake.fail:
                    return self._json(fake.fail, {"Code": "ServiceUnavailable"})
                action = params.get("Action", "")
                if action not in models:
                    return self._json(400, {"Code": "InvalidAction.NotFound"})
                unknown = unknown_params(models[action], params)
                if unknown:
                    return self._json(400, {"Code": "InvalidParameter", "Message": unknown})
                if action == "ListTagResources":
                    iid = params.get("ResourceId.1", "")
                    items = [
                        {"ResourceId": iid, "ResourceType": "instance", "TagKey": k, "TagValue": v}
                        for k, v in fake.tags.get(iid, {}).items()
                    ]
                    page = {"TagResources": {"TagResource": items}, "NextToken": ""}
                    return self._json(200, {"RequestId": "r", **page})
                if action == "TagResources":
                    iid = params.get("ResourceId.1", "")
                    fake.tags.setdefault(iid, {})[params["Tag.1.Key"]] = params["Tag.1.Value"]
                    return self._json(200, {"RequestId": "r"})
                if action == "StopInstance":
                    if fake.stop_errors:
                        status, code = fake.stop_errors.pop(0)
                        return self._json(status, {"RequestId": "r", "Code": code})
                    mode = params.get("StoppedMode", "KeepCharging")  # the account default
                    fake.stopped[params["InstanceId"]] = mode
                    return self._json(200, {"RequestId": "r"})
                fake.metrics.append(params)
                return self._json(200, {"Code": "200", "RequestId": "r"})

            def _json(self, status: int, body: dict[str, Any]) -> None:
                self._send(status, json.dumps(body), "application/json")

        return Handler
