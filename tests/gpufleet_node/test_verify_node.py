"""The node-side verify files: parsers for other driver generations, the scratch and object
storage probes against real files and a real S3 API (moto on 127.0.0.1), the CPU training
step under a real torchrun, and the report upload (the probe's client, on the node)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bootstrap.fleet import node_package
from bootstrap.fleet.api import ScratchSpec
from bootstrap.verify import judge as j
from bootstrap.verify.report import REPORT_SCHEMA, VerifyRun, save_report
from bootstrap.verify.ship import REMOTE_FILES
from gpufleet_node import verify_node, verify_smi
from infra.catalog import load_catalog
from tests.gpufleet_node.watchdog_fakes import closed_port
from tests.support.moto_server import moto_server

NODE_MODULE = "gpufleet_node.verify_node"  # run as the node runs it: python -m

# The layout drivers before R470 print (V100 era): single/double-bit ECC with totals,
# "throttle" instead of "event" reasons, page retirement instead of row remapping.
OLD_DRIVER_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v11.dtd">
<nvidia_smi_log>
  <driver_version>460.106.00</driver_version>
  <cuda_version>11.2</cuda_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:00:1E.0">
    <product_name>Tesla V100-SXM2-16GB</product_name>
    <persistence_mode>Disabled</persistence_mode>
    <minor_number>0</minor_number>
    <pci><pci_gpu_link_info>
      <pcie_gen><max_link_gen>3</max_link_gen><current_link_gen>3</current_link_gen></pcie_gen>
      <link_widths><max_link_width>16x</max_link_width><current_link_width>16x</current_link_width></link_widths>
    </pci_gpu_link_info></pci>
    <clocks_throttle_reasons>
      <clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>
      <clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown>
    </clocks_throttle_reasons>
    <fb_memory_usage><total>16160 MiB</total></fb_memory_usage>
    <ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
    <ecc_errors>
      <volatile>
        <single_bit><device_memory>3</device_memory><total>3</total></single_bit>
        <double_bit><device_memory>1</device_memory><total>1</total></double_bit>
      </volatile>
      <aggregate>
        <single_bit><total>9</total></single_bit>
        <double_bit><total>1</total></double_bit>
      </aggregate>
    </ecc_errors>
    <retired_pages>
      <multiple_single_bit_retirement><retired_count>2</retired_count></multiple_single_bit_retirement>
      <double_bit_retirement><retired_count>1</retired_count></double_bit_retirement>
      <pending_blacklist>Yes</pending_blacklist>
    </retired_pages>
    <remapped_rows>N/A</remapped_rows>
    <temperature><gpu_temp>44 C</gpu_temp></temperature>
    <power_readings><power_limit>300.00 W</power_limit></power_readings>
  </gpu>
</nvidia_smi_log>
"""


