"""The node watchdog on Azure: IMDS (identity, own tags, managed-identity tokens, Scheduled
Events) and the calls the node makes (custom metrics, the lease tag, deallocation through
ARM, the Blob container) against one local fake on 127.0.0.1, and the watchdog loop in
simulation: a Preempt notice saves scratch at once; an idle node saves scratch, then is
deallocated through ARM, never shut down from inside (a "Stopped" VM is still billed)."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.gpufleet_node.test_watchdog import (
    RecordingSyncer,
    Timeline,
    azure_node,
    make_dog,
    nodebase,
    nodeclouds,
    run_until_poweroff,
    wscratch,
    wsync,
)
from tests.gpufleet_node.watchdog_fakes import closed_port

REGION = "eastus"
VM = "azt-a100x1-0"
SUB = "00000000-0000-4000-8000-000000000001"
RID = f"/subscriptions/{SUB}/resourceGroups/rg-azt/providers/Microsoft.Compute/virtualMachines/{VM}"
ACCOUNT, CONTAINER = "gpufleetazt1a2b", "gpufleet"
TOKENS = {
    "https://management.azure.com/": "arm-token",
    "https://monitoring.azure.com/": "monitor-token",
    "https://storage.azure.com/": "storage-token",
}


@dataclass
class FakeAzureNode:
    """IMDS, ARM, the regional metrics endpoint and Blob Storage, as the node reaches them."""

    tags: dict[str, str] = field(default_factory=lambda: {"managed-by": "gpufleet"})
    events: list[dict[str, Any]] = field(default_factory=list)
    identity: bool = True
    deallocate_answers: list[int] = field(default_factory=list)  # statuses before a 202
    power: str = "running"
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tag_writes: list[dict[str, Any]] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)
    blocks: dict[str, dict[str, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    page_size: int = 5000  # List Blobs' maximum; tests lower it to see NextMarker

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> tuple[int, bytes, dict[str, str]]:
        url = urllib.parse.urlsplit(h.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        self.calls.append((method, url.path))
        if url.path.startswith("/metadata/"):
            if h.headers.get("Metadata") != "true":
                return 400, b'{"error": "Bad request. Required metadata header not specified"}', {}
            return self.imds(url.path, q)
        auth = h.headers.get("Authorization", "")
        if url.path.startswith(f"/{ACCOUNT}/{CONTAINER}"):
            if auth != "Bearer storage-token" or not h.headers.get("x-ms-version"):
                return 403, b"<Error><Code>AuthenticationFailed</Code></Error>", {}
            if url.path == f"/{ACCOUNT}/{CONTAINER}":
                return self.list_blobs(method, q)
            return self.blob(method, url.path, q, body, h)
        if url.path == RID + "/metrics" and method == "POST":
            if auth != "Bearer monitor-token":
                return 401, b'{"error": "audience"}', {}
            self.metrics.append(json.loads(body))
            return 200, b"", {}
        if auth != "Bearer arm-token":
            return 401, b'{"error": {"code": "InvalidAuthenticationToken"}}', {}
        if url.path == RID + "/providers/Microsoft.Resources/tags/default" and method == "PATCH":
            doc = json.loads(body)
            self.tag_writes.append(doc)
            if doc.get("operation") == "Merge":
                self.tags.update(doc["properties"]["tags"])
            return 200, json.dumps({"properties": {"tags": self.tags}}).encode(), {}
        if url.path == RID + "/deallocate" and method == "POST":
            if self.deallocate_answers:
                status = self.deallocate_answers.pop(0)
                return status, b'{"error": {"code": "Fault"}}', {"Retry-After": "1"}
            self.power = "deallocating"
            return 202, b"", {"Azure-AsyncOperation": "https://example.invalid/op"}
        return 404, b'{"error": {"code": "NotFound"}}', {}

    def imds(self, path: str, q: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        if path == "/metadata/instance/compute":
            doc = {
                "name": VM,
                "location": REGION,
                "resourceId": RID,
                "subscriptionId": SUB,
                "tagsList": [{"name": k, "value": v} for k, v in self.tags.items()],
            }
            return 200, json.dumps(doc).encode(), {}
        if path == "/metadata/identity/oauth2/token":
            if not self.identity:
                return (
                    400,
                    b'{"error": "invalid_request", "error_description": "Identity not found"}',
                    {},
                )
            token = TOKENS.get(q.get("resource", ""))
            if token is None:
                return 400, b'{"error": "invalid_resource"}', {}
            doc = {"access_token": token, "expires_on": "1900000000", "resource": q["resource"]}
            return 200, json.dumps(doc).encode(), {}
        if path == "/metadata/scheduledevents":
            events = {
                "DocumentIncarnation": len(self.events),
                "Events": self.events,
            }
            return 200, json.dumps(events).encode(), {}
        return 404, b"", {}

    def list_blobs(self, method: str, q: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        """List Blobs: EnumerationResults with Name and Content-Length, page_size names a
        page after ``marker``, NextMarker while more remain."""
        if method != "GET" or (q.get("restype"), q.get("comp")) != ("container", "list"):
            return 400, b"<Error><Code>InvalidQueryParameterValue</Code></Error>", {}
        names = sorted(n for n in self.blobs if n.startswith(q.get("prefix", "")))
        names = [n for n in names if n > q.get("marker", "")]
        page, rest = names[: self.page_size], names[self.page_size :]
        items = "".join(
            f"<Blob><Name>{n}</Name><Properties><Content-Length>{len(self.blobs[n])}"
            "</Content-Length></Properties></Blob>"
            for n in page
        )
        marker = page[-1] if rest else ""
        doc = (
            '<?xml version="1.0" encoding="utf-8"?><EnumerationResults ContainerName="c">'
            f"<Blobs>{items}</Blobs><NextMarker>{marker}</NextMarker></EnumerationResults>"
        )
        return 200, doc.encode(), {"Content-Type": "application/xml"}

    def blob(
        self, method: str, path: str, q: dict[str, str], body: bytes, h: BaseHTTPRequestHandler
    ) -> tuple[int, bytes, dict[str, str]]:
        name = path[len(f"/{ACCOUNT}/{CONTAINER}/") :]
        if method == "GET":
            data = self.blobs.get(name)
            if data is None:
                return 404, b"<Error><Code>BlobNotFound</Code></Error>", {}
            return 200, data, {"x-ms-blob-type": "BlockBlob"}
        if method == "HEAD":
            data = self.blobs.get(name)
            if data is None:
                return 404, b"", {}
            return 200, b"", {"Content-Length": str(len(data)), "x-ms-blob-type": "BlockBlob"}
        if method == "DELETE":
            # Delete Blob: "A successful operation returns status code 202 (Accepted)"
            # (learn.microsoft.com/en-us/rest/api/storageservices/delete-blob, read 2026-12-02).
            if self.blobs.pop(name, None) is None:
                return 404, b"<Error><Code>BlobNotFound</Code></Error>", {}
            return 202, b"", {}
        if method != "PUT":
            return 405, b"", {}
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        if h.headers.get("Content-MD5") != md5:
            return 400, b"<Error><Code>Md5Mismatch</Code></Error>", {}
        if q.get("comp") == "block":
            self.blocks.setdefault(name, {})[q["blockid"]] = body
            return 201, b"", {}
        if q.get("comp") == "blocklist":
            ids = [part.split("</Latest>")[0] for part in body.decode().split("<Latest>")[1:]]
            staged = self.blocks.pop(name, {})
            if any(i not in staged for i in ids):
                return 400, b"<Error><Code>InvalidBlockList</Code></Error>", {}
            self.blobs[name] = b"".join(staged[i] for i in ids)
            return 201, b"", {}
        if h.headers.get("x-ms-blob-type") != "BlockBlob":
            return 400, b"<Error><Code>MissingRequiredHeader</Code></Error>", {}
        self.blobs[name] = body
        return 201, b"", {}


@pytest.fixture
def azure() -> Iterator[tuple[FakeAzureNode, str]]:
    fake = FakeAzureNode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _serve(self, method: str) -> None:
            with fake.lock:
                status, data, headers = fake.handle(self, method)
            self.send_response(status)
            # HEAD (Get Blob Properties) tells the blob's length, with no body.
            headers.setdefault("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def node(url: str, **kw: Any) -> Any:
    return azure_node.AzureNode(
        REGION, endpoint_url=url, metadata_url=url, sleep=lambda s: None, **kw
    )


# ---------------------------------------------------------------- Scheduled Events (pure)


def _events(*events: dict[str, Any]) -> str:
    return json.dumps({"DocumentIncarnation": 2, "Events": list(events)})


def test_a_preempt_event_for_this_vm_is_a_notice_that_changes_per_event() -> None:
    event = {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 19 Sep 2026 18:29:47 GMT",
    }
    notice = azure_node.parse_scheduled_events(_events(event), VM)
    assert notice == f"Preempt {event['EventId']} {event['NotBefore']}"
    other = dict(event, EventId="another")
    assert azure_node.parse_scheduled_events(_events(other), VM) != notice


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "<html>proxy</html>",
        json.dumps({"Events": "nope"}),
        _events({"EventType": "Freeze", "Resources": [VM]}),
        _events({"EventType": "Reboot", "Resources": [VM]}),
        _events({"EventType": "Preempt", "Resources": ["another-vm"]}),
    ],
)
def test_anything_but_a_preempt_of_this_vm_is_no_notice(text: str | None) -> None:
    assert azure_node.parse_scheduled_events(text, VM) is None


# ---------------------------------------------------------------- IMDS


@pytest.mark.integration
def test_identity_and_own_tags_come_from_imds_with_the_metadata_header(
    azure: tuple[FakeAzureNode, str],
) -> None:
    fake, url = azure
    fake.tags["gpufleet:protected"] = "true"
    n = node(url)
    assert n.instance_id() == VM
    assert n.resource_id() == RID
    assert n.instance_tags(VM, lambda: None) == {
        "managed-by": "gpufleet",
        "gpufleet:protected": "true",
    }
    # Without the header IMDS refuses: the fake does so too, and the node always sends it.
    assert all(p.startswith("/metadata/") for _, p in fake.calls)


@pytest.mark.integration
def test_tokens_for_arm_monitor_and_storage_come_from_the_managed_identity(
    azure: tuple[FakeAzureNode, str],
) -> None:
    fake, url = azure
    creds = node(url).credentials()
    assert creds is not None
    assert (creds["token"], creds["monitor"], creds["storage"]) == (
        "arm-token",
        "monitor-token",
        "storage-token",
    )
    fake.identity = False
    assert node(url).credentials() is None


def test_no_imds_means_no_id_no_credentials_no_notice_and_unreadable_tags() -> None:
    n = node(closed_port())
    assert n.instance_id() is None
    assert n.credentials() is None
    assert n.spot_notice() is None
    with pytest.raises(nodebase.TagsUnreadable):
        n.instance_tags(VM, lambda: None)


# ---------------------------------------------------------------- the node's calls


@pytest.mark.integration
def test_metrics_are_custom_metrics_on_the_vms_resource_id_one_post_each(
    azure: tuple[FakeAzureNode, str],
) -> None:
    fake, url = azure
    n = node(url)
    n.put_metrics(
        VM,
        [("Heartbeat", 1.7e9, "None"), ("GPUUtilization", 87.0, "Percent")],
        {**(n.credentials() or {})},
    )
    assert [m["data"]["baseData"]["metric"] for m in fake.metrics] == [
        "Heartbeat",
        "GPUUtilization",
    ]
    base = fake.metrics[1]["data"]["baseData"]
    assert base["namespace"] == "gpufleet"
    assert base["series"] == [{"dimValues": [], "min": 87.0, "max": 87.0, "sum": 87.0, "count": 1}]
    assert fake.metrics[0]["time"].endswith("Z")


@pytest.mark.integration
def test_the_lease_is_a_merge_of_one_tag_on_this_vm(azure: tuple[FakeAzureNode, str]) -> None:
    fake, url = azure
    n = node(url)
    n.write_tag(VM, "gpufleet:keep-alive-until", "2026-03-01T20:00:00Z", n.credentials() or {})
    assert fake.tag_writes == [
        {
            "operation": "Merge",
            "properties": {"tags": {"gpufleet:keep-alive-until": "2026-03-01T20:00:00Z"}},
        }
    ]
    assert fake.tags["managed-by"] == "gpufleet"  # a merge keeps the other tags


@pytest.mark.integration
def test_poweroff_deallocates_through_arm_and_retries_throttling(
    azure: tuple[FakeAzureNode, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = azure
    monkeypatch.setattr(nodebase, "system_poweroff", _no_os_shutdown)
    fake.deallocate_answers = [429, 503]
    node(url).poweroff()
    assert fake.power == "deallocating"
    assert [p for m, p in fake.calls if m == "POST" and p.endswith("/deallocate")] == [
        RID + "/deallocate"
    ] * 3


@pytest.mark.integration
def test_a_refused_deallocation_raises_and_never_falls_back_to_an_os_shutdown(
    azure: tuple[FakeAzureNode, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = azure
    monkeypatch.setattr(nodebase, "system_poweroff", _no_os_shutdown)
    fake.deallocate_answers = [403]
    with pytest.raises(azure_node.urllib.error.HTTPError):
        node(url).poweroff()
    assert fake.power == "running"
    fake.identity = False
    with pytest.raises(RuntimeError, match="no managed-identity token"):
        node(url).poweroff()


def _no_os_shutdown() -> None:
    raise AssertionError("an OS shutdown leaves an Azure VM Stopped and billed")


# ---------------------------------------------------------------- the Blob container


def _store(url: str, creds: Any) -> Any:
    return wsync.BlobStore.for_node(
        endpoint="https://blob.core.windows.net",
        region=REGION,
        bucket=f"{ACCOUNT}/{CONTAINER}",
        credentials=creds,
        endpoint_url=url,
    )


def test_blob_urls_put_the_account_in_front_of_the_host_or_in_the_path() -> None:
    creds = dict
    own = wsync.BlobStore.for_node(
        endpoint="https://blob.core.windows.net",
        region=REGION,
        bucket=f"{ACCOUNT}/{CONTAINER}",
        credentials=creds,
    )
    assert own.url("checkpoints/n/step 1.pt") == (
        f"https://{ACCOUNT}.blob.core.windows.net/{CONTAINER}/checkpoints/n/step%201.pt"
    )
    assert _store("http://127.0.0.1:1", creds).url("k") == (
        f"http://127.0.0.1:1/{ACCOUNT}/{CONTAINER}/k"
    )
    with pytest.raises(wsync.StoreError, match="storage account"):
        wsync.BlobStore.for_node(
            endpoint="x://y", region=REGION, bucket="nocontainer", credentials=creds
        )


@pytest.mark.integration
def test_blob_put_and_large_files_in_blocks_land_whole_and_check_sync_reads_back(
    azure: tuple[FakeAzureNode, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = azure
    n = node(url)
    store = _store(url, n.credentials)
    store.put("a.txt", b"hello")
    monkeypatch.setattr(wsync, "BLOCK_SIZE", 1000)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 11)  # 2816 bytes: three blocks
    store.upload_file("big.bin", big, big.stat().st_size, deadline=wsync.time.monotonic() + 30)
    assert fake.blobs["a.txt"] == b"hello"
    assert fake.blobs["big.bin"] == big.read_bytes()
    assert [q for m, q in fake.calls if m == "PUT"].count(f"/{ACCOUNT}/{CONTAINER}/big.bin") == 4
    assert wsync.check_store(store, "azt-1").startswith("wrote and read back azureblob://")


@pytest.mark.integration
def test_blob_refusals_are_store_errors_and_no_token_is_no_request(
    azure: tuple[FakeAzureNode, str],
) -> None:
    fake, url = azure
    bad = _store(url, lambda: {"access_key_id": "x", "secret": "", "storage": "wrong"})
    with pytest.raises(wsync.StoreError, match="AuthenticationFailed"):
        bad.put("a", b"x")
    before = len(fake.calls)
    with pytest.raises(wsync.StoreError, match="no storage token"):
        _store(url, lambda: None).put("a", b"x")
    assert len(fake.calls) == before


# ---------------------------------------------------------------- the watchdog loop


@pytest.mark.integration
def test_preempt_notice_syncs_scratch_at_once_and_only_once(
    tmp_path: Path, azure: tuple[FakeAzureNode, str]
) -> None:
    fake, url = azure
    dog, _probe, rec = make_dog(
        tmp_path, Timeline(util=lambda m: 100.0), provider="azure", region=REGION
    )
    dog.cloud = node(url)
    dog.run_once()
    assert not rec.syncs()
    fake.events.append(
        {
            "EventId": "e1",
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": [VM],
            "EventStatus": "Scheduled",
            "NotBefore": "Mon, 01 Mar 2026 09:00:30 GMT",
        }
    )
    dog.run_once()
    dog.run_once()
    assert len(rec.syncs()) == 1
    assert not rec.poweroffs()  # busy: the notice saves scratch, it is not a stop


@pytest.mark.integration
def test_idle_node_saves_scratch_to_blob_then_deallocates_never_an_os_shutdown(
    tmp_path: Path, azure: tuple[FakeAzureNode, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = azure
    monkeypatch.setattr(nodebase, "system_poweroff", _no_os_shutdown)
    dog, probe, rec = make_dog(
        tmp_path,
        Timeline(util=lambda m: 0.0),
        provider="azure",
        region=REGION,
        bucket=f"{ACCOUNT}/{CONTAINER}",
        storage_endpoint_url=url,
        endpoint_url=url,
        metadata_url=url,
    )
    ckpt = Path(dog.config.scratch_path) / "checkpoints" / "step-100.pt"
    ckpt.write_bytes(b"weights" * 100)
    cloud = node(url)
    dog.syncer = RecordingSyncer(wscratch.ScratchSyncer(dog.config, cloud.credentials), probe, rec)

    def deallocate() -> None:
        rec.events.append(("poweroff", probe.minutes))
        cloud.poweroff()

    dog.poweroff = deallocate
    assert run_until_poweroff(dog, probe, rec, 200) is not None
    assert fake.blobs[f"checkpoints/{dog.config.node}/step-100.pt"] == ckpt.read_bytes()
    puts = [i for i, (m, p) in enumerate(fake.calls) if m == "PUT"]
    deallocs = [i for i, (m, p) in enumerate(fake.calls) if p.endswith("/deallocate")]
    assert puts and deallocs and max(puts) < min(deallocs)  # saved first, then deallocated
    assert fake.power == "deallocating"


@pytest.mark.integration
def test_unsaved_scratch_refuses_the_deallocation(
    tmp_path: Path, azure: tuple[FakeAzureNode, str]
) -> None:
    fake, url = azure
    dog, probe, rec = make_dog(
        tmp_path,
        Timeline(util=lambda m: 0.0),
        provider="azure",
        region=REGION,
        bucket=f"{ACCOUNT}/{CONTAINER}",
        storage_endpoint_url=url,
    )
    (Path(dog.config.scratch_path) / "checkpoints" / "step-1.pt").write_bytes(b"w")
    broken = node(url)
    broken.metadata_url = closed_port()  # no token: the container cannot be written
    dog.syncer = RecordingSyncer(
        wscratch.ScratchSyncer(dog.config, broken.credentials, retry_sleep=lambda s: None),
        probe,
        rec,
    )
    assert run_until_poweroff(dog, probe, rec, 120) is None
    assert rec.syncs()
    assert fake.power == "running"
    assert any("REFUSING to power off" in w for w in rec.warnings)


def test_azure_is_a_registered_node_cloud_with_a_blob_store() -> None:
    assert nodeclouds.CLOUDS["azure"] is azure_node.AzureNode
    assert nodeclouds.node_cloud("azure", REGION).name == "azure"
    assert azure_node.AzureNode.bucket_store is wsync.BlobStore


# ---------------------------------------------------------------- verify-gpu's paths


def verify_args(url: str) -> Any:
    """verify_node.py's bucket arguments for the fake's container and identity."""
    from argparse import Namespace

    return Namespace(
        bucket=f"{ACCOUNT}/{CONTAINER}",
        provider="azure",
        region=REGION,
        s3_endpoint=url,
        metadata_url=url,
    )


@pytest.mark.integration
def test_the_verify_report_reaches_the_container_with_the_vms_managed_identity(
    azure: tuple[FakeAzureNode, str], tmp_path: Path
) -> None:
    from gpufleet_node import verify_node

    fake, url = azure
    path = tmp_path / "verify-1.json"
    path.write_text('{"overall": "pass"}\n')
    args = verify_args(url)
    done = verify_node.upload_report(args, path)
    assert done == {
        "status": "ok",
        "tool": "bucket.py",
        "url": f"{url}/{ACCOUNT}/{CONTAINER}/gpufleet/verify/verify-1.json",
    }
    assert fake.blobs["gpufleet/verify/verify-1.json"] == path.read_bytes()
    fake.identity = False  # no managed identity: nothing to authorise the upload with
    missing = verify_node.upload_report(args, path)
    assert missing["status"] == "skip" and "no storage token" in missing["reason"], missing


@pytest.mark.integration
def test_the_node_probe_for_blob_is_the_nodes_own_client_with_its_managed_identity(
    azure: tuple[FakeAzureNode, str],
) -> None:
    from gpufleet_node import verify_node

    fake, url = azure
    args = verify_args(url)
    result = verify_node.storage_probe(args)
    assert result["status"] == "ok", result
    assert result["tool"] == "bucket.py" and {"put_s", "get_s", "delete_s"} <= set(result)
    assert [m for m, p in fake.calls if p.startswith(f"/{ACCOUNT}/")] == ["PUT", "GET", "DELETE"]
    assert fake.blobs == {}  # the probe blob is gone again
    fake.identity = False  # no managed identity: nothing to authorise the probe with
    missing = verify_node.storage_probe(args)
    assert missing["status"] == "skip" and "no storage token" in missing["reason"], missing
