"""Every fault class the stores produce, driven through bucket.Store (moto S3 behind a
strict front that refuses damaged bodies as S3 does) and bucket.BlobStore (the Blob fake),
each behind tests/support/fault_proxy.py: a transfer ends in the exact bytes or in a
StoreError with its cause, and a file never has its real name with wrong bytes."""

from __future__ import annotations

import hashlib
import importlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.blob_fake import ACCOUNT, CONTAINER, CREDS, FakeBlob, blob_fake
from tests.support.fault_proxy import Fault, FaultProxy, fault_proxy
from tests.support.moto_server import moto_server
from tests.support.strict_s3 import strict_s3

bucket: Any = importlib.import_module("gpufleet_node.bucket")

S3_CREDS = {"access_key_id": "testing", "secret": "testing", "token": ""}
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url, strict_s3(url) as front:
        yield front.url


@dataclass
class Rig:
    """One store behind a fault proxy, and a way to write the object behind its back."""

    kind: str
    store: Any
    proxy: FaultProxy
    replace: Any  # (key, data) -> None: another writer, not through the proxy
    slept: list[float] = field(default_factory=list)

    def deadline(self, seconds: float = 60) -> float:
        return time.monotonic() + seconds

    def put(self, key: str, data: bytes) -> str:
        return str(self.store.put(key, data, self.deadline()))

    def gets(self) -> list[Any]:
        return self.proxy.requests("GET")


def _s3_rig(moto: str) -> Iterator[Rig]:
    import boto3

    name = f"h1-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=name)
    with fault_proxy(moto) as proxy:
        store = bucket.Store.for_node(
            endpoint="https://unused.invalid",
            region="us-east-1",
            bucket=name,
            credentials=lambda: dict(S3_CREDS),
            endpoint_url=proxy.url,
        )

        def replace(key: str, data: bytes) -> None:
            client.put_object(Bucket=name, Key=key, Body=data)

        rig = Rig("s3", store, proxy, replace)
        store.retry_sleep = rig.slept.append
        store.retry_rng = lambda: 1.0
        yield rig


def _blob_rig() -> Iterator[Rig]:
    fake: FakeBlob
    with blob_fake() as (fake, url), fault_proxy(url) as proxy:
        store = bucket.BlobStore.for_node(
            endpoint="https://unused.invalid",
            region="eastus",
            bucket=f"{ACCOUNT}/{CONTAINER}",
            credentials=lambda: dict(CREDS),
            endpoint_url=proxy.url,
        )
        rig = Rig("blob", store, proxy, fake.replace)
        store.retry_sleep = rig.slept.append
        store.retry_rng = lambda: 1.0
        yield rig


@pytest.fixture(params=["s3", "blob"])
def rig(request: pytest.FixtureRequest, moto: str) -> Iterator[Rig]:
    yield from (_s3_rig(moto) if request.param == "s3" else _blob_rig())


@pytest.fixture
def s3(moto: str) -> Iterator[Rig]:
    yield from _s3_rig(moto)


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    # S3 parts are at least 5 MiB but the last (moto enforces it); Blob blocks may be small.
    monkeypatch.setattr(bucket, "PART_SIZE", 5 * MIB)
    monkeypatch.setattr(bucket, "BLOCK_SIZE", 5 * MIB)


def busy(rig: Rig, times: int, **kw: Any) -> Fault:
    code = "SlowDown" if rig.kind == "s3" else "ServerBusy"
    return Fault("status", times=times, status=503, code=code, flavour=rig.kind, **kw)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def nothing_named(dest: Path) -> bool:
    part = dest.with_name(dest.name + bucket.PART_SUFFIX)
    return not dest.exists() and not part.exists()


# ---------------------------------------------------------------------------- uploads


def test_every_upload_records_the_sha256_it_returns(rig: Rig, tmp_path: Path) -> None:
    data = os.urandom(3000)
    (tmp_path / "f").write_bytes(data)
    assert rig.store.upload_file("a/f", tmp_path / "f", 3000, rig.deadline()) == sha(data)
    assert rig.store.head_sha256("a/f", rig.deadline()) == sha(data)
    assert rig.store.head_sha256("a/absent", rig.deadline()) == ""
    puts = rig.proxy.requests("PUT")
    assert puts[-1].headers[rig.store.meta_header] == sha(data)
    assert "content-md5" in puts[-1].headers


