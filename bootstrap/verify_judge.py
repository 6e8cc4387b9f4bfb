"""verify-gpu's judgement, pure: what a healthy node of the tier looks like, and each check.

:func:`expected_from` turns the stack outputs and the catalog into the expectation,
:func:`judge` compares one node's raw measurements (the JSON the node side prints) with it
check by check, :func:`judge_cluster` does the same for the cross-node run. Thresholds are
catalog data (``infra/catalog/gpus.toml``, ``thresholds`` tables), never constants in this
file; each check names the threshold it failed and by how much.

Statuses: PASS, WARN, FAIL, SKIP (could not be checked: a tool or credential is missing; never
a pass) and NOT-RUN (not applicable, or not asked for: ``--quick``, ``--cpu``). A CPU run
(``--cpu``) is never a PASS: its overall verdict is CPU-ONLY, or FAIL.
"""

from __future__ import annotations

import json as jsonlib
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bootstrap.api import ScratchSpec
from infra.catalog import Catalog, Gpu, gpu_by_nvml_name, load_catalog

PASS, WARN, FAIL, SKIP, NOT_RUN = "PASS", "WARN", "FAIL", "SKIP", "NOT-RUN"
CPU_ONLY = "CPU-ONLY"
_RANK = {PASS: 0, NOT_RUN: 0, SKIP: 1, WARN: 1, FAIL: 2}

NODE_SCHEMA = "gpufleet.verify/1"

