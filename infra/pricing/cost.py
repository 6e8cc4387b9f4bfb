"""The bill before `pulumi up`: compute, disks, bucket, egress and snapshots for one stack.

What a bill holds (a stack's inputs, each charge, the estimate and its JSON; docs/cost.md) and
the arithmetic that fills it in, over the catalog (instance-hour prices) and the price sheet
(infra.pricing.price_sheet: pricing.toml, everything else). No provider SDK and no Pulumi here.
The same tier compared across clouds, and the catalog against a live price, is
infra.pricing.compare (it shares the error and the warnings defined here).

Conventions:
- amounts are in the provider's currency unless a target currency is asked for; conversions use
  the dated rate in pricing.toml and say so.
- "hourly" is the compute bill for every node of the stack for one running hour; disks, bucket,
  egress and snapshots are monthly (they are billed whether or not the nodes run).
- a month is 730 hours (pricing.toml); subscription is paid for the whole month whatever the use.
- a reservation (Azure's 1- or 3-year commitment, bought apart from the VM) is owed for its whole
  term whatever the VMs do; a term is 12 or 36 of those months (8,760 or 26,280 hours).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infra.catalog import Catalog, InstanceType, Price, ProviderInfo, load_catalog
from infra.pricing.billing_modes import billing_problem
from infra.pricing.price_sheet import (
    RESERVATION_TERM_MONTHS,
    Pricing,
    ProviderPricing,
    Rate,
    load_pricing,
)
from infra.suggest import did_you_mean

# ----------------------------------------------------------------------------------------------
# what a bill holds: a stack's inputs, each charge, the estimate and its JSON

Range = tuple[float, float]


class CostError(ValueError):
    """Bad input to the cost model; `.problems` holds one line per problem, each saying the fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class CostInputs:
    """What the model needs to know about a stack (the CLI fills it from a StackConfig)."""

    provider: str
    instance_type: str
    nodes: int = 1
    billing: str = "on-demand"
    region: str | None = None  # None: the catalog's price region
    root_disk_gb: float = 200
    root_disk_class: str | None = None  # None: the provider's default in pricing.toml
    scratch_gb: float = 0  # ignored where the instance type has local NVMe (no disk is created)
    scratch_class: str | None = None
    spot_max_price: float | None = None  # per node-hour, provider currency
    subscription_months: int = 1
    hours_per_month: float | None = None  # running hours; None: pricing.toml's 730
    bucket_gb: float = 0
    bucket_class: str | None = None
    egress_gb: float = 0  # per month
    snapshot_gb: float = 0  # stored, per month
    stack: str | None = None
    tier: str | None = None
    # a reservation term to price beside the bill ("1y", "3y"): not a VM setting, the VMs
    # stay pay-as-you-go and the reservation, bought separately, discounts them
    reservation: str | None = None


@dataclass(frozen=True)
class LineItem:
    """One monthly storage/transfer charge, with the figure it came from."""

    item: str
    quantity: float
    unit: str
    unit_price: float
    amount: float
    date: dt.date
    source: str
    estimate: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "quantity": self.quantity,
            "unit": self.unit,
            "unit_price": _r(self.unit_price, 6),
            "amount": _r(self.amount),
            "date": self.date.isoformat(),
            "source": self.source,
            "estimate": self.estimate,
        }


@dataclass(frozen=True)
class Compute:
    """Compute price per running hour of the whole stack, for each billing mode."""

    on_demand: float
    spot: Range | None
    spot_estimated: bool
    subscription: float | None  # the subscription's monthly price spread over 730 hours

    def times(self, k: float) -> Compute:
        return Compute(
            on_demand=self.on_demand * k,
            spot=(self.spot[0] * k, self.spot[1] * k) if self.spot else None,
            spot_estimated=self.spot_estimated,
            subscription=None if self.subscription is None else self.subscription * k,
        )

    def to_json(self, digits: int = 4) -> dict[str, Any]:
        return {
            "on_demand": _r(self.on_demand, digits),
            "spot": [_r(self.spot[0], digits), _r(self.spot[1], digits)] if self.spot else None,
            "spot_estimated": self.spot_estimated if self.spot else None,
            "subscription": _r(self.subscription, digits),
        }


