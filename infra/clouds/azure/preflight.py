"""Azure's preflight (infra/preflight.py): the user's own subscription, read only.

Calls, in order, each counted, through azure-mgmt-compute's ComputeManagementClient (39.0.0)
and the same bearer token as ``where.py --live`` and the reaper on a laptop:

- Subscriptions - Get (ARM ``GET /subscriptions/{id}``, api-version 2022-12-01, sent through
  the client's own pipeline): the subscription the token reaches, its tenant and its
  ``state`` (Enabled, or Warned / PastDue / Disabled / Deleted, which create nothing); the
  answer's fields are those of azure-rest-api-specs' example
  specification/resources/resource-manager/Microsoft.Resources/stable/2022-12-01/examples/
  GetSubscription.json (commit f186684d, read 2026-12-05). The token's own claims (who
  signed in) are read locally, unverified, only to name the caller;
- Resource SKUs - List (``$filter=location eq '<region>'``): the size's ``family``, the
  name its vCPU quota has in Compute Usages;
- Usage - List (``GET .../providers/Microsoft.Compute/locations/{region}/usages``, the SDK's
  UsageOperations.list): rows of the SDK's Usage model (currentValue, limit, name.value,
  name.localizedValue, unit). Standard (pay-as-you-go) VMs must fit both the size's family
  quota and "Total Regional vCPUs"; spot VMs must fit "Total Regional Low-priority vCPUs",
  shared by every family (MicrosoftDocs/azure-docs articles/virtual-machines/quotas.md at
  2f85b1e5 and articles/quotas/spot-quota.md at 02d00dc8, read 2026-12-05; deallocated VMs
  count too). The rows' wire names ``cores`` and ``lowPriorityCores`` are how `az vm
  list-usage` answers them in public scripts, not read on a Microsoft page here: a row is
  also matched by its localized name;
- Virtual Machine Images - List: the program's Ubuntu 22.04 image for the size, offered in
  the region.

- Resource Groups - List (api-version 2022-09-01), then Permissions - List For Resource
  Group (``GET .../resourcegroups/{rg}/providers/Microsoft.Authorization/permissions``,
  api-version 2022-04-01; operation AzurePermissionsForResourceGroup_List as
  learn.microsoft.com's Azure.ResourceManager.Authorization reference names it, read
  2026-12-05): the caller's own effective permissions there, rows of ``actions``,
  ``notActions``, ``dataActions``, ``notDataActions`` (the Permission model's members, as
  stackql/stackql-registry-docs docs/azure-docs/providers/azure/authorization/
  permissions_for_resource_group/index.md lists them, read 2026-12-05). Asked at the
  stack's own group (gpufleet-<stack>) when it exists, else at the first group the
  subscription lists (roles given at the subscription, which creating resource groups
  needs, reach every group); no group at all: not checked. Matched against
  :data:`ACTIONS` (what ``pulumi up`` of infra/clouds/azure/program.py creates) by the
  rules of MicrosoftDocs/azure-docs articles/role-based-access-control/
  role-definitions.md (at 00766527, read 2026-12-05): ``*`` matches any run of
  characters, names compare without case, a row allows an action its ``actions`` match
  and its own ``notActions`` do not ("Actions - NotActions = Effective control plane
  permissions"), and a ``notActions`` entry is no deny: another row that allows the
  action allows it;
- Storage Accounts - Check Name Availability (``POST .../providers/Microsoft.Storage/
  checkNameAvailability``, api-version 2025-01-01, body ``{name, type:
  Microsoft.Storage/storageAccounts}`` as Azure/azure-sdk-for-js sdk/storage/arm-storage/
  samples/v19/javascript/storageAccountsCheckNameAvailabilitySample.js sends it, read
  2026-12-05): the answer's ``nameAvailable``, ``reason`` (AccountNameInvalid,
  AlreadyExists) and ``message``, for the data account's name drawn as the program draws
  it (a prefix of the stack's name and a fresh random suffix).

Each request through the ComputeManagementClient's own pipeline (``send_request``): no
other Azure SDK is pinned for these two.

Credentials: GPUFLEET_AZURE_ACCESS_TOKEN (``az account get-access-token --query accessToken
-o tsv``) and GPUFLEET_AZURE_SUBSCRIPTION_ID; GPUFLEET_AZURE_ARM_ENDPOINT points the client
elsewhere (tests: a local TLS fake on 127.0.0.1). The SDK is imported inside.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Calls, Check, Need, QuotaAsk

SUBSCRIPTIONS_API = "2022-12-01"
GROUPS_API = "2022-09-01"
PERMISSIONS_API = "2022-04-01"
STORAGE_API = "2025-01-01"
MAX_PAGES = 5  # permission and group pages: a handful each; more is a wrong answer
# What `pulumi up` of infra/clouds/azure/program.py asks of ARM, by the resource types it
# declares (the provider operation each create or update is authorized as; Azure's
# "Resource provider operations" names), and why. Deletes (`pulumi destroy`) are not asked.
ACTIONS: tuple[tuple[str, str], ...] = (
    ("Microsoft.Resources/subscriptions/resourceGroups/write", "the stack's resource groups"),
    ("Microsoft.Network/networkSecurityGroups/write", "the network security group"),
    ("Microsoft.Network/networkSecurityGroups/join/action", "the subnet's security group"),
    ("Microsoft.Network/virtualNetworks/write", "the virtual network"),
    ("Microsoft.Network/virtualNetworks/subnets/write", "the subnet"),
    ("Microsoft.Network/virtualNetworks/subnets/join/action", "a NIC in the subnet"),
    ("Microsoft.Network/publicIPAddresses/write", "the nodes' public IPs"),
    ("Microsoft.Network/publicIPAddresses/join/action", "a NIC's public IP"),
    ("Microsoft.Network/networkInterfaces/write", "the nodes' NICs"),
    ("Microsoft.Network/networkInterfaces/join/action", "a VM's NIC"),
    ("Microsoft.Compute/virtualMachines/write", "the GPU VMs"),
    ("Microsoft.Compute/disks/write", "the data disks"),
    ("Microsoft.Compute/availabilitySets/write", "the InfiniBand availability set"),
    ("Microsoft.Compute/proximityPlacementGroups/write", "the placement group"),
    ("Microsoft.ManagedIdentity/userAssignedIdentities/write", "the identities"),
    ("Microsoft.ManagedIdentity/userAssignedIdentities/assign/action", "an identity on a VM"),
    ("Microsoft.Authorization/roleDefinitions/write", "the nodes' and reaper's custom roles"),
    ("Microsoft.Authorization/roleAssignments/write", "the roles given to those identities"),
    ("Microsoft.Storage/storageAccounts/write", "the data, function and package accounts"),
    ("Microsoft.Storage/storageAccounts/blobServices/write", "blob versioning, retention"),
    ("Microsoft.Storage/storageAccounts/blobServices/containers/write", "the containers"),
    ("Microsoft.Storage/storageAccounts/managementPolicies/write", "the lifecycle policy"),
    ("Microsoft.Storage/storageAccounts/listKeys/action", "the package upload (account key)"),
    ("Microsoft.Web/serverfarms/write", "the reaper's Functions plan"),
    ("Microsoft.Web/sites/write", "the reaper's Function App"),
    ("Microsoft.Insights/workbooks/write", "the stack's dashboard workbook"),
)
REGIONAL = ("cores", "Total Regional vCPUs")  # (name.value, name.localizedValue)
LOW_PRIORITY = ("lowPriorityCores", "Total Regional Low-priority vCPUs")
CREDENTIALS_HINT = (
    "set GPUFLEET_AZURE_ACCESS_TOKEN (`az account get-access-token --query "
    "accessToken -o tsv`) and GPUFLEET_AZURE_SUBSCRIPTION_ID"
)
# The portal's route for spot vCPUs (articles/quotas/spot-quota.md, read 2026-12-05).
QUOTA_SCOPE = "region"  # Compute Usages are per region (`make up --quota`)
SPOT_FIX = (
    "Azure portal > Quotas > Compute, search 'spot', select the region's "
    "low-priority vCPUs > Request quota increase > Enter a new limit: {value}"
)


# --request-quota: the Quota API (Microsoft.Quota) has its own SDK, azure-mgmt-quota, which
# is not pinned here; the request is the `az quota update` line, run by the person.
QUOTA_API_NOTE = " (azure-cli's quota extension files it: `az extension add --name quota`)"


def quota_request(subscription: str, region: str, resource: str, value: int) -> str:
    """The exact request to raise a standard vCPU quota: the azure-cli quota extension's own
    example for compute (Azure/azure-cli-extensions src/quota/azext_quota/aaz/latest/quota/
    _update.py at 7380c3b6, read 2026-12-05: PATCH {scope}/providers/Microsoft.Quota/quotas/
    {resourceName}, api-version 2023-02-01)."""
    scope = f"/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{region}"
    return (
        f"`az quota update --resource-name {resource} --scope {scope} "
        f"--limit-object value={value} --resource-type dedicated`"
    )


def token_caller(token: str) -> str:
    """Who the token was issued to, from its claims (read, not verified: ARM verifies it)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return ""
    if not isinstance(claims, dict):
        return ""
    who = claims.get("upn") or claims.get("unique_name") or claims.get("appid") or ""
    return str(who or claims.get("oid") or "")


