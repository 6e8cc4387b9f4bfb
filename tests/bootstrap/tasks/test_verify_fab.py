"""``fab verify-gpu`` end to end: real fab, real SSH to the local sshd, the node's own venv
(made by ``fab install-pytorch``), real torchrun with gloo processes, a real loss curve."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.bootstrap.stack_outputs import ND_TIER, p4d_tier
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def node_scratch() -> Iterator[Path]:
    """A scratch folder the SSH test user can write (pytest's tmp dirs are root-only), on
    tmpfs when there is one: these tests are about the plumbing, not this machine's disk."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="gpufleet-verify-scratch-", dir=shm))
        base.chmod(0o755)
    else:
        base = node_dir("gpufleet-verify-scratch-")
    scratch = base / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    try:
        yield scratch
    finally:
        shutil.rmtree(base, ignore_errors=True)


def write_inventory(
    server: SshServer, folder: Path, scratch: Path, *, nodes: int = 1, tier: str = "a100x8"
) -> Path:
    tiers = {"a100x8": p4d_tier(), "h100x8": dict(ND_TIER)}
    providers = {"a100x8": "aws", "h100x8": "azure"}
    data = server.inventory(
        stack="verify-test",
        provider=providers[tier],
        tier=tiers[tier],
        nodes=[
            {
                "name": f"node-{i}",
                "role": "head" if i == 0 else "worker",
                "instance_id": f"i-{i}",
                "public_ip": server.host,
                "private_ip": server.host,
            }
            for i in range(nodes)
        ],
        scratch={"path": str(scratch), "kind": "disk", "devices": 1, "size_gb": 10},
    )
    path = folder / "inventory.json"
    path.write_text(json.dumps(data))
    return path


def verify(inventory: Path, reports: Path, *args: str) -> FabResult:
    return run_fab(
        "verify-gpu",
        "--inventory",
        str(inventory),
        "--reports",
        str(reports),
        "--scratch-mb",
        "16",
        "--state-dir",
        str(reports.parent / "state"),
        *args,
        timeout=400,
    )


def checks(host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in host["checks"]}


@pytest.mark.slow
def test_cpu_mode_trains_on_the_node_and_is_reported_as_a_cpu_run(
    sshd_server: SshServer,
    node_venv: tuple[Path, FabResult],
    node_scratch: Path,
    tmp_path: Path,
) -> None:
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout + installed.stderr
    inventory = write_inventory(sshd_server, tmp_path, node_scratch)
    result = verify(
        inventory, tmp_path / "reports", "--cpu", "--python", str(venv / "bin/python"), "--json"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = result.doc
    assert doc["overall"] == "CPU-ONLY"  # never PASS for the a100x8 tier
    (host,) = doc["hosts"]
    c = checks(host)
    assert c["gpu"]["status"] == "NOT-RUN" and "NOT verified" in c["gpu"]["detail"]
    assert c["train"]["status"] == "PASS" and "2 gloo ranks" in c["train"]["detail"]
    assert c["allreduce.local"]["status"] == "PASS"
    assert c["scratch.read"]["value"] > 0
    assert c["storage"]["status"] == "NOT-RUN"  # the inventory names no bucket
    measured = doc["measurements"][host["host"]]["local"]
    losses = measured["torchrun"]["train"]["losses"]
    assert losses[-1] < 0.8 * losses[0]
    assert measured["host"]["executable"].startswith(str(venv))
    saved = Path(doc["report_path"])
    assert saved.parent == tmp_path / "reports" / "verify-test"
    assert json.loads(saved.read_text())["overall"] == "CPU-ONLY"
    assert doc["upload"] == {"status": "skip", "reason": "the stack has no bucket"}


def test_without_cpu_a_node_with_no_gpu_fails_clearly_without_a_traceback(
    sshd_server: SshServer,
    node_venv: tuple[Path, FabResult],
    node_scratch: Path,
    tmp_path: Path,
) -> None:
    venv, _ = node_venv
    inventory = write_inventory(sshd_server, tmp_path, node_scratch)
    result = verify(
        inventory, tmp_path / "reports", "--quick", "--python", str(venv / "bin/python")
    )
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "Traceback" not in out
    assert "gpu.present" in out and "no NVIDIA GPU" in out and "--cpu" in out
    assert "verify-gpu: FAIL" in result.stdout
    # verify-gpu keeps the node's health verdict as fab health does: its findings with the
    # health snapshot's (the a100x8 tier's 8 GPUs are not in the driver), failed.
    kept = json.loads((tmp_path / "state" / "health" / "verdict.json").read_text())
    assert (kept["origin"], kept["status"]) == ("verify-gpu", "failed")
    assert kept["reasons"][0]["text"] == "0 of 8 GPUs in the driver (no nvidia-smi)"
    assert "gpu.present" in [r["check"] for r in kept["reasons"]]
    assert "failed, kept in " in result.stdout


def test_a_missing_node_python_is_explained(
    sshd_server: SshServer, node_scratch: Path, tmp_path: Path
) -> None:
    inventory = write_inventory(sshd_server, tmp_path, node_scratch)
    result = verify(
        inventory,
        tmp_path / "reports",
        "--cpu",
        "--python",
        "/nonexistent/venv/bin/python",
        "--json",
    )
    assert result.returncode == 1
    (host,) = result.doc["hosts"]
    assert "fab install-pytorch" in host["checks"][0]["detail"]


@pytest.mark.parametrize(
    ("writes", "says"),
    [
        ('{"schema": "gpufleet.verify/1", "stage": "local", "nvi', "truncated"),
        ("Segmentation fault (core dumped)", "not JSON"),
        (None, "the node wrote no report"),
    ],
)
def test_a_bad_report_from_the_node_fails_that_host_with_the_reason(
    sshd_server: SshServer, node_scratch: Path, tmp_path: Path, writes: str | None, says: str
) -> None:
    # A stand-in for the node's python that writes a broken report where --out points.
    fake = node_scratch / "fake-python"
    action = f"printf '%s' '{writes}' > \"${{a#--out=}}\"" if writes is not None else ":"
    fake.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in --out=*) {action};; esac; done\n'
        "echo 'worker died' >&2\nexit 3\n"
    )
    fake.chmod(0o755)
    inventory = write_inventory(sshd_server, tmp_path, node_scratch)
    result = verify(inventory, tmp_path / "reports", "--python", str(fake), "--json")
    assert result.returncode == 1
    (host,) = result.doc["hosts"]
    first = host["checks"][0]
    assert (first["name"], first["status"]) == ("report", "FAIL")
    assert says in first["detail"]
    if writes is None:
        assert "worker died" in first["detail"]


