#!/usr/bin/env python3
"""What a stack will cost before `pulumi up`, and how a tier compares across providers.

    python scripts/cost.py --stack a100x4 [--hours-per-month 200] [--egress-gb 50]
                           [--storage-gb 500] [--snapshot-gb 0] [--currency USD] [--json] [--live]
                           [--reservation 1y|3y]
    python scripts/cost.py --stack-file stacks/Pulumi.a100x4.yaml ...
    python scripts/cost.py --compare a100x8 [--currency USD] [--sort tflop-hour]
                           [--plot a100x8.png] [--json]

Exit status (docs/exit-status.md): 0 done; 1 --live could not compare (no credentials, no
network, an API error: the bill is still printed, the reason on stderr) or the catalog data
itself is broken; 2 bad input (message on stderr).
--live asks AWS's Price List API / Alibaba's DescribePrice for the current on-demand price of the
stack's instance type when credentials are present; the estimate never depends on it.
--reservation prices a 1- or 3-year reservation beside the bill where the cloud's catalog file
sells one (Azure): bought separately, not set on the VM; --live fetches its price (Azure's
Retail Prices API needs no account) when the catalog carries none.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file from a checkout without the editable install
    sys.path.insert(0, str(REPO))

from infra.catalog import CatalogError, load_catalog  # noqa: E402
from infra.clouds.live import LivePriceError  # noqa: E402
from infra.config import ConfigError, StackConfig, load_stack_file  # noqa: E402
from infra.pricing.compare import SORT_KEYS, Comparison, LiveCheck, compare_tier  # noqa: E402
from infra.pricing.cost import (  # noqa: E402  # noqa: E402
    CostError,
    CostEstimate,
    CostInputs,
    ReservationQuote,
    catalog_reservation_quote,
    check_cost_inputs,
    estimate_cost,
    term_words,
)
from infra.pricing.price_sheet import RESERVATION_TERM_MONTHS  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.stackfiles import STACKS_DIR as DEFAULT_STACKS_DIR  # noqa: E402
from infra.stackfiles import StackNotFound, find_stack  # noqa: E402
from infra.suggest import did_you_mean  # noqa: E402
from infra.usage import fit  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STACKS_DIR = DEFAULT_STACKS_DIR
BILLING_COLOURS = {
    "on-demand": "#4C72B0",
    "spot": "#DD8452",
    "subscription-month": "#55A868",
    "subscription-year": "#2E6B3C",
}


class UsageError(Exception):
    """Bad command-line input: printed on stderr, one line per problem, exit status 2."""

    def __init__(self, *problems: str):
        super().__init__(*problems)
        self.problems = list(problems)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, fit(f"{self.prog}: {message} (see --help)") + "\n")


# Usage amounts (GB, GB-months) beyond this are a typo, not a plan: an exabyte.
MAX_AMOUNT = 1e9
AMOUNT_FLAGS = ("egress_gb", "storage_gb", "snapshot_gb")


def check_amounts(args: argparse.Namespace) -> None:
    """NaN and infinity would price to nonsense: refuse them by flag (ranges: the cost model)."""
    problems = []
    for dest in ("hours_per_month", *AMOUNT_FLAGS):
        value = getattr(args, dest)
        if value is None:
            continue
        flag = "--" + dest.replace("_", "-")
        if not math.isfinite(value):
            problems.append(f"{flag}: {value!r} is not a number")
        elif dest in AMOUNT_FLAGS and value > MAX_AMOUNT:
            problems.append(f"{flag}: must be <= {MAX_AMOUNT:g}, got {value:g}")
    if problems:
        raise UsageError(*problems)


def reservation_term(value: str | None) -> str | None:
    """The --reservation value as a term key ('1y', '3y'), or a one-line UsageError."""
    if value is None:
        return None
    key = value.strip().lower()
    if key in RESERVATION_TERM_MONTHS:
        return key
    # '1', '1yr', '3 years', '3-year': the digit says which term was meant
    digits = "".join(ch for ch in key if ch.isdigit())
    near = f"{digits}y" if f"{digits}y" in RESERVATION_TERM_MONTHS else None
    hint = f" (did you mean {near!r}?)" if near else did_you_mean(key, RESERVATION_TERM_MONTHS)
    raise UsageError(
        f"--reservation: {value!r} is not a term: use one of "
        f"{', '.join(RESERVATION_TERM_MONTHS)}{hint}"
    )


# exit status when --live could not compare (docs/exit-status.md: it ran, the answer is no)
LIVE_NOT_CHECKED = 1


class LiveUnavailable(Exception):
    """A live price could not be asked for (no credentials, no network): said, not fatal."""


# ----------------------------------------------------------------------------------------------
# stack -> inputs


def stack_path(name: str, stacks_dir: Path | None = None) -> Path:
    try:
        return find_stack(name, stacks_dir or STACKS_DIR)
    except StackNotFound as exc:
        raise UsageError(str(exc)) from None


def inputs_from_stack(cfg: StackConfig, args: argparse.Namespace) -> CostInputs:
    """Map the validated stack config plus the usage flags onto the cost model's inputs."""
    return CostInputs(
        provider=cfg.provider,
        instance_type=cfg.instance_type,
        nodes=cfg.nodes,
        billing=cfg.billing,
        region=cfg.region,
        root_disk_gb=cfg.root_disk_gb,
        scratch_gb=cfg.scratch_gb,
        scratch_class=cfg.scratch_class,
        spot_max_price=cfg.spot_max_price,
        subscription_months=cfg.subscription_months or 1,
        hours_per_month=args.hours_per_month,
        bucket_gb=args.storage_gb,
        bucket_class=args.bucket_class,
        egress_gb=args.egress_gb,
        snapshot_gb=args.snapshot_gb,
        stack=cfg.stack,
        tier=cfg.tier,
        reservation=reservation_term(args.reservation),
    )


