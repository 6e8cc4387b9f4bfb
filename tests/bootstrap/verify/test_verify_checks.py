"""Each registered verify-gpu check on its own: pure calls on node reports built from the
recorded fixtures (tests/fixtures/verify), against the a100x8 tier of the real catalog."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bootstrap.verify import checks as registry
from bootstrap.verify.checks import bench, collective, health, inventory, storage, topology
from bootstrap.verify.checks.base import CPU, CROSS, GPU, CheckSpec, Node, ThresholdError, check
from bootstrap.verify.judge import judge, judge_cluster, local_node, run_checks
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check
from infra.catalog import load_catalog
from tests.bootstrap.verify.verify_reports import (
    cpu_report,
    cross_report,
    expected,
    node_report,
)

Edit = Callable[[dict[str, Any]], None]


def on_node(spec: CheckSpec, edit: Edit | None = None, **exp_args: Any) -> list[Check]:
    """The check's lines for the healthy 8x A100 report, after ``edit``."""
    node, th = local_node(node_report(edit=edit), expected(**exp_args))
    return spec(node, th)


def one(spec: CheckSpec, edit: Edit | None = None, **exp_args: Any) -> Check:
    (line,) = on_node(spec, edit, **exp_args)
    return line


def on_gpus(**fields: Any) -> Edit:
    def edit(r: dict[str, Any]) -> None:
        for g in r["nvidia"]["gpus"]:
            g.update(fields)

    return edit


def on_gpu(index: int, **fields: Any) -> Edit:
    def edit(r: dict[str, Any]) -> None:
        r["nvidia"]["gpus"][index].update(fields)

    return edit


def on_run(**fields: Any) -> Edit:
    def edit(r: dict[str, Any]) -> None:
        r["torchrun"].update(fields)

    return edit


# ------------------------------------------------------------------------- the registry


def test_every_check_is_registered_once_per_run_kind_in_the_verdict_order() -> None:
    for kind in (GPU, CPU, CROSS):
        names = [c.name for c in registry.CHECKS if kind in c.runs]
        assert len(names) == len(set(names)), kind
    gpu_names = [c.name for c in registry.CHECKS if GPU in c.runs]
    assert gpu_names.index("gpu.present") < gpu_names.index("gpu.count")
    assert gpu_names[-1] == "storage"


def test_every_threshold_a_check_reads_is_in_the_catalog_for_every_gpu_model() -> None:
    catalog = load_catalog()
    used = registry.thresholds_used()
    assert {"pass_ratio", "scratch_nvme_gbs_per_device", "min_pcie_width"} <= used
    for gpu in catalog.gpus.values():
        missing = used - set(gpu.thresholds)
        assert not missing, f"{gpu.key} lacks {sorted(missing)}"
    # Without a known GPU the defaults are used, and only the GPU-specific GEMM fraction
    # is never read then (the GEMM check has no peak to compare with).
    assert used - {"expected_gemm_fraction"} <= set(catalog.default_thresholds)


def test_the_scratch_expectation_is_the_catalogs_figure_not_a_constant() -> None:
    per = load_catalog().default_thresholds["scratch_nvme_gbs_per_device"]
    read, _ = on_node(storage.scratch)
    assert f"scratch_nvme_gbs_per_device {per:g} x 8 device(s)" in read.detail
    assert f"of expected {per * 8:,.1f} GB/s" in read.detail


def test_a_check_cannot_read_a_threshold_it_did_not_declare() -> None:
    @check("sneaky", runs=[GPU], thresholds=["pass_ratio"])
    def sneaky(node: Node, th: Any) -> Check:
        return Check("sneaky", PASS, str(th["warn_ratio"]))

    node, th = local_node(node_report(), expected())
    with pytest.raises(ThresholdError, match="reads threshold 'warn_ratio' without declaring"):
        sneaky(node, th)


def test_a_threshold_missing_from_the_catalog_names_the_file_to_fix() -> None:
    node, th = local_node(node_report(), expected())
    without = {k: v for k, v in th.items() if k != "max_temperature_c"}
    with pytest.raises(ThresholdError, match=r"'max_temperature_c'.*infra/catalog/gpus.toml"):
        health.temperature(node, without)


def test_a_threshold_default_in_a_check_is_refused() -> None:
    @check("fallback", runs=[GPU], thresholds=["max_temperature_c"])
    def fallback(node: Node, th: Any) -> Check:
        return Check("fallback", PASS, str(th.get("max_temperature_c", 87.0)))

    node, th = local_node(node_report(), expected())
    with pytest.raises(ThresholdError, match="with a default"):
        fallback(node, th)


