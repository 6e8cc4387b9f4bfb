"""The node watchdog on Tencent Cloud: its stdlib TC3 signer against the official SDK's, the
metadata service (instance id, CAM role keys, spot reclaim notice) as a local fake, and its
tags, lease tag and STOP_CHARGING power-off through the signed API fake the reaper's tests
use (tests/reaper/tencent_fake.py, which verifies every signature on its own)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.gpufleet_node.test_watchdog import (
    RecordingSyncer,
    Timeline,
    make_dog,
    nodebase,
    nodeclouds,
    tencent_node,
    wconfig,
    wd,
    wmetrics,
    write_checkpoints,
    wscratch,
    wsignals,
)
from tests.gpufleet_node.watchdog_fakes import closed_port
from tests.reaper.tencent_fake import ACCOUNT_UIN, SECRET_ID, SECRET_KEY, FakeCvm, FakeTencent
from tests.support.moto_server import moto_server

REGION = "ap-guangzhou"
IID = "ins-0a1b2c3d"


@dataclass
class FakeTencentMetadata:
    """metadata.tencentyun.com's few paths: plain GETs (no token), 404 where nothing is."""

    notice: str | None = None
    role: bool = True
    reads: int = 0

    def paths(self) -> dict[str, str]:
        base = "/latest/meta-data/cam/security-credentials/"
        routes = {
            "/latest/meta-data/instance-id": IID,
            "/latest/meta-data/placement/region": REGION,
        }
        if self.role:
            routes[base] = "gpufleet-node"
            routes[base + "gpufleet-node"] = json.dumps(
                {
                    "TmpSecretId": SECRET_ID,
                    "TmpSecretKey": SECRET_KEY,
                    "Token": "role-token",
                    "ExpiredTime": 1900000000,
                    "Code": "Success",
                }
            )
        if self.notice:
            routes["/latest/meta-data/spot/termination-time"] = self.notice
        return routes

    def serve(self) -> Any:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                fake.reads += 1
                body = fake.paths().get(urllib.parse.unquote(self.path))
                data = (body or "").encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