def usage_row(usages: Sequence[Mapping[str, Any]], value: str, localized: str) -> Any:
    """The usage row named ``value`` (case as ARM writes it, compared without case) or
    ``localized``; None when the answer has neither."""
    for row in usages:
        name = row.get("name") or {}
        if str(name.get("value", "")).lower() == value.lower():
            return row
        if localized and str(name.get("localizedValue", "")) == localized:
            return row
    return None


def _said(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc)
    first = (text.splitlines() or [""])[0]
    code = getattr(getattr(exc, "error", None), "code", None)
    return f"{code}: {first[:160]}" if code and code not in first else first[:200]


def _unasked(why: str, fix: str) -> list[Check]:
    rest = ("quota", "image", "permissions", "bucket")
    return [Check("identity", UNKNOWN, why, fix)] + [
        Check(n, UNKNOWN, "not asked: no identity") for n in rest
    ]


def _client(token: str, subscription: str) -> Any:
    from azure.mgmt.compute import ComputeManagementClient

    from infra.clouds.azure.availability import ARM_ENDPOINT
    from infra.clouds.azure.reaper import ARM_SCOPE, StaticTokenCredential

    endpoint = (os.environ.get("GPUFLEET_AZURE_ARM_ENDPOINT") or ARM_ENDPOINT).rstrip("/")
    return ComputeManagementClient(
        StaticTokenCredential(token),
        subscription,
        base_url=endpoint,
        credential_scopes=[ARM_SCOPE],
        retry_total=0,  # one try each: a preflight answers in seconds or says it could not
        connection_timeout=5,
        read_timeout=20,
    )