def test_a_gate_leaves_only_the_checks_that_always_run() -> None:
    @check("stop", runs=[GPU], gate=True)
    def stop(node: Node, th: Any) -> Check:
        return Check("stop", FAIL, "stopped")

    node, th = local_node(node_report(), expected())
    lines = run_checks(node, th, (health.ecc, stop, health.xid, storage.storage))
    assert [c.name for c in lines] == ["ecc", "stop", "storage"]


# ------------------------------------------------------------------------- inventory


def test_report_fails_when_the_node_script_crashed_and_is_silent_otherwise() -> None:
    line = one(inventory.node_script_crashed, lambda r: r.update(fatal="MemoryError: "))
    assert (line.status, line.measured, line.detail) == (
        FAIL,
        "node script crashed",
        "MemoryError: ",
    )
    assert on_node(inventory.node_script_crashed) == []


def test_gpu_present_fails_with_what_lspci_saw_and_is_silent_on_a_gpu_node() -> None:
    def no_driver(r: dict[str, Any]) -> None:
        r["nvidia"] = {"available": False, "error": "nvidia-smi not found", "pci": {"gpus": 8}}

    line = one(inventory.gpu_present, no_driver)
    assert line.status == FAIL and "lspci shows 8 NVIDIA GPU(s)" in line.detail
    assert line.expected == "8x A100-40GB"
    assert on_node(inventory.gpu_present) == []


def test_a_cpu_run_says_the_gpu_tier_was_not_verified() -> None:
    node, th = local_node(cpu_report([4.0, 3.0]), expected(cpu=True))
    (line,) = inventory.gpu_not_verified(node, th)
    assert (line.status, line.expected) == (NOT_RUN, "8x A100-40GB")


def test_gpu_count_without_a_tier_is_a_warning_naming_the_options() -> None:
    from bootstrap.verify.judge import expected_from

    node, th = local_node(node_report(), expected_from(None, load_catalog()))
    (line,) = inventory.gpu_count(node, th)
    assert line.status == WARN and "--stack, --inventory or --tier" in line.detail


def test_gpu_count_with_more_gpus_than_the_tier_fails() -> None:
    def nine(r: dict[str, Any]) -> None:
        r["nvidia"]["gpus"].append(dict(r["nvidia"]["gpus"][0], index=8))

    line = one(inventory.gpu_count, nine)
    assert (line.status, line.measured) == (FAIL, "9 of 8")
    assert "1 more GPU(s) than the tier" in line.detail


def test_gpu_model_fails_a_gpu_the_tier_does_not_allow() -> None:
    line = one(inventory.gpu_model, tier="t4x4")
    assert line.status == FAIL and "not the tier's GPU: NVIDIA A100-SXM4-40GB" in line.detail


def test_gpu_memory_below_the_catalog_fraction_fails_and_names_the_gpu() -> None:
    line = one(inventory.gpu_memory, on_gpu(3, memory_total_mib=32768.0))
    assert (line.status, line.threshold) == (FAIL, "min_memory_fraction")
    assert line.detail == "GPU3 below min_memory_fraction x 40 GB"
    assert on_node(inventory.gpu_memory, on_gpus(memory_total_mib=None)) == []


def test_software_fails_a_cpu_only_torch_build_on_a_gpu_node() -> None:
    line = one(inventory.software, lambda r: r["torch"].update(torch_cuda=None))
    assert line.status == FAIL and "CPU-only build" in line.detail


def test_software_fails_when_torch_sees_fewer_gpus_than_the_driver() -> None:
    line = one(inventory.software, lambda r: r["torch"].update(device_count=6))
    assert line.status == FAIL and "torch sees 6 of 8" in line.detail


def test_software_passes_a_newer_cuda_minor_through_compatibility() -> None:
    def newer_minor(r: dict[str, Any]) -> None:
        r["nvidia"]["cuda_version"] = "12.4"

    line = one(inventory.software, newer_minor)
    assert line.status == PASS and "minor-version compatibility" in line.detail


def test_software_on_a_cpu_run_fails_without_torch() -> None:
    report = cpu_report([4.0, 3.0])
    report["torch"] = {"error": "import torch failed: ModuleNotFoundError"}
    node, th = local_node(report, expected(cpu=True))
    (line,) = inventory.software_cpu(node, th)
    assert line.status == FAIL and "fab install-pytorch" in line.detail


