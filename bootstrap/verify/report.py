"""What one ``fab verify-gpu`` produced (:class:`VerifyRun`), saved as JSON under reports/ and
copied into the stack's bucket."""

from __future__ import annotations

import json as jsonlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootstrap.verify.expected import Expected
from bootstrap.verify.verdict import Verdict, overall
from infra.catalog import object_store

REPORT_SCHEMA = "gpufleet.verify-report/1"


@dataclass
class VerifyRun:
    """Everything one ``fab verify-gpu`` produced."""

    expected: Expected
    verdicts: list[Verdict]
    cluster: Verdict | None
    measurements: dict[str, Any]
    seconds: float
    started_at: str
    # The fabric and the environment the cross-node stage ran with (None: no cross-node run).
    network: Mapping[str, Any] | None = None

    @property
    def status(self) -> str:
        return overall([*self.verdicts, *([self.cluster] if self.cluster else [])])

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "overall": self.status,
            "expected": self.expected.summary(),
            "hosts": [v.to_json() for v in self.verdicts],
            "cluster": self.cluster.to_json() if self.cluster else None,
            "network": dict(self.network) if self.network is not None else None,
            "measurements": self.measurements,
        }


def save_report(run: VerifyRun, reports_dir: Path) -> Path:
    """reports/<stack>/verify-<UTC time>.json (never overwritten: the time is in the name)."""
    folder = reports_dir / (run.expected.stack or "adhoc")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = run.started_at.replace(":", "").replace("-", "")
    path = folder / f"verify-{stamp}.json"
    path.write_text(jsonlib.dumps(run.to_json(), indent=1, default=str) + "\n")
    return path


def upload_report(path: Path, exp: Expected, *, endpoint_url: str | None = None) -> dict[str, Any]:
    """Copy the saved report into the stack's bucket. Returns what happened; never raises."""
    if not exp.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    key = f"gpufleet/verify/{path.name}"
    return UPLOADERS[object_store(exp.provider)](path, exp, key, endpoint_url)


def _upload_s3(path: Path, exp: Expected, key: str, endpoint_url: str | None) -> dict[str, Any]:
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        return {"status": "skip", "reason": "boto3 is not installed here"}
    session = boto3.session.Session(region_name=exp.region or None)
    if session.get_credentials() is None:
        return {"status": "skip", "reason": "no AWS credentials here (aws configure / AWS_PROFILE)"}
    try:
        session.client("s3", endpoint_url=endpoint_url).upload_file(str(path), exp.bucket, key)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"s3://{exp.bucket}/{key}"}


def _upload_oss(path: Path, exp: Expected, key: str, endpoint_url: str | None) -> dict[str, Any]:
    try:
        import oss2
    except ImportError:
        return {
            "status": "skip",
            "reason": "uploading to OSS needs the oss2 package (pip install oss2)",
        }
    key_id = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    if not key_id or not secret:
        return {
            "status": "skip",
            "reason": "no ALIBABA_CLOUD_ACCESS_KEY_ID/SECRET in the environment",
        }
    try:
        bucket = oss2.Bucket(
            oss2.Auth(key_id, secret), f"https://oss-{exp.region}.aliyuncs.com", exp.bucket
        )
        bucket.put_object_from_file(key, str(path))
    except Exception as exc:  # oss2 raises its own hierarchy; report, never crash the task
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"oss://{exp.bucket}/{key}"}


def _upload_cos(path: Path, exp: Expected, key: str, endpoint_url: str | None) -> dict[str, Any]:
    """COS through its S3-compatible API (SigV4 at ``cos.<region>.myqcloud.com``, the region
    as the signing region: cloud.tencent.com/document/product/436/37421): the S3 path with
    Tencent's keys from the environment."""
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError:
        return {"status": "skip", "reason": "boto3 is not installed here"}
    key_id = os.environ.get("TENCENTCLOUD_SECRET_ID")
    secret = os.environ.get("TENCENTCLOUD_SECRET_KEY")
    if not key_id or not secret:
        return {"status": "skip", "reason": "no TENCENTCLOUD_SECRET_ID/KEY in the environment"}
    style = "path" if endpoint_url else "virtual"
    client = boto3.client(
        "s3",
        region_name=exp.region,
        endpoint_url=endpoint_url or f"https://cos.{exp.region}.myqcloud.com",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=os.environ.get("TENCENTCLOUD_SESSION_TOKEN") or None,
        config=botocore.config.Config(signature_version="s3v4", s3={"addressing_style": style}),
    )
    try:
        client.upload_file(str(path), exp.bucket, key)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"cos://{exp.bucket}/{key}"}


def _upload_azureblob(
    path: Path, exp: Expected, key: str, endpoint_url: str | None
) -> dict[str, Any]:
    """Azure Blob (not S3-compatible): the node sync's stdlib Blob client (Put Blob) with a
    bearer token for storage.azure.com from GPUFLEET_AZURE_STORAGE_TOKEN (``az account
    get-access-token --resource https://storage.azure.com/``); the bucket is
    ``<storage account>/<container>``."""
    from bootstrap.remote import bucket

    token = os.environ.get("GPUFLEET_AZURE_STORAGE_TOKEN", "").strip()
    if not token:
        return {"status": "skip", "reason": "no GPUFLEET_AZURE_STORAGE_TOKEN in the environment"}
    try:
        store = bucket.BlobStore.for_node(
            endpoint="https://blob.core.windows.net",
            region=exp.region or "",
            bucket=exp.bucket or "",
            credentials=lambda: {"access_key_id": "bearer", "secret": "", "storage": token},
            endpoint_url=endpoint_url or "",
        )
        store.put(key, path.read_bytes(), deadline=None)
    except (bucket.StoreError, OSError) as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"azureblob://{exp.bucket}/{key}"}


# How a report reaches each kind of object store (the catalog's ``object_store`` values).
UPLOADERS: Mapping[str, Callable[[Path, Expected, str, str | None], dict[str, Any]]] = {
    "s3": _upload_s3,
    "oss": _upload_oss,
    "cos": _upload_cos,
    "azureblob": _upload_azureblob,
}
