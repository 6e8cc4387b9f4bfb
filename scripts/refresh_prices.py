#!/usr/bin/env python3
"""Refresh the catalog's instance prices from each cloud's own price API.

    python scripts/refresh_prices.py                 # every cloud that can be asked
    python scripts/refresh_prices.py --cloud azure   # one cloud (repeatable)
    python scripts/refresh_prices.py --dry-run       # show what would change, write nothing

For each cloud, each instance type its catalog.toml prices (in the file's price region),
the cloud's prices.py asks its API for the pay-as-you-go price per hour (the same client as
``cost.py --live``: Azure's Retail Prices API needs no account; AWS's Price List, Alibaba's
DescribePrice and Tencent's InquiryPriceRunInstances are signed, so they need the account's
credentials from the environment). A cloud that cannot be asked (no credentials, no
prices.py) says so in one line and is skipped. Then the price lines of that cloud's
catalog.toml are rewritten in place: only ``on_demand``, ``date`` (today) and ``source``
(the API's [sources] key) change, and ``estimate = true`` goes. Where the cloud's prices.py
also reads spot prices (``live_spot``: AWS DescribeSpotPriceHistory with the account's
credentials, Azure's Retail Prices Spot meters without one), each line that has a spot
range gets ``spot`` (lowest, highest over the region's zones), ``spot_date`` (today) and
``spot_source`` too; Alibaba's DescribeSpotPriceHistory and Tencent's
InquiryPriceRunInstances (SPOTPAID) with the account's credentials give a range to a line
that had none (their prices.py sets ``SPOT_ADDS_RANGES``). Where the cloud's prices.py reads
monthly prices too (``live_monthly``: Alibaba's DescribePrice by the month, Tencent's PREPAID
inquiry), each quote of the file's [pricing.subscription.monthly] gets its ``price``,
``date`` and ``source``. Comments and everything else stay byte for byte. A cloud whose API
fails part way is not written at all.

Prints a table of what changes (type, region, billing, old -> new, change; a spot range's
change is its midpoint's). Exit status
(docs/exit-status.md): 0 every price asked was had; 1 a cloud's API failed, a type had no
price in the answer, or no cloud could be asked; 2 bad input.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra import catalog, clouds  # noqa: E402
from infra.catalog import CatalogError, load_catalog  # noqa: E402
from infra.clouds.live import LivePriceError, NoCredentials, PriceNotFound  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.suggest import did_you_mean  # noqa: E402
from infra.usage import USAGE_EXIT, OneLineParser, fit  # noqa: E402

PROG = "refresh_prices.py"
BILLING = "on-demand"  # what the price APIs answer here: the pay-as-you-go hour


@dataclass(frozen=True)
class Change:
    type: str
    region: str
    old: float
    new: float

    @property
    def percent(self) -> float:
        return (self.new - self.old) / self.old * 100 if self.old else 0.0


@dataclass(frozen=True)
class SpotChange:
    type: str
    region: str
    old: tuple[float, float]
    new: tuple[float, float]

    @property
    def percent(self) -> float:
        was, now = sum(self.old) / 2, sum(self.new) / 2
        return (now - was) / was * 100 if was else 0.0


@dataclass(frozen=True)
class SpotAdded:
    """A spot range where the line had none (the change is said as 'new')."""

    type: str
    region: str
    new: tuple[float, float]
    old: None = None
    percent: float = 0.0


@dataclass
class Outcome:
    """One cloud's answer: its prices, or why there are none (skipped / failed)."""

    cloud: str
    source: str = ""
    currency: str = ""
    changes: list[Change] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # one line per type without a price
    skipped: str = ""  # nothing asked (no credentials, no price API)
    failed: str = ""  # asked, and the API failed: nothing written
    path: Path | None = None
    spot_source: str = ""  # "" when the cloud's prices.py reads no spot prices
    spots: list[SpotChange | SpotAdded] = field(default_factory=list)
    monthly_source: str = ""  # "" when the cloud's prices.py reads no monthly prices
    monthly: list[Change] = field(default_factory=list)


