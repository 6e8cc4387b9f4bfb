"""The node side of ``fab data-*`` (gpufleet_node/data_sync.py): a folder to and from the
bucket through the watchdog's own client. Moto's S3 stands for S3 and for OSS's and COS's
S3-compatible endpoints (each cloud's node module with its own environment keys), the
watchdog tests' local fake for Azure Blob; what moto proves is our requests and matching,
not that OSS or COS accept them (only a real bucket does)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet_node import data_sync, job_sync
from tests.gpufleet_node.test_verify_node import S3_CLOUDS
from tests.gpufleet_node.test_watchdog_azure import (  # noqa: F401 (the fixture)
    ACCOUNT,
    CONTAINER,
    REGION,
    FakeAzureNode,
    azure,
)
from tests.support.moto_server import moto_server

REMOTE = Path(data_sync.__file__).resolve().parent
# The bucket module as the node files import it (side by side), whose globals they read.
bucket = job_sync.bucket
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


def client(url: str) -> Any:
    return boto3.client(
        "s3", region_name="us-east-1", endpoint_url=url,
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


def folder(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".gpufleet-")
    }


def a_dataset(root: Path) -> Path:
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "0.bin").write_bytes(os.urandom(200_000))
    (root / "meta.json").write_text('{"rows": 2}')
    return root


# ---------------------------------------------------------------------------- matching


def test_a_multipart_etag_is_matched_by_the_md5s_of_its_parts(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = os.urandom(11 * MIB)
    path.write_bytes(data)
    md5 = hashlib.md5(data).hexdigest()
    five = data_sync.multipart_etag(path, 5 * MIB)
    assert five.endswith("-3")
    assert data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data), five))
    eight = data_sync.multipart_etag(path, 8 * MIB)  # the aws CLI's default parts
    assert data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data), eight))
    assert data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data), md5))
    # An ETag that is no MD5 (SSE-KMS), another size, or none: not the same bytes.
    kms = "a" * 32
    assert not data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data), kms))
    assert not data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data) + 1, md5))
    assert not data_sync.same_bytes(path, md5, len(data), bucket.Entry(len(data), ""))


# ---------------------------------------------------------------------------- S3 family


@pytest.mark.integration
@pytest.mark.parametrize("provider", sorted(S3_CLOUDS))
def test_a_folder_goes_up_and_down_with_each_clouds_own_keys_and_moves_once(
    moto_s3: str, provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"gpufleet-data-{provider}"
    client(moto_s3).create_bucket(Bucket=name)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)  # only this cloud's own keys are there
    key_id, secret = S3_CLOUDS[provider]
    monkeypatch.setenv(key_id, "testing")
    monkeypatch.setenv(secret, "testing")
    store = job_sync.make_store(provider, name, "us-east-1", moto_s3)
    assert store is not None
    src = a_dataset(tmp_path / "src")

    up = data_sync.upload(src, store, "data/set")
    assert (up["ok"], up["moved"], up["kept"]) == (True, 2, 0), up
    again = data_sync.upload(src, store, "data/set")
    assert (again["moved"], again["kept"]) == (0, 2), again

    dest = tmp_path / "node" / "data" / "set"
    down = data_sync.fetch(dest, store, "data/set/")
    assert (down["ok"], down["moved"], down["bytes"]) == (True, 2, 200_000 + 11), down
    assert folder(dest) == folder(src)
    # No record, no digest cache: the ETags alone say the bytes are there.
    for ours in (data_sync.RECORD, data_sync.DIGESTS):
        (dest / ours).unlink()
    twice = data_sync.fetch(dest, store, "data/set/")
    assert (twice["moved"], twice["kept"]) == (0, 2), twice


def aws_store(moto_s3: str, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    client(moto_s3).create_bucket(Bucket=name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = job_sync.make_store("aws", name, "us-east-1", moto_s3)
    assert store is not None
    return store


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def multipart_put(moto_s3: str, name: str, key: str, data: bytes, **extra: Any) -> None:
    """As ``aws s3 cp`` uploads a large file: multipart (its ETag "<md5 of md5s>-N")."""
    from boto3.s3.transfer import TransferConfig

    five = 5 * MIB
    client(moto_s3).upload_fileobj(
        __import__("io").BytesIO(data), name, key, ExtraArgs=extra or None,
        Config=TransferConfig(multipart_threshold=five, multipart_chunksize=five),
    )  # fmt: skip
    assert client(moto_s3).head_object(Bucket=name, Key=key)["ETag"].endswith('-3"')


def no_parts(root: Path) -> list[str]:
    return [p.name for p in root.rglob(f"*{bucket.PART_SUFFIX}")]


@pytest.mark.integration
def test_an_upload_records_each_sha256_and_writes_its_manifest_last_and_only_when_it_changed(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = aws_store(moto_s3, "gpufleet-data-manifest", monkeypatch)
    src = a_dataset(tmp_path / "src")
    writes: list[str] = []
    depth = [0]  # upload_file may PUT through put: one write each
    for name in ("put", "upload_file"):
        real = getattr(store, name)

        def spy(key: str, *args: Any, _real: Any = real, **kw: Any) -> Any:
            if not depth[0]:
                writes.append(key)
            depth[0] += 1
            try:
                return _real(key, *args, **kw)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(store, name, spy)
    assert data_sync.upload(src, store, "data/m")["ok"]
    manifest_key = "data/m/" + data_sync.MANIFEST
    assert writes[-1] == manifest_key and len(writes) == 3, writes
    s3 = client(moto_s3)
    for rel, data in folder(src).items():
        head = s3.head_object(Bucket="gpufleet-data-manifest", Key=f"data/m/{rel}")
        assert head["Metadata"][bucket.META_SHA256] == sha(data)
    body = s3.get_object(Bucket="gpufleet-data-manifest", Key=manifest_key)["Body"].read()
    files = data_sync.parse_manifest(body)
    assert {rel: f["sha256"] for rel, f in files.items()} == {
        rel: sha(data) for rel, data in folder(src).items()
    }
    listed = s3.list_objects_v2(Bucket="gpufleet-data-manifest", Prefix="data/m/")["Contents"]
    etags = {o["Key"][len("data/m/") :]: o["ETag"] for o in listed}
    assert all(files[rel]["etag"] == etags[rel] for rel in files)

    writes.clear()
    assert data_sync.upload(src, store, "data/m")["kept"] == 2
    assert writes == []  # nothing moved, the manifest as it was: no request writes
    (src / "meta.json").write_text('{"rows": 3}')
    assert data_sync.upload(src, store, "data/m")["moved"] == 1
    assert writes == ["data/m/meta.json", manifest_key]


@pytest.mark.integration
def test_a_fetch_refuses_bytes_unlike_the_recorded_sha256_and_keeps_nothing_under_the_name(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "gpufleet-data-damaged"
    store = aws_store(moto_s3, name, monkeypatch)
    small, big = os.urandom(1000), os.urandom(11 * MIB)
    s3 = client(moto_s3)
    # What a damaged object looks like from the node: its bytes are not the ones whose
    # SHA-256 was recorded (a multipart one too, whose ETag is no MD5).
    s3.put_object(Bucket=name, Key="data/d/small.bin", Body=small,
                  Metadata={bucket.META_SHA256: sha(b"other")})  # fmt: skip
    multipart_put(moto_s3, name, "data/d/big.bin", big,
                  Metadata={bucket.META_SHA256: sha(b"other")})  # fmt: skip
    dest = tmp_path / "d"
    for _ in range(2):  # and again: a rerun never keeps it either
        bad = data_sync.fetch(dest, store, "data/d/")
        assert not bad["ok"] and bad["error"].startswith("damaged: "), bad
        assert "run it again" in bad["error"] and "\n" not in bad["error"]
        assert folder(dest) == {}
        assert no_parts(dest) == []

    # The bucket made right: the same fetch finishes, each file checked by its SHA-256.
    s3.put_object(Bucket=name, Key="data/d/small.bin", Body=small,
                  Metadata={bucket.META_SHA256: sha(small)})  # fmt: skip
    multipart_put(moto_s3, name, "data/d/big.bin", big, Metadata={bucket.META_SHA256: sha(big)})
    good = data_sync.fetch(dest, store, "data/d/")
    assert good["ok"] and good["size_only"] == 0, good
    assert folder(dest) == {"big.bin": big, "small.bin": small}
    record = json.loads((dest / data_sync.RECORD).read_text())["keys"]
    assert {k: v["checked"] for k, v in record.items()} == {
        "data/d/big.bin": "sha256",
        "data/d/small.bin": "sha256",
    }


@pytest.mark.integration
def test_the_manifest_vouches_for_a_multipart_object_and_a_wrong_entry_is_refused(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "gpufleet-data-mp"
    store = aws_store(moto_s3, name, monkeypatch)
    monkeypatch.setattr(bucket, "PART_SIZE", 5 * MIB)  # our own upload is multipart
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(11 * MIB)
    (src / "big.bin").write_bytes(big)
    assert data_sync.upload(src, store, "data/mp")["ok"]
    s3 = client(moto_s3)
    assert s3.head_object(Bucket=name, Key="data/mp/big.bin")["ETag"].endswith('-3"')
    dest = tmp_path / "d"
    down = data_sync.fetch(dest, store, "data/mp")
    assert down["ok"] and down["size_only"] == 0 and (dest / "big.bin").read_bytes() == big

    # A manifest whose entry names this very object (its ETag) but other bytes: refused,
    # though the object's own metadata is right: the manifest is what a fetch trusts.
    key = "data/mp/" + data_sync.MANIFEST
    doc = json.loads(s3.get_object(Bucket=name, Key=key)["Body"].read())
    doc["files"]["big.bin"]["sha256"] = sha(b"other")
    s3.put_object(Bucket=name, Key=key, Body=json.dumps(doc).encode())
    shutil.rmtree(dest)
    bad = data_sync.fetch(dest, store, "data/mp")
    assert not bad["ok"] and bad["error"].startswith("damaged: ") and folder(dest) == {}, bad


@pytest.mark.integration
def test_objects_another_tool_wrote_without_a_digest_are_counted_as_checked_by_size_only(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "gpufleet-data-foreign"
    store = aws_store(moto_s3, name, monkeypatch)
    big = os.urandom(11 * MIB)
    multipart_put(moto_s3, name, "data/f/big.bin", big)  # no metadata, no MD5 ETag
    client(moto_s3).put_object(Bucket=name, Key="data/f/one.txt", Body=b"one")  # MD5 ETag
    dest = tmp_path / "d"
    down = data_sync.fetch(dest, store, "data/f")
    assert (down["ok"], down["moved"], down["size_only"]) == (True, 2, 1), down
    again = data_sync.fetch(dest, store, "data/f")
    assert (again["moved"], again["kept"], again["size_only"]) == (0, 2, 1), again


@pytest.mark.integration
def test_a_rerun_compares_what_is_there_by_sha256_not_by_its_size_and_mtime(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = aws_store(moto_s3, "gpufleet-data-rerun", monkeypatch)
    monkeypatch.setattr(bucket, "PART_SIZE", 5 * MIB)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(11 * MIB))  # multipart: its ETag is no MD5
    assert data_sync.upload(src, store, "data/r")["ok"]
    dest = tmp_path / "d"
    assert data_sync.fetch(dest, store, "data/r")["moved"] == 1
    # Damaged in place, size and mtime as they were; the digest cache gone (a new disk
    # image, a copy): the record of the last fetch alone would keep it forever.
    path = dest / "big.bin"
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(5 * MIB)
        f.write(b"\x00" * 7)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    (dest / data_sync.DIGESTS).unlink()
    again = data_sync.fetch(dest, store, "data/r")
    assert (again["moved"], again["kept"]) == (1, 0), again
    assert folder(dest) == folder(src)


def cut_after_first_get(store: Any, monkeypatch: pytest.MonkeyPatch, key: str) -> list[str]:
    """The second ranged GET of ``key`` fails for good (403): a fetch cut half way, its part
    file and sidecar left; every GET's Range is noted."""
    real = store.request
    ranges: list[str] = []

    def request(method: str, k: str, **kw: Any) -> Any:
        if method == "GET" and k == key:
            headers = kw["headers"]
            ranges.append((headers() if callable(headers) else headers)["Range"])
            if len(ranges) == 2:
                raise bucket.StoreError(f"GET {k}: AccessDenied", "AccessDenied", 403)
        return real(method, k, **kw)

    monkeypatch.setattr(store, "request", request)
    return ranges


