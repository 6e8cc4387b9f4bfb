"""What a healthy node of the tier looks like: :func:`expected_from` combines the stack outputs
(or a tier named on the command line) with the catalog into an :class:`Expected`, the promise
plus the catalog thresholds every check is held to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bootstrap.fleet.api import ScratchSpec
from bootstrap.fleet.interconnect import INFINIBAND, TCP, fabric_of
from infra.catalog import Catalog, Gpu


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
    fabric: str = TCP  # between the nodes: efa | infiniband | tcp (bootstrap/fleet/interconnect.py)
    infiniband_gbps: float | None = None  # the size's total InfiniBand bandwidth
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
            "fabric": self.fabric,
            "infiniband_gbps": self.infiniband_gbps,
            "scratch": asdict(self.scratch),
            "bucket": self.bucket,
            "thresholds": dict(self.thresholds),
            "cpu": self.cpu,
            "quick": self.quick,
            "nodes": self.nodes,
        }


@dataclass(frozen=True)
class _TierFacts:
    """What the tier promises, from the stack's tier output and the catalog together."""

    gpus_allowed: tuple[Gpu, ...]
    gpu_count: int | None
    nvlink: bool
    nvswitch: bool
    provider: str | None
    instance_type: str | None


def _tier_facts(
    catalog: Catalog, name: str | None, raw: Mapping[str, Any], provider: str | None
) -> _TierFacts:
    """The stack's tier output, completed from the catalog tier of that name (if any): the
    output's own values win, the catalog fills what it leaves out."""
    itype = raw.get("instance_type")
    facts = _TierFacts(
        (),
        raw.get("gpu_count"),
        bool(raw.get("nvlink", False)),
        bool(raw.get("nvswitch", False)),
        provider,
        itype,
    )
    if not name or name not in catalog.tiers:
        return facts
    t = catalog.tiers[name]
    offers = [
        catalog.instance(p, profile)
        for p, profiles in t.offers.items()
        if provider in (None, p)
        for profile in profiles.values()
    ]
    if not itype and offers:
        itype, provider = offers[0].name, provider or offers[0].provider
    return _TierFacts(
        tuple(catalog.gpus[g] for g in t.gpus_allowed),
        facts.gpu_count or t.gpus,
        facts.nvlink or t.nvlink,
        facts.nvswitch if "nvswitch" in raw else any(o.nvswitch for o in offers),
        provider,
        itype,
    )


def _with_model(catalog: Catalog, model: str | None, allowed: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """The stack's actual GPU model first, then the tier's other allowed ones."""
    if not model:
        return allowed
    if model not in catalog.gpus:
        raise ValueError(
            f"stack tier GPU {model!r} is not in the catalog (infra/catalog/gpus.toml)"
        )
    found = catalog.gpus[model]
    return (found, *[g for g in allowed if g.key != found.key])


def _scratch_spec(raw: Mapping[str, Any]) -> ScratchSpec:
    return ScratchSpec(
        path=raw.get("path", "/scratch"),
        kind=raw.get("kind", "nvme"),
        devices=raw.get("devices"),
        size_gb=raw.get("size_gb"),
    )


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
    if tier and tier not in catalog.tiers:
        known = ", ".join(sorted(catalog.tiers))
        raise ValueError(f"unknown tier {tier!r}; the catalog has: {known}")
    # A tier named on the command line replaces the stack's tier wholesale.
    raw_tier = {} if tier else dict(outputs.get("tier") or {})
    tier_name = tier or raw_tier.get("name")
    facts = _tier_facts(catalog, tier_name, raw_tier, outputs.get("provider"))
    gpus_allowed = _with_model(catalog, raw_tier.get("gpu_model"), facts.gpus_allowed)
    provider, itype = facts.provider, facts.instance_type
    it = catalog.instances.get((provider, itype)) if provider and itype else None
    network = it.network_gbps if it else None
    fabric = fabric_of(raw_tier, it, catalog)
    ib_gbps = raw_tier.get("infiniband_gbps") or (it.infiniband_gbps if it else 0)
    first = gpus_allowed[0] if gpus_allowed else None
    memory = float(raw_tier.get("gpu_memory_gb") or (first.memory_gb if first else 0))
    return Expected(
        stack=outputs.get("stack"),
        provider=provider,
        region=outputs.get("region"),
        tier=tier_name,
        gpu=first,
        gpus_allowed=gpus_allowed,
        gpu_count=int(facts.gpu_count) if facts.gpu_count else None,
        memory_gb=memory or None,
        nvlink=facts.nvlink,
        nvswitch=facts.nvswitch,
        network_gbps=network,
        fabric=fabric,
        infiniband_gbps=float(ib_gbps) if fabric == INFINIBAND and ib_gbps else None,
        scratch=scratch or _scratch_spec(outputs.get("scratch") or {}),
        bucket=outputs.get("bucket"),
        thresholds=dict(first.thresholds if first else catalog.default_thresholds),
        cpu=cpu,
        quick=quick,
        nodes=nodes,
    )