@dataclass(frozen=True)
class BreakEven:
    """Running hours per month above which the subscription is the cheaper way to pay."""

    hours_per_month: float
    utilisation: float  # of a 730-hour month

    def to_json(self) -> dict[str, Any]:
        return {"hours_per_month": _r(self.hours_per_month, 1), "utilisation": _r(self.utilisation)}


@dataclass(frozen=True)
class SpotSaving:
    fraction: Range  # (least, most) saved against on-demand, 0..1
    per_hour: Range  # (least, most) saved per stack-hour
    estimated: bool
    caveat: str

    def to_json(self) -> dict[str, Any]:
        return {
            "fraction": [_r(self.fraction[0]), _r(self.fraction[1])],
            "per_hour": [_r(self.per_hour[0]), _r(self.per_hour[1])],
            "estimated": self.estimated,
            "caveat": self.caveat,
        }


def term_words(term: str) -> str:
    """'1y' -> '1-year', '3y' -> '3-year' (how a sentence names a reservation term)."""
    return f"{RESERVATION_TERM_MONTHS[term] // 12}-year"


@dataclass(frozen=True)
class ReservationQuote:
    """A reservation's price for one VM: the total for the whole term, and where it came from.

    ``payg_node_hour`` is the pay-as-you-go price to compare it with when it was fetched the
    same way (live); None compares with the catalog's on-demand price."""

    term: str  # a key of RESERVATION_TERM_MONTHS
    total: float  # one VM, the whole term, provider currency
    date: dt.date
    source: str
    estimate: bool = False
    live: bool = False
    payg_node_hour: float | None = None
    payg_source: str | None = None


@dataclass(frozen=True)
class ReservationCost:
    """A reservation for every node of the stack, against pay-as-you-go.

    A reservation is a commitment: ``total`` is owed whatever the VMs do. Spread over the
    term's hours it is an effective hourly rate; the VMs must run more than
    ``break_even_utilisation`` of the term's hours for it to cost less than pay-as-you-go."""

    term: str
    months: int
    term_hours: float
    nodes: int
    total: float  # every node, the whole term
    payg_hourly: float  # every node, pay-as-you-go
    run_hours: float  # running hours per month the estimate assumes
    month_hours: float  # hours in the month the term is counted in (730)
    date: dt.date
    source: str
    estimate: bool
    live: bool
    payg_source: str
    bought_with: str
    covers: str

    @property
    def effective_hourly(self) -> float:
        return self.total / self.term_hours

    @property
    def per_month(self) -> float:
        """What the reservation costs each month of the term, run or idle."""
        return self.total / self.months

    @property
    def run_share(self) -> float:
        """The month's running hours at the effective rate: the part of the commitment used."""
        return self.effective_hourly * self.run_hours

    @property
    def unused_per_month(self) -> float:
        """Paid each month for reserved hours the VMs do not run (lost, not carried over)."""
        return self.per_month - self.run_share

    @property
    def payg_month(self) -> float:
        """The same running hours at pay-as-you-go."""
        return self.payg_hourly * self.run_hours

    @property
    def break_even_utilisation(self) -> float:
        """The fraction of the term's hours the VMs must run for the reservation to be cheaper."""
        return self.effective_hourly / self.payg_hourly

    @property
    def break_even_hours_per_month(self) -> float:
        return self.break_even_utilisation * self.month_hours

    @property
    def saving_at_full_use(self) -> float:
        """What it saves against pay-as-you-go when the VMs run every hour of the term."""
        return 1 - self.break_even_utilisation

    def to_json(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "months": self.months,
            "term_hours": self.term_hours,
            "nodes": self.nodes,
            "total": _r(self.total),
            "committed": _r(self.total),
            "per_month": _r(self.per_month),
            "effective_hourly": _r(self.effective_hourly, 4),
            "payg_hourly": _r(self.payg_hourly, 4),
            "payg_source": self.payg_source,
            "run_hours_per_month": self.run_hours,
            "run_share_per_month": _r(self.run_share),
            "unused_per_month": _r(self.unused_per_month),
            "payg_per_month": _r(self.payg_month),
            "break_even": {
                "utilisation": _r(self.break_even_utilisation, 4),
                "hours_per_month": _r(self.break_even_hours_per_month, 1),
            },
            "saving_at_full_use": _r(self.saving_at_full_use, 4),
            "date": self.date.isoformat(),
            "source": self.source,
            "live": self.live,
            "estimate": self.estimate,
            "bought_separately": True,
            "bought_with": self.bought_with,
            "covers": self.covers,
        }


