"""How long a run takes: its FLOPs, the GPU's peak, the measured MFU and the multi-node
scaling.

Time: training FLOPs = 6 x params x tokens (Kaplan et al. 2020), 8 x with full recomputation (one
more forward pass); divided by GPUs x the GPU's dense peak in the chosen precision x MFU x the
multi-node scaling efficiency.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from infra.catalog import Catalog, Gpu, InstanceType, load_catalog
from infra.pricing.workload import Assumptions, Workload

REPORT_SCHEMA_PREFIX = "gpufleet.verify-report/"


def training_flops(w: Workload) -> float:
    """6 x params x tokens (8 x with full recomputation); a CNN row's measured FLOPs per sample
    (x 4/3 with checkpointing: one more forward pass, a third of a training step)."""
    if w.kind == "cnn" and w.train_flops_per_sample:
        k = 4 / 3 if w.grad_checkpointing else 1.0
        return w.train_flops_per_sample * w.tokens * k
    return (8.0 if w.grad_checkpointing else 6.0) * w.params * w.tokens


def peak_tflops(gpu: Gpu, precision: str) -> tuple[float, str]:
    """Dense peak per GPU in the precision, and a note when the GPU cannot run it as asked."""
    if precision == "bf16":
        if gpu.bf16:
            return gpu.bf16_tflops, ""
        return gpu.fp16_tflops, f"{gpu.key} has no bf16: fp16 with a gradient scaler"
    if precision == "fp16":
        return gpu.fp16_tflops, ""
    return gpu.fp32_tflops, ""


@dataclass(frozen=True)
class Calibration:
    """An MFU measured by fab verify-gpu on this GPU model."""

    gpu: str
    mfu: float
    path: str
    started_at: str
    hosts: int


def read_calibrations(
    reports_dir: Path | str, catalog: Catalog | None = None
) -> dict[str, Calibration]:
    """The newest verify-gpu MFU per GPU model under reports_dir (reports/<stack>/verify-*.json).

    A report counts when it is a GPU run (not --cpu) whose mfu check measured a value and did
    not FAIL; its MFU is the mean over its hosts. The GPU model is the one nvidia-smi named on
    the node, else the one the report expected. Unreadable files are skipped."""
    from infra.catalog import gpu_by_nvml_name

    cat = catalog or load_catalog()
    root = Path(reports_dir)
    best: dict[str, Calibration] = {}
    if not root.is_dir():
        return best
    for path in sorted(root.glob("**/verify-*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(
            REPORT_SCHEMA_PREFIX
        ):
            continue
        expected = doc.get("expected") or {}
        if expected.get("cpu"):
            continue
        per_model: dict[str, list[float]] = {}
        for host in doc.get("hosts") or []:
            if not isinstance(host, dict) or host.get("mode") != "gpu":
                continue
            check = next(
                (
                    c
                    for c in host.get("checks") or []
                    if isinstance(c, dict) and c.get("name") == "mfu"
                ),
                None,
            )
            if not check or check.get("status") not in ("PASS", "WARN"):
                continue
            value = check.get("value")
            if not isinstance(value, int | float) or not 0 < value <= 1:
                continue
            local = ((doc.get("measurements") or {}).get(host.get("host")) or {}).get("local") or {}
            gpus = (local.get("nvidia") or {}).get("gpus") or []
            found = gpu_by_nvml_name(cat, str(gpus[0].get("name") or "")) if gpus else None
            key = found.key if found else str(expected.get("gpu_model"))
            if key in cat.gpus:
                per_model.setdefault(key, []).append(float(value))
        started = str(doc.get("started_at", ""))
        for key, values in per_model.items():
            cal = Calibration(key, sum(values) / len(values), str(path), started, len(values))
            if key not in best or (started, str(path)) > (best[key].started_at, best[key].path):
                best[key] = cal
    return best


def fabric_gbps(it: InstanceType) -> float:
    """The bandwidth the gradient all-reduce has between nodes: the InfiniBand HCAs where the
    node has them (Azure ND: 8x 200 Gb/s HDR beside a 24 Gb/s Ethernet NIC), else the
    instance network, which on EFA types is the EFA figure itself (p4d: 4x 100 Gb/s EFA).
    A cloud's RDMA fabric (Alicloud eRDMA, Tencent HCC) counts once its catalog lists a type
    with it; today neither catalog does, so those nodes scale as plain TCP."""
    if it.infiniband and it.infiniband_gbps:
        return float(max(it.infiniband_gbps, it.network_gbps))
    return float(it.network_gbps)


def scaling_efficiency(it: InstanceType, nodes: int, assumptions: Assumptions) -> float:
    if nodes <= 1:
        return 1.0
    gbps = fabric_gbps(it)
    per = next(eff for floor, eff in assumptions.scaling if gbps >= floor)
    return float(per ** math.log2(nodes))
