"""What a bill holds: a stack's inputs, each charge, the estimate and its JSON (docs/cost.md).

The cost model (infra.pricing.cost) fills these in; the comparison (infra.pricing.compare)
shares the error and the warnings. Conventions are cost.py's: amounts in the provider's
currency unless a target currency is asked for, "hourly" for every node of the stack for one
running hour, storage and transfer per month.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infra.pricing.prices import RESERVATION_TERM_MONTHS, Pricing, Rate

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

    def check(self, what: str, date: dt.date, source: str, estimate: bool = False) -> None:
        age = (self.today - date).days
        limit = self.pricing.stale_after_days
        if age > limit:
            self.add(
                f"{what}: figure from {source} dated {date.isoformat()} is {age} days old "
                f"(> {limit}): refresh the catalog or check with --live"
            )
        if estimate:
            self.add(f"{what}: an estimate ({source}), not a quoted price: verify before relying")

    def rate(self, what: str, rate: Rate) -> None:
        self.check(what, rate.date, rate.source, rate.estimate)


def stale_days(date: dt.date, today: dt.date, limit: int) -> int | None:
    """Days past the limit a price is, or None when it is fresh enough."""
    age = (today - date).days
    return age if age > limit else None
