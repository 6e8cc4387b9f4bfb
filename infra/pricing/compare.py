"""The same price compared: a tier across clouds, regions, billing modes and profiles, and
the catalog against a cloud's live price.

Pure arithmetic over the catalog and pricing.toml, like the cost model whose subscription
price it reuses. `scripts/cost.py --compare` renders a Comparison; `--live` asks the cloud's
prices.py (infra/clouds/<name>/) for today's price and sets it against the catalog's in a
LiveCheck.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from infra.catalog import Catalog, InstanceType, load_catalog
from infra.pricing.cost import CostError, Range, Warnings, stale_days, subscription_month_price
from infra.pricing.price_sheet import Pricing, ProviderPricing, Rate, load_pricing
from infra.suggest import did_you_mean

SORT_KEYS = ("gpu-hour", "tflop-hour")


@dataclass(frozen=True)
class Offer:
    """One way to rent a tier: provider, region, profile, instance type and billing mode."""

    tier: str
    provider: str
    region: str
    profile: str
    instance_type: str
    gpu: str
    gpus: int
    billing: str  # on-demand | spot | subscription-month | subscription-year
    currency: str
    per_gpu_hour: float  # point used for sorting (spot: middle of the range)
    per_gpu_hour_range: Range | None  # spot only
    peak_tflops: float  # the GPU's dense peak in its training dtype
    native_currency: str
    native_node_hour: float
    price_date: dt.date
    source: str
    estimate: bool
    stale: bool

    @property
    def per_tflop_hour(self) -> float:
        return self.per_gpu_hour / self.peak_tflops

    @property
    def label(self) -> str:
        profile = "" if self.profile == "general" else f" [{self.profile}]"
        return f"{self.provider} {self.instance_type}{profile} {self.billing}"

    def to_json(self) -> dict[str, Any]:
        rng = self.per_gpu_hour_range
        return {
            "provider": self.provider,
            "region": self.region,
            "profile": self.profile,
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "billing": self.billing,
            "currency": self.currency,
            "per_gpu_hour": round(self.per_gpu_hour, 4),
            "per_gpu_hour_range": [round(rng[0], 4), round(rng[1], 4)] if rng else None,
            "per_tflop_hour": round(self.per_tflop_hour, 6),
            "peak_tflops": self.peak_tflops,
            "node_hour_native": round(self.native_node_hour, 4),
            "native_currency": self.native_currency,
            "price_date": self.price_date.isoformat(),
            "source": self.source,
            "estimate": self.estimate,
            "stale": self.stale,
        }


@dataclass(frozen=True)
class Comparison:
    tier: str
    currency: str
    sort_by: str
    offers: tuple[Offer, ...]
    fx: tuple[Rate, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "currency": self.currency,
            "sort_by": self.sort_by,
            "fx": [
                {"rate": r.amount, "date": r.date.isoformat(), "source": r.source} for r in self.fx
            ],
            "offers": [o.to_json() for o in self.offers],
            "warnings": list(self.warnings),
        }


def _offers(
    tier: str,
    profile: str,
    it: InstanceType,
    cat: Catalog,
    prc: Pricing,
    currency: str,
    k: float,
    today: dt.date,
) -> list[Offer]:
    """One instance type's offers: on-demand, spot (observed or band), subscription terms."""
    info = cat.providers[it.provider]
    pp = prc.providers[it.provider]
    on_demand = _on_demand_offer(tier, profile, it, cat, prc, currency, k, today)
    out = [on_demand]
    if "spot" in info.billing:
        out.append(_spot_offer(on_demand, it, prc, k, today))
    if "subscription" in info.billing:
        out += _subscription_offers(on_demand, it, pp, prc.hours_per_month, k)
    return out


def _on_demand_offer(
    tier: str,
    profile: str,
    it: InstanceType,
    cat: Catalog,
    prc: Pricing,
    currency: str,
    k: float,
    today: dt.date,
) -> Offer:
    """The on-demand offer; the spot and subscription offers are copies of it."""
    price = it.price
    assert price is not None
    return Offer(
        tier=tier,
        provider=it.provider,
        region=cat.providers[it.provider].price_region,
        profile=profile,
        instance_type=it.name,
        gpu=it.gpu,
        gpus=it.gpus,
        billing="on-demand",
        currency=currency,
        per_gpu_hour=price.on_demand * (k / it.gpus),
        per_gpu_hour_range=None,
        peak_tflops=cat.gpu_for(it).peak_tflops,
        native_currency=prc.providers[it.provider].currency,
        native_node_hour=price.on_demand,
        price_date=price.date,
        source=price.source,
        estimate=price.estimate,
        stale=stale_days(price.date, today, prc.stale_after_days) is not None,
    )


def _spot_offer(
    on_demand: Offer, it: InstanceType, prc: Pricing, k: float, today: dt.date
) -> Offer:
    """Spot at the middle of its observed range, or of pricing.toml's band (an estimate)."""
    price = it.price
    assert price is not None
    per_gpu = k / it.gpus
    if price.spot:
        lo, hi = price.spot
        date, source, estimate = (
            price.spot_date or price.date,
            price.spot_source or price.source,
            False,
        )
    else:
        lo, hi = (price.on_demand * f for f in prc.spot_band)
        date, source, estimate = price.date, price.source, True
    mid = (lo + hi) / 2
    return replace(
        on_demand,
        billing="spot",
        per_gpu_hour=mid * per_gpu,
        per_gpu_hour_range=(lo * per_gpu, hi * per_gpu),
        native_node_hour=mid,
        price_date=date,
        source=source,
        estimate=estimate,
        stale=stale_days(date, today, prc.stale_after_days) is not None,
    )


