"""Where a tier or an instance type can be had: every cloud, region and zone, with its price.

``make where`` (scripts/where.py). Offline, from each cloud folder's catalog.toml (types,
tiers, the price region's prices) and the zone snapshot (infra/zones.py: each folder's
zones.toml, which zones offer a type, a region's zones, per-region prices); live, from each
cloud's own availability signal (its folder's availability.py), asked only with ``--live``.
Nothing here names a cloud: the clouds are the folders (infra.clouds).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import clouds
from infra.catalog import Catalog, InstanceType, load_catalog
from infra.clouds.availability import NoSignal, ZoneSignal
from infra.suggest import did_you_mean
from infra.zones import OFFERED, REGION, UNKNOWN, ZoneData


class UsageError(ValueError):
    """Bad input: the message is one line saying what is wrong and how to fix it."""


@dataclass(frozen=True)
class Offer:
    """One row: a type in one region of one cloud, its zones and its prices there."""

    provider: str
    instance_type: str
    tier: str | None
    region: str
    zones: tuple[str, ...]
    zones_basis: str  # OFFERED, REGION or UNKNOWN
    zones_source: str
    currency: str
    on_demand: float | None
    spot: tuple[float, float] | None
    price_source: str
    price_date: dt.date | None
    usd_per_hour: float | None  # on-demand in USD, the sort key (catalog exchange rate)

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "tier": self.tier,
            "region": self.region,
            "zones": list(self.zones),
            "zones_basis": self.zones_basis,
            "zones_source": self.zones_source or None,
            "currency": self.currency,
            "on_demand": self.on_demand,
            "spot": list(self.spot) if self.spot else None,
            "price_source": self.price_source or None,
            "price_date": self.price_date.isoformat() if self.price_date else None,
            "usd_per_hour": None if self.usd_per_hour is None else round(self.usd_per_hour, 4),
        }


def targets(catalog: Catalog, query: str) -> tuple[str, list[tuple[InstanceType, str | None]]]:
    """("tier" or "instance type", the types to look up with their tier) for a tier key or
    an instance type name (case as typed or not); UsageError with a did-you-mean if neither."""
    if query in catalog.tiers:
        tier = catalog.tiers[query]
        found: list[tuple[InstanceType, str | None]] = [
            (catalog.instance(provider, name), query)
            for provider in catalog.providers
            for name in dict.fromkeys(tier.offers.get(provider, {}).values())
        ]
        return "tier", found
    wanted = query.lower()
    matches = [it for (_, name), it in catalog.instances.items() if name.lower() == wanted]
    if matches:
        return "instance type", [(it, catalog.tier_of(it.provider, it.name)) for it in matches]
    names = [*catalog.tiers, *(name for _, name in catalog.instances)]
    hint = did_you_mean(query, names) or did_you_mean(wanted, [n.lower() for n in names])
    # the tiers and types are too many for one line: gpus.py lists both
    raise UsageError(f"{query!r} is neither a tier nor an instance type{hint}; see `make gpus`")


def offers(
    catalog: Catalog,
    zone_data: Mapping[str, ZoneData],
    found: Iterable[tuple[InstanceType, str | None]],
    usd_rate: Callable[[str], float | None],
) -> list[Offer]:
    """Every (type, region) row the offline data supports, sorted by on-demand USD/h (rows
    without a price last, in the clouds' order)."""
    rows: list[Offer] = []
    for it, tier in found:
        info = catalog.providers[it.provider]
        data = zone_data.get(it.provider, ZoneData())
        priced = data.prices.get(it.name, {})
        if data.offerings is not None:
            where = dict(data.offerings.get(it.name, {}))
        else:
            where = {r: data.regions.get(r, ()) for r in priced} or {
                info.price_region: data.regions.get(info.price_region, ())
            }
        for region, zones in where.items():
            if data.offerings is not None:
                basis, zsource = OFFERED, data.offerings_source
            elif zones or region in data.regions:  # listed with no zones: none in the region
                basis, zsource = REGION, data.regions_source
            else:
                basis, zsource = UNKNOWN, ""
            od: float | None = None
            spot: tuple[float, float] | None = None
            psource, pdate = "", None
            if region in priced:
                od, one_spot = priced[region]
                spot = None if one_spot is None else (one_spot, one_spot)
                psource, pdate = data.prices_source, data.prices_date
            elif region == info.price_region and it.price is not None:
                od, spot = it.price.on_demand, it.price.spot
                psource, pdate = it.price.source, it.price.date
                if it.price.spot_source:
                    psource += f"; spot {it.price.spot_source}"
            rate = usd_rate(info.currency)
            rows.append(
                Offer(
                    provider=it.provider,
                    instance_type=it.name,
                    tier=tier,
                    region=region,
                    zones=tuple(zones),
                    zones_basis=basis,
                    zones_source=zsource,
                    currency=info.currency,
                    on_demand=od,
                    spot=spot,
                    price_source=psource,
                    price_date=pdate,
                    usd_per_hour=None if od is None or rate is None else od * rate,
                )
            )
    order = {name: i for i, name in enumerate(catalog.providers)}
    rows.sort(
        key=lambda r: (
            r.usd_per_hour is None,
            r.usd_per_hour or 0.0,
            order[r.provider],
            r.instance_type,
            r.region,
        )
    )
    return rows


@dataclass(frozen=True)
class LiveAnswer:
    """One cloud's signal for one type: its zones, or why there are none."""

    provider: str
    instance_type: str
    signal: str  # the API calls it rests on ("" when the cloud has no availability.py)
    zones: tuple[ZoneSignal, ...] = ()
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "signal": self.signal or None,
            "error": self.error or None,
            "zones": [
                {
                    "region": z.region,
                    "zone": z.zone or None,
                    "state": z.state,
                    "spot_price": z.spot_price,
                    "detail": z.detail or None,
                }
                for z in self.zones
            ],
        }


