"""What a healthy node of the tier looks like: :func:`expected_from` combines the stack outputs
(or a tier named on the command line) with the catalog into an :class:`Expected`, the promise
plus the catalog thresholds every check is held to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bootstrap.api import ScratchSpec
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
