"""Reads pricing.toml: disks, buckets, egress, snapshots, subscription and reservation terms,
spot band, FX.

Instance-hour prices stay on the instance types (``infra.catalog``); this module holds the rest
of the bill. Same rules as the catalog: plain data, a date and a source on every figure, no
network, frozen objects, parsed once per process for the default file.
"""

from __future__ import annotations

import datetime as dt
import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from infra.catalog import (
    DATA_DIR,
    Catalog,
    CatalogError,
    _date,
    cloud_file,
    cloud_path,
    load_catalog,
)

# The shared part (meta, spot band, FX); each cloud's own rates are its file's [pricing] table.
PRICING_FILE = DATA_DIR / "pricing.toml"


@dataclass(frozen=True)
class Rate:
    """One dated, sourced figure: a unit price, a factor or an exchange rate."""

    amount: float
    date: dt.date
    source: str
    estimate: bool = False
    note: str = ""

    def age_days(self, today: dt.date) -> int:
        return (today - self.date).days


@dataclass(frozen=True)
class Egress:
    rate: Rate  # per GB
    free_gb: float


@dataclass(frozen=True)
class Subscription:
    """PrePaid terms: the monthly price quoted per instance type, and the yearly discount.

    ``monthly_factor`` (a fraction of on-demand x hours_per_month) prices types without a
    quote only when pricing.toml gives one; the shipped file gives none, because the real
    quotes are no single factor off on-demand (0.658 x for gn7, 0.394 x for gn6v)."""

    yearly_factor: float
    yearly: Rate  # carries the yearly factor's date, source and estimate flag
    monthly: Mapping[str, Rate]
    monthly_factor: Rate | None = None


# The reservation terms the cost model knows, in months. A cloud's [pricing.reservations]
# table says which of them it sells; the CLI checks a term against this list before anything.
RESERVATION_TERM_MONTHS: Mapping[str, int] = MappingProxyType({"1y": 12, "3y": 36})


@dataclass(frozen=True)
class Reservations:
    """Commitments a cloud sells apart from the VM (Azure reservations): bought for a whole
    term, they discount matching running VMs of one billing mode, hour by hour.

    ``quotes`` holds a dated total for the whole term (one instance) where a public source
    gives one: instance type -> term -> Rate. ``live`` names where a current price can be
    asked for instead (shown when the catalog has none)."""

    terms: tuple[str, ...]  # keys of RESERVATION_TERM_MONTHS, in the order offered
    discounts: str  # the billing mode of the VMs it applies to ("on-demand")
    bought_with: str
    covers: str
    live: str
    source: str  # where the terms are documented
    quotes: Mapping[str, Mapping[str, Rate]]


@dataclass(frozen=True)
class ProviderPricing:
    provider: str
    currency: str
    region: str
    root_disk_class: str
    bucket_class: str
    spot_caveat: str
    spot_caveat_source: str
    block: Mapping[str, Rate]  # per GB-month, by disk class
    bucket: Mapping[str, Rate]  # per GB-month, by storage class
    egress: Egress
    snapshot: Rate  # per GB-month
    subscription: Subscription | None
    reservations: Reservations | None = None  # None: the cloud sells none through this tool


@dataclass(frozen=True)
class Pricing:
    stale_after_days: int
    hours_per_month: float
    spot_band: tuple[float, float]
    spot_band_rate: Rate  # amount unused; carries the band's date and source
    fx: Mapping[tuple[str, str], Rate]  # (base, quote) -> 1 base = amount quote
    providers: Mapping[str, ProviderPricing]

    @property
    def currencies(self) -> tuple[str, ...]:
        seen = {c for pair in self.fx for c in pair}
        seen.update(p.currency for p in self.providers.values())
        return tuple(sorted(seen))

    def fx_rate(self, source: str, target: str) -> tuple[float, Rate | None]:
        """Multiplier turning an amount in `source` into `target`, and the rate used (None when
        the currencies are the same). Raises KeyError naming the known currencies."""
        if source == target:
            return 1.0, None
        if (source, target) in self.fx:
            rate = self.fx[(source, target)]
            return rate.amount, rate
        if (target, source) in self.fx:
            rate = self.fx[(target, source)]
            return 1.0 / rate.amount, rate
        raise KeyError(
            f"no exchange rate between {source} and {target} in pricing.toml "
            f"(known currencies: {', '.join(self.currencies)})"
        )