def test_mig_pending_is_a_warning() -> None:
    line = one(inventory.mig, on_gpu(2, mig_pending=True))
    assert (line.status, line.measured) == (WARN, "MIG pending on GPU2")


# ------------------------------------------------------------------------- health


def test_ecc_errors_in_the_gpus_lifetime_only_warn() -> None:
    line = one(health.ecc, on_gpu(1, ecc_aggregate={"corrected": 4, "uncorrected": 2}))
    assert line.status == WARN and "2 uncorrectable in the GPUs' lifetime" in line.detail
    assert one(health.ecc).status == PASS


def test_ecc_disabled_is_a_warning() -> None:
    line = one(health.ecc, on_gpu(0, ecc_mode=False))
    assert line.status == WARN and "ECC disabled on GPU0" in line.detail


def test_retired_pages_without_anything_pending_warn() -> None:
    pages = {"single_bit": 2, "double_bit": 0, "pending": False}
    line = one(health.memory_remap, on_gpu(4, retired_pages=pages))
    assert (line.status, line.detail) == (WARN, "GPU4: 2 retired page(s)")


def test_a_failed_row_remap_fails() -> None:
    rows = {"correctable": 0, "uncorrectable": 1, "pending": False, "failure": True}
    line = one(health.memory_remap, on_gpu(6, remapped_rows=rows))
    assert line.status == FAIL and "GPU6: row remapping failed" in line.detail


def test_a_software_power_cap_is_noted_not_failed() -> None:
    line = one(health.throttle, on_gpu(0, throttle_reasons=["sw_power_cap"]))
    assert line.status == PASS and "power cap reached on GPU0" in line.detail


def test_hw_slowdown_at_idle_fails_too() -> None:
    line = one(health.throttle, on_gpu(7, throttle_reasons=["hw_slowdown"]))
    assert (line.status, line.measured) == (FAIL, "GPU7: hw_slowdown")


def test_temperature_is_judged_by_the_catalog_limit() -> None:
    node, th = local_node(node_report(), expected())
    assert health.temperature(node, th)[0].status == PASS
    (hot,) = health.temperature(node, {**th, "max_temperature_c": 50.0})
    assert (hot.status, hot.threshold, hot.expected) == (WARN, "max_temperature_c", "<= 50 C")


def test_temperature_says_nothing_without_a_reading() -> None:
    def no_temps(r: dict[str, Any]) -> None:
        r.pop("load")
        for g in r["nvidia"]["gpus"]:
            g["temperature_c"] = None

    assert on_node(health.temperature, no_temps) == []


def test_persistence_mode_off_is_a_warning_with_the_fix() -> None:
    line = one(health.persistence, on_gpu(5, persistence_mode=False))
    assert line.status == WARN and "nvidia-smi -pm 1" in line.detail


def test_an_unreadable_kernel_log_is_skipped_never_passed() -> None:
    def unreadable(r: dict[str, Any]) -> None:
        r["xid"] = {"source": None, "events": [], "error": "dmesg: Operation not permitted"}

    line = one(health.xid, unreadable)
    assert line.status == SKIP and "Operation not permitted" in line.detail


def test_an_application_xid_is_a_warning() -> None:
    def xid13(r: dict[str, Any]) -> None:
        r["xid"]["events"] = [{"xid": 13, "pci": "0000:10:1c", "line": "NVRM: Xid 13"}]

    line = one(health.xid, xid13)
    assert (line.status, line.measured) == (WARN, "Xid 13")


@pytest.mark.parametrize(
    ("xid", "status"),
    # NVIDIA's Xid catalog: 46 and 143 need a GPU reset, 160 a reboot; 94 (contained ECC)
    # only a restart of the application, 92 (excessive single-bit ECC interrupts) nothing.
    [(46, FAIL), (143, FAIL), (160, FAIL), (79, FAIL), (94, WARN), (92, WARN)],
)
def test_an_xid_fails_exactly_when_the_catalog_says_reset_reboot_or_inspect(
    xid: int, status: str
) -> None:
    def event(r: dict[str, Any]) -> None:
        r["xid"]["events"] = [{"xid": xid, "pci": "0000:10:1c", "line": f"NVRM: Xid {xid}"}]

    assert one(health.xid, event).status == status


def test_fabric_manager_is_not_judged_without_nvswitch() -> None:
    def plain(r: dict[str, Any]) -> None:
        r["nvidia"].update(nvswitch_devices=0, pci={"gpus": 1, "nvswitches": 0})

    line = one(health.fabric_manager, plain, tier="t4x4")
    assert line.status == NOT_RUN


