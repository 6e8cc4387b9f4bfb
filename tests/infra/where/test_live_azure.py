"""Azure's availability signal (infra/clouds/azure/availability.py): azure-mgmt-compute with
a bearer token against a local TLS fake of ARM's Resource SKUs - List on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.availability import OFFERED, RESTRICTED, NoSignal
from infra.clouds.azure import availability
from tests.infra.where.fakes import serving
from tests.reaper.azure_fake import make_tls

SUB = "00000000-0000-4000-8000-00000000aaaa"
SIZE = "Standard_ND96asr_v4"


def sku(name: str, location: str, zones: list[str], restrictions: list[Any]) -> dict[str, Any]:
    """One Resource SKU, shaped like Azure/azure-rest-api-specs specification/compute/
    resource-manager/Microsoft.Compute/Skus/stable/2021-07-01/examples/skus/
    ListAvailableResourceSkusForARegion.json at dd68c545 (resourceType, locations,
    locationInfo.zones, name, tier, size, family), with ``restrictions`` as that version's
    skus.json defines ResourceSkuRestrictions (type Location/Zone, values, restrictionInfo
    {locations, zones}, reasonCode QuotaId/NotAvailableForSubscription)."""
    return {
        "resourceType": "virtualMachines",
        "locations": [location],
        "locationInfo": [{"location": location, "zones": zones}],
        "name": name,
        "tier": "Standard",
        "size": name.removeprefix("Standard_"),
        "family": "standardNDASv4_A100Family",
        "restrictions": restrictions,
    }


def zone_restriction(location: str, zones: list[str]) -> dict[str, Any]:
    return {
        "type": "Zone",
        "values": [location],
        "restrictionInfo": {"locations": [location], "zones": zones},
        "reasonCode": "NotAvailableForSubscription",
    }


ANSWERS = {
    "eastus": [
        sku(SIZE, "eastus", ["3", "1", "2"], [zone_restriction("eastus", ["2"])]),
        sku("Standard_A0", "eastus", ["1"], []),
    ],
    "westus2": [
        sku(
            SIZE,
            "westus2",
            ["1", "2", "3"],
            [
                {
                    "type": "Location",
                    "values": ["westus2"],
                    "restrictionInfo": {"locations": ["westus2"]},
                    "reasonCode": "QuotaId",
                }
            ],
        )
    ],
}


@pytest.fixture
def arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    tls = make_tls(tmp_path)

    def answer(
        method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if headers.get("authorization") != "Bearer fake-arm-token":
            return 401, {"error": {"code": "AuthenticationFailed", "message": "no token"}}
        if path != f"/subscriptions/{SUB}/providers/Microsoft.Compute/skus":
            return 404, {"error": {"code": "InvalidResourceType", "message": path}}
        location = q.get("$filter", "").removeprefix("location eq '").removesuffix("'")
        if location not in ANSWERS:
            err = {"code": "InvalidFilter", "message": f"unknown location {location}"}
            return 400, {"error": err}
        return 200, {"value": ANSWERS[location], "nextLink": None}

    with serving(answer, tls) as (endpoint, seen):
        monkeypatch.setenv("GPUFLEET_AZURE_ARM_ENDPOINT", f"https://{endpoint}")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls[0]))  # requests' documented setting
        monkeypatch.setenv("GPUFLEET_AZURE_ACCESS_TOKEN", "fake-arm-token")
        monkeypatch.setenv("GPUFLEET_AZURE_SUBSCRIPTION_ID", SUB)
        yield seen


def test_each_zone_says_whether_this_subscription_may_use_the_size(
    arm: list[dict[str, Any]],
) -> None:
    zones = availability.live_zones(SIZE, ["eastus"])
    assert [(z.zone, z.state, z.detail) for z in zones] == [
        ("1", OFFERED, "unrestricted"),
        ("2", RESTRICTED, "NotAvailableForSubscription"),
        ("3", OFFERED, "unrestricted"),
    ]


def test_a_location_restriction_covers_every_zone_of_the_region(
    arm: list[dict[str, Any]],
) -> None:
    zones = availability.live_zones(SIZE, ["westus2"])
    assert {(z.state, z.detail) for z in zones} == {(RESTRICTED, "QuotaId")} and len(zones) == 3


def test_the_request_filters_by_location_with_the_bearer_token(arm: list[dict[str, Any]]) -> None:
    availability.live_zones(SIZE, ["eastus"])
    (req,) = arm
    assert req["query"]["$filter"] == "location eq 'eastus'" and req["query"]["api-version"]


def test_an_arm_error_is_one_line_naming_the_region(arm: list[dict[str, Any]]) -> None:
    with pytest.raises(NoSignal, match=r"^Resource SKUs in nowhere: ") as info:
        availability.live_zones(SIZE, ["nowhere"])
    assert "\n" not in str(info.value)


def test_no_credentials_is_one_line_saying_so() -> None:
    with pytest.raises(NoSignal, match=r"^no Azure credentials .*offline rows only$"):
        availability.live_zones(SIZE, ["eastus"])