def _rate(raw: Mapping[str, Any], key: str, where: str, sources: Mapping[str, Any]) -> Rate:
    for required in (key, "date", "source"):
        if required not in raw:
            raise CatalogError(f"{where}: '{required}' is required")
    amount = raw[key]
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
        raise CatalogError(f"{where}: {key} must be a number >= 0, got {amount!r}")
    source = str(raw["source"])
    if source not in sources:
        raise CatalogError(f"{where}: source {source!r} is not in sources.toml")
    return Rate(
        amount=float(amount),
        date=_date(raw["date"], where),
        source=source,
        estimate=bool(raw.get("estimate", False)),
        note=str(raw.get("note", "")),
    )


def _table(raw: Mapping[str, Any], key: str, where: str, sources: Mapping) -> Mapping[str, Rate]:
    return MappingProxyType(
        {name: _rate(r, key, f"{where}.{name}", sources) for name, r in raw.items()}
    )


def _provider(name: str, raw: Mapping[str, Any], catalog: Catalog) -> ProviderPricing:
    sources = catalog.sources
    info = catalog.providers.get(name)
    if info is None:
        raise CatalogError(f"pricing.{name}: not a provider in the catalog")
    if raw.get("currency") != info.currency:
        raise CatalogError(
            f"pricing.{name}: currency {raw.get('currency')!r} differs from the catalog's "
            f"{info.currency!r}"
        )
    block = _table(raw["block"], "per_gb_month", f"pricing.{name}.block", sources)
    bucket = _table(raw["bucket"], "per_gb_month", f"pricing.{name}.bucket", sources)
    for what, table, default in (
        ("root_disk_class", block, raw["root_disk_class"]),
        ("bucket_class", bucket, raw["bucket_class"]),
    ):
        if default not in table:
            raise CatalogError(f"pricing.{name}.{what}: {default!r} has no price in the table")
    if raw.get("spot_caveat_source") not in sources:
        raise CatalogError(f"pricing.{name}.spot_caveat_source: not in sources.toml")
    subscription = None
    if "subscription" in raw:
        sub = dict(raw["subscription"])
        quotes = sub.pop("monthly", {})
        where = f"pricing.{name}.subscription"
        factor = _rate(sub, "monthly_factor", where, sources) if "monthly_factor" in sub else None
        yearly = _rate({"yearly_factor": 1.0, **sub}, "yearly_factor", where, sources)
        if not (0 < yearly.amount <= 1 and (factor is None or 0 < factor.amount <= 1)):
            raise CatalogError(f"{where}: factors must lie in (0, 1]")
        for itype in quotes:
            if (name, itype) not in catalog.instances:
                raise CatalogError(f"{where}.monthly: unknown type {itype!r}")
        subscription = Subscription(
            yearly_factor=yearly.amount,
            yearly=yearly,
            monthly=_table(quotes, "price", f"{where}.monthly", sources),
            monthly_factor=factor,
        )
    if subscription is None and "subscription" in info.billing:
        raise CatalogError(f"pricing.{name}: the catalog sells subscription but no terms are given")
    egress_raw = raw["egress"]
    reservations = (
        _reservations(name, raw["reservations"], catalog) if "reservations" in raw else None
    )
    return ProviderPricing(
        provider=name,
        currency=info.currency,
        region=str(raw.get("region", info.price_region)),
        root_disk_class=raw["root_disk_class"],
        bucket_class=raw["bucket_class"],
        spot_caveat=str(raw["spot_caveat"]),
        spot_caveat_source=str(raw["spot_caveat_source"]),
        block=block,
        bucket=bucket,
        egress=Egress(
            _rate(egress_raw, "per_gb", f"pricing.{name}.egress", sources),
            float(egress_raw.get("free_gb", 0)),
        ),
        snapshot=_rate(raw["snapshot"], "per_gb_month", f"pricing.{name}.snapshot", sources),
        subscription=subscription,
        reservations=reservations,
    )


_RESERVATION_KEYS = frozenset(
    {"terms", "discounts", "bought_with", "covers", "live", "source", "quotes"}
)


