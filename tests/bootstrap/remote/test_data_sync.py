"""The node side of ``fab data-*`` (bootstrap/remote/data_sync.py): a folder to and from the
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from bootstrap.remote import data_sync, job_sync
from tests.bootstrap.remote.test_verify_node import S3_CLOUDS
from tests.bootstrap.remote.test_watchdog_azure import (  # noqa: F401 (the fixture)
    ACCOUNT,
    CONTAINER,
    REGION,
    FakeAzureNode,
    azure,
)

REMOTE = Path(data_sync.__file__).resolve().parent
# The bucket module as the node files import it (side by side), whose globals they read.
bucket = job_sync.bucket
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


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


@pytest.mark.integration
def test_a_cut_off_download_goes_on_from_its_part_and_the_digest_refuses_bad_bytes(
    moto_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = client(moto_s3)
    s3.create_bucket(Bucket="gpufleet-data-cut")
    data = os.urandom(3 * MIB)
    s3.put_object(Bucket="gpufleet-data-cut", Key="data/cut/x.bin", Body=data)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(bucket, "PART_SIZE", MIB)  # three ranged GETs
    store = job_sync.make_store("aws", "gpufleet-data-cut", "us-east-1", moto_s3)
    assert store is not None
    dest = tmp_path / "d"
    dest.mkdir()
    part = dest / f"x.bin{bucket.PART_SUFFIX}"
    # The part on disk holds other bytes than the object: kept, the rest fetched after it.
    part.write_bytes(b"X" * MIB)
    store.download_file("data/cut/x.bin", dest / "x.bin", len(data), deadline=1e12)
    got = (dest / "x.bin").read_bytes()
    assert got[:MIB] == b"X" * MIB and got[MIB:] == data[MIB:] and not part.exists()

    # A fetch checks what it read against the ETag: refused, removed, then fetched whole.
    (dest / "x.bin").unlink()
    part.write_bytes(b"X" * MIB)
    bad = data_sync.fetch(dest, store, "data/cut/")
    assert not bad["ok"] and "do not match its digest" in bad["error"], bad
    assert not (dest / "x.bin").exists()
    good = data_sync.fetch(dest, store, "data/cut/")
    assert good["ok"] and (dest / "x.bin").read_bytes() == data, good


@pytest.mark.integration
def test_the_shipped_files_alone_fetch_with_the_environment_from_stdin(
    moto_s3: str, tmp_path: Path
) -> None:
    s3 = client(moto_s3)
    s3.create_bucket(Bucket="gpufleet-data-alone")
    s3.put_object(Bucket="gpufleet-data-alone", Key="data/a/one.txt", Body=b"one")
    alone = tmp_path / "bin"
    shutil.copytree(REMOTE / "clouds", alone / "clouds")
    for name in ("data_sync.py", "job_sync.py", "bucket.py", "fleet_names.py"):
        shutil.copy(REMOTE / name, alone / name)
    doc = {"env": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
    done = subprocess.run(
        [sys.executable, "-S", "-E", str(alone / "data_sync.py"), "fetch", "--root",
         str(tmp_path / "dest"), "--prefix", "data/a/", "--bucket", "gpufleet-data-alone",
         "--provider", "aws", "--region", "us-east-1", "--s3-endpoint", moto_s3],
        input=json.dumps(doc), capture_output=True, text=True, timeout=60,
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

    from tests.bootstrap.remote.watchdog_fakes import closed_port

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