# ----------------------------------------------------------------------------------------------
# live prices: each cloud's own prices.py (its SDK imported there, only when asked)


def live_prices(provider: str) -> Any:
    """The cloud's prices module (infra/clouds/<provider>/prices.py, infra.clouds.live): its
    SDK is imported only when a price is asked for."""
    from infra import clouds

    try:
        return clouds.module(provider, "prices")
    except LookupError:
        raise LiveUnavailable(f"no live price source for {provider}") from None


def live_check(inputs: CostInputs) -> LiveCheck:
    cat = load_catalog()
    it = cat.instance(inputs.provider, inputs.instance_type)
    assert it.price is not None
    region = inputs.region or it.price.region
    try:
        live, currency = live_prices(inputs.provider).live_price(it.name, region)
    except LivePriceError as exc:
        raise LiveUnavailable(str(exc)) from None
    if currency != it.price.currency:
        raise LiveUnavailable(
            f"live price came in {currency}, the catalog is in {it.price.currency}"
        )
    return LiveCheck(inputs.provider, it.name, region, currency, it.price.on_demand, live)


def live_reservation_quote(inputs: CostInputs, check: LiveCheck | None) -> ReservationQuote:
    """The reservation's current price for one VM, compared with the live pay-as-you-go price
    when that check succeeded (like with like), else with the catalog's."""
    assert inputs.reservation is not None
    it = load_catalog().instance(inputs.provider, inputs.instance_type)
    assert it.price is not None
    region = inputs.region or it.price.region
    try:
        terms, name = live_prices(inputs.provider).live_reservations(it.name, region)
    except LivePriceError as exc:
        raise LiveUnavailable(str(exc)) from None
    if inputs.reservation not in terms:
        raise LiveUnavailable(
            f"no {term_words(inputs.reservation)} reservation price for {it.name} in {region} "
            f"(the answer has: {', '.join(terms) or 'none'})"
        )
    total, currency = terms[inputs.reservation]
    if currency != it.price.currency:
        raise LiveUnavailable(
            f"live reservation price came in {currency}, the catalog is in {it.price.currency}"
        )
    return ReservationQuote(
        term=inputs.reservation,
        total=total,
        date=dt.date.today(),
        source=f"{name}, {region}",
        live=True,
        payg_node_hour=check.live if check else None,
        payg_source=f"live, {region}" if check else None,
    )