def _reservations(name: str, raw: Mapping[str, Any], catalog: Catalog) -> Reservations:
    where = f"pricing.{name}.reservations"
    extra = set(raw) - _RESERVATION_KEYS
    if extra:
        raise CatalogError(f"{where}: unknown keys {sorted(extra)}")
    missing = sorted(_RESERVATION_KEYS - {"quotes"} - set(raw))
    if missing:
        raise CatalogError(f"{where}: {', '.join(missing)} required")
    terms = tuple(str(t) for t in raw["terms"])
    unknown = [t for t in terms if t not in RESERVATION_TERM_MONTHS]
    if not terms or unknown:
        raise CatalogError(
            f"{where}.terms: use some of {', '.join(RESERVATION_TERM_MONTHS)}, got {list(terms)}"
        )
    if raw["discounts"] not in catalog.providers[name].billing:
        raise CatalogError(f"{where}.discounts: {raw['discounts']!r} is not a billing it sells")
    if raw["source"] not in catalog.sources:
        raise CatalogError(f"{where}.source: {raw['source']!r} is not in sources.toml")
    quotes: dict[str, Mapping[str, Rate]] = {}
    for itype, by_term in raw.get("quotes", {}).items():
        if (name, itype) not in catalog.instances:
            raise CatalogError(f"{where}.quotes: unknown type {itype!r}")
        stray = [t for t in by_term if t not in terms]
        if stray:
            raise CatalogError(f"{where}.quotes.{itype}: terms {stray} are not in terms")
        quotes[itype] = _table(by_term, "total", f"{where}.quotes.{itype}", catalog.sources)
    return Reservations(
        terms=terms,
        discounts=str(raw["discounts"]),
        bought_with=str(raw["bought_with"]),
        covers=str(raw["covers"]),
        live=str(raw["live"]),
        source=str(raw["source"]),
        quotes=MappingProxyType(quotes),
    )


def parse_pricing(data: Mapping[str, Any], catalog: Catalog) -> Pricing:
    """Build and cross-check Pricing from parsed TOML. Raises CatalogError on bad data."""
    try:
        meta = data["meta"]
        band_raw = meta["spot_band"]
        band_rate = _rate(
            {**band_raw, "amount": 0}, "amount", "pricing.meta.spot_band", catalog.sources
        )
        band = (float(band_raw["low"]), float(band_raw["high"]))
        if not 0 < band[0] <= band[1] <= 1:
            raise CatalogError(f"pricing.meta.spot_band: need 0 < low <= high <= 1, got {band}")
        fx: dict[tuple[str, str], Rate] = {}
        for pair, raw in data.get("fx", {}).items():
            base, _, quote = pair.partition("_")
            if not (len(base) == len(quote) == 3):
                raise CatalogError(f"pricing.fx.{pair}: name it BASE_QUOTE, e.g. USD_CNY")
            fx[(base, quote)] = _rate(raw, "rate", f"pricing.fx.{pair}", catalog.sources)
        providers = {
            name: _provider(name, data[name], catalog) for name in catalog.providers if name in data
        }
    except KeyError as exc:
        raise CatalogError(f"pricing.toml: missing key {exc}") from None
    missing = [p for p in catalog.providers if p not in providers]
    if missing:
        where = ", ".join(cloud_path(p) for p in missing)
        raise CatalogError(f"pricing: no [pricing] table in {where}")
    return Pricing(
        stale_after_days=int(meta["stale_after_days"]),
        hours_per_month=float(meta["hours_per_month"]),
        spot_band=band,
        spot_band_rate=band_rate,
        fx=MappingProxyType(fx),
        providers=MappingProxyType(providers),
    )


def shipped_pricing_data(catalog: Catalog | None = None) -> dict[str, Any]:
    """pricing.toml with each catalog cloud's [pricing] table under the cloud's name."""
    with PRICING_FILE.open("rb") as fh:
        data = tomllib.load(fh)
    for name in (catalog or load_catalog()).providers:
        if name in data:
            raise CatalogError(f"pricing.toml: [{name}] belongs in {cloud_path(name)} [pricing]")
        if "pricing" in cloud_file(name):
            data[name] = cloud_file(name)["pricing"]
    return data


def load_pricing(path: Path | str | None = None, catalog: Catalog | None = None) -> Pricing:
    """The pricing data: the shipped files (cached) or another whole file (tests, overrides)."""
    if path is None and catalog is None:
        return _load_default()
    if path is None:
        return parse_pricing(shipped_pricing_data(catalog), catalog or load_catalog())
    with Path(path).open("rb") as fh:
        return parse_pricing(tomllib.load(fh), catalog or load_catalog())


@functools.lru_cache(maxsize=1)
def _load_default() -> Pricing:
    return parse_pricing(shipped_pricing_data(), load_catalog())
