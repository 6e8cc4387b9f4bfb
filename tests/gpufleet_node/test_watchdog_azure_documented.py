"""AzureNode on IMDS answers shaped like Microsoft's documented response examples (every
field the docs show, our own values), served over real HTTP on 127.0.0.1.

Shapes followed (read 2026-12-01):
- compute: "Azure Instance Metadata Service" (learn.microsoft.com/azure/virtual-machines/
  instance-metadata-service), the Linux example response of
  /metadata/instance/compute?api-version=2021-02-01: tags as one "k:v;k:v" string and as
  tagsList, name, resourceId, location, priority, securityProfile, ...
- identity: "How to use managed identities for Azure resources on an Azure VM to acquire an
  access token" (learn.microsoft.com/entra/identity/managed-identities-azure-resources/
  how-to-use-vm-token), the sample response: every value a string, expires_in and
  expires_on included.
- scheduled events: "Azure Metadata Service: Scheduled Events for Linux VMs"
  (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events), the query response:
  DocumentIncarnation, Events[EventId, EventType, ResourceType, Resources, EventStatus,
  NotBefore (an RFC 1123 date), Description, EventSource, DurationInSeconds].
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.gpufleet_node.test_watchdog import azure_node

VM = "azure-t4x1-0"
SUB = "00000000-0000-4000-8000-00000000bbbb"
GROUP = f"/subscriptions/{SUB}/resourceGroups/gpufleet-azure-t4x1"
RID = f"{GROUP}/providers/Microsoft.Compute/virtualMachines/{VM}"

COMPUTE: dict[str, Any] = {
    "azEnvironment": "AzurePublicCloud",
    "additionalCapabilities": {"hibernationEnabled": "false"},
    "hostGroup": {"id": ""},
    "extendedLocation": {"type": "", "name": ""},
    "evictionPolicy": "Deallocate",
    "isHostCompatibilityLayerVm": "false",
    "licenseType": "",
    "location": "eastus",
    "name": VM,
    "offer": "0001-com-ubuntu-server-jammy",
    "osProfile": {
        "adminUsername": "azureuser",
        "computerName": VM,
        "disablePasswordAuthentication": "true",
    },
    "osType": "Linux",
    "placementGroupId": "",
    "plan": {"name": "", "product": "", "publisher": ""},
    "platformFaultDomain": "0",
    "platformSubFaultDomain": "",
    "platformUpdateDomain": "0",
    "priority": "Spot",
    "provider": "Microsoft.Compute",
    "publicKeys": [
        {"keyData": "ssh-ed25519 AAAA...", "path": "/home/azureuser/.ssh/authorized_keys"}
    ],
    "publisher": "Canonical",
    "resourceGroupName": "gpufleet-azure-t4x1",
    "resourceId": RID,
    "securityProfile": {
        "secureBootEnabled": "false",
        "virtualTpmEnabled": "false",
        "encryptionAtHost": "true",
        "securityType": "",
    },
    "sku": "22_04-lts-gen2",
    "storageProfile": {"dataDisks": [], "imageReference": {}, "osDisk": {}, "resourceDisk": {}},
    "subscriptionId": SUB,
    # the docs show both: one string (a value with ":" or ";" in it is ambiguous there) and
    # the list, which the watchdog reads
    "tags": "gpufleet:stack:azure-t4x1;managed-by:gpufleet",
    "tagsList": [
        {"name": "gpufleet:stack", "value": "azure-t4x1"},
        {"name": "managed-by", "value": "gpufleet"},
        {"name": "gpufleet:lease-until", "value": "2026-12-01T12:00:00Z"},
    ],
    "userData": "",
    "version": "22.04.202611010",
    "virtualMachineScaleSet": {"id": ""},
    "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
    "vmScaleSetName": "",
    "vmSize": "Standard_NC4as_T4_v3",
    "zone": "",
}

TOKEN = {
    "access_token": "eyJ0eXAiOiJKV1Qi.our-own.not-a-token",
    "refresh_token": "",
    "expires_in": "3599",
    "expires_on": "1796131200",
    "not_before": "1796127300",
    "resource": "https://management.azure.com/",
    "token_type": "Bearer",
}


def event(kind: str, resources: list[str]) -> dict[str, Any]:
    return {
        "EventId": "3c5d7e1f-2a4b-4c6d-8e0f-1a2b3c4d5e6f",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled",
        "NotBefore": "Tue, 01 Dec 2026 10:05:00 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


class Imds:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        if path == "/metadata/instance/compute":
            return 200, COMPUTE
        if path == "/metadata/identity/oauth2/token":
            return 200, {**TOKEN, "resource": query.get("resource", "")}
        if path == "/metadata/scheduledevents":
            return 200, {"DocumentIncarnation": 5, "Events": self.events}
        return 404, {"error": "not found"}


@pytest.fixture
def imds() -> Iterator[tuple[Imds, str]]:
    fake = Imds()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if self.headers.get("Metadata") != "true":
                status, body = 400, {"error": "Bad request. Required metadata header not specified"}
            else:
                status, body = fake.answer(url.path, dict(urllib.parse.parse_qsl(url.query)))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def node(url: str) -> Any:
    return azure_node.AzureNode("eastus", endpoint_url=url, metadata_url=url, sleep=lambda s: None)


def test_the_documented_compute_answer_gives_the_vms_name_resource_id_and_tags(imds) -> None:
    _, url = imds
    n = node(url)
    assert n.instance_id() == VM
    assert n.resource_id() == RID
    tags = n.instance_tags(VM, lambda: None)
    # from tagsList: a key with a colon, a value with colons, both whole
    assert tags == {
        "gpufleet:stack": "azure-t4x1",
        "managed-by": "gpufleet",
        "gpufleet:lease-until": "2026-12-01T12:00:00Z",
    }


def test_the_documented_token_answer_gives_a_token_per_audience(imds) -> None:
    _, url = imds
    creds = node(url).credentials()
    assert creds is not None
    assert {creds["token"], creds["monitor"], creds["storage"]} == {TOKEN["access_token"]}


def test_a_documented_preempt_event_naming_this_vm_is_a_notice(imds) -> None:
    fake, url = imds
    fake.events = [event("Preempt", [VM])]
    notice = node(url).spot_notice()
    assert notice == "Preempt 3c5d7e1f-2a4b-4c6d-8e0f-1a2b3c4d5e6f Tue, 01 Dec 2026 10:05:00 GMT"


@pytest.mark.parametrize(
    "events",
    [
        [event("Freeze", [VM])],  # the docs' own example type: maintenance, no eviction
        [event("Preempt", ["azure-t4x1-1"])],  # another VM's eviction
        [],
    ],
)
def test_other_documented_events_are_no_notice(imds, events: list[dict[str, Any]]) -> None:
    fake, url = imds
    fake.events = events
    assert node(url).spot_notice() is None
