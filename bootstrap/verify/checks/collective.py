"""The collective checks, on one node (``allreduce.local``, ``train``, ``mfu``) and across
nodes (``allreduce.cross``, ``train.cross``, ``mfu.cross``, ``cross.nodes``, ``fabric``): the
all-reduce sums right at the bus bandwidth the interconnect or network promises, the DDP
training step's loss falls and stays finite, its model FLOPs utilisation, and the fabric
environment the cross-node run used.

A CPU run (``--cpu``) or a GPU the catalog does not know is judged for correctness only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from bootstrap.fleet.interconnect import EFA, INFINIBAND, TCP
from bootstrap.verify.checks.base import (
    CPU,
    CROSS,
    GPU,
    GRADE,
    Node,
    Result,
    Thresholds,
    check,
    run_error,
)
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check, grade, join

ALL = frozenset({GPU, CPU, CROSS})


def never_met(node: Node) -> bool:
    """The cross-node run failed on some node before any node trained: nothing to judge."""
    return bool(node.problems) and not node.run.get("train")


def _problems(node: Node) -> str:
    return "; ".join(node.problems)[:400]


def _judged(node: Node) -> bool:
    """Bandwidth and MFU are judged on a GPU run against a GPU the catalog knows."""
    return node.gpu is not None and not node.exp.cpu


@check(
    "allreduce",
    runs=ALL,
    thresholds=[*GRADE, "nccl_busbw_fraction", "internode_busbw_fraction"],
)
def allreduce(node: Node, th: Thresholds) -> Result:
    name = "allreduce" + (node.suffix or ".local")
    run, exp = node.run, node.exp
    if never_met(node):
        return Check(name, FAIL, "not measured", "-", detail=_problems(node))
    if exp.quick:
        # A CPU --quick run has no collective phases at all: nothing to report.
        return None if node.run_kind == CPU else Check(name, NOT_RUN, "--quick", "-")
    ar = run.get("allreduce")
    nproc = int(run.get("nproc") or 0) * int(run.get("nnodes") or 1)
    if ar is None:
        if nproc == 1:
            return Check(name, NOT_RUN, "1 process", "-", detail="nothing to all-reduce")
        return Check(name, FAIL, "not measured", "-", detail=run_error(run))
    if not ar.get("correct"):
        return Check(
            name,
            FAIL,
            "wrong sum",
            "exact sum",
            detail="all-reduce returned a wrong result: a broken NCCL/gloo setup",
        )
    if not _judged(node):
        why = "CPU run" if exp.cpu else "no catalog reference for this GPU"
        return Check(
            name,
            PASS,
            f"correct, {ar['busbw_gbs']:.2f} GB/s bus",
            "correct sum",
            detail=f"{ar['world']} {run.get('backend', 'gloo')} ranks; {why}: correctness only",
            value=ar["busbw_gbs"],
        )
    return _busbw(name, node, ar, th)


def _busbw(name: str, node: Node, ar: Mapping[str, Any], th: Thresholds) -> Check:
    exp = node.exp
    if node.run_kind == CROSS:
        # InfiniBand sizes carry their collectives over the HCAs, not the Ethernet NIC: judged
        # against the InfiniBand rate, a run that fell back to TCP sockets shows as slow.
        ib = exp.fabric == INFINIBAND and bool(exp.infiniband_gbps)
        gbps = (exp.infiniband_gbps if ib else exp.network_gbps) or 0
        basis_gbs = gbps / 8
        frac = th["internode_busbw_fraction"]
        net = "InfiniBand" if ib else "network"
        basis = f"internode_busbw_fraction {frac:g} x {gbps:g} Gbit/s {net}"
    else:
        basis_gbs = node.gpu.interconnect_gbs if node.gpu else 0
        frac = th["nccl_busbw_fraction"]
        basis = f"nccl_busbw_fraction {frac:g} x {basis_gbs:g} GB/s interconnect"
    if not basis_gbs:
        return Check(
            name,
            SKIP,
            f"{ar['busbw_gbs']:.1f} GB/s",
            "-",
            detail="no network bandwidth in the catalog for this instance type",
        )
    return grade(
        name,
        ar["busbw_gbs"],
        basis_gbs * frac,
        th,
        unit="GB/s",
        basis=basis,
        detail=f"{ar['world']} ranks, {ar['bytes'] / 2**20:.0f} MiB messages",
    )


@check("train", runs=ALL, thresholds=["loss_drop_min"])
def train(node: Node, th: Thresholds) -> Result:
    """The loss of the DDP + AMP + checkpointing step falls by loss_drop_min, finitely."""
    name = "train" + node.suffix
    run, exp = node.run, node.exp
    if never_met(node):
        return Check(name, FAIL, "did not run", "loss falls", detail=_problems(node))
    if exp.quick:
        if node.run_kind == CPU:
            return Check(name, NOT_RUN, "--quick", detail="training step skipped")
        return Check(name, NOT_RUN, "--quick", "-")
    step = run.get("train")
    if not step:
        return Check(name, FAIL, "did not run", "loss falls", detail=run_error(run))
    losses = [float(x) for x in step.get("losses") or []]
    drop_min = th["loss_drop_min"]
    where = f"{step['world']} {step['backend']} ranks, {step['amp']}, checkpointing " + (
        "on" if step.get("checkpointing") else "OFF"
    )
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if not losses:
        return Check(name, FAIL, "no loss curve", "loss falls")
    if bad is not None:
        return Check(
            name,
            FAIL,
            f"loss {losses[bad]} at step {bad}",
            "finite loss",
            detail=join("the training step diverged", where),
        )
    first, last = losses[0], statistics.fmean(losses[-5:])
    drop = 1 - last / first if first > 0 else 0.0
    measured = f"loss {first:.2f} -> {last:.2f} ({drop:.0%} lower)"
    expected = f">= {drop_min:.0%} lower in {len(losses)} steps"
    if drop >= drop_min:
        return Check(name, PASS, measured, expected, detail=where, value=drop)
    short = 1 - drop / drop_min if drop_min else 1.0
    return Check(
        name,
        FAIL,
        measured,
        expected,
        detail=join(
            f"the loss did not fall enough: {short:.0%} short of the loss_drop_min threshold",
            where,
        ),
        threshold="loss_drop_min",
        shortfall=short,
        value=drop,
    )


@check("mfu", runs=ALL, thresholds=["pass_ratio", "expected_mfu", "min_mfu"])
def mfu(node: Node, th: Thresholds) -> Result:
    """Model FLOPs utilisation of the training step against the catalog GPU's dense peak."""
    name = "mfu" + node.suffix
    step = node.run.get("train")
    if never_met(node) or node.exp.quick or not step:
        return None
    tps, gpu = step.get("tokens_per_s"), node.gpu
    if node.exp.cpu or gpu is None or not tps:
        why = (
            "CPU run: throughput reported, not judged"
            if node.exp.cpu
            else "no GPU reference peak"
            if gpu is None
            else "no tokens/s measured"
        )
        return Check(name, NOT_RUN, f"{tps or 0:,.0f} tokens/s", "-", detail=why)
    achieved = tps * step["flops_per_token"]
    util = achieved / (step["world"] * gpu.peak_tflops * 1e12)
    want, floor = th["expected_mfu"], th["min_mfu"]
    pass_at = th["pass_ratio"] * want
    measured = f"{util:.1%} ({tps:,.0f} tokens/s)"
    detail = (
        f"{achieved / 1e12 / step['world']:.0f} TF/s per GPU of {gpu.peak_tflops:g} peak; "
        f"model FLOPs 6N + attention, recompute not counted"
    )
    if util >= pass_at:
        return Check(name, PASS, measured, f">= {pass_at:.1%}", detail=detail, value=util)
    if util >= floor:
        short = 1 - util / pass_at
        return Check(
            name,
            WARN,
            measured,
            f">= {pass_at:.1%}",
            detail=join(f"{short:.0%} below pass_ratio x expected_mfu {want:g}", detail),
            threshold="expected_mfu",
            shortfall=short,
            value=util,
        )
    short = 1 - util / floor
    return Check(
        name,
        FAIL,
        measured,
        f">= {floor:.1%}",
        detail=join(f"{short:.0%} below the min_mfu floor {floor:g}", detail),
        threshold="min_mfu",
        shortfall=short,
        value=util,
    )