@dataclass(frozen=True)
class CostEstimate:
    inputs: CostInputs
    currency: str
    native_currency: str
    fx: Rate | None  # the exchange rate applied, when currency != native_currency
    price_region: str
    gpu: str
    gpus_per_node: int
    hours_per_month: float
    hourly: Compute  # whole stack, per running hour
    subscription_month: float | None  # whole stack, one month at the chosen term
    subscription_year: float | None  # whole stack, one year at the yearly rate
    storage: tuple[LineItem, ...]
    break_even: BreakEven | None
    spot_saving: SpotSaving | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    subscription_estimated: bool = False  # from a discount factor, not a quoted price
    reservation: ReservationCost | None = None  # priced only when inputs.reservation asks

    @property
    def storage_monthly(self) -> float:
        return sum(item.amount for item in self.storage)

    @property
    def compute_monthly(self) -> Compute:
        """Compute per month at `hours_per_month` running hours; subscription is the full price."""
        h = self.hours_per_month
        per_hour = self.hourly.times(h)
        return replace(per_hour, subscription=self.subscription_month)

    @property
    def monthly_total(self) -> Compute:
        c, s = self.compute_monthly, self.storage_monthly
        return Compute(
            on_demand=c.on_demand + s,
            spot=(c.spot[0] + s, c.spot[1] + s) if c.spot else None,
            spot_estimated=c.spot_estimated,
            subscription=None if c.subscription is None else c.subscription + s,
        )

    def selected(self, per: Compute) -> float | Range:
        billing = self.inputs.billing
        if billing == "spot":
            assert per.spot is not None  # spot is always priced (catalog range or band)
            return per.spot
        if billing == "subscription":
            assert per.subscription is not None  # checked in estimate_cost
            return per.subscription
        return per.on_demand

    def to_json(self) -> dict[str, Any]:
        """The JSON contract of `scripts/cost.py --json` (docs/cost.md)."""
        sel_hourly = self.selected(self.hourly)
        sel_monthly = self.selected(self.monthly_total)
        doc = {
            "stack": self.inputs.stack,
            "tier": self.inputs.tier,
            "provider": self.inputs.provider,
            "region": self.inputs.region or self.price_region,
            "price_region": self.price_region,
            "instance_type": self.inputs.instance_type,
            "gpu": self.gpu,
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.inputs.nodes,
            "billing": self.inputs.billing,
            "currency": self.currency,
            "fx": _fx_dict(self.native_currency, self.currency, self.fx),
            "hourly": {**self.hourly.to_json(), "selected": _rr(sel_hourly, 4)},
            "daily": self.hourly.times(24).to_json(2),
            "monthly": {
                "hours": self.hours_per_month,
                "compute": self.compute_monthly.to_json(2),
                "storage": [item.to_json() for item in self.storage],
                "storage_total": _r(self.storage_monthly),
                "total": self.monthly_total.to_json(2),
                "selected": _rr(sel_monthly, 2),
            },
            "subscription": None
            if self.subscription_month is None
            else {
                "months": self.inputs.subscription_months,
                "per_month": _r(self.subscription_month),
                "per_year": _r(self.subscription_year),
                "estimated": self.subscription_estimated,
            },
            "break_even": self.break_even.to_json() if self.break_even else None,
            "spot_saving": self.spot_saving.to_json() if self.spot_saving else None,
            "warnings": list(self.warnings),
        }
        if self.inputs.reservation is not None:  # the key appears only when one is asked for
            res = self.reservation
            doc["reservation"] = None if res is None else res.to_json()
        return doc


# ----------------------------------------------------------------------------------------------
# helpers


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _rr(value: float | Range, digits: int) -> float | list[float]:
    if isinstance(value, tuple):
        return [round(value[0], digits), round(value[1], digits)]
    return round(value, digits)


def _fx_dict(native: str, target: str, rate: Rate | None) -> dict[str, Any] | None:
    if rate is None:
        return None
    return {
        "from": native,
        "to": target,
        "rate": rate.amount,
        "date": rate.date.isoformat(),
        "source": rate.source,
    }


