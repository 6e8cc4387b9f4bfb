"""A node's health verdict: healthy, degraded (it may train; fix it at the next chance) or
failed (keep work off it until the action is done), each reason with its GPU, its action and
the source that classes it, and when it was taken.

The findings come from the node (gpufleet_node/verify_health.py ``snapshot``); the
classes and thresholds are catalog data (infra/catalog/health.toml), never constants here.
:func:`from_verify` turns a verify-gpu :class:`~bootstrap.verify.verdict.Verdict` into the
same verdict, so verify-gpu and the health checks write one kind of record.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import infra.catalog
from bootstrap.verify.verdict import FAIL, WARN, Verdict
from gpufleet_node.verify_health import SCHEMA, port_from_sysfs

HEALTHY, DEGRADED, FAILED, NOTE = "healthy", "degraded", "failed", "note"
NO_GPU = "no NVIDIA GPU on this node (no nvidia-smi, none on the PCI bus): GPU checks not run"
_RANK = {NOTE: 0, HEALTHY: 0, DEGRADED: 1, FAILED: 2}
CATALOG_FILE = Path(infra.catalog.__file__).resolve().parent / "health.toml"


@dataclass(frozen=True)
class Reason:
    """One finding: which check, how bad, on which GPU (None: the node), what to do."""

    check: str
    level: str  # failed | degraded | note
    text: str
    action: str = ""
    gpu: int | None = None
    source: str = ""  # the DCGM error or Xid bucket that classes it

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass(frozen=True)
class HealthVerdict:
    host: str
    taken_at: str
    reasons: tuple[Reason, ...] = ()
    checked: tuple[str, ...] = ()  # the checks that had something to read
    origin: str = "health"  # health | verify-gpu

    @property
    def status(self) -> str:
        worst = max((_RANK[r.level] for r in self.reasons), default=0)
        return {0: HEALTHY, 1: DEGRADED, 2: FAILED}[worst]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "gpufleet.verdict/1",
            "host": self.host,
            "status": self.status,
            "taken_at": self.taken_at,
            "origin": self.origin,
            "checked": list(self.checked),
            "reasons": [r.to_json() for r in self.reasons],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HealthVerdict:
        """A stored verdict; ValueError (one line) when it is not one."""
        if data.get("schema") != "gpufleet.verdict/1":
            raise ValueError(f"not a gpufleet verdict (schema {data.get('schema')!r})")
        fields = ("check", "level", "text", "action", "gpu", "source")
        reasons = tuple(
            Reason(**{k: r[k] for k in fields if k in r}) for r in data.get("reasons") or []
        )
        if any(r.level not in _RANK for r in reasons):
            raise ValueError("a stored verdict reason has an unknown level")
        return cls(
            host=str(data.get("host") or "?"),
            taken_at=str(data.get("taken_at") or ""),
            reasons=reasons,
            checked=tuple(data.get("checked") or ()),
            origin=str(data.get("origin") or "health"),
        )


@cache
def load_health_catalog(path: Path = CATALOG_FILE) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def xids_of_class(level: str, catalog: Mapping[str, Any] | None = None) -> frozenset[int]:
    """The Xids whose catalog bucket classes a node ``level`` (failed, degraded, note)."""
    xids = (catalog or load_health_catalog())["xid"]
    return frozenset(
        code
        for bucket, codes in xids["codes"].items()
        if xids["buckets"][bucket]["class"] == level
        for code in codes
    )


@dataclass(frozen=True)
class Context:
    """What the checks read: the node's findings, the catalog and the tier's promise."""

    doc: Mapping[str, Any]
    catalog: Mapping[str, Any]
    nvlink_expected: bool = False
    infiniband_gbps_per_port: float | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_count: int | None = None  # the tier's
    nvswitch: bool = False  # the tier's

    @property
    def th(self) -> Mapping[str, Any]:
        return self.catalog["thresholds"]

    def finding(self, key: str, text: str, gpu: int | None = None, **more: str) -> Reason:
        f = self.catalog["findings"][key]
        check = _CHECK_OF[key.split("_")[0]]
        return Reason(check, f["class"], text, more.get("action") or f["action"], gpu, f["dcgm"])


# A finding's key starts with the check it belongs to.
_CHECK_OF = {
    "ecc": "ecc",
    "retired": "retired-pages",
    "row": "row-remap",
    "nvlink": "nvlink",
    "pcie": "pcie",
    "throttle": "throttle",
    "temperature": "temperature",
    "ib": "infiniband",
    "gpu": "gpu-count",
    "fabric": "fabric-manager",
}

Check = Callable[[Context], list[Reason] | None]  # None: nothing to read


def _ecc(c: Context) -> list[Reason] | None:
    if not c.gpus:
        return None
    out = []
    for g in c.gpus:
        n = (g.get("ecc_volatile") or {}).get("uncorrected") or 0
        if n > c.th["ecc_volatile_uncorrectable_max"]:
            out.append(
                c.finding(
                    "ecc_volatile_uncorrectable",
                    f"{n} volatile uncorrectable ECC error(s)",
                    g["index"],
                )
            )
        agg = (g.get("ecc_aggregate") or {}).get("uncorrected") or 0
        if agg and not n:
            out.append(
                Reason(
                    "ecc", NOTE, f"{agg} uncorrectable ECC error(s) in its lifetime", gpu=g["index"]
                )
            )
    return out


def _retired(c: Context) -> list[Reason] | None:
    if not c.gpus:
        return None
    out = []
    for g in c.gpus:
        pages = g.get("retired_pages") or {}
        count = (pages.get("single_bit") or 0) + (pages.get("double_bit") or 0)
        if count >= c.th["retired_pages_failed"]:
            out.append(c.finding("retired_pages_limit", f"{count} retired pages", g["index"]))
        elif count >= c.th["retired_pages_degraded"]:
            out.append(c.finding("retired_pages_soft", f"{count} retired pages", g["index"]))
        if pages.get("pending"):
            out.append(c.finding("retired_pages_pending", "page retirement pending", g["index"]))
    return out


def _row_remap(c: Context) -> list[Reason] | None:
    if not c.gpus:
        return None
    out = []
    for g in c.gpus:
        rows, i = g.get("remapped_rows") or {}, g["index"]
        unc = rows.get("uncorrectable") or 0
        if rows.get("failure"):
            out.append(c.finding("row_remap_failure", "row remapping failed", i))
        elif unc >= c.th["row_remap_uncorrectable_failed"]:
            out.append(c.finding("row_remap_limit", f"{unc} rows remapped (uncorrectable)", i))
        if rows.get("pending"):
            out.append(c.finding("row_remap_pending", "row remap pending", i))
    return out


def _nvlink(c: Context) -> list[Reason] | None:
    status, errors = c.doc.get("nvlink"), c.doc.get("nvlink_errors")
    if status is None and errors is None:
        return None
    out = []
    for g in status or []:
        down = [str(link["link"]) for link in g.get("links") or [] if link.get("gbs") is None]
        if down and c.nvlink_expected:
            out.append(c.finding("nvlink_down", f"NVLink {', '.join(down)} inactive", g["index"]))
    for g in errors or []:
        for link in g.get("links") or []:
            bad = {k: link.get(k) for k in ("replay", "recovery")}
            over = {k: n for k, n in bad.items() if n is not None and n > c.th["nvlink_errors_max"]}
            if over:
                said = ", ".join(f"{n} {k}" for k, n in over.items())
                out.append(
                    c.finding("nvlink_errors", f"link {link['link']}: {said} errors", g["index"])
                )
    return out


def _pcie(c: Context) -> list[Reason] | None:
    if not c.gpus:
        return None
    out = []
    for g in c.gpus:
        p = g.get("pcie") or {}
        if p.get("width_current") and p.get("width_max") and p["width_current"] < p["width_max"]:
            out.append(
                c.finding(
                    "pcie_width", f"PCIe x{p['width_current']} of x{p['width_max']}", g["index"]
                )
            )
        # An idle link trains down to gen1 to save power: only a reading under load counts.
        busy = (g.get("load") or {}).get("pcie_gen_busy_max")
        if busy and p.get("gen_max") and busy < p["gen_max"]:
            out.append(
                c.finding(
                    "pcie_generation",
                    f"PCIe gen{busy:g} of gen{p['gen_max']} under load",
                    g["index"],
                )
            )
    return out


def _throttle(c: Context) -> list[Reason] | None:
    if not c.gpus:
        return None
    bad = set(c.catalog["throttle"]["reasons"])
    out = []
    for g in c.gpus:
        hit = sorted(set(g.get("throttle_reasons") or []) & bad)
        if hit:
            out.append(c.finding("throttle", f"clocks cut: {', '.join(hit)}", g["index"]))
    return out


def _temperature(c: Context) -> list[Reason] | None:
    read = [g for g in c.gpus if g.get("temperature_c") is not None]
    if not read:
        return None
    out = []
    for g in read:
        slow = g.get("temperature_slowdown_c")
        if slow and g["temperature_c"] >= slow - c.th["temperature_margin_c"]:
            out.append(
                c.finding(
                    "temperature",
                    f"{g['temperature_c']:g} C at its {slow:g} C slowdown point",
                    g["index"],
                )
            )
    return out


def _bus(address: str) -> str:
    """The bus and device of a PCI address: nvidia-smi's "00000000:10:1C.0" and the Xid
    line's "0000:10:1c" differ in the domain's width and the function."""
    return ":".join(address.lower().split(".")[0].split(":")[-2:])


def _xid(c: Context) -> list[Reason] | None:
    log = c.doc.get("xid")
    if log is None:
        return None
    xids = c.catalog["xid"]
    bucket_of = {code: name for name, codes in xids["codes"].items() for code in codes}
    by_bus = {_bus(str(g.get("bus_id") or "")): g["index"] for g in c.gpus}
    seen: dict[tuple[int, str], int] = {}
    for e in log.get("events") or []:
        seen[(e["xid"], e.get("pci", "?"))] = seen.get((e["xid"], e.get("pci", "?")), 0) + 1
    out = []
    for (code, pci), times in seen.items():
        bucket = bucket_of.get(code, "UNEXPECTED")
        b = xids["buckets"][bucket]
        gpu = by_bus.get(_bus(pci))
        where = "" if gpu is not None else f" on PCI {pci}"
        many = f" ({times} times)" if times > 1 else ""
        out.append(
            Reason(
                "xid",
                b["class"],
                f"Xid {code}{where}{many}",
                b["action"],
                gpu,
                f"Xid catalog {bucket}",
            )
        )
    return out


def _infiniband(c: Context) -> list[Reason] | None:
    raw = c.doc.get("infiniband")
    if raw is None:
        return None
    ports = [p if "rate_gbps" in p else port_from_sysfs(p) for p in raw]
    ports = [p for p in ports if (p.get("link_layer") or "InfiniBand") == "InfiniBand"]
    if not ports:
        return None
    active = [p for p in ports if (p.get("state") or "").lower() == "active"]
    if not active:
        return [c.finding("ib_no_port", f"0 of {len(ports)} InfiniBand ports Active")]
    out = [
        c.finding("ib_port_down", f"{p['device']}/{p['port']}: {p.get('state') or '?'}")
        for p in ports
        if p not in active
    ]
    want = c.infiniband_gbps_per_port
    out += [
        c.finding("ib_rate", f"{p['device']}/{p['port']}: {p['rate_gbps']:g} of {want:g} Gb/s")
        for p in active
        if want and (p.get("rate_gbps") or 0) < want
    ]
    return out


def _dcgm(c: Context) -> list[Reason] | None:
    diag = c.doc.get("dcgm")
    if diag is None:
        return None
    level = diag.get("level")
    name = f"dcgm r{level}" if level else "dcgm"
    if diag.get("runtime_error"):
        return [
            Reason(
                "dcgm",
                NOTE,
                f"{name} did not run: {diag['runtime_error'][:160]}",
                "start the host engine (systemctl start nvidia-dcgm) and re-check",
            )
        ]
    severity = {int(k): v for k, v in c.catalog["dcgm"]["severity"].items()}
    by_error = {int(k): v for k, v in c.catalog["dcgm"]["error"].items()}
    actions = {int(k): v for k, v in c.catalog["dcgm"]["action"].items()}
    by_action = {int(k): v for k, v in c.catalog["dcgm"]["error_action"].items()}
    out = []
    for test in diag.get("tests") or []:
        for r in test.get("gpus") or []:
            if r.get("status") not in ("Fail", "Warn"):
                continue
            warnings = r.get("warnings") or [{}]
            for w in warnings:
                level_of = by_error.get(w.get("error_id") or -1) or severity.get(
                    w.get("severity") or -1
                )
                if level_of is None:
                    level_of = FAILED if r["status"] == "Fail" else DEGRADED
                text = w.get("text") or f"{test['name']}: {r['status']}"
                action = (
                    by_action.get(w.get("error_id") or -1)
                    or actions.get(w.get("severity") or -1)
                    or actions[2 if level_of == FAILED else 4]
                )
                out.append(
                    Reason(
                        "dcgm",
                        level_of,
                        f"{test['name']}: {text}",
                        action,
                        gpu=r.get("gpu"),
                        source=f"DCGM error {w.get('error_id', '?')}",
                    )
                )
    return out


def _gpu_count(c: Context) -> list[Reason] | None:
    """Fewer GPUs in the driver than the tier has, or than the PCI bus shows."""
    pci = (c.doc.get("pci") or {}).get("gpus")
    want = max(c.gpu_count or 0, pci or 0)
    if "nvidia" not in c.doc:
        if c.doc.get("nvidia_smi") != "missing":
            return None  # not asked for (a partial snapshot)
        if want:  # GPUs on the bus or in the tier, but nvidia-smi printed nothing
            return [c.finding("gpu_missing", f"0 of {want} GPUs in the driver (no nvidia-smi)")]
        # A CPU node (the tests' sshd nodes, a head without GPUs): say so, fail nothing.
        return [Reason("gpu-count", NOTE, NO_GPU)]
    if not want:
        return None
    if len(c.gpus) >= want:
        return []
    seen = f"; the PCI bus shows {pci}" if pci else ""
    return [c.finding("gpu_missing", f"{len(c.gpus)} of {want} GPUs in the driver{seen}")]


def _fabric_manager(c: Context) -> list[Reason] | None:
    """NVSwitch nodes (by the tier, or by the switches on the PCI bus) need the manager."""
    state = c.doc.get("fabric_manager")
    switches = (c.doc.get("pci") or {}).get("nvswitches") or 0
    if state is None or not (c.nvswitch or switches):
        return None
    return (
        [] if state == "active" else [c.finding("fabric_manager", f"nvidia-fabricmanager {state}")]
    )


# The registry, in the order the verdict lists reasons.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("gpu-count", _gpu_count),
    ("dcgm", _dcgm),
    ("xid", _xid),
    ("ecc", _ecc),
    ("retired-pages", _retired),
    ("row-remap", _row_remap),
    ("nvlink", _nvlink),
    ("pcie", _pcie),
    ("throttle", _throttle),
    ("temperature", _temperature),
    ("infiniband", _infiniband),
    ("fabric-manager", _fabric_manager),
)


def judge_health(
    doc: Mapping[str, Any],
    host: str,
    *,
    nvlink: bool = False,
    infiniband_gbps_per_port: float | None = None,
    gpu_count: int | None = None,
    nvswitch: bool = False,
    load: Iterable[Mapping[str, Any]] = (),
    catalog: Mapping[str, Any] | None = None,
) -> HealthVerdict:
    """The node's findings (``snapshot``) against the catalog. ``nvlink``, ``gpu_count``,
    ``nvswitch``: what the tier promises (an inactive link, a missing GPU, a stopped fabric
    manager then fail); ``load``: verify_smi.summarise_load rows, so the
    PCIe generation is judged under load only. ValueError when ``doc`` is not a snapshot."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a health snapshot (schema {doc.get('schema')!r}, want {SCHEMA!r})")
    by_index = {row["index"]: row for row in load}
    gpus = [
        {**g, "load": by_index.get(g.get("index"))}
        for g in (doc.get("nvidia") or {}).get("gpus") or []
    ]
    ctx = Context(
        doc,
        catalog or load_health_catalog(),
        nvlink,
        infiniband_gbps_per_port,
        gpus,
        gpu_count,
        nvswitch,
    )
    reasons: list[Reason] = []
    checked: list[str] = []
    for name, fn in CHECKS:
        found = fn(ctx)
        if found is None:
            continue
        checked.append(name)
        reasons += found
    reasons += [Reason("snapshot", DEGRADED, e, "re-run the health check") for e in doc["errors"]]
    return HealthVerdict(host, str(doc.get("taken_at") or ""), tuple(reasons), tuple(checked))


def from_verify(v: Verdict, taken_at: str) -> HealthVerdict:
    """verify-gpu's verdict as a health verdict: a FAIL check fails the node, a WARN degrades
    it; SKIP and NOT-RUN checks say nothing about the hardware."""
    level = {FAIL: FAILED, WARN: DEGRADED}
    reasons = tuple(
        Reason(
            c.name, level[c.status], f"{c.measured} (expected {c.expected})".strip(), c.detail[:200]
        )
        for c in v.checks
        if c.status in level
    )
    return HealthVerdict(v.host, taken_at, reasons, tuple(c.name for c in v.checks), "verify-gpu")