def test_a_multipart_upload_records_the_sha256_and_a_damaged_download_of_it_is_caught(
    rig: Rig, tmp_path: Path, small_parts: None
) -> None:
    data = os.urandom(11 * MIB + 17)
    (tmp_path / "big").write_bytes(data)
    assert rig.store.upload_file("a/big", tmp_path / "big", len(data), rig.deadline()) == sha(data)
    assert rig.store.head_sha256("a/big", rig.deadline()) == sha(data)
    parts = [
        s for s in rig.proxy.requests("PUT") if "partNumber" in s.query or "blockid" in s.query
    ]
    assert len(parts) == 3 and all("content-md5" in s.headers for s in parts)
    # The second ranged GET gets one byte flipped, as a TLS-terminating gateway could.
    rig.proxy.add(Fault("flip_response", method="GET", path="/a/big", times=1, after=100))
    rig.proxy.add(Fault("flip_response", method="GET", path="/a/big", times=1, after=100))
    rig.proxy.faults[0].used = 1  # the first GET passes untouched
    dest = tmp_path / "out" / "big"
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/big", dest, len(data), rig.deadline())
    assert (err.value.code, err.value.cause) == ("Digest", "damaged")
    assert nothing_named(dest)
    got = rig.store.download_file("a/big", dest, len(data), rig.deadline())
    assert (got.sha256, got.checked, dest.read_bytes() == data) == (sha(data), "sha256", True)


def test_a_request_body_damaged_on_the_way_is_refused_by_the_store(rig: Rig) -> None:
    rig.proxy.add(Fault("flip_request", method="PUT", after=5))
    with pytest.raises(bucket.StoreError) as err:
        rig.put("a/x", b"checkpoint bytes")
    expected = "BadDigest" if rig.kind == "s3" else "Md5Mismatch"
    assert (err.value.code, err.value.status, err.value.cause) == (expected, 400, "damaged")
    assert rig.store.head("a/x", rig.deadline()) is None


def test_the_strict_front_refuses_a_body_that_does_not_match_its_sha256_alone(s3: Rig) -> None:
    # No Content-MD5: only the signed x-amz-content-sha256 can catch it, as in S3.
    s3.proxy.add(Fault("flip_request", method="PUT", after=0))
    with pytest.raises(bucket.StoreError) as err:
        s3.store.request("PUT", "a/y", body=b"weights", deadline=s3.deadline())
    assert (err.value.code, err.value.cause) == ("XAmzContentSHA256Mismatch", "damaged")


def test_a_file_that_changes_under_its_given_digest_is_never_recorded(
    rig: Rig, tmp_path: Path
) -> None:
    (tmp_path / "f").write_bytes(b"new bytes")
    with pytest.raises(bucket.StoreError) as err:
        rig.store.upload_file("a/f", tmp_path / "f", 9, rig.deadline(), sha256=sha(b"old bytes"))
    assert err.value.code == "Digest"
    assert rig.proxy.requests("PUT") == []


def test_a_denied_upload_is_final_and_says_denied(rig: Rig) -> None:
    code = "AccessDenied" if rig.kind == "s3" else "AuthorizationPermissionMismatch"
    rig.proxy.add(Fault("status", status=403, code=code, flavour=rig.kind, times=5))
    with pytest.raises(bucket.StoreError) as err:
        rig.put("a/x", b"data")
    assert (err.value.code, err.value.cause, len(rig.proxy.seen), rig.slept) == (
        code,
        "denied",
        1,
        [],
    )


# ---------------------------------------------------------------------------- downloads


def test_throttling_then_ok_succeeds_after_backing_off(rig: Rig, tmp_path: Path) -> None:
    data = os.urandom(5000)
    rig.put("a/x", data)
    rig.proxy.add(busy(rig, times=2, method="GET"))
    got = rig.store.download_file("a/x", tmp_path / "x", 5000, rig.deadline())
    assert (got.sha256, got.checked, (tmp_path / "x").read_bytes() == data) == (
        sha(data),
        "sha256",
        True,
    )
    assert rig.slept == [1.0, 2.0]  # the throttling ceilings, drawn at rng() = 1.0


def test_throttling_honours_retry_after_and_draws_its_jitter(rig: Rig, tmp_path: Path) -> None:
    rig.put("a/x", b"abc")
    draws = iter([0.25, 0.25])
    rig.store.retry_rng = lambda: next(draws)
    rig.proxy.add(busy(rig, times=1, method="GET", retry_after="3"))
    rig.proxy.add(busy(rig, times=1, method="GET"))
    rig.store.download_file("a/x", tmp_path / "x", 3, rig.deadline())
    # Retry-After: 3 outweighs the jittered 0.25 s; then a quarter of the 2 s ceiling.
    assert rig.slept == [3.0, 0.5]


