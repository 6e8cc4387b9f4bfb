"""The job's checkpoints on the node side: the newest complete one, the watchdog's sync to
the bucket, and the restore (moto on 127.0.0.1 plays the bucket)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.remote import job_sync


def marker(files: dict[str, int], step: int = 0) -> str:
    return json.dumps({"step": step, "files": files})


def test_the_newest_complete_checkpoint_wins_and_half_written_ones_are_skipped() -> None:
    listing = {
        "step-10/model.pt": 100,
        "step-10/COMPLETE": 30,
        "step-20/model.pt": 100,
        "step-20/COMPLETE": 30,
        "step-30/model.pt": 40,
        "step-30/COMPLETE": 30,  # cut off: marker says 100
        "step-40/model.pt": 100,  # no marker yet
        "notes.txt": 5,
    }
    markers = {f"step-{s}": marker({"model.pt": 100}, s) for s in (10, 20, 30)}
    best = job_sync.newest_complete(listing, markers.get)
    assert best is not None and best.folder == "step-20" and best.step == 20


def test_a_marker_that_is_not_json_or_lists_escaping_paths_is_not_complete() -> None:
    assert job_sync.parse_marker("{not json") is None
    assert job_sync.parse_marker(json.dumps({"files": {"../x": 1}})) is None
    assert job_sync.parse_marker(json.dumps({"files": {}})) is None


class DictStore:
    """An in-memory bucket with the Store protocol (moto covers the real HTTP elsewhere)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def list(self, prefix: str) -> dict[str, int]:
        return {k: len(v) for k, v in self.objects.items() if k.startswith(prefix)}

    def get(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.objects[key])

    def put(self, source: Path, key: str) -> None:
        self.objects[key] = source.read_bytes()

    def push(self, root: Path, prefix: str) -> None:
        for rel in job_sync.local_listing(root):
            self.put(root / rel, f"{prefix}{rel}")


