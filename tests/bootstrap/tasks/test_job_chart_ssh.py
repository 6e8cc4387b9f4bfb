"""``fab logs JOB`` draws the job's chart from what its two nodes recorded (the watchdog's
samples, the runner's events), keeps it beside the job's record on the head node and in
the bucket (moto S3 on 127.0.0.1) beside its checkpoints, and says where; ``fab jobs``
then names it too. The nodes are the two local sshds of test_top_ssh.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bootstrap.conftest import run_fab
from tests.bootstrap.tasks.test_top_ssh import (  # noqa: F401 (fixtures)
    Node,
    inventory,
    place,
    supervisor,
    two_nodes,
    write_job,
)
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration

BUCKET = "gpufleet-chart-test"
JOB = "train-lm-261202-030000-ab12"


@pytest.fixture
def moto_bucket() -> Iterator[tuple[str, Any]]:
    import boto3

    with moto_server(warm=("s3",)) as url:
        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        yield url, client


def recorded(jobs: Path, url: str) -> None:
    """What the nodes keep while the job runs: each node's samples and events, and the
    job's bucket in its spec (as fab train writes it)."""
    spec_path = jobs / JOB / "job.json"
    spec = json.loads(spec_path.read_text())
    spec.update(
        bucket=BUCKET,
        bucket_prefix=f"checkpoints/node-0/{JOB}/",
        provider="aws",
        region="us-east-1",
        s3_endpoint=url,
        env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
    )
    spec_path.write_text(json.dumps(spec))
    for rank, util in ((0, 95.0), (1, 4.0)):
        nd = jobs / JOB / f"node-{rank}"
        lines = [
            {"at": f"2026-12-02T03:{m:02d}:00Z", "gpu_util": [util], "gpu_mem": 60.0}
            for m in range(30)
        ]
        (nd / "gpu-samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        events = [{"at": "2026-12-02T03:00:00Z", "event": "start", "attempt": 1}]
        if rank == 0:
            events.append({"at": "2026-12-02T03:20:00Z", "event": "checkpoint", "step": 200})
        (nd / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in events))
    subprocess.run(["chmod", "-R", "a+rwX", str(jobs)], check=True)


def test_fab_logs_draws_the_chart_keeps_it_with_the_job_and_fab_jobs_names_it(
    sshd_server: SshServer,
    two_nodes: list[Node],  # noqa: F811
    place: Path,  # noqa: F811
    supervisor: int,  # noqa: F811
    moto_bucket: tuple[str, Any],
    tmp_path: Path,
) -> None:
    url, client = moto_bucket
    jobs = place / "jobs"
    jobs.mkdir()
    write_job(jobs, two_nodes, supervisor)
    recorded(jobs, url)
    inv = inventory(place, two_nodes, sshd_server.key_path, sshd_server.user)
    common = ["--inventory", str(inv), "--jobs-dir", str(jobs)]
    common += ["--known-hosts", str(place / "known_hosts")]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    logs = run_fab("logs", JOB, *common, timeout=180, env=env)
    assert logs.returncode == 0, logs.stderr
    assert "step 40 loss 3.12" in logs.stdout  # the logs themselves, on stdout
    local = tmp_path / "cache" / "gpufleet" / "jobs" / JOB / "gpufleet-chart.png"
    assert f"chart of {JOB}: {local}" in logs.stderr
    assert local.read_bytes()[:4] == b"\x89PNG"
    # with the job's record on its head node, and in the bucket beside its checkpoints
    assert (jobs / JOB / "gpufleet-chart.png").read_bytes() == local.read_bytes()
    key = f"checkpoints/node-0/{JOB}/gpufleet-chart.png"
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == local.read_bytes()
    assert f"{BUCKET}/{key}" in logs.stderr
    # the same history again: the chart is neither redrawn nor sent again
    drawn = local.stat().st_mtime_ns
    head = (jobs / JOB / "gpufleet-chart.png").stat().st_mtime_ns
    again = run_fab("logs", JOB, *common, timeout=180, env=env)
    assert again.returncode == 0, again.stderr
    assert "chart unchanged since it was drawn and kept with the job" in again.stderr
    assert f"chart of {JOB}: {local}" in again.stderr
    assert local.stat().st_mtime_ns == drawn
    assert (jobs / JOB / "gpufleet-chart.png").stat().st_mtime_ns == head
    # a new event on a node is a new history: drawn and kept again
    events = jobs / JOB / "node-1" / "events.jsonl"
    new = {"at": "2026-12-02T03:30:00Z", "event": "checkpoint", "step": 300}
    events.write_text(events.read_text() + json.dumps(new) + "\n")
    third = run_fab("logs", JOB, *common, timeout=180, env=env)
    assert third.returncode == 0, third.stderr
    assert "chart unchanged" not in third.stderr
    assert local.stat().st_mtime_ns != drawn
    assert (jobs / JOB / "gpufleet-chart.png").read_bytes() == local.read_bytes()
    listed = run_fab("jobs", *common, "--json", timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["jobs"]
    assert row["chart"] == str(local)
    table = run_fab("jobs", *common, timeout=120, env={**env, "COLUMNS": "200"})
    assert f"chart of {JOB}: {local}" in table.stdout
