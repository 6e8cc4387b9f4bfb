"""The metadata clouds' shared base (``watchdog.MetadataNode``): AWS, Alicloud and Tencent
state only their data (address, token headers, role fields, spot path); one code path reads
the instance id, the role's credentials and the spot notice. Against a local metadata
service on 127.0.0.1 that records what each request carried."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.gpufleet_node.watchdog_fakes import serve

aws_node: Any = importlib.import_module("gpufleet_node.clouds.aws")
alicloud_node: Any = importlib.import_module("gpufleet_node.clouds.alicloud")
tencent_node: Any = importlib.import_module("gpufleet_node.clouds.tencent")

METADATA_CLOUDS = [aws_node.AwsNode, alicloud_node.AlicloudNode, tencent_node.TencentNode]


@dataclass
class Metadata:
    """Answers GETs from ``routes``; in token mode only with the token it handed out."""

    routes: dict[str, str]
    token_header: str = ""
    # method, path, headers (names in lower case)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                meta.requests.append(("PUT", self.path, lowered(self.headers)))
                self._send(200, "tok")

            def do_GET(self) -> None:
                meta.requests.append(("GET", self.path, lowered(self.headers)))
                if meta.token_header and self.headers.get(meta.token_header) != "tok":
                    return self._send(401, "")
                if self.path in meta.routes:
                    return self._send(200, meta.routes[self.path])
                return self._send(404, "")

        return Handler


def lowered(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def role_routes(cls: Any, doc: Any) -> dict[str, str]:
    return {cls.role_path: "node-role\n", cls.role_path + "node-role": json.dumps(doc)}


@pytest.fixture
def metadata() -> Iterator[Any]:
    started: list[Any] = []

    def start(cls: Any, routes: dict[str, str]) -> tuple[Metadata, Any]:
        meta = Metadata(routes, cls.token_header)
        ctx = serve(meta.handler())
        started.append(ctx)
        return meta, cls("us-east-1", metadata_url=ctx.__enter__())

    yield start
    for ctx in reversed(started):
        ctx.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def no_env_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in METADATA_CLOUDS:
        for name in cls.env_keys:
            monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("cls", METADATA_CLOUDS, ids=lambda c: c.name)
def test_each_metadata_cloud_reads_its_role_keys_by_its_own_field_names(
    metadata: Any, cls: Any
) -> None:
    key_id, secret, token = cls.role_fields
    _, node = metadata(cls, role_routes(cls, {key_id: "AK", secret: "SK", token: "ST"}))
    assert node.credentials() == {"access_key_id": "AK", "secret": "SK", "token": "ST"}


@pytest.mark.parametrize("cls", METADATA_CLOUDS, ids=lambda c: c.name)
@pytest.mark.parametrize("doc", [[], "text", {}, {"Token": "t"}], ids=repr)
def test_a_role_document_without_a_key_id_gives_no_credentials(
    metadata: Any, cls: Any, doc: Any
) -> None:
    # AWS and Alicloud used to hand back {"access_key_id": "", ...} for an object without
    # a key id, and raise AttributeError for a document that is not an object.
    _, node = metadata(cls, role_routes(cls, doc))
    assert node.credentials() is None


@pytest.mark.parametrize("cls", METADATA_CLOUDS, ids=lambda c: c.name)
def test_the_instance_id_and_spot_notice_come_from_each_clouds_paths(
    metadata: Any, cls: Any
) -> None:
    routes = {cls.instance_id_path: "i-abc\n", cls.spot_path: "terminate at 12:00"}
    _, node = metadata(cls, routes)
    assert node.instance_id() == "i-abc"
    assert node.spot_notice() == "terminate at 12:00"


@pytest.mark.parametrize("cls", METADATA_CLOUDS, ids=lambda c: c.name)
def test_an_empty_or_missing_instance_id_is_none(metadata: Any, cls: Any) -> None:
    _, node = metadata(cls, {cls.instance_id_path: "  \n"})
    assert node.instance_id() is None
    assert node.spot_notice() is None  # 404: no notice


@pytest.mark.parametrize(
    "cls", [aws_node.AwsNode, alicloud_node.AlicloudNode], ids=lambda c: c.name
)
def test_token_mode_asks_for_a_token_with_its_ttl_header_and_sends_it_with_each_read(
    metadata: Any, cls: Any
) -> None:
    meta, node = metadata(cls, {cls.instance_id_path: "i-abc"})
    assert node.instance_id() == "i-abc"
    (put, get) = meta.requests
    assert put[:2] == ("PUT", "/latest/api/token")
    assert put[2][cls.token_ttl_header.lower()] == str(cls.token_ttl_s)
    assert get[2][cls.token_header.lower()] == "tok"


def test_a_plain_metadata_service_is_never_asked_for_a_token(metadata: Any) -> None:
    meta, node = metadata(
        tencent_node.TencentNode, {tencent_node.TencentNode.instance_id_path: "ins-1"}
    )
    assert node.instance_id() == "ins-1"
    assert [(method, path) for method, path, _ in meta.requests] == [
        ("GET", "/latest/meta-data/instance-id")
    ]


def test_environment_keys_come_before_the_role(
    metadata: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = tencent_node.TencentNode
    key_id, secret, _ = cls.env_keys
    monkeypatch.setenv(key_id, "env-id")
    monkeypatch.setenv(secret, "env-secret")
    meta, node = metadata(cls, role_routes(cls, {"TmpSecretId": "AK"}))
    assert node.credentials() == {"access_key_id": "env-id", "secret": "env-secret", "token": ""}
    assert meta.requests == []
