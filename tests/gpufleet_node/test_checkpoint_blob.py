"""Checkpoint versions on Azure Blob: the same push and restore through the watchdog's
BlobStore, against the watchdog tests' Blob fake (tests/gpufleet_node/test_watchdog_azure.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpufleet_node import job_sync
from tests.gpufleet_node.test_watchdog_azure import ACCOUNT, CONTAINER, REGION, FakeAzureNode
from tests.gpufleet_node.test_watchdog_azure import azure as azure  # the fixture

PREFIX = "checkpoints/n0/j1/"


@pytest.mark.integration
def test_a_jobs_checkpoints_go_to_blob_as_a_version_and_come_back_verified(
    azure: tuple[FakeAzureNode, str], tmp_path: Path
) -> None:
    fake, url = azure
    fake.page_size = 2  # the listings take pages (NextMarker)
    store = job_sync.make_store("azure", f"{ACCOUNT}/{CONTAINER}", REGION, url, url)
    assert isinstance(store, job_sync.bucket.BlobStore)
    root = tmp_path / "scratch" / "checkpoints" / "j1"
    for step, data in ((10, b"a" * 10), (20, b"b" * 20)):
        (root / f"checkpoint-{step}").mkdir(parents=True)
        (root / f"checkpoint-{step}" / "model.pt").write_bytes(data)
    old = time.time() - 60
    for path in root.rglob("*"):
        os.utime(path, (old, old))
    out = job_sync.push(root, store, "n0", prefix=PREFIX)
    assert out.ok and out.version == 1 and out.uploaded == 2 and out.newest_step == 20, out
    assert f"{PREFIX}.gpufleet/versions/00000001.json" in fake.blobs
    fresh = tmp_path / "fresh" / "checkpoints" / "j1"
    back = job_sync.restore(fresh, store, PREFIX)
    assert back.ok and (back.version, back.step, back.fetched) == (1, 20, 2), back
    assert (fresh / "checkpoint-20" / "model.pt").read_bytes() == b"b" * 20
