"""How the GPUs are connected: NVLink between every pair on NVLink tiers, and each GPU's
PCIe link at its generation and width (read under load: idle links may downshift)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bootstrap.verify.checks.base import GPU, Node, Result, Thresholds, check
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check


def nvlink_problems(nv: Mapping[str, Any]) -> tuple[list[str], int]:
    """(what is wrong with the NVLink mesh, links active), from topo -m and nvlink --status."""
    problems = []
    topo = nv.get("topology") or {}
    for row, cols in sorted((topo.get("links") or {}).items()):
        not_nv = [c for c, v in cols.items() if not str(v).startswith("NV")]
        if not_nv:
            problems.append(f"{row} reaches {', '.join(not_nv)} without NVLink ({cols[not_nv[0]]})")
    status = nv.get("nvlink")
    active = 0
    if status is None:
        problems.append("nvidia-smi nvlink --status failed")
    else:
        for g in status:
            down = [str(link["link"]) for link in g["links"] if link["gbs"] is None]
            active += len(g["links"]) - len(down)
            if down:
                problems.append(f"GPU{g['index']} link(s) {', '.join(down)} inactive")
            elif not g["links"]:
                problems.append(f"GPU{g['index']} reports no NVLink links")
    if not topo.get("links") and len(nv.get("gpus") or []) > 1:
        problems.append("nvidia-smi topo -m printed no GPU matrix")
    return problems, active


@check("nvlink", runs=[GPU])
def nvlink(node: Node, th: Thresholds) -> Result:
    if not node.exp.nvlink:
        return Check("nvlink", NOT_RUN, "-", "-", detail="the tier has no NVLink")
    problems, active = nvlink_problems(node.nvidia)
    more = f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
    return Check(
        "nvlink",
        FAIL if problems else PASS,
        "degraded" if problems else f"{active} links active",
        "all links active, NVLink between every GPU pair",
        detail="; ".join(problems[:6]) + more,
    )


@check("pcie", runs=[GPU], thresholds=["min_pcie_gen", "min_pcie_width"])
def pcie(node: Node, th: Thresholds) -> Result:
    load = node.load
    min_gen, min_width = th["min_pcie_gen"], th["min_pcie_width"]
    fails: list[str] = []
    warns: list[str] = []
    shown: list[tuple[float, float]] = []
    for g in node.gpus:
        link = g.get("pcie") or {}
        busy = load.get(g["index"]) or {}
        under_load = bool(busy.get("busy_samples"))
        gen = busy.get("pcie_gen_busy_max") if under_load else link.get("gen_current")
        width = busy.get("pcie_width_busy_max") if under_load else link.get("width_current")
        gmax = busy.get("pcie_gen_max") or link.get("gen_max")
        wmax = busy.get("pcie_width_max") or link.get("width_max")
        if gen is None or width is None:
            continue
        shown.append((gen, width))
        label = f"GPU{g['index']} gen{gen:g} x{width:g}"
        # At idle a link may legitimately downshift: only a reading under load can fail.
        found = fails if under_load else warns
        idle = "" if under_load else " (read at idle, when links may downshift)"
        if width < (wmax or width) or width < min_width:
            found.append(f"{label}: width below x{max(wmax or 0, min_width):g}{idle}")
        if gen < min_gen:
            found.append(f"{label}: below min_pcie_gen {min_gen:g}{idle}")
        elif gmax and gen < gmax:
            found.append(f"{label}: link trained below its gen{gmax:g} maximum{idle}")
    if not shown:
        return Check(
            "pcie",
            SKIP,
            "not reported",
            f">= gen{min_gen:g} x{min_width:g}",
            detail="nvidia-smi printed no PCIe link state (a VM without it?)",
        )
    gen, width = min(shown)
    how = "under load" if load else "at idle (no load samples)"
    return Check(
        "pcie",
        FAIL if fails else (WARN if warns else PASS),
        f"gen{gen:g} x{width:g} ({how})",
        f">= gen{min_gen:g} x{min_width:g}, at the link maximum",
        detail="; ".join((fails + warns)[:6]),
        threshold="min_pcie_width/min_pcie_gen" if fails else None,
    )