def _credentials() -> tuple[str, str]:
    token = os.environ.get("GPUFLEET_AZURE_ACCESS_TOKEN", "").strip()
    subscription = os.environ.get("GPUFLEET_AZURE_SUBSCRIPTION_ID", "").strip()
    return token, subscription


def quota(need: Need, calls: Calls) -> list[Check]:
    """The quota checks alone, for one region (``make up --quota`` asks each place)."""
    from azure.core.exceptions import AzureError

    token, subscription = _credentials()
    if not token or not subscription:
        return [Check("quota", UNKNOWN, "no Azure credentials", CREDENTIALS_HINT)]
    client = _client(token, subscription)
    return _quotas(client, need, subscription, calls, (AzureError, OSError, ValueError))


def checks(need: Need, calls: Calls) -> list[Check]:
    token, subscription = _credentials()
    if not token or not subscription:
        return _unasked("no Azure credentials", CREDENTIALS_HINT)
    from azure.core.exceptions import AzureError
    from azure.core.rest import HttpRequest

    client = _client(token, subscription)
    problems = (AzureError, OSError, ValueError)
    try:
        calls.add("arm:Subscriptions.Get")
        response = client.send_request(
            HttpRequest(
                "GET",
                f"/subscriptions/{subscription}",
                params={"api-version": SUBSCRIPTIONS_API},
            )
        )
        response.raise_for_status()
        sub = dict(response.json())
    except problems as exc:
        return _unasked(f"ARM Subscriptions - Get: {_said(exc)}", "check the token and network")
    out = [_identity(sub, subscription, token_caller(token))]
    out.extend(_quotas(client, need, subscription, calls, problems))
    out.append(_image(client, need, calls, problems))
    out.append(_permissions(client, need, subscription, calls, problems))
    out.append(_account_name(client, need, subscription, calls, problems))
    return out


