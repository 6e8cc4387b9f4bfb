#!/usr/bin/env python3
"""Reserved capacity for a tier: each cloud's offerings for fixed dates, priced.

    python scripts/reserve.py h100x8 --start 2026-12-14 --days 7 --nodes 2
    python scripts/reserve.py a100x8 --start 2026-12-14 --days 14 --json

Asks each cloud that sells capacity for fixed dates through an API (its folder's
reserved.py: AWS Capacity Blocks for ML, DescribeCapacityBlockOfferings) with the account's
credentials from the environment, for offerings starting between --start and --end
(default: a week after --start). Each offering: zone, dates, the upfront fee for the whole
block, per instance-hour and per GPU-hour, against the tier's on-demand price. A cloud that
sells reservations another way says what and how to target one (capacityReservation).
Exit status: 0 done, 2 bad input (one line on stderr), 1 no cloud could be asked.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra import reserved  # noqa: E402
from infra.catalog import Feature, load_catalog  # noqa: E402
from infra.render import output_width, wrap  # noqa: E402
from infra.suggest import did_you_mean  # noqa: E402
from infra.usage import OneLineParser, fit, whole_number  # noqa: E402

PROG = "reserve.py"


def _date(text: str) -> dt.datetime:
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def _problem(cat: Any, args: argparse.Namespace) -> str | None:
    """What is wrong with the request, before any cloud is asked (None: nothing)."""
    if args.tier not in cat.tiers:
        return f"{args.tier!r} is not a tier{did_you_mean(args.tier, cat.tiers)}"
    sold = [c for c in reserved.sellers() if c in cat.tiers[args.tier].offers]
    said = (reserved.request_problem(c, args.days, args.nodes) for c in sold)
    problem = next((x for x in said if x), None)
    if problem:
        return problem
    if args.region is not None:
        known = {r for c in sold for r in cat.providers[c].regions}
        if known and args.region not in known:
            hint = did_you_mean(args.region, known)
            return f"--region {args.region!r} is not a region of {', '.join(sold)}{hint}"
    try:
        least = args.start + dt.timedelta(days=args.days)
        end = args.end or least + dt.timedelta(days=7)
    except OverflowError:
        return f"--start {args.start.date()} plus --days {args.days} is past the calendar's end"
    if end < least:
        return f"--end {end.date()} is before --start plus --days: move it later"
    return None


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    p = OneLineParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    p.add_argument("tier", help="a tier key of the catalog, e.g. h100x8")
    p.add_argument("--start", type=_date, required=True, help="earliest start (YYYY-MM-DD)")
    p.add_argument("--end", type=_date, help="latest end (default: a week after start+days)")
    p.add_argument(
        "--days", type=whole_number(1), required=True, help="how long: 1-14, or whole weeks"
    )
    p.add_argument(
        "--nodes", type=whole_number(1), default=1, help="instances in the block (default 1)"
    )
    p.add_argument("--region", help="region to ask (default: each cloud's default region)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    cat = load_catalog()
    problem = _problem(cat, args)
    if problem:
        print(fit(f"{PROG}: {problem}"), file=err)
        return 2
    end = args.end or args.start + dt.timedelta(days=args.days + 7)
    tier = cat.tiers[args.tier]
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    asked = failed = 0
    for provider, by_profile in tier.offers.items():
        info = cat.providers[provider]
        itype = next(iter(by_profile.values()))
        if provider not in reserved.sellers():
            why = info.unsupported.get(Feature.CAPACITY_BLOCK, "no offering API here")
            lines.append(f"{provider}: {why}")
            continue
        region = args.region or info.default_region
        asked += 1
        try:
            found = reserved.offerings(
                provider, itype, args.nodes, args.start, end, args.days * 24, region
            )
        except reserved.NoOffering as exc:
            failed += 1
            lines.append(f"{provider} {itype}: {exc}")
            continue
        it = cat.instance(provider, itype)
        od = it.price.on_demand if it.price and region == info.price_region else None
        if not found:
            lines.append(f"{provider} {itype} in {region}: no offering for those dates")
        for o in found:
            row = o.to_json(it.gpus)
            row["on_demand_per_hour"] = od
            rows.append(row)
            versus = f", on-demand {od:,.2f}" if od is not None else ""
            lines.append(
                f"{provider} {o.zone} {o.count}x {o.instance_type} {o.start:%Y-%m-%d %H:%M}"
                f" to {o.end:%Y-%m-%d %H:%M} ({o.hours} h): {o.upfront_fee:,.2f} "
                f"{o.currency} upfront, {o.per_instance_hour():,.2f}/instance-h{versus}, "
                f"{row['per_gpu_hour']:,.2f}/GPU-h ({o.offering_id})"
            )
    if args.json:
        json.dump({"tier": args.tier, "offerings": rows, "notes": lines}, out, indent=1)
        out.write("\n")
    else:
        width = output_width(out)
        out.write(f"reserved capacity: {args.tier}, {args.nodes} node(s), {args.days} days\n")
        for line in lines:
            out.write("\n".join(wrap(line, width, "", "    ")) + "\n")
    return 1 if asked and failed == asked else 0


if __name__ == "__main__":
    sys.exit(main())