@pytest.mark.integration
@pytest.mark.parametrize("replaced", [False, True])
def test_a_cut_download_goes_on_only_from_the_same_object(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replaced: bool
) -> None:
    name = f"gpufleet-data-cut-{int(replaced)}"
    store = aws_store(moto_s3, name, monkeypatch)
    monkeypatch.setattr(bucket, "PART_SIZE", MIB)  # three ranged GETs
    old, new = os.urandom(3 * MIB), os.urandom(3 * MIB)  # the same size
    s3 = client(moto_s3)
    s3.put_object(Bucket=name, Key="data/c/x.bin", Body=old)
    dest = tmp_path / "d"
    with monkeypatch.context() as m:
        cut_after_first_get(store, m, "data/c/x.bin")
        cut = data_sync.fetch(dest, store, "data/c")
    assert not cut["ok"] and cut["error"].startswith("denied: "), cut
    assert not (dest / "x.bin").exists() and len(no_parts(dest)) == 2  # part + sidecar
    if replaced:
        s3.put_object(Bucket=name, Key="data/c/x.bin", Body=new)
    again = data_sync.fetch(dest, store, "data/c")
    assert again["ok"], again
    assert (dest / "x.bin").read_bytes() == (new if replaced else old)
    assert no_parts(dest) == []


