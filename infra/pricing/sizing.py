"""Which tier fits a training run, how long it takes and what the whole run costs on each cloud.

Pure arithmetic over the catalog (GPUs, tiers, prices), pricing.toml (spot band, subscription
quotes, exchange rates), models.toml (published model shapes) and sizing.toml (the planning
assumptions). No provider SDK, no Pulumi, no network; the only I/O is reading the TOML files and,
for calibration, the verify-gpu reports under reports/. `scripts/size.py` is the command line.

The run is infra.pricing.workload; the memory and time formulas, with their published
sources, are infra.pricing.memory and infra.pricing.speed.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from infra.catalog import Catalog, Gpu, InstanceType, ProviderInfo, Tier, load_catalog
from infra.pricing.billing_modes import SUBSCRIPTION_MONTHS, billing_problem
from infra.pricing.cost import CostError, CostEstimate, CostInputs, estimate_cost
from infra.pricing.memory import Memory, memory_breakdown, usable_gb
from infra.pricing.price_sheet import Pricing, load_pricing
from infra.pricing.speed import (
    Calibration,
    peak_tflops,
    read_calibrations,
    scaling_efficiency,
    training_flops,
)
from infra.pricing.workload import Assumptions, SizingError, Workload, load_assumptions
from infra.suggest import did_you_mean

HOURS_PER_MONTH = 730.0

# status of an option, in ranking order
OK, FILTERED, NO_PRICE, NO_FIT = "ok", "filtered", "no-price", "does-not-fit"
_STATUS_RANK = {OK: 0, FILTERED: 1, NO_PRICE: 2, NO_FIT: 3}


# ----------------------------------------------------------------------------------------------
# options


@dataclass(frozen=True)
class Option:
    tier: str
    provider: str
    instance_type: str
    billing: str
    nodes: int
    gpus: int
    gpu_model: str
    gpu_memory_gb: float
    per_gpu_memory_gb: float
    fits: bool
    why: str | None
    peak_tflops: float
    mfu: float
    mfu_source: str
    mfu_measured: bool
    scaling_efficiency: float
    hours: float | None
    cost: float | None
    cost_range: tuple[float, float] | None
    currency: str
    cost_common: float | None
    common_currency: str
    status: str
    months: int | None = None
    estimate: bool = False
    price_date: str | None = None
    notes: tuple[str, ...] = ()
    fix: str | None = None  # does-not-fit: the flags that would make it fit, when some do
    # spot priced from one price seen once: 'one observation, <date>, <source>' (no range)
    spot_observation: str | None = None

    @property
    def label(self) -> str:
        nodes = f" x{self.nodes}" if self.nodes > 1 else ""
        return f"{self.tier}{nodes}"

    def to_json(self) -> dict[str, Any]:
        rng = self.cost_range
        return {
            "tier": self.tier,
            "provider": self.provider,
            "instance_type": self.instance_type,
            "billing": self.billing,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "gpu_model": self.gpu_model,
            "gpu_memory_gb": self.gpu_memory_gb,
            "per_gpu_memory_gb": _r(self.per_gpu_memory_gb),
            "fits": self.fits,
            "why": self.why,
            "peak_tflops": self.peak_tflops,
            "mfu": round(self.mfu, 4),
            "mfu_source": self.mfu_source,
            "scaling_efficiency": round(self.scaling_efficiency, 4),
            "hours": _r(self.hours),
            "cost": _r(self.cost),
            "currency": self.currency,
            "cost_common": _r(self.cost_common),
            "common_currency": self.common_currency,
            "status": self.status,
            "cost_range": [_r(rng[0]), _r(rng[1])] if rng else None,
            "subscription_months": self.months,
            "estimate": self.estimate,
            "price_date": self.price_date,
            "notes": list(self.notes),
            "fix": self.fix,
            "spot_observation": self.spot_observation,
        }


@dataclass(frozen=True)
class Filters:
    deadline_hours: float | None = None
    budget: float | None = None  # in budget_currency
    budget_currency: str | None = None  # None: the common currency
    providers: tuple[str, ...] | None = None
    billings: tuple[str, ...] | None = None
    max_nodes: int = 4


@dataclass(frozen=True)
class SizingResult:
    workload: Workload
    flops: float
    memory: Memory
    options: tuple[Option, ...]
    common_currency: str
    filters: Filters
    budget_common: float | None
    assumptions: Assumptions
    calibrations: Mapping[str, Calibration]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def viable(self) -> list[Option]:
        return [o for o in self.options if o.status == OK]

    def to_json(self) -> dict[str, Any]:
        """The JSON contract of `scripts/size.py --json` (docs/cost.md)."""
        w, a, f = self.workload, self.assumptions, self.filters
        return {
            "params": w.params,
            "tokens": w.tokens,
            "flops": self.flops,
            "memory": self.memory.to_json(),
            "options": [o.to_json() for o in self.options],
            "common_currency": self.common_currency,
            "inputs": {
                "model": w.model,
                "kind": w.kind,
                "layers": w.layers,
                "hidden": w.hidden,
                "heads": w.heads,
                "seq_len": w.seq_len,
                "micro_batch": w.micro_batch,
                "vocab": w.vocab,
                "precision": w.precision,
                "optimizer": w.optimizer,
                "momentum": w.momentum if w.optimizer == "sgd" else None,
                "strategy": w.strategy,
                "grad_checkpointing": w.grad_checkpointing,
                "attention": w.attention,
            },
            "filters": {
                "deadline_hours": f.deadline_hours,
                "budget": f.budget,
                "budget_currency": f.budget_currency or self.common_currency,
                "budget_common": _r(self.budget_common),
                "providers": list(f.providers) if f.providers else None,
                "billing": list(f.billings) if f.billings else None,
                "max_nodes": f.max_nodes,
            },
            "assumptions": {
                "headroom": a.headroom,
                "overhead_gb": a.overhead_gb,
                "fsdp_gathered_layers": a.fsdp_gathered_layers,
                "spot_overhead": a.spot_overhead,
                "scaling_per_doubling": [
                    {"min_network_gbps": g, "per_doubling": e} for g, e in a.scaling
                ],
                "source": a.source,
                "estimate": a.estimate,
            },
            "calibrations": {
                k: {"mfu": round(c.mfu, 4), "report": c.path, "started_at": c.started_at}
                for k, c in self.calibrations.items()
            },
            "warnings": list(self.warnings),
        }


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _node_counts(gpus_per_node: int, max_nodes: int) -> list[int]:
    # Multi-node clusters are built from the 8-GPU tiers (DESIGN.md); powers of two.
    if gpus_per_node < 8:
        return [1]
    out, n = [], 1
    while n <= max_nodes:
        out.append(n)
        n *= 2
    return out


def _fit_advice(
    w: Workload,
    gpu: Gpu,
    gpus: int,
    a: Assumptions,
    fitting: Sequence[str],
) -> tuple[str | None, str]:
    """(the flags that make this workload fit `gpus` GPUs of this model, or None; the advice)."""
    usable = usable_gb(gpu, a)
    tries: list[tuple[str, Workload]] = []
    if w.strategy == "ddp" and gpus > 1:
        tries.append(("--strategy fsdp", replace(w, strategy="fsdp")))
    if not w.grad_checkpointing:
        tries.append(("--grad-checkpointing", replace(w, grad_checkpointing=True)))
        if w.strategy == "ddp" and gpus > 1:
            tries.append(
                (
                    "--strategy fsdp --grad-checkpointing",
                    replace(w, strategy="fsdp", grad_checkpointing=True),
                )
            )
    if w.micro_batch > 1:
        tries.append(("--micro-batch 1", replace(w, micro_batch=1)))
    if w.optimizer == "adamw":
        tries.append(("--optimizer adamw-8bit", replace(w, optimizer="adamw-8bit")))
    for flags, alt in tries:
        mem = memory_breakdown(alt, a)
        if mem.per_gpu(alt.strategy, gpus, a.fsdp_gathered_layers) <= usable:
            return flags, f"fits with {flags}"
    where = ", ".join(fitting[:3])
    more = f" (fits as is: {where})" if where else ""
    hint = (
        "more GPUs with --strategy fsdp, or a bigger GPU"
        if gpus == 1 or w.strategy == "ddp"
        else ("more nodes (--max-nodes) or a bigger GPU")
    )
    return None, f"no flag alone makes it fit on {gpus}x {gpu.key}: {hint}{more}"


@dataclass(frozen=True)
class _Run:
    """What every option of one sizing run is judged against: the workload, the data, the
    filters and what has been worked out once for all options."""

    w: Workload
    cat: Catalog
    prc: Pricing
    a: Assumptions
    f: Filters
    today: dt.date
    common_currency: str
    flops: float
    calibrations: Mapping[str, Calibration]
    # (GPU model, GPUs in all) -> (GB needed per GPU, whether that fits), and the sizes
    # that fit
    fit: Mapping[tuple[str, int], tuple[float, bool]]
    fitting: Sequence[str]


@dataclass(frozen=True)
class _Speed:
    """How fast one GPU model runs the workload: its peak, the MFU and where both come from."""

    peak: float
    mfu: float
    measured: bool
    mfu_source: str
    notes: tuple[str, ...]


def _fit_table(
    w: Workload, cat: Catalog, memory: Memory, a: Assumptions, max_nodes: int
) -> tuple[dict[tuple[str, int], tuple[float, bool]], list[str]]:
    """Per (GPU model, GPUs in all): the GB each GPU needs and whether it fits; and the tier
    sizes that fit, smallest GPU memory first (the advice on those that do not names them).

    Each offer is judged by its own GPU, not by the tier's nominal one: a tier a cloud fills
    with another card (Azure's a100x1 is an 80 GB PCIe A100) fits what that card holds."""
    fit: dict[tuple[str, int], tuple[float, bool]] = {}
    sizes: dict[str, tuple[float, int]] = {}
    for tier in cat.tiers.values():
        for provider, offer in tier.offers.items():
            if "general" not in offer or provider not in cat.providers:
                continue
            gpu = cat.gpu_for(cat.instance(provider, offer["general"]))
            for nodes in _node_counts(tier.gpus, max_nodes):
                gpus = tier.gpus * nodes
                need = memory.per_gpu(w.strategy, gpus, a.fsdp_gathered_layers)
                ok = need <= usable_gb(gpu, a)
                fit[(gpu.key, gpus)] = (need, ok)
                if ok:
                    label = _size_label(tier.key, nodes, gpu.key, tier.gpu)
                    sizes.setdefault(label, (gpu.memory_gb, nodes))
    fitting = sorted(sizes, key=lambda k: sizes[k])
    return fit, fitting


def _size_label(tier: str, nodes: int, gpu: str, nominal: str) -> str:
    """'a100x8 x2', or 'a100x1 (A100-PCIE-80GB)' where a cloud fills the tier with another
    GPU than the tier names."""
    label = f"{tier}{f' x{nodes}' if nodes > 1 else ''}"
    return label if gpu == nominal else f"{label} ({gpu})"


def _speed(w: Workload, gpu: Gpu, calibrations: Mapping[str, Calibration]) -> _Speed:
    """The GPU's peak in the workload's precision and its MFU: measured by verify-gpu where a
    report says so, else the catalog's expectation."""
    peak, precision_note = peak_tflops(gpu, w.precision)
    cal = calibrations.get(gpu.key)
    if cal is not None:
        mfu, measured = cal.mfu, True
        mfu_source = f"measured by verify-gpu ({cal.path}, {cal.started_at}, {cal.hosts} host(s))"
    else:
        mfu, measured = gpu.thresholds.get("expected_mfu", 0.2), False
        mfu_source = "catalog expected_mfu (an unverified estimate)"
    unverified = (
        f"{gpu.key} peak unverified" if _peak_field(w.precision, gpu) in gpu.unverified else ""
    )
    notes = tuple(n for n in (precision_note, unverified) if n)
    return _Speed(peak, mfu, measured, mfu_source, notes)


def _tier_options(
    run: _Run, provider: str, info: ProviderInfo, tier: Tier
) -> tuple[list[Option], dt.date | None]:
    """One tier on one cloud: an option per node count and billing mode the filters allow,
    and the date of its price when that is older than the pricing data accepts."""
    w, a, f = run.w, run.a, run.f
    it = run.cat.instance(provider, tier.offers[provider]["general"])
    gpu = run.cat.gpu_for(it)
    speed = _speed(w, gpu, run.calibrations)
    options: list[Option] = []
    stale: dt.date | None = None
    for nodes in _node_counts(tier.gpus, f.max_nodes):
        gpus = tier.gpus * nodes
        need, ok = run.fit[(gpu.key, gpus)]
        eff = scaling_efficiency(it, nodes, a)
        base = Option(
            tier=tier.key,
            provider=provider,
            instance_type=it.name,
            billing="on-demand",
            nodes=nodes,
            gpus=gpus,
            gpu_model=gpu.key,
            gpu_memory_gb=gpu.memory_gb,
            per_gpu_memory_gb=need,
            fits=ok,
            why=None,
            peak_tflops=speed.peak,
            mfu=speed.mfu,
            mfu_source=speed.mfu_source,
            mfu_measured=speed.measured,
            scaling_efficiency=eff,
            hours=run.flops / (gpus * speed.peak * 1e12 * speed.mfu * eff) / 3600,
            cost=None,
            cost_range=None,
            currency=info.currency,
            cost_common=None,
            common_currency=run.common_currency,
            status=OK,
            notes=speed.notes,
        )
        if not ok:
            usable = usable_gb(gpu, a)
            fix, advice = _fit_advice(w, gpu, gpus, a, run.fitting)
            why = (
                f"needs {need:.1f} GB per GPU, {usable:.1f} usable of "
                f"{gpu.memory_gb:g} ({a.headroom:.0%} headroom): {need - usable:.1f} GB "
                f"over; {advice}"
            )
            base = replace(base, fix=fix)
        for billing in info.billing:
            if f.billings and billing not in f.billings:
                continue
            if not ok:
                options.append(replace(base, billing=billing, status=NO_FIT, why=why, hours=None))
                continue
            opt = _priced(base, billing, it, run.cat, run.prc, a, run.today, run.common_currency)
            if opt.price_date and it.price is not None:
                d = it.price.date
                if (run.today - d).days > run.prc.stale_after_days:
                    stale = min(stale or d, d)
            options.append(opt)
    return options, stale


def _closing_warnings(
    options: Sequence[Option], stale: Mapping[str, dt.date], today: dt.date
) -> list[str]:
    """What the ranked options rest on that the user should know: old prices, unmeasured MFU."""
    warnings = [
        f"{provider} prices are dated {d.isoformat()} ({(today - d).days} days old): "
        f"refresh with `make refresh-prices CLOUD={provider}` or check with scripts/cost.py --live"
        for provider, d in sorted(stale.items())
    ]
    if options and not any(o.mfu_measured for o in options if o.status == OK):
        warnings.append(
            "MFU is the catalog's unverified expectation on every row: hours and costs are "
            "estimates until fab verify-gpu records a report under reports/"
        )
    return warnings


def size(
    w: Workload,
    *,
    filters: Filters | None = None,
    common_currency: str = "USD",
    reports_dir: Path | str | None = None,
    catalog: Catalog | None = None,
    pricing: Pricing | None = None,
    assumptions: Assumptions | None = None,
    today: dt.date | None = None,
) -> SizingResult:
    """Every tier x provider x billing mode (x node count for the 8-GPU tiers), best first.

    Raises SizingError for bad filters, and for a deadline or budget no fitting option meets."""
    cat = catalog or load_catalog()
    prc = pricing or load_pricing()
    a = assumptions or load_assumptions()
    f = filters or Filters()
    today = today or dt.date.today()
    problems = _check_filters(f, cat, prc, common_currency)
    if problems:
        raise SizingError(problems)
    budget_common = None
    if f.budget is not None:
        budget_common = (
            f.budget * prc.fx_rate(f.budget_currency or common_currency, common_currency)[0]
        )

    calibrations = read_calibrations(reports_dir, cat) if reports_dir is not None else {}
    memory = memory_breakdown(w, a)
    warnings: list[str] = []
    if memory.activations_gb is None:
        warnings.append(
            "activations are not counted (no model shape): a tier shown as fitting may not; "
            "give --model, or --layers --hidden --seq-len"
        )
    fit, fitting = _fit_table(w, cat, memory, a, f.max_nodes)
    run = _Run(
        w, cat, prc, a, f, today, common_currency, training_flops(w), calibrations, fit, fitting
    )

    options: list[Option] = []
    stale: dict[str, dt.date] = {}
    for provider, info in cat.providers.items():
        if f.providers and provider not in f.providers:
            continue
        for tier in cat.tiers.values():
            if "general" not in tier.offers.get(provider, {}):
                continue
            offered, dated = _tier_options(run, provider, info, tier)
            options += offered
            if dated is not None:
                stale[provider] = min(stale.get(provider, dated), dated)

    options = [_filter(o, f, budget_common) for o in options]
    _impossible(options, f, budget_common, common_currency)
    options.sort(key=_rank_key)
    warnings += _closing_warnings(options, stale, today)
    return SizingResult(
        workload=w,
        flops=run.flops,
        memory=memory,
        options=tuple(options),
        common_currency=common_currency,
        filters=f,
        budget_common=budget_common,
        assumptions=a,
        calibrations=MappingProxyType(calibrations),
        warnings=tuple(warnings),
    )


def _peak_field(precision: str, gpu: Gpu) -> str:
    if precision == "fp32":
        return "fp32_tflops"
    return "bf16_tflops" if precision == "bf16" and gpu.bf16 else "fp16_tflops"


def _check_filters(f: Filters, cat: Catalog, prc: Pricing, common: str) -> list[str]:
    problems = []
    if common not in prc.currencies:
        problems.append(
            f"currency {common!r} is unknown: use one of {', '.join(prc.currencies)}"
            + did_you_mean(common, prc.currencies)
        )
    if f.budget_currency is not None and f.budget_currency not in prc.currencies:
        problems.append(
            f"budget currency {f.budget_currency!r} is unknown: use one of "
            f"{', '.join(prc.currencies)}" + did_you_mean(f.budget_currency, prc.currencies)
        )
    if f.deadline_hours is not None and not (
        f.deadline_hours > 0 and math.isfinite(f.deadline_hours)
    ):
        problems.append(f"deadline must be a number of hours above 0, got {f.deadline_hours:g}")
    if f.budget is not None and not (f.budget > 0 and math.isfinite(f.budget)):
        problems.append(f"budget must be an amount above 0, got {f.budget:g}")
    if f.max_nodes < 1:
        problems.append(f"max nodes must be a whole number >= 1, got {f.max_nodes}")
    for p in f.providers or ():
        if p not in cat.providers:
            problems.append(
                f"provider {p!r} is not in the catalog: use one of {', '.join(cat.providers)}"
                + did_you_mean(p, cat.providers)
            )
    for b in f.billings or ():
        # the mode alone: a mode some clouds do not sell still ranks on those that do
        why = billing_problem(b)
        if why:
            problems.append(why)
    return problems


def _priced(
    base: Option,
    billing: str,
    it: InstanceType,
    cat: Catalog,
    prc: Pricing,
    a: Assumptions,
    today: dt.date,
    common: str,
) -> Option:
    """The option's hours and cost under one billing mode, in the provider's currency and the
    common one."""
    try:
        est = estimate_cost(
            CostInputs(it.provider, it.name, nodes=base.nodes, root_disk_gb=0),
            catalog=cat,
            pricing=prc,
            today=today,
        )
    except CostError as exc:
        return replace(base, billing=billing, status=NO_PRICE, why=exc.problems[0], hours=None)
    assert it.price is not None and base.hours is not None
    k = prc.fx_rate(est.currency, common)[0]
    hours = base.hours
    months = None
    cost_range = None
    observation = None
    estimate = not base.mfu_measured
    price_date = it.price.date.isoformat()
    why = None
    notes = list(base.notes)
    if billing == "on-demand":
        cost = est.hourly.on_demand * hours
    elif billing == "spot":
        assert est.hourly.spot is not None
        hours = hours * (1 + a.spot_overhead)
        lo, hi = est.hourly.spot
        cost_range = (lo * hours, hi * hours)
        cost = (lo + hi) / 2 * hours
        if it.price.spot_date:
            price_date = it.price.spot_date.isoformat()
        observation = None if est.hourly.spot_estimated else it.price.spot_observation
        if est.hourly.spot_estimated:
            lo_f, hi_f = prc.spot_band
            notes.append(f"spot estimated as {lo_f:.0%}-{hi_f:.0%} of on-demand")
        notes.append(f"+{a.spot_overhead:.0%} hours for interruptions and restarts")
    else:
        priced = _subscription_term(base, it, est, cat, prc, today)
        if isinstance(priced, str):
            return replace(base, billing=billing, status=NO_PRICE, hours=None, why=priced)
        months, term = priced
        assert term.subscription_month is not None
        cost = term.subscription_month * months
        est = term
        on_demand = est.hourly.on_demand * hours
        estimate = estimate or est.subscription_estimated
        if cost >= on_demand:
            be = est.break_even.hours_per_month if est.break_even else float("nan")
            why = (
                f"does not pay off: {months} month(s) cost {cost:,.0f} {est.currency}, "
                f"on-demand for {hours:,.1f} h costs {on_demand:,.0f} {est.currency} "
                f"(a month pays off above {be:,.0f} h of use)"
            )
    return replace(
        base,
        billing=billing,
        hours=hours,
        cost=cost,
        cost_range=cost_range,
        cost_common=cost * k,
        months=months,
        estimate=estimate,
        price_date=price_date,
        status=FILTERED if why else OK,
        why=why,
        notes=tuple(notes),
        spot_observation=observation,
    )


def _subscription_term(
    base: Option,
    it: InstanceType,
    est: CostEstimate,
    cat: Catalog,
    prc: Pricing,
    today: dt.date,
) -> tuple[int, CostEstimate] | str:
    """The shortest term that covers the run, and its bill; or why none can be priced."""
    assert base.hours is not None
    needed = max(1, math.ceil(base.hours / HOURS_PER_MONTH))
    months = next((m for m in SUBSCRIPTION_MONTHS if m >= needed), None)
    term = None
    if months is not None and est.subscription_month is not None:
        # a whole number of years is priced at the yearly rate
        term = estimate_cost(
            CostInputs(
                it.provider,
                it.name,
                nodes=base.nodes,
                root_disk_gb=0,
                subscription_months=months,
            ),
            catalog=cat,
            pricing=prc,
            today=today,
        )
    if term is None or term.subscription_month is None or months is None:
        return (
            f"{it.provider} {it.name} has no subscription quote in the catalog"
            if est.subscription_month is None
            else f"the run needs {needed} months: longer than the longest term"
        )
    return months, term


def _filter(o: Option, f: Filters, budget_common: float | None) -> Option:
    if o.status != OK:
        return o
    reasons = []
    assert o.hours is not None and o.cost_common is not None
    if f.deadline_hours is not None and o.hours > f.deadline_hours:
        reasons.append(f"takes {o.hours:,.1f} h, over the {f.deadline_hours:g} h deadline")
    if budget_common is not None:
        worst = (
            o.cost_range[1] * (o.cost_common / o.cost) if o.cost_range and o.cost else o.cost_common
        )
        if worst > budget_common:
            up_to = " up to" if o.cost_range else ""
            reasons.append(
                f"costs{up_to} {worst:,.0f} {o.common_currency}, over the budget of "
                f"{budget_common:,.0f} {o.common_currency}"
            )
    if reasons:
        return replace(o, status=FILTERED, why="; ".join(reasons))
    return o


def _impossible(
    options: Sequence[Option], f: Filters, budget_common: float | None, common: str
) -> None:
    """A deadline or budget that no fitting, priced option meets is bad input (exit 2)."""
    if f.deadline_hours is None and budget_common is None:
        return
    if any(o.status == OK for o in options):
        return
    candidates = [
        o for o in options if o.hours is not None and o.cost_common is not None and o.fits
    ]
    candidates = [o for o in candidates if not (o.why or "").startswith("does not pay off")]
    if not candidates:
        return  # nothing fits at all: the table says why, the filters are not the problem
    problems = []
    fastest = min(candidates, key=lambda o: o.hours or math.inf)
    if f.deadline_hours is not None and all((o.hours or 0) > f.deadline_hours for o in candidates):
        more = " or more nodes with --max-nodes" if fastest.nodes >= f.max_nodes else ""
        problems.append(
            f"deadline {duration(f.deadline_hours)} is impossible: the fastest fitting option "
            f"({fastest.label} on {fastest.provider}, {fastest.billing}) needs "
            f"{duration(fastest.hours or 0)}; allow at least that{more}"
        )
    in_time = [
        o for o in candidates if f.deadline_hours is None or (o.hours or 0) <= f.deadline_hours
    ]
    if budget_common is not None and in_time:
        cheapest = min(in_time, key=lambda o: o.cost_common or math.inf)
        within = " within the deadline" if f.deadline_hours is not None else ""
        problems.append(
            f"budget {budget_common:,.0f} {common} is too small: the cheapest fitting option"
            f"{within} ({cheapest.label} on {cheapest.provider}, {cheapest.billing}) costs "
            f"{cheapest.cost_common:,.0f} {common}"
            + (" at the top of its spot range" if cheapest.cost_range else "")
        )
    if problems:
        raise SizingError(problems)


def duration(hours: float) -> str:
    """48 -> '48 h', 168 -> '7 days', 1/60 -> '1 min': a deadline as it was given."""
    if hours < 1 / 60:
        return f"{hours * 3600:.3g} s"
    if hours < 1:
        return f"{hours * 60:.3g} min"
    if hours >= 72 and hours % 24 == 0:
        return f"{hours / 24:g} days"
    return f"{hours:,.0f} h" if hours >= 100 or hours == int(hours) else f"{hours:,.1f} h"


def _rank_key(o: Option) -> tuple[Any, ...]:
    return (
        _STATUS_RANK[o.status],
        o.cost_common if o.cost_common is not None else math.inf,
        o.hours if o.hours is not None else math.inf,
        o.per_gpu_memory_gb - o.gpu_memory_gb if o.status == NO_FIT else 0.0,
        o.provider,
        o.tier,
        o.nodes,
        o.billing,
    )


_FIXES: dict[str, dict[str, Any]] = {
    "--strategy fsdp": {"strategy": "fsdp"},
    "--grad-checkpointing": {"grad_checkpointing": True},
    "--strategy fsdp --grad-checkpointing": {"strategy": "fsdp", "grad_checkpointing": True},
    "--micro-batch 1": {"micro_batch": 1},
    "--optimizer adamw-8bit": {"optimizer": "adamw-8bit"},
}


def with_fix(w: Workload, fix: str) -> Workload:
    """The workload as it would be with one of the fixes `_fit_advice` names."""
    return replace(w, **_FIXES[fix])


def best_fix(result: SizingResult) -> str | None:
    """When nothing fits as asked: the fix (in _FIXES order) that the most tier sizes name."""
    if result.viable:
        return None
    counts: dict[str, int] = {}
    for o in result.options:
        if o.status == NO_FIT and o.fix:
            counts[o.fix] = counts.get(o.fix, 0) + 1
    if not counts:
        return None
    order = list(_FIXES)
    return max(counts, key=lambda k: (counts[k], -order.index(k)))