# Xids that mean the hardware (or its firmware) is at fault, after NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors): double-bit ECC (48), micro-controller halt (62),
# row-remap / page-retirement failure (64), NVLink (74), fallen off the bus (79), high
# single-bit rate (92), contained / uncontained ECC (94, 95), GSP errors (119, 120).
# Others (13, 31, 43, ...) are usually application faults: a WARN, worth a look.
FATAL_XIDS = frozenset({48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# Throttle reasons that mean the GPU is slowed by something wrong with it or its cooling.
# A software power cap under a full GEMM is normal on power-limited cards: noted, not failed.
BAD_THROTTLE = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
)


class ReportError(ValueError):
    """The node's output is not a usable verify report."""


# ---------------------------------------------------------------------------------------------
# What a healthy node looks like


@dataclass(frozen=True)
class Expected:
    """The tier's promise plus the thresholds to hold the node to."""

    stack: str | None = None
    provider: str | None = None
    region: str | None = None
    tier: str | None = None
    gpu: Gpu | None = None  # the tier's first allowed GPU (None: unknown, judged by what is found)
    gpus_allowed: tuple[Gpu, ...] = ()
    gpu_count: int | None = None
    memory_gb: float | None = None
    nvlink: bool = False
    nvswitch: bool = False
    network_gbps: float | None = None
    scratch: ScratchSpec = field(default_factory=ScratchSpec)
    bucket: str | None = None
    thresholds: Mapping[str, float] = field(default_factory=dict)
    cpu: bool = False
    quick: bool = False
    nodes: int = 1

    def summary(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "provider": self.provider,
            "tier": self.tier,
            "gpu_model": self.gpu.key if self.gpu else None,
            "gpus_allowed": [g.key for g in self.gpus_allowed],
            "gpu_count": self.gpu_count,
            "memory_gb": self.memory_gb,
            "nvlink": self.nvlink,
            "nvswitch": self.nvswitch,
            "network_gbps": self.network_gbps,
            "scratch": asdict(self.scratch),
            "bucket": self.bucket,
            "thresholds": dict(self.thresholds),
            "cpu": self.cpu,
            "quick": self.quick,
            "nodes": self.nodes,
        }


def expected_from(
    outputs: Mapping[str, Any] | None,
    catalog: Catalog,
    *,
    tier: str | None = None,
    cpu: bool = False,
    quick: bool = False,
    nodes: int = 1,
    scratch: ScratchSpec | None = None,
) -> Expected:
    """Combine the stack outputs (may be None for plain ``-H`` runs) with the catalog.

    ``tier`` names a catalog tier and beats the outputs' tier (for ``-H`` runs). Raises
    ValueError naming the fix when the tier or GPU model is unknown to the catalog.
    """
    outputs = outputs or {}
    # A tier named on the command line replaces the stack's tier wholesale.
    raw_tier = {} if tier else dict(outputs.get("tier") or {})
    tier_name = tier or raw_tier.get("name")
    gpus_allowed: tuple[Gpu, ...] = ()
    gpu_count = raw_tier.get("gpu_count")
    nvlink = bool(raw_tier.get("nvlink", False))
    nvswitch = bool(raw_tier.get("nvswitch", False))
    provider = outputs.get("provider")
    itype = raw_tier.get("instance_type")
    if tier_name and tier_name in catalog.tiers:
        t = catalog.tiers[tier_name]
        gpus_allowed = tuple(catalog.gpus[g] for g in t.gpus_allowed)
        gpu_count = gpu_count or t.gpus
        nvlink = nvlink or t.nvlink
        offers = [
            catalog.instance(p, name)
            for p, profiles in t.offers.items()
            if provider in (None, p)
            for name in profiles.values()
        ]
        if "nvswitch" not in raw_tier:
            nvswitch = any(o.nvswitch for o in offers)
        if not itype and offers:
            itype, provider = offers[0].name, provider or offers[0].provider
    elif tier:
        known = ", ".join(sorted(catalog.tiers))
        raise ValueError(f"unknown tier {tier!r}; the catalog has: {known}")
    model = raw_tier.get("gpu_model")
    if model:
        if model not in catalog.gpus:
            raise ValueError(
                f"stack tier GPU {model!r} is not in the catalog (infra/catalog/gpus.toml)"
            )
        found = catalog.gpus[model]
        gpus_allowed = (found, *[g for g in gpus_allowed if g.key != found.key])
    network = None
    if provider and itype and (provider, itype) in catalog.instances:
        network = catalog.instances[(provider, itype)].network_gbps
    first = gpus_allowed[0] if gpus_allowed else None
    thresholds = dict(first.thresholds if first else catalog.default_thresholds)
    memory = float(raw_tier.get("gpu_memory_gb") or (first.memory_gb if first else 0))
    raw_scratch = outputs.get("scratch") or {}
    spec = scratch or ScratchSpec(
        path=raw_scratch.get("path", "/scratch"),
        kind=raw_scratch.get("kind", "nvme"),
        devices=raw_scratch.get("devices"),
        size_gb=raw_scratch.get("size_gb"),
    )
    return Expected(
        stack=outputs.get("stack"),
        provider=provider,
        region=outputs.get("region"),
        tier=tier_name,
        gpu=first,
        gpus_allowed=gpus_allowed,
        gpu_count=int(gpu_count) if gpu_count else None,
        memory_gb=memory or None,
        nvlink=nvlink,
        nvswitch=nvswitch,
        network_gbps=network,
        scratch=spec,
        bucket=outputs.get("bucket"),
        thresholds=thresholds,
        cpu=cpu,
        quick=quick,
        nodes=nodes,
    )


# ---------------------------------------------------------------------------------------------
# Checks and verdicts


@dataclass(frozen=True)
class Check:
    """One line of the verdict: what was measured, what was expected, and the call."""

    name: str
    status: str
    measured: str
    expected: str = ""
    detail: str = ""
    threshold: str | None = None  # the catalog threshold that decided a WARN/FAIL
    shortfall: float | None = None  # how far below that threshold, as a fraction of it
    value: float | None = None  # the measured number, for machines

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass(frozen=True)
class Verdict:
    """All checks of one host (or of the cluster) and the resulting status."""

    host: str
    mode: str
    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        worst = max((_RANK[c.status] for c in self.checks), default=0)
        if worst == 2:
            return FAIL
        if self.mode == "cpu":
            return CPU_ONLY
        return WARN if worst == 1 else PASS

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in {[c.name for c in self.checks]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "mode": self.mode,
            "status": self.status,
            "checks": [c.to_json() for c in self.checks],
        }


def overall(verdicts: Iterable[Verdict]) -> str:
    items = list(verdicts)
    if not items or any(v.status == FAIL for v in items):
        return FAIL
    if any(v.status == CPU_ONLY for v in items):
        return CPU_ONLY
    return WARN if any(v.status == WARN for v in items) else PASS


def grade(
    name: str,
    measured: float,
    expected: float,
    th: Mapping[str, float],
    *,
    unit: str,
    basis: str,
    detail: str = "",
) -> Check:
    """PASS at >= pass_ratio x expected, WARN at >= warn_ratio x expected, else FAIL.

    ``basis`` says where ``expected`` came from (e.g. "0.869 x 312 TF/s peak")."""
    pass_at, warn_at = th["pass_ratio"] * expected, th["warn_ratio"] * expected
    share = measured / expected if expected else 0.0
    text = f"{share:.0%} of expected {expected:,.1f} {unit} ({basis})"
    common = {
        "measured": f"{measured:,.1f} {unit}",
        "expected": f">= {pass_at:,.1f} {unit}",
        "value": measured,
    }
    if measured >= pass_at:
        return Check(name, PASS, detail=_join(text, detail), **common)  # type: ignore[arg-type]
    if measured >= warn_at:
        short = 1 - measured / pass_at
        why = f"{short:.0%} below the pass_ratio {th['pass_ratio']:g} threshold"
        return Check(
            name,
            WARN,
            detail=_join(text, why, detail),
            threshold="pass_ratio",
            shortfall=short,
            **common,  # type: ignore[arg-type]
        )
    short = 1 - measured / warn_at if warn_at else 1.0
    why = f"{short:.0%} below the warn_ratio {th['warn_ratio']:g} threshold ({warn_at:,.1f} {unit})"
    return Check(
        name,
        FAIL,
        detail=_join(text, why, detail),
        threshold="warn_ratio",
        shortfall=short,
        **common,  # type: ignore[arg-type]
    )


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _gpu_list(indices: Iterable[Any]) -> str:
    return ", ".join(f"GPU{i}" for i in indices)


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


def judge(m: Mapping[str, Any], exp: Expected, host: str = "") -> Verdict:
    """One node's measurements against the tier: every check, in a fixed order."""
    host = host or str((m.get("host") or {}).get("hostname") or "?")
    mode = "cpu" if exp.cpu else "gpu"
    if m.get("report_error"):
        return Verdict(host, mode, (Check("report", FAIL, "unusable", detail=m["report_error"]),))
    checks: list[Check] = []
    if m.get("fatal"):
        checks.append(Check("report", FAIL, "node script crashed", detail=str(m["fatal"])))
    if exp.cpu:
        checks += _cpu_checks(m, exp)
    else:
        checks += _gpu_checks(m, exp)
    checks += _storage_checks(m, exp)
    return Verdict(host, mode, tuple(checks))


def _cpu_checks(m: Mapping[str, Any], exp: Expected) -> list[Check]:
    tier = f"{exp.gpu_count or '?'}x {exp.gpu.key}" if exp.gpu else "no GPU tier"
    checks = [
        Check(
            "gpu",
            NOT_RUN,
            "CPU run (--cpu)",
            tier,
            detail="the GPU tier is NOT verified by a CPU run: inventory, health, GEMM, "
            "bandwidth and MFU are not measured",
        )
    ]
    torch_info = m.get("torch") or {}
    if torch_info.get("error") or not torch_info.get("torch"):
        checks.append(
            Check(
                "software",
                FAIL,
                "no usable torch",
                "torch in the node's Python",
                detail=f"{torch_info.get('error') or 'torch not found'}: run fab install-pytorch "
                "or pass --python",
            )
        )
    else:
        checks.append(Check("software", PASS, f"torch {torch_info['torch']}", "torch"))
    run = m.get("torchrun") or {}
    if exp.quick:
        checks.append(Check("train", NOT_RUN, "--quick", detail="training step skipped"))
        return checks
    checks += _run_checks(run, exp, "", gpu=None)
    # Scratch and the bucket do not need a GPU: a CPU run judges them like a GPU run.
    checks += _scratch_checks(m, exp, exp.thresholds)
    return checks


def _gpu_checks(m: Mapping[str, Any], exp: Expected) -> list[Check]:
    nv = m.get("nvidia") or {}
    torch_info = m.get("torch") or {}
    if not nv.get("available"):
        pci = (nv.get("pci") or {}).get("gpus")
        seen = f"; lspci shows {pci} NVIDIA GPU(s)" if pci else ""
        return [
            Check(
                "gpu.present",
                FAIL,
                "no NVIDIA GPU",
                f"{exp.gpu_count or 'some'}x {exp.gpu.key if exp.gpu else 'NVIDIA GPU'}",
                detail=f"{nv.get('error') or 'nvidia-smi lists no GPU'}{seen}. "
                "Install the driver (fab install-driver), or verify the CPU training path "
                "only with --cpu",
            )
        ]
    gpus: list[dict[str, Any]] = nv.get("gpus") or []
    # The GPU the performance numbers are judged by: the tier's, else the one found.
    gpu = exp.gpu or gpu_by_nvml_name(load_catalog(), str(gpus[0].get("name") or ""))
    th = dict(gpu.thresholds) if gpu and not exp.gpu else dict(exp.thresholds)
    checks = _inventory(nv, torch_info, exp)
    checks += _health(m, nv, exp, th)
    checks += _topology(m, nv, exp, th)
    run = m.get("torchrun") or {}
    if m.get("skipped"):
        checks.append(Check("benchmarks", FAIL, "not run", detail=str(m["skipped"])))
        return checks
    checks += _gemm_hbm(run, exp, gpu, th)
    checks += _run_checks(run, exp, "", gpu=gpu, th=th)
    checks += _scratch_checks(m, exp, th)
    return checks


def _inventory(nv: Mapping[str, Any], torch_info: Mapping[str, Any], exp: Expected) -> list[Check]:
    gpus: list[dict[str, Any]] = nv.get("gpus") or []
    checks: list[Check] = []
    found = len(gpus)
    pci = (nv.get("pci") or {}).get("gpus")
    extra = []
    # Fewer on the bus than the driver lists means lspci cannot see the bus (a container).
    if pci is not None and pci > found:
        extra.append(f"lspci shows {pci} NVIDIA GPU(s), the driver {found}")
    if nv.get("smi_stderr"):
        extra.append(f"nvidia-smi: {nv['smi_stderr']}")
    if exp.gpu_count is None:
        checks.append(
            Check(
                "gpu.count",
                WARN,
                str(found),
                "?",
                detail=_join(
                    "no tier to compare with: pass --stack, --inventory or --tier", *extra
                ),
            )
        )
    elif found != exp.gpu_count:
        checks.append(
            Check(
                "gpu.count",
                FAIL,
                f"{found} of {exp.gpu_count}",
                str(exp.gpu_count),
                detail=_join(
                    f"{exp.gpu_count - found:+d} GPU(s) missing"
                    if found < exp.gpu_count
                    else f"{found - exp.gpu_count} more GPU(s) than the tier",
                    *extra,
                ),
                threshold="gpu_count",
                value=found,
            )
        )
    else:
        checks.append(
            Check(
                "gpu.count", PASS, str(found), str(exp.gpu_count), detail=_join(*extra), value=found
            )
        )

    names = sorted({str(g.get("name")) for g in gpus})
    catalog = load_catalog()
    allowed = {n.lower() for g in exp.gpus_allowed for n in g.nvml_names}
    if not exp.gpus_allowed:
        known = [gpu_by_nvml_name(catalog, n) for n in names]
        checks.append(
            Check(
                "gpu.model",
                WARN,
                ", ".join(names),
                "?",
                detail=_join(
                    "no tier to compare with",
                    "" if all(known) else "not in the catalog: thresholds are the defaults",
                ),
            )
        )
    else:
        wrong = [n for n in names if n.lower() not in allowed]
        want = " / ".join(g.key for g in exp.gpus_allowed)
        checks.append(
            Check(
                "gpu.model",
                FAIL if wrong else PASS,
                ", ".join(names),
                want,
                detail=f"not the tier's GPU: {', '.join(wrong)}" if wrong else "",
            )
        )

    mems = [float(g["memory_total_mib"]) for g in gpus if g.get("memory_total_mib")]
    if mems and exp.memory_gb:
        low = min(mems) / 1024  # nvidia-smi MiB -> GiB, the unit datasheets round to "GB"
        floor = exp.thresholds.get("min_memory_fraction", 0.9) * exp.memory_gb
        short = [g["index"] for g in gpus if (g.get("memory_total_mib") or 0) / 1024 < floor]
        checks.append(
            Check(
                "gpu.memory",
                FAIL if short else PASS,
                f"{low:.1f} GiB",
                f">= {floor:.1f} GiB",
                detail=f"{_gpu_list(short)} below min_memory_fraction x {exp.memory_gb:g} GB"
                if short
                else "",
                threshold="min_memory_fraction" if short else None,
                value=low,
            )
        )

    driver, cuda = nv.get("driver_version"), nv.get("cuda_version")
    tcuda = torch_info.get("torch_cuda")
    measured = f"driver {driver or '?'}, CUDA {cuda or '?'}, torch {torch_info.get('torch', '?')}"
    if torch_info.get("nccl"):
        measured += f", NCCL {torch_info['nccl']}"
    if torch_info.get("error") or not torch_info.get("torch"):
        checks.append(
            Check(
                "software",
                FAIL,
                measured,
                "torch with CUDA",
                detail=str(torch_info.get("error") or "torch not found"),
            )
        )
    elif not tcuda:
        checks.append(
            Check(
                "software",
                FAIL,
                measured,
                "a CUDA build of torch",
                detail="the node's torch is a CPU-only build: reinstall with fab install-pytorch",
            )
        )
    elif not torch_info.get("cuda_available"):
        checks.append(
            Check(
                "software",
                FAIL,
                measured,
                f"CUDA >= {tcuda} driver",
                detail=f"torch (CUDA {tcuda}) cannot use the GPUs: driver too old "
                "for this torch build, or a broken CUDA install",
            )
        )
    elif int(torch_info.get("device_count") or 0) != len(gpus):
        checks.append(
            Check(
                "software",
                FAIL,
                measured,
                f"{len(gpus)} devices in torch",
                detail=f"torch sees {torch_info.get('device_count')} of {len(gpus)} "
                "GPUs (CUDA_VISIBLE_DEVICES set? a GPU in a bad state?)",
            )
        )
    elif cuda and _version(tcuda)[0] > _version(cuda)[0]:
        checks.append(
            Check(
                "software",
                FAIL,
                measured,
                f"driver CUDA >= {tcuda}",
                detail="torch's CUDA major version is newer than the driver's",
            )
        )
    elif cuda and _version(tcuda) > _version(cuda):
        checks.append(
            Check(
                "software",
                PASS,
                measured,
                f"driver CUDA {_version(tcuda)[0]}.x",
                # PyTorch wheels carry their own CUDA runtime and SASS for every supported
                # GPU, so a newer minor version runs on an older driver of the same major.
                detail=f"torch's CUDA {tcuda} runs on the driver's {cuda} through CUDA "
                "minor-version compatibility",
            )
        )
    else:
        checks.append(Check("software", PASS, measured, f"torch CUDA {tcuda} <= driver CUDA"))

    mig_on = [g["index"] for g in gpus if g.get("mig_current")]
    mig_pending = [g["index"] for g in gpus if g.get("mig_pending") and not g.get("mig_current")]
    if mig_on:
        checks.append(
            Check(
                "mig",
                FAIL,
                f"MIG on: {_gpu_list(mig_on)}",
                "MIG off",
                detail="the tier expects whole GPUs: `nvidia-smi -mig 0` then reset "
                "the GPUs (or reboot)",
            )
        )
    elif mig_pending:
        checks.append(
            Check(
                "mig",
                WARN,
                f"MIG pending on {_gpu_list(mig_pending)}",
                "MIG off",
                detail="MIG turns on at the next GPU reset",
            )
        )
    else:
        checks.append(Check("mig", PASS, "off", "off"))
    return checks


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in str(text).split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _health(
    m: Mapping[str, Any], nv: Mapping[str, Any], exp: Expected, th: Mapping[str, float]
) -> list[Check]:
    gpus: list[dict[str, Any]] = nv.get("gpus") or []
    checks: list[Check] = []

    vol = {g["index"]: (g.get("ecc_volatile") or {}).get("uncorrected") or 0 for g in gpus}
    agg = {g["index"]: (g.get("ecc_aggregate") or {}).get("uncorrected") or 0 for g in gpus}
    corr = sum((g.get("ecc_volatile") or {}).get("corrected") or 0 for g in gpus)
    ecc_off = [g["index"] for g in gpus if g.get("ecc_mode") is False]
    bad = {i: n for i, n in vol.items() if n}
    if bad:
        listing = ", ".join(f"GPU{i}: {n}" for i, n in bad.items())
        checks.append(
            Check(
                "ecc",
                FAIL,
                f"{sum(bad.values())} uncorrectable (volatile)",
                "0",
                detail=f"{listing}; drain the node and reset the GPU or replace it",
                threshold="uncorrectable ECC",
                value=float(sum(bad.values())),
            )
        )
    elif any(agg.values()) or ecc_off:
        parts = []
        if any(agg.values()):
            parts.append(
                f"{sum(agg.values())} uncorrectable in the GPUs' lifetime (aggregate) on "
                f"{_gpu_list(i for i, n in agg.items() if n)}"
            )
        if ecc_off:
            parts.append(f"ECC disabled on {_gpu_list(ecc_off)}")
        checks.append(
            Check("ecc", WARN, "0 uncorrectable since boot", "0", detail="; ".join(parts))
        )
    else:
        checks.append(Check("ecc", PASS, f"0 uncorrectable, {corr} corrected", "0 uncorrectable"))

    pend, warn = [], []
    for g in gpus:
        rows, pages = g.get("remapped_rows") or {}, g.get("retired_pages") or {}
        i = g["index"]
        if rows.get("failure"):
            pend.append(f"GPU{i}: row remapping failed")
        elif rows.get("pending"):
            pend.append(f"GPU{i}: row remap pending (reset the GPU)")
        if pages.get("pending"):
            pend.append(f"GPU{i}: page retirement pending (reset the GPU)")
        retired = (pages.get("single_bit") or 0) + (pages.get("double_bit") or 0)
        if retired:
            warn.append(f"GPU{i}: {retired} retired page(s)")
        if rows.get("uncorrectable"):
            warn.append(f"GPU{i}: {rows['uncorrectable']} row(s) remapped for uncorrectable errors")
    if pend:
        checks.append(
            Check("memory.remap", FAIL, "pending", "none pending", detail="; ".join(pend + warn))
        )
    elif warn:
        checks.append(
            Check("memory.remap", WARN, "remapped/retired", "none", detail="; ".join(warn))
        )
    else:
        checks.append(Check("memory.remap", PASS, "none", "none"))

    load = {g["index"]: g for g in ((m.get("load") or {}).get("gpus") or [])}
    reasons: dict[int, set[str]] = {}
    for g in gpus:
        seen = set(g.get("throttle_reasons") or []) | set(
            (load.get(g["index"]) or {}).get("throttle_reasons") or []
        )
        reasons[g["index"]] = seen
    bad_t = {i: sorted(r & set(BAD_THROTTLE)) for i, r in reasons.items() if r & set(BAD_THROTTLE)}
    capped = [i for i, r in reasons.items() if "sw_power_cap" in r]
    note = f"power cap reached on {_gpu_list(capped)} (normal under full load)" if capped else ""
    if bad_t:
        listing = "; ".join(f"GPU{i}: {', '.join(r)}" for i, r in bad_t.items())
        checks.append(
            Check(
                "throttle",
                FAIL,
                listing,
                "no thermal/HW slowdown",
                detail=_join(
                    "clocks were cut by the hardware: check cooling, power and the GPU", note
                ),
            )
        )
    else:
        checks.append(Check("throttle", PASS, "none", "no thermal/HW slowdown", detail=note))

    temps = [
        t
        for t in ((load.get(g["index"]) or {}).get("temperature_max_c") for g in gpus)
        if t is not None
    ]
    temps += [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
    if temps:
        hottest, limit = max(temps), th.get("max_temperature_c", 87.0)
        status = WARN if hottest > limit else PASS
        checks.append(
            Check(
                "temperature",
                status,
                f"{hottest:.0f} C",
                f"<= {limit:.0f} C",
                threshold="max_temperature_c" if status != PASS else None,
                value=hottest,
                detail="hot under load: check airflow before long runs" if status != PASS else "",
            )
        )

    off = [g["index"] for g in gpus if g.get("persistence_mode") is False]
    checks.append(
        Check(
            "persistence",
            WARN if off else PASS,
            f"off on {_gpu_list(off)}" if off else "on",
            "on",
            detail="`nvidia-smi -pm 1` (or nvidia-persistenced) avoids driver "
            "re-initialisation on every process start"
            if off
            else "",
        )
    )

    xid = m.get("xid") or {}
    events = xid.get("events") or []
    if not xid.get("source"):
        checks.append(
            Check(
                "xid",
                SKIP,
                "kernel log unreadable",
                "no Xid errors",
                detail=f"{xid.get('error') or 'no kernel log'}; run as root or allow sudo dmesg",
            )
        )
    else:
        fatal = sorted({e["xid"] for e in events if e["xid"] in FATAL_XIDS})
        other = sorted({e["xid"] for e in events if e["xid"] not in FATAL_XIDS})
        where = sorted({e.get("pci", "?") for e in events})
        if fatal:
            checks.append(
                Check(
                    "xid",
                    FAIL,
                    f"Xid {', '.join(map(str, fatal))}",
                    "none",
                    detail=f"hardware-class Xid since boot on PCI {', '.join(where)}: "
                    f"{events[-1]['line'][:160]}",
                )
            )
        elif other:
            checks.append(
                Check(
                    "xid",
                    WARN,
                    f"Xid {', '.join(map(str, other))}",
                    "none",
                    detail="application-class Xid since boot (often a crashed job)",
                )
            )
        else:
            checks.append(Check("xid", PASS, "none", "none", detail=f"read with {xid['source']}"))

    fm = m.get("fabric_manager") or {}
    nvswitch_seen = (nv.get("nvswitch_devices") or 0) + (
        (nv.get("pci") or {}).get("nvswitches") or 0
    )
    if exp.nvswitch or nvswitch_seen:
        state = fm.get("state") or "unknown"
        checks.append(
            Check(
                "fabric-manager",
                PASS if state == "active" else FAIL,
                state,
                "active",
                detail=""
                if state == "active"
                else "NVSwitch systems need "
                "nvidia-fabricmanager running (same version as the driver), or CUDA "
                "finds no peer links",
            )
        )
    else:
        checks.append(
            Check("fabric-manager", NOT_RUN, "no NVSwitch", "-", detail="not an NVSwitch tier")
        )
    return checks


def _topology(
    m: Mapping[str, Any], nv: Mapping[str, Any], exp: Expected, th: Mapping[str, float]
) -> list[Check]:
    gpus: list[dict[str, Any]] = nv.get("gpus") or []
    checks: list[Check] = []
    if exp.nvlink:
        problems = []
        topo = nv.get("topology") or {}
        for row, cols in sorted((topo.get("links") or {}).items()):
            not_nv = [c for c, v in cols.items() if not str(v).startswith("NV")]
            if not_nv:
                problems.append(
                    f"{row} reaches {', '.join(not_nv)} without NVLink ({cols[not_nv[0]]})"
                )
        status = nv.get("nvlink")
        active_total = 0
        if status is None:
            problems.append("nvidia-smi nvlink --status failed")
        else:
            counts = []
            for g in status:
                down = [str(link["link"]) for link in g["links"] if link["gbs"] is None]
                counts.append(len(g["links"]) - len(down))
                active_total += len(g["links"]) - len(down)
                if down:
                    problems.append(f"GPU{g['index']} link(s) {', '.join(down)} inactive")
                elif not g["links"]:
                    problems.append(f"GPU{g['index']} reports no NVLink links")
        if not topo.get("links") and len(gpus) > 1:
            problems.append("nvidia-smi topo -m printed no GPU matrix")
        checks.append(
            Check(
                "nvlink",
                FAIL if problems else PASS,
                f"{active_total} links active" if not problems else "degraded",
                "all links active, NVLink between every GPU pair",
                detail="; ".join(problems[:6])
                + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""),
            )
        )
    else:
        checks.append(Check("nvlink", NOT_RUN, "-", "-", detail="the tier has no NVLink"))

    load = {g["index"]: g for g in ((m.get("load") or {}).get("gpus") or [])}
    min_gen, min_width = th.get("min_pcie_gen", 3), th.get("min_pcie_width", 16)
    fails: list[str] = []
    warns: list[str] = []
    shown: list[tuple[float, float]] = []
    for g in gpus:
        pcie = g.get("pcie") or {}
        busy = load.get(g["index"]) or {}
        under_load = bool(busy.get("busy_samples"))
        gen = busy.get("pcie_gen_busy_max") if under_load else pcie.get("gen_current")
        width = busy.get("pcie_width_busy_max") if under_load else pcie.get("width_current")
        gmax = busy.get("pcie_gen_max") or pcie.get("gen_max")
        wmax = busy.get("pcie_width_max") or pcie.get("width_max")
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
    if shown:
        gen, width = min(shown)
        how = "under load" if load else "at idle (no load samples)"
        status = FAIL if fails else (WARN if warns else PASS)
        checks.append(
            Check(
                "pcie",
                status,
                f"gen{gen:g} x{width:g} ({how})",
                f">= gen{min_gen:g} x{min_width:g}, at the link maximum",
                detail="; ".join((fails + warns)[:6]),
                threshold="min_pcie_width/min_pcie_gen" if fails else None,
            )
        )
    else:
        checks.append(
            Check(
                "pcie",
                SKIP,
                "not reported",
                f">= gen{min_gen:g} x{min_width:g}",
                detail="nvidia-smi printed no PCIe link state (a VM without it?)",
            )
        )
    return checks


def _gemm_hbm(
    run: Mapping[str, Any], exp: Expected, gpu: Gpu | None, th: Mapping[str, float]
) -> list[Check]:
    checks: list[Check] = []
    gemm = run.get("gemm") or []
    if gpu is None:
        checks.append(
            Check(
                "gemm",
                SKIP,
                "no reference",
                "-",
                detail="the GPU model is not in the catalog, so there is no peak to compare with",
            )
        )
    elif not gemm:
        checks.append(Check("gemm", FAIL, "not measured", "-", detail=_run_error(run)))
    else:
        expected = gpu.expected_gemm_tflops
        worst = min(gemm, key=lambda r: r["tflops"])
        slow = [
            f"GPU{r['local_rank']} {r['tflops']:.0f}"
            for r in gemm
            if r["tflops"] < th["pass_ratio"] * expected
        ]
        c = grade(
            "gemm",
            worst["tflops"],
            expected,
            th,
            unit="TF/s",
            basis=f"expected_gemm_fraction {th['expected_gemm_fraction']:g} x "
            f"{gpu.peak_tflops:g} {worst['dtype']} peak",
            detail=f"slow: {', '.join(slow)}"
            if slow
            else f"min of {len(gemm)} GPU(s), {worst['n']}^3 {worst['dtype']}",
        )
        if not all(r.get("finite", True) for r in gemm):
            c = replace(c, status=FAIL, detail=_join("GEMM produced non-finite values", c.detail))
        checks.append(c)
    if exp.quick:
        checks.append(Check("hbm", NOT_RUN, "--quick", "-"))
        return checks
    hbm = run.get("hbm") or []
    if gpu is None:
        checks.append(Check("hbm", SKIP, "no reference", "-"))
    elif not hbm:
        checks.append(Check("hbm", FAIL, "not measured", "-", detail=_run_error(run)))
    else:
        worst = min(hbm, key=lambda r: r["gbs"])
        frac = th["expected_hbm_fraction"]
        checks.append(
            grade(
                "hbm",
                worst["gbs"],
                gpu.bandwidth_gbs * frac,
                th,
                unit="GB/s",
                basis=f"expected_hbm_fraction {frac:g} x {gpu.bandwidth_gbs:g} GB/s",
                detail=f"device copy of {worst['bytes'] / 2**30:.1f} GiB, min of {len(hbm)}",
            )
        )
    return checks


def _run_error(run: Mapping[str, Any]) -> str:
    errors = run.get("errors") or []
    if errors:
        return str(errors[0])[:300]
    return "torchrun did not run" if not run else f"torchrun exited {run.get('rc')}"


def _run_checks(
    run: Mapping[str, Any],
    exp: Expected,
    suffix: str,
    *,
    gpu: Gpu | None,
    th: Mapping[str, float] | None = None,
) -> list[Check]:
    """All-reduce and training checks, for a node's local run (suffix "") or the cluster's."""
    th = th or exp.thresholds
    cpu = gpu is None or exp.cpu
    checks: list[Check] = []
    name_ar = "allreduce" + (suffix or ".local")
    if exp.quick:
        return [
            Check(name_ar, NOT_RUN, "--quick", "-"),
            Check("train" + suffix, NOT_RUN, "--quick", "-"),
        ]
    ar = run.get("allreduce")
    nproc = int(run.get("nproc") or 0) * int(run.get("nnodes") or 1)
    if ar is None:
        if nproc == 1:
            checks.append(Check(name_ar, NOT_RUN, "1 process", "-", detail="nothing to all-reduce"))
        else:
            checks.append(Check(name_ar, FAIL, "not measured", "-", detail=_run_error(run)))
    elif not ar.get("correct"):
        checks.append(
            Check(
                name_ar,
                FAIL,
                "wrong sum",
                "exact sum",
                detail="all-reduce returned a wrong result: a broken NCCL/gloo setup",
            )
        )
    elif cpu:
        checks.append(
            Check(
                name_ar,
                PASS,
                f"correct, {ar['busbw_gbs']:.2f} GB/s bus",
                "correct sum",
                detail=f"{ar['world']} {run.get('backend', 'gloo')} ranks; "
                "CPU run: correctness only",
                value=ar["busbw_gbs"],
            )
        )
    else:
        if suffix:
            basis_gbs = (exp.network_gbps or 0) / 8
            frac = th.get("internode_busbw_fraction", 0.5)
            basis = f"internode_busbw_fraction {frac:g} x {exp.network_gbps or 0:g} Gbit/s network"
        else:
            basis_gbs = gpu.interconnect_gbs if gpu else 0
            frac = th.get("nccl_busbw_fraction", 0.7)
            basis = f"nccl_busbw_fraction {frac:g} x {basis_gbs:g} GB/s interconnect"
        if basis_gbs:
            checks.append(
                grade(
                    name_ar,
                    ar["busbw_gbs"],
                    basis_gbs * frac,
                    th,
                    unit="GB/s",
                    basis=basis,
                    detail=f"{ar['world']} ranks, {ar['bytes'] / 2**20:.0f} MiB messages",
                )
            )
        else:
            checks.append(
                Check(
                    name_ar,
                    SKIP,
                    f"{ar['busbw_gbs']:.1f} GB/s",
                    "-",
                    detail="no network bandwidth in the catalog for this instance type",
                )
            )

    train = run.get("train")
    name_tr = "train" + suffix
    if not train:
        checks.append(Check(name_tr, FAIL, "did not run", "loss falls", detail=_run_error(run)))
        return checks
    losses = [float(x) for x in train.get("losses") or []]
    drop_min = th.get("loss_drop_min", 0.2)
    where = f"{train['world']} {train['backend']} ranks, {train['amp']}, checkpointing " + (
        "on" if train.get("checkpointing") else "OFF"
    )
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if not losses:
        checks.append(Check(name_tr, FAIL, "no loss curve", "loss falls"))
    elif bad is not None:
        checks.append(
            Check(
                name_tr,
                FAIL,
                f"loss {losses[bad]} at step {bad}",
                "finite loss",
                detail=_join("the training step diverged", where),
            )
        )
    else:
        first, last = losses[0], statistics.fmean(losses[-5:])
        drop = 1 - last / first if first > 0 else 0.0
        measured = f"loss {first:.2f} -> {last:.2f} ({drop:.0%} lower)"
        expected = f">= {drop_min:.0%} lower in {len(losses)} steps"
        if drop >= drop_min:
            checks.append(Check(name_tr, PASS, measured, expected, detail=where, value=drop))
        else:
            short = 1 - drop / drop_min if drop_min else 1.0
            checks.append(
                Check(
                    name_tr,
                    FAIL,
                    measured,
                    expected,
                    detail=_join(
                        f"the loss did not fall enough: {short:.0%} short of "
                        "the loss_drop_min threshold",
                        where,
                    ),
                    threshold="loss_drop_min",
                    shortfall=short,
                    value=drop,
                )
            )

    tps = train.get("tokens_per_s")
    name_mfu = "mfu" + suffix
    if cpu or not tps or gpu is None:
        checks.append(
            Check(
                name_mfu,
                NOT_RUN,
                f"{tps or 0:,.0f} tokens/s",
                "-",
                detail="CPU run: throughput reported, not judged"
                if cpu
                else "no GPU reference peak",
            )
        )
        return checks
    achieved = tps * train["flops_per_token"]
    mfu = achieved / (train["world"] * gpu.peak_tflops * 1e12)
    want = th.get("expected_mfu", 0.2)
    floor = th.get("min_mfu", 0.05)
    measured = f"{mfu:.1%} ({tps:,.0f} tokens/s)"
    detail = (
        f"{achieved / 1e12 / train['world']:.0f} TF/s per GPU of {gpu.peak_tflops:g} peak; "
        f"model FLOPs 6N + attention, recompute not counted"
    )
    if mfu >= th["pass_ratio"] * want:
        checks.append(
            Check(
                name_mfu,
                PASS,
                measured,
                f">= {th['pass_ratio'] * want:.1%}",
                detail=detail,
                value=mfu,
            )
        )
    elif mfu >= floor:
        short = 1 - mfu / (th["pass_ratio"] * want)
        checks.append(
            Check(
                name_mfu,
                WARN,
                measured,
                f">= {th['pass_ratio'] * want:.1%}",
                detail=_join(f"{short:.0%} below pass_ratio x expected_mfu {want:g}", detail),
                threshold="expected_mfu",
                shortfall=short,
                value=mfu,
            )
        )
    else:
        short = 1 - mfu / floor
        checks.append(
            Check(
                name_mfu,
                FAIL,
                measured,
                f">= {floor:.1%}",
                detail=_join(f"{short:.0%} below the min_mfu floor {floor:g}", detail),
                threshold="min_mfu",
                shortfall=short,
                value=mfu,
            )
        )
    return checks


def _scratch_checks(m: Mapping[str, Any], exp: Expected, th: Mapping[str, float]) -> list[Check]:
    if exp.quick:
        return [Check("scratch", NOT_RUN, "--quick", "-")]
    s = m.get("scratch")
    if not s:
        return [Check("scratch", FAIL, "not measured", "-")]
    if s.get("error"):
        return [Check("scratch", FAIL, "unusable", exp.scratch.path, detail=str(s["error"]))]
    devices = exp.scratch.devices or 1
    if exp.scratch.kind == "nvme":
        per = th.get("scratch_nvme_gbs_per_device", 2.0)
        read_exp, basis = (
            per * devices,
            f"scratch_nvme_gbs_per_device {per:g} x {devices} device(s)",
        )
    else:
        read_exp = th.get("scratch_disk_gbs", 0.25)
        basis = f"scratch_disk_gbs {read_exp:g}"
    write_frac = th.get("scratch_write_fraction", 0.5)
    how = f"{s['bytes'] / 2**20:.0f} MiB, {'O_DIRECT' if s.get('direct') else 'buffered + fsync'}"
    notes = [how]
    if s.get("is_mount") is False:
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
    if s.get("is_mount") is False:
        read = replace(read, status=FAIL if read.status == FAIL else WARN)
    return [read, write]


def _storage_checks(m: Mapping[str, Any], exp: Expected) -> list[Check]:
    st = m.get("storage")
    if st is None:
        return []
    status = st.get("status")
    bucket = st.get("bucket") or exp.bucket
    if status == "ok":
        timing = ", ".join(
            f"{k[:-2]} {st[k] * 1000:.0f} ms" for k in ("put_s", "get_s", "delete_s") if k in st
        )
        return [
            Check(
                "storage",
                PASS,
                f"put/get/delete ok ({st.get('tool')})",
                f"put/get/delete in {bucket}",
                detail=timing,
            )
        ]
    if status == "skip":
        if not bucket:
            return [Check("storage", NOT_RUN, "no bucket", "-", detail=str(st.get("reason", "")))]
        return [
            Check(
                "storage",
                SKIP,
                "not probed",
                f"put/get/delete in {bucket}",
                detail=str(st.get("reason", "")),
            )
        ]
    return [
        Check(
            "storage",
            FAIL,
            "error",
            f"put/get/delete in {bucket}",
            detail=str(st.get("reason", ""))[:300],
        )
    ]


def judge_cluster(per_host: Mapping[str, Mapping[str, Any]], exp: Expected) -> Verdict:
    """The cross-node run (one report per host, the same collective from each side)."""
    mode = "cpu" if exp.cpu else "gpu"
    problems = []
    for host, m in per_host.items():
        if m.get("report_error") or m.get("fatal") or m.get("skipped"):
            problems.append(
                f"{host}: {m.get('report_error') or m.get('fatal') or m.get('skipped')}"
            )
        elif (m.get("torchrun") or {}).get("errors"):
            problems.append(f"{host}: {(m['torchrun']['errors'] or [''])[0]}")
    runs = [m.get("torchrun") or {} for m in per_host.values()]
    head = next((r for r in runs if r.get("train")), runs[0] if runs else {})
    if problems and not head.get("train"):
        return Verdict(
            "cluster",
            mode,
            (
                Check(
                    "allreduce.cross", FAIL, "not measured", "-", detail="; ".join(problems)[:400]
                ),
                Check(
                    "train.cross",
                    FAIL,
                    "did not run",
                    "loss falls",
                    detail="; ".join(problems)[:400],
                ),
            ),
        )
    nv = exp.gpu
    checks = _run_checks(head, exp, ".cross", gpu=None if exp.cpu else nv, th=exp.thresholds)
    if problems:
        checks.append(
            Check("cross.nodes", FAIL, "errors", "clean run", detail="; ".join(problems)[:400])
        )
    return Verdict("cluster", mode, tuple(checks))


def cluster_not_run(reason: str, exp: Expected) -> Verdict:
    return Verdict(
        "cluster",
        "cpu" if exp.cpu else "gpu",
        (Check("cross-node", FAIL, "not run", f"{exp.nodes} nodes", detail=reason),),
    )