def ask(cloud: str) -> Outcome:
    """Every catalog price of ``cloud`` asked of its API; never raises for the API's sake."""
    out = Outcome(cloud)
    try:
        module = clouds.module(cloud, "prices")
    except LookupError:
        out.skipped = "no price API in its folder (no prices.py)"
        return out
    cat = load_catalog()
    out.source = str(getattr(module, "SOURCE", ""))
    if out.source not in cat.sources:
        out.skipped = "its prices.py names no SOURCE of the catalog's [sources]"
        return out
    priced = [it for (p, _), it in cat.instances.items() if p == cloud and it.price is not None]
    for it in priced:  # one call per type: bounded by the catalog, each call by its client
        assert it.price is not None
        out.currency = it.price.currency
        try:
            answer = answered(out, f"{it.name}: ", module.live_price, it.name, it.price.region)
        except NoCredentials as exc:
            out.skipped = f"{exc} (not refreshed: {', '.join(refreshes(module))})"
            return out
        if out.failed:
            return out
        if answer is None:
            continue
        value, currency = answer
        if currency != it.price.currency:
            out.missing.append(f"{it.name}: the API answered in {currency}, not {out.currency}")
            continue
        out.changes.append(Change(it.name, it.price.region, it.price.on_demand, float(value)))
    out = ask_spot(module, cat, priced, out)
    return out if out.failed else ask_monthly(module, cat, cloud, out)


def refreshes(module: Any) -> list[str]:
    """What the cloud's prices.py refreshes: said when none of it could be asked."""
    what = ["on-demand prices"]
    if getattr(module, "live_spot", None) is not None:
        what.append("spot ranges")
    if getattr(module, "live_monthly", None) is not None:
        what.append("monthly prices")
    return what


def ask_spot(module: Any, cat: Any, priced: Sequence[Any], out: Outcome) -> Outcome:
    """Each priced type's spot range, where the catalog has one and the cloud's prices.py
    reads spot prices (``live_spot`` and a SPOT_SOURCE of the catalog's [sources])."""
    live_spot = getattr(module, "live_spot", None)
    source = str(getattr(module, "SPOT_SOURCE", ""))
    if live_spot is None or source not in cat.sources:
        return out
    out.spot_source = source
    adds = bool(getattr(module, "SPOT_ADDS_RANGES", False))
    for it in priced:
        if it.price.spot is None and not adds:
            continue  # no range to refresh: the catalog says why (a note on the line)
        try:
            answer = answered(out, f"{it.name}'s spot range: ", live_spot, it.name, it.price.region)
        except NoCredentials as exc:
            out.missing.append(f"the spot ranges: {exc}")
            out.spot_source = ""
            return out
        if out.failed:
            return out
        if answer is None:
            continue
        low, high, currency = answer
        if currency != it.price.currency:
            out.missing.append(f"{it.name}'s spot range: answered in {currency}")
            continue
        new = (round(float(low), 6), round(float(high), 6))
        if it.price.spot is None:
            out.spots.append(SpotAdded(it.name, it.price.region, new))
        else:
            out.spots.append(SpotChange(it.name, it.price.region, tuple(it.price.spot), new))
    return out


