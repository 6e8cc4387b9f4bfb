"""Where a `zone: auto` stack goes: its candidates in the user's order, and the one chosen.

A stack with ``zone: auto`` (and, optionally, ordered ``allowedClouds``, ``allowedRegions``
and ``allowedTypes``) is resolved here at plan time from the catalog and each cloud's
zones.toml (infra/zones.py). The candidates are ordered as `make up` fails over
(scripts/up.py): within a cloud and region, every zone of the first type, then the zones of
a sibling type with the same GPUs (the tier's other profiles), then the next region, then the
next allowed cloud. A multi-node stack puts all its nodes in one candidate's zone, so a
candidate is one (cloud, region, zone, type) for the whole stack.

Each candidate is checked by the stack's own config rules (parse_config with that cloud,
region, zone and profile pinned), so a candidate another cloud would refuse (its scratch
class, its billing modes, its stack-name limit) is left out with the reason, and by the
stack's cost ceiling (maxHourlyCost, in the stack's cloud's currency) as the program checks
it. ``placement`` (written by `make up` where it landed) makes that candidate the chosen one.
No provider SDK and no Pulumi here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.catalog import Catalog
from infra.suggest import did_you_mean

if TYPE_CHECKING:
    from infra.config import StackConfig

AUTO = "auto"
LIST_KEYS = ("allowedClouds", "allowedRegions", "allowedTypes")
# Keys a candidate pins, and the keys that describe the choice rather than one placement.
PINNED = ("provider", "region", "zone", "profile")
CHOICE_KEYS = (*LIST_KEYS, "placement")
WIDTH = 80


@dataclass(frozen=True)
class Candidate:
    """One place the whole stack can go."""

    provider: str
    region: str
    zone: str | None  # None: the region lists no zones; the program takes the first offering
    instance_type: str
    profile: str
    basis: str  # zones.OFFERED (the source lists the zone for the type), REGION or UNKNOWN
    source: str  # the zones' source key ("" when unknown)
    hourly: float | None = None  # the whole stack per hour in the stack cloud's currency
    currency: str = ""

    @property
    def key(self) -> str:
        """What ``placement`` holds: provider/region/zone/type (zone '-' when none)."""
        return f"{self.provider}/{self.region}/{self.zone or '-'}/{self.instance_type}"

    def config(self) -> dict[str, Any]:
        """The `gpufleet:*` values that pin the stack to this candidate."""
        return {
            "provider": self.provider,
            "region": self.region,
            "zone": self.zone,
            "profile": self.profile,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "provider": self.provider,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "profile": self.profile,
            "zones_basis": self.basis,
            "zones_source": self.source or None,
            "hourly": self.hourly,
            "currency": self.currency or None,
        }


@dataclass(frozen=True)
class Placement:
    """The candidates in failover order, which one the stack takes now and why."""

    candidates: tuple[Candidate, ...]
    chosen: int
    why: str
    rejected: tuple[str, ...] = ()  # one line each: a place left out, and why

    @property
    def choice(self) -> Candidate:
        return self.candidates[self.chosen]

    def order(self) -> tuple[Candidate, ...]:
        """The order `make up` tries them: the chosen one, then the rest in list order."""
        rest = [c for i, c in enumerate(self.candidates) if i != self.chosen]
        return (self.choice, *rest)

    def line(self, width: int = WIDTH) -> str:
        """One line for the plan: where the stack goes and why, at most ``width`` columns."""
        c = self.choice
        where = c.zone if c.zone and c.zone.startswith(c.region) else f"{c.region}/{c.zone or '-'}"
        head = f"placed: {c.provider} {where} {c.instance_type}, {self.chosen + 1} of "
        head += f"{len(self.candidates)}"
        for why in (self.why, self.why.split(" (")[0]):
            if len(f"{head}: {why}") <= width:
                return f"{head}: {why}"
        return f"{head}: {self.why}"[: width - 3] + "..."

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.choice.key,
            "why": self.why,
            "candidates": [c.to_json() for c in self.candidates],
            "rejected": list(self.rejected),
        }


# ------------------------------------------------------------------------ validation


def _list(raw: Mapping[str, Any], key: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(the list's items, problems): a YAML list, or JSON text as the engine hands it over."""
    import json

    value = raw.get(key)
    if value is None or value == "":
        return [], []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]
    if not isinstance(value, list) or not value:
        return [], [(key, "expected a non-empty list in your order of preference")]
    bad = [i for i, v in enumerate(value) if not isinstance(v, str) or not v.strip()]
    if bad:
        return [], [(f"{key}[{bad[0]}]", f"expected a name, got {value[bad[0]]!r}")]
    items = [v.strip() for v in value]
    dup = next((i for i, v in enumerate(items) if v in items[:i]), None)
    if dup is not None:
        return [], [(f"{key}[{dup}]", f"{items[dup]!r} is listed twice: remove one")]
    return items, []


