"""The node health parsers on recorded shapes (tests/fixtures/health/README.md names each
fixture's source): DCGM's JSON, nvidia-smi nvlink -e, ibstat, sysfs ports, the journal's Xid
lines, and the stored verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import boto3
import pytest

from gpufleet_node import verify_health as vh
from tests.gpufleet_node.test_verify_node import moto_s3  # noqa: F401  (the fixture)
from tests.gpufleet_node.watchdog_fakes import closed_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- dcgmi diag -j --------------------------------------------------------------------------


def test_a_passing_level_1_diag_lists_its_test_and_every_gpu_passing() -> None:
    diag = vh.parse_dcgm_diag(read("dcgm_r1_pass.json"))
    assert diag["version"] == "4.2.3" and diag["runtime_error"] is None
    assert [(t["category"], t["name"], t["status"]) for t in diag["tests"]] == [
        ("Deployment", "software", "Pass")
    ]
    assert [r["status"] for r in diag["tests"][0]["gpus"]] == ["Pass", "Pass"]


def test_a_failing_level_2_diag_keeps_the_gpu_error_id_and_severity() -> None:
    diag = vh.parse_dcgm_diag(read("dcgm_r2_fail_pending_remap.json"))
    memory = next(t for t in diag["tests"] if t["name"] == "memory")
    assert memory["status"] == "Fail"
    bad = memory["gpus"][1]
    assert (bad["gpu"], bad["status"]) == (1, "Fail")
    assert bad["warnings"][0]["error_id"] == 85 and bad["warnings"][0]["severity"] == 6


def test_a_level_3_diag_reads_the_stress_category() -> None:
    diag = vh.parse_dcgm_diag(read("dcgm_r3_fail_thermal.json"))
    assert {t["category"] for t in diag["tests"]} == {
        "Deployment",
        "Integration",
        "Hardware",
        "Stress",
    }


def test_a_diag_that_could_not_run_says_why() -> None:
    diag = vh.parse_dcgm_diag(read("dcgm_runtime_error.json"))
    assert "host engine" in diag["runtime_error"] and diag["tests"] == []


@pytest.mark.parametrize(
    ("text", "said"),
    [("Error: unable to connect", "not JSON"), ('{"x": 1}', "no 'DCGM Diagnostic'")],
)
def test_text_that_is_not_dcgm_json_is_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        vh.parse_dcgm_diag(text)


# --- nvidia-smi nvlink -e, ibstat, sysfs ----------------------------------------------------


def test_nvlink_error_counters_are_read_per_link_and_na_is_none() -> None:
    gpus = vh.parse_nvlink_errors(read("nvlink_errors_h100.txt"))
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[1]["links"][1] == {"link": 1, "replay": 3, "recovery": 2, "crc": None}
    assert gpus[0]["links"][0] == {"link": 0, "replay": 0, "recovery": 0, "crc": 0}


def test_ibstat_ports_keep_state_rate_and_layer_and_skip_the_panic_line() -> None:
    ports = vh.parse_ibstat(read("ibstat_ndr.txt"))
    assert [(p["device"], p["state"], p["rate_gbps"]) for p in ports] == [
        ("mlx5_0", "Active", 400.0),
        ("mlx5_1", "Down", 10.0),
        ("mlx5_2", "Active", 200.0),
    ]
    assert all(p["link_layer"] == "InfiniBand" for p in ports)


def test_a_sysfs_port_reads_in_ibstat_words() -> None:
    port = {
        "device": "mlx5_0",
        "port": 1,
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
    }
    assert vh.port_from_sysfs(port) == {
        "device": "mlx5_0",
        "port": 1,
        "state": "Active",
        "phys_state": "LinkUp",
        "rate_gbps": 400.0,
        "link_layer": "InfiniBand",
    }


# --- the snapshot and the stored verdict -----------------------------------------------------


def test_the_snapshot_keeps_what_parsed_and_names_what_did_not() -> None:
    doc = vh.snapshot(
        taken_at="2026-12-02T01:00:00Z",
        kernel_log=read("journal_xids.txt"),
        kernel_source="journalctl -k -b",
        dcgm="dcgmi: command not found",
        ibstat=read("ibstat_ndr.txt"),
    )
    assert doc["schema"] == vh.SCHEMA
    assert [e["xid"] for e in doc["xid"]["events"]] == [13, 63, 79]
    assert len(doc["infiniband"]) == 3
    assert doc["errors"] == ["dcgm: dcgmi diag -j output is not JSON (Expecting value at char 0)"]
    assert "dcgm" not in doc and "nvidia" not in doc


def test_the_verdict_is_stored_whole_and_read_back(tmp_path: Path) -> None:
    assert vh.read_verdict(tmp_path) is None
    path = vh.store_verdict({"status": "failed"}, tmp_path)
    assert path == tmp_path / "health" / "verdict.json"
    assert vh.read_verdict(tmp_path) == {"status": "failed"}
    assert [p.name for p in path.parent.iterdir()] == ["verdict.json"]


# --- the node-side run -----------------------------------------------------------------------

STUBS = {
    "nvidia-smi": """case "$*" in
  "-q -x") cat "$FIX/verify/a100x8_smi.xml" ;;
  "nvlink --status") cat "$FIX/verify/a100x8_nvlink.txt" ;;
  "nvlink -e") cat "$FIX/health/nvlink_errors_h100.txt" ;;
  *) exit 2 ;;