# ----------------------------------------------------------------------------------------------
# rendering


def _money(value: float | tuple[float, float] | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return f"{value[0]:,.2f} - {value[1]:,.2f}{unit}"
    return f"{value:,.2f}{unit}"


class _TrailingSpacesDropped:
    """The stream rich writes to, minus the spaces it pads each line of a table's title or a
    wrapped paragraph with up to the console width (piped output read them as content)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.out.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.out, "isatty", lambda: False)())

    def fileno(self) -> int:
        return int(self.out.fileno())


def _console(out: TextIO) -> Any:
    """A console that prints text as it is (no markup or emoji read from prices or names), as
    wide as the terminal, or unlimited when piped (lines as long as their content)."""
    from rich.console import Console

    from infra.render import output_width

    width = output_width(out)
    return Console(
        file=cast(TextIO, _TrailingSpacesDropped(out)),
        width=width or 1000,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=width is None,
    )


def _say(con: Any, text: str, first: str = "", rest: str = "") -> None:
    """A sentence, wrapped under its own indent at the console's width (whole when piped)."""
    from infra.render import wrap

    for line in wrap(text, None if con.soft_wrap else con.width, first, rest or " " * len(first)):
        con.print(line)


def _bold(text: str) -> Any:
    from infra.render import literal

    return literal(text, "bold")


def fit_columns(con: Any, build: Any, columns: Sequence[str], drop_order: Sequence[str]) -> tuple:
    """(table, columns left out): the widest table `build(columns)` that fits the console,
    leaving out columns in `drop_order` one by one; figures are never cut or wrapped."""
    from rich.measure import Measurement

    kept = list(columns)
    left_out: list[str] = []
    table = build(kept)
    natural = con.options.update_width(100_000)  # measure what the table wants, not the cap
    for name in drop_order:
        # fits: every unbreakable cell (figures, names) whole, text columns wrapped at words
        if Measurement.get(con, natural, table).minimum <= con.width:
            break
        kept.remove(name)
        left_out.append(name)
        table = build(kept)
    return table, left_out


def render_reservation(con: Any, est: CostEstimate, not_priced: str | None = None) -> None:
    """The reservation beside the bill: what is committed, the effective rate, this month's
    share and the break-even against pay-as-you-go, and how it is bought."""
    term = est.inputs.reservation
    if term is None:
        return
    words, cur = term_words(term), est.currency
    r = est.reservation
    if r is None:
        _say(con, f"Reservation ({words}): not priced: {not_priced or 'no price'}.")
        return
    nodes = f"{r.nodes} node{'s' if r.nodes > 1 else ''}"
    title = load_catalog().providers[est.inputs.provider].title
    src = f"{r.source} {r.date}" + (" (estimate)" if r.estimate else "")
    con.print(_bold(f"Reservation, {words}, for {nodes} (bought separately, not set on the VM)"))
    rows = (
        ("committed", f"{r.total:,.2f} {cur} for the term, owed whatever the VMs do ({src})"),
        (
            "effective rate",
            f"{r.effective_hourly:,.4f} {cur}/h (the total over the term's "
            f"{r.term_hours:,.0f} h), {r.saving_at_full_use:.0%} below pay-as-you-go "
            f"{r.payg_hourly:,.4f} {cur}/h ({r.payg_source})",
        ),
        (
            "each month",
            f"{r.per_month:,.2f} {cur}: {r.run_share:,.2f} of it for the "
            f"{r.run_hours:g} running hours at the effective rate, {r.unused_per_month:,.2f} "
            "for reserved hours left unused (they are lost, not carried over)",
        ),
        (
            "pay-as-you-go",
            f"{r.payg_month:,.2f} {cur} for the same {r.run_hours:g} hours; with the storage "
            f"above the month is {r.per_month + est.storage_monthly:,.2f} reserved, "
            f"{r.payg_month + est.storage_monthly:,.2f} pay-as-you-go",
        ),
        (
            "break-even",
            f"the VMs must run {r.break_even_utilisation:.1%} of the term's hours "
            f"({r.break_even_hours_per_month:,.0f} h a month) for the reservation to cost "
            f"less; at {r.run_hours:g} h a month it costs "
            + ("less" if r.per_month < r.payg_month else "more"),
        ),
    )
    for label, text in rows:
        _say(con, text, f"  {label:<15}", " " * 17)
    _say(
        con,
        f"The stack still deploys pay-as-you-go VMs. Buy the reservation separately "
        f"(quantity {r.nodes}, one per VM), in {r.bought_with}: {title} then bills matching "
        f"running VMs at the reserved rate, hour by hour. It covers {r.covers}.",
    )


def render_estimate(
    est: CostEstimate, out: TextIO, live: str | None = None, not_priced: str | None = None
) -> None:
    con = _console(out)
    i = est.inputs
    cur = est.currency
    head = f"{i.stack or i.instance_type}: " if i.stack else ""
    from rich.text import Text

    con.print(
        Text.assemble(
            _bold(f"{head}{i.provider} {i.instance_type}"),
            f" ({est.gpus_per_node}x {est.gpu}) x {i.nodes} node{'s' if i.nodes > 1 else ''}, "
            f"{i.region or est.price_region}, billing ",
            _bold(i.billing),
            f", prices in {cur}"
            + (
                f" (from {est.native_currency} at {est.fx.amount:g}, {est.fx.date})"
                if est.fx
                else ""
            ),
        )
    )
    con.print(_compute_table(est))
    con.print(_monthly_table(est))
    _render_notes(con, est, live, not_priced)


def _spot_observation(est: CostEstimate) -> str | None:
    """'one observation, <date>, <source>' when the catalog's spot price for this type is one
    price seen once (and not the estimated band)."""
    if not est.hourly.spot or est.hourly.spot_estimated:
        return None
    i = est.inputs
    price = load_catalog().instance(i.provider, i.instance_type).price
    if price is None or est.hourly.spot[0] != est.hourly.spot[1]:
        return None
    return price.spot_observation


def _spot_range_cell(rng: tuple[float, float] | None) -> str:
    """'0.31-1.02'; one price seen once is '0.37 (one obs.)', not '0.37-0.37'."""
    if not rng:
        return ""
    if rng[0] == rng[1]:
        return f"{rng[0]:.2f} (one obs.)"
    return f"{rng[0]:.2f}-{rng[1]:.2f}"


def _compute_table(est: CostEstimate) -> Any:
    """Compute for all nodes per hour, day and month, one row per billing mode priced."""
    from rich.table import Table
    from rich.text import Text

    i, cur = est.inputs, est.currency
    compute = Table(title="Compute, all nodes", title_justify="left")
    for col in (
        "billing",
        f"{cur}/hour",
        f"{cur}/day",
        f"{cur}/month at {est.hours_per_month:g} h",
    ):
        if col == "billing":
            compute.add_column(col, overflow="fold")
        else:  # figures stay whole: their header wraps instead
            compute.add_column(Text(col, overflow="fold"), justify="right", no_wrap=True)
    h, m = est.hourly, est.compute_monthly
    d = h.times(24)
    compute.add_row("on-demand", _money(h.on_demand), _money(d.on_demand), _money(m.on_demand))
    if h.spot and d.spot and m.spot and _spot_observation(est):
        # one price seen once: its value, not a range of zero width ('0.44 - 0.44')
        compute.add_row(
            "spot (one observation)", _money(h.spot[0]), _money(d.spot[0]), _money(m.spot[0])
        )
    elif h.spot:
        label = "spot (estimate)" if h.spot_estimated else "spot (observed range)"
        compute.add_row(label, _money(h.spot), _money(d.spot), _money(m.spot))
    if h.subscription is not None:
        compute.add_row(
            f"subscription ({i.subscription_months} mo term)",
            _money(h.subscription),
            _money(d.subscription),
            _money(m.subscription) + " (fixed)",
        )
    return compute


def _monthly_table(est: CostEstimate) -> Any:
    """The month's bill: the chosen compute, each storage line with its source, the total."""
    from rich.table import Table

    i, cur = est.inputs, est.currency
    monthly = Table(
        title=f"Monthly bill at {est.hours_per_month:g} running hours", title_justify="left"
    )
    for col in ("item", "quantity", "unit price", cur, "source"):
        if col in ("item", "source"):
            monthly.add_column(col, overflow="fold")
        else:
            monthly.add_column(col, justify="right", no_wrap=True)
    sel_compute = est.selected(est.compute_monthly)
    monthly.add_row(f"compute ({i.billing})", "", "", _money(sel_compute), "catalog")
    for item in est.storage:
        src = item.source + (" (estimate)" if item.estimate else "") + f" {item.date}"
        monthly.add_row(
            item.item,
            f"{item.quantity:,.10g} {item.unit}",  # 1,000,000 GB, never 1e+06
            f"{item.unit_price:.10g}",
            _money(item.amount),
            src,
        )
    monthly.add_row(_bold("total"), "", "", _bold(_money(est.selected(est.monthly_total))), "")
    return monthly


def _render_notes(con: Any, est: CostEstimate, live: str | None, not_priced: str | None) -> None:
    """Below the tables: break-even, reservation, spot saving, the live note, warnings."""
    from rich.text import Text

    i, cur = est.inputs, est.currency
    if est.break_even:
        be = est.break_even
        con.print(
            f"Break-even: the subscription is cheaper above {be.hours_per_month:,.0f} running "
            f"hours a month ({be.utilisation:.0%} of the month); below that, pay on-demand."
        )
    elif "subscription" not in load_catalog().providers[i.provider].billing:
        con.print(f"Subscription: not sold on {i.provider} through this tool.")
    render_reservation(con, est, not_priced)
    if est.spot_saving:
        s = est.spot_saving
        seen = _spot_observation(est)
        if seen:
            saves = f"{s.fraction[0]:.0%} ({_money(s.per_hour[0])} {cur}/h, {seen})"
        else:
            kind = "estimated" if s.estimated else "from observed spot prices"
            saves = (
                f"{s.fraction[0]:.0%}-{s.fraction[1]:.0%} ({_money(s.per_hour)} {cur}/h, {kind})"
            )
        con.print(f"Spot saves {saves}. Caveat: {s.caveat}.")
    if live:
        con.print(f"Live: {live}")
    if est.warnings:
        con.print(Text("Warnings", "bold yellow"))
        for w in est.warnings:
            _say(con, w, "  ! ")


def render_comparison(cmp: Comparison, out: TextIO) -> None:
    from rich import box
    from rich.table import Table

    con = _console(out)
    cat = load_catalog()
    t = cat.tiers[cmp.tier]
    cols = (
        "#",
        "provider / region",
        "instance type",
        "profile",
        "billing",
        f"{cmp.currency}/GPU-h",
        "spot range",
        f"{cmp.currency}/TFLOP-h",
        "node-h, native",
        "price date",
        "flags",
    )
    rows = []
    for n, o in enumerate(cmp.offers, 1):
        flags = ", ".join(f for f, on in (("estimate", o.estimate), ("stale", o.stale)) if on)
        rng = o.per_gpu_hour_range
        rows.append(
            (
                str(n),
                f"{o.provider} {o.region}",
                o.instance_type,
                o.profile,
                o.billing,
                f"{o.per_gpu_hour:.3f}",
                _spot_range_cell(rng),
                f"{o.per_tflop_hour:.5f}",
                f"{o.native_node_hour:,.2f} {o.native_currency}",
                o.price_date.isoformat(),
                flags,
            )
        )

    def build(kept: Sequence[str]) -> Table:
        table = Table(
            title=f"{cmp.tier}: {t.description} - sorted by {cmp.currency} per {cmp.sort_by}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        for col in kept:
            right = ("/" in col and "region" not in col) or col in ("#", "node-h, native")
            # figures, instance types and dates are never broken; the words around them may be
            whole = right or col in ("instance type", "price date", "spot range")
            table.add_column(
                col, justify="right" if right else "left", no_wrap=whole, overflow="fold"
            )
        index = [cols.index(c) for c in kept]
        for row in rows:
            table.add_row(*(row[i] for i in index))
        return table

    # the least useful first: what a reader gives up for an 80-column terminal
    drop_order = (
        "#",
        "node-h, native",
        "price date",
        "profile",
        f"{cmp.currency}/TFLOP-h",
        "spot range",
        "flags",
    )
    table, left_out = fit_columns(con, build, cols, drop_order)
    con.print(table)
    if left_out:
        _say(
            con,
            f"Left out at {con.width} columns: {'; '.join(left_out)} (a wider terminal, "
            "or --json, shows them).",
        )
    _say(
        con,
        "TFLOP-h: per GPU-hour over the GPU's dense peak in its training dtype (bf16, else fp16). "
        "Subscription rows assume the node runs all month.",
    )
    for w in cmp.warnings:
        _say(con, w, "  ! ")


def comparison_figure(cmp: Comparison) -> Figure:
    """Two bar panels, cheapest at the top: per GPU-hour and per reference TFLOP-hour.

    Built on matplotlib's object API (no pyplot state); the caller saves or inspects it."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    offers = list(cmp.offers)
    n = len(offers)
    fig = Figure(figsize=(13, 1.6 + 0.42 * n), layout="constrained")
    ax_gpu, ax_tf = fig.subplots(1, 2, sharey=True)
    ys = list(range(n))[::-1]  # first (cheapest) offer at the top
    for billing, colour in BILLING_COLOURS.items():
        rows = [(y, o) for y, o in zip(ys, offers, strict=True) if o.billing == billing]
        if not rows:
            continue
        ypos = [r[0] for r in rows]
        for ax, values in (
            (ax_gpu, [o.per_gpu_hour for _, o in rows]),
            (ax_tf, [o.per_tflop_hour * 1000 for _, o in rows]),
        ):
            bars = ax.barh(ypos, values, color=colour, label=billing, height=0.7)
            for bar, (_, o) in zip(bars, rows, strict=True):
                if o.estimate:
                    bar.set_hatch("//")
                    bar.set_edgecolor("white")
                if o.stale:
                    bar.set_alpha(0.65)
        spot = [(yy, o.per_gpu_hour, o.per_gpu_hour_range) for yy, o in rows]
        ranged = [(yy, mid, rng) for yy, mid, rng in spot if rng is not None]
        if ranged:
            # the observed (or banded) spot range around the midpoint the bar shows
            ax_gpu.errorbar(
                [mid for _, mid, _ in ranged],
                [yy for yy, _, _ in ranged],
                xerr=[
                    [mid - lo for _, mid, (lo, _) in ranged],
                    [hi - mid for _, mid, (_, hi) in ranged],
                ],
                fmt="none",
                ecolor="black",
                capsize=3,
                linewidth=1,
            )
    for y, o in zip(ys, offers, strict=True):
        top = o.per_gpu_hour_range[1] if o.per_gpu_hour_range else o.per_gpu_hour
        ax_gpu.annotate(f" {o.per_gpu_hour:.2f}", (top, y), va="center", fontsize=8)
        ax_tf.annotate(
            f" {o.per_tflop_hour * 1000:.2f}", (o.per_tflop_hour * 1000, y), va="center", fontsize=8
        )
    ax_gpu.set_yticks(ys, [o.label for o in offers], fontsize=9)
    ax_gpu.set_xlabel(f"{cmp.currency} per GPU-hour")
    ax_tf.set_xlabel(f"{cmp.currency} per 1000 TFLOP-hours (GPU's dense peak)")
    for ax in (ax_gpu, ax_tf):
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        ax.margins(x=0.18)
    cat = load_catalog()
    tier = cat.tiers[cmp.tier]
    fx = "; ".join(f"1 USD = {r.amount:g} CNY ({r.date}, {r.source})" for r in cmp.fx)
    fig.suptitle(
        f"{cmp.tier}: {tier.description} - cheapest first\n"
        + (f"converted at {fx}" if fx else f"prices in {cmp.currency}"),
        fontsize=11,
    )
    handles = [
        Patch(color=c, label=b)
        for b, c in BILLING_COLOURS.items()
        if any(o.billing == b for o in offers)
    ]
    handles.append(Patch(facecolor="grey", hatch="//", edgecolor="white", label="estimate"))
    handles.append(Patch(facecolor="grey", alpha=0.65, label="stale price (> 180 days)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9)
    return fig


def save_figure(fig: Figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if path.suffix.lower() != ".png":
        raise UsageError(f"--plot writes PNG: name the file *.png, got {path.name!r}")
    if not path.parent.is_dir():
        raise UsageError(f"--plot: directory {path.parent} does not exist")
    FigureCanvasAgg(fig)  # Agg: no display needed, same output on CI and laptops
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:  # a directory of that name, no write permission, disk full
        raise UsageError(f"--plot: cannot write {path} ({exc.strerror or exc})") from None


# ----------------------------------------------------------------------------------------------
# command line


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="cost.py",
        description="The bill for a stack before `pulumi up`, or a tier across providers.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--stack", metavar="NAME", help="stacks/Pulumi.NAME.yaml")
    what.add_argument("--stack-file", metavar="FILE", type=Path, help="a Pulumi.<stack>.yaml")
    what.add_argument("--compare", metavar="TIER", help="compare a tier across providers")
    p.add_argument(
        "--hours-per-month",
        type=float,
        default=None,
        metavar="H",
        help="hours the nodes run each month (default 730: always on)",
    )
    p.add_argument("--egress-gb", type=float, default=0.0, metavar="G", help="data out per month")
    p.add_argument("--storage-gb", type=float, default=0.0, metavar="S", help="bucket GB stored")
    p.add_argument("--bucket-class", default=None, help="bucket storage class (default Standard)")
    p.add_argument("--snapshot-gb", type=float, default=0.0, metavar="N", help="snapshot GB stored")
    p.add_argument(
        "--currency", default=None, help="USD or CNY (default: the provider's; USD for --compare)"
    )
    p.add_argument(
        "--sort", choices=SORT_KEYS, default=None, help="--compare order (default gpu-hour)"
    )
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="--compare: write a bar chart")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--live", action="store_true", help="check the catalog against live prices")
    p.add_argument(
        "--reservation",
        metavar="TERM",
        default=None,
        help="also price a 1y or 3y reservation (where the cloud sells one: Azure); it is "
        "bought separately, not set on the VM",
    )
    return p


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = parser().parse_args(argv)
    for dest in ("currency", "bucket_class"):  # given empty, they read as not given at all
        if getattr(args, dest) is not None and not getattr(args, dest).strip():
            flag = "--" + dest.replace("_", "-")
            raise UsageError(f"{flag} '': give a value or leave the flag out (see --help)")
    check_amounts(args)
    reservation_term(args.reservation)  # a bad term is refused before anything is read
    if args.compare is not None:
        if not args.compare.strip():
            raise UsageError("--compare: give a tier name, e.g. --compare a100x8")
        for flag in ("stack", "live", "reservation"):
            if getattr(args, flag):
                raise UsageError(f"--{flag} does not apply to --compare")
        sort_by = args.sort or "gpu-hour"
        cmp = compare_tier(args.compare, currency=args.currency or "USD", sort_by=sort_by)
        if args.plot:
            save_figure(comparison_figure(cmp), args.plot)
        if args.json:
            doc = cmp.to_json()
            if args.plot:
                doc["plot"] = str(args.plot)
            out.write(json.dumps(doc, indent=2) + "\n")
        else:
            render_comparison(cmp, out)
            if args.plot:
                out.write(f"chart written to {args.plot}\n")
        return 0

    if args.plot:
        raise UsageError("--plot only applies to --compare TIER")
    if args.sort is not None:
        raise UsageError("--sort only applies to --compare TIER (it orders the comparison)")
    path = args.stack_file if args.stack_file else stack_path(args.stack)
    cfg = load_stack_file(path)
    inputs = inputs_from_stack(cfg, args)
    # every problem with the inputs, the reservation's included, before any live request
    check_cost_inputs(inputs, currency=args.currency)
    est = estimate_cost(replace(inputs, reservation=None), currency=args.currency)
    live_doc: dict[str, Any] | None = None
    live_line: str | None = None
    check: LiveCheck | None = None
    quote: ReservationQuote | None = None
    not_priced: str | None = None  # why a live reservation price could not be had
    if args.live:
        try:
            check = live_check(inputs)
            live_line = check.message()
            live_doc = {"ok": True, **check.to_json(), "message": live_line}
        except LiveUnavailable as exc:
            live_line = f"not checked: {exc}"
            live_doc = {"ok": False, "message": str(exc)}
            err.write(fit(f"cost.py --live: {exc}") + "\n")
        if inputs.reservation is not None:
            try:
                quote = live_reservation_quote(inputs, check)
                live_doc["reservation"] = {
                    "ok": True,
                    "term": quote.term,
                    "total": quote.total,
                    "source": quote.source,
                }
            except LiveUnavailable as exc:
                not_priced = str(exc)
                live_doc["reservation"] = {"ok": False, "message": not_priced}
                err.write(fit(f"cost.py --live: reservation: {exc}") + "\n")
    if inputs.reservation is not None:
        term = inputs.reservation
        if not_priced and catalog_reservation_quote(inputs.provider, inputs.instance_type, term):
            not_priced = None  # the catalog's dated quote prices it instead
        if not_priced is None:
            # offline without a catalog quote: CostError naming the size and --live
            est = estimate_cost(inputs, currency=args.currency, reservation_quote=quote)
        else:
            est = replace(est, inputs=inputs)  # the bill, and a reservation not priced
    if args.json:
        doc = est.to_json()
        if live_doc is not None:
            doc["live"] = live_doc
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        render_estimate(est, out, live_line, not_priced)
    # --live asked for a comparison: when none could be made (no credentials, no network, an
    # API error) the bill is still printed, and the status says the check did not happen
    return LIVE_NOT_CHECKED if live_doc is not None and not live_doc["ok"] else 0


def main(
    argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv, out, err)
    except (UsageError, CostError, ConfigError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        for problem in problems:
            err.write(fit(f"cost.py: {' '.join(str(problem).split())}") + "\n")
        return 2
    except CatalogError as exc:
        err.write(
            fit(f"cost.py: the catalog data is inconsistent (a bug, not your input): {exc}") + "\n"
        )
        return 1


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    sys.exit(main())
