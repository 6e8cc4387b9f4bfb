"""What the node has, against the tier: a GPU at all, how many, which model, how much memory,
a torch that can use them, and whole GPUs (MIG off). ``--cpu`` runs have their own two. And
first of all: did the node script finish?"""

from __future__ import annotations

from bootstrap.verify.checks.base import CPU, GPU, LOCAL, Node, Result, Thresholds, check
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, WARN, Check, gpu_list, join
from infra.catalog import gpu_by_nvml_name, load_catalog


@check("report", runs=LOCAL)
def node_script_crashed(node: Node, th: Thresholds) -> Result:
    """verify_node.py died part-way: what it did measure is still judged, after this FAIL."""
    fatal = node.report.get("fatal")
    return Check("report", FAIL, "node script crashed", detail=str(fatal)) if fatal else None


@check("gpu.present", runs=[GPU], gate=True)
def gpu_present(node: Node, th: Thresholds) -> Result:
    """No usable GPU ends the GPU checks: everything after it would only repeat this."""
    nv, exp = node.nvidia, node.exp
    if nv.get("available"):
        return None
    pci = (nv.get("pci") or {}).get("gpus")
    seen = f"; lspci shows {pci} NVIDIA GPU(s)" if pci else ""
    return Check(
        "gpu.present",
        FAIL,
        "no NVIDIA GPU",
        f"{exp.gpu_count or 'some'}x {exp.gpu.key if exp.gpu else 'NVIDIA GPU'}",
        detail=f"{nv.get('error') or 'nvidia-smi lists no GPU'}{seen}. "
        "Install the driver (fab install-driver), or verify the CPU training path "
        "only with --cpu",
    )


@check("gpu", runs=[CPU])
def gpu_not_verified(node: Node, th: Thresholds) -> Result:
    exp = node.exp
    tier = f"{exp.gpu_count or '?'}x {exp.gpu.key}" if exp.gpu else "no GPU tier"
    return Check(
        "gpu",
        NOT_RUN,
        "CPU run (--cpu)",
        tier,
        detail="the GPU tier is NOT verified by a CPU run: inventory, health, GEMM, "
        "bandwidth and MFU are not measured",
    )


@check("gpu.count", runs=[GPU])
def gpu_count(node: Node, th: Thresholds) -> Result:
    nv, want = node.nvidia, node.exp.gpu_count
    found = len(node.gpus)
    pci = (nv.get("pci") or {}).get("gpus")
    extra = []
    # Fewer on the bus than the driver lists means lspci cannot see the bus (a container).
    if pci is not None and pci > found:
        extra.append(f"lspci shows {pci} NVIDIA GPU(s), the driver {found}")
    if nv.get("smi_stderr"):
        extra.append(f"nvidia-smi: {nv['smi_stderr']}")
    if want is None:
        return Check(
            "gpu.count",
            WARN,
            str(found),
            "?",
            detail=join("no tier to compare with: pass --stack, --inventory or --tier", *extra),
        )
    if found != want:
        gap = (
            f"{want - found:+d} GPU(s) missing"
            if found < want
            else f"{found - want} more GPU(s) than the tier"
        )
        return Check(
            "gpu.count",
            FAIL,
            f"{found} of {want}",
            str(want),
            detail=join(gap, *extra),
            threshold="gpu_count",
            value=found,
        )
    return Check("gpu.count", PASS, str(found), str(want), detail=join(*extra), value=found)


@check("gpu.model", runs=[GPU])
def gpu_model(node: Node, th: Thresholds) -> Result:
    exp = node.exp
    names = sorted({str(g.get("name")) for g in node.gpus})
    if not exp.gpus_allowed:
        known = [gpu_by_nvml_name(load_catalog(), n) for n in names]
        return Check(
            "gpu.model",
            WARN,
            ", ".join(names),
            "?",
            detail=join(
                "no tier to compare with",
                "" if all(known) else "not in the catalog: thresholds are the defaults",
            ),
        )
    allowed = {n.lower() for g in exp.gpus_allowed for n in g.nvml_names}
    wrong = [n for n in names if n.lower() not in allowed]
    return Check(
        "gpu.model",
        FAIL if wrong else PASS,
        ", ".join(names),
        " / ".join(g.key for g in exp.gpus_allowed),
        detail=f"not the tier's GPU: {', '.join(wrong)}" if wrong else "",
    )


