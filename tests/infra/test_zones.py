"""infra/zones.py: the shipped zone snapshot, parsed and checked against the catalog."""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path

import pytest

from infra import zones
from infra.catalog import CatalogError, load_catalog
from infra.clouds import HOME

CAT = load_catalog()


def test_aws_zones_are_motos_describe_instance_type_offerings_zone_for_zone() -> None:
    import moto

    base = Path(moto.__file__).parent / "ec2/resources/instance_type_offerings/availability-zone"
    ours = tomllib.loads((HOME / "aws" / "zones.toml").read_text())["offerings"]
    types = {name for prov, name in CAT.instances if prov == "aws"}
    theirs: dict[str, dict[str, list[str]]] = {}
    for f in sorted(base.glob("*.json.gz")):
        for o in json.loads(gzip.decompress(f.read_bytes())):
            if o["InstanceType"] in types:
                region = f.name.removesuffix(".json.gz")
                theirs.setdefault(o["InstanceType"], {}).setdefault(region, []).append(
                    o["Location"]
                )
    ours.pop("source")
    assert {t: {r: sorted(z) for r, z in by.items()} for t, by in theirs.items()} == ours


def test_azure_eastus_prices_are_the_catalogs_own_eastus_prices() -> None:
    prices = zones.load_zone_data()["azure"].prices
    for (provider, name), it in CAT.instances.items():
        if provider == "azure" and name in prices and it.price is not None:
            od, _ = prices[name]["eastus"]
            assert od == it.price.on_demand, name


def _raw(**tables: object) -> dict[str, object]:
    return {"sources": {"X": {"title": "t", "url": "u", "retrieved": "2026-12-02"}}, **tables}


def test_zone_data_refuses_a_source_it_does_not_know() -> None:
    with pytest.raises(CatalogError, match=r"\[regions\]: source 'NOPE'"):
        zones.parse_zone_data(_raw(regions={"source": "NOPE", "eastus": ["1"]}), "azure", CAT)


def test_zone_data_refuses_a_region_the_cloud_does_not_have_with_the_nearest() -> None:
    raw = _raw(regions={"source": "X", "eastus9": ["1"]})
    with pytest.raises(CatalogError, match=r"'eastus9' is not a region of azure \(did you mean"):
        zones.parse_zone_data(raw, "azure", CAT)


def test_zone_data_refuses_a_type_the_cloud_does_not_sell() -> None:
    raw = _raw(prices={"source": "X", "date": "2024-06-01", "Standard_X": {"eastus": {}}})
    with pytest.raises(CatalogError, match=r"'Standard_X' is not a azure type"):
        zones.parse_zone_data(raw, "azure", CAT)


def test_every_shipped_zone_file_parses_against_the_catalog() -> None:
    data = zones.load_zone_data()
    assert set(data) == set(CAT.providers)
    assert data["aws"].offerings and data["azure"].prices and data["tencent"].regions