esac""",
    "dcgmi": 'cat "$FIX/health/dcgm_r2_fail_pending_remap.json"; exit 226',
    "lspci": 'cat "$FIX/verify/lspci_p4d.txt"',
    "systemctl": "echo inactive; exit 3",
    "dmesg": 'cat "$FIX/verify/dmesg_xid79.txt"',
}


def test_the_shipped_files_alone_take_a_snapshot_with_the_tools_they_find(
    tmp_path: Path,
) -> None:
    """Run as the node runs it: the three shipped files alone in a folder, an interpreter
    without user site or PYTHONPATH (-s -E), stub tools on PATH printing the recorded
    outputs."""
    import shutil
    import subprocess
    import sys

    remote = Path(vh.__file__).parent
    (tmp_path / "gpufleet_node").mkdir()
    for name in ("__init__.py", "verify_health.py", "verify_smi.py", "verify_node.py"):
        shutil.copy(remote / name, tmp_path / "gpufleet_node" / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in STUBS.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FIX": str(FIXTURES.parent)}
    done = subprocess.run(
        [sys.executable, "-s", "-E", "-m", "gpufleet_node.verify_health", "--dcgm-level", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == vh.SCHEMA and doc["errors"] == []
    assert len(doc["nvidia"]["gpus"]) == 8 and doc["pci"] == {"gpus": 8, "nvswitches": 6}
    assert doc["dcgm"]["level"] == 2 and doc["dcgm"]["tests"][2]["status"] == "Fail"
    assert doc["fabric_manager"] == "inactive"
    assert [e["xid"] for e in doc["xid"]["events"]] == [79] and doc["xid"]["source"] == "dmesg"
    assert doc["nvlink_errors"][1]["links"][1]["replay"] == 3
    assert set(doc["timings"]) >= {"smi_xml", "dcgm", "kernel_log"}


# --- the verdict's store: the node's file, the quarantine and the bucket ---------------------


def save_args(tmp_path: Path, verdict: dict[str, object], **over: object) -> argparse.Namespace:
    path = tmp_path / "verdict-in.json"
    path.write_text(json.dumps(verdict))
    base: dict[str, object] = {
        "save": str(path),
        "state_dir": str(tmp_path / "state"),
        "quarantine": False,
        "release": False,
        "bucket": "",
        "provider": "aws",
        "region": "us-east-1",
        "s3_endpoint": "",
        "metadata_url": closed_port(),
    }
    return argparse.Namespace(**{**base, **over})


FAILED_VERDICT = {
    "host": "a100x8-0 (10.0.0.5)",
    "status": "failed",
    "taken_at": "2026-12-02T01:00:00Z",
}


def test_a_saved_verdict_is_readable_by_every_user_and_needs_no_bucket(tmp_path: Path) -> None:
    out = vh.save(save_args(tmp_path, FAILED_VERDICT))
    path = tmp_path / "state" / "health" / "verdict.json"
    assert out["file"] == str(path) and vh.read_verdict(tmp_path / "state") == FAILED_VERDICT
    assert path.stat().st_mode & 0o777 == 0o644
    assert out["bucket"] == {"status": "skip", "reason": "the stack has no bucket"}
    assert "quarantine" not in out


def test_quarantine_is_kept_beside_the_verdict_until_released(tmp_path: Path) -> None:
    out = vh.save(save_args(tmp_path, FAILED_VERDICT, quarantine=True))
    mark = json.loads(Path(out["quarantine"]).read_text())
    assert mark["since"] == "2026-12-02T01:00:00Z" and mark["verdict"] == FAILED_VERDICT
    healthy = {**FAILED_VERDICT, "status": "healthy"}
    vh.save(save_args(tmp_path, healthy))  # a verdict alone does not lift it
    assert (tmp_path / "state" / vh.QUARANTINE_FILE).exists()
    assert vh.save(save_args(tmp_path, healthy, release=True))["quarantine"] == "released"
    assert not (tmp_path / "state" / vh.QUARANTINE_FILE).exists()


def test_the_bucket_key_is_the_host_label_in_safe_characters() -> None:
    assert vh.object_key("a100x8-0 (10.0.0.5:22)") == "gpufleet/health/a100x8-0_10.0.0.5_22.json"
    assert vh.object_key("") == "gpufleet/health/node.json"


@pytest.mark.integration
def test_the_verdict_goes_into_the_stack_bucket_with_the_nodes_own_client(
    moto_s3: str,  # noqa: F811  (the imported fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3)
    s3.create_bucket(Bucket="gpufleet-health")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    args = save_args(tmp_path, FAILED_VERDICT, bucket="gpufleet-health", s3_endpoint=moto_s3)
    out = vh.save(args)
    assert out["bucket"]["status"] == "ok", out
    body = s3.get_object(Bucket="gpufleet-health", Key=out["bucket"]["key"])["Body"].read()
    assert json.loads(body) == FAILED_VERDICT


@pytest.mark.integration
def test_a_bucket_that_refuses_the_verdict_is_reported_and_the_node_copy_stays(
    moto_s3: str,  # noqa: F811  (the imported fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    out = vh.save(save_args(tmp_path, FAILED_VERDICT, bucket="no-such", s3_endpoint=moto_s3))
    assert out["bucket"]["status"] == "error" and "NoSuchBucket" in out["bucket"]["reason"]
    assert vh.read_verdict(tmp_path / "state") == FAILED_VERDICT