def write_checkpoint(root: Path, step: int, payload: bytes, *, complete: bool = True) -> None:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(payload)
    if complete:
        (folder / "COMPLETE").write_text(marker({"model.pt": len(payload)}, step))


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_bucket(moto_url: str, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A fresh bucket in moto, with the test keys the node's client signs with."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=name)


def test_the_watchdogs_sync_uploads_a_job_and_restore_fetches_only_the_newest(
    tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_bucket(moto_url, monkeypatch, "ckpt-roundtrip")
    node = tmp_path / "scratch" / "checkpoints" / "j1"
    write_checkpoint(node, 10, b"a" * 10)
    write_checkpoint(node, 20, b"b" * 20)
    store = job_sync.make_store("aws", "ckpt-roundtrip", "us-east-1", moto_url)
    assert store is not None
    out = job_sync.push(node, store, "n0")
    assert out.ok and out.uploaded == 4 and out.newest_step == 20, out
    assert job_sync.push(node, store, "n0").uploaded == 0  # the record says all is saved

    reader = job_sync.BucketReader(store)
    assert set(reader.list("checkpoints/n0/j1/")) == {
        f"checkpoints/n0/j1/step-000000{s}0/{f}" for s in (1, 2) for f in ("model.pt", "COMPLETE")
    }
    fresh = tmp_path / "fresh"
    back = job_sync.restore(fresh, reader, "checkpoints/n0/j1/")
    assert back.ok and back.newest_step == 20
    assert (fresh / "step-00000020" / "model.pt").read_bytes() == b"b" * 20
    assert not (fresh / "step-00000010").exists()  # only the newest is fetched


def test_a_test_endpoint_without_credentials_never_asks_the_metadata_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    store = job_sync.make_store("aws", "b", "us-east-1", "http://127.0.0.1:9")
    assert store is not None and store.credentials() is None


@pytest.mark.parametrize(
    ("provider", "region", "says"),
    [("", "us-east-1", "without its provider"), ("tencent", "", "without its region")],
)
def test_a_bucket_without_its_cloud_or_region_is_an_error_not_a_default_cloud(
    provider: str, region: str, says: str
) -> None:
    # Issue 23: an empty provider used to get the aws store, an empty region us-east-1.
    with pytest.raises(ValueError, match=says):
        job_sync.make_store(provider, "b", region, "http://127.0.0.1:9")


def test_no_bucket_means_no_store_whatever_the_cloud() -> None:
    assert job_sync.make_store("", "", "", "") is None


def test_restore_ignores_a_newer_checkpoint_cut_off_in_the_bucket(tmp_path: Path) -> None:
    store = DictStore()
    node = tmp_path / "n"
    write_checkpoint(node, 10, b"x" * 10)
    store.push(node, "p/")
    # A node stopped while uploading step 20: its marker reached the bucket, half the data.
    store.objects["p/step-00000020/model.pt"] = b"y" * 5
    store.objects["p/step-00000020/COMPLETE"] = marker({"model.pt": 20}, 20).encode()
    out = job_sync.restore(tmp_path / "fresh", store, "p/")
    assert out.newest_step == 10 and "step-00000010" in out.detail


def test_a_torch_distributed_checkpoint_comes_back_whole_with_its_hidden_index(
    tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.distributed.checkpoint writes its index as ".metadata" beside the shards; the
    # folder manifest used to leave every hidden file out, so a replaced node got the shards
    # back without the index and dcp.load failed.
    import torch
    import torch.distributed.checkpoint as dcp

    s3_bucket(moto_url, monkeypatch, "ckpt-dcp")
    node = tmp_path / "scratch" / "checkpoints" / "j-dcp"
    state = {"w": torch.arange(12.0).reshape(3, 4)}
    with pytest.warns(UserWarning):  # no process group: DCP says it saves as one process
        dcp.save(state, checkpoint_id=str(node / "latest"))
    (node / ".tmp-step-3").mkdir()  # a save in progress is not the job's folder
    (node / ".tmp-step-3" / "half.distcp").write_bytes(b"x")
    (node / ".marker-step-2").write_text("{}")  # gpufleet's own temp file
    assert (node / "latest" / ".metadata").is_file()

    store = job_sync.make_store("aws", "ckpt-dcp", "us-east-1", moto_url)
    assert store is not None
    prefix = "checkpoints/n0/j-dcp/"
    assert job_sync.push(node, store, "n0", prefix=prefix).ok
    fresh = tmp_path / "replaced" / "j-dcp"
    fresh.mkdir(parents=True)
    back = job_sync.restore(fresh, job_sync.BucketReader(store), prefix)
    assert back.ok and "restored the job's folder" in back.detail, back
    assert sorted(p.name for p in (fresh / "latest").iterdir()) == sorted(
        p.name for p in (node / "latest").iterdir()
    )
    assert not (fresh / ".tmp-step-3").exists() and not (fresh / ".marker-step-2").exists()
    loaded = {"w": torch.zeros(3, 4)}
    with pytest.warns(UserWarning):
        dcp.load(loaded, checkpoint_id=str(fresh / "latest"))
    assert torch.equal(loaded["w"], state["w"])


def test_a_checkpoints_marker_goes_up_after_the_files_it_lists(tmp_path: Path) -> None:
    # "COMPLETE" sorts before "model.pt": the sync sent the marker first, so a bucket could
    # list a step's marker with its model still on the way (a job killed then left a marker
    # whose files never came, and a test that waited for the marker resumed from nothing).
    from bootstrap.remote import bucket

    class Recording:
        bucket = "b"

        def __init__(self) -> None:
            self.keys: list[str] = []

        def upload_file(self, key: str, path: Path, size: int, deadline: float) -> None:
            self.keys.append(key)

    scratch = tmp_path / "scratch"
    for step in (5, 10):
        write_checkpoint(scratch / "checkpoints" / "j", step, b"m" * step)
        (scratch / "checkpoints" / "j" / f"step-{step:08d}" / "Adam.pt").write_bytes(b"o")
    store = Recording()
    out = bucket.sync_scratch(
        scratch=scratch, sync_dirs=("checkpoints",), node="n0", store=store, timeout_s=60
    )  # type: ignore[arg-type]
    assert out.ok and out.uploaded == 6, out
    for step in (5, 10):
        folder = [k for k in store.keys if f"/step-{step:08d}/" in k]
        assert [k.rsplit("/", 1)[1] for k in folder] == ["Adam.pt", "model.pt", "COMPLETE"]
