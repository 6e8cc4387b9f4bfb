"""Checkpoint versions against a moto S3 server on 127.0.0.1: a push is one version whose
manifest goes up last, a restore is all of one version or a clear error, and nothing wrong
ever takes a real name in the checkpoint folder."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_sync
from tests.support.moto_server import moto_server

# The node files import each other as top-level modules: job_sync's own bucket module (its
# StoreError is the one job_sync catches).
bucket = job_sync.bucket
PREFIX = "checkpoints/n0/j1/"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


_count = iter(range(10_000))


@pytest.fixture
def s3(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, bucket.BucketStore]:
    """A fresh bucket (boto3 client, the node's store for it)."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    name = f"ckpt-versions-{next(_count)}"
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    store = job_sync.make_store("aws", name, "us-east-1", moto_url)
    assert store is not None
    store.retry_sleep = lambda s: None
    return client, store


def folder(tmp_path: Path, node: str = "scratch") -> Path:
    root = tmp_path / node / "checkpoints" / "j1"
    root.mkdir(parents=True, exist_ok=True)
    return root


def save(root: Path, **files: bytes) -> None:
    """Write files as a script saves them, then make them old enough to be quiet."""
    for name, data in files.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old = time.time() - 60
    for path in root.rglob("*"):
        os.utime(path, (old, old))


def push(root: Path, store: bucket.BucketStore, **kw: Any) -> job_sync.SyncOutcome:
    return job_sync.push(root, store, "n0", prefix=PREFIX, **kw)


def keys(client: Any, store: bucket.BucketStore, under: str = "") -> list[str]:
    out = client.list_objects_v2(Bucket=store.bucket, Prefix=PREFIX + under)
    return sorted(o["Key"][len(PREFIX) :] for o in out.get("Contents", []))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- push


def test_a_push_is_a_version_and_an_unchanged_folder_sends_nothing_again(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"m" * 100, **{"checkpoint-300__optim.pt": b"o" * 50})
    out = push(root, store)
    assert out.ok and out.pushed and out.version == 1 and out.uploaded == 2, out
    assert out.newest_step == 300
    assert keys(client, store) == sorted(
        [
            f".gpufleet/objects/{sha(b'm' * 100)}",
            f".gpufleet/objects/{sha(b'o' * 50)}",
            ".gpufleet/versions/00000001.json",
        ]
    )
    doc = json.loads(
        client.get_object(Bucket=store.bucket, Key=PREFIX + ".gpufleet/versions/00000001.json")[
            "Body"
        ].read()
    )
    assert doc["files"]["model_pt"] == {"size": 100, "sha256": sha(b"m" * 100)}
    assert (doc["step"], doc["step_source"], doc["regressed"]) == (
        300,
        "name checkpoint-300",
        False,
    )
    again = push(root, store)
    assert again.ok and not again.pushed and again.uploaded == 0
    assert again.detail == "unchanged since version 1 (step 300)"
    # One file changes: only its new content is sent, as version 2.
    save(root, model_pt=b"M" * 100)
    second = push(root, store)
    assert (second.version, second.uploaded, second.bytes_sent) == (2, 1, 100), second


def test_an_unchanged_big_file_is_not_read_again_at_each_sync(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, big_bin=os.urandom(3_000_000))
    assert push(root, store).pushed
    cache = job_sync.DigestCache.load(job_sync.workspace(root) / "digests.json")
    cache.digest(root, "big_bin", job_sync.local_files(root)["big_bin"])
    assert cache.hashed_bytes == 0  # its (size, mtime_ns) is in the cache


def test_a_folder_still_being_written_waits_for_the_next_sync_unless_the_job_ended(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = folder(tmp_path)
    (root / "ckpt.pt").write_bytes(b"fresh")  # written just now
    out = push(root, store)
    assert out.ok and not out.pushed and "changing" in out.detail and "next sync" in out.detail
    assert keys(client, store) == []
    assert push(root, store, final=True).pushed  # the job ended: nothing is writing


def test_a_file_that_changes_while_it_is_uploaded_writes_no_version(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, store = s3
    root = folder(tmp_path)
    save(root, a_pt=b"a" * 10, b_pt=b"b" * 10)
    real = store.upload_file

    def rewriting(key: str, path: Path, size: int, deadline: float, sha256: str = "") -> str:
        if path.name == "a_pt":
            path.write_bytes(b"A" * 10)  # the script saves again meanwhile
        return real(key, path, size, deadline, sha256)

    monkeypatch.setattr(store, "upload_file", rewriting)
    out = push(root, store)
    assert out.ok and not out.pushed and "changing" in out.detail, out
    assert keys(client, store, ".gpufleet/versions/") == []


def test_an_empty_checkpoint_folder_says_the_job_wrote_nothing(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    out = push(folder(tmp_path), store)
    assert out.ok and out.wrote_nothing and not out.pushed
    assert out.detail.startswith("the job wrote nothing to its checkpoint folder")


def test_pushed_files_are_marked_in_the_watchdogs_record_of_scratch(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, ckpt_pt=b"c" * 10)
    assert push(root, store).pushed
    left = bucket.pending(tmp_path / "scratch", ("checkpoints",), "n0", store.bucket)
    assert left == []  # the watchdog's pre-stop save has nothing to send again


# ---------------------------------------------------------------------------- restore


def test_a_torn_upload_restores_the_previous_whole_version(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # model.pt + optim.pt rewritten in place; the node dies between the two uploads.
    _, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"model-1" * 10, optim_pt=b"optim-1" * 10)
    assert push(root, store).version == 1
    save(root, model_pt=b"model-2" * 10, optim_pt=b"optim-2" * 10)
    real = store.upload_file

    def cut(key: str, path: Path, size: int, deadline: float, sha256: str = "") -> str:
        if path.name == "optim_pt":
            raise bucket.StoreError("connection reset", code="Unreachable")
        return real(key, path, size, deadline, sha256)

    monkeypatch.setattr(store, "upload_file", cut)
    out = push(root, store)
    assert not out.ok and not out.pushed, out
    monkeypatch.setattr(store, "upload_file", real)
    fresh = folder(tmp_path, "other")
    back = job_sync.restore(fresh, store, PREFIX)
    assert back.ok and back.version == 1 and back.fetched == 2, back
    assert (fresh / "model_pt").read_bytes() == b"model-1" * 10
    assert (fresh / "optim_pt").read_bytes() == b"optim-1" * 10


def test_a_damaged_object_fails_the_restore_and_nothing_wrong_takes_a_name(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"good model" * 100, optim_pt=b"optimizer" * 100)
    assert push(root, store).pushed
    good = sha(b"good model" * 100)
    bad = bytearray(b"good model" * 100)
    bad[500] ^= 0x01  # one flipped bit at rest, its recorded digest kept
    client.put_object(
        Bucket=store.bucket,
        Key=f"{PREFIX}.gpufleet/objects/{good}",
        Body=bytes(bad),
        Metadata={bucket.META_SHA256: good},
    )
    fresh = folder(tmp_path, "other")
    back = job_sync.restore(fresh, store, PREFIX)
    assert not back.ok and back.cause == "damaged", back
    assert job_sync.local_files(fresh) == {}  # not even the good optim_pt: all or nothing
    line = job_sync.error_line(back.cause, back.detail)
    assert line.startswith("restore failed (damaged):") and "\n" not in line


def test_a_missing_object_fails_the_restore_with_cause_missing(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"weights")
    assert push(root, store).pushed
    client.delete_object(Bucket=store.bucket, Key=f"{PREFIX}.gpufleet/objects/{sha(b'weights')}")
    back = job_sync.restore(folder(tmp_path, "other"), store, PREFIX)
    assert not back.ok and back.cause == "missing", back


def test_a_damaged_local_copy_is_replaced_by_the_verified_one_and_set_aside(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"w" * 1000, optim_pt=b"o" * 1000)
    assert push(root, store).pushed
    # A flipped byte on the node's disk, size and mtime as they were (bit rot): the digest
    # cache must not vouch for it.
    st = (root / "model_pt").stat()
    with open(root / "model_pt", "r+b") as f:
        f.seek(10)
        f.write(b"X")
    os.utime(root / "model_pt", ns=(st.st_atime_ns, st.st_mtime_ns))
    back = job_sync.restore(root, store, PREFIX)
    assert back.ok and (back.fetched, back.kept) == (1, 1), back
    assert (root / "model_pt").read_bytes() == b"w" * 1000
    aside = Path(back.aside)
    assert aside.is_dir() and (aside / "model_pt").read_bytes()[10:11] == b"X"
    assert not aside.is_relative_to(root)  # outside the folder the watchdog syncs


def test_a_version_that_regressed_is_never_restored(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = folder(tmp_path)
    save(root, **{"checkpoint-400__model.pt": b"400"})
    assert push(root, store).newest_step == 400
    # The next attempt restored step 400, ignored it and wrote checkpoint-100.
    save(root, **{"checkpoint-100__model.pt": b"100"})
    out = push(root, store, restored_from={"version": 1, "step": 400}, attempt=2)
    assert out.pushed and out.regressed and out.version == 2, out
    assert "below step 400" in out.note and "REGRESSED" in out.detail
    doc = json.loads(
        client.get_object(Bucket=store.bucket, Key=PREFIX + ".gpufleet/versions/00000002.json")[
            "Body"
        ].read()
    )
    assert doc["regressed"] is True and doc["restored_from"] == {"seq": 1, "step": 400}
    fresh = folder(tmp_path, "other")
    back = job_sync.restore(fresh, store, PREFIX)
    assert back.version == 1 and back.step == 400
    assert not (fresh / "checkpoint-100").exists()
    assert job_sync.newest_restorable(store, PREFIX) == {
        "seq": 1,
        "step": 400,
        "files": 1,
        "bytes": 3,
    }


def test_two_restores_into_one_folder_take_turns_and_the_second_keeps_everything(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, a_pt=os.urandom(200_000), b_pt=os.urandom(200_000))
    assert push(root, store).pushed
    shared = folder(tmp_path, "shared-disk")
    results: list[job_sync.RestoreOutcome] = []
    threads = [
        threading.Thread(target=lambda: results.append(job_sync.restore(shared, store, PREFIX)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.ok for r in results), results
    assert sorted((r.fetched, r.kept) for r in results) == [(0, 2), (2, 0)]
    assert (shared / "a_pt").read_bytes() == (root / "a_pt").read_bytes()


def test_no_version_in_the_bucket_reuses_the_local_folder_and_says_so(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, snapshot_pt=b"local")
    back = job_sync.restore(root, store, PREFIX)
    assert back.ok and back.version is None and back.files == 1
    assert (
        back.detail == "no checkpoint version in the bucket: the local folder is reused (1 file(s))"
    )


def test_a_torch_distributed_checkpoint_comes_back_whole_with_its_hidden_index(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    # torch.distributed.checkpoint writes its index as ".metadata" beside the shards.
    import torch
    import torch.distributed.checkpoint as dcp

    _, store = s3
    root = folder(tmp_path)
    state = {"w": torch.arange(12.0).reshape(3, 4)}
    with pytest.warns(UserWarning):  # no process group: DCP says it saves as one process
        dcp.save(state, checkpoint_id=str(root / "latest"))
    (root / ".tmp-step-3").mkdir()  # a save in progress is not the job's folder
    (root / ".tmp-step-3" / "half.distcp").write_bytes(b"x")
    save(root)
    assert push(root, store).pushed
    fresh = folder(tmp_path, "replaced")
    back = job_sync.restore(fresh, store, PREFIX)
    assert back.ok and back.fetched == len(list((root / "latest").iterdir())), back
    assert (fresh / "latest" / ".metadata").is_file()
    assert not (fresh / ".tmp-step-3").exists()
    loaded = {"w": torch.zeros(3, 4)}
    with pytest.warns(UserWarning):
        dcp.load(loaded, checkpoint_id=str(fresh / "latest"))
    assert torch.equal(loaded["w"], state["w"])


def test_part_files_a_killed_transfer_left_are_swept_by_the_next_restore(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"m")
    assert push(root, store).pushed
    staging = job_sync.workspace(root) / "staging"
    staging.mkdir(parents=True)
    stale = [root / ("old.bin" + bucket.PART_SUFFIX), staging / ("x.pt" + bucket.PART_SUFFIX)]
    young = root / ("new.bin" + bucket.PART_SUFFIX)
    for path in [*stale, young]:
        path.write_bytes(b"half")
    day_ago = time.time() - 86400
    for path in stale:
        os.utime(path, (day_ago, day_ago))
    assert job_sync.restore(root, store, PREFIX).ok
    assert not any(p.exists() for p in stale) and young.exists()
    assert "new.bin" + bucket.PART_SUFFIX not in job_sync.local_files(root)


def test_one_push_at_a_time_on_a_node_whatever_the_job(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    _, store = s3
    root = folder(tmp_path)
    save(root, model_pt=b"m")
    other_job = job_sync.workspace(root.parent / "j2")
    with job_sync.flock(other_job.parent / "push.lock", 1, "test"):  # j2's push is running
        out = push(root, store, deadline_s=0.3)
    assert not out.ok and "another checkpoint push on this node" in out.detail, out
    assert push(root, store).pushed  # once it is done
