"""infra/where.py offline: every tier's rows from the catalog and infra/zones.py's snapshot."""

from __future__ import annotations

import pytest

from infra import where, zones
from infra.catalog import load_catalog
from infra.pricing.price_sheet import load_pricing

CAT = load_catalog()
PRC = load_pricing()


def usd(currency: str) -> float | None:
    return PRC.fx_rate(currency, "USD")[0]


def rows_for(query: str) -> list[where.Offer]:
    _, found = where.targets(CAT, query)
    return where.offers(CAT, zones.load_zone_data(), found, usd)


@pytest.mark.parametrize("tier", list(CAT.tiers))
def test_every_tier_gets_a_row_or_a_reason_on_each_cloud_that_offers_it(tier: str) -> None:
    _, found = where.targets(CAT, tier)
    rows = where.offers(CAT, zones.load_zone_data(), found, usd)
    gone = where.missing(zones.load_zone_data(), found, rows)
    for provider, by_profile in CAT.tiers[tier].offers.items():
        for name in by_profile.values():
            answered = any(r.provider == provider and r.instance_type == name for r in rows)
            said = any(line.startswith(f"{provider} {name}:") for line in gone)
            assert answered or said, (tier, provider, name)


def test_rows_are_sorted_by_usd_per_hour_and_unpriced_rows_come_last() -> None:
    rows = rows_for("a100x8")
    priced = [r.usd_per_hour for r in rows if r.usd_per_hour is not None]
    assert priced == sorted(priced) and len(priced) >= 4
    first_unpriced = next(i for i, r in enumerate(rows) if r.usd_per_hour is None)
    assert all(r.usd_per_hour is None for r in rows[first_unpriced:])


def test_a_cny_price_sorts_by_its_usd_value_at_the_catalogs_rate() -> None:
    row = next(r for r in rows_for("a100x8") if r.currency == "CNY")
    assert row.on_demand is not None and row.usd_per_hour is not None
    assert row.usd_per_hour == pytest.approx(row.on_demand / PRC.fx[("USD", "CNY")].amount)


def test_an_instance_type_is_found_whatever_its_case_with_its_tier() -> None:
    kind, found = where.targets(CAT, "P4D.24XLARGE")
    assert kind == "instance type"
    assert [(it.provider, it.name, tier) for it, tier in found] == [
        ("aws", "p4d.24xlarge", "a100x8")
    ]


def test_an_unknown_query_says_the_nearest_tier() -> None:
    with pytest.raises(where.UsageError, match=r"did you mean 'h100x8'\?"):
        where.targets(CAT, "h100x9")


def test_an_aws_type_the_snapshot_lists_nowhere_gets_no_row_and_a_reason() -> None:
    _, found = where.targets(CAT, "p3.2xlarge")
    rows = where.offers(CAT, zones.load_zone_data(), found, usd)
    assert rows == []
    (line,) = where.missing(zones.load_zone_data(), found, rows)
    assert line.startswith("aws p3.2xlarge: no zone offers it in MOTO-OFFER")


def test_a_price_region_row_carries_the_catalog_price_and_its_source() -> None:
    row = next(r for r in rows_for("a100x8") if r.provider == "aws" and r.region == "us-east-1")
    it = CAT.instance("aws", "p4d.24xlarge")
    assert it.price is not None
    assert (row.on_demand, row.spot) == (it.price.on_demand, it.price.spot)
    assert row.price_source == "KP; spot SC8" and row.zones_basis == zones.OFFERED


def test_every_cloud_names_a_sourced_zone_list_for_its_price_region() -> None:
    for provider, info in CAT.providers.items():
        rows = [r for r in rows_for("t4x1") if r.provider == provider]
        row = next(r for r in rows if r.region == info.price_region)
        assert row.zones and row.zones_source, provider


def test_alicloud_lists_shanghais_zones_from_alibabas_own_table() -> None:
    row = next(r for r in rows_for("a100x8") if r.provider == "alicloud")
    assert (row.region, row.zones_basis, row.zones_source) == (
        "cn-shanghai",
        zones.REGION,
        "ALI-AZ",
    )
    assert "cn-shanghai-l" in row.zones


def test_a_region_with_no_source_zone_list_says_its_zones_are_unknown() -> None:
    _, found = where.targets(CAT, "a100x8")
    data = {**zones.load_zone_data(), "alicloud": zones.ZoneData()}
    row = next(r for r in where.offers(CAT, data, found, usd) if r.provider == "alicloud")
    assert (row.region, row.zones, row.zones_basis) == ("cn-shanghai", (), zones.UNKNOWN)


def test_the_table_fits_80_columns_at_80_and_keeps_lines_whole_when_piped() -> None:
    rows = rows_for("t4x1")
    at80 = where.render("t4x1", "tier", rows, [], 80)
    assert max(len(line) for line in at80.splitlines()) <= 80
    piped = where.render("t4x1", "tier", rows, [], None)
    assert any(len(line) > 80 for line in piped.splitlines())
    assert "us-east-1a us-east-1b us-east-1c us-east-1d us-east-1f" in piped


def test_a_cloud_without_the_tier_says_so_with_its_nearest_types() -> None:
    lines = where.not_offered(CAT, "h100x8")
    clouds = {line.split(":")[0] for line in lines}
    assert clouds == set(CAT.providers) - set(CAT.tiers["h100x8"].offers)
    assert all("offers no h100x8 type; nearest there: " in line for line in lines)