def _identity(sub: Mapping[str, Any], subscription: str, caller: str) -> Check:
    name = sub.get("displayName") or sub.get("subscriptionId") or subscription
    state = str(sub.get("state") or "")
    said = f"subscription {subscription} ({name}), tenant {sub.get('tenantId')}"
    said += f", as {caller}" if caller else ""
    if state and state != "Enabled":
        return Check(
            "identity",
            FAIL,
            f"{said}: the subscription is {state}",
            "an Enabled subscription creates resources: see its billing in the portal",
        )
    return Check("identity", OK, f"{said}, {state or 'state not given'}")


def _family(client: Any, need: Need, calls: Calls, problems: tuple[type[Exception], ...]) -> str:
    calls.add("arm:ResourceSkus.List")
    for sku in client.resource_skus.list(filter=f"location eq '{need.region}'"):
        d = sku.as_dict()
        if d.get("resourceType") == "virtualMachines" and d.get("name") == need.instance_type:
            return str(d.get("family") or "")
    return ""


def _quotas(
    client: Any,
    need: Need,
    subscription: str,
    calls: Calls,
    problems: tuple[type[Exception], ...],
) -> list[Check]:
    try:
        family = _family(client, need, calls, problems)
    except problems as exc:
        return [Check("quota", UNKNOWN, f"ARM Resource SKUs in {need.region}: {_said(exc)}")]
    try:
        calls.add("arm:Usage.List")
        usages = [u.as_dict() for u in client.usage.list(location=need.region)]
    except problems as exc:
        return [Check("quota", UNKNOWN, f"ARM Compute Usages in {need.region}: {_said(exc)}")]
    want = need.total_vcpus
    sized = f"the stack needs {want} ({need.nodes} x {need.vcpus})"
    out: list[Check] = []

    # standard (pay-as-you-go): the family's quota and the regional total, both
    judged = need.billing != "spot"
    rows: list[tuple[str, Any]] = []
    if not family:
        rows.append(("", None))
    else:
        rows.append((family, usage_row(usages, family, "")))
    rows.append((REGIONAL[0], usage_row(usages, *REGIONAL)))
    said, short, missing = [], [], []
    for name, row in rows:
        if row is None:
            missing.append(name or f"the family of {need.instance_type}")
            continue
        label = (row.get("name") or {}).get("localizedValue") or name
        free = int(row.get("limit") or 0) - int(row.get("currentValue") or 0)
        said.append(f"{label}: {free} of {row.get('limit')} free")
        if free < want:
            short.append((name, int(row.get("currentValue") or 0) + want))
    text = "; ".join(said + [f"no usage row for {m}" for m in missing]) + f"; {sized}"
    if short:
        fix = "; ".join(quota_request(subscription, need.region, n, v) for n, v in short)
        fix += " (deallocated VMs count against it too)"
        state = FAIL if judged else INFO
        ask = QuotaAsk(
            f"vCPUs of {', '.join(n for n, _ in short)}",
            max(v for _, v in short),
            need.region,
            step=fix + QUOTA_API_NOTE,
        )
        out.append(
            Check(
                "quota on-demand",
                state,
                text if judged else text + "; only for on-demand billing",
                fix if judged else "",
                ask if judged else None,
            )
        )
    elif missing:
        out.append(Check("quota on-demand", UNKNOWN if judged else INFO, text))
    else:
        out.append(Check("quota on-demand", OK if judged else INFO, text))

    # spot: the regional low-priority vCPUs, shared by every family
    judged = need.billing == "spot"
    row = usage_row(usages, *LOW_PRIORITY)
    if row is None:
        why = f"no usage row for {LOW_PRIORITY[1]}"
        out.append(Check("quota spot", UNKNOWN if judged else INFO, why))
        return out
    free = int(row.get("limit") or 0) - int(row.get("currentValue") or 0)
    text = f"{LOW_PRIORITY[1]}: {free} of {row.get('limit')} free; {sized}"
    if free >= want:
        out.append(Check("quota spot", OK if judged else INFO, text))
    elif judged:
        value = int(row.get("currentValue") or 0) + want
        fix = SPOT_FIX.format(value=value)
        ask = QuotaAsk(f"vCPUs of {LOW_PRIORITY[1]}", value, need.region, step=fix)
        out.append(Check("quota spot", FAIL, text, fix, ask))
    else:
        out.append(Check("quota spot", INFO, text + "; only for spot billing"))
    return out