@check("cross.nodes", runs=[CROSS])
def cross_nodes(node: Node, th: Thresholds) -> Result:
    """Some node reported errors although the run went ahead."""
    if not node.problems or never_met(node):
        return None
    return Check("cross.nodes", FAIL, "errors", "clean run", detail=_problems(node))


# What would take the cross-node collectives off the fabric the tier pays for, as the node's
# own environment showed it (user --node-env included): fabric -> (variable, value that does).
_OFF_FABRIC: dict[str, tuple[str, Callable[[str], bool]]] = {
    EFA: ("FI_PROVIDER", lambda v: v != "efa"),
    INFINIBAND: ("NCCL_IB_DISABLE", lambda v: v == "1"),
}


@check("fabric", runs=[CROSS])
def fabric(node: Node, th: Thresholds) -> Result:
    """Which fabric environment the cross-node run used, and whether something in it (a
    --node-env value, the node's own profile) turned the tier's fabric off."""
    exp = node.exp
    env = node.report.get("network_env")
    expected = {EFA: "EFA", INFINIBAND: "InfiniBand", TCP: "TCP sockets"}[exp.fabric]
    if env is None:
        return Check("fabric", SKIP, "not reported", expected, detail="older node script")
    shown = ", ".join(f"{k}={v}" for k, v in env.items())[:300] or "nothing set"
    off = _OFF_FABRIC.get(exp.fabric)
    if off and off[0] in env and off[1](env[off[0]]):
        return Check(
            "fabric",
            WARN,
            f"{off[0]}={env[off[0]]}",
            expected,
            detail=f"the cross-node run did not use {expected} (--node-env?): its figures "
            f"are not the fabric's; env: {shown}",
        )
    return Check("fabric", PASS, f"{exp.fabric} env", expected, detail=shown)