def test_throttling_that_outlasts_the_tries_says_throttled_and_keeps_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    rig.put("a/x", b"abc")
    rig.proxy.add(busy(rig, times=10, method="GET"))
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/x", tmp_path / "x", 3, rig.deadline())
    assert (err.value.status, err.value.cause) == (503, "throttled")
    assert len(rig.gets()) == rig.store.attempts
    assert not (tmp_path / "x").exists()


def test_a_body_cut_short_continues_from_its_last_byte_with_if_match(
    rig: Rig, tmp_path: Path
) -> None:
    data = os.urandom(100_000)
    rig.put("a/x", data)
    rig.proxy.add(Fault("cut", method="GET", after=30_000))
    got = rig.store.download_file("a/x", tmp_path / "x", len(data), rig.deadline())
    assert (tmp_path / "x").read_bytes() == data and got.sha256 == sha(data)
    first, second = rig.gets()
    assert (first.fault, second.headers["range"]) == ("cut", "bytes=30000-99999")
    assert second.headers["if-match"].strip('"') == rig.store.head("a/x")["etag"].strip('"')


def test_a_damaged_body_never_takes_the_files_name_nor_replaces_the_old_file(
    rig: Rig, tmp_path: Path
) -> None:
    data = os.urandom(4096)
    rig.put("a/x", data)
    dest = tmp_path / "x"
    dest.write_bytes(b"the old, good file")
    rig.proxy.add(Fault("flip_response", method="GET", after=1000))
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/x", dest, len(data), rig.deadline())
    assert (err.value.code, err.value.cause) == ("Digest", "damaged")
    assert dest.read_bytes() == b"the old, good file"
    assert not dest.with_name("x" + bucket.PART_SUFFIX).exists()
    assert not dest.with_name("x" + bucket.SIDECAR_SUFFIX).exists()


def test_without_a_recorded_sha256_a_single_part_md5_is_checked(rig: Rig, tmp_path: Path) -> None:
    data = os.urandom(2048)
    rig.replace("a/plain", data)  # written by another tool: no META_SHA256
    got = rig.store.download_file("a/plain", tmp_path / "p", len(data), rig.deadline())
    assert (got.checked, got.sha256) == ("md5", sha(data))
    rig.proxy.add(Fault("flip_response", method="GET", after=7))
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/plain", tmp_path / "q", len(data), rig.deadline())
    assert err.value.code == "Digest" and nothing_named(tmp_path / "q")


def test_the_callers_sha256_outranks_the_recorded_one(rig: Rig, tmp_path: Path) -> None:
    rig.put("a/x", b"what the bucket has")
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file(
            "a/x", tmp_path / "x", 19, rig.deadline(), sha256=sha(b"what the manifest says")
        )
    assert err.value.code == "Digest" and nothing_named(tmp_path / "x")


def test_an_object_replaced_between_two_ranged_gets_starts_over_never_mixes(
    rig: Rig, tmp_path: Path
) -> None:
    old, new = os.urandom(50_000), os.urandom(50_000)  # same size: only If-Match tells
    rig.put("a/x", old)
    rig.proxy.add(Fault("cut", method="GET", after=20_000))
    rig.proxy.add(Fault("replace", method="GET", action=lambda: rig.replace("a/x", new)))
    got = rig.store.download_file("a/x", tmp_path / "x", len(new), rig.deadline())
    assert (tmp_path / "x").read_bytes() == new and got.sha256 == sha(new)
    statuses = [s.status for s in rig.gets()]
    assert statuses == [206, 412, 206]
    assert "if-match" not in rig.gets()[2].headers or rig.gets()[2].headers["if-match"]


def test_a_version_pinned_by_the_listing_that_is_gone_is_a_changed_error(
    rig: Rig, tmp_path: Path
) -> None:
    rig.put("a/x", b"version one")
    etag = rig.store.list_entries("a/")["a/x"].etag
    assert etag
    rig.replace("a/x", b"version two")
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/x", tmp_path / "x", 11, rig.deadline(), etag=etag)
    assert err.value.cause == "changed" and nothing_named(tmp_path / "x")