def _image(client: Any, need: Need, calls: Calls, problems: tuple[type[Exception], ...]) -> Check:
    from azure.core.exceptions import ResourceNotFoundError

    from infra.catalog import load_catalog
    from infra.clouds.azure.program import image_for

    image = image_for(load_catalog().instance(need.provider, need.instance_type))
    urn = f"{image['publisher']}:{image['offer']}:{image['sku']}"
    try:
        calls.add("arm:VirtualMachineImages.List")
        versions = client.virtual_machine_images.list(
            need.region, image["publisher"], image["offer"], image["sku"], top=1
        )
    except ResourceNotFoundError as exc:
        return Check("image", FAIL, f"{urn} in {need.region}: {_said(exc)}", "pick another region")
    except problems as exc:
        return Check("image", UNKNOWN, f"ARM VM images {urn}: {_said(exc)}")
    if not versions:
        return Check("image", FAIL, f"{urn}: no version in {need.region}", "pick another region")
    return Check("image", OK, f"{urn} ({versions[0].name} in {need.region})")


def _get_all(client: Any, url: str, params: dict[str, str], calls: Calls, name: str) -> list[Any]:
    """Every ``value`` row of an ARM list, its ``nextLink`` pages followed (bounded)."""
    from azure.core.rest import HttpRequest

    rows: list[Any] = []
    request = HttpRequest("GET", url, params=params)
    for _ in range(MAX_PAGES):
        calls.add(name)
        response = client.send_request(request)
        response.raise_for_status()
        page = response.json()
        rows.extend(page.get("value") or [])
        link = page.get("nextLink")
        if not link:
            return rows
        request = HttpRequest("GET", str(link))
    raise ValueError(f"{name}: still more pages after {MAX_PAGES}")


def action_matches(pattern: str, action: str) -> bool:
    """An action string against a role's entry: ``*`` is any run of characters, no case."""
    parts = (re.escape(p) for p in pattern.split("*"))
    return re.fullmatch(".*".join(parts), action, flags=re.IGNORECASE) is not None


def allowed(rows: Sequence[Mapping[str, Any]], action: str, data: bool = False) -> bool:
    """Whether any permission row allows ``action``: its actions (dataActions) match and its
    own notActions (notDataActions) do not. A notActions entry subtracts from its own row
    only, never from another row (it is not a deny)."""
    grant, minus = ("dataActions", "notDataActions") if data else ("actions", "notActions")
    for row in rows:
        granted = any(action_matches(str(p), action) for p in row.get(grant) or ())
        if granted and not any(action_matches(str(p), action) for p in row.get(minus) or ()):
            return True
    return False


