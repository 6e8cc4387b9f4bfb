"""The job's checkpoints on the node side: the bucket's store, the old step-<N> marker's
rules that still hold, and the watchdog's own sync order. Versions (push and restore) are in
test_checkpoint_versions.py, their pure parts in test_checkpoint_units.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet_node import job_sync


def marker(files: dict[str, int], step: int = 0) -> str:
    return json.dumps({"step": step, "files": files})


def write_checkpoint(root: Path, step: int, payload: bytes) -> None:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(payload)
    (folder / "COMPLETE").write_text(marker({"model.pt": len(payload)}, step))


def test_a_marker_that_is_not_json_or_lists_escaping_paths_is_not_complete() -> None:
    assert job_sync.parse_marker("{not json") is None
    assert job_sync.parse_marker(json.dumps({"files": {"../x": 1}})) is None
    assert job_sync.parse_marker(json.dumps({"files": {}})) is None


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


def test_a_checkpoints_marker_goes_up_after_the_files_it_lists(tmp_path: Path) -> None:
    # "COMPLETE" sorts before "model.pt": the sync sent the marker first, so a bucket could
    # list a step's marker with its model still on the way (a job killed then left a marker
    # whose files never came, and a test that waited for the marker resumed from nothing).
    from gpufleet_node import bucket

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
        scratch=scratch,
        sync_dirs=("checkpoints",),
        node="n0",
        store=store,  # type: ignore[arg-type]
        timeout_s=60,
    )
    assert out.ok and out.uploaded == 6, out
    for step in (5, 10):
        folder = [k for k in store.keys if f"/step-{step:08d}/" in k]
        assert [k.rsplit("/", 1)[1] for k in folder] == ["Adam.pt", "model.pt", "COMPLETE"]
