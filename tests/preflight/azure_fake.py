"""A local fake of the four Azure Resource Manager reads the preflight makes, over HTTPS on
127.0.0.1 (azure-core sends a bearer token over TLS only; tests/reaper/azure_fake.py's
make_tls gives the certificate, tests/infra/where/fakes.py's ``serving`` the server).

Answers, each from the cloud's own definitions:

- Subscriptions - Get: the fields of azure-rest-api-specs' example
  specification/resources/resource-manager/Microsoft.Resources/stable/2022-12-01/examples/
  GetSubscription.json (commit f186684d, read 2026-12-05);
- Resource SKUs - List: one SKU shaped as tests/infra/where/test_live_azure.py's (the
  ListAvailableResourceSkusForARegion.json example it cites), with its ``family``;
- Usage - List: ``{"value": [...]}`` of rows with the SDK's Usage / UsageName members only
  (currentValue, limit, unit, name.value, name.localizedValue; azure-mgmt-compute 39.0.0
  models, checked by a test), named as MicrosoftDocs/azure-docs
  articles/virtual-machines/quotas.md (2f85b1e5) shows them ("Total Regional vCPUs",
  "Standard ... Family vCPUs");
- Virtual Machine Images - List: a JSON array of VirtualMachineImageResource (name,
  location, id).

- Resource Groups - List: ``{"value": [{id, name, location, properties.provisioningState}]}``
  (the ResourceGroup model's members);
- Permissions - List For Resource Group: ``{"value": [{actions, notActions, dataActions,
  notDataActions}]}``, the Permission model's members as stackql/stackql-registry-docs
  docs/azure-docs/providers/azure/authorization/permissions_for_resource_group/index.md
  lists them (read 2026-12-05); the default is the Contributor role's row plus User Access
  Administrator's, as MicrosoftDocs/azure-docs articles/role-based-access-control/
  role-definitions.md (00766527) shows Contributor's permissions;
- Storage Accounts - Check Name Availability: ``{nameAvailable, reason, message}``
  (CheckNameAvailabilityResult; reason AccountNameInvalid or AlreadyExists), taking the
  body Azure/azure-sdk-for-js's storageAccountsCheckNameAvailabilitySample.js sends
  ({name, type: "Microsoft.Storage/storageAccounts"}); a name in ``taken`` is AlreadyExists,
  one that is not 3-24 lower-case letters and digits AccountNameInvalid.

Errors are ARM's ``{"error": {"code", "message"}}``: 401 without the token, 403
AuthorizationFailed for a call kind in ``denied``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.infra.where.fakes import serving
from tests.reaper.azure_fake import make_tls

SUB = "00000000-0000-4000-8000-00000000beef"
TENANT = "31c75423-32d6-4322-88b7-c478bdde4858"
SIZE = "Standard_NC4as_T4_v3"
FAMILY = "standardNCASv3_T4Family"


def fake_token(upn: str = "ada@example.org") -> str:
    """A token shaped as a JWT (header.claims.signature); ARM would verify it, the fake only
    compares it."""
    import base64

    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'upn': upn, 'tid': TENANT})}.sig"


def usage(value: str, localized: str, current: int, limit: int) -> dict[str, Any]:
    return {
        "unit": "Count",
        "currentValue": current,
        "limit": limit,
        "name": {"value": value, "localizedValue": localized},
    }


def sku(name: str, location: str, family: str, zones: list[str]) -> dict[str, Any]:
    return {
        "resourceType": "virtualMachines",
        "locations": [location],
        "locationInfo": [{"location": location, "zones": zones}],
        "name": name,
        "tier": "Standard",
        "size": name.removeprefix("Standard_"),
        "family": family,
        "restrictions": [],
    }


@dataclass
class AzureFake:
    token: str = field(default_factory=fake_token)
    state: str = "Enabled"
    skus: list[dict[str, Any]] = field(
        default_factory=lambda: [sku(SIZE, "eastus", FAMILY, ["1", "2", "3"])]
    )
    usages: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {
            "eastus": [
                usage("cores", "Total Regional vCPUs", 0, 100),
                usage(FAMILY, "Standard NCASv3_T4 Family vCPUs", 0, 24),
                usage("lowPriorityCores", "Total Regional Low-priority vCPUs", 0, 24),
            ]
        }
    )
    images: list[str] = field(default_factory=lambda: ["22.04.202411010"])
    groups: list[str] = field(default_factory=lambda: ["NetworkWatcherRG"])
    permissions: list[dict[str, Any]] = field(default_factory=lambda: [CONTRIBUTOR, ACCESS_ADMIN])
    taken: set[str] = field(default_factory=set)  # storage account names someone holds
    # subscription, skus, usages, images, groups, permissions, names
    denied: set[str] = field(default_factory=set)
    seen: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = ""
    ca: Path | None = None

    def subscription(self) -> dict[str, Any]:
        return {
            "id": f"/subscriptions/{SUB}",
            "subscriptionId": SUB,
            "tenantId": TENANT,
            "displayName": "Example Subscription",
            "state": self.state,
            "subscriptionPolicies": {
                "locationPlacementId": "Internal_2014-09-01",
                "quotaId": "Internal_2014-09-01",
                "spendingLimit": "Off",
            },
            "authorizationSource": "RoleBased",
        }

    def answer(
        self, method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, error("AuthenticationFailed", "no valid token")
        base = f"/subscriptions/{SUB}"
        compute = f"{base}/providers/Microsoft.Compute"
        kind, doc = "", None  # type: tuple[str, Any]
        if path == base:
            kind, doc = "subscription", self.subscription()
        elif path == f"{compute}/skus":
            location = q.get("$filter", "").removeprefix("location eq '").removesuffix("'")
            kind = "skus"
            doc = {"value": [s for s in self.skus if location in s["locations"]]}
        elif path.startswith(f"{compute}/locations/") and path.endswith("/usages"):
            location = path.split("/")[-2]
            kind, doc = "usages", {"value": self.usages.get(location, [])}
        elif path.startswith(f"{compute}/locations/") and path.endswith("/versions"):
            location = path.split("/")[6]
            kind = "images"
            doc = [
                {
                    "name": v,
                    "location": location,
                    "id": f"{path.removeprefix(base)}/{v}",
                }
                for v in self.images
            ]
        elif path == f"{base}/resourcegroups":
            kind = "groups"
            doc = {
                "value": [
                    {
                        "id": f"{base}/resourceGroups/{g}",
                        "name": g,
                        "type": "Microsoft.Resources/resourceGroups",
                        "location": "eastus",
                        "properties": {"provisioningState": "Succeeded"},
                    }
                    for g in self.groups
                ]
            }
        elif path.startswith(f"{base}/resourcegroups/") and path.endswith(
            "/providers/Microsoft.Authorization/permissions"
        ):
            group = path.split("/")[4]
            kind = "permissions"
            if group not in self.groups:
                return 404, error(
                    "ResourceGroupNotFound", f"Resource group '{group}' could not be found."
                )
            doc = {"value": self.permissions}
        elif path == f"{base}/providers/Microsoft.Storage/checkNameAvailability":
            kind = "names"
            asked = json.loads(body or b"{}")
            doc = name_answer(str(asked.get("name", "")), self.taken)
        if kind in self.denied:
            return 403, error(
                "AuthorizationFailed",
                f"The client does not have authorization to perform action over scope '{path}'",
            )
        if doc is None:
            return 404, error("InvalidResourceType", path)
        return 200, doc

    @contextmanager
    def running(self, tmp: Path) -> Iterator[AzureFake]:
        tls = make_tls(tmp)
        with serving(self.answer, tls) as (endpoint, seen):
            self.endpoint, self.seen = f"https://{endpoint}", seen
            self.ca = tls[0]
            yield self


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


# Contributor's row as role-definitions.md shows it, and User Access Administrator's (the
# role assignments Contributor lacks): together they allow what `pulumi up` needs.
CONTRIBUTOR: dict[str, Any] = {
    "actions": ["*"],
    "notActions": [
        "Microsoft.Authorization/*/Delete",
        "Microsoft.Authorization/*/Write",
        "Microsoft.Authorization/elevateAccess/Action",
        "Microsoft.Blueprint/blueprintAssignments/write",
        "Microsoft.Blueprint/blueprintAssignments/delete",
    ],
    "dataActions": [],
    "notDataActions": [],
}
ACCESS_ADMIN: dict[str, Any] = {
    "actions": ["*/read", "Microsoft.Authorization/*"],
    "notActions": [],
    "dataActions": [],
    "notDataActions": [],
}


def name_answer(name: str, taken: set[str]) -> dict[str, Any]:
    """CheckNameAvailabilityResult for a storage account name."""
    import re

    if not re.fullmatch(r"[a-z0-9]{3,24}", name):
        return {
            "nameAvailable": False,
            "reason": "AccountNameInvalid",
            "message": f"{name} is not a valid storage account name. Storage account name "
            "must be between 3 and 24 characters in length and use numbers and lower-case "
            "letters only.",
        }
    if name in taken or any(name.startswith(t[:-1]) for t in taken if t.endswith("*")):
        return {
            "nameAvailable": False,
            "reason": "AlreadyExists",
            "message": f"The storage account named {name} is already taken.",
        }
    return {"nameAvailable": True}
