"""fab health over the real sshd: the snapshot runs on the node with a fake nvidia-smi on
its PATH printing recorded outputs (tests/fixtures/verify, tests/fixtures/health), the
verdict is judged here and kept on the node; fab status shows it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def fake_tools(folder: Path, smi_xml: str, dcgm: str = "") -> Path:
    """nvidia-smi (and dcgmi) printing recorded outputs, in a folder the node user reads."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "verify" / smi_xml, bin_dir / "smi.xml")
    shutil.copy(FIXTURES / "verify" / "a100x8_nvlink.txt", bin_dir / "nvlink.txt")
    smi = f"""#!/bin/sh
case "$*" in
  "-q -x") cat {bin_dir}/smi.xml ;;
  "nvlink --status") cat {bin_dir}/nvlink.txt ;;
  *) exit 0 ;;
esac
"""
    (bin_dir / "nvidia-smi").write_text(smi)
    tools = ["nvidia-smi"]
    if dcgm:
        shutil.copy(FIXTURES / "health" / dcgm, bin_dir / "dcgm.json")
        (bin_dir / "dcgmi").write_text(f"#!/bin/sh\ncat {bin_dir}/dcgm.json\nexit 226\n")
        tools.append("dcgmi")
    for name in tools:
        (bin_dir / name).chmod(0o755)
    bin_dir.chmod(0o755)
    return bin_dir


@pytest.fixture
def node(sshd_server: SshServer) -> Iterator[tuple[SshServer, Path]]:
    folder = node_dir("gpufleet-health-")
    yield sshd_server, folder
    shutil.rmtree(folder, ignore_errors=True)


def inventory(server: SshServer, folder: Path) -> Path:
    path = folder / "inventory.json"
    path.write_text(json.dumps(server.inventory()))
    return path


def fab_health(server: SshServer, folder: Path, *extra: str) -> FabResult:
    inv = inventory(server, folder)
    state = folder / "state"
    return run_fab("health", "--inventory", str(inv), "--state-dir", str(state), *extra)


def test_a_node_without_gpus_is_said_to_have_none_and_is_not_failed(
    node: tuple[SshServer, Path],
) -> None:
    server, folder = node
    result = fab_health(server, folder, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    step = result.step("health")
    verdict = step["details"]["verdict"]
    assert verdict["status"] == "healthy"
    assert "no NVIDIA GPU on this node" in verdict["reasons"][0]["text"]
    kept = json.loads((folder / "state" / "health" / "verdict.json").read_text())
    assert kept == verdict
    assert step["details"]["stored"]["bucket"]["status"] == "skip"


def test_a_node_with_uncorrectable_ecc_errors_is_failed_and_kept_so(
    node: tuple[SshServer, Path],
) -> None:
    server, folder = node
    tools = fake_tools(folder, "a100x8_smi_ecc.xml")
    result = fab_health(server, folder, "--node-path", str(tools))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "volatile uncorrectable ECC" in result.stdout
    assert "drain the GPU and reset it" in result.stdout
    kept = json.loads((folder / "state" / "health" / "verdict.json").read_text())
    assert kept["status"] == "failed" and kept["host"].startswith("local-0")
    # The stack's offline plan has no local-test stack: the replace line says why.
    assert "replace: cannot build the node URNs of stack 'local-test'" in result.stdout


def test_deep_runs_dcgm_and_its_failure_fails_the_node(node: tuple[SshServer, Path]) -> None:
    server, folder = node
    tools = fake_tools(folder, "a100x8_smi.xml", dcgm="dcgm_r2_fail_row_remap_failure.json")
    result = fab_health(server, folder, "--node-path", str(tools), "--deep", "2", "--json")
    verdict = result.step("health")["details"]["verdict"]
    assert verdict["status"] == "failed", verdict
    assert [r["check"] for r in verdict["reasons"]] == ["dcgm"]
    assert "dcgm" in verdict["checked"]


def test_status_shows_the_verdict_and_its_age(node: tuple[SshServer, Path]) -> None:
    server, folder = node
    tools = fake_tools(folder, "a100x8_smi_ecc.xml")
    fab_health(server, folder, "--node-path", str(tools))
    inv = inventory(server, folder)
    result = run_fab(
        "status", "--inventory", str(inv), "--state-dir", str(folder / "state"), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    health = result.step("status")["details"]["health"]
    assert health["status"] == "failed" and health["age"].endswith("m")
    table = run_fab("status", "--inventory", str(inv), "--state-dir", str(folder / "state"))
    assert "failed" in table.stdout


def test_quarantine_marks_a_failed_node_until_released(node: tuple[SshServer, Path]) -> None:
    server, folder = node
    mark = folder / "state" / "health" / "quarantine.json"
    bad = fake_tools(folder / "bad", "a100x8_smi_ecc.xml")
    result = fab_health(server, folder, "--node-path", str(bad), "--quarantine")
    assert result.returncode == 1 and f"quarantine: {mark}" in result.stdout
    assert json.loads(mark.read_text())["verdict"]["status"] == "failed"
    inv = inventory(server, folder)
    shown = run_fab("status", "--inventory", str(inv), "--state-dir", str(folder / "state"))
    assert "QUARANTINED" in shown.stdout
    good = fake_tools(folder / "good", "a100x8_smi.xml")
    # A healthy node is never quarantined; only --release lifts an earlier mark.
    fab_health(server, folder, "--node-path", str(good), "--quarantine")
    assert mark.exists()
    released = fab_health(server, folder, "--node-path", str(good), "--release")
    assert released.returncode == 0 and not mark.exists()
