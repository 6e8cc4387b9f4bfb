"""`fab stop` and `fab start` over real SSH (the loopback sshd) with the cloud in moto.

The node is the test sshd; the instance behind it is a moto EC2 instance tagged with the
stack, named by the inventory's ``instance_id``; the inventory gives the node's own
address (``host``), so whatever public IP moto hands out is never connected to. The
watchdog is installed for real (``--no-watchdog-timer``: no systemd here) and saves
scratch into a moto S3 bucket with role credentials from a fake metadata service.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.reaper import tags as T
from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.gpufleet_node.watchdog_fakes import FakeIMDS, serve
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration

BUCKET = "gpufleet-power-test"
STACK = "local-test"
LAPTOP = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def cloud() -> Iterator[str]:
    """moto (EC2 for the laptop, S3 and tags for the node) and the node's metadata."""
    imds = FakeIMDS(tags={"managed-by": "gpufleet"})
    with moto_server() as moto, serve(imds.handler()) as imds_url:
        client("s3", moto).create_bucket(Bucket=BUCKET)
        yield json.dumps({"moto": moto, "imds": imds_url})


def client(service: str, url: str) -> Any:
    keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    return boto3.client(service, endpoint_url=url, region_name="us-east-1", **keys)


def instance(moto: str, stack: str = STACK) -> str:
    tags = [{"Key": T.MANAGED_BY, "Value": T.MANAGED_BY_VALUE}, {"Key": T.STACK, "Value": stack}]
    made = client("ec2", moto).run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return str(made["Instances"][0]["InstanceId"])


def state(moto: str, iid: str) -> str:
    found = client("ec2", moto).describe_instances(InstanceIds=[iid])
    return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])


@dataclass(frozen=True)
class Node:
    inventory: Path
    instance_id: str
    scratch: Path
    paths: list[str]  # --prefix P --etc E: where the watchdog is on the node
    moto: str

    def fab(self, task: str, *extra: str) -> FabResult:
        args = [task, "--inventory", str(self.inventory), "--api-endpoint", self.moto]
        return run_fab(*args, *self.paths, "--json", *extra, env=LAPTOP)


@pytest.fixture
def node(sshd_server: SshServer, cloud: str, tmp_path: Path) -> Iterator[Node]:
    urls = json.loads(cloud)
    base = node_dir("gpufleet-power-")
    scratch = base / "scratch"
    (scratch / "checkpoints").mkdir(parents=True)
    for p in (scratch, scratch / "checkpoints"):
        p.chmod(0o777)
    iid = instance(urls["moto"])
    data = sshd_server.inventory(
        stack=STACK,
        bucket=BUCKET,
        scratch={"path": str(scratch), "kind": "nvme"},
    )
    data["nodes"][0].update(instance_id=iid, host=sshd_server.host)
    inv = tmp_path / "stack.json"
    inv.write_text(json.dumps(data))
    paths = ["--prefix", str(base / "opt"), "--etc", str(base / "etc")]
    installed = run_fab(
        "install-watchdog", "--inventory", str(inv), "--no-watchdog-timer", *paths,
        "--unit-dir", str(base / "units"), "--state-dir", str(base / "state"),
        "--storage-endpoint", urls["moto"], "--metadata-url", urls["imds"],
        "--api-endpoint", urls["moto"],
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    try:
        yield Node(inv, iid, scratch, paths, urls["moto"])
    finally:
        shutil.rmtree(base, ignore_errors=True)
        # moto keeps one store per process: the next test (or module) starts with none of
        # this one's objects.
        s3 = client("s3", urls["moto"])
        for obj in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=obj["Key"])


