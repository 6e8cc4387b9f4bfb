#!/usr/bin/env python3
"""Where a tier or an instance type can be had: every cloud, region and zone, with prices.

    python scripts/where.py a100x8               # a tier: every cloud that offers it
    python scripts/where.py p4d.24xlarge --json  # one instance type
    python scripts/where.py h100x8 --live --region us-east-1

Offline, from the catalog (dated, sourced zone lists and prices, infra/clouds/*/zones.toml);
with --live, each cloud's own availability signal too (its credentials from the
environment; a cloud without any says so in one line and its offline rows still print).
Sorted by on-demand price in USD. Exit status: 0 done, 2 bad input (one line on stderr),
1 the catalog data itself is broken. A live signal that fails never changes the status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra import where  # noqa: E402
from infra.catalog import CatalogError, load_catalog  # noqa: E402
from infra.pricing.price_sheet import load_pricing  # noqa: E402
from infra.render import output_width  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.suggest import did_you_mean  # noqa: E402
from infra.usage import OneLineParser, fit  # noqa: E402
from infra.zones import load_zone_data  # noqa: E402

PROG = "where.py"


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = OneLineParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("query", metavar="TIER|INSTANCE_TYPE", help="a tier key or a type name")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--live", action="store_true", help="ask each cloud's own availability signal too"
    )
    parser.add_argument(
        "--region",
        action="append",
        default=[],
        help="with --live: only this region (repeat for more; default: the offline rows')",
    )
    args = parser.parse_args(argv)
    if args.region and not args.live:
        print(f"{PROG}: --region only narrows --live: add --live", file=err)
        return 2
    try:
        catalog = load_catalog()
        pricing = load_pricing()
        kind, found = where.targets(catalog, args.query)
        zone_data = load_zone_data()
    except where.UsageError as exc:
        print(fit(f"{PROG}: {exc}"), file=err)
        return 2
    except CatalogError as exc:
        print(fit(f"{PROG}: the catalog data is broken: {exc}"), file=err)
        return 1
    clouds = sorted({it.provider for it, _ in found})
    known = {r for c in clouds for r in catalog.providers[c].regions}
    strange = [r for r in args.region if known and r not in known]
    if strange:  # refused here: no cloud is asked about a region none of them has
        hint = did_you_mean(strange[0], known)
        print(
            fit(f"{PROG}: --region {strange[0]!r} is not a region of {', '.join(clouds)}{hint}"),
            file=err,
        )
        return 2

    def usd(currency: str) -> float | None:
        try:
            return pricing.fx_rate(currency, "USD")[0]
        except KeyError:
            return None

    rows = where.offers(catalog, zone_data, found, usd)
    gone = where.missing(zone_data, found, rows)
    if kind == "tier":
        gone += where.not_offered(catalog, args.query)
    answers = where.live(rows, args.region) if args.live else []
    if args.json:
        doc = {
            "query": args.query,
            "kind": kind,
            "rows": [r.to_json() for r in rows],
            "not_offered": gone,
            "live": [a.to_json() for a in answers] if args.live else None,
        }
        json.dump(doc, out, indent=1)
        out.write("\n")
        return 0
    out.write(where.render(args.query, kind, rows, answers, output_width(out), gone))
    return 0


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    sys.exit(main())