@pytest.fixture
def metadata() -> Iterator[tuple[FakeTencentMetadata, str]]:
    fake = FakeTencentMetadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.serve())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api() -> Iterator[tuple[FakeTencent, str]]:
    fake = FakeTencent(region=REGION)
    created = (datetime.now(UTC) - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    tags = {"managed-by": "gpufleet", "gpufleet:stack": "tc", "gpufleet:protected": "true"}
    fake.instances.append(FakeCvm(IID, tags, created))
    fake.instances.append(FakeCvm("ins-other", {"managed-by": "gpufleet"}, created))
    with fake.running() as url:
        yield fake, url


def node(meta_url: str, api_url: str = "", **kw: Any) -> Any:
    return tencent_node.TencentNode(REGION, endpoint_url=api_url, metadata_url=meta_url, **kw)


# ---------------------------------------------------------------- the signer


def test_node_tc3_signature_is_what_the_official_sdk_signs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK signs a real DescribeInstances request (captured, never sent anywhere); the
    node's stdlib signer, given the same body, host, time and keys, gives the same header."""
    from tencentcloud.common import credential
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile
    from tencentcloud.common.sign import Sign
    from tencentcloud.cvm.v20170312 import cvm_client, models

    http = HttpProfile(endpoint="cvm.tencentcloudapi.com")
    client = cvm_client.CvmClient(
        credential.Credential(SECRET_ID, SECRET_KEY, "tok"), REGION, ClientProfile(httpProfile=http)
    )
    sent: dict[str, Any] = {}

    def capture(req: Any) -> Any:
        sent.update(header=dict(req.header), data=req.data)
        raise RuntimeError("captured")

    monkeypatch.setattr(client.request, "send_request", capture)
    request = models.DescribeInstancesRequest()
    request.from_json_string(json.dumps({"InstanceIds": [IID], "Limit": 1}))
    with pytest.raises(Exception, match="captured"):
        client.DescribeInstances(request)
    sdk = sent["header"]
    body = sent["data"].encode() if isinstance(sent["data"], str) else sent["data"]
    ours = tencent_node.tc3_headers(
        service="cvm",
        host="cvm.tencentcloudapi.com",
        action="DescribeInstances",
        version="2017-03-12",
        region=REGION,
        payload=body,
        secret_id=SECRET_ID,
        secret_key=SECRET_KEY,
        token="tok",
        timestamp=int(sdk["X-TC-Timestamp"]),
    )
    assert sdk["Content-Type"] == ours["Content-Type"] == "application/json"
    assert ours["Authorization"] == sdk["Authorization"]
    for name in ("X-TC-Action", "X-TC-Version", "X-TC-Region", "X-TC-Token", "Host"):
        assert ours[name] == sdk[name], name
    # And the last step alone, through the SDK's own sign function.
    date = datetime.fromtimestamp(int(sdk["X-TC-Timestamp"]), UTC).strftime("%Y-%m-%d")
    assert Sign.sign_tc3(SECRET_KEY, date, "cvm", "a string to sign") == _our_last_step(
        SECRET_KEY, date, "cvm", "a string to sign"
    )


def _our_last_step(key: str, date: str, service: str, to_sign: str) -> str:
    import hashlib
    import hmac

    def mac(k: bytes, m: str) -> bytes:
        return hmac.new(k, m.encode(), hashlib.sha256).digest()

    derived = mac(mac(mac(("TC3" + key).encode(), date), service), "tc3_request")
    return hmac.new(derived, to_sign.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- metadata, tags, lease


@pytest.mark.integration
def test_instance_id_and_cam_role_keys_come_from_the_metadata_service(
    metadata: tuple[FakeTencentMetadata, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    _, url = metadata
    cloud = node(url)
    assert cloud.instance_id() == IID
    assert cloud.credentials() == {
        "access_key_id": SECRET_ID,
        "secret": SECRET_KEY,
        "token": "role-token",
    }
    assert nodeclouds.node_cloud("tencent", REGION).bucket_endpoint() == (
        "https://cos.ap-guangzhou.myqcloud.com"
    )


@pytest.mark.integration
def test_no_role_and_no_metadata_service_mean_no_credentials(
    metadata: tuple[FakeTencentMetadata, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    fake, url = metadata
    fake.role = False
    assert node(url).credentials() is None
    silent = node(closed_port())
    assert silent.credentials() is None and silent.instance_id() is None
    assert silent.spot_notice() is None


@pytest.mark.integration
def test_own_tags_come_from_describe_instances_signed_and_verified(
    metadata: tuple[FakeTencentMetadata, str], api: tuple[FakeTencent, str]
) -> None:
    _, meta_url = metadata
    fake, api_url = api
    cloud = node(meta_url, api_url)
    tags = cloud.instance_tags(IID, cloud.credentials)
    assert tags["gpufleet:protected"] == "true"
    assert wsignals.is_protected(tags)
    assert [a for a, _ in fake.calls] == ["DescribeInstances"]
    assert fake.calls[0][1]["InstanceIds"] == [IID]
    assert not fake.rejected  # the fake's own TC3 check accepted the stdlib signature


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["500", "html", "error", "closed", "nocreds"])
def test_unreadable_tags_raise_tags_unreadable_never_empty(
    metadata: tuple[FakeTencentMetadata, str], api: tuple[FakeTencent, str], fault: str
) -> None:
    _, meta_url = metadata
    fake, api_url = api
    if fault == "500":
        fake.status_actions["DescribeInstances"] = 500
    elif fault == "html":
        fake.html_actions.add("DescribeInstances")
    elif fault == "error":
        fake.fail_actions.add("DescribeInstances")
    cloud = node(meta_url, closed_port() if fault == "closed" else api_url, timeout=2.0)
    creds = (lambda: None) if fault == "nocreds" else cloud.credentials
    with pytest.raises(nodebase.TagsUnreadable):
        cloud.instance_tags(IID, creds)


@pytest.mark.integration
def test_lease_tag_is_written_on_this_instance_only_through_tag_resources(
    metadata: tuple[FakeTencentMetadata, str], api: tuple[FakeTencent, str]
) -> None:
    _, meta_url = metadata
    fake, api_url = api
    cloud = node(meta_url, api_url)
    cloud.write_tag(IID, "gpufleet:keep-alive-until", "2026-12-01T20:00:00Z", cloud.credentials())
    tagged = {i.instance_id: i.tags for i in fake.instances}
    assert tagged[IID]["gpufleet:keep-alive-until"] == "2026-12-01T20:00:00Z"
    assert "gpufleet:keep-alive-until" not in tagged["ins-other"]
    call = dict(fake.calls)["TagResources"]
    assert call["ResourceList"] == [f"qcs::cvm:{REGION}:uin/{ACCOUNT_UIN}:instance/{IID}"]
    assert not fake.rejected


# ---------------------------------------------------------------- power-off


@pytest.mark.integration
def test_poweroff_is_stop_instances_with_stop_charging_for_this_instance_only(
    metadata: tuple[FakeTencentMetadata, str], api: tuple[FakeTencent, str]
) -> None:
    _, meta_url = metadata
    fake, api_url = api
    node(meta_url, api_url).poweroff()
    assert {i.instance_id: i.state for i in fake.instances} == {
        IID: "STOPPED",
        "ins-other": "RUNNING",
    }
    stop = dict(fake.calls)["StopInstances"]
    assert stop == {"InstanceIds": [IID], "StopType": "SOFT_FIRST", "StoppedMode": "STOP_CHARGING"}


@pytest.mark.integration
def test_poweroff_retries_throttling_and_raises_on_a_refusal_without_keep_charging(
    metadata: tuple[FakeTencentMetadata, str], api: tuple[FakeTencent, str]
) -> None:
    _, meta_url = metadata
    fake, api_url = api
    naps: list[float] = []
    fake.status_actions["StopInstances"] = 503
    with pytest.raises(Exception, match="503"):
        node(meta_url, api_url, sleep=naps.append).poweroff()
    assert len([a for a, _ in fake.calls if a == "StopInstances"]) == nodebase.LEASE_TAG_ATTEMPTS
    assert len(naps) == nodebase.LEASE_TAG_ATTEMPTS - 1  # bounded
    del fake.status_actions["StopInstances"]
    fake.instances[0].refuses_stop = True
    with pytest.raises(tencent_node.TencentApiError, match="StoppedModeStopCharging"):
        node(meta_url, api_url, sleep=naps.append).poweroff()
    stops = [q for a, q in fake.calls if a == "StopInstances"]
    assert all(q["StoppedMode"] == "STOP_CHARGING" for q in stops)
    assert fake.instances[0].state == "RUNNING"


# ---------------------------------------------------------------- the watchdog loop


@pytest.mark.integration
def test_spot_reclaim_notice_syncs_scratch_at_once_and_only_once(
    tmp_path: Path, metadata: tuple[FakeTencentMetadata, str]
) -> None:
    fake, url = metadata
    dog, _probe, rec = make_dog(
        tmp_path, Timeline(util=lambda m: 100.0), provider="tencent", region=REGION
    )
    dog.cloud = node(url)
    dog.run_once()
    assert not rec.syncs()
    fake.notice = "2026-03-01 16:40:00"  # the documented answer: a time (UTC+8)
    dog.run_once()
    dog.run_once()
    assert len(rec.syncs()) == 1 and rec.events[0][0] == "sync 90"
    assert not rec.poweroffs()  # busy: the notice saves scratch, it is not a stop


UTC8 = wd.dt.timezone(timedelta(hours=8))


def notice_at(when: datetime) -> str:
    """The notice as the metadata service writes it: the time in UTC+8 (213/32487)."""
    return when.astimezone(UTC8).strftime("%Y-%m-%d %H:%M:%S")


def test_the_spot_notice_is_the_repossession_time_in_utc_plus_8() -> None:
    cloud = node("http://127.0.0.1:1")
    assert cloud.spot_deadline("2018-08-18 12:05:33") == datetime(2018, 8, 18, 4, 5, 33, tzinfo=UTC)
    assert cloud.spot_deadline("soon") is None
    assert cloud.spot_deadline("2018-08-18T12:05:33Z") is None  # not the documented form


def test_the_spot_sync_ends_before_the_repossession_time_the_notice_names(
    tmp_path: Path,
) -> None:
    dog, probe, _ = make_dog(tmp_path, Timeline(), provider="tencent", region=REGION)
    dog.cloud = node("http://127.0.0.1:1")
    now = probe.now()
    assert dog.spot_sync_budget(notice_at(now + timedelta(seconds=40))) == 30.0
    assert dog.spot_sync_budget(notice_at(now + timedelta(minutes=9))) == wd.SPOT_SYNC_S
    # Late (or a clock far off): the newest files still get a few seconds.
    assert dog.spot_sync_budget(notice_at(now - timedelta(minutes=1))) == wd.SPOT_MIN_SYNC_S
    assert dog.spot_sync_budget("not a time") == wd.SPOT_SYNC_S


@pytest.fixture(scope="module")
def cos() -> Iterator[str]:
    """moto's S3 standing in for COS's S3-compatible API (the node speaks SigV4 to both)."""
    with moto_server(warm=("s3",)) as url:
        yield url


def spot_node(tmp_path: Path, meta_url: str, bucket_url: str, bucket: str) -> tuple[Any, Any, Any]:
    """A busy Tencent node whose sync is the real one, talking to ``bucket_url``."""
    dog, probe, rec = make_dog(
        tmp_path,
        Timeline(util=lambda m: 100.0),
        provider="tencent",
        region=REGION,
        bucket=bucket,
        storage_endpoint_url=bucket_url,
        samples_per_run=1,
    )
    keys = {"access_key_id": "testing", "secret": "testing", "token": ""}
    syncer = wscratch.ScratchSyncer(dog.config, lambda: keys, retry_sleep=lambda s: None)
    dog.syncer = RecordingSyncer(syncer, probe, rec)
    dog.cloud = node(meta_url)
    return dog, probe, rec


@pytest.mark.integration
def test_a_reclaim_notice_lands_the_checkpoints_in_the_bucket_before_the_repossession(
    tmp_path: Path, metadata: tuple[FakeTencentMetadata, str], cos: str
) -> None:
    import boto3

    fake, meta_url = metadata
    s3 = boto3.client("s3", endpoint_url=cos, region_name="us-east-1")
    s3.create_bucket(Bucket="gpufleet-tc-spot")
    dog, probe, rec = spot_node(tmp_path, meta_url, cos, "gpufleet-tc-spot")
    files = write_checkpoints(Path(dog.config.scratch_path))
    dog.run_once()
    assert not rec.syncs()  # no notice: nothing to do on a busy node
    fake.notice = notice_at(probe.now() + timedelta(seconds=100))
    dog.run_once()
    dog.run_once()
    assert [e for e, _ in rec.events] == ["sync 90"]  # once per notice, inside its time
    listed = s3.list_objects_v2(Bucket="gpufleet-tc-spot").get("Contents", [])
    assert sorted(o["Key"] for o in listed) == sorted(f"checkpoints/a100x8-1/{k}" for k in files)
    assert not rec.poweroffs()  # Tencent repossesses the node; the watchdog only saves


@pytest.fixture
def silent_bucket() -> Iterator[str]:
    """A bucket endpoint that takes connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.integration
def test_a_reclaim_notice_sync_to_a_silent_bucket_gives_up_before_the_repossession(
    tmp_path: Path, metadata: tuple[FakeTencentMetadata, str], silent_bucket: str
) -> None:
    fake, meta_url = metadata
    dog, probe, rec = spot_node(tmp_path, meta_url, silent_bucket, "gpufleet-tc-spot")
    write_checkpoints(Path(dog.config.scratch_path))
    fake.notice = notice_at(probe.now() + timedelta(seconds=16))
    started = time.monotonic()
    dog.run_once()
    took = time.monotonic() - started
    assert [e for e, _ in rec.events] == ["sync 6"]  # 16 s left, 10 s kept in hand
    assert took < 6 + 3  # bounded by the budget, whatever the bucket does
    result = dog.syncer.results[0]
    assert not result.ok and result.unsynced == 2
    dog.run_once()  # not saved: the same notice is tried again on the next run
    assert len(rec.syncs()) == 2


@pytest.mark.integration
def test_the_tencent_watchdog_beats_with_an_object_in_the_bucket_not_custom_metrics(
    tmp_path: Path, metadata: tuple[FakeTencentMetadata, str], cos: str
) -> None:
    import boto3

    _, url = metadata
    s3 = boto3.client("s3", endpoint_url=cos, region_name="us-east-1")
    s3.create_bucket(Bucket="gpufleet-tc-beat")
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True)
    config = wconfig.Config(
        provider="tencent",
        region=REGION,
        stack="tc",
        node="tc-1",
        bucket="gpufleet-tc-beat",
        metadata_url=url,
        storage_endpoint_url=cos,
        scratch_path=str(scratch),
        state_dir=str(tmp_path / "state"),
    )
    dog = wd.build(config)
    assert isinstance(dog.publisher, wmetrics.BucketHeartbeat)
    assert dog.publisher.instance_id == IID  # from the metadata service
    now = datetime.now(UTC)
    dog.publisher.publish(at=now, gpu_util=42.0, gpu_mem=10.0, unsynced=0)
    key = f"{wd.names.HEARTBEAT_OBJECT_PREFIX}{IID}"
    body = json.loads(s3.get_object(Bucket="gpufleet-tc-beat", Key=key)["Body"].read())
    assert body["gpu_util"] == 42.0 and body["node_time"] == wd.idle_rules.format_utc(now)
    with pytest.raises(RuntimeError, match="PutMonitorData"):
        node(url).put_metrics(IID, [("Heartbeat", 1.0, "None")], {})

    # And the reaper reads what the node wrote: the object's Last-Modified, stamped by the
    # storage service (moto's clock here), through the reaper's own bucket client.
    from infra.clouds.tencent.reaper import TencentCloud

    reaper = TencentCloud(
        REGION,
        secret_id=SECRET_ID,
        secret_key=SECRET_KEY,
        bucket="gpufleet-tc-beat",
        cos_endpoint=cos,
    )
    seen = reaper._with_heartbeat(IID, 0.0, now - timedelta(minutes=5), now + timedelta(minutes=5))
    assert seen.error is None and seen.last_heartbeat is not None
    assert abs((seen.last_heartbeat - now).total_seconds()) < 5
    gone = reaper._with_heartbeat("ins-never", 0.0, now - timedelta(minutes=5), now)
    assert gone.error is None and gone.last_heartbeat is None  # no object: no evidence


def test_tencent_is_a_registered_node_cloud() -> None:
    assert nodeclouds.CLOUDS["tencent"] is tencent_node.TencentNode
    assert nodeclouds.node_cloud("tencent", REGION).name == "tencent"