# ------------------------------------------------------------------------- topology


def test_nvlink_status_that_failed_is_a_problem_on_an_nvlink_tier() -> None:
    line = one(topology.nvlink, lambda r: r["nvidia"].update(nvlink=None))
    assert line.status == FAIL and "nvidia-smi nvlink --status failed" in line.detail


def test_pcie_without_any_link_state_is_skipped() -> None:
    def no_links(r: dict[str, Any]) -> None:
        r.pop("load")
        for g in r["nvidia"]["gpus"]:
            g["pcie"] = {}

    line = one(topology.pcie, no_links)
    assert (line.status, line.measured) == (SKIP, "not reported")


def test_pcie_below_the_catalog_generation_fails_under_load() -> None:
    node, th = local_node(node_report(), expected())
    (line,) = topology.pcie(node, {**th, "min_pcie_gen": 5.0})
    assert line.status == FAIL and "below min_pcie_gen 5" in line.detail


# ------------------------------------------------------------------------- benchmarks


def test_benchmarks_not_run_fails_and_ends_the_gpu_checks_but_not_storage() -> None:
    def skipped(r: dict[str, Any]) -> None:
        r["skipped"] = "GPU benchmarks not run: no CUDA device"

    line = one(bench.benchmarks, skipped)
    assert line.status == FAIL and "no CUDA device" in line.detail
    names = [c.name for c in judge(node_report(edit=skipped), expected()).checks]
    assert names[-2:] == ["benchmarks", "storage"] and "gemm" not in names


def test_gemm_is_skipped_for_a_gpu_the_catalog_does_not_know() -> None:
    from bootstrap.verify.judge import expected_from

    report = node_report(edit=on_gpus(name="NVIDIA Mystery 9000"))
    node, th = local_node(report, expected_from(None, load_catalog()))
    (line,) = bench.gemm(node, th)
    assert (line.status, line.measured) == (SKIP, "no reference")


def test_gemm_with_non_finite_results_fails_even_when_fast() -> None:
    def nan(r: dict[str, Any]) -> None:
        r["torchrun"]["gemm"][2]["finite"] = False

    line = one(bench.gemm, nan)
    assert line.status == FAIL and line.detail.startswith("GEMM produced non-finite values")


def test_gemm_not_measured_fails_with_torchruns_error() -> None:
    line = one(bench.gemm, on_run(gemm=[], errors=["rank 0: CUDA error: out of memory"]))
    assert (line.status, line.detail) == (FAIL, "rank 0: CUDA error: out of memory")


def test_hbm_is_not_run_with_quick_and_graded_otherwise() -> None:
    assert one(bench.hbm, quick=True).status == NOT_RUN
    line = one(bench.hbm)
    assert line.status == PASS and "expected_hbm_fraction 0.85 x 1555 GB/s" in line.detail


# ------------------------------------------------------------------------- the runs


def test_allreduce_with_one_process_has_nothing_to_reduce() -> None:
    line = one(collective.allreduce, on_run(allreduce=None, nproc=1))
    assert (line.status, line.measured) == (NOT_RUN, "1 process")


def test_allreduce_missing_on_several_processes_fails() -> None:
    line = one(collective.allreduce, on_run(allreduce=None, errors=["rank 3: NCCL timeout"]))
    assert (line.status, line.detail) == (FAIL, "rank 3: NCCL timeout")


def test_allreduce_on_a_gpu_the_catalog_does_not_know_is_not_called_a_cpu_run() -> None:
    """Bug fixed: a GPU run without a catalog reference was labelled "CPU run"."""
    from bootstrap.verify.judge import expected_from

    report = node_report(edit=on_gpus(name="NVIDIA Mystery 9000"))
    node, th = local_node(report, expected_from(None, load_catalog()))
    (line,) = collective.allreduce(node, th)
    assert line.status == PASS
    assert "no catalog reference for this GPU: correctness only" in line.detail
    assert "CPU run" not in line.detail


def test_allreduce_is_graded_against_the_interconnect() -> None:
    line = one(collective.allreduce)
    assert line.status == PASS and "nccl_busbw_fraction 0.7 x" in line.detail


def test_the_cross_node_allreduce_without_a_network_figure_is_skipped() -> None:
    exp = expected(nodes=2)
    exp = type(exp)(**{**exp.__dict__, "network_gbps": None})
    verdict = judge_cluster({"n0": cross_report(30.0, [6.0, 5.0, 4.0])}, exp)
    assert verdict.check("allreduce.cross").status == SKIP


