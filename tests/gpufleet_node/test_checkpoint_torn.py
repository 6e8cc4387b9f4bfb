"""A torn save never becomes a version: a torch.save file (a zip) or a safetensors file cut
short (a kill or ``fab cancel``'s final push while the script was saving in place) is found
before a push publishes anything; the push says which file and why, and the bucket keeps
its newest version. Real files from torch 2.13 (CPU) and the safetensors package, cut; the
bucket is moto S3 on 127.0.0.1."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_sync
from tests.support.moto_server import moto_server

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

bucket = job_sync.bucket
PREFIX = "checkpoints/n0/j1/"


def nanogpt_like(path: Path, iter_num: int = 200) -> bytes:
    """What nanoGPT's train.py saves as ckpt.pt: model and optimizer state and iter_num."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "iter_num": iter_num, "best_val_loss": 1.5}, path)
    return path.read_bytes()


def cut(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def old(root: Path) -> None:
    """Quiet: the files were last written a minute ago."""
    then = time.time() - 60
    for path in root.rglob("*"):
        os.utime(path, (then, then))


# ---------------------------------------------------------------------------- the checks


def test_a_whole_torch_save_file_is_not_torn(tmp_path: Path) -> None:
    nanogpt_like(tmp_path / "ckpt.pt")
    assert job_sync.torn_file(tmp_path, "ckpt.pt", (tmp_path / "ckpt.pt").stat().st_size) == ""


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, -22, -1])
def test_a_torch_save_file_cut_anywhere_is_torn(tmp_path: Path, keep: float) -> None:
    """Cut at 10/50/90 % (inside the data), just before the end of central directory
    record (22 bytes) and by one byte."""
    data = nanogpt_like(tmp_path / "ckpt.pt")
    size = int(len(data) * keep) if keep > 0 else len(data) + int(keep)
    cut(tmp_path / "ckpt.pt", size)
    why = job_sync.torn_file(tmp_path, "ckpt.pt", size)
    assert why.startswith("ckpt.pt is an incomplete torch.save (zip) file ("), why
    assert why.endswith("): the job was stopped while saving?")


def test_a_zip_whose_directory_names_data_past_it_is_torn(tmp_path: Path) -> None:
    """A directory that parses but whose member runs into it (a false end record found in
    the data, or a damaged directory) is caught by the member bounds, not by a CRC read."""
    import zipfile

    path = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"x" * 1000)
    with zipfile.ZipFile(path) as z:
        directory = z.start_dir
    data = bytearray(path.read_bytes())
    # The central directory's compressed size (offset 20 in its record) made 100 bytes more.
    at = directory + 20
    data[at : at + 4] = (1100).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    why = job_sync.torn_zip(path)
    assert why == "member archive/data.pkl's data runs past the directory", why


def test_a_file_that_is_not_a_zip_is_not_checked(tmp_path: Path) -> None:
    (tmp_path / "notes.pt").write_bytes(b"\x80\x02legacy torch pickle, cut")
    (tmp_path / "log.txt").write_text("step 1\n")
    assert job_sync.torn_file(tmp_path, "notes.pt", 26) == ""
    assert job_sync.torn_file(tmp_path, "log.txt", 7) == ""


def test_a_whole_safetensors_file_agrees_with_its_header(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = {"w": torch.randn(32, 16), "b": torch.zeros(16), "empty": torch.zeros(0, 4)}
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    assert job_sync.torn_file(tmp_path, "model.safetensors", path.stat().st_size) == ""


@pytest.mark.parametrize("keep", [0, 5, 40, -1])
def test_a_safetensors_file_cut_is_torn(tmp_path: Path, keep: int) -> None:
    """Cut to nothing, inside the length, inside the JSON header, and by one byte."""
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"w": torch.randn(32, 16)}, str(path))
    size = keep if keep >= 0 else path.stat().st_size + keep
    cut(path, size)
    why = job_sync.torn_file(tmp_path, "model.safetensors", size)
    assert why.startswith("model.safetensors is an incomplete safetensors file ("), why
    with pytest.raises(Exception):  # noqa: B017 (the package's own reader refuses it too)
        safetensors_torch.load_file(str(path))


def test_safetensors_reasons_name_what_disagrees(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file({"w": torch.randn(8, 8)}, str(path))  # 256 data bytes
    size = path.stat().st_size
    cut(path, size - 1)
    assert job_sync.torn_safetensors(path, size - 1) == (
        "its tensors end at byte 256 of a data buffer of 255 bytes"
    )
    cut(path, 12)
    assert job_sync.torn_safetensors(path, 12).startswith("its header length says ")


# ---------------------------------------------------------------------------- a push


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


@pytest.fixture
def s3(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, bucket.BucketStore]:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    name = f"ckpt-torn-{os.getpid()}-{time.monotonic_ns()}"
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    store = job_sync.make_store("aws", name, "us-east-1", moto_url)
    assert store is not None
    return client, store


def keys(client: Any, store: bucket.BucketStore) -> list[str]:
    out = client.list_objects_v2(Bucket=store.bucket, Prefix=PREFIX)
    return sorted(o["Key"][len(PREFIX) :] for o in out.get("Contents", []))


@pytest.mark.parametrize("final", [True, False])
def test_a_torch_save_cut_mid_write_is_no_version_and_the_bucket_keeps_the_last(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore], final: bool
) -> None:
    client, store = s3
    root = tmp_path / "scratch" / "checkpoints" / "j1"
    root.mkdir(parents=True)
    nanogpt_like(root / "ckpt.pt", iter_num=200)
    old(root)
    first = job_sync.push(root, store, "n0", prefix=PREFIX, final=True)
    assert first.ok and first.version == 1 and first.newest_step == 200, first
    before = keys(client, store)
    # The next save, at iter 400, killed half way through its torch.save.
    data = nanogpt_like(root / "ckpt.pt", iter_num=400)
    cut(root / "ckpt.pt", len(data) // 2)
    old(root)
    out = job_sync.push(root, store, "n0", prefix=PREFIX, final=final)
    assert not out.ok and not out.pushed and out.torn == "ckpt.pt", out
    assert out.cause == "torn" and out.to_json()["torn"] == "ckpt.pt"
    assert out.detail.startswith("ckpt.pt is an incomplete torch.save (zip) file (")
    assert out.detail.endswith(
        "the job was stopped while saving? No version uploaded; the bucket keeps version 1"
    )
    assert keys(client, store) == before  # nothing sent, not even the torn file's object
    # A restore still gives iter 200's whole file.
    fresh = tmp_path / "other" / "checkpoints" / "j1"
    got = job_sync.restore(fresh, store, PREFIX)
    assert got.ok and got.version == 1 and got.step == 200, got
    assert job_sync.torch_save_step(fresh / "ckpt.pt") == (200, "iter_num")


def test_a_cut_safetensors_file_in_a_trainer_checkpoint_is_no_version(
    tmp_path: Path, s3: tuple[Any, bucket.BucketStore]
) -> None:
    client, store = s3
    root = tmp_path / "scratch" / "checkpoints" / "j1"
    (root / "checkpoint-300").mkdir(parents=True)
    path = root / "checkpoint-300" / "model.safetensors"
    safetensors_torch.save_file({"w": torch.randn(64, 64)}, str(path))
    cut(path, path.stat().st_size - 1000)
    old(root)
    out = job_sync.push(root, store, "n0", prefix=PREFIX, final=True)
    assert not out.ok and out.torn == "checkpoint-300/model.safetensors", out
    assert out.detail.endswith("No version uploaded; the bucket has no version")
    assert keys(client, store) == []
