"""The shipped zone snapshot: each cloud folder's zones.toml, checked against the catalog.

Which zones offer a type, a region's zones, the zones closed to new purchases and per-region
prices, each dated and sourced. Read by ``make where`` (infra/where.py), by ``zone: auto``'s
candidates (infra/placement.py) and by the check of a stack's pinned zone (infra/config.py).
Nothing here names a cloud: the clouds are the folders (infra.clouds).

A zones.toml holds any of:

- ``[offerings."<type>"]``: region -> the zones that offer the type (a type missing there
  is not offered anywhere, by that source);
- ``[regions]``: region -> its zones (the type per zone unknown);
- ``[sold_out]``: region -> zones the source lists as closed to new purchases: real zone
  names a stack may pin (the plan accepts them), never a place ``zone: auto`` tries;
- ``[prices."<type>"]``: region -> {on_demand, spot} per hour in the cloud's currency;

each table with a ``source`` (a key of ``[sources]`` there or of the catalog's) and prices a
``date``. Without any entry for a type, its only row in ``make where`` is the catalog's price
region.
"""

from __future__ import annotations

import datetime as dt
import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from infra import clouds
from infra.catalog import Catalog, CatalogError, Source, load_catalog
from infra.suggest import did_you_mean

ZONES_FILE = "zones.toml"
# What a row's zone list rests on, for people and --json.
OFFERED = "offered"  # the source lists these zones as offering the type
REGION = "region"  # the region's zones; whether each offers the type is not known offline
UNKNOWN = "unknown"  # no zone list for the region


@dataclass(frozen=True)
class ZoneData:
    """One cloud's zones.toml, checked."""

    regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    regions_source: str = ""
    sold_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    offerings: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None  # None: no such table
    offerings_source: str = ""
    prices: Mapping[str, Mapping[str, tuple[float, float | None]]] = field(default_factory=dict)
    prices_source: str = ""
    prices_date: dt.date | None = None
    sources: Mapping[str, Source] = field(default_factory=dict)


def _sources(raw: Mapping[str, Any], where: str) -> dict[str, Source]:
    out = {}
    for key, v in raw.items():
        try:
            retrieved = dt.date.fromisoformat(str(v["retrieved"]))
        except (KeyError, ValueError):
            raise CatalogError(f"{where} [sources.{key}]: retrieved must be an ISO date") from None
        out[key] = Source(key, str(v["title"]), str(v["url"]), retrieved, str(v.get("note", "")))
    return out


def parse_zone_data(
    raw: Mapping[str, Any], provider: str, catalog: Catalog, where: str = ""
) -> ZoneData:
    """A zones.toml's tables, each source and type and region checked against the catalog."""
    where = where or f"clouds/{provider}/{ZONES_FILE}"
    known = {*catalog.sources, *raw.get("sources", {})}
    info = catalog.providers[provider]
    allowed_regions = set(info.regions)

    def source_of(table: str, body: Mapping[str, Any]) -> str:
        src = str(body.get("source", ""))
        if src not in known:
            raise CatalogError(f"{where} [{table}]: source {src!r} is not a known source")
        return src

    def region_ok(table: str, region: str) -> None:
        if allowed_regions and region not in allowed_regions:
            hint = did_you_mean(region, allowed_regions)
            raise CatalogError(f"{where} [{table}]: {region!r} is not a region of {provider}{hint}")

    def type_ok(table: str, name: str) -> None:
        if (provider, name) not in catalog.instances:
            raise CatalogError(f"{where} [{table}]: {name!r} is not a {provider} type")

    regions: dict[str, tuple[str, ...]] = {}
    regions_source = ""
    if raw.get("regions"):
        body = dict(raw["regions"])
        regions_source = source_of("regions", body)
        for region, zones in body.items():
            if region != "source":
                region_ok("regions", region)
                regions[region] = tuple(str(z) for z in zones)
    sold_out: dict[str, tuple[str, ...]] = {}
    if raw.get("sold_out"):
        body = dict(raw["sold_out"])
        source_of("sold_out", body)
        for region, zones in body.items():
            if region != "source":
                region_ok("sold_out", region)
                sold_out[region] = tuple(str(z) for z in zones)
    offerings = None
    offerings_source = ""
    if "offerings" in raw:
        body = dict(raw["offerings"])
        offerings_source = source_of("offerings", body)
        offerings = {}
        for name, by_region in body.items():
            if name == "source":
                continue
            type_ok(f"offerings.{name}", name)
            for region in by_region:
                region_ok(f"offerings.{name}", region)
            offerings[name] = MappingProxyType(
                {r: tuple(str(z) for z in zs) for r, zs in by_region.items()}
            )
    prices: dict[str, Mapping[str, tuple[float, float | None]]] = {}
    prices_source, prices_date = "", None
    if "prices" in raw:
        body = dict(raw["prices"])
        prices_source = source_of("prices", body)
        try:
            prices_date = dt.date.fromisoformat(str(body.pop("date")))
        except (KeyError, ValueError):
            raise CatalogError(f"{where} [prices]: date must be an ISO date") from None
        for name, by_region in body.items():
            if name == "source":
                continue
            type_ok(f"prices.{name}", name)
            rows = {}
            for region, p in by_region.items():
                region_ok(f"prices.{name}", region)
                spot = p.get("spot")
                rows[region] = (float(p["on_demand"]), None if spot is None else float(spot))
            prices[name] = MappingProxyType(rows)
    return ZoneData(
        regions=MappingProxyType(regions),
        regions_source=regions_source,
        sold_out=MappingProxyType(sold_out),
        offerings=None if offerings is None else MappingProxyType(offerings),
        offerings_source=offerings_source,
        prices=MappingProxyType(prices),
        prices_source=prices_source,
        prices_date=prices_date,
        sources=MappingProxyType(_sources(raw.get("sources", {}), where)),
    )


@functools.lru_cache(maxsize=1)
def load_zone_data() -> Mapping[str, ZoneData]:
    """Each cloud's zones.toml, parsed and checked once per process (clouds without one get
    an empty ZoneData: their price region only)."""
    catalog = load_catalog()
    found = clouds.folders(ZONES_FILE)
    out = {}
    for name in catalog.providers:
        if name in found:
            with (found[name] / ZONES_FILE).open("rb") as fh:
                out[name] = parse_zone_data(tomllib.load(fh), name, catalog)
        else:
            out[name] = ZoneData()
    return MappingProxyType(out)


def region_zones(provider: str, region: str) -> tuple[tuple[str, ...], str] | None:
    """(the zones a region has in the shipped snapshot, their source key), or None where
    the snapshot does not list the region: its [regions] zones, every zone its [offerings]
    name there and its [sold_out] zones, in the snapshot's order."""
    data = load_zone_data().get(provider, ZoneData())
    zones = dict.fromkeys(data.regions.get(region, ()))
    offered = [z for o in (data.offerings or {}).values() for z in o.get(region, ())]
    if region not in data.regions and not offered:
        return None
    zones.update(dict.fromkeys([*offered, *data.sold_out.get(region, ())]))
    source = data.regions_source if region in data.regions else data.offerings_source
    return tuple(zones), source