def test_older_driver_xml_is_read_with_the_same_field_names() -> None:
    gpu = verify_smi.parse_smi_xml(OLD_DRIVER_XML)["gpus"][0]
    assert gpu["ecc_volatile"] == {"corrected": 3, "uncorrected": 1}
    assert gpu["ecc_aggregate"] == {"corrected": 9, "uncorrected": 1}
    assert gpu["retired_pages"] == {"single_bit": 2, "double_bit": 1, "pending": True}
    assert gpu["remapped_rows"]["pending"] is None
    assert gpu["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert gpu["persistence_mode"] is False
    assert gpu["power_limit_w"] == 300.0
    assert gpu["pcie"] == {"gen_current": 3, "gen_max": 3, "width_current": 16, "width_max": 16}


def test_xml_that_is_not_an_nvidia_smi_log_is_rejected() -> None:
    with pytest.raises(ValueError, match="not XML"):
        verify_smi.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate")
    with pytest.raises(ValueError, match="expected <nvidia_smi_log>"):
        verify_smi.parse_smi_xml("<html></html>")


def test_a_driver_that_does_not_answer_is_reported_not_raised() -> None:
    out = verify_node.nvidia_from_outputs(
        {
            "rc": 9,
            "out": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver. Make sure that the latest NVIDIA driver is installed and running.\n",
            "err": "",
        },
        lspci="00:1e.0 0302: 10de:1db1 (rev a1)\n",
    )
    assert out["available"] is False
    assert "couldn't communicate with the NVIDIA driver" in out["error"]
    assert out["pci"] == {"gpus": 1, "nvswitches": 0}


def test_query_csv_reads_hex_masks_and_not_available_fields() -> None:
    rows = verify_smi.parse_query_csv(
        "0, 00000000:00:1E.0, 3, 3, 16, 16, 97, 71, 0x0000000000000044, [N/A]\ngarbage line\n"
    )
    assert rows == [
        {
            "index": 0.0,
            "pci.bus_id": "00000000:00:1E.0",
            "pcie.link.gen.current": 3.0,
            "pcie.link.gen.max": 3.0,
            "pcie.link.width.current": 16.0,
            "pcie.link.width.max": 16.0,
            "utilization.gpu": 97.0,
            "temperature.gpu": 71.0,
            "clocks_throttle_reasons.active": 0x44,
            "power.draw": None,
        }
    ]
    assert verify_smi.throttle_reasons(0x44) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_load_summary_ignores_what_idle_gpus_report() -> None:
    fields = verify_smi.LOAD_QUERY_FIELDS
    idle = verify_smi.parse_query_csv("0, b, 1, 4, 16, 16, 0, 30, 0x1, 50\n", fields)
    busy = verify_smi.parse_query_csv("0, b, 4, 4, 16, 16, 100, 65, 0x4, 390\n", fields)
    (gpu,) = verify_smi.summarise_load([idle, busy, idle])
    assert (gpu["pcie_gen_busy_max"], gpu["busy_samples"], gpu["samples"]) == (4, 1, 3)
    assert gpu["throttle_reasons"] == ["sw_power_cap"]  # gpu_idle only ever seen at idle
    assert gpu["temperature_max_c"] == 65


def test_scratch_probe_writes_and_reads_a_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    result = verify_node.scratch_probe(str(tmp_path), size_mb=32, block_mb=4, threads=4)
    assert result["error"] is None
    assert result["bytes"] == 32 << 20
    assert result["read_gbs"] > 0 and result["write_gbs"] > 0
    assert result["is_mount"] is False
    assert list(tmp_path.iterdir()) == []


def test_scratch_probe_on_a_missing_mount_says_so(tmp_path: Path) -> None:
    result = verify_node.scratch_probe(str(tmp_path / "scratch"), size_mb=8)
    assert "does not exist" in result["error"] and "mounted" in result["error"]


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    with moto_server(warm=("s3",)) as url:
        yield url


def probe_args(endpoint: str, bucket: str, provider: str = "aws") -> Namespace:
    return Namespace(
        bucket=bucket,
        provider=provider,
        region="us-east-1",
        s3_endpoint=endpoint,
        metadata_url=closed_port(),  # no metadata service: the keys come from the environment
    )


# Each S3-compatible cloud's node module with its own environment keys, against moto's S3
# standing for S3, OSS's and COS's S3-compatible endpoints (what moto proves is our SigV4
# and addressing, not that OSS or COS accept them: only a real bucket does).
S3_CLOUDS = {
    "aws": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "alicloud": ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"),
    "tencent": ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY"),
}


def only_the_clouds_own_keys(monkeypatch: pytest.MonkeyPatch, provider: str) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in S3_CLOUDS[provider]:
        monkeypatch.setenv(name, "testing")


@pytest.mark.integration
@pytest.mark.parametrize("provider", sorted(S3_CLOUDS))
def test_storage_probe_puts_gets_and_deletes_with_the_nodes_own_client(
    moto_s3: str, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3)
    s3.create_bucket(Bucket=f"gpufleet-probe-{provider}")
    only_the_clouds_own_keys(monkeypatch, provider)
    result = verify_node.storage_probe(probe_args(moto_s3, f"gpufleet-probe-{provider}", provider))
    assert result["status"] == "ok", result
    assert result["tool"] == "bucket.py" and result["bytes"] == 1 << 20
    assert {"put_s", "get_s", "delete_s"} <= set(result)
    assert s3.list_objects_v2(Bucket=f"gpufleet-probe-{provider}").get("KeyCount") == 0


@pytest.mark.integration
def test_storage_probe_on_a_missing_bucket_is_an_error_with_the_reason(moto_s3: str) -> None:
    result = verify_node.storage_probe(probe_args(moto_s3, "no-such-bucket"))
    assert result["status"] == "error" and "NoSuchBucket" in result["reason"]


def test_storage_probe_without_credentials_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    result = verify_node.storage_probe(probe_args(closed_port(), "gpufleet-probe"))
    assert result["status"] == "skip" and "no credentials" in result["reason"], result


def test_storage_probe_for_a_cloud_without_a_node_module_is_an_error_naming_the_known_ones() -> (
    None
):
    result = verify_node.storage_probe(probe_args(closed_port(), "b", provider="nimbus"))
    assert result["status"] == "error" and "'nimbus'" in result["reason"]
    assert "aws" in result["reason"]


def test_storage_probe_without_a_bucket_is_skipped_with_the_reason() -> None:
    result = verify_node.storage_probe(probe_args("", ""))
    assert result == {"status": "skip", "reason": "the stack has no bucket"}


@pytest.mark.integration
def test_the_shipped_probe_needs_neither_boto3_nor_a_cli_on_the_node(
    moto_s3: str, tmp_path: Path
) -> None:
    """The files verify-gpu ships, run by a bare interpreter (no site-packages, so no boto3;
    an empty PATH, so no aws CLI or ossutil): the probe still puts, gets and deletes."""
    boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3).create_bucket(
        Bucket="gpufleet-bare"
    )
    for name in REMOTE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(node_package.source(name).read_bytes())
    code = (
        "import argparse, json\nfrom gpufleet_node import verify_node\n"
        "a = argparse.Namespace(bucket='gpufleet-bare', provider='aws', region='us-east-1',"
        f" s3_endpoint={moto_s3!r}, metadata_url={closed_port()!r})\n"
        "print(json.dumps(verify_node.storage_probe(a)))\n"
    )
    env = {"PATH": "", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["tool"] == "bucket.py", result


@pytest.mark.integration
@pytest.mark.parametrize("provider", sorted(S3_CLOUDS))
def test_the_report_upload_is_the_nodes_own_client_with_its_clouds_keys(
    moto_s3: str, provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3)
    s3.create_bucket(Bucket=f"gpufleet-reports-{provider}")
    only_the_clouds_own_keys(monkeypatch, provider)
    report = tmp_path / "verify-20261129T120000Z.json"
    report.write_text('{"overall": "PASS"}')
    args = probe_args(moto_s3, f"gpufleet-reports-{provider}", provider)
    result = verify_node.upload_report(args, report)
    key = f"gpufleet/verify/{report.name}"
    assert result == {
        "status": "ok",
        "tool": "bucket.py",
        "url": f"{moto_s3}/gpufleet-reports-{provider}/{key}",
    }
    body = s3.get_object(Bucket=f"gpufleet-reports-{provider}", Key=key)["Body"]
    assert json.loads(body.read()) == {"overall": "PASS"}


def test_without_credentials_the_upload_is_skipped_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    report = tmp_path / "r.json"
    report.write_text("{}")
    result = verify_node.upload_report(probe_args(closed_port(), "b"), report)
    assert result["status"] == "skip" and "no credentials" in result["reason"], result


def test_an_upload_for_a_cloud_without_a_node_module_is_an_error(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text("{}")
    result = verify_node.upload_report(probe_args(closed_port(), "b", "nimbus"), report)
    assert result["status"] == "error" and "'nimbus'" in result["reason"]


def test_the_saved_report_is_named_by_stack_and_time(tmp_path: Path) -> None:
    run = VerifyRun(
        expected=j.expected_from(None, load_catalog(), tier="t4x1"),
        verdicts=[],
        cluster=None,
        measurements={},
        seconds=1.0,
        started_at="2026-11-29T12:00:00Z",
    )
    path = save_report(run, tmp_path)
    assert path == tmp_path / "adhoc" / "verify-20261129T120000Z.json"
    doc = json.loads(path.read_text())
    assert doc["schema"] == REPORT_SCHEMA and doc["overall"] == j.FAIL  # no host verified
    assert doc["expected"]["tier"] == "t4x1"


@pytest.fixture
def ram_scratch(tmp_path: Path) -> Iterator[Path]:
    """Scratch on tmpfs when there is one, so disk speed cannot fail a test about training."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="gpufleet-verify-", dir=shm))
    else:
        path = tmp_path / "scratch"
        path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_the_cpu_training_step_runs_under_torchrun_and_its_loss_falls(
    tmp_path: Path, ram_scratch: Path
) -> None:
    """verify_node.py run directly (no SSH): two gloo processes, bf16 autocast, checkpointing."""
    out = tmp_path / "report.json"
    scratch = ram_scratch
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            NODE_MODULE,
            "--mode=cpu",
            "--nproc=2",
            "--steps=25",
            f"--scratch={scratch}",
            "--scratch-mb=16",
            f"--out={out}",
            f"--workdir={tmp_path / 'work'}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = j.parse_report(out.read_text())
    run = report["torchrun"]
    assert run["errors"] == [] and run["rc"] == 0
    train = run["train"]
    assert (train["world"], train["backend"], train["amp"]) == (2, "gloo", "bf16-autocast")
    assert train["checkpointing"] is True and len(train["losses"]) == 25
    assert train["losses"][-1] < 0.8 * train["losses"][0]
    assert run["allreduce"]["correct"] is True and run["allreduce"]["world"] == 2
    # A data-disk expectation: the verdict must not hinge on this machine's disk speed.
    exp = j.expected_from(
        None, load_catalog(), tier="a100x8", cpu=True, scratch=ScratchSpec(str(scratch), "disk")
    )
    verdict = j.judge(report, exp)
    assert verdict.status == j.CPU_ONLY, verdict.checks
    assert "verify: torchrun" in proc.stderr  # progress goes to stderr, the JSON to --out


@pytest.mark.slow
def test_the_training_step_under_torchrun_leaves_no_torchelastic_folder_behind(
    tmp_path: Path, ram_scratch: Path
) -> None:
    """torchrun makes a log folder per launch (``torchelastic_*`` in the temp dir) unless it
    is given one: verify_node.py gives it one inside its own run folder and removes that.

    The run gets a private TMPDIR so other processes on this machine cannot make the answer
    wrong either way: everything it would have left in /tmp would be left in there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            NODE_MODULE,
            "--mode=cpu",
            "--nproc=2",
            "--steps=6",
            f"--scratch={ram_scratch}",
            "--scratch-mb=8",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.returncode == 0, proc.stderr
    run = j.parse_report(out.read_text())["torchrun"]
    assert run["errors"] == [] and run["rc"] == 0 and len(run["train"]["losses"]) == 6
    assert run["allreduce"]["world"] == 2
    left = sorted(p.name for p in tmp.iterdir())
    # torchinductor_<user> is torch's per-user compile cache, reused by every run, not a leak.
    assert [n for n in left if not n.startswith("torchinductor_")] == []
    assert "gpufleet-verify-run-" not in " ".join(left)