@pytest.mark.integration
def test_a_cut_download_of_the_same_object_asks_only_for_the_rest(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = aws_store(moto_s3, "gpufleet-data-rest", monkeypatch)
    monkeypatch.setattr(bucket, "PART_SIZE", MIB)
    data = os.urandom(3 * MIB)
    client(moto_s3).put_object(Bucket="gpufleet-data-rest", Key="data/c/x.bin", Body=data)
    dest = tmp_path / "d"
    with monkeypatch.context() as m:
        cut_after_first_get(store, m, "data/c/x.bin")
        assert not data_sync.fetch(dest, store, "data/c")["ok"]
    seen: list[str] = []
    real = store.request

    def request(method: str, k: str, **kw: Any) -> Any:
        if method == "GET" and k == "data/c/x.bin":
            headers = kw["headers"]
            seen.append((headers() if callable(headers) else headers)["Range"])
        return real(method, k, **kw)

    monkeypatch.setattr(store, "request", request)
    assert data_sync.fetch(dest, store, "data/c")["ok"]
    assert seen[0] == f"bytes={MIB}-{2 * MIB - 1}", seen
    assert (dest / "x.bin").read_bytes() == data


def test_part_files_of_a_killed_run_go_after_an_hour_and_young_ones_stay(tmp_path: Path) -> None:
    root = tmp_path / "set"
    root.mkdir()
    old = root / f"a.bin.1234abcd{bucket.PART_SUFFIX}"
    young = root / f"b.bin.5678ef01{bucket.PART_SUFFIX}"
    for p in (old, young):
        p.write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    out = data_sync.prepare(root, [])
    assert out["ok"] and out["swept"] == 1 and out["files"] == {}
    assert not old.exists() and young.exists()


def test_waiting_for_a_folder_another_run_holds_ends_at_the_deadline(tmp_path: Path) -> None:
    import fcntl

    root = tmp_path / "set"
    lock = tmp_path / f".gpufleet-lock-{root.name}"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        with (
            pytest.raises(bucket.StoreError) as err,
            data_sync.folder_lock(root, time.monotonic() + 0.5),
        ):
            pass
        assert time.monotonic() - started < 3
        assert err.value.cause == "deadline" and "another data-* run" in str(err.value)
    with data_sync.folder_lock(root, time.monotonic() + 0.5):
        pass  # free again


def test_a_failure_is_one_line_with_its_cause_and_what_to_do() -> None:
    slow = bucket.StoreError("GET k: 10 bytes in 31 s, slower than\n100 bytes/s", "TooSlow")
    line = data_sync.failure(slow, "2 fetched, 0 already here")
    assert line.startswith("slow: GET k: 10 bytes in 31 s, slower than 100 bytes/s (2 fetched")
    assert line.endswith("or lower --min-rate") and "\n" not in line
    full = OSError(28, "No space left on device")
    assert data_sync.failure(full, "0 fetched").startswith("disk: ")


def test_the_rate_options_reach_the_bucket_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    made = bucket.Store("b", "us-east-1", lambda: None, "http://127.0.0.1:9")
    monkeypatch.setattr(job_sync, "make_store", lambda *a: made)
    args = argparse.Namespace(provider="aws", bucket="b", region="us-east-1", s3_endpoint="",
                              min_rate=5000.0, rate_grace=2.0)  # fmt: skip
    store = data_sync._store(args)
    assert (store.min_rate, store.rate_grace_s) == (5000.0, 2.0)


@pytest.mark.integration
def test_the_shipped_files_alone_fetch_with_the_environment_from_stdin(
    moto_s3: str, tmp_path: Path
) -> None:
    s3 = client(moto_s3)
    s3.create_bucket(Bucket="gpufleet-data-alone")
    s3.put_object(Bucket="gpufleet-data-alone", Key="data/a/one.txt", Body=b"one")
    from bootstrap.fleet import node_package
    from bootstrap.train.steps import REMOTE_FILES

    alone = tmp_path / "bin"  # what fab train ships: bin-<sha>/gpufleet_node/...
    for name in REMOTE_FILES:
        (alone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(node_package.source(name), alone / name)
    doc = {"env": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "gpufleet_node.data_sync", "fetch", "--root",
         str(tmp_path / "dest"), "--prefix", "data/a/", "--bucket", "gpufleet-data-alone",
         "--provider", "aws", "--region", "us-east-1", "--s3-endpoint", moto_s3],
        input=json.dumps(doc), capture_output=True, text=True, timeout=60, cwd=alone,
        env={"PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    *progress, answer = done.stdout.strip().splitlines()
    assert json.loads(answer)["moved"] == 1 and progress[-1].startswith("progress 3 3 ")
    assert (tmp_path / "dest" / "one.txt").read_bytes() == b"one"
    # The keys came on stdin, never on the command line where ps shows them.
    assert "testing" not in " ".join(map(str, done.args))


# ---------------------------------------------------------------------------- Azure Blob


@pytest.mark.integration
def test_blob_up_and_down_and_a_listing_without_md5_is_known_by_the_record(
    azure: tuple[FakeAzureNode, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    fake, url = azure
    store = job_sync.make_store("azure", f"{ACCOUNT}/{CONTAINER}", REGION, url, url)
    assert isinstance(store, bucket.BlobStore)
    src = a_dataset(tmp_path / "src")
    up = data_sync.upload(src, store, "data/set/")
    assert (up["ok"], up["moved"]) == (True, 2), up
    assert fake.blobs["data/set/meta.json"] == b'{"rows": 2}'

    dest = tmp_path / "node"
    # The fake answers a ranged Get Blob with the whole blob (200): taken whole.
    down = data_sync.fetch(dest, store, "data/set/")
    assert (down["ok"], down["moved"]) == (True, 2), down
    assert folder(dest) == folder(src)
    # Its listing carries no Content-MD5: the record of the last fetch says what is here.
    again = data_sync.fetch(dest, store, "data/set/")
    assert (again["moved"], again["kept"]) == (0, 2), again
    (dest / data_sync.RECORD).unlink()
    blind = data_sync.fetch(dest, store, "data/set/")
    assert blind["moved"] == 2 and folder(dest) == folder(src), blind
    assert data_sync.upload(src, store, "data/set/")["kept"] == 2


def test_a_bucket_without_its_cloud_is_one_line_from_the_node_not_a_default_cloud(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 23: --provider used to default to aws (no default cloud is guessed).
    import io

    from tests.gpufleet_node.watchdog_fakes import closed_port

    monkeypatch.setattr(sys, "stdin", io.StringIO("{}"))
    argv = ["fetch", "--root", str(tmp_path / "d"), "--prefix", "data/x/", "--bucket", "b"]
    argv += ["--region", "us-east-1", "--s3-endpoint", closed_port()]
    assert data_sync.main(argv) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer == {
        "ok": False,
        "error": "bucket 'b' comes without its provider: the job spec (fab train records "
        "the stack's) must name the cloud and region it is in",
    }


@pytest.mark.integration
def test_blob_datasets_are_checked_by_sha256_through_the_manifest_and_damage_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.blob_fake import ACCOUNT as ACCT
    from tests.support.blob_fake import CONTAINER as CONT
    from tests.support.blob_fake import CREDS as BLOB_CREDS
    from tests.support.blob_fake import blob_fake
    from tests.support.fault_proxy import Fault, fault_proxy

    monkeypatch.setattr(bucket, "BLOCK_SIZE", MIB)  # big.bin goes as blocks: no Content-MD5
    with blob_fake() as (fake, url), fault_proxy(url) as proxy:
        store = bucket.BlobStore.for_node(
            endpoint="https://unused.invalid", region="eastus", bucket=f"{ACCT}/{CONT}",
            credentials=lambda: dict(BLOB_CREDS), endpoint_url=proxy.url,
        )  # fmt: skip
        src = a_dataset(tmp_path / "src")
        (src / "big.bin").write_bytes(os.urandom(3 * MIB))
        up = data_sync.upload(src, store, "data/b")
        assert (up["ok"], up["moved"]) == (True, 3), up
        assert fake.blobs["data/b/big.bin"].meta  # its SHA-256, as metadata
        files = data_sync.parse_manifest(fake.blobs["data/b/" + data_sync.MANIFEST].data)
        assert sorted(files) == ["big.bin", "meta.json", "shards/0.bin"]
        assert data_sync.upload(src, store, "data/b")["kept"] == 3  # by SHA-256

        dest = tmp_path / "d"
        proxy.add(Fault("flip_response", method="GET", path=r"/data/b/big\.bin$",
                        after=MIB + 3, times=5))  # fmt: skip
        bad = data_sync.fetch(dest, store, "data/b")
        assert not bad["ok"] and bad["error"].startswith("damaged: "), bad
        assert not (dest / "big.bin").exists() and no_parts(dest) == []
        proxy.clear()
        good = data_sync.fetch(dest, store, "data/b")
        assert good["ok"] and good["size_only"] == 0 and folder(dest) == folder(src), good

        # Another writer replaces a blob (new ETag, no metadata): the manifest no longer
        # describes it; Put Blob's Content-MD5 checks it, and the rerun fetches it.
        fake.replace("data/b/meta.json", b'{"rows": 9}')
        again = data_sync.fetch(dest, store, "data/b")
        assert (again["moved"], again["kept"], again["size_only"]) == (1, 2, 0), again
        assert (dest / "meta.json").read_bytes() == b'{"rows": 9}'
