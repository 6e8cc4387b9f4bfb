"""verify-gpu's verdicts on recorded-format outputs of healthy and broken 8x A100 nodes.

The node report is assembled from the fixture files through the same functions the node
runs (``nvidia_from_outputs``, ``xid_from_log``, ``summarise_load``), then judged against
the a100x8 tier from the real catalog.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from bootstrap.verify import judge as j
from bootstrap.verify.ship import VerifyOptions, node_command, parse_node_env
from bootstrap.verify.verdict_text import overall_line, verdict_text
from gpufleet_node import verify_node
from infra.catalog import load_catalog
from tests.bootstrap.verify.verify_reports import (
    cpu_report,
    cross_report,
    expected,
    node_report,
    read,
    statuses,
)


def test_a_healthy_8x_a100_node_passes_every_check() -> None:
    verdict = j.judge(node_report(), expected())
    assert verdict.status == j.PASS, [c for c in verdict.checks if c.status != j.PASS]
    assert list(statuses(verdict)) == [
        "gpu.count",
        "gpu.model",
        "gpu.memory",
        "software",
        "mig",
        "ecc",
        "memory.remap",
        "throttle",
        "temperature",
        "persistence",
        "xid",
        "fabric-manager",
        "infiniband",
        "nvlink",
        "pcie",
        "gemm",
        "hbm",
        "allreduce.local",
        "train",
        "mfu",
        "scratch.read",
        "scratch.write",
        "storage",
    ]
    assert verdict.check("gpu.count").measured == "8"
    assert verdict.check("nvlink").measured == "96 links active"
    # Idle links sit at gen1; the judge reads the link under load.
    assert verdict.check("pcie").measured == "gen4 x16 (under load)"
    assert "power cap reached on GPU1, GPU5" in verdict.check("throttle").detail


def test_mfu_is_model_flops_over_the_catalog_peak_of_every_gpu() -> None:
    check = j.judge(node_report(), expected()).check("mfu")
    bench = json.loads(read("a100x8_bench.json"))["train"]
    want = bench["tokens_per_s"] * bench["flops_per_token"] / (8 * 312e12)
    assert check.value == pytest.approx(want)
    assert check.measured.startswith(f"{want:.1%}")


def test_a_node_missing_one_of_eight_gpus_fails_and_names_the_evidence() -> None:
    def seven_gemms(r: dict[str, Any]) -> None:
        r["torchrun"]["gemm"] = r["torchrun"]["gemm"][:7]
        r["torchrun"]["hbm"] = r["torchrun"]["hbm"][:7]

    report = node_report(
        smi="a100x8_smi_missing_gpu.xml",
        smi_rc=15,
        smi_err="Unable to determine the device handle for GPU0000:A0:1D.0: Unknown Error",
        nvlink="a100x8_nvlink_missing_gpu.txt",
        load="a100x8_load_missing_gpu.csv",
        dmesg="dmesg_xid79.txt",
        torch_devices=7,
        edit=seven_gemms,
    )
    verdict = j.judge(report, expected())
    count = verdict.check("gpu.count")
    assert (count.status, count.measured) == (j.FAIL, "7 of 8")
    assert "lspci shows 8 NVIDIA GPU(s), the driver 7" in count.detail
    assert "Unable to determine the device handle" in count.detail
    xid = verdict.check("xid")
    assert (xid.status, xid.measured) == (j.FAIL, "Xid 79")
    assert "0000:a0:1d" in xid.detail
    assert verdict.status == j.FAIL


def test_uncorrectable_ecc_errors_and_a_pending_row_remap_fail_the_node() -> None:
    verdict = j.judge(node_report(smi="a100x8_smi_ecc.xml", dmesg="dmesg_xid48.txt"), expected())
    ecc = verdict.check("ecc")
    assert ecc.status == j.FAIL and "GPU5: 2" in ecc.detail
    remap = verdict.check("memory.remap")
    assert remap.status == j.FAIL and "GPU5: row remap pending" in remap.detail
    assert verdict.check("xid").measured == "Xid 48"  # 63 rides along, 48 is the fatal one
    assert verdict.status == j.FAIL


def test_nvlink_with_inactive_links_fails_on_an_nvlink_tier() -> None:
    verdict = j.judge(
        node_report(topo="a100x8_topo_nvlink_down.txt", nvlink="a100x8_nvlink_down.txt"),
        expected(),
    )
    check = verdict.check("nvlink")
    assert check.status == j.FAIL
    assert "GPU3 link(s) 4, 5 inactive" in check.detail


def test_nvlink_is_not_judged_on_a_tier_without_it() -> None:
    verdict = j.judge(node_report(), expected(tier="t4x4"))
    assert verdict.check("nvlink").status == j.NOT_RUN


def test_a_gpu_on_a_x8_pcie_link_fails_with_the_threshold_named() -> None:
    check = j.judge(node_report(load="a100x8_load_pcie_x8.csv"), expected()).check("pcie")
    assert check.status == j.FAIL
    assert check.measured == "gen4 x8 (under load)"
    assert "GPU6 gen4 x8: width below x16" in check.detail
    assert check.threshold == "min_pcie_width/min_pcie_gen"


def test_idle_link_downshift_is_only_a_warning_without_load_samples() -> None:
    check = j.judge(node_report(load=None), expected()).check("pcie")
    assert check.status == j.WARN
    assert "read at idle" in check.detail


def test_thermal_throttling_fails_and_the_hot_gpu_is_named() -> None:
    verdict = j.judge(node_report(load="a100x8_load_thermal.csv"), expected())
    throttle = verdict.check("throttle")
    assert throttle.status == j.FAIL
    assert throttle.measured == "GPU2: hw_thermal_slowdown, sw_thermal_slowdown"
    temp = verdict.check("temperature")
    assert (temp.status, temp.measured, temp.threshold) == (j.WARN, "91 C", "max_temperature_c")


def test_gemm_at_40_percent_of_peak_fails_and_says_by_how_much() -> None:
    def slow_gpu4(r: dict[str, Any]) -> None:
        r["torchrun"]["gemm"][4]["tflops"] = 0.40 * 312

    check = j.judge(node_report(edit=slow_gpu4), expected()).check("gemm")
    gpu = load_catalog().gpus["A100-40GB"]
    warn_at = 0.75 * 0.869 * 312
    assert check.status == j.FAIL
    assert check.threshold == "warn_ratio"
    assert check.shortfall == pytest.approx(1 - 124.8 / warn_at)
    assert check.value == pytest.approx(124.8)
    assert "slow: GPU4 125" in check.detail
    assert f"of expected {gpu.expected_gemm_tflops:,.1f} TF/s" in check.detail
    assert "39% below the warn_ratio 0.75 threshold" in check.detail


def test_gemm_a_little_slow_is_a_warning_naming_the_pass_ratio() -> None:
    def slowish(r: dict[str, Any]) -> None:
        r["torchrun"]["gemm"][0]["tflops"] = 0.85 * 0.869 * 312

    check = j.judge(node_report(edit=slowish), expected()).check("gemm")
    assert (check.status, check.threshold) == (j.WARN, "pass_ratio")


def test_thresholds_come_from_the_catalog_not_the_code() -> None:
    exp = expected()
    stricter = j.Expected(**{**exp.__dict__, "thresholds": {**exp.thresholds, "pass_ratio": 0.999}})
    assert j.judge(node_report(), exp).check("gemm").status == j.PASS
    assert j.judge(node_report(), stricter).check("gemm").status == j.WARN


def test_mig_enabled_fails_a_tier_that_rents_whole_gpus() -> None:
    check = j.judge(node_report(smi="a100x8_smi_mig.xml"), expected()).check("mig")
    assert check.status == j.FAIL and "nvidia-smi -mig 0" in check.detail


def test_fabric_manager_down_on_an_nvswitch_node_fails() -> None:
    def fm_down(r: dict[str, Any]) -> None:
        r["fabric_manager"] = {"state": "inactive", "error": None}

    check = j.judge(node_report(edit=fm_down), expected()).check("fabric-manager")
    assert (check.status, check.measured) == (j.FAIL, "inactive")


def test_a_torch_build_newer_than_the_driver_is_the_driver_torch_mismatch() -> None:
    def mismatch(r: dict[str, Any]) -> None:
        r["torch"].update(torch="2.13.0+cu130", torch_cuda="13.0", cuda_available=False)

    check = j.judge(node_report(edit=mismatch), expected()).check("software")
    assert check.status == j.FAIL and "driver too old" in check.detail


def test_a_loss_that_does_not_fall_fails_the_training_step() -> None:
    def flat(r: dict[str, Any]) -> None:
        r["torchrun"]["train"]["losses"] = [6.93] * 30

    check = j.judge(node_report(edit=flat), expected()).check("train")
    assert (check.status, check.threshold) == (j.FAIL, "loss_drop_min")
    assert check.shortfall == pytest.approx(1.0)


def test_a_diverging_loss_fails_and_names_the_step() -> None:
    def nan(r: dict[str, Any]) -> None:
        r["torchrun"]["train"]["losses"][7] = math.nan

    check = j.judge(node_report(edit=nan), expected()).check("train")
    assert check.status == j.FAIL and "at step 7" in check.measured


def test_a_wrong_all_reduce_sum_fails() -> None:
    def wrong(r: dict[str, Any]) -> None:
        r["torchrun"]["allreduce"]["correct"] = False

    assert j.judge(node_report(edit=wrong), expected()).check("allreduce.local").status == j.FAIL


def test_scratch_that_is_not_mounted_is_called_out() -> None:
    def root_disk(r: dict[str, Any]) -> None:
        r["scratch"].update(is_mount=False)

    check = j.judge(node_report(edit=root_disk), expected()).check("scratch.read")
    assert check.status == j.WARN and "not a mount point" in check.detail


def test_quick_mode_skips_bandwidth_and_training_but_not_health() -> None:
    def quick(r: dict[str, Any]) -> None:
        for key in ("hbm", "allreduce", "train"):
            r["torchrun"].pop(key, None)
        r.pop("scratch")

    verdict = j.judge(node_report(edit=quick), expected(quick=True))
    s = statuses(verdict)
    assert s["gemm"] == s["ecc"] == s["nvlink"] == j.PASS
    assert s["hbm"] == s["allreduce.local"] == s["train"] == s["scratch"] == j.NOT_RUN
    assert verdict.status == j.PASS


def test_a_host_without_a_gpu_fails_with_advice_and_no_benchmarks() -> None:
    report = node_report(
        edit=lambda r: r.update(
            nvidia=verify_node.nvidia_from_outputs(None, lspci="", nvswitch_devices=0),
            torch={"torch": "2.13.0+cpu", "torch_cuda": None, "device_count": 0, "error": None},
            torchrun={},
            skipped="GPU benchmarks not run: nvidia-smi not found",
        )
    )
    verdict = j.judge(report, expected())
    first = verdict.checks[0]
    assert (first.name, first.status) == ("gpu.present", j.FAIL)
    assert "nvidia-smi not found" in first.detail and "--cpu" in first.detail
    assert verdict.status == j.FAIL


def test_a_cpu_run_is_never_a_pass_for_a_gpu_tier() -> None:
    falling = [4.9 - 0.1 * i for i in range(40)]
    verdict = j.judge(cpu_report(falling), expected(cpu=True))
    assert verdict.status == j.CPU_ONLY
    assert verdict.check("gpu").status == j.NOT_RUN
    assert "NOT verified" in verdict.check("gpu").detail
    assert verdict.check("train").status == j.PASS
    assert verdict.check("mfu").status == j.NOT_RUN  # tokens/s reported, not judged on CPU
    assert verdict.check("software").measured == "torch 2.13.0+cpu"
    storage = verdict.check("storage")
    assert storage.status == j.SKIP and "aws CLI" in storage.detail  # SKIP is never a PASS
    assert j.overall([verdict]) == j.CPU_ONLY
    flat = j.judge(cpu_report([4.9] * 40), expected(cpu=True))
    assert flat.status == j.FAIL and j.overall([verdict, flat]) == j.FAIL


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"schema": "gpufleet.verify/1", "stage": "local", "nvid', "truncated"),
        ("Traceback (most recent call last):\n  File ...", "not JSON"),
        ("", "empty report"),
        ("[1, 2]", "JSON list"),
        ('{"schema": "something-else/9"}', "mixed versions"),
    ],
)
def test_a_bad_report_from_the_node_is_an_error_that_says_what_is_wrong(
    text: str, says: str
) -> None:
    with pytest.raises(j.ReportError, match=says):
        j.parse_report(text)


def test_an_unusable_report_becomes_a_failed_verdict_not_a_crash() -> None:
    verdict = j.judge({"report_error": "the node's report is truncated"}, expected(), host="n0")
    assert verdict.status == j.FAIL
    assert verdict.checks[0].name == "report" and "truncated" in verdict.checks[0].detail


def test_a_crashed_node_script_is_reported_with_what_it_did_measure() -> None:
    verdict = j.judge(node_report(edit=lambda r: r.update(fatal="MemoryError: ")), expected())
    assert verdict.checks[0].name == "report" and verdict.status == j.FAIL
    assert verdict.check("gemm").status == j.PASS


def test_expected_comes_from_the_stack_outputs_and_the_catalog() -> None:
    exp = expected()
    assert exp.gpu is not None and exp.gpu.key == "A100-40GB"
    assert (exp.gpu_count, exp.memory_gb, exp.nvlink, exp.nvswitch) == (8, 40.0, True, True)
    assert exp.network_gbps == load_catalog().instance("aws", "p4d.24xlarge").network_gbps
    assert exp.bucket == "gpufleet-a100x8-ab12cd" and exp.scratch.devices == 8
    assert exp.thresholds["expected_gemm_fraction"] == pytest.approx(0.869)


def test_a_tier_named_on_the_command_line_replaces_the_stack_tier() -> None:
    exp = j.expected_from(None, load_catalog(), tier="v100x1")
    assert exp.gpu is not None and exp.gpu.training_dtype == "float16"
    assert exp.gpu_count == 1 and not exp.nvlink
    with pytest.raises(ValueError, match=r"unknown tier 'a100x3'.*a100x4"):
        j.expected_from(None, load_catalog(), tier="a100x3")


def test_without_any_tier_the_found_gpu_sets_the_performance_bar() -> None:
    exp = j.expected_from(None, load_catalog())
    verdict = j.judge(node_report(), exp)
    assert verdict.check("gpu.count").status == j.WARN  # nothing to compare the count with
    assert verdict.check("gemm").status == j.PASS  # judged against the A100's catalog entry


def test_the_node_command_carries_dtype_peak_and_rendezvous_quoted() -> None:
    exp = j.expected_from(None, load_catalog(), tier="v100x1")
    opts = VerifyOptions(python="/opt/my venv/bin/python", node_env={"NCCL_DEBUG": "INFO"})
    cmd = node_command(
        "/tmp/gpufleet-verify.abc",
        opts,
        exp,
        stage="cross",
        node_rank=1,
        nnodes=2,
        master_addr="10.0.1.5",
    )
    assert cmd.startswith(
        "env PYTHONPATH=/tmp/gpufleet-verify.abc NCCL_DEBUG=INFO '/opt/my venv/bin/python' "
        "-m gpufleet_node.verify_node "
    )
    for part in (
        "--dtype=float16",
        "--peak-tflops=125",
        "--stage=cross",
        "--node-rank=1",
        "--nnodes=2",
        "--master-addr=10.0.1.5",
        "--mode=gpu",
    ):
        assert part in cmd
    cpu = node_command("/tmp/x", VerifyOptions(cpu=True, quick=True), exp)
    assert "--mode=cpu" in cpu and "--quick" in cpu and "--dtype" not in cpu


def test_node_env_must_be_key_value_pairs() -> None:
    assert parse_node_env("A=1, NCCL_IB_HCA=mlx5_0,B=x=y") == {
        "A": "1",
        "NCCL_IB_HCA": "mlx5_0",
        "B": "x=y",
    }
    with pytest.raises(ValueError, match="'oops' is not KEY=VALUE"):
        parse_node_env("A=1,oops")


def test_the_cross_node_run_is_judged_against_the_instance_network() -> None:
    exp = expected(nodes=2)
    good = [6.9 - 0.2 * i for i in range(30)]
    per_host = {"n0": cross_report(30.0, good), "n1": cross_report(30.0, good)}
    verdict = j.judge_cluster(per_host, exp)
    ar = verdict.check("allreduce.cross")
    assert ar.status == j.PASS and "400 Gbit/s network" in ar.detail  # 0.5 x 50 GB/s = 25
    slow = j.judge_cluster({"n0": cross_report(6.0, good)}, exp).check("allreduce.cross")
    assert slow.status == j.FAIL and slow.threshold == "warn_ratio"


def test_a_cross_node_run_that_never_met_fails_with_each_nodes_reason() -> None:
    per_host: dict[str, dict[str, Any]] = {
        "n0": {"schema": j.NODE_SCHEMA, "torchrun": {"errors": ["torchrun timed out after 600 s"]}},
        "n1": {"report_error": "the node wrote no report (exit 255)"},
    }
    verdict = j.judge_cluster(per_host, expected(nodes=2))
    assert verdict.status == j.FAIL
    assert "n0: torchrun timed out" in verdict.checks[0].detail
    assert "n1: the node wrote no report" in verdict.checks[0].detail


def test_the_report_and_the_verdict_line_say_what_failed() -> None:
    from rich.console import Console

    def slow(r: dict[str, Any]) -> None:
        r["torchrun"]["gemm"][4]["tflops"] = 124.8

    verdict = j.judge(copy.deepcopy(node_report(edit=slow)), expected(), host="a100x8-0")
    console = Console(record=True, width=200)
    console.print(verdict_text(verdict, "verify-gpu a100x8-0", 200))
    text = console.export_text()
    assert "verify-gpu a100x8-0: FAIL" in text and "124.8 TF/s" in text
    assert overall_line([verdict], verdict.status) == "verify-gpu: FAIL (a100x8-0: gemm)"