def ask_monthly(module: Any, cat: Any, cloud: str, out: Outcome) -> Outcome:
    """Each monthly quote of the cloud's [pricing.subscription.monthly] asked again, where
    its prices.py reads monthly prices (``live_monthly`` and a MONTHLY_SOURCE of the
    catalog's [sources]). Only the quotes the file has: a type without one stays without."""
    live_monthly = getattr(module, "live_monthly", None)
    source = str(getattr(module, "MONTHLY_SOURCE", ""))
    if live_monthly is None or source not in cat.sources:
        return out
    path = catalog.cloud_file_path(cloud)
    with path.open("rb") as f:
        doc = tomllib.load(f)
    quotes = doc.get("pricing", {}).get("subscription", {}).get("monthly", {})
    region = str(doc.get("provider", {}).get("price_region", ""))
    currency = str(doc.get("provider", {}).get("currency", out.currency))
    out.monthly_source = source
    for name, quote in quotes.items():  # one call per quote: bounded by the file
        try:
            answer = answered(out, f"{name}'s monthly price: ", live_monthly, name, region)
        except NoCredentials as exc:
            out.missing.append(f"the monthly prices: {exc}")
            out.monthly_source = ""
            return out
        if out.failed:
            return out
        if answer is None:
            continue
        value, in_currency = answer
        if in_currency != currency:
            out.missing.append(f"{name}'s monthly price: answered in {in_currency}")
            continue
        out.monthly.append(Change(name, region, float(quote["price"]), float(value)))
    return out


def answered(out: Outcome, missing: str, live: Callable[..., Any], *args: Any) -> Any:
    """``live(*args)``'s answer; None when there is none: a price the API does not have
    (a line of ``out.missing``, after ``missing``) or a failed call (``out.failed``, one
    line, never a trace). NoCredentials goes to the caller: what it skips is its own."""
    try:
        return live(*args)
    except NoCredentials:
        raise
    except PriceNotFound as exc:
        out.missing.append(f"{missing}{exc}")
    except LivePriceError as exc:
        out.failed = brief(str(exc))
    except Exception as exc:  # an SDK's own error we did not foresee: one line, not a trace
        out.failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^\"'>)]+)")


def brief(message: str) -> str:
    """A transport failure as its API and its reason ('... DescribePrice: Connection
    refused'), not the SDK's nested retry text; any other message as it is."""
    m = _ERRNO.search(message)
    return f"{message.split(':')[0]}: {m[1].strip()}" if m else message


# ----------------------------------------------------------------------------------------------
# the rewrite: price lines only, everything else byte for byte

_SECTION = re.compile(r'^\[\s*instances\.(?:"(?P<quoted>[^"]+)"|(?P<bare>[A-Za-z0-9_-]+))\s*\]')
_PRICE_LINE = re.compile(r"^price\s*=\s*\{")
_ON_DEMAND = re.compile(r"(?<![\w-])(on_demand\s*=\s*)[0-9][0-9_.eE+-]*")
_DATE = re.compile(r'(?<![\w-])(date\s*=\s*)"[^"]*"')
_SOURCE = re.compile(r'(?<![\w-])(source\s*=\s*)"[^"]*"')
_ESTIMATE = re.compile(r",\s*estimate\s*=\s*(?:true|false)(?=\s*[,}])")
_SPOT = re.compile(r"(?<![\w-])(spot\s*=\s*)\[[^\]]*\]")
_SPOT_DATE = re.compile(r'(?<![\w-])(spot_date\s*=\s*)"[^"]*"')
_SPOT_SOURCE = re.compile(r'(?<![\w-])(spot_source\s*=\s*)"[^"]*"')
_MONTHLY_SECTION = re.compile(r"^\[\s*pricing\.subscription\.monthly\s*\]")
_MONTHLY_LINE = re.compile(r'^"(?P<name>[^"]+)"\s*=\s*\{')
_PRICE = re.compile(r"(?<![\w-])(price\s*=\s*)[0-9][0-9_.eE+-]*")


def toml_float(value: float) -> str:
    """The shortest text that reads back as the same float (TOML wants a digit after '.')."""
    text = repr(float(value))
    return text if ("." in text or "e" in text or "n" in text) else f"{text}.0"


