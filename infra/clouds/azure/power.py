"""VM start and deallocation for ``fab start`` / ``fab stop`` (the contract:
infra/clouds/power.py).

The reaper's client: its scan of the stack's resource group for the power states, its
Deallocate (never a power-off, which keeps billing the compute), and Virtual Machines -
Start (azure-mgmt-compute ``virtual_machines.begin_start``, POST .../virtualMachines/
{vmName}/start, a long-running operation), polled a bounded number of times like the
deallocation. The node's public IP is a static address (program.py), so a stop keeps it.

On the laptop: the subscription from GPUFLEET_AZURE_SUBSCRIPTION_ID (or AZURE_SUBSCRIPTION_ID),
the resource group from GPUFLEET_AZURE_RESOURCE_GROUP (default ``gpufleet-<stack>``, the
name program.py gives it) and an ARM token in GPUFLEET_AZURE_ACCESS_TOKEN
(``az account get-access-token --query accessToken -o tsv``), as scripts/teardown.py takes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from infra.clouds.azure.reaper import (
    AzureCloud,
    StaticTokenCredential,
    _text,
)
from infra.clouds.power import NodePower

TOKEN_ENV = "GPUFLEET_AZURE_ACCESS_TOKEN"
# What the laptop's identity needs for fab start / fab stop (SECURITY.md section 2), on
# the stack's resource group.
LAPTOP_ACTIONS = (
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/instanceView/read",
    "Microsoft.Compute/virtualMachines/start/action",
    "Microsoft.Compute/virtualMachines/deallocate/action",
    "Microsoft.Compute/locations/operations/read",
)


def connect(region: str, stack: str, env: Mapping[str, str], endpoint: str | None) -> AzurePower:
    subscription = env.get("GPUFLEET_AZURE_SUBSCRIPTION_ID") or env.get("AZURE_SUBSCRIPTION_ID")
    token = (env.get(TOKEN_ENV) or "").strip()
    if not subscription:
        raise ValueError(
            "Azure needs the subscription: set GPUFLEET_AZURE_SUBSCRIPTION_ID "
            "(az account show --query id -o tsv)"
        )
    if not token:
        raise ValueError(
            f"Azure needs an ARM token: set {TOKEN_ENV}="
            "$(az account get-access-token --query accessToken -o tsv)"
        )
    cloud = AzureCloud(
        region,
        subscription_id=subscription,
        resource_group=env.get("GPUFLEET_AZURE_RESOURCE_GROUP") or f"gpufleet-{stack}",
        credential=StaticTokenCredential(token),
        endpoint=endpoint,
        max_attempts=4,
    )
    return AzurePower(cloud, stack)


class AzurePower:
    def __init__(self, cloud: AzureCloud, stack: str) -> None:
        self.cloud = cloud
        self.stack = stack

    def describe(self, ids: Sequence[str]) -> dict[str, NodePower]:
        wanted = set(ids)
        listed = self.cloud.scan(None)  # the resource group's VMs, tags matched below
        return {i.instance_id: NodePower(i) for i in listed if i.instance_id in wanted}

    def start(self, ids: Sequence[str]) -> dict[str, str]:
        # Accepted and still running after the bounded polls is no failure: fab start waits.
        begin = self.cloud.compute().virtual_machines.begin_start
        _, refused, failed = self.cloud.send_then_poll(begin, ids)
        out = {name: _text(exc) for name, exc in refused.items()}
        out.update((name, f"start failed: {_text(exc)}") for name, exc in failed.items())
        return out

    def stop(self, ids: Sequence[str]) -> dict[str, str]:
        return dict(self.cloud.stop(ids).failed)
