"""What Pulumi's mocks answer for Azure (infra.offline): resource outputs and invokes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.offline import Engine

PACKAGE = "azure-native"  # the Pulumi package whose type tokens ("azure-native:...") these answer
AZURE_SUBSCRIPTION = "00000000-0000-4000-8000-000000000000"  # a placeholder, never a real one
# Azure resources: the input that names each type (the rest take the Pulumi name), and the
# ARM provider segment of its id.
AZURE_NAMED_BY = {
    "azure-native:resources:ResourceGroup": "resourceGroupName",
    "azure-native:compute:VirtualMachine": "vmName",
    "azure-native:storage:StorageAccount": "accountName",
    "azure-native:storage:BlobContainer": "containerName",
    "azure-native:storage:Blob": "blobName",
    "azure-native:managedidentity:UserAssignedIdentity": "resourceName",
    "azure-native:applicationinsights:Workbook": "resourceName",
    "azure-native:web:WebApp": "name",
    "azure-native:web:AppServicePlan": "name",
}


def resource(
    typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any], rid: str, engine: Engine
) -> str:
    """Azure outputs the program reads: names, ARM ids, addresses, identities, URLs."""
    own = str(inputs.get(AZURE_NAMED_BY.get(typ, ""), "") or name)
    out.setdefault("name", own)
    _, namespace, kind = typ.split(":")
    group = inputs.get("resourceGroupName", own)
    rid = f"/subscriptions/{AZURE_SUBSCRIPTION}/resourceGroups/{group}"
    if kind != "ResourceGroup":
        rid += f"/providers/Microsoft.{namespace}/{kind[0].lower() + kind[1:]}s/{own}"
    identity = inputs.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
        # an input list of identity ids comes back from ARM as a map keyed by id
        ids = identity["userAssignedIdentities"]
        out["identity"] = {**identity, "userAssignedIdentities": {i: {} for i in ids}}
    if kind == "PublicIPAddress":
        out["ipAddress"], _ = engine.ips_for(name)
    elif kind == "NetworkInterface":
        _, private = engine.ips_for(name)
        configs = [dict(c) for c in inputs.get("ipConfigurations", [])]
        if configs:
            configs[0]["privateIPAddress"] = private
        out["ipConfigurations"] = configs
    elif kind == "UserAssignedIdentity":
        out["principalId"] = "p-" + engine.digest("principal", name, n=12)
        out["clientId"] = "c-" + engine.digest("client", name, n=12)
    elif kind == "Blob":
        out["url"] = f"https://{inputs.get('accountName')}.blob.core.windows.net/" + (
            f"{inputs.get('containerName')}/{own}"
        )
    return rid


def invoke(token: str, inputs: dict[str, Any], engine: Engine) -> dict[str, Any] | None:
    """Azure's answer to an invoke, or None for a token it does not know."""
    if token == "azure-native:authorization:getClientConfig":
        return {
            "clientId": "c-plan",
            "objectId": "o-plan",
            "subscriptionId": AZURE_SUBSCRIPTION,
            "tenantId": AZURE_SUBSCRIPTION,
        }
    return None