def rewrite(
    text: str,
    prices: Mapping[str, float],
    date: dt.date,
    source: str,
    spots: Mapping[str, tuple[float, float]] | None = None,
    spot_source: str = "",
    monthly: Mapping[str, float] | None = None,
    monthly_source: str = "",
) -> str:
    """``text`` with each named type's price line given the new on_demand, date and source
    (and no estimate flag), each type in ``spots`` its new spot range, spot_date and
    spot_source (added after the range where the line had none, all three where it had no
    range), and each quote in ``monthly`` (its line of [pricing.subscription.monthly]) its
    new price, date and source. Raises ValueError when a line is not found or the result
    parses to anything but those changes."""
    spots, monthly = spots or {}, monthly or {}
    lines = text.splitlines(keepends=True)
    section: str | None = None
    in_monthly = False
    done: set[str] = set()
    quoted: set[str] = set()
    for i, line in enumerate(lines):
        if line.startswith("["):
            m = _SECTION.match(line)
            section = (m["quoted"] or m["bare"]) if m else None
            in_monthly = _MONTHLY_SECTION.match(line) is not None
            continue
        q = _MONTHLY_LINE.match(line) if in_monthly else None
        if q and q["name"] in monthly and q["name"] not in quoted:
            lines[i] = _price_fields(line, monthly[q["name"]], date, monthly_source, _PRICE)
            quoted.add(q["name"])
            continue
        if section is None or section in done or not _PRICE_LINE.match(line):
            continue
        if section in prices:
            line = _price_fields(line, prices[section], date, source)
        if section in spots:
            line = _spot_fields(line, spots[section], date, spot_source)
        if section in prices or section in spots:
            lines[i] = line
            done.add(section)
    lost = (set(prices) | set(spots)) - done
    if lost:
        raise ValueError(f"no one-line price = {{...}} for {', '.join(sorted(lost))}")
    if set(monthly) - quoted:
        raise ValueError(f"no monthly quote line for {', '.join(sorted(set(monthly) - quoted))}")
    result = "".join(lines)
    _check(text, result, prices, date, source, spots, spot_source, monthly, monthly_source)
    return result


def _price_fields(
    line: str, value: float, date: dt.date, source: str, field: re.Pattern[str] = _ON_DEMAND
) -> str:
    text = toml_float(value)
    new = field.sub(lambda m: m[1] + text, line, count=1)
    new = _DATE.sub(lambda m: f'{m[1]}"{date.isoformat()}"', new, count=1)
    new = _SOURCE.sub(lambda m: f'{m[1]}"{source}"', new, count=1)
    return _ESTIMATE.sub("", new, count=1)


def _spot_fields(line: str, spot: tuple[float, float], date: dt.date, source: str) -> str:
    pair = f"[{toml_float(spot[0])}, {toml_float(spot[1])}]"
    if not _SPOT.search(line):  # no range yet: one, with its date and source, before the '}'
        end = line.index("}")
        tail = f', spot = {pair}, spot_date = "{date.isoformat()}", spot_source = "{source}"'
        return line[:end].rstrip() + tail + " " + line[end:]
    new = _SPOT.sub(lambda m: m[1] + pair, line, count=1)
    day = f'"{date.isoformat()}"'
    extra = ""
    if _SPOT_DATE.search(new):
        new = _SPOT_DATE.sub(lambda m: m[1] + day, new, count=1)
    else:
        extra += f", spot_date = {day}"
    if _SPOT_SOURCE.search(new):
        new = _SPOT_SOURCE.sub(lambda m: f'{m[1]}"{source}"', new, count=1)
    else:
        extra += f', spot_source = "{source}"'
    return _SPOT.sub(lambda m: m[0] + extra, new, count=1) if extra else new


