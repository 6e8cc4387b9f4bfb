"""Each recorded failure ends in the verdict a GPU operator would give, by the cited catalog
(infra/catalog/health.toml): row-remap failure, Xid 79 / 48 / 64 / 74 -> failed; a pending
row remap, a power/thermal throttle, a narrow PCIe link, a down IB port -> degraded; an
application Xid is listed and leaves the node healthy."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bootstrap.verify.health import verdict as nh
from bootstrap.verify.verdict import FAIL, PASS, WARN, Check, Verdict
from gpufleet_node import verify_health as vh

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TAKEN = "2026-12-02T01:00:00Z"


def _make_fixtures() -> ModuleType:
    path = FIXTURES / "verify" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("gpufleet_make_fixtures", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mf = _make_fixtures()


def smi(gpu: int | None = None, **over: object) -> str:
    """The healthy p4d nvidia-smi -q -x, with GPU ``gpu`` changed as ``over`` says."""
    return mf.smi_xml([mf.gpu_xml(i, **(over if i == gpu else {})) for i in range(8)])


def verdict(**outputs: Any) -> nh.HealthVerdict:
    keys = ("nvlink", "infiniband_gbps_per_port", "load", "gpu_count", "nvswitch")
    opts = {k: outputs.pop(k) for k in keys if k in outputs}
    return nh.judge_health(vh.snapshot(taken_at=TAKEN, **outputs), "node-0", **opts)


def read(name: str) -> str:
    return (FIXTURES / "health" / name).read_text()


def levels(v: nh.HealthVerdict) -> list[tuple[str, str, int | None]]:
    return [(r.check, r.level, r.gpu) for r in v.reasons]


# --- healthy ---------------------------------------------------------------------------------


def test_the_healthy_node_is_healthy_with_every_check_that_had_input() -> None:
    v = verdict(
        smi_xml=smi(),
        nvlink_status=(FIXTURES / "verify" / "a100x8_nvlink.txt").read_text(),
        kernel_log=(FIXTURES / "verify" / "dmesg_clean.txt").read_text(),
        dcgm=read("dcgm_r1_pass.json"),
        nvlink=True,
    )
    assert v.status == nh.HEALTHY and v.reasons == ()
    assert v.checked == (
        "dcgm",
        "xid",
        "ecc",
        "retired-pages",
        "row-remap",
        "nvlink",
        "pcie",
        "throttle",
        "temperature",
    )
    assert v.taken_at == TAKEN


# --- memory ----------------------------------------------------------------------------------


def test_a_row_remap_failure_fails_the_node_and_says_replace() -> None:
    v = verdict(smi_xml=smi(3, remap_failure="Yes", remap_unc=9))
    assert v.status == nh.FAILED
    assert levels(v) == [("row-remap", nh.FAILED, 3)]
    assert "replace the GPU" in v.reasons[0].action


def test_a_pending_row_remap_degrades_the_node_and_says_reset() -> None:
    v = verdict(smi_xml=smi(5, remap_unc=1, remap_pending="Yes"))
    assert v.status == nh.DEGRADED
    assert levels(v) == [("row-remap", nh.DEGRADED, 5)]
    assert "reset the GPU" in v.reasons[0].action


def test_volatile_uncorrectable_ecc_fails_the_node() -> None:
    v = verdict(smi_xml=(FIXTURES / "verify" / "a100x8_smi_ecc.xml").read_text())
    assert v.status == nh.FAILED
    assert ("ecc", nh.FAILED, 5) in levels(v) and ("row-remap", nh.DEGRADED, 5) in levels(v)


def test_uncorrectable_remaps_at_dcgms_limit_fail_the_node() -> None:
    assert verdict(smi_xml=smi(0, remap_unc=511)).status == nh.HEALTHY
    assert verdict(smi_xml=smi(0, remap_unc=512)).status == nh.FAILED


# --- PCIe, throttle, temperature -------------------------------------------------------------


def test_a_pcie_link_narrower_than_the_card_degrades_the_node() -> None:
    v = verdict(smi_xml=smi(6, width=8))
    assert levels(v) == [("pcie", nh.DEGRADED, 6)] and "x8 of x16" in v.reasons[0].text


def test_pcie_gen1_at_idle_is_normal_but_below_max_under_load_degrades() -> None:
    assert verdict(smi_xml=smi()).status == nh.HEALTHY  # the fixture idles at gen1
    load = [{"index": 2, "pcie_gen_busy_max": 3.0}]
    v = verdict(smi_xml=smi(), load=load)
    assert levels(v) == [("pcie", nh.DEGRADED, 2)] and "gen3 of gen4" in v.reasons[0].text


def test_a_thermal_or_power_brake_throttle_degrades_and_a_power_cap_does_not() -> None:
    hot = verdict(smi_xml=smi(2, event_reasons=mf.event_reasons({"hw_thermal_slowdown"})))
    assert levels(hot) == [("throttle", nh.DEGRADED, 2)]
    capped = verdict(smi_xml=smi(2, event_reasons=mf.event_reasons({"sw_power_cap"})))
    assert capped.status == nh.HEALTHY


def test_a_gpu_at_its_slowdown_temperature_degrades_the_node() -> None:
    slow = mf.gpu_xml(0).split("<gpu_temp_slow_threshold>")[1].split(" C")[0]
    v = verdict(smi_xml=smi(4, temp=int(slow)))
    assert levels(v) == [("temperature", nh.DEGRADED, 4)]


# --- NVLink ----------------------------------------------------------------------------------


def test_an_inactive_nvlink_fails_an_nvlink_tier_only() -> None:
    down = (FIXTURES / "verify" / "a100x8_nvlink_down.txt").read_text()
    assert levels(verdict(nvlink_status=down, nvlink=True)) == [("nvlink", nh.FAILED, 3)]
    assert verdict(nvlink_status=down, nvlink=False).status == nh.HEALTHY


def test_nvlink_replay_or_recovery_errors_over_dcgms_limit_degrade() -> None:
    v = verdict(nvlink_errors=read("nvlink_errors_h100.txt"))
    assert levels(v) == [("nvlink", nh.DEGRADED, 1)]
    assert v.reasons[0].text == "link 1: 3 replay, 2 recovery errors"


# --- Xid -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "status", "bucket"),
    [
        (79, nh.FAILED, "RESTART_BM"),
        (48, nh.FAILED, "WORKFLOW_XID_48"),
        (64, nh.FAILED, "RESET_GPU"),
        (74, nh.FAILED, "WORKFLOW_NVLINK_ERR"),
        (95, nh.FAILED, "RESET_GPU"),
        (94, nh.HEALTHY, "RESTART_APP"),
        (63, nh.HEALTHY, "IGNORE"),
        (13, nh.HEALTHY, "RESTART_APP"),
        (1, nh.DEGRADED, "UNEXPECTED"),
    ],
)
def test_each_xid_gets_the_catalogs_immediate_action(xid: int, status: str, bucket: str) -> None:
    line = f"kernel: NVRM: Xid (PCI:0000:10:1c): {xid}, pid=1896, name=python, message"
    v = verdict(smi_xml=smi(), kernel_log=line)
    assert v.status == status
    assert v.reasons[0].source == f"Xid catalog {bucket}" and v.reasons[0].gpu == 0


def test_the_journal_with_xid_79_fails_and_lists_the_application_xid_as_a_note() -> None:
    v = verdict(kernel_log=read("journal_xids.txt"))
    assert v.status == nh.FAILED
    assert [(r.text, r.level) for r in v.reasons] == [
        ("Xid 13 on PCI 0000:1b:00", nh.NOTE),
        ("Xid 63 on PCI 0000:43:00", nh.NOTE),
        ("Xid 79 on PCI 0000:44:00", nh.FAILED),
    ]
    assert v.reasons[2].action == "reboot the node"


def test_application_xids_only_leave_the_node_healthy() -> None:
    v = verdict(kernel_log=read("journal_xid13.txt"))
    assert v.status == nh.HEALTHY and len(v.reasons) == 2


# --- DCGM ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "status", "gpu", "action"),
    [
        ("dcgm_r1_pass.json", nh.HEALTHY, None, ""),
        ("dcgm_r2_pass.json", nh.HEALTHY, None, ""),
        ("dcgm_r3_pass.json", nh.HEALTHY, None, ""),
        # Level 1, the software test: a DBE with pages still to retire (RESET): drain, reset.
        ("dcgm_r1_fail_dbe_pending_retirement.json", nh.FAILED, 1, "drain the node and reset"),
        # Persistence mode off (CONFIG), as NVSentinel's preflight saw it: fix it, may train.
        ("dcgm_r1_warn_persistence_mode.json", nh.DEGRADED, 0, "fix the configuration"),
        # A pending row remap (RESET, classed down): the GPU works, reset at the next chance.
        ("dcgm_r2_fail_pending_remap.json", nh.DEGRADED, 1, "reset the GPU"),
        # Row remapping failed (RESET, DCGM: "unrecoverable memory hardware damage"): replace.
        ("dcgm_r2_fail_row_remap_failure.json", nh.FAILED, 0, "replace the GPU"),
        # Too hot under targeted_power (MONITOR): it can train, watch its cooling.
        ("dcgm_r3_fail_thermal.json", nh.DEGRADED, 0, "it can still train: watch it"),
    ],
)
def test_dcgm_diag_results_end_in_the_operators_verdict(
    fixture: str, status: str, gpu: int | None, action: str
) -> None:
    v = verdict(dcgm=read(fixture), dcgm_level=int(fixture[6]))
    assert v.status == status
    assert [r.gpu for r in v.reasons] == ([] if gpu is None else [gpu])
    assert all(r.action.startswith(action) for r in v.reasons)


def test_a_dcgm_that_could_not_run_is_noted_not_passed_or_failed() -> None:
    v = verdict(dcgm=read("dcgm_runtime_error.json"), dcgm_level=1)
    assert v.status == nh.HEALTHY and v.reasons[0].level == nh.NOTE
    assert "nvidia-dcgm" in v.reasons[0].action


# --- InfiniBand ------------------------------------------------------------------------------


def test_a_down_ib_port_and_a_slow_one_degrade() -> None:
    v = verdict(ibstat=read("ibstat_ndr.txt"), infiniband_gbps_per_port=400)
    assert [(r.level, r.text) for r in v.reasons] == [
        (nh.DEGRADED, "mlx5_1/1: Down"),
        (nh.DEGRADED, "mlx5_2/1: 200 of 400 Gb/s"),
    ]


def test_no_active_ib_port_fails_the_node() -> None:
    down = read("ibstat_ndr.txt").replace("State: Active", "State: Down")
    assert verdict(ibstat=down).status == nh.FAILED


# --- the stored record -----------------------------------------------------------------------


def test_the_verdict_goes_to_json_and_back_whole() -> None:
    v = verdict(smi_xml=smi(3, remap_failure="Yes"), kernel_log=read("journal_xids.txt"))
    doc = json.loads(json.dumps(v.to_json()))
    assert doc["status"] == "failed" and doc["taken_at"] == TAKEN
    assert nh.HealthVerdict.from_json(doc) == v


def test_a_stored_file_that_is_not_a_verdict_is_refused() -> None:
    with pytest.raises(ValueError, match="not a gpufleet verdict"):
        nh.HealthVerdict.from_json({"status": "healthy"})


def test_a_snapshot_of_another_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="not a health snapshot"):
        nh.judge_health({"schema": "gpufleet.verify/1"}, "node-0")


def test_verify_gpus_verdict_becomes_the_same_record() -> None:
    checks = (
        Check("gemm", FAIL, "124.8 TF/s", ">= 250.0 TF/s"),
        Check("temperature", WARN, "88 C", "<= 85 C"),
        Check("ecc", PASS, "0", "0"),
    )
    v = nh.from_verify(Verdict("node-0", "gpu", checks), TAKEN)
    assert v.status == nh.FAILED and v.origin == "verify-gpu"
    assert levels(v) == [("gemm", nh.FAILED, None), ("temperature", nh.DEGRADED, None)]


def test_every_xid_bucket_named_in_the_catalog_has_a_class_and_an_action() -> None:
    cat = nh.load_health_catalog()
    assert set(cat["xid"]["codes"]) <= set(cat["xid"]["buckets"])
    codes = [c for cs in cat["xid"]["codes"].values() for c in cs]
    assert len(codes) == len(set(codes)), "an Xid is in two buckets"
    for bucket in cat["xid"]["buckets"].values():
        assert bucket["class"] in (nh.FAILED, nh.DEGRADED, nh.NOTE) and bucket["action"]


# --- inventory and the fabric manager --------------------------------------------------------


def test_a_gpu_gone_from_the_driver_fails_the_node() -> None:
    seven = mf.smi_xml([mf.gpu_xml(i) for i in range(7)])
    lspci = (FIXTURES / "verify" / "lspci_p4d.txt").read_text()
    v = verdict(smi_xml=seven, lspci=lspci)
    assert levels(v) == [("gpu-count", nh.FAILED, None)]
    assert v.reasons[0].text == "7 of 8 GPUs in the driver; the PCI bus shows 8"
    assert verdict(smi_xml=seven, gpu_count=8).status == nh.FAILED
    assert verdict(smi_xml=smi(), lspci=lspci, gpu_count=8).status == nh.HEALTHY


def test_a_stopped_fabric_manager_fails_an_nvswitch_node_only() -> None:
    lspci = (FIXTURES / "verify" / "lspci_p4d.txt").read_text()  # six NVSwitches
    v = verdict(lspci=lspci, fabric_manager="inactive\n")
    assert levels(v) == [("fabric-manager", nh.FAILED, None)]
    assert verdict(lspci=lspci, fabric_manager="active\n").status == nh.HEALTHY
    assert verdict(fabric_manager="inactive", nvswitch=False).status == nh.HEALTHY
    assert verdict(fabric_manager="failed", nvswitch=True).status == nh.FAILED


# --- a node without GPUs -----------------------------------------------------------------------


def test_a_node_without_nvidia_smi_or_gpus_is_noted_and_stays_healthy() -> None:
    doc = {**vh.snapshot(taken_at=TAKEN, lspci=""), "nvidia_smi": "missing"}
    v = nh.judge_health(doc, "cpu-0")
    assert v.status == nh.HEALTHY and [r.text for r in v.reasons] == [nh.NO_GPU]


def test_gpus_on_the_bus_or_in_the_tier_without_nvidia_smi_fail_the_node() -> None:
    doc = {**vh.snapshot(taken_at=TAKEN), "nvidia_smi": "missing"}
    v = nh.judge_health(doc, "gpu-0", gpu_count=8)
    assert levels(v) == [("gpu-count", nh.FAILED, None)]
    assert v.reasons[0].text == "0 of 8 GPUs in the driver (no nvidia-smi)"