def test_train_with_quick_differs_between_a_cpu_and_a_gpu_run() -> None:
    assert one(collective.train, quick=True).expected == "-"
    node, th = local_node(cpu_report([4.0, 3.0]), expected(cpu=True, quick=True))
    (line,) = collective.train(node, th)
    assert (line.status, line.detail) == (NOT_RUN, "training step skipped")
    assert collective.allreduce(node, th) == [] and collective.mfu(node, th) == []


def test_train_without_a_loss_curve_fails() -> None:
    line = one(collective.train, lambda r: r["torchrun"]["train"].update(losses=[]))
    assert (line.status, line.measured) == (FAIL, "no loss curve")


def test_train_that_did_not_run_fails_and_mfu_says_nothing() -> None:
    edit = on_run(train=None, errors=["rank 1: RuntimeError: boom"])
    assert one(collective.train, edit).detail == "rank 1: RuntimeError: boom"
    assert on_node(collective.mfu, edit) == []


def test_mfu_without_tokens_per_second_says_so() -> None:
    """Bug fixed: a GPU run with no tokens/s was reported as having "no GPU reference peak"."""
    line = one(collective.mfu, lambda r: r["torchrun"]["train"].update(tokens_per_s=0))
    assert (line.status, line.detail) == (NOT_RUN, "no tokens/s measured")


def test_mfu_between_the_floor_and_the_expectation_warns() -> None:
    node, th = local_node(node_report(), expected())
    (line,) = collective.mfu(node, {**th, "expected_mfu": 0.9, "min_mfu": 0.01})
    assert (line.status, line.threshold) == (WARN, "expected_mfu")


def test_mfu_below_the_floor_fails() -> None:
    node, th = local_node(node_report(), expected())
    (line,) = collective.mfu(node, {**th, "expected_mfu": 0.95, "min_mfu": 0.9})
    assert (line.status, line.threshold) == (FAIL, "min_mfu")


def test_cross_nodes_fails_when_a_node_reported_errors_after_training() -> None:
    per_host = {
        "n0": cross_report(30.0, [6.9 - 0.2 * i for i in range(30)]),
        "n1": {"report_error": "the node wrote no report (exit 255)"},
    }
    verdict = judge_cluster(per_host, expected(nodes=2))
    line = verdict.check("cross.nodes")
    assert line.status == FAIL and "n1: the node wrote no report" in line.detail
    assert verdict.check("train.cross").status == PASS


# ------------------------------------------------------------------------- storage


def test_scratch_on_a_data_disk_uses_the_disk_figure() -> None:
    from bootstrap.fleet.api import ScratchSpec

    per_disk = load_catalog().default_thresholds["scratch_disk_gbs"]
    read, write = on_node(storage.scratch, scratch=ScratchSpec("/scratch", "disk"))
    assert f"scratch_disk_gbs {per_disk:g}" in read.detail
    assert write.name == "scratch.write" and "scratch_write_fraction 0.5" in write.detail


def test_scratch_that_is_unusable_is_one_failed_line() -> None:
    def missing(r: dict[str, Any]) -> None:
        r["scratch"] = {"error": "/scratch does not exist (is scratch mounted?)"}

    line = one(storage.scratch, missing)
    assert (line.name, line.status, line.measured) == ("scratch", FAIL, "unusable")


def test_scratch_is_not_mentioned_on_a_cpu_quick_run() -> None:
    node, th = local_node(cpu_report([4.0, 3.0]), expected(cpu=True, quick=True))
    assert storage.scratch(node, th) == []
    assert one(storage.scratch, quick=True).status == NOT_RUN


def test_storage_passes_a_probe_and_fails_an_error() -> None:
    assert one(storage.storage).status == PASS

    def denied(r: dict[str, Any]) -> None:
        r["storage"] = {"status": "error", "reason": "AccessDenied"}

    line = one(storage.storage, denied)
    assert (line.status, line.detail) == (FAIL, "AccessDenied")
    assert on_node(storage.storage, lambda r: r.pop("storage")) == []


def test_storage_without_a_bucket_is_not_run() -> None:
    def no_bucket(r: dict[str, Any]) -> None:
        r["storage"] = {"status": "skip", "reason": "the stack has no bucket"}

    outputs_without_bucket = {"bucket": None}
    node, th = local_node(node_report(edit=no_bucket), expected())
    node = Node(node.report, type(node.exp)(**{**node.exp.__dict__, **outputs_without_bucket}))
    (line,) = storage.storage(node, th)
    assert (line.status, line.measured) == (NOT_RUN, "no bucket")