@pytest.mark.slow
def test_two_nodes_run_the_cross_node_all_reduce_and_training_step(
    sshd_server: SshServer,
    node_venv: tuple[Path, FabResult],
    node_scratch: Path,
    tmp_path: Path,
) -> None:
    """Two inventory nodes (the same sshd twice), one gloo process each: the cross-node stage
    meets through torchrun's rendezvous on the head's private IP."""
    venv, _ = node_venv
    inventory = write_inventory(sshd_server, tmp_path, node_scratch, nodes=2)
    result = verify(
        inventory,
        tmp_path / "reports",
        "--cpu",
        "--nproc",
        "1",
        "--steps",
        "20",
        "--python",
        str(venv / "bin/python"),
        "--master-port",
        str(free_port()),
        "--json",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = result.doc
    assert [checks(h)["allreduce.local"]["status"] for h in doc["hosts"]] == ["NOT-RUN"] * 2
    cluster = checks(doc["cluster"])
    assert cluster["allreduce.cross"]["status"] == "PASS"
    assert "2 gloo ranks" in cluster["allreduce.cross"]["detail"]
    assert cluster["train.cross"]["status"] == "PASS"
    cross = [m["cross"]["torchrun"] for m in doc["measurements"].values()]
    assert {c["nnodes"] for c in cross} == {2}
    assert doc["overall"] == "CPU-ONLY"


@pytest.mark.slow
def test_two_nd_nodes_run_the_cross_node_stage_with_the_infiniband_env(
    sshd_server: SshServer,
    node_venv: tuple[Path, FabResult],
    node_scratch: Path,
    tmp_path: Path,
) -> None:
    """An Azure ND inventory: the cross-node run on the node gets InfiniBand's NCCL settings
    with the user's --node-env over them, and the report and the terminal say so."""
    venv, _ = node_venv
    inventory = write_inventory(sshd_server, tmp_path, node_scratch, nodes=2, tier="h100x8")
    reports = tmp_path / "reports"
    result = verify(
        inventory,
        reports,
        "--cpu",
        "--nproc",
        "1",
        "--steps",
        "20",
        "--python",
        str(venv / "bin/python"),
        "--master-port",
        str(free_port()),
        "--node-env",
        "NCCL_DEBUG=WARN,NCCL_SOCKET_IFNAME=lo",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cross-node env: infiniband: NCCL_IB_DISABLE=0" in result.stdout
    assert "--node-env over it: NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo" in result.stdout
    (saved,) = (reports / "verify-test").glob("verify-*.json")
    doc = json.loads(saved.read_text())
    assert doc["network"]["fabric"] == "infiniband"
    assert doc["network"]["env"]["NCCL_SOCKET_IFNAME"] == "eth0"  # the default ...
    assert doc["network"]["applied"]["NCCL_SOCKET_IFNAME"] == "lo"  # ... the user's won
    # What the node's own process saw (verify_node.py reads its environment).
    seen = [m["cross"]["network_env"] for m in doc["measurements"].values()]
    assert len(seen) == 2
    for env in seen:
        assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
        assert env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
        assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_DEBUG"]) == ("lo", "WARN")
    cluster = checks(doc["cluster"])
    assert cluster["fabric"]["status"] == "PASS"
    assert cluster["train.cross"]["status"] == "PASS"