def _region_owners(cat: Catalog) -> dict[str, list[str]]:
    """region -> the clouds that have it (catalog regions and zones.toml regions)."""
    from infra.zones import load_zone_data

    owners: dict[str, list[str]] = {}
    for provider, info in cat.providers.items():
        data = load_zone_data().get(provider)
        names = {*info.regions, info.price_region, info.default_region}
        if data is not None:
            names |= set(data.regions) | {r for p in data.prices.values() for r in p}
            names |= {r for o in (data.offerings or {}).values() for r in o}
        for region in names:
            owners.setdefault(region, []).append(provider)
    return owners


def problems(
    raw: Mapping[str, Any], cat: Catalog, provider: str | None, tier: str | None
) -> list[tuple[str, str]]:
    """(key, one line) per thing wrong with the placement keys (said before anything is planned)."""
    auto = str(raw.get("zone") or "").strip().lower() == AUTO
    found: list[tuple[str, str]] = []
    given = [k for k in CHOICE_KEYS if raw.get(k) not in (None, "")]
    if given and not auto:
        found.append(
            (
                given[0],
                "only with zone: auto (a pinned or default zone is never moved): "
                f"set gpufleet:zone: auto, or remove {given[0]}",
            )
        )
        return found
    if not auto or not tier:
        return found
    clouds, why = _list(raw, "allowedClouds")
    found += why
    for i, name in enumerate(clouds):
        if name not in cat.providers:
            hint = did_you_mean(name, cat.providers)
            found.append((f"allowedClouds[{i}]", f"{name!r} is not a cloud of the catalog{hint}"))
        elif name not in cat.tiers[tier].offers:
            found.append((f"allowedClouds[{i}]", f"{name} offers no {tier} type: remove it"))
    clouds = [c for c in clouds if c in cat.tiers[tier].offers] or ([provider] if provider else [])
    regions, why = _list(raw, "allowedRegions")
    found += why
    owners = _region_owners(cat)
    for i, name in enumerate(regions):
        if not set(owners.get(name, ())) & set(clouds):
            hint = did_you_mean(name, [r for r, o in owners.items() if set(o) & set(clouds)])
            found.append(
                (f"allowedRegions[{i}]", f"{name!r} is not a region of {', '.join(clouds)}{hint}")
            )
    types, why = _list(raw, "allowedTypes")
    found += why
    offered = {n for c in clouds for n in cat.tiers[tier].offers.get(c, {}).values()}
    for i, name in enumerate(types):
        if name not in offered:
            hint = did_you_mean(name, offered)
            found.append(
                (
                    f"allowedTypes[{i}]",
                    f"{name!r} is no type of tier {tier} on {', '.join(clouds)}{hint}",
                )
            )
    placed = raw.get("placement")
    if placed not in (None, "") and (not isinstance(placed, str) or placed.count("/") != 3):
        found.append(
            ("placement", f"{placed!r} is not provider/region/zone/type (`make up` writes it)")
        )
    return found


# ------------------------------------------------------------------------ candidates


def _types_for(cat: Catalog, tier: str, provider: str, profile: str, allowed: Sequence[str]):
    """(type, profile) in order: the allowed ones the tier has there, else the stack's profile's
    type and then its siblings (the tier's other profiles: the same GPUs, another host)."""
    offers = cat.tiers[tier].offers.get(provider, {})
    by_type: dict[str, str] = {}
    for prof in (profile, *offers):
        if prof in offers:
            by_type.setdefault(offers[prof], prof)
    if allowed:
        return [(t, by_type[t]) for t in allowed if t in by_type]
    return list(by_type.items())