def _check(
    before: str,
    after: str,
    prices: Mapping[str, float],
    date: dt.date,
    source: str,
    spots: Mapping[str, tuple[float, float]] | None = None,
    spot_source: str = "",
    monthly: Mapping[str, float] | None = None,
    monthly_source: str = "",
) -> None:
    """The rewritten file means the old one plus exactly these price changes."""
    want: dict[str, Any] = tomllib.loads(before)
    for name, value in prices.items():
        price = want["instances"][name]["price"]
        price.update(on_demand=value, date=date.isoformat(), source=source)
        price.pop("estimate", None)
    for name, (low, high) in (spots or {}).items():
        price = want["instances"][name]["price"]
        price.update(spot=[low, high], spot_date=date.isoformat(), spot_source=spot_source)
    for name, value in (monthly or {}).items():
        quote = want["pricing"]["subscription"]["monthly"][name]
        quote.update(price=value, date=date.isoformat(), source=monthly_source)
        quote.pop("estimate", None)
    if tomllib.loads(after) != want:
        raise ValueError("the rewritten file would change more than the prices: not written")


# ----------------------------------------------------------------------------------------------
# what is shown


def money(value: float) -> str:
    """At least two decimals, up to four, no trailing zeros past two."""
    text = f"{value:,.4f}"
    while text.endswith("0") and len(text.split(".")[1]) > 2:
        text = text[:-1]
    return text


def span(pair: tuple[float, float] | None) -> str:
    """A spot range as the catalog reads it: '1.27-1.52', or one price when low == high;
    '-' for none (a range the line did not have)."""
    if pair is None:
        return "-"
    return money(pair[0]) if pair[0] == pair[1] else f"{money(pair[0])}-{money(pair[1])}"


def table(outcome: Outcome) -> list[str]:
    """What changes, one row a type and billing: type, region, billing, old -> new, change;
    the monthly quotes in a table of their own (their figures are wider)."""
    moved = [c for c in outcome.changes if c.new != c.old]
    rows = [
        (c.type, c.region, BILLING, money(c.old), money(c.new), f"{c.percent:+.1f}%") for c in moved
    ]
    rows += [
        (c.type, c.region, "spot", span(c.old), span(c.new), _change(c))
        for c in outcome.spots
        if c.new != c.old
    ]
    monthly = [
        (c.type, c.region, "monthly", money(c.old), money(c.new), f"{c.percent:+.1f}%")
        for c in outcome.monthly
        if c.new != c.old
    ]
    return _columns(rows) + _columns(monthly)


def _columns(rows: list[tuple[str, str, str, str, str, str]]) -> list[str]:
    if not rows:
        return []
    head = ("type", "region", "billing", "old", "new", "change")
    w = [max(len(r[k]) for r in [head, *rows]) for k in range(6)]
    # two spaces between columns, one where that would pass 80 (long names and ranges)
    gap = "  " if sum(w) + 16 <= 80 else " "
    out = []
    for r in [head, *rows]:
        arrow = "    " if r is head else " -> "
        out.append(
            f"  {r[0]:<{w[0]}}{gap}{r[1]:<{w[1]}}{gap}{r[2]:<{w[2]}}{gap}"
            f"{r[3]:>{w[3]}}{arrow}{r[4]:>{w[4]}}{gap}{r[5]:>{w[5]}}".rstrip()
        )
    return out


def _change(c: SpotChange | SpotAdded) -> str:
    return "new" if c.old is None else f"{c.percent:+.1f}%"


def _count_line(cloud: str, what: str, changes: Sequence[Any], source: str, verb: str) -> str:
    """``<cloud>: N <what> from <source>, M changed, K the same`` (``what`` may carry its
    unit)."""
    moved = sum(1 for c in changes if c.new != c.old)
    return fit(
        f"{cloud}: {len(changes)} {what} from {source}, {moved} {verb}, "
        f"{len(changes) - moved} the same"
    )