def _subscription_offers(
    on_demand: Offer, it: InstanceType, pp: ProviderPricing, hours: float, k: float
) -> list[Offer]:
    """A month's and a year's term per running hour; none without a subscription price."""
    price = it.price
    assert price is not None
    sub = subscription_month_price(it, pp, hours)
    if sub is None or pp.subscription is None:
        return []
    month, rate = sub
    quoted = pp.subscription.monthly.get(it.name) is rate
    source = rate.source if quoted else f"{price.source} x {rate.source}"
    yearly = pp.subscription.yearly
    terms = (
        ("subscription-month", month / hours, rate.estimate, source),
        (
            "subscription-year",
            month * yearly.amount / hours,
            rate.estimate or yearly.estimate,
            f"{source} x {yearly.source}",
        ),
    )
    return [
        replace(
            on_demand,
            billing=billing,
            per_gpu_hour=node_hour * (k / it.gpus),
            native_node_hour=node_hour,
            estimate=estimate,
            source=src,
        )
        for billing, node_hour, estimate, src in terms
    ]


def compare_tier(
    tier: str,
    *,
    currency: str = "USD",
    sort_by: str = "gpu-hour",
    catalog: Catalog | None = None,
    pricing: Pricing | None = None,
    today: dt.date | None = None,
) -> Comparison:
    """Every priced offer of a tier, cheapest first by GPU-hour (or by reference TFLOP-hour)."""
    cat = catalog or load_catalog()
    prc = pricing or load_pricing()
    today = today or dt.date.today()
    problems = []
    # tier names and currency codes are case-blind (`--compare A100x8 --currency cny`)
    tier = next((t for t in cat.tiers if t.casefold() == tier.strip().casefold()), tier)
    currency = currency.strip().upper()
    if tier not in cat.tiers:
        problems.append(
            f"unknown tier {tier!r}{did_you_mean(tier, cat.tiers)}: "
            f"known tiers are {', '.join(cat.tiers)}"
        )
    if currency not in prc.currencies:
        problems.append(
            f"unknown currency {currency!r}{did_you_mean(currency, prc.currencies)}: "
            f"use one of {', '.join(prc.currencies)}"
        )
    if sort_by not in SORT_KEYS:
        problems.append(f"sort by {sort_by!r} is unknown: use one of {', '.join(SORT_KEYS)}")
    if problems:
        raise CostError(problems)

    t = cat.tiers[tier]
    warn = Warnings(prc, today)
    limit = prc.stale_after_days
    offers: list[Offer] = []
    fx_used: list[Rate] = []
    for provider, profiles in t.offers.items():
        pp = prc.providers[provider]
        k, fx = prc.fx_rate(pp.currency, currency)
        if fx is not None and fx not in fx_used:
            fx_used.append(fx)
            warn.rate(f"exchange rate {pp.currency}->{currency}", fx)
        for profile, name in profiles.items():
            it = cat.instance(provider, name)
            if it.price is None:
                warn.add(f"{provider} {name} ({profile}) has no price in the catalog: left out")
                continue
            if stale_days(it.price.date, today, limit) is not None or it.price.estimate:
                warn.check(
                    f"{provider} {name} on-demand",
                    it.price.date,
                    it.price.source,
                    it.price.estimate,
                )
            offers.extend(_offers(tier, profile, it, cat, prc, currency, k, today))
    for provider, info in cat.providers.items():
        # A cloud without the tier still gets a line: what it has nearest, and where to look.
        near = [a for a in cat.alternatives(tier, provider) if a.provider == provider]
        if provider not in t.offers and near:
            names = "; ".join(f"{a.instance_type} ({a.gpus}x {a.gpu})" for a in near)
            other = cat.tier_of(provider, near[0].instance_type)
            see = f" (see --compare {other})" if other else ""
            warn.add(f"{info.title} offers no {tier}; its nearest: {names}{see}")
    if any(o.billing == "spot" and o.estimate for o in offers):
        lo, hi = prc.spot_band
        warn.add(
            f"spot rows marked estimate use {lo:.0%}-{hi:.0%} of on-demand "
            "(no observed spot range in the catalog)"
        )
    if any(o.billing.startswith("subscription") and o.estimate for o in offers):
        warn.add(
            "subscription rows marked estimate rest on an unquoted factor (the yearly "
            "discount, or on-demand x a monthly factor): quote the real PrePaid price before "
            "committing (rows assume 100 % use)"
        )
    key = (
        (lambda o: (o.per_gpu_hour, o.provider, o.instance_type, o.billing))
        if sort_by == "gpu-hour"
        else (lambda o: (o.per_tflop_hour, o.provider, o.instance_type, o.billing))
    )
    offers.sort(key=key)
    return Comparison(tier, currency, sort_by, tuple(offers), tuple(fx_used), tuple(warn.lines))


# ----------------------------------------------------------------------------------------------
# the catalog against a live price (the cloud's prices.py fetches it, scripts/cost.py asks)


@dataclass(frozen=True)
class LiveCheck:
    provider: str
    instance_type: str
    region: str
    currency: str
    catalog: float
    live: float

    @property
    def off(self) -> float:
        """How far the catalog is from the live price, as a fraction of the live price."""
        return (self.catalog - self.live) / self.live

    def message(self) -> str:
        where = f"{self.provider} {self.instance_type} in {self.region}"
        base = (
            f"{where}: catalog {self.catalog:g} {self.currency}/h, "
            f"live {self.live:g} {self.currency}/h"
        )
        if abs(self.off) < 0.005:
            return f"{base}: the catalog is current"
        side = "above" if self.off > 0 else "below"
        return f"{base}: the catalog is {abs(self.off):.1%} {side} the live price"

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "region": self.region,
            "currency": self.currency,
            "catalog": self.catalog,
            "live": self.live,
            "off": round(self.off, 4),
        }
