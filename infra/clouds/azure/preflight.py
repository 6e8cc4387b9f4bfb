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

Permissions: not checked. gpufleet knows no read-only proof of them on Azure here (the
stack's resource groups do not exist before ``pulumi up``). The storage account takes a
random suffix.

Credentials: GPUFLEET_AZURE_ACCESS_TOKEN (``az account get-access-token --query accessToken
-o tsv``) and GPUFLEET_AZURE_SUBSCRIPTION_ID; GPUFLEET_AZURE_ARM_ENDPOINT points the client
elsewhere (tests: a local TLS fake on 127.0.0.1). The SDK is imported inside.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Calls, Check, Need

SUBSCRIPTIONS_API = "2022-12-01"
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
    rest = ("quota", "image")
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
    out.append(
        Check(
            "permissions",
            NOT_CHECKED,
            "gpufleet proves no Azure permission without creating something (the "
            "stack's resource groups do not exist before `pulumi up`)",
            "the caller must create resource groups, VMs, identities, a custom "
            "role and role assignments (docs/clouds/azure.md)",
        )
    )
    out.append(
        Check(
            "bucket",
            OK,
            "storage account named at `pulumi up` with a random suffix: no name to be taken",
        )
    )
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
        out.append(
            Check(
                "quota on-demand",
                state,
                text if judged else text + "; only for on-demand billing",
                fix if judged else "",
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
        out.append(Check("quota spot", FAIL, text, SPOT_FIX.format(value=value)))
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
