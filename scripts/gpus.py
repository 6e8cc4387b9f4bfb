#!/usr/bin/env python3
"""Every GPU model and instance type the catalog knows, per provider, with prices.

    python scripts/gpus.py                    # every GPU model, every provider
    python scripts/gpus.py --gpu A100         # models whose key or name contains A100
    python scripts/gpus.py --provider aws --json

Per instance type: GPUs, GPU memory, interconnect (NVSwitch / NVLink / PCIe, and the network),
the tier it serves, on-demand and spot per hour and per GPU-hour in one common currency (USD
unless --currency says otherwise; the line below each row gives the cloud's own currency and
the rate used), and the price date. Spot ranges the catalog has not observed are the 30-70 %
planning band, marked `~`; a spot price seen once is one figure, with its date and source.
Exit status: 0 done, 2 bad input (one line per problem on stderr), 1 the catalog data itself
is broken.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra.catalog import Catalog, CatalogError, Gpu, InstanceType, load_catalog  # noqa: E402
from infra.pricing.price_sheet import Pricing, load_pricing  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.suggest import did_you_mean  # noqa: E402
from infra.usage import OneLineParser, fit  # noqa: E402

WIDTH = 80


class UsageError(Exception):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def interconnect(it: InstanceType, gpu: Gpu) -> str:
    if it.gpus == 1:
        link = "single GPU"
    elif it.nvswitch:
        link = "NVSwitch"
    elif it.nvlink:
        link = "NVLink"
    else:
        link = "PCIe"
    net = f"{'up to ' if it.network_up_to else ''}{it.network_gbps:g} Gbps"
    if it.efa:
        net += f", {it.efa_interfaces} EFA"
    if it.infiniband:
        net += f", {it.infiniband_gbps:g} Gbps InfiniBand" if it.infiniband_gbps else ", InfiniBand"
    return f"{link}; {net}"


def matching_gpus(cat: Catalog, wanted: str | None) -> list[Gpu]:
    if wanted is None:
        return list(cat.gpus.values())
    w = wanted.strip().lower()
    if not w:  # an empty --gpu matched every model
        raise UsageError(["--gpu '': give part of a GPU model's key or name (e.g. A100)"])
    found = [g for g in cat.gpus.values() if w in g.key.lower() or w in g.name.lower()]
    if not found:
        raise UsageError(
            [
                f"--gpu: no GPU model matches {wanted!r}{did_you_mean(wanted, cat.gpus)}; "
                f"known: {', '.join(cat.gpus)}"
            ]
        )
    return found


def rows(
    cat: Catalog,
    prc: Pricing,
    gpu_filter: str | None,
    provider: str | None,
    common: str = "USD",
) -> list[dict[str, Any]]:
    """One dict per GPU model, each with its instance types (the --json contract), every
    price in its cloud's own currency and, beside it, in `common`."""
    if provider is not None and provider not in cat.providers:
        raise UsageError(
            [
                f"--provider: {provider!r} is not in the catalog"
                f"{did_you_mean(provider, cat.providers)}; use one of {', '.join(cat.providers)}"
            ]
        )
    if common not in prc.currencies:
        raise UsageError(
            [
                f"--currency: {common!r} is unknown{did_you_mean(common, prc.currencies)}; "
                f"use one of {', '.join(prc.currencies)}"
            ]
        )
    out = []
    for gpu in matching_gpus(cat, gpu_filter):
        types = []
        for (prov, _), it in cat.instances.items():
            if it.gpu != gpu.key or (provider and prov != provider):
                continue
            types.append(_type_row(cat, prc, it, gpu, common))
        types.sort(key=lambda r: (r["provider"], r["gpus"], r["instance_type"]))
        out.append(
            {
                "gpu": gpu.key,
                "name": gpu.name,
                "memory_gb": gpu.memory_gb,
                "bandwidth_gbs": gpu.bandwidth_gbs,
                "form": gpu.form,
                "peak_tflops": gpu.peak_tflops,
                "training_dtype": gpu.training_dtype,
                "unverified": list(gpu.unverified),
                "source": gpu.source,
                "instances": types,
            }
        )
    return out


