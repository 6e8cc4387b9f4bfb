"""The catalog's idle and TTL limits per instance type, as the reaper reads them.

The catalog (infra/catalog/*.toml, read by ``infra.catalog``) is the one source. The cloud
function runs without the repository and on Python 3.10 (no ``tomllib``), so the function
package carries this table as JSON (``instance_types.json``, written by
:func:`build_table` when the zip is built); from a checkout the table is built from the
catalog directly. Standard library only.

An instance type missing from the table gets the family entry (``p4d``, ``ecs.gn7e``: the
name without its size) when the family is in the catalog, else the documented default (the
longer limit, which only costs money that the TTL bounds).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE_FILE = "instance_types.json"
TABLE_VERSION = 1


def family_of(instance_type: str) -> str:
    """``p4d.24xlarge`` -> ``p4d``; ``ecs.gn7e-c16g1.32xlarge`` -> ``ecs.gn7e``."""
    name = instance_type.strip().lower()
    head = name.rsplit(".", 1)[0] if name.count(".") >= 1 else name
    return head.split("-", 1)[0]


def build_table(catalog: Any) -> dict[str, Any]:
    """The JSON-ready table from an ``infra.catalog.Catalog``.

    An instance type offered by tiers takes their limits; one offered by none takes the
    limits of the tiers with the same GPU; where they disagree, the longer limit (safer for a
    busy node). None means "no catalog value": the policy's default applies.
    """
    tiers = {
        key: {"idle_minutes": t.idle_minutes, "ttl_hours": t.ttl_hours, "gpu": t.gpu}
        for key, t in sorted(catalog.tiers.items())
    }
    types: dict[str, Any] = {}
    families: dict[str, Any] = {}
    for (provider, name), it in sorted(catalog.instances.items()):
        offering = [
            t for t in catalog.tiers.values() if name in t.offers.get(provider, {}).values()
        ]
        same_gpu = [t for t in catalog.tiers.values() if it.gpu in t.gpus_allowed]
        source = offering or same_gpu
        idle = max((t.idle_minutes for t in source), default=None)
        ttl = max((t.ttl_hours for t in source), default=None)
        types[name] = {
            "provider": provider,
            "gpu": it.gpu,
            "gpus": it.gpus,
            "idle_minutes": idle,
            "ttl_hours": ttl,
        }
        fam = families.setdefault(
            family_of(name), {"provider": provider, "gpus": [], "idle_minutes": None}
        )
        if it.gpu not in fam["gpus"]:
            fam["gpus"].append(it.gpu)
        if idle is not None:
            fam["idle_minutes"] = max(idle, fam["idle_minutes"] or 0)
    return {"version": TABLE_VERSION, "tiers": tiers, "instance_types": types, "families": families}


def table_json(catalog: Any) -> bytes:
    """Deterministic bytes of the table (sorted keys), as the function package carries them."""
    return (json.dumps(build_table(catalog), indent=1, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class CatalogLimits:
    idle_minutes: float | None
    ttl_hours: float | None
    gpu: str | None
    note: str | None = None  # why no catalog value applies


@dataclass(frozen=True)
class TypeTable:
    tiers: Mapping[str, Mapping[str, Any]]
    instance_types: Mapping[str, Mapping[str, Any]]
    families: Mapping[str, Mapping[str, Any]]
    origin: str  # where the table came from, for reports

    def limits(self, tier: str | None, instance_type: str | None) -> CatalogLimits:
        """The catalog's limits: the exact instance type, else the tier, else the family."""
        itype = (instance_type or "").strip()
        row = self.instance_types.get(itype)
        if row is not None:
            return CatalogLimits(row.get("idle_minutes"), row.get("ttl_hours"), row.get("gpu"))
        t = self.tiers.get((tier or "").strip())
        if t is not None:
            return CatalogLimits(t.get("idle_minutes"), t.get("ttl_hours"), t.get("gpu"))
        fam = self.families.get(family_of(itype)) if itype else None
        if fam is not None:
            gpus = fam.get("gpus") or []
            return CatalogLimits(fam.get("idle_minutes"), None, gpus[0] if len(gpus) == 1 else None)
        return CatalogLimits(
            None, None, None, note=f"instance type {itype or '?'!r} not in the catalog: defaults"
        )

    def gpu_family_known(self, instance_type: str) -> bool:
        """A catalog instance type, one of a catalog family (a size the catalog lacks), or of
        a family named like one (``p5e`` next to ``p5``, ``ecs.gn7s`` next to ``ecs.gn7``)."""
        itype = instance_type.strip()
        if itype in self.instance_types:
            return True
        fam = family_of(itype)
        return any(fam.startswith(known) for known in self.families)


def parse_table(data: Mapping[str, Any], origin: str) -> TypeTable:
    if data.get("version") != TABLE_VERSION:
        raise ValueError(f"{origin}: table version {data.get('version')!r}, want {TABLE_VERSION}")
    return TypeTable(
        tiers=dict(data.get("tiers", {})),
        instance_types=dict(data.get("instance_types", {})),
        families=dict(data.get("families", {})),
        origin=origin,
    )


EMPTY = TypeTable({}, {}, {}, origin="none (defaults only)")


@functools.lru_cache(maxsize=1)
def load_table() -> TypeTable:
    """The packaged JSON when present (the cloud function), else the catalog (a checkout).

    Neither available: an empty table, so every instance gets the defaults (the longer idle
    limit); the reports say so in each decision's reason.
    """
    packaged = Path(__file__).resolve().parent / TABLE_FILE
    if packaged.is_file():
        return parse_table(json.loads(packaged.read_text(encoding="utf-8")), str(packaged))
    try:
        from infra.catalog import load_catalog
    except ImportError:
        return EMPTY
    return parse_table(build_table(load_catalog()), "infra/catalog")
