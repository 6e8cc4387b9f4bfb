"""The node's disks and bucket, on GPU and CPU runs alike: scratch sequential read and write
throughput against the catalog's per-device figures, and a put/get/delete in the bucket."""

from __future__ import annotations

from dataclasses import replace

from bootstrap.verify.checks.base import CPU, GRADE, LOCAL, Node, Result, Thresholds, check
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check, grade

SCRATCH_THRESHOLDS = (
    *GRADE,
    "scratch_nvme_gbs_per_device",
    "scratch_disk_gbs",
    "scratch_write_fraction",
)


@check("scratch", runs=LOCAL, thresholds=SCRATCH_THRESHOLDS)
def scratch(node: Node, th: Thresholds) -> Result:
    """``scratch.read`` and ``scratch.write``; one ``scratch`` line when nothing was measured."""
    exp = node.exp
    if exp.quick:
        # The node skips the probe with --quick; a CPU --quick run does not mention it.
        return None if node.run_kind == CPU else Check("scratch", NOT_RUN, "--quick", "-")
    s = node.report.get("scratch")
    if not s:
        return Check("scratch", FAIL, "not measured", "-")
    if s.get("error"):
        return Check("scratch", FAIL, "unusable", exp.scratch.path, detail=str(s["error"]))
    devices = exp.scratch.devices or 1
    if exp.scratch.kind == "nvme":
        per = th["scratch_nvme_gbs_per_device"]
        read_exp, basis = (
            per * devices,
            f"scratch_nvme_gbs_per_device {per:g} x {devices} device(s)",
        )
    else:
        read_exp = th["scratch_disk_gbs"]
        basis = f"scratch_disk_gbs {read_exp:g}"
    write_frac = th["scratch_write_fraction"]
    how = f"{s['bytes'] / 2**20:.0f} MiB, {'O_DIRECT' if s.get('direct') else 'buffered + fsync'}"
    notes = [how]
    unmounted = s.get("is_mount") is False
    if unmounted:
        notes.append(
            f"{s['path']} is not a mount point: the scratch volume is not mounted "
            "(fab mount-scratch), this measured the root disk"
        )
    read = grade(
        "scratch.read",
        s["read_gbs"],
        read_exp,
        th,
        unit="GB/s",
        basis=basis,
        detail="; ".join(notes),
    )
    write = grade(
        "scratch.write",
        s["write_gbs"],
        read_exp * write_frac,
        th,
        unit="GB/s",
        basis=f"scratch_write_fraction {write_frac:g} x read expectation",
        detail=how,
    )
    if unmounted:
        read = replace(read, status=FAIL if read.status == FAIL else WARN)
    return [read, write]


@check("storage", runs=LOCAL, always=True)
def storage(node: Node, th: Thresholds) -> Result:
    """The node's put/get/delete probe in the stack's bucket, with the node's credentials."""
    st = node.report.get("storage")
    if st is None:
        return None
    status = st.get("status")
    bucket = st.get("bucket") or node.exp.bucket
    if status == "ok":
        timing = ", ".join(
            f"{k[:-2]} {st[k] * 1000:.0f} ms" for k in ("put_s", "get_s", "delete_s") if k in st
        )
        return Check(
            "storage",
            PASS,
            f"put/get/delete ok ({st.get('tool')})",
            f"put/get/delete in {bucket}",
            detail=timing,
        )
    if status == "skip":
        if not bucket:
            return Check("storage", NOT_RUN, "no bucket", "-", detail=str(st.get("reason", "")))
        return Check(
            "storage",
            SKIP,
            "not probed",
            f"put/get/delete in {bucket}",
            detail=str(st.get("reason", "")),
        )
    return Check(
        "storage",
        FAIL,
        "error",
        f"put/get/delete in {bucket}",
        detail=str(st.get("reason", ""))[:300],
    )
