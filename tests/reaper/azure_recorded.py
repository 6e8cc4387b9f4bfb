"""Azure answers in the shape Azure really sends, with our own values.

Each body follows a recorded real response (or Microsoft's documented example) field by
field; the names, ids, times and numbers are ours. Nothing is copied: the source named
beside each says what shape it follows, read 2026-12-01.
"""

from __future__ import annotations

from typing import Any

SUB = "00000000-0000-4000-8000-00000000aaaa"
GROUP = "gpufleet-azure-t4x1"
VM_NAME = "azure-t4x1-0"
GROUP_ID = f"/subscriptions/{SUB}/resourceGroups/{GROUP}"
VM_ID = f"{GROUP_ID}/providers/Microsoft.Compute/virtualMachines/{VM_NAME}"

# Follows Azure/azure-sdk-for-python sdk/compute/azure-mgmt-compute/tests/recordings/
# test_mgmt_compute.test_virtual_machines_operations.yaml
# at 228203ab2dc04947a2caa6eccea9cfac39ab0cd5: the Virtual Machines - List answer
# ({"value": [{name, id, type, location, properties: {vmId, hardwareProfile,
# storageProfile, osProfile, networkProfile, provisioningState}}]}), ARM's seven
# fractional digits in times; plus what `$expand=instanceView` adds under properties
# (instanceView.statuses: code, level, displayStatus, time), whose status entries follow
# MicrosoftDocs azure-docs includes/virtual-machines-common-states-and-lifecycle.md.
VM_LIST_PAGE: dict[str, Any] = {
    "value": [
        {
            "name": VM_NAME,
            "id": VM_ID,
            "type": "Microsoft.Compute/virtualMachines",
            "location": "eastus",
            "tags": {
                "managed-by": "gpufleet",
                "gpufleet:stack": "azure-t4x1",
                "gpufleet:role": "head",
            },
            "properties": {
                "vmId": "1f0c7e5a-7d3b-4d8e-9a51-3c2b8e6f4a10",
                "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
                "priority": "Spot",
                "evictionPolicy": "Deallocate",
                "storageProfile": {
                    "imageReference": {
                        "publisher": "Canonical",
                        "offer": "0001-com-ubuntu-server-jammy",
                        "sku": "22_04-lts-gen2",
                        "version": "latest",
                        "exactVersion": "22.04.202611010",
                    },
                    "osDisk": {
                        "osType": "Linux",
                        "name": f"{VM_NAME}-os",
                        "createOption": "FromImage",
                        "caching": "ReadWrite",
                        "diskSizeGB": 200,
                    },
                    "dataDisks": [],
                },
                "osProfile": {
                    "computerName": VM_NAME,
                    "adminUsername": "azureuser",
                    "linuxConfiguration": {
                        "disablePasswordAuthentication": True,
                        "provisionVMAgent": True,
                    },
                    "secrets": [],
                    "allowExtensionOperations": True,
                    "requireGuestProvisionSignal": True,
                },
                "networkProfile": {
                    "networkInterfaces": [
                        {
                            "id": f"{GROUP_ID}/providers/Microsoft.Network/"
                            f"networkInterfaces/{VM_NAME}-nic"
                        }
                    ]
                },
                "provisioningState": "Succeeded",
                "timeCreated": "2026-11-30T08:00:01.1234567+00:00",
                "instanceView": {
                    "statuses": [
                        {
                            "code": "ProvisioningState/succeeded",
                            "level": "Info",
                            "displayStatus": "Provisioning succeeded",
                            "time": "2026-11-30T09:15:42.7654321+00:00",
                        },
                        {
                            "code": "PowerState/running",
                            "level": "Info",
                            "displayStatus": "VM running",
                        },
                    ]
                },
            },
        }
    ]
}

# Follows the same recording's long-running operation answers on
# .../providers/Microsoft.Compute/locations/<region>/operations/<id>: InProgress
# ({startTime, status, name}), then Succeeded with endTime.
OPERATION_IN_PROGRESS = {
    "startTime": "2026-12-01T10:00:00.220938+00:00",
    "status": "InProgress",
    "name": "5b9e2c1a-0d4f-4b8e-9c7a-2e1f3d4c5b6a",
}
OPERATION_SUCCEEDED = {
    **OPERATION_IN_PROGRESS,
    "endTime": "2026-12-01T10:03:12.0615079+00:00",
    "status": "Succeeded",
}


# Follows Azure/azure-sdk-for-python
# sdk/monitor/azure-monitor-query/tests/recordings/
# test_metrics_client.pyTestMetricsClienttest_metrics_granularity.json at
# bf0ae07c77a4a8bed5ca4669cb879942e25b9cba: the Metrics - List answer ({cost, timespan,
# interval, value: [{id, type, name: {value, localizedValue}, displayDescription, unit,
# timeseries, errorCode}], namespace, resourceregion}); timeseries entries are
# {metadatavalues, data: [{timeStamp, count, maximum}]} (the REST reference's shape).
def metrics_answer(beats: list[tuple[str, int]], util: list[tuple[str, float]]) -> dict[str, Any]:
    def metric(name: str, points: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": f"{VM_ID}/providers/Microsoft.Insights/metrics/{name}",
            "type": "Microsoft.Insights/metrics",
            "name": {"value": name, "localizedValue": name},
            "displayDescription": "",
            "unit": "Unspecified",
            "timeseries": [{"metadatavalues": [], "data": points}] if points else [],
            "errorCode": "Success",
        }

    return {
        "cost": 119,
        "timespan": "2026-12-01T09:00:00Z/2026-12-01T10:00:00Z",
        "interval": "PT1M",
        "value": [
            metric("Heartbeat", [{"timeStamp": t, "count": c, "maximum": 1.0} for t, c in beats]),
            metric("GPUUtilization", [{"timeStamp": t, "count": 1, "maximum": v} for t, v in util]),
        ],
        "namespace": "gpufleet",
        "resourceregion": "eastus",
    }
