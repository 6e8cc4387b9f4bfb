"""The saved verify report reaches the stack's bucket from the head node: shipped over SSH
(the local sshd on 127.0.0.1 plays the head) and uploaded there by verify_node.py with the
node's own bucket client (moto on 127.0.0.1 plays the bucket), no credentials asked here."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap.fleet.api import Host
from bootstrap.verify.expected import Expected
from bootstrap.verify.report import upload_report
from bootstrap.verify.ship import FILE_PIECE, VerifyOptions, write_file_commands
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer

BUCKET = "gpufleet-reports"
# The node's keys, given as the user's --node-env (the test sshd has no instance role).
NODE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


def head(server: SshServer) -> Host:
    return Host(
        server.host,
        user=server.user,
        port=server.port,
        name="head",
        key_filename=str(server.key_path),
    )


def test_a_file_goes_to_the_node_in_pieces_that_fit_a_command_line(tmp_path: Path) -> None:
    data = os.urandom(3 * FILE_PIECE)  # random: gzip cannot shrink it below one piece
    target = tmp_path / "report.json"
    commands = write_file_commands(str(target), data)
    assert len(commands) > 2 and all(len(c) < 2 * FILE_PIECE for c in commands)
    for command in commands:
        subprocess.run(["bash", "-c", command], check=True, timeout=60)
    assert target.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.mark.integration
def test_the_report_is_uploaded_from_the_head_with_the_nodes_client(
    sshd_server: SshServer, moto: str, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto)
    s3.create_bucket(Bucket=BUCKET)
    report = tmp_path / "verify-20261129T120000Z.json"
    # Larger than one command line once encoded, as a many-node report is.
    report.write_text(json.dumps({"overall": "PASS", "noise": os.urandom(FILE_PIECE).hex()}))
    exp = Expected(provider="aws", region="us-east-1", bucket=BUCKET)
    opts = VerifyOptions(python="python3", s3_endpoint=moto, node_env=NODE_KEYS)
    result = upload_report(report, exp, opts, head(sshd_server))
    key = f"gpufleet/verify/{report.name}"
    assert result == {"status": "ok", "tool": "bucket.py", "url": f"{moto}/{BUCKET}/{key}"}
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == report.read_bytes()


@pytest.mark.integration
def test_a_head_that_cannot_be_reached_is_an_upload_error_not_a_crash(
    sshd_server: SshServer, tmp_path: Path
) -> None:
    report = tmp_path / "verify-1.json"
    report.write_text("{}")
    exp = Expected(provider="aws", region="us-east-1", bucket=BUCKET)
    unreachable = Host("127.0.0.1", user=sshd_server.user, port=1, name="head")
    result = upload_report(report, exp, VerifyOptions(), unreachable, connect_timeout_s=5)
    assert result["status"] == "error" and result["reason"]


def test_a_stack_without_a_bucket_skips_the_upload_before_any_connection(tmp_path: Path) -> None:
    report = tmp_path / "verify-1.json"
    report.write_text("{}")
    nowhere = Host("127.0.0.1", port=1)
    result = upload_report(report, Expected(provider="aws"), VerifyOptions(), nowhere)
    assert result == {"status": "skip", "reason": "the stack has no bucket"}
