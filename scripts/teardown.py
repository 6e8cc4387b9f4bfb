#!/usr/bin/env python3
"""Stop idle managed GPU instances: the scheduled reaper, as a command.

Dry run unless --apply. Prints one decision per managed instance (id, stack, action
stop|keep, reason) and what the stops save per hour; --json prints one JSON object
{"decisions": [...], "summary": {...}}. Never terminates; never touches untagged or
gpufleet:protected=true instances.

    python scripts/teardown.py --provider aws --region us-east-1 --stack a100x4
    python scripts/teardown.py --provider aws --region us-east-1 --apply --json

Decisions use the API's clock (its Date header), not this host's. An instance whose data
cannot be read (no heartbeat, a failed metrics query, a bad tag) is kept and marked
"unknown". The API endpoint is the cloud's, or --endpoint-url; GPUFLEET_ENDPOINT_URL in the
environment is ignored here (a notice says so).

Exit status: 0 every intended stop succeeded (or dry run) and every API answered in full;
1 a stop failed, a metrics read failed or an instance could not be judged (the last line on
stderr says which); 2 bad input or the scan itself failed (nothing was stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra.reaper.core import PriceLookup, Report, reap  # noqa: E402
from infra.reaper.handler import CLOUDS, ConfigError, make_cloud  # noqa: E402
from infra.usage import fit  # noqa: E402

# AWS / Alicloud regions (us-east-1, cn-beijing) and Azure locations (eastus, westeurope2).
_REGION = re.compile(r"^([a-z]{2}(-[a-z0-9]+){1,3}|[a-z]{4,}[0-9]?)$")
_STACK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def catalog_prices() -> PriceLookup | None:
    """Prices from infra/catalog when it is importable; the reaper also runs without it."""
    try:
        from infra.catalog import load_catalog

        cat = load_catalog()
    except Exception:  # missing or broken catalog: report "price unknown", still reap
        return None

    def lookup(provider: str, instance_type: str, spot: bool) -> tuple[int, float | None, str]:
        item = cat.instances.get((provider, instance_type))
        if item is None:
            raise LookupError
        price = item.price
        if price is None:
            return item.gpus, None, "USD"
        band = price.spot if spot else None
        # Spot prices move: the middle of the catalog's observed band is the estimate.
        per_hour = (band[0] + band[1]) / 2 if band else price.on_demand
        return item.gpus, per_hour, price.currency

    def safe(provider: str, instance_type: str, spot: bool) -> tuple[int, float | None, str] | None:
        try:
            return lookup(provider, instance_type, spot)
        except (LookupError, AttributeError):
            return None

    return safe


class _OneLineParser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit status 2, never a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, fit(f"teardown: {message} (see --help)") + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _OneLineParser(
        description="Stop idle gpufleet GPU instances (dry run unless --apply)."
    )
    parser.add_argument("--provider", required=True, choices=sorted(CLOUDS))
    parser.add_argument(
        "--region", required=True, help="e.g. us-east-1, cn-beijing, ap-guangzhou, eastus"
    )
    parser.add_argument("--stack", help="only this stack's instances (default: every stack)")
    parser.add_argument("--endpoint-url", help="alternative API endpoint (local tests)")
    parser.add_argument("--apply", action="store_true", help="really stop (default: dry run)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if not _REGION.match(args.region):
        parser.error(f"--region {args.region!r} does not look like a region (e.g. us-east-1)")
    if args.stack is not None and not _STACK.match(args.stack):
        parser.error(f"--stack {args.stack!r}: letters, digits, '-', '_' and '.' only")
    if args.endpoint_url and not re.match(r"^https?://", args.endpoint_url):
        parser.error(f"--endpoint-url {args.endpoint_url!r} must start with http:// or https://")
    return args


def render_text(report: Report) -> str:
    lines = []
    width = max([len(d.instance_id) for d in report.decisions] + [11])
    for d in report.decisions:
        result = f" [{d.result}]" if d.result else ""
        if d.unknown and not result:
            result = " [unknown]"
        lines.append(
            f"{d.instance_id:<{width}}  {d.stack or '-':<14} {d.action:<4}  {d.reason}{result}"
        )
        if d.warning:
            lines.append(f"{'':<{width}}  warning: {d.warning}")
    s = report.summary
    mode = "applied" if report.apply else "dry run: nothing was stopped (use --apply)"
    money = ", ".join(f"{v:.2f} {c}/h" for c, v in sorted(s["saved_per_hour"].items()))
    if s.get("price_unknown"):
        unknown = ", ".join(s["price_unknown"])
        money = f"{money}; " if money else ""
        money += f"price unknown for {unknown}"
    clock = s.get("clock") or {}
    if clock.get("warning"):
        lines.append(f"clock: {clock['warning']}")
    lines.append(
        f"{s['instances']} managed instance(s): {s['stop']} to stop, {s['keep']} kept "
        f"({s.get('unknown', 0)} unknown); {s['stopped']} stopped, {s['failed']} failed ({mode})"
    )

    lines.append(
        f"saves {s['gpu_hours_saved_per_hour']} GPU-hours per hour; {money or 'nothing to save'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Retry tuning and the Alicloud account id come from the environment, as in the cloud
    # function; the endpoint never does (a stray variable must not redirect the calls).
    env: dict[str, Any] = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("GPUFLEET_") and k not in ("GPUFLEET_REGION", "GPUFLEET_ENDPOINT_URL")
    }
    env["GPUFLEET_REGION"] = args.region
    if os.environ.get("GPUFLEET_ENDPOINT_URL"):
        print(
            "teardown: GPUFLEET_ENDPOINT_URL is ignored here; pass --endpoint-url instead",
            file=sys.stderr,
        )
    try:
        cloud = make_cloud(args.provider, env, endpoint=args.endpoint_url)
    except (ConfigError, ValueError) as exc:
        print(fit(f"teardown: {_one_line(exc)}"), file=sys.stderr)
        return 2
    try:
        report = reap(cloud, stack=args.stack, apply=args.apply, price=catalog_prices())
    except Exception as exc:  # the scan failed: nothing was decided, nothing stopped
        why = f"{type(exc).__name__}: {_one_line(exc)}"
        print(fit(f"teardown: scan failed, nothing stopped: {why}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(render_text(report))
    if report.problems:
        print(fit(f"teardown: {'; '.join(report.problems)}"), file=sys.stderr)
    return report.exit_code


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


if __name__ == "__main__":
    sys.exit(main())
