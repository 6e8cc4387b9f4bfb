"""verify-gpu's judgement, pure: one node's raw measurements (the JSON the node side prints)
against the expectation, check by check, walking the registry in
:mod:`bootstrap.verify.checks`; :func:`judge_cluster` does the same for the cross-node run.
Thresholds are catalog data (``infra/catalog/gpus.toml``, ``thresholds`` tables), never
constants in the code; each check names the threshold it failed and by how much.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from typing import Any

from bootstrap.verify.checks import CHECKS
from bootstrap.verify.checks.base import CPU, CROSS, GPU, CheckSpec, Node
from bootstrap.verify.expected import Expected, expected_from
from bootstrap.verify.verdict import (
    CPU_ONLY,
    FAIL,
    NOT_RUN,
    PASS,
    SKIP,
    WARN,
    Check,
    Verdict,
    grade,
    overall,
)
from infra.catalog import gpu_by_nvml_name, load_catalog

__all__ = [
    "CPU_ONLY",
    "FAIL",
    "NODE_SCHEMA",
    "NOT_RUN",
    "PASS",
    "SKIP",
    "WARN",
    "Check",
    "Expected",
    "ReportError",
    "Verdict",
    "cluster_not_run",
    "expected_from",
    "grade",
    "judge",
    "judge_cluster",
    "local_node",
    "overall",
    "parse_report",
    "run_checks",
]

NODE_SCHEMA = "gpufleet.verify/1"


class ReportError(ValueError):
    """The node's output is not a usable verify report."""


def parse_report(text: str) -> dict[str, Any]:
    """The node's JSON, or a ReportError saying what is wrong with it."""
    stripped = text.strip()
    if not stripped:
        raise ReportError("the node returned an empty report")
    try:
        data = jsonlib.loads(stripped)
    except jsonlib.JSONDecodeError as exc:
        hint = "truncated" if stripped.startswith("{") else "not JSON"
        raise ReportError(f"the node's report is {hint} ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise ReportError(f"the node's report is a JSON {type(data).__name__}, not an object")
    if data.get("schema") != NODE_SCHEMA:
        raise ReportError(
            f"the node's report has schema {data.get('schema')!r}, expected {NODE_SCHEMA!r} "
            "(mixed versions of verify_node.py?)"
        )
    return data


def run_checks(
    node: Node, th: Mapping[str, float], checks: tuple[CheckSpec, ...] = CHECKS
) -> tuple[Check, ...]:
    """Every registered check of the node's run kind, in order. A gate that speaks (no GPU,
    benchmarks not run) leaves only the checks marked ``always``."""
    out: list[Check] = []
    gated = False
    for spec in checks:
        if node.run_kind not in spec.runs or (gated and not spec.always):
            continue
        lines = spec(node, th)
        out += lines
        gated = gated or (spec.gate and bool(lines))
    return tuple(out)


def local_node(m: Mapping[str, Any], exp: Expected) -> tuple[Node, Mapping[str, float]]:
    """One node's facts for the checks, and the thresholds they are held to. The GPU that
    sets the performance bar is the tier's, else (no tier) the catalog entry of the GPU
    found; a CPU run has none."""
    if exp.cpu:
        return Node(m, exp, gpu=None, run_kind=CPU), exp.thresholds
    gpus = (m.get("nvidia") or {}).get("gpus") or []
    found = gpu_by_nvml_name(load_catalog(), str(gpus[0].get("name") or "")) if gpus else None
    gpu = exp.gpu or found
    th = gpu.thresholds if gpu and not exp.gpu else exp.thresholds
    return Node(m, exp, gpu=gpu, run_kind=GPU), th


def judge(m: Mapping[str, Any], exp: Expected, host: str = "") -> Verdict:
    """One node's measurements against the tier: every check, in the registry's order."""
    host = host or str((m.get("host") or {}).get("hostname") or "?")
    mode = "cpu" if exp.cpu else "gpu"
    if m.get("report_error"):
        return Verdict(host, mode, (Check("report", FAIL, "unusable", detail=m["report_error"]),))
    return Verdict(host, mode, run_checks(*local_node(m, exp)))


def judge_cluster(per_host: Mapping[str, Mapping[str, Any]], exp: Expected) -> Verdict:
    """The cross-node run (one report per host, the same collective from each side)."""
    problems = []
    for host, m in per_host.items():
        if m.get("report_error") or m.get("fatal") or m.get("skipped"):
            problems.append(
                f"{host}: {m.get('report_error') or m.get('fatal') or m.get('skipped')}"
            )
        elif (m.get("torchrun") or {}).get("errors"):
            problems.append(f"{host}: {(m['torchrun']['errors'] or [''])[0]}")
    runs = [m.get("torchrun") or {} for m in per_host.values()]
    # Every node reports the same collective; the first that trained speaks for the run.
    head = next((r for r in runs if r.get("train")), runs[0] if runs else {})
    # The environment the collectives ran with, as the first node that reported it saw it.
    env = next((m["network_env"] for m in per_host.values() if "network_env" in m), None)
    node = Node(
        {"torchrun": head, **({"network_env": env} if env is not None else {})},
        exp,
        gpu=None if exp.cpu else exp.gpu,
        run_kind=CROSS,
        problems=tuple(problems),
    )
    return Verdict("cluster", "cpu" if exp.cpu else "gpu", run_checks(node, exp.thresholds))


def cluster_not_run(reason: str, exp: Expected) -> Verdict:
    return Verdict(
        "cluster",
        "cpu" if exp.cpu else "gpu",
        (Check("cross-node", FAIL, "not run", f"{exp.nodes} nodes", detail=reason),),
    )