class Warnings:
    """Collects one line per stale or estimated figure that feeds a number on the bill."""

    def __init__(self, pricing: Pricing, today: dt.date):
        self.pricing, self.today = pricing, today
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def check(
        self,
        what: str,
        date: dt.date,
        source: str,
        estimate: bool = False,
        refresh: str = "refresh the catalog",
    ) -> None:
        """``refresh`` says how: the instance prices name the command that refreshes them."""
        age = (self.today - date).days
        limit = self.pricing.stale_after_days
        if age > limit:
            self.add(
                f"{what}: figure from {source} dated {date.isoformat()} is {age} days old "
                f"(> {limit}): {refresh} or check with --live"
            )
        if estimate:
            self.add(f"{what}: an estimate ({source}), not a quoted price: verify before relying")

    def rate(self, what: str, rate: Rate) -> None:
        self.check(what, rate.date, rate.source, rate.estimate)


def stale_days(date: dt.date, today: dt.date, limit: int) -> int | None:
    """Days past the limit a price is, or None when it is fresh enough."""
    age = (today - date).days
    return age if age > limit else None


# ----------------------------------------------------------------------------------------------
# the cost model

MAX_HOURS_PER_MONTH = 744.0  # 31 days: more running hours than that is a typo, not a plan


# ----------------------------------------------------------------------------------------------
# helpers


def _normalise_class(name: str | None, table: Mapping[str, Rate], default: str) -> str | None:
    """Accept the config's spellings (PL1, gp3) and the API's (cloud_essd_pl1, GP3)."""
    if name is None or name == "":
        return default
    key = name.strip()
    if key in table:
        return key
    folded = {k.lower(): k for k in table}
    k = key.lower().removeprefix("cloud_essd_").removeprefix("essd_")
    return folded.get(k) or folded.get(key.lower())


def _priced_instance(
    catalog: Catalog, provider: str, name: str
) -> tuple[InstanceType | None, str | None]:
    """The instance type, or a problem line saying why it cannot be priced."""
    it = catalog.instances.get((provider, name))
    if it is None:
        names = [n for (p, n) in catalog.instances if p == provider]
        return None, (
            f"instance type {name!r} is not in the {provider} catalog" + did_you_mean(name, names)
        )
    if it.price is None:
        return (
            it,
            f"{provider} {name} has no price in the catalog: "
            f"add one to infra/clouds/{provider}/catalog.toml",
        )
    return it, None


def subscription_month_price(
    it: InstanceType, pp: ProviderPricing, hours_per_month: float
) -> tuple[float, Rate] | None:
    """One node's monthly PrePaid price and the figure it rests on: the type's quote, else a
    factor of on-demand where pricing.toml gives one, else None (not sold as a subscription)."""
    if pp.subscription is None or it.price is None:
        return None
    quote = pp.subscription.monthly.get(it.name)
    if quote is not None:
        return quote.amount, quote
    factor = pp.subscription.monthly_factor
    if factor is None:
        return None
    return it.price.on_demand * hours_per_month * factor.amount, factor


# ----------------------------------------------------------------------------------------------
# the model: estimate_cost checks the inputs, then prices compute, storage and a reservation,
# one named part each


@dataclass(frozen=True)
class _Checked:
    """The inputs after validation, resolved against the catalog and the pricing data."""

    pp: ProviderPricing
    info: ProviderInfo
    it: InstanceType
    price: Price
    hours: float  # running hours per month
    root_class: str
    scratch_class: str
    bucket_class: str
    currency: str  # the target currency
    k: float  # native -> target
    fx: Rate | None


def _reservation_problem(inputs: CostInputs, pp: ProviderPricing) -> str | None:
    """Why the reservation asked for cannot be priced on this cloud (None: it can, or none
    was asked for). Whether a cloud sells reservations is its catalog file's data."""
    term = inputs.reservation
    if term is None:
        return None
    if term not in RESERVATION_TERM_MONTHS:
        return (
            f"reservation term {term!r} is unknown: use one of {', '.join(RESERVATION_TERM_MONTHS)}"
            + did_you_mean(term, RESERVATION_TERM_MONTHS)
        )
    res = pp.reservations
    if res is None:
        return (
            f"{inputs.provider} sells no reservations through this tool (its catalog file, "
            f"infra/clouds/{inputs.provider}/catalog.toml, has no [pricing.reservations])"
        )
    if term not in res.terms:
        return f"{inputs.provider} sells no {term} reservation: use one of {', '.join(res.terms)}"
    if inputs.billing != res.discounts:
        return (
            f"{inputs.provider} reservations discount {res.discounts} VMs, not {inputs.billing}: "
            f"set billing to {res.discounts} (the reservation is bought separately)"
        )
    return None


