"""COS (Tencent's object store) reached through the S3 path: verify-gpu's report upload and
its node probe, both through the node's own bucket client (bucket.py's SigV4, as the
Tencent node module builds it) with Tencent's keys. Both against moto's S3
on 127.0.0.1 standing for COS's S3-compatible endpoint: what moto proves is our SigV4 path
and addressing, not that COS accepts them (only a real bucket does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from gpufleet_node import verify_node
from tests.gpufleet_node.watchdog_fakes import closed_port
from tests.support.moto_server import moto_server

REMOTE = Path(__file__).resolve().parents[2] / "gpufleet_node"
REGION = "ap-guangzhou"


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


def bucket(moto: str, name: str) -> str:
    s3 = boto3.client(
        "s3",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    s3.create_bucket(Bucket=name)
    return name


def keys(moto: str, name: str) -> list[str]:
    s3 = boto3.client(
        "s3",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=name).get("Contents", []))


def cos_probe_args(name: str, moto: str) -> SimpleNamespace:
    return SimpleNamespace(
        bucket=name,
        provider="tencent",
        region=REGION,
        s3_endpoint=moto,
        metadata_url=closed_port(),  # no metadata service: Tencent's keys from the environment
    )


@pytest.mark.integration
def test_report_upload_to_cos_is_the_nodes_own_client_with_tencents_keys(
    moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = bucket(moto, "gpufleet-tc-1250000000")
    path = tmp_path / "verify-1.json"
    path.write_text('{"overall": "PASS"}')
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID", raising=False)
    skipped = verify_node.upload_report(cos_probe_args(name, moto), path)  # type: ignore[arg-type]
    assert skipped["status"] == "skip" and "no credentials" in skipped["reason"], skipped
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtest")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "secret")
    done = verify_node.upload_report(cos_probe_args(name, moto), path)  # type: ignore[arg-type]
    assert done == {
        "status": "ok",
        "tool": "bucket.py",
        "url": f"{moto}/{name}/gpufleet/verify/verify-1.json",
    }
    assert keys(moto, name) == ["gpufleet/verify/verify-1.json"]


@pytest.mark.integration
def test_verify_cos_probe_is_the_nodes_own_client_with_tencents_keys(
    moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = bucket(moto, "gpufleet-probe-1250000000")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtest")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "secret")
    result = verify_node.storage_probe(cos_probe_args(name, moto))  # type: ignore[arg-type]
    assert result["status"] == "ok", result
    assert result["tool"] == "bucket.py" and {"put_s", "get_s", "delete_s"} <= set(result)
    assert keys(moto, name) == []  # the probe object is gone again

    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    missing = verify_node.storage_probe(cos_probe_args(name, moto))  # type: ignore[arg-type]
    assert missing["status"] == "skip" and "no credentials" in missing["reason"]


@pytest.mark.integration
def test_verify_cos_probe_reports_a_missing_bucket_as_an_error(
    moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtest")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "secret")
    args = cos_probe_args("no-such-bucket-1250000000", moto)
    result = verify_node.storage_probe(args)  # type: ignore[arg-type]
    assert result["status"] == "error" and "NoSuchBucket" in result["reason"], result