def _zones_for(provider: str, itype: str, region: str) -> tuple[list[str | None], str, str]:
    """(the zones to try, their basis, their source) for a type in a region, from zones.toml."""
    from infra.zones import OFFERED, REGION, UNKNOWN, ZoneData, load_zone_data

    data = load_zone_data().get(provider, ZoneData())
    if data.offerings is not None:
        zones = data.offerings.get(itype, {}).get(region, ())
        return list(zones), OFFERED, data.offerings_source
    if region in data.regions:
        zones = data.regions[region]
        return (list(zones) or [None]), REGION, data.regions_source
    return [None], UNKNOWN, ""


@functools.lru_cache(maxsize=256)
def _hourly(
    provider: str, itype: str, nodes: int, billing: str, region: str, currency: str, months: int
) -> float | None:
    from infra.pricing.cost import hourly_estimate

    try:
        est = hourly_estimate(
            provider,
            itype,
            nodes,
            billing,
            subscription_months=months,
            region=region,
            currency=currency,
        )
    except (KeyError, ValueError):  # unpriced type, or no exchange rate to the currency
        return None
    return float(est["amount"])


def resolve(raw: Mapping[str, Any], base: StackConfig, cat: Catalog) -> StackConfig:
    """The stack pinned to its chosen candidate, with the Placement attached.

    Raises ConfigError (one line) when no candidate is left."""
    from infra.config import ConfigError, parse_config

    clouds = _list(raw, "allowedClouds")[0] or [base.provider]
    regions_given = _list(raw, "allowedRegions")[0]
    types_given = _list(raw, "allowedTypes")[0]
    owners = _region_owners(cat)
    currency = cat.providers[base.provider].currency
    plain = {k: v for k, v in raw.items() if k not in (*CHOICE_KEYS, *PINNED)}
    found: list[Candidate] = []
    rejected: list[str] = []
    for provider in clouds:
        info = cat.providers[provider]
        if regions_given:
            regions = [r for r in regions_given if provider in owners.get(r, ())]
        else:
            regions = [base.region if provider == base.provider else info.default_region]
        for region in regions:
            for itype, profile in _types_for(cat, base.tier, provider, base.profile, types_given):
                zones, basis, source = _zones_for(provider, itype, region)
                if not zones:
                    rejected.append(f"{provider} {region} {itype}: no zone offers it ({source})")
                    continue
                hourly = _hourly(
                    provider,
                    itype,
                    base.nodes,
                    base.billing,
                    region,
                    currency,
                    base.subscription_months or 1,
                )
                if base.max_hourly_cost is not None and (
                    hourly is None or hourly > base.max_hourly_cost
                ):
                    cost = "no price" if hourly is None else f"{hourly:g} {currency}/h"
                    rejected.append(
                        f"{provider} {region} {itype}: {cost}, above maxHourlyCost "
                        f"{base.max_hourly_cost:g}"
                    )
                    continue
                for zone in zones:
                    pinned = {**plain, "provider": provider, "region": region}
                    pinned["profile"] = profile
                    if zone:
                        pinned["zone"] = zone
                    try:
                        parse_config(pinned, base.stack, cat)
                    except ConfigError as exc:
                        rejected.append(f"{provider} {region} {zone or '-'}: {exc.problems[0]}")
                        continue
                    found.append(
                        Candidate(
                            provider, region, zone, itype, profile, basis, source, hourly, currency
                        )
                    )
    if not found:
        why = rejected[0] if rejected else "the allowed lists leave no place"
        raise ConfigError([f"gpufleet:zone: auto: no candidate for {base.tier}: {why}"])
    chosen, why = 0, _why_first(found[0])
    placed = raw.get("placement")
    if isinstance(placed, str) and placed:
        at = next((i for i, c in enumerate(found) if c.key == placed), None)
        if at is None:
            why = f"{why}; placement {placed} is no candidate now"
        else:
            chosen, why = at, "where `make up` landed (gpufleet:placement)"
    placement = Placement(tuple(found), chosen, why, tuple(rejected))
    c = placement.choice
    pinned = {**plain, "provider": c.provider, "region": c.region, "profile": c.profile}
    if c.zone:
        pinned["zone"] = c.zone
    return dataclasses.replace(parse_config(pinned, base.stack, cat), placement=placement)


def _why_first(c: Candidate) -> str:
    from infra.zones import OFFERED, REGION, UNKNOWN

    return {
        OFFERED: f"your order, offered there ({c.source})",
        REGION: f"your order, a zone of the region ({c.source})",
        UNKNOWN: "your order, zones not known offline",
    }[c.basis]
