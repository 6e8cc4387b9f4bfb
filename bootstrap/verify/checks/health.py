"""Is the hardware healthy: ECC, retired/remapped memory, throttling, temperature,
persistence mode, Xid errors in the kernel log, the fabric manager on NVSwitch nodes and the
InfiniBand ports on InfiniBand tiers."""

from __future__ import annotations

from bootstrap.fleet.interconnect import INFINIBAND
from bootstrap.verify.checks.base import GPU, Node, Result, Thresholds, check
from bootstrap.verify.health.verdict import FAILED, xids_of_class
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check, gpu_list, join

# Xids whose immediate action in NVIDIA's Xid catalog is a GPU reset, a reboot, a hardware
# check or an ECC / NVLink workflow: the node-health catalog's "failed" buckets
# (infra/catalog/health.toml, cited there). The others warn: usually an application fault
# (13, 31, 43, 94), worth a look.
FATAL_XIDS = xids_of_class(FAILED)
# Throttle reasons that mean the GPU is slowed by something wrong with it or its cooling.
# A software power cap under a full GEMM is normal on power-limited cards: noted, not failed.
BAD_THROTTLE = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)


@check("ecc", runs=[GPU])
def ecc(node: Node, th: Thresholds) -> Result:
    gpus = node.gpus
    vol = {g["index"]: (g.get("ecc_volatile") or {}).get("uncorrected") or 0 for g in gpus}
    agg = {g["index"]: (g.get("ecc_aggregate") or {}).get("uncorrected") or 0 for g in gpus}
    corrected = sum((g.get("ecc_volatile") or {}).get("corrected") or 0 for g in gpus)
    off = [g["index"] for g in gpus if g.get("ecc_mode") is False]
    bad = {i: n for i, n in vol.items() if n}
    if bad:
        listing = ", ".join(f"GPU{i}: {n}" for i, n in bad.items())
        return Check(
            "ecc",
            FAIL,
            f"{sum(bad.values())} uncorrectable (volatile)",
            "0",
            detail=f"{listing}; drain the node and reset the GPU or replace it",
            threshold="uncorrectable ECC",
            value=float(sum(bad.values())),
        )
    parts = []
    if any(agg.values()):
        parts.append(
            f"{sum(agg.values())} uncorrectable in the GPUs' lifetime (aggregate) on "
            f"{gpu_list(i for i, n in agg.items() if n)}"
        )
    if off:
        parts.append(f"ECC disabled on {gpu_list(off)}")
    if parts:
        return Check("ecc", WARN, "0 uncorrectable since boot", "0", detail="; ".join(parts))
    return Check("ecc", PASS, f"0 uncorrectable, {corrected} corrected", "0 uncorrectable")


@check("memory.remap", runs=[GPU])
def memory_remap(node: Node, th: Thresholds) -> Result:
    """Pending remaps/retirements need a GPU reset (FAIL); done ones are worth knowing (WARN)."""
    pending, done = [], []
    for g in node.gpus:
        rows, pages = g.get("remapped_rows") or {}, g.get("retired_pages") or {}
        i = g["index"]
        if rows.get("failure"):
            pending.append(f"GPU{i}: row remapping failed")
        elif rows.get("pending"):
            pending.append(f"GPU{i}: row remap pending (reset the GPU)")
        if pages.get("pending"):
            pending.append(f"GPU{i}: page retirement pending (reset the GPU)")
        retired = (pages.get("single_bit") or 0) + (pages.get("double_bit") or 0)
        if retired:
            done.append(f"GPU{i}: {retired} retired page(s)")
        if rows.get("uncorrectable"):
            done.append(f"GPU{i}: {rows['uncorrectable']} row(s) remapped for uncorrectable errors")
    if pending:
        return Check(
            "memory.remap", FAIL, "pending", "none pending", detail="; ".join(pending + done)
        )
    if done:
        return Check("memory.remap", WARN, "remapped/retired", "none", detail="; ".join(done))
    return Check("memory.remap", PASS, "none", "none")


@check("throttle", runs=[GPU])
def throttle(node: Node, th: Thresholds) -> Result:
    """Throttle reasons seen at idle or under load; hardware/thermal slowdowns fail."""
    load = node.load
    reasons = {
        g["index"]: set(g.get("throttle_reasons") or [])
        | set((load.get(g["index"]) or {}).get("throttle_reasons") or [])
        for g in node.gpus
    }
    bad = {i: sorted(r & BAD_THROTTLE) for i, r in reasons.items() if r & BAD_THROTTLE}
    capped = [i for i, r in reasons.items() if "sw_power_cap" in r]
    note = f"power cap reached on {gpu_list(capped)} (normal under full load)" if capped else ""
    if bad:
        return Check(
            "throttle",
            FAIL,
            "; ".join(f"GPU{i}: {', '.join(r)}" for i, r in bad.items()),
            "no thermal/HW slowdown",
            detail=join("clocks were cut by the hardware: check cooling, power and the GPU", note),
        )
    return Check("throttle", PASS, "none", "no thermal/HW slowdown", detail=note)