@check("gpu.memory", runs=[GPU], thresholds=["min_memory_fraction"])
def gpu_memory(node: Node, th: Thresholds) -> Result:
    gpus, tier_gb = node.gpus, node.exp.memory_gb
    mems = [float(g["memory_total_mib"]) for g in gpus if g.get("memory_total_mib")]
    if not mems or not tier_gb:
        return None
    low = min(mems) / 1024  # nvidia-smi MiB -> GiB, the unit datasheets round to "GB"
    floor = th["min_memory_fraction"] * tier_gb
    short = [g["index"] for g in gpus if (g.get("memory_total_mib") or 0) / 1024 < floor]
    return Check(
        "gpu.memory",
        FAIL if short else PASS,
        f"{low:.1f} GiB",
        f">= {floor:.1f} GiB",
        detail=f"{gpu_list(short)} below min_memory_fraction x {tier_gb:g} GB" if short else "",
        threshold="min_memory_fraction" if short else None,
        value=low,
    )


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in str(text).split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _software_problem(node: Node) -> tuple[str, str] | None:
    """(expected, why) when the node's torch cannot use its GPUs; None when it can."""
    info, gpus = node.torch, node.gpus
    cuda, tcuda = node.nvidia.get("cuda_version"), info.get("torch_cuda")
    if info.get("error") or not info.get("torch"):
        return "torch with CUDA", str(info.get("error") or "torch not found")
    if not tcuda:
        return (
            "a CUDA build of torch",
            "the node's torch is a CPU-only build: reinstall with fab install-pytorch",
        )
    if not info.get("cuda_available"):
        return (
            f"CUDA >= {tcuda} driver",
            f"torch (CUDA {tcuda}) cannot use the GPUs: driver too old "
            "for this torch build, or a broken CUDA install",
        )
    if int(info.get("device_count") or 0) != len(gpus):
        return (
            f"{len(gpus)} devices in torch",
            f"torch sees {info.get('device_count')} of {len(gpus)} "
            "GPUs (CUDA_VISIBLE_DEVICES set? a GPU in a bad state?)",
        )
    if cuda and _version(tcuda)[0] > _version(cuda)[0]:
        return f"driver CUDA >= {tcuda}", "torch's CUDA major version is newer than the driver's"
    return None


@check("software", runs=[GPU])
def software(node: Node, th: Thresholds) -> Result:
    """Driver, CUDA and torch versions, and whether this torch can drive these GPUs."""
    nv, info = node.nvidia, node.torch
    driver, cuda, tcuda = nv.get("driver_version"), nv.get("cuda_version"), info.get("torch_cuda")
    measured = f"driver {driver or '?'}, CUDA {cuda or '?'}, torch {info.get('torch', '?')}"
    if info.get("nccl"):
        measured += f", NCCL {info['nccl']}"
    problem = _software_problem(node)
    if problem:
        return Check("software", FAIL, measured, problem[0], detail=problem[1])
    if cuda and _version(str(tcuda)) > _version(cuda):
        return Check(
            "software",
            PASS,
            measured,
            f"driver CUDA {_version(str(tcuda))[0]}.x",
            # PyTorch wheels carry their own CUDA runtime and SASS for every supported
            # GPU, so a newer minor version runs on an older driver of the same major.
            detail=f"torch's CUDA {tcuda} runs on the driver's {cuda} through CUDA "
            "minor-version compatibility",
        )
    return Check("software", PASS, measured, f"torch CUDA {tcuda} <= driver CUDA")


@check("software", runs=[CPU])
def software_cpu(node: Node, th: Thresholds) -> Result:
    info = node.torch
    if info.get("error") or not info.get("torch"):
        return Check(
            "software",
            FAIL,
            "no usable torch",
            "torch in the node's Python",
            detail=f"{info.get('error') or 'torch not found'}: run fab install-pytorch "
            "or pass --python",
        )
    return Check("software", PASS, f"torch {info['torch']}", "torch")


@check("mig", runs=[GPU])
def mig(node: Node, th: Thresholds) -> Result:
    gpus = node.gpus
    on = [g["index"] for g in gpus if g.get("mig_current")]
    pending = [g["index"] for g in gpus if g.get("mig_pending") and not g.get("mig_current")]
    if on:
        return Check(
            "mig",
            FAIL,
            f"MIG on: {gpu_list(on)}",
            "MIG off",
            detail="the tier expects whole GPUs: `nvidia-smi -mig 0` then reset "
            "the GPUs (or reboot)",
        )
    if pending:
        return Check(
            "mig",
            WARN,
            f"MIG pending on {gpu_list(pending)}",
            "MIG off",
            detail="MIG turns on at the next GPU reset",
        )
    return Check("mig", PASS, "off", "off")