def _check_inputs(inputs: CostInputs, cat: Catalog, prc: Pricing, currency: str | None) -> _Checked:
    """Every problem with the inputs at once (CostError), or what the pricing parts need."""
    problems: list[str] = []
    pp = prc.providers.get(inputs.provider)
    if pp is None:
        raise CostError(
            [
                f"provider {inputs.provider!r} is unknown: use one of {', '.join(prc.providers)}"
                + did_you_mean(inputs.provider, prc.providers)
            ]
        )
    it, why = _priced_instance(cat, inputs.provider, inputs.instance_type)
    if why:
        problems.append(why)
    info = cat.providers[inputs.provider]
    billing_why = billing_problem(inputs.billing, inputs.provider, cat)
    if billing_why:
        problems.append(billing_why)
    if not isinstance(inputs.nodes, int) or isinstance(inputs.nodes, bool) or inputs.nodes < 1:
        problems.append(f"nodes must be a whole number >= 1, got {inputs.nodes!r}")
    hours = prc.hours_per_month if inputs.hours_per_month is None else inputs.hours_per_month
    if not 0 <= hours <= MAX_HOURS_PER_MONTH:
        problems.append(
            f"hours per month must be between 0 and {MAX_HOURS_PER_MONTH:g} "
            f"(a 31-day month), got {hours:g}"
        )
    for label, value in (
        ("root disk GB", inputs.root_disk_gb),
        ("scratch GB", inputs.scratch_gb),
        ("bucket storage GB", inputs.bucket_gb),
        ("egress GB", inputs.egress_gb),
        ("snapshot GB", inputs.snapshot_gb),
    ):
        if value < 0:
            problems.append(f"{label} must be >= 0, got {value:g}")
    if inputs.subscription_months < 1:
        problems.append(f"subscription months must be >= 1, got {inputs.subscription_months}")
    if inputs.spot_max_price is not None and inputs.spot_max_price <= 0:
        problems.append(f"spot max price must be above 0, got {inputs.spot_max_price:g}")
    root_class = _normalise_class(inputs.root_disk_class, pp.block, pp.root_disk_class)
    if root_class is None:
        problems.append(
            f"root disk class {inputs.root_disk_class!r} has no {inputs.provider} price: "
            f"use one of {', '.join(pp.block)}"
            + did_you_mean(str(inputs.root_disk_class), pp.block)
        )
    scratch_class = _normalise_class(inputs.scratch_class, pp.block, pp.root_disk_class)
    if scratch_class is None:
        problems.append(
            f"scratch class {inputs.scratch_class!r} has no {inputs.provider} price: "
            f"use one of {', '.join(pp.block)}" + did_you_mean(str(inputs.scratch_class), pp.block)
        )
    bucket_class = inputs.bucket_class or pp.bucket_class
    if bucket_class not in pp.bucket:
        problems.append(
            f"bucket class {bucket_class!r} is unknown on {inputs.provider}: "
            f"use one of {', '.join(pp.bucket)}" + did_you_mean(bucket_class, pp.bucket)
        )
    target = (currency or pp.currency).upper()  # currency codes are case-blind: cny is CNY
    try:
        k, fx = prc.fx_rate(pp.currency, target)
    except KeyError:
        problems.append(
            f"unknown currency {target!r}: use one of {', '.join(prc.currencies)}"
            + did_you_mean(target, prc.currencies)
        )
        k, fx = 1.0, None
    reservation = _reservation_problem(inputs, pp)
    if reservation:
        problems.append(reservation)
    if problems:
        raise CostError(problems)
    assert it is not None and it.price is not None and root_class and scratch_class
    return _Checked(
        pp, info, it, it.price, hours, root_class, scratch_class, bucket_class, target, k, fx
    )


def check_cost_inputs(
    inputs: CostInputs,
    *,
    currency: str | None = None,
    catalog: Catalog | None = None,
    pricing: Pricing | None = None,
) -> None:
    """Raise CostError with every problem estimate_cost would find in the inputs, without
    pricing anything (the CLI calls it before asking a live API for a price)."""
    _check_inputs(inputs, catalog or load_catalog(), pricing or load_pricing(), currency)