def live(rows: Sequence[Offer], regions: Sequence[str] = ()) -> list[LiveAnswer]:
    """Each cloud's own signal for each (cloud, type) of ``rows``: for ``regions`` when given
    (those the cloud knows), else the rows' regions. A cloud without an availability.py, or
    whose signal fails (no credentials), answers one line of why."""
    wanted: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        wanted.setdefault((r.provider, r.instance_type), [])
        if not regions and r.region not in wanted[(r.provider, r.instance_type)]:
            wanted[(r.provider, r.instance_type)].append(r.region)
    catalog = load_catalog()
    have = clouds.names("availability.py")
    out = []
    for (provider, itype), own in wanted.items():
        asked = own
        if regions:
            known = catalog.providers[provider].regions
            asked = [r for r in regions if not known or r in known]
        if provider not in have:
            out.append(LiveAnswer(provider, itype, "", error="no availability signal module (yet)"))
            continue
        module = clouds.module(provider, "availability")
        if not asked:
            out.append(
                LiveAnswer(
                    provider, itype, module.SIGNAL, error="no --region given is one of its regions"
                )
            )
            continue
        try:
            zones = tuple(module.live_zones(itype, asked))
        except NoSignal as exc:
            out.append(LiveAnswer(provider, itype, module.SIGNAL, error=str(exc)))
            continue
        out.append(LiveAnswer(provider, itype, module.SIGNAL, zones=zones))
    return out


# ------------------------------------------------------------------------------ rendering


def _money(x: float | None) -> str:
    return "-" if x is None else (f"{x:,.2f}" if x < 1000 else f"{x:,.0f}")


def _spot(s: tuple[float, float] | None) -> str:
    if s is None:
        return "-"
    return _money(s[0]) if s[0] == s[1] else f"{_money(s[0])}-{_money(s[1])}"


def _zones_text(r: Offer) -> str:
    if r.zones_basis == UNKNOWN:
        return "zones not known offline (--live asks the cloud)"
    if not r.zones:
        return f"no availability zones in this region ({r.zones_source})"
    what = "offer it" if r.zones_basis == OFFERED else "of the region; per type: --live"
    return f"zones {' '.join(r.zones)} ({what}; {r.zones_source})"


HEADER = f"{'cloud':<9}{'instance type':<26}{'region':<17}{'cur':<4}{'/h':>8}{'spot/h':>15}"


def render(
    query: str,
    kind: str,
    rows: Sequence[Offer],
    answers: Sequence[LiveAnswer],
    width: int | None,
    missing: Sequence[str] = (),
) -> str:
    """The table (80 columns a row; zone lines wrap at ``width``, none when it is None)."""
    from infra.render import wrap

    lines = [f"where: {kind} {query}, {len(rows)} region rows, sorted by on-demand USD/h", ""]
    lines.append(HEADER)
    for r in rows:
        lines.append(
            f"{r.provider:<9.8}{r.instance_type:<26.25}{r.region:<17.16}{r.currency:<4}"
            f"{_money(r.on_demand):>8}{_spot(r.spot):>15}"
        )
        price = f"priced {r.price_date.isoformat()} ({r.price_source}); " if r.price_date else ""
        lines += wrap(price + _zones_text(r), width, "    ", "      ")
    for text in missing:
        lines += wrap(text, width)
    if answers:
        lines += ["", "live (each cloud's own signal):"]
        for a in answers:
            head = f"{a.provider} {a.instance_type}"
            if a.error:
                lines += wrap(f"{head}: {a.error}", width, "  ", "    ")
                continue
            lines += wrap(f"{head}: {a.signal}", width, "  ", "    ")
            if not a.zones:
                lines.append("    no zone reports it")
            for z in a.zones:
                spot = f", spot {_money(z.spot_price)}/h" if z.spot_price is not None else ""
                detail = f" ({z.detail})" if z.detail else ""
                lines += wrap(
                    f"{z.zone or z.region + ' (regional)'}: {z.state}{spot}{detail}",
                    width,
                    "    ",
                    "      ",
                )
    lines += [
        "",
        "Prices are the sources' dated figures, not quotes; 'cur' is the cloud's currency, "
        "sorted in USD at the catalog's exchange rate.",
    ]
    out: list[str] = []
    for line in lines:
        out += [line] if line.startswith(" ") or not line else wrap(line, width)
    return "\n".join(out) + "\n"


def missing(
    zone_data: Mapping[str, ZoneData],
    found: Iterable[tuple[InstanceType, str | None]],
    rows: Sequence[Offer],
) -> list[str]:
    """A line for each looked-up type that got no row: its source lists no zone for it."""
    have = {(r.provider, r.instance_type) for r in rows}
    out = []
    for it, _ in found:
        if (it.provider, it.name) not in have:
            src = zone_data[it.provider].offerings_source
            out.append(
                f"{it.provider} {it.name}: no zone offers it in {src} (retired there, or "
                "never sold); --live asks the cloud"
            )
    return out


def not_offered(catalog: Catalog, tier: str) -> list[str]:
    """A line for each cloud that offers no type for ``tier``, with the nearest it has."""
    out = []
    for provider in catalog.providers:
        if provider in catalog.tiers[tier].offers:
            continue
        near = [a for a in catalog.alternatives(tier, provider) if a.provider == provider]
        hint = "; ".join(str(a) for a in near[:2]) or "none of the same GPU"
        out.append(f"{provider}: offers no {tier} type; nearest there: {hint}")
    return out