def report(outcome: Outcome, today: dt.date, dry_run: bool, out: TextIO) -> None:
    verb = "would change" if dry_run else "changed"
    cloud, cur = outcome.cloud, outcome.currency
    lines = [_count_line(cloud, "prices", outcome.changes, f"{outcome.source} ({cur}/h)", verb)]
    if outcome.spot_source:
        lines.append(_count_line(cloud, "spot ranges", outcome.spots, outcome.spot_source, verb))
    if outcome.monthly_source:
        monthly = f"{outcome.monthly_source} ({cur}/month)"
        lines.append(_count_line(cloud, "monthly prices", outcome.monthly, monthly, verb))
    lines += table(outcome)
    if outcome.changes or outcome.spots or outcome.monthly:
        where = display_path(outcome.path) if outcome.path else f"{outcome.cloud}'s catalog"
        did = "would be" if dry_run else "are now"
        said = f"{where}: its prices {did} dated {today.isoformat()}, source {outcome.source}"
        if outcome.spots:
            said += f"; its spot ranges source {outcome.spot_source}"
        if outcome.monthly:
            said += f"; its monthly prices source {outcome.monthly_source}"
        lines.append(fit(said))
    print("\n".join(lines), file=out)


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None, known: Sequence[str]) -> Any:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cloud",
        action="append",
        metavar="NAME",
        help=f"only this cloud (repeatable; one of {', '.join(known)})",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change, write nothing"
    )
    return parser.parse_args(argv)


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        known = catalog.provider_names()
        load_catalog()
    except CatalogError as exc:
        print(fit(f"{PROG}: the catalog is broken: {exc}"), file=err)
        return 1
    try:
        args = parse(argv, known)
    except SystemExit as exc:  # argparse said it in one line (or printed --help)
        return exc.code if isinstance(exc.code, int) else USAGE_EXIT
    unknown = [name for name in args.cloud or [] if name not in known]
    for name in unknown:
        problem = f"--cloud {name!r}: not a cloud{did_you_mean(name, known)} (see --help)"
        print(fit(f"{PROG}: {problem}"), file=err)
    if unknown:
        return USAGE_EXIT
    today = dt.date.today()
    status, asked = 0, 0
    try:
        for cloud in args.cloud or known:
            outcome = ask(cloud)
            if outcome.skipped:
                print(fit(f"{cloud}: skipped: {outcome.skipped}"), file=err)
                continue
            asked += 1
            if outcome.failed:
                print(fit(f"{cloud}: {outcome.failed}; nothing rewritten"), file=err)
                status = 1
                continue
            for line in outcome.missing:
                print(fit(f"{cloud}: kept {line}"), file=err)
                status = 1
            outcome.path = catalog.cloud_file_path(cloud)
            touched = outcome.changes or outcome.spots or outcome.monthly
            if touched and not write(outcome, today, args.dry_run, err):
                status = 1
                continue
            report(outcome, today, args.dry_run, out)
        if args.dry_run and asked:
            print("--dry-run: nothing written", file=out)
        out.flush()
    except BrokenPipeError:  # `refresh_prices.py | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if not asked:
        print(fit(f"{PROG}: no cloud could be asked; nothing rewritten"), file=err)
        return 1
    return status


def write(outcome: Outcome, today: dt.date, dry_run: bool, err: TextIO) -> bool:
    """Rewrite the cloud's file (a temporary file renamed over it), or only check that it
    can be, with ``dry_run``. False (said in one line) when it cannot."""
    assert outcome.path is not None
    prices = {c.type: c.new for c in outcome.changes}
    spots = {c.type: c.new for c in outcome.spots}
    monthly = {c.type: c.new for c in outcome.monthly}
    try:
        text = outcome.path.read_bytes().decode("utf-8")
        new = rewrite(
            text,
            prices,
            today,
            outcome.source,
            spots,
            outcome.spot_source,
            monthly,
            outcome.monthly_source,
        )
        if not dry_run and new != text:
            tmp = outcome.path.with_name(f".{outcome.path.name}.refresh")
            tmp.write_bytes(new.encode("utf-8"))
            os.replace(tmp, outcome.path)
    except (OSError, ValueError) as exc:
        print(fit(f"{outcome.cloud}: {display_path(outcome.path)}: {exc}"), file=err)
        return False
    return True


if __name__ == "__main__":
    one_command()
    sys.exit(main())