@check("temperature", runs=[GPU], thresholds=["max_temperature_c"])
def temperature(node: Node, th: Thresholds) -> Result:
    """The hottest reading, under load or at idle; nothing to say without one."""
    load, gpus = node.load, node.gpus
    temps = [
        t
        for t in ((load.get(g["index"]) or {}).get("temperature_max_c") for g in gpus)
        if t is not None
    ]
    temps += [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
    if not temps:
        return None
    hottest, limit = max(temps), th["max_temperature_c"]
    hot = hottest > limit
    return Check(
        "temperature",
        WARN if hot else PASS,
        f"{hottest:.0f} C",
        f"<= {limit:.0f} C",
        threshold="max_temperature_c" if hot else None,
        value=hottest,
        detail="hot under load: check airflow before long runs" if hot else "",
    )


@check("persistence", runs=[GPU])
def persistence(node: Node, th: Thresholds) -> Result:
    off = [g["index"] for g in node.gpus if g.get("persistence_mode") is False]
    return Check(
        "persistence",
        WARN if off else PASS,
        f"off on {gpu_list(off)}" if off else "on",
        "on",
        detail="`nvidia-smi -pm 1` (or nvidia-persistenced) avoids driver "
        "re-initialisation on every process start"
        if off
        else "",
    )


@check("xid", runs=[GPU])
def xid(node: Node, th: Thresholds) -> Result:
    """Xid errors since boot: hardware-class ones fail, the others warn."""
    log = node.report.get("xid") or {}
    events = log.get("events") or []
    if not log.get("source"):
        return Check(
            "xid",
            SKIP,
            "kernel log unreadable",
            "no Xid errors",
            detail=f"{log.get('error') or 'no kernel log'}; run as root or allow sudo dmesg",
        )
    fatal = sorted({e["xid"] for e in events if e["xid"] in FATAL_XIDS})
    other = sorted({e["xid"] for e in events if e["xid"] not in FATAL_XIDS})
    where = sorted({e.get("pci", "?") for e in events})
    if fatal:
        return Check(
            "xid",
            FAIL,
            f"Xid {', '.join(map(str, fatal))}",
            "none",
            detail=f"hardware-class Xid since boot on PCI {', '.join(where)}: "
            f"{events[-1]['line'][:160]}",
        )
    if other:
        return Check(
            "xid",
            WARN,
            f"Xid {', '.join(map(str, other))}",
            "none",
            detail="application-class Xid since boot (often a crashed job)",
        )
    return Check("xid", PASS, "none", "none", detail=f"read with {log['source']}")


@check("fabric-manager", runs=[GPU])
def fabric_manager(node: Node, th: Thresholds) -> Result:
    """NVSwitch systems (by the tier, or by the devices found) need the fabric manager."""
    nv = node.nvidia
    seen = (nv.get("nvswitch_devices") or 0) + ((nv.get("pci") or {}).get("nvswitches") or 0)
    if not (node.exp.nvswitch or seen):
        return Check("fabric-manager", NOT_RUN, "no NVSwitch", "-", detail="not an NVSwitch tier")
    state = (node.report.get("fabric_manager") or {}).get("state") or "unknown"
    if state == "active":
        return Check("fabric-manager", PASS, state, "active")
    return Check(
        "fabric-manager",
        FAIL,
        state,
        "active",
        detail="NVSwitch systems need nvidia-fabricmanager running (same version as the "
        "driver), or CUDA finds no peer links",
    )


def _ib_rate_gbps(rate: str | None) -> float:
    """sysfs ``rate``: "200 Gb/sec (4X HDR)" -> 200.0 (0 when unreadable)."""
    try:
        return float(str(rate or "").split()[0])
    except (IndexError, ValueError):
        return 0.0


@check("infiniband", runs=[GPU])
def infiniband(node: Node, th: Thresholds) -> Result:
    """On an InfiniBand tier: /dev/infiniband exists and the HCAs' InfiniBand ports are
    ACTIVE (sysfs, as ``ibstatus`` reads it), at the size's total rate when it is known."""
    if node.exp.fabric != INFINIBAND:
        return Check("infiniband", NOT_RUN, "-", "-", detail="not an InfiniBand tier")
    ib = node.report.get("infiniband")
    if ib is None:
        return Check(
            "infiniband", SKIP, "not collected", "ports active", detail="older node script"
        )
    fix = (
        "NCCL would fall back to TCP: boot Microsoft's Ubuntu HPC image (it carries the "
        "InfiniBand driver stack) or install the DOCA/MOFED stack, then reboot"
    )
    if not ib.get("dev"):
        return Check("infiniband", FAIL, "no /dev/infiniband", "HCA devices", detail=fix)
    ports = [p for p in ib.get("ports") or [] if p.get("link_layer") == "InfiniBand"]
    if not ports:
        return Check(
            "infiniband",
            FAIL,
            "no InfiniBand ports",
            "ports active",
            detail=f"none in /sys/class/infiniband; {fix}",
        )
    active = [p for p in ports if "ACTIVE" in str(p.get("state") or "")]
    down = [f"{p['device']}/{p['port']}: {p.get('state') or '?'}" for p in ports if p not in active]
    measured = f"{len(active)} of {len(ports)} ports active"
    if not active:
        return Check(
            "infiniband",
            FAIL,
            measured,
            "all active",
            detail=f"{'; '.join(down)[:200]}; the subnet manager may not have brought the "
            "links up yet: retry in a minute, else redeploy the VM",
        )
    total = sum(_ib_rate_gbps(p.get("rate")) for p in active)
    want = node.exp.infiniband_gbps or 0
    if down or (want and total < want):
        why = "; ".join(down)[:200] if down else f"{total:g} of {want:g} Gb/s across the ports"
        return Check(
            "infiniband",
            WARN,
            measured,
            f"all active, {want:g} Gb/s" if want else "all active",
            detail=f"{why}: cross-node bandwidth will be below what the size is sold with",
            value=total,
        )
    return Check(
        "infiniband",
        PASS,
        f"{measured}, {total:g} Gb/s",
        f"all active, {want:g} Gb/s" if want else "all active",
        value=total,
    )