def missing_actions(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(a, why) for a, why in ACTIONS if not allowed(rows, a)]


def _permissions(
    client: Any, need: Need, subscription: str, calls: Calls, problems: tuple[type[Exception], ...]
) -> Check:
    base = f"/subscriptions/{subscription}"
    own = f"gpufleet-{need.stack}"

    def listed(path: str, api_version: str, name: str) -> list[Any]:
        return _get_all(client, f"{base}/{path}", {"api-version": api_version}, calls, name)

    try:
        groups = listed("resourcegroups", GROUPS_API, "arm:ResourceGroups.List")
    except problems as exc:
        return Check("permissions", UNKNOWN, f"ARM Resource Groups - List: {_said(exc)}")
    names = [str(g.get("name") or "") for g in groups if g.get("name")]
    if not names:
        return Check(
            "permissions",
            NOT_CHECKED,
            "the subscription has no resource group to ask Azure for the caller's "
            "permissions at (Permissions - List needs one)",
            "`az group create -n gpufleet-check -l <region>` once, then run this again",
        )
    group = next((g for g in names if g.lower() == own.lower()), names[0])
    try:
        rows = listed(
            f"resourcegroups/{group}/providers/Microsoft.Authorization/permissions",
            PERMISSIONS_API,
            "arm:Permissions.ListForResourceGroup",
        )
    except problems as exc:
        return Check("permissions", UNKNOWN, f"ARM Permissions - List at {group}: {_said(exc)}")
    at = f"at resource group {group}" + ("" if group == own else " (not the stack's own yet)")
    lack = missing_actions(rows)
    if not lack:
        return Check("permissions", OK, f"all {len(ACTIONS)} actions `pulumi up` needs, {at}")
    more = f" and {len(lack) - 3} more" if len(lack) > 3 else ""
    shown = ", ".join(f"{a} ({why})" for a, why in lack[:3]) + more
    return Check(
        "permissions",
        FAIL,
        f"{len(lack)} of {len(ACTIONS)} actions missing {at}: {shown}",
        "give the caller Owner, or Contributor plus User Access Administrator, on the "
        "subscription (`az role assignment create --assignee <you> --role Owner "
        f"--scope /subscriptions/{subscription}`)",
    )


def _account_name(
    client: Any, need: Need, subscription: str, calls: Calls, problems: tuple[type[Exception], ...]
) -> Check:
    from azure.core.rest import HttpRequest

    from infra.clouds.azure.program import storage_account_name

    name = storage_account_name(need.stack, secrets.token_hex(3))
    url = f"/subscriptions/{subscription}/providers/Microsoft.Storage/checkNameAvailability"
    try:
        calls.add("arm:StorageAccounts.CheckNameAvailability")
        response = client.send_request(
            HttpRequest(
                "POST",
                url,
                params={"api-version": STORAGE_API},
                json={"name": name, "type": "Microsoft.Storage/storageAccounts"},
            )
        )
        response.raise_for_status()
        answer = dict(response.json())
    except problems as exc:
        return Check("bucket", UNKNOWN, f"ARM Storage Check Name Availability: {_said(exc)}")
    drawn = f"storage account {name} (a random suffix drawn as `pulumi up` draws it)"
    if answer.get("nameAvailable") is True:
        return Check("bucket", OK, f"{drawn}: free")
    reason = str(answer.get("reason") or "")
    said = f"{drawn}: {reason or 'not available'}: {str(answer.get('message') or '')[:120]}"
    if reason == "AccountNameInvalid":
        fix = "use a stack name of lower-case letters and digits (the account takes 24 at most)"
    else:
        fix = "run the preflight again (a new suffix is drawn); `pulumi up` draws its own"
    return Check("bucket", FAIL, said.rstrip(": "), fix)