def test_a_part_file_is_continued_only_from_the_same_etag(rig: Rig, tmp_path: Path) -> None:
    data = os.urandom(60_000)
    rig.put("a/x", data)
    dest = tmp_path / "x"
    rig.proxy.add(
        Fault("cut", method="GET", after=25_000),
        Fault("status", status=403, code="AccessDenied", flavour=rig.kind, method="GET"),
    )
    with pytest.raises(bucket.StoreError):
        rig.store.download_file("a/x", dest, len(data), rig.deadline())
    part = dest.with_name("x" + bucket.PART_SUFFIX)
    assert part.stat().st_size == 25_000 and not dest.exists()
    rig.proxy.clear()
    rig.store.download_file("a/x", dest, len(data), rig.deadline())  # a rerun goes on
    assert dest.read_bytes() == data
    assert [s.headers["range"] for s in rig.gets()] == ["bytes=25000-59999"]
    # A part file whose sidecar names another version is asked for with that version's
    # ETag: the store answers 412, and it is thrown away, never continued.
    dest.unlink()
    part.write_bytes(data[:25_000])
    dest.with_name("x" + bucket.SIDECAR_SUFFIX).write_text(
        '{"key": "a/x", "size": 60000, "etag": "\\"other\\"", "sha256": "", "md5": ""}'
    )
    rig.proxy.clear()
    rig.store.download_file("a/x", dest, len(data), rig.deadline())
    assert dest.read_bytes() == data
    asked = [(s.headers["range"], s.headers.get("if-match"), s.status) for s in rig.gets()]
    assert asked[0] == ("bytes=25000-59999", '"other"', 412)
    assert asked[1][::2] == ("bytes=0-59999", 206)


def test_a_trickling_body_ends_in_bounded_time_as_too_slow(rig: Rig, tmp_path: Path) -> None:
    rig.put("a/x", os.urandom(1000))
    rig.store.min_rate, rig.store.rate_grace_s, rig.store.attempts = 100.0, 1.0, 2
    rig.proxy.add(Fault("trickle", method="GET", times=5, interval=0.3, max_seconds=30))
    started = time.monotonic()
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/x", tmp_path / "x", 1000, rig.deadline())
    took = time.monotonic() - started
    assert (err.value.code, err.value.cause) == ("TooSlow", "slow")
    assert "slower than 100 bytes/s" in str(err.value)
    assert took < 8, took
    assert nothing_named(tmp_path / "x") or not (tmp_path / "x").exists()


def test_a_trickle_within_the_rate_still_ends_at_the_deadline(rig: Rig, tmp_path: Path) -> None:
    rig.put("a/x", os.urandom(1000))
    rig.store.min_rate = 0.0
    rig.proxy.add(Fault("trickle", method="GET", times=5, interval=0.2, max_seconds=30))
    started = time.monotonic()
    with pytest.raises(bucket.StoreError) as err:
        rig.store.download_file("a/x", tmp_path / "x", 1000, time.monotonic() + 2)
    assert (err.value.code, err.value.cause) == ("Deadline", "deadline")
    assert time.monotonic() - started < 4
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------- part files


def test_sweep_parts_removes_old_part_files_and_sidecars_only(tmp_path: Path) -> None:
    old = tmp_path / "d" / ("a.bin" + bucket.PART_SUFFIX)
    side = tmp_path / "d" / ("a.bin" + bucket.SIDECAR_SUFFIX)
    young = tmp_path / ("b.bin" + bucket.PART_SUFFIX)
    data = tmp_path / "d" / "a.bin"
    old.parent.mkdir()
    for path in (old, side, young, data):
        path.write_bytes(b"x")
    hour_ago = time.time() - 3600
    for path in (old, side, data):
        os.utime(path, (hour_ago, hour_ago))
    assert bucket.sweep_parts(tmp_path, older_than_s=600) == 2
    assert (old.exists(), side.exists(), young.exists(), data.exists()) == (
        False,
        False,
        True,
        True,
    )
    assert bucket.sweep_parts(tmp_path / "absent", 0) == 0


@pytest.mark.parametrize(
    ("code", "status", "cause"),
    [
        ("SlowDown", 503, "throttled"),
        ("ServerBusy", 503, "throttled"),
        ("OperationTimedOut", 500, "throttled"),
        ("HTTP429", 429, "throttled"),
        ("AccessDenied", 403, "denied"),
        ("AuthorizationPermissionMismatch", 403, "denied"),
        ("InvalidAccessKeyId", 403, "credentials"),
        ("NoCredentials", 0, "credentials"),
        ("NoSuchKey", 404, "missing"),
        ("BlobNotFound", 404, "missing"),
        ("BadDigest", 400, "damaged"),
        ("Digest", 0, "damaged"),
        ("ConditionNotMet", 412, "changed"),
        ("TooSlow", 0, "slow"),
        ("Deadline", 0, "deadline"),
        ("Unreachable", 0, "unreachable"),
        ("InternalError", 500, "error"),
    ],
)
def test_each_failure_has_a_cause_a_person_can_act_on(code: str, status: int, cause: str) -> None:
    assert bucket.StoreError("x", code, status).cause == cause
    assert cause in bucket.CAUSES
