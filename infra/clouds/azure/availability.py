"""Azure's availability signal for one VM size, zone by zone (``where.py --live``).

Per region, one read-only ARM call through azure-mgmt-compute: Resource SKUs - List
(``$filter=location eq '<region>'``). A size's ``locationInfo`` gives the zones it is offered
in for this subscription, and its ``restrictions`` (type Location or Zone, reasonCode
NotAvailableForSubscription or QuotaId) the places this subscription may not use it. Azure
gives no stock signal here: an unrestricted zone can still answer ZonalAllocationFailed.

Credentials: a bearer token in GPUFLEET_AZURE_ACCESS_TOKEN (e.g. ``az account
get-access-token --query accessToken -o tsv``) and GPUFLEET_AZURE_SUBSCRIPTION_ID.
GPUFLEET_AZURE_ARM_ENDPOINT points the client elsewhere (tests: a local TLS fake on
127.0.0.1, its CA in REQUESTS_CA_BUNDLE). The SDK is imported inside the function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.availability import OFFERED, RESTRICTED, NoSignal, ZoneSignal

SIGNAL = "ARM Resource SKUs (zones and restrictions for this subscription)"
ARM_ENDPOINT = "https://management.azure.com"


def parse_skus(skus: Sequence[Mapping[str, Any]], region: str, size: str) -> list[ZoneSignal]:
    """The zones of one Resource SKUs answer (its ``value`` items, wire names) for the size."""
    out: list[ZoneSignal] = []
    for sku in skus:
        if sku.get("resourceType") != "virtualMachines" or sku.get("name") != size:
            continue
        blocked_region = ""
        blocked_zones: dict[str, str] = {}
        for r in sku.get("restrictions") or []:
            info = r.get("restrictionInfo") or {}
            reason = str(r.get("reasonCode") or r.get("type") or "restricted")
            if r.get("type") == "Location" and region in (info.get("locations") or []):
                blocked_region = reason
            elif r.get("type") == "Zone" and region in (info.get("locations") or [region]):
                for z in info.get("zones") or []:
                    blocked_zones[str(z)] = reason
        for li in sku.get("locationInfo") or []:
            if str(li.get("location", "")).lower() != region.lower():
                continue
            zones = sorted(str(z) for z in li.get("zones") or [])
            for z in zones or [""]:
                reason = blocked_region or blocked_zones.get(z, "")
                state = RESTRICTED if reason else OFFERED
                out.append(ZoneSignal(region, z, state, None, reason or "unrestricted"))
    return out


def live_zones(instance_type: str, regions: Sequence[str]) -> list[ZoneSignal]:
    token = os.environ.get("GPUFLEET_AZURE_ACCESS_TOKEN", "")
    subscription = os.environ.get("GPUFLEET_AZURE_SUBSCRIPTION_ID", "")
    if not token or not subscription:
        raise NoSignal(
            "no Azure credentials (set GPUFLEET_AZURE_ACCESS_TOKEN, e.g. from `az account "
            "get-access-token`, and GPUFLEET_AZURE_SUBSCRIPTION_ID): offline rows only"
        )
    from azure.core.exceptions import AzureError
    from azure.mgmt.compute import ComputeManagementClient

    from infra.clouds.azure.reaper import ARM_SCOPE, StaticTokenCredential

    endpoint = (os.environ.get("GPUFLEET_AZURE_ARM_ENDPOINT") or ARM_ENDPOINT).rstrip("/")
    client = ComputeManagementClient(
        StaticTokenCredential(token),
        subscription,
        base_url=endpoint,
        credential_scopes=[ARM_SCOPE],
        retry_total=1,
        connection_timeout=10,
        read_timeout=30,
    )
    found: list[ZoneSignal] = []
    for region in regions:
        try:
            skus = [
                s.as_dict() for s in client.resource_skus.list(filter=f"location eq '{region}'")
            ]
        except AzureError as exc:
            text = str(getattr(exc, "message", None) or exc).splitlines()[0]
            raise NoSignal(f"Resource SKUs in {region}: {text}") from None
        found += parse_skus(skus, region, instance_type)
    return found