def _spot_range(
    inputs: CostInputs, c: _Checked, prc: Pricing, warn: Warnings, label: str
) -> tuple[Range, bool]:
    """One node's spot range per hour (native currency, capped at the max price) and whether
    it is estimated from the band rather than observed."""
    price, billing = c.price, inputs.billing
    if price.spot:
        spot: Range = price.spot
        estimated = False
        if billing == "spot":
            warn.check(
                f"{label} spot range",
                price.spot_date or price.date,
                price.spot_source or price.source,
            )
    else:
        lo, hi = prc.spot_band
        spot = (price.on_demand * lo, price.on_demand * hi)
        estimated = True
        if billing == "spot":
            warn.add(
                f"{label} spot: no observed range in the catalog; estimated as "
                f"{lo:.0%}-{hi:.0%} of on-demand ({prc.spot_band_rate.source})"
            )
    if inputs.spot_max_price is not None:
        cap = inputs.spot_max_price
        if cap < spot[0] and billing == "spot":
            warn.add(
                f"spot max price {cap:g} {c.pp.currency}/h is below the lowest recent spot price "
                f"{spot[0]:g}: nodes may not start, or be reclaimed often"
            )
        spot = (min(spot[0], cap), min(spot[1], cap))
    return spot, estimated


@dataclass(frozen=True)
class _SubscriptionTerms:
    node_month: float | None  # one node, one month at the chosen term (native currency)
    node_year: float | None
    estimated: bool


def _subscription_terms(
    inputs: CostInputs, c: _Checked, prc: Pricing, warn: Warnings, label: str
) -> _SubscriptionTerms:
    """One node's PrePaid month and year; refuses subscription billing without a quote."""
    pp, billing = c.pp, inputs.billing
    month = prc.hours_per_month  # hours in the month subscriptions are priced over
    sub = subscription_month_price(c.it, pp, month) if "subscription" in c.info.billing else None
    if sub is None or pp.subscription is None:
        if billing == "subscription":
            raise CostError(
                [
                    f"{label} has no subscription quote: add its monthly price under "
                    "[pricing.subscription.monthly] in "
                    f"infra/clouds/{inputs.provider}/catalog.toml, or use on-demand or spot"
                ]
            )
        return _SubscriptionTerms(None, None, False)
    node_month, rate = sub
    estimated = rate.estimate
    yearly = pp.subscription.yearly_factor
    node_year = node_month * 12 * yearly
    if inputs.subscription_months % 12 == 0:
        node_month = node_month * yearly
        estimated = estimated or pp.subscription.yearly.estimate
        if billing == "subscription":
            warn.rate(f"{label} yearly subscription factor", pp.subscription.yearly)
    if billing == "subscription":
        warn.rate(f"{label} subscription", rate)
    return _SubscriptionTerms(node_month, node_year, estimated)


def _storage_items(inputs: CostInputs, c: _Checked, warn: Warnings) -> tuple[LineItem, ...]:
    """Disks, bucket, egress and snapshots per month, in the target currency."""
    pp, it, k, nodes = c.pp, c.it, c.k, inputs.nodes
    items: list[LineItem] = []

    def add(item: str, qty: float, unit: str, rate: Rate, chargeable: float | None = None) -> None:
        if qty <= 0:
            return
        billable = qty if chargeable is None else chargeable
        items.append(
            LineItem(
                item,
                qty,
                unit,
                rate.amount * k,
                billable * rate.amount * k,
                rate.date,
                rate.source,
                rate.estimate,
                rate.note,
            )
        )
        if billable > 0:
            warn.rate(item, rate)

    add(
        f"root disks ({c.root_class}, {nodes}x {inputs.root_disk_gb:g} GB)",
        inputs.root_disk_gb * nodes,
        "GB-month",
        pp.block[c.root_class],
    )
    if it.nvme_count == 0:
        add(
            f"scratch disks ({c.scratch_class}, {nodes}x {inputs.scratch_gb:g} GB)",
            inputs.scratch_gb * nodes,
            "GB-month",
            pp.block[c.scratch_class],
        )
    elif inputs.scratch_gb > 0:
        warn.add(
            f"{it.name} has {it.nvme_count}x {it.nvme_gb} GB local NVMe: scratch uses it "
            "(included in the instance price; erased on stop)"
        )
    add(f"bucket ({c.bucket_class})", inputs.bucket_gb, "GB-month", pp.bucket[c.bucket_class])
    add(
        "data transfer out",
        inputs.egress_gb,
        "GB",
        pp.egress.rate,
        chargeable=max(0.0, inputs.egress_gb - pp.egress.free_gb),
    )
    add("snapshots", inputs.snapshot_gb, "GB-month", pp.snapshot)
    return tuple(items)


