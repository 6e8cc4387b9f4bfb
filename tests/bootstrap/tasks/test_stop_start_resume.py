"""Issue 24's whole path, end to end: a public training script (pytorch/examples'
ddp-tutorial-series multinode.py, examples/ddp_multinode/, CPU edits marked) trains on a
node with a bucket; `fab cancel` saves its last snapshot, `fab stop` saves scratch the
watchdog's way and stops the instance (moto EC2); the node's local checkpoints are
removed, as a stop wipes instance-store NVMe; `fab start` brings the node back and
`fab train --resume` goes on from the last saved epoch, as the script itself says.

The node is the loopback sshd (see test_power_ssh.py): a stop here cannot power it off,
so the test removes what a stop removes. 2 processes, gloo, a 2,048-sample dataset.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.bootstrap.tasks.test_power_ssh import BUCKET, LAPTOP, Node, client, cloud, node, state

__all__ = ["cloud", "node"]  # the fixtures this module takes from test_power_ssh

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = "examples/ddp_multinode/multinode.py"
CREDS = "AWS_ACCESS_KEY_ID=testing,AWS_SECRET_ACCESS_KEY=testing"
SAVED = re.compile(r"Epoch (\d+) \| Training snapshot saved at ")
RESUMED = re.compile(r"Resuming training from snapshot at Epoch (\d+)")


def wait_for(what: str, check: Callable[[], object], timeout: float = 240.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def rank0_log(jobs: Path, job: str) -> str:
    path = jobs / job / "logs" / "rank-0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def newest_version(moto: str, prefix: str) -> tuple[int, dict[str, Any]]:
    """The newest checkpoint version under the job's ``prefix``: (seq, manifest) (docs/train.md,
    "Contract: a checkpoint": ``P.gpufleet/versions/<seq>.json``, written last), each file
    it names checked to be in the bucket as ``P.gpufleet/objects/<sha256>`` with its size."""
    s3 = client("s3", moto)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}.gpufleet/versions/")
    keys = sorted(obj["Key"] for obj in listed.get("Contents", []))
    assert keys, f"no checkpoint version under {prefix}"
    doc: dict[str, Any] = json.loads(s3.get_object(Bucket=BUCKET, Key=keys[-1])["Body"].read())
    for rel, item in doc["files"].items():
        head = s3.head_object(Bucket=BUCKET, Key=f"{prefix}.gpufleet/objects/{item['sha256']}")
        assert head["ContentLength"] == item["size"], (rel, item, head["ContentLength"])
    return int(keys[-1].rsplit("/", 1)[1].removesuffix(".json")), doc


def fab_ok(*args: str) -> FabResult:
    done = run_fab(*args, timeout=400, env=LAPTOP)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


# The session's node venv (a pip install of torch, 1.5-3 min on these loaded machines) is
# built in this test's setup when it is the first to need it: that counts against the
# timeout too. The test itself takes about a minute of fab commands.
@pytest.mark.timeout(900)
def test_a_stopped_node_started_again_resumes_the_public_script_from_its_last_epoch(
    node: Node, node_venv: tuple[Path, FabResult]
) -> None:
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    jobs = node_dir("gpufleet-resume-jobs-")
    jobs.chmod(0o777)  # the SSH user writes the job folders
    inv = ["--inventory", str(node.inventory), "--jobs-dir", str(jobs)]
    job_id = ""
    try:
        started = fab_ok(
            "train", *inv, "--script", SCRIPT, "--cpu", "--nproc-per-node", "2",
            "--venv", str(venv), "--s3-endpoint", node.moto, "--node-env", CREDS,
            "--sync-interval", "1", "--args", "1000 1 --batch_size 16",
        )  # fmt: skip
        job = re.search(r"job (\S+) running on 1 node", started.stdout)
        assert job, started.stdout[-2000:]
        job_id = job.group(1)
        prefix = f"checkpoints/local-0/{job_id}/"
        wait_for(
            "epoch 2's snapshot", lambda: "Epoch 2 | Training snapshot" in rank0_log(jobs, job_id)
        )

        fab_ok("cancel", job_id, *inv, "--s3-endpoint", node.moto)
        saved = [int(n) for n in SAVED.findall(rank0_log(jobs, job_id))]
        assert saved and saved[-1] >= 2
        # The cancel's push left the snapshot in the bucket as a whole version.
        seq, version = newest_version(node.moto, prefix)
        assert "snapshot.pt" in version["files"], version

        stopped = fab_ok("stop", "--inventory", str(node.inventory), "--api-endpoint", node.moto,
                         *node.paths, "--json")  # fmt: skip
        assert stopped.step("save-scratch")["status"] in ("ok", "changed")
        assert state(node.moto, node.instance_id) == "stopped"
        # What a stop does to instance-store NVMe: the job's checkpoints are gone.
        shutil.rmtree(node.scratch / "checkpoints")
        (node.scratch / "checkpoints").mkdir(mode=0o777)
        (node.scratch / "checkpoints").chmod(0o777)

        fab_ok("start", "--inventory", str(node.inventory), "--api-endpoint", node.moto,
               *node.paths, "--no-watchdog-timer", "--timeout", "120")  # fmt: skip
        assert state(node.moto, node.instance_id) == "running"

        resumed = fab_ok("train", "--resume", job_id, *inv)
        assert f"job {job_id} resumed on 1 node" in resumed.stdout, resumed.stdout[-2000:]
        # From the bucket (the local copy is gone): the version the cancel pushed.
        assert f"from version {seq}" in resumed.stdout, resumed.stdout[-2000:]
        line = wait_for("the script's resume line", lambda: RESUMED.search(rank0_log(jobs, job_id)))
        assert isinstance(line, re.Match)
        # The bucket's snapshot is the last one the script saved (or, when the cancel came
        # while it wrote the next, that one): never epoch 0 again.
        assert saved[-1] <= int(line.group(1)) <= saved[-1] + 1, (saved, line.group(0))
    finally:
        if job_id:
            run_fab("cancel", job_id, *inv, "--s3-endpoint", node.moto, env=LAPTOP)
        shutil.rmtree(jobs, ignore_errors=True)