def test_stop_saves_scratch_then_stops_and_start_brings_the_node_back(node: Node) -> None:
    (node.scratch / "checkpoints" / "step-3.pt").write_bytes(b"weights" * 100)

    stopped = node.fab("stop")
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    save = stopped.step("save-scratch")
    assert save["status"] == "changed" and save["details"]["uploaded"] == 1, save
    assert stopped.step("stop")["message"] == f"{node.instance_id} stopped"
    assert state(node.moto, node.instance_id) == "stopped"
    listed = client("s3", node.moto).list_objects_v2(Bucket=BUCKET, Prefix="checkpoints/")
    assert "checkpoints/local-0/step-3.pt" in [o["Key"] for o in listed["Contents"]]

    again = node.fab("stop")
    assert again.returncode == 0, again.stderr
    assert again.step("stop")["message"] == f"{node.instance_id} already stopped"

    started = node.fab("start", "--no-watchdog-timer", "--timeout", "60")
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    first = started.step("start")
    assert first["status"] == "changed"
    assert first["message"].startswith(f"{node.instance_id} started, SSH answers after ")
    assert state(node.moto, node.instance_id) == "running"
    # This machine has no instance-store NVMe: the step says so; it never formats a disk
    # here (its mkfs path is tests/bootstrap/tasks/test_scratch_loop.py's).
    assert started.step("mount-scratch")["status"] in ("skipped", "ok")
    watchdog = started.step("watchdog-running")
    assert watchdog["status"] == "ok" and "timer not checked" in watchdog["message"], watchdog


def test_a_node_whose_scratch_cannot_be_saved_is_not_stopped_unless_forced(
    node: Node, sshd_server: SshServer
) -> None:
    (node.scratch / "checkpoints" / "step-1.pt").write_bytes(b"w")
    config = Path(node.paths[3]) / "watchdog.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "bucket": "gpufleet-no-such-bucket"}))

    refused = node.fab("stop")
    assert refused.returncode == 1
    save = refused.step("save-scratch")
    assert save["status"] == "failed" and "NoSuchBucket" in save["message"], save
    assert save["message"].endswith("not stopped (--force stops it anyway)")
    assert refused.step("stop")["message"] == f"{node.instance_id} not stopped: " + (
        "its scratch was not saved"
    )
    assert state(node.moto, node.instance_id) == "running"

    forced = node.fab("stop", "--force")
    assert forced.returncode == 0, forced.stdout[-2000:] + forced.stderr[-2000:]
    assert forced.step("save-scratch")["status"] == "skipped"
    assert state(node.moto, node.instance_id) == "stopped"


def test_an_instance_the_cloud_does_not_tag_with_the_stack_is_not_touched(
    node: Node, tmp_path: Path
) -> None:
    other = instance(node.moto, stack="someone-else")
    data = json.loads(node.inventory.read_text())
    data["nodes"][0]["instance_id"] = other
    node.inventory.write_text(json.dumps(data))
    done = node.fab("stop", "--force")
    assert done.returncode == 1
    message = done.step("stop")["message"]
    assert message == f"instance {other} is not tagged {T.STACK}={STACK} (tag: someone-else): " + (
        "not touched"
    )
    assert state(node.moto, other) == "running"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["stop", "--timeout", "abc"], "--timeout"),
        (["start", "--timeout", "0"], "--timeout"),
        (["stop", "--sync-timeout", "-1"], "--sync-timeout"),
    ],
)
def test_bad_numbers_are_one_line_and_exit_2_before_any_call(
    args: list[str], says: str, node: Node
) -> None:
    done = run_fab(*args, "--inventory", str(node.inventory), env=LAPTOP)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr
    assert state(node.moto, node.instance_id) == "running"


def test_hosts_without_the_stacks_outputs_are_refused_in_one_line(
    sshd_server: SshServer,
) -> None:
    done = run_fab("-H", f"127.0.0.1:{sshd_server.port}", "stop", env=LAPTOP)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"gpufleet: 127.0.0.1:{sshd_server.port}: no instance_id in the stack outputs' nodes "
        "(give --stack or --inventory with the stack's outputs)"
    )