def _type_row(
    cat: Catalog, prc: Pricing, it: InstanceType, gpu: Gpu, common: str
) -> dict[str, Any]:
    price = it.price
    info = cat.providers[it.provider]
    row: dict[str, Any] = {
        "provider": it.provider,
        "instance_type": it.name,
        "tier": cat.tier_of(it.provider, it.name),
        "gpus": it.gpus,
        "gpu_memory_gb": gpu.memory_gb,
        "interconnect": interconnect(it, gpu),
        "currency": info.currency,
        "on_demand": None,
        "on_demand_per_gpu": None,
        "spot": None,
        "spot_per_gpu": None,
        "spot_estimated": None,
        "price_date": None,
        "spot_date": None,
        "source": None,
        "spot_observation": None,
        "note": it.note or None,
        "common_currency": common,
        "fx_rate": None,
        "on_demand_common": None,
        "on_demand_per_gpu_common": None,
        "spot_per_gpu_common": None,
    }
    if price is None:
        return row
    if price.spot:
        spot, estimated, spot_date = price.spot, False, price.spot_date or price.date
    elif "spot" in info.billing:
        lo, hi = prc.spot_band
        spot, estimated, spot_date = (price.on_demand * lo, price.on_demand * hi), True, price.date
    else:
        spot, estimated, spot_date = None, None, None
    row.update(
        on_demand=price.on_demand,
        on_demand_per_gpu=round(price.on_demand / it.gpus, 4),
        spot=[round(spot[0], 4), round(spot[1], 4)] if spot else None,
        spot_per_gpu=[round(spot[0] / it.gpus, 4), round(spot[1] / it.gpus, 4)] if spot else None,
        spot_estimated=estimated,
        price_date=price.date.isoformat(),
        spot_date=spot_date.isoformat() if spot_date else None,
        source=price.source + (f"; spot {price.spot_source}" if price.spot_source else ""),
        spot_observation=price.spot_observation,
    )
    k, rate = prc.fx_rate(info.currency, common)
    row.update(
        fx_rate=None
        if rate is None
        else {"rate": round(k, 6), "date": rate.date.isoformat(), "source": rate.source},
        on_demand_common=round(price.on_demand * k, 4),
        on_demand_per_gpu_common=round(price.on_demand * k / it.gpus, 4),
        spot_per_gpu_common=[round(x * k / it.gpus, 4) for x in spot] if spot else None,
    )
    return row


def _p(x: float | None) -> str:
    return "-" if x is None else (f"{x:,.2f}" if x < 1000 else f"{x:,.0f}")


def _spot(pair: list[float] | None, estimated: bool | None) -> str:
    """'~0.27-0.63', or one figure where the catalog saw one spot price once."""
    if not pair:
        return "-"
    lo, hi = pair
    return ("~" if estimated else "") + (_p(lo) if lo == hi else f"{_p(lo)}-{_p(hi)}")


def render(models: list[dict[str, Any]], common: str = "USD") -> str:
    """Each row in the common currency (so rows of different clouds compare); the line under
    it gives the cloud's own currency, the rate used and where the price comes from."""
    lines: list[str] = []
    for g in models:
        extra = f"; unverified: {', '.join(g['unverified'])}" if g["unverified"] else ""
        lines += textwrap.wrap(
            f"{g['gpu']} ({g['name']}): {g['memory_gb']:g} GB, {g['bandwidth_gbs']:g} GB/s, "
            f"{g['peak_tflops']:g} TF/s {g['training_dtype']}, {g['form']}{extra}",
            WIDTH,
            subsequent_indent="    ",
        )
        if not g["instances"]:
            lines.append("  no instance type in the catalog")
            lines.append("")
            continue
        lines.append(
            f"  {'provider':<9}{'instance type':<24}{'GPUs':>4} {'tier':<10}"
            f"{common + '/h':>9}{'/GPU-h':>8}{'spot/GPU-h':>13}"
        )
        for r in g["instances"]:
            lines.append(
                f"  {r['provider']:<9}{r['instance_type']:<24.24}{r['gpus']:>4} "
                f"{(r['tier'] or '-'):<10.10}{_p(r['on_demand_common']):>9}"
                f"{_p(r['on_demand_per_gpu_common']):>8}"
                f"{_spot(r['spot_per_gpu_common'], r['spot_estimated']):>13}"
            )
            lines += textwrap.wrap(
                f"{r['interconnect']}; {_native(r)}",
                WIDTH,
                initial_indent="    ",
                subsequent_indent="      ",
            )
        lines.append("")
    lines.append("~ spot not observed: the 30-70 % of on-demand planning band (pricing.toml)")
    return "\n".join(lines) + "\n"


def _native(r: dict[str, Any]) -> str:
    """The price in the cloud's own currency, its date, and the exchange rate used."""
    if not r["price_date"]:
        return "no price"
    cur = r["currency"]
    text = f"{_p(r['on_demand'])} {cur}/h"
    if r["spot"]:
        text += f", spot {_spot(r['spot'], r['spot_estimated'])} {cur}/h"
    text += f", priced {r['price_date']}"
    if r["spot_observation"]:
        text += f"; spot: {r['spot_observation']}"
    elif r["spot_date"] and r["spot_date"] != r["price_date"]:
        text += f", spot {r['spot_date']}"
    fx = r["fx_rate"]
    if fx:
        text += f"; 1 {cur} = {fx['rate']:g} {r['common_currency']} ({fx['source']} {fx['date']})"
    return text


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = OneLineParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpu", help="GPU models whose key or name contains this (e.g. A100)")
    parser.add_argument("--provider", help="one provider of the catalog (default: all)")
    parser.add_argument(
        "--currency", default="USD", help="the common currency of the table (default USD)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    common = args.currency.upper()
    try:
        models = rows(load_catalog(), load_pricing(), args.gpu, args.provider, common)
    except UsageError as exc:
        for problem in exc.problems:
            print(fit(f"gpus.py: {problem}"), file=err)
        return 2
    except CatalogError as exc:
        print(fit(f"gpus.py: the catalog data is broken: {exc}"), file=err)
        return 1
    if args.json:
        json.dump({"gpus": models}, out, indent=1)
        out.write("\n")
        return 0
    from rich.console import Console

    Console(
        file=out, width=WIDTH, markup=False, emoji=False, highlight=False, soft_wrap=True
    ).print(render(models, common), end="")
    return 0


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    sys.exit(main())