def _spot_saving(hourly: Compute, pp: ProviderPricing) -> SpotSaving | None:
    if hourly.spot is None or hourly.on_demand <= 0:
        return None
    od = hourly.on_demand
    return SpotSaving(
        fraction=(1 - hourly.spot[1] / od, 1 - hourly.spot[0] / od),
        per_hour=(od - hourly.spot[1], od - hourly.spot[0]),
        estimated=hourly.spot_estimated,
        caveat=(
            f"{pp.spot_caveat} ({pp.spot_caveat_source}): checkpoint to the bucket often, "
            "and expect restarts"
        ),
    )


def catalog_reservation_quote(
    provider: str, instance_type: str, term: str, pricing: Pricing | None = None
) -> ReservationQuote | None:
    """The catalog's dated total for one VM's reservation term, or None (none carried)."""
    pp = (pricing or load_pricing()).providers.get(provider)
    res = pp.reservations if pp else None
    rate = res.quotes.get(instance_type, {}).get(term) if res else None
    if rate is None:
        return None
    return ReservationQuote(term, rate.amount, rate.date, rate.source, estimate=rate.estimate)


def _reservation_cost(
    inputs: CostInputs,
    c: _Checked,
    prc: Pricing,
    warn: Warnings,
    label: str,
    quote: ReservationQuote | None,
) -> ReservationCost | None:
    """The reservation asked for, priced from the quote given (a live one) or the catalog's."""
    term = inputs.reservation
    res = c.pp.reservations
    if term is None or res is None:
        return None
    quote = quote or catalog_reservation_quote(inputs.provider, c.it.name, term, prc)
    words = term_words(term)
    if quote is None:
        raise CostError(
            [
                f"{label}: the catalog carries no dated {words} reservation price; "
                f"add --live to fetch it from {res.live}"
            ]
        )
    if quote.term != term:
        raise ValueError(f"a {quote.term} quote cannot price a {term} reservation")
    if not quote.live:  # a live price is today's: its source and date show beside it
        warn.check(f"{label} {words} reservation", quote.date, quote.source, quote.estimate)
    if quote.payg_node_hour is None:
        payg, payg_source = c.price.on_demand, f"catalog, {c.price.source} {c.price.date}"
        if quote.live:
            warn.add(
                f"{label} reservation break-even: a live reservation price against the "
                f"catalog's pay-as-you-go price of {c.price.date.isoformat()} (the live "
                "pay-as-you-go price could not be fetched)"
            )
    else:
        payg, payg_source = quote.payg_node_hour, quote.payg_source or "live"
    months = RESERVATION_TERM_MONTHS[term]
    return ReservationCost(
        term=term,
        months=months,
        term_hours=months * prc.hours_per_month,
        nodes=inputs.nodes,
        total=quote.total * inputs.nodes * c.k,
        payg_hourly=payg * inputs.nodes * c.k,
        run_hours=c.hours,
        month_hours=prc.hours_per_month,
        date=quote.date,
        source=quote.source,
        estimate=quote.estimate,
        live=quote.live,
        payg_source=payg_source,
        bought_with=res.bought_with,
        covers=res.covers,
    )


