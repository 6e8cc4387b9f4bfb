"""Each GPU's own speed, measured on all of them at once: dense GEMM TFLOP/s in the tier's
precision and HBM GB/s (a large device copy), against the catalog GPU's expectations."""

from __future__ import annotations

from dataclasses import replace

from bootstrap.verify.checks.base import GPU, GRADE, Node, Result, Thresholds, check, run_error
from bootstrap.verify.verdict import FAIL, NOT_RUN, SKIP, Check, grade, join


@check("benchmarks", runs=[GPU], gate=True)
def benchmarks(node: Node, th: Thresholds) -> Result:
    """The node skipped its benchmarks (no CUDA device for torch): nothing below can run."""
    skipped = node.report.get("skipped")
    return Check("benchmarks", FAIL, "not run", detail=str(skipped)) if skipped else None


@check("gemm", runs=[GPU], thresholds=[*GRADE, "expected_gemm_fraction"])
def gemm(node: Node, th: Thresholds) -> Result:
    """The slowest GPU's GEMM against expected_gemm_fraction x the catalog's dense peak."""
    gpu, rows = node.gpu, node.run.get("gemm") or []
    if gpu is None:
        return Check(
            "gemm",
            SKIP,
            "no reference",
            "-",
            detail="the GPU model is not in the catalog, so there is no peak to compare with",
        )
    if not rows:
        return Check("gemm", FAIL, "not measured", "-", detail=run_error(node.run))
    # gpu.expected_gemm_tflops is the catalog's expected_gemm_fraction x peak; th names the
    # same fraction here and carries any override the caller made.
    expected = gpu.peak_tflops * th["expected_gemm_fraction"]
    worst = min(rows, key=lambda r: r["tflops"])
    slow = [
        f"GPU{r['local_rank']} {r['tflops']:.0f}"
        for r in rows
        if r["tflops"] < th["pass_ratio"] * expected
    ]
    result = grade(
        "gemm",
        worst["tflops"],
        expected,
        th,
        unit="TF/s",
        basis=f"expected_gemm_fraction {th['expected_gemm_fraction']:g} x "
        f"{gpu.peak_tflops:g} {worst['dtype']} peak",
        detail=f"slow: {', '.join(slow)}"
        if slow
        else f"min of {len(rows)} GPU(s), {worst['n']}^3 {worst['dtype']}",
    )
    if not all(r.get("finite", True) for r in rows):
        detail = join("GEMM produced non-finite values", result.detail)
        result = replace(result, status=FAIL, detail=detail)
    return result


@check("hbm", runs=[GPU], thresholds=[*GRADE, "expected_hbm_fraction"])
def hbm(node: Node, th: Thresholds) -> Result:
    """The slowest GPU's device-to-device copy against expected_hbm_fraction x bandwidth."""
    if node.exp.quick:
        return Check("hbm", NOT_RUN, "--quick", "-")
    gpu, rows = node.gpu, node.run.get("hbm") or []
    if gpu is None:
        return Check("hbm", SKIP, "no reference", "-")
    if not rows:
        return Check("hbm", FAIL, "not measured", "-", detail=run_error(node.run))
    worst = min(rows, key=lambda r: r["gbs"])
    frac = th["expected_hbm_fraction"]
    return grade(
        "hbm",
        worst["gbs"],
        gpu.bandwidth_gbs * frac,
        th,
        unit="GB/s",
        basis=f"expected_hbm_fraction {frac:g} x {gpu.bandwidth_gbs:g} GB/s",
        detail=f"device copy of {worst['bytes'] / 2**30:.1f} GiB, min of {len(rows)}",
    )