def estimate_cost(
    inputs: CostInputs,
    *,
    currency: str | None = None,
    catalog: Catalog | None = None,
    pricing: Pricing | None = None,
    today: dt.date | None = None,
    reservation_quote: ReservationQuote | None = None,
) -> CostEstimate:
    """The bill for one stack. Raises CostError listing every problem with the inputs.

    With ``inputs.reservation`` the estimate also prices that reservation term, from
    ``reservation_quote`` (a live price) or else the catalog's dated quote."""
    cat = catalog or load_catalog()
    prc = pricing or load_pricing()
    today = today or dt.date.today()
    c = _check_inputs(inputs, cat, prc, currency)

    warn = Warnings(prc, today)
    price, pp, nodes = c.price, c.pp, inputs.nodes
    month = prc.hours_per_month  # hours in the month subscriptions are priced over
    label = f"{inputs.provider} {c.it.name}"
    warn.check(
        f"{label} on-demand",
        price.date,
        price.source,
        price.estimate,
        refresh=f"refresh with `make refresh-prices CLOUD={inputs.provider}`",
    )
    if inputs.region and inputs.region != price.region:
        warn.add(
            f"prices are the catalog's for {price.region}; {inputs.region} may differ: "
            "check with --live"
        )
    if c.fx is not None:
        warn.rate(f"exchange rate {pp.currency}->{c.currency}", c.fx)

    spot, spot_estimated = _spot_range(inputs, c, prc, warn, label)
    sub = _subscription_terms(inputs, c, prc, warn, label)
    hourly = Compute(
        on_demand=price.on_demand * nodes,
        spot=(spot[0] * nodes, spot[1] * nodes),
        spot_estimated=spot_estimated,
        subscription=None if sub.node_month is None else sub.node_month * nodes / month,
    ).times(c.k)
    storage = _storage_items(inputs, c, warn)
    break_even = None
    if hourly.subscription is not None and hourly.on_demand > 0:
        assert sub.node_month is not None
        be_hours = (sub.node_month * nodes * c.k) / hourly.on_demand
        break_even = BreakEven(be_hours, be_hours / month)
    reservation = _reservation_cost(inputs, c, prc, warn, label, reservation_quote)
    return CostEstimate(
        inputs=inputs,
        currency=c.currency,
        native_currency=pp.currency,
        fx=c.fx,
        price_region=price.region,
        gpu=c.it.gpu,
        gpus_per_node=c.it.gpus,
        hours_per_month=c.hours,
        hourly=hourly,
        subscription_month=None if sub.node_month is None else sub.node_month * nodes * c.k,
        subscription_year=None if sub.node_year is None else sub.node_year * nodes * c.k,
        storage=storage,
        break_even=break_even,
        spot_saving=_spot_saving(hourly, pp),
        warnings=tuple(warn.lines),
        subscription_estimated=sub.estimated,
        reservation=reservation,
    )


def hourly_estimate(
    provider: str,
    instance_type: str,
    nodes: int = 1,
    billing: str = "on-demand",
    *,
    spot_max_price: float | None = None,
    subscription_months: int = 1,
    region: str | None = None,
    currency: str | None = None,
    catalog: Catalog | None = None,
    pricing: Pricing | None = None,
    today: dt.date | None = None,
) -> dict[str, Any]:
    """The stack output `hourly_cost`: {"currency", "billing", "amount", ...} for all nodes.

    For spot, `amount` is the top of the range (what to budget for) and `low`/`high` bound it;
    for subscription, `amount` is the monthly price spread over 730 hours.
    """
    est = estimate_cost(
        CostInputs(
            provider=provider,
            instance_type=instance_type,
            nodes=nodes,
            billing=billing,
            spot_max_price=spot_max_price,
            subscription_months=subscription_months,
            region=region,
            root_disk_gb=0,  # compute only: disks are on the monthly bill, not the hourly rate
        ),
        currency=currency,
        catalog=catalog,
        pricing=pricing,
        today=today,
    )
    cat = catalog or load_catalog()
    price = cat.instance(provider, instance_type).price
    assert price is not None  # estimate_cost refused unpriced types
    selected = est.selected(est.hourly)
    # an observed spot range carries its own date and source; the on-demand figure's would
    # claim the range is as fresh (and from the same page) as the on-demand price
    date, source = price.date, price.source
    if billing == "spot" and price.spot and not est.hourly.spot_estimated:
        date, source = price.spot_date or price.date, price.spot_source or price.source
    out: dict[str, Any] = {
        "currency": est.currency,
        "billing": billing,
        "amount": round(selected[1] if isinstance(selected, tuple) else selected, 4),
        "nodes": nodes,
        "instance_type": instance_type,
        "price_date": date.isoformat(),
        "source": source,
        "estimate": (billing == "spot" and est.hourly.spot_estimated)
        or (billing == "subscription" and est.subscription_estimated)
        or (billing == "on-demand" and price.estimate),
        "warnings": list(est.warnings),
    }
    if isinstance(selected, tuple):
        out["low"], out["high"] = round(selected[0], 4), round(selected[1], 4)
    return out
