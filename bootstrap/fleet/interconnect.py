"""The interconnect between a stack's nodes (the network fabric: EFA, InfiniBand or plain
TCP; nothing to do with the Fabric SSH library the rest of this package wraps).

Which fabric links a stack's nodes, and the NCCL/UCX environment it needs: one pure
function, :func:`fabric_env`, that ``fab train`` and ``fab verify-gpu``'s cross-node run both
use, so a job and the check of the fleet run with the same settings.

The fabric is read from the stack's ``tier`` output (``efa``, ``infiniband``:
``infra.nodes.tier_summary``) and the node-image details from the catalog entry of the
instance type (``efa_rdma``; ``nccl_topo_file``, ``nccl_socket_ifname`` with their
``fabric_source``), never from the provider's name. Whatever the user passes with
``--node-env`` is merged over these defaults by the callers: the user's value always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.catalog import Catalog, Feature, InstanceType, load_catalog

EFA, INFINIBAND, TCP = "efa", "infiniband", "tcp"

# NCCL over EFA, as `fab train` has always set it: the libfabric EFA provider, sockets kept
# off loopback and docker bridges, GPUDirect RDMA only where the type has it (efa_rdma).
_EFA_ENV = {"FI_PROVIDER": "efa", "NCCL_SOCKET_IFNAME": "^lo,docker"}

# NCCL over InfiniBand, as Microsoft's own scripts set it for ND A100 v4 and ND H100 v5 on the
# Ubuntu HPC image (sources AZ-HPCIMG, AZ-HPCNCCL, AZ-MSAMP in infra/clouds/azure/catalog.toml);
# the size-specific values (topology file, socket interface) are catalog data.
_INFINIBAND_ENV = {
    # NCCL's own default (NCCL environment docs, NCCL_IB_DISABLE), said explicitly: a 1
    # inherited from the node's profile or a container would quietly turn the run into TCP.
    "NCCL_IB_DISABLE": "0",
    # Relaxed PCIe ordering for the IB verbs transport: AZ-HPCIMG's /etc/nccl.conf for
    # ndv4 and ndv5, AZ-HPCNCCL, AZ-MSAMP.
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    # The same for UCX (MPI or UCX-based libraries in the user's job; NCCL ignores it):
    # AZ-HPCNCCL.
    "UCX_IB_PCI_RELAXED_ORDERING": "on",
    # GPUs numbered in PCI bus order, the order the topology file describes: AZ-HPCNCCL,
    # AZ-MSAMP.
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
}


@dataclass(frozen=True)
class FabricEnv:
    """The fabric between the nodes and the environment gpufleet sets for it by default."""

    fabric: str = TCP  # efa | infiniband | tcp
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = ""  # the catalog sources of the size-specific values, if any

    def merged(self, user: Mapping[str, str]) -> dict[str, str]:
        """The defaults with the user's ``--node-env`` over them (the user's value wins)."""
        return {**self.env, **user}

    def describe(self) -> str:
        """One line for a report: the fabric and what was set for it."""
        if not self.env:
            return f"{self.fabric}: NCCL's defaults (nothing set)"
        return f"{self.fabric}: " + " ".join(f"{k}={v}" for k, v in self.env.items())

    def to_json(self) -> dict[str, Any]:
        return {"fabric": self.fabric, "env": dict(self.env), "source": self.source}


def _instance(cat: Catalog, provider: str | None, itype: object) -> InstanceType | None:
    if not provider or not itype:
        return None
    return cat.instances.get((provider, str(itype)))


def fabric_of(tier: Mapping[str, Any], it: InstanceType | None, cat: Catalog) -> str:
    """EFA or InfiniBand as the stack's tier output says. A stack deployed before the output
    had ``infiniband`` falls back to the catalog: an InfiniBand type on a cloud that
    supports it."""
    if tier.get("efa"):
        return EFA
    ib = tier.get("infiniband")
    if ib is None and it is not None:
        info = cat.providers.get(it.provider)
        ib = it.infiniband and info is not None and info.supports(Feature.INFINIBAND)
    return INFINIBAND if ib else TCP


def fabric_env(
    tier: Mapping[str, Any], provider: str | None, catalog: Catalog | None = None
) -> FabricEnv:
    """The NCCL/UCX environment for the tier's fabric: EFA's, InfiniBand's, or nothing for
    plain TCP (NCCL's defaults are right there). Pure: stack data and the catalog only."""
    cat = catalog or load_catalog()
    it = _instance(cat, provider, tier.get("instance_type"))
    fabric = fabric_of(tier, it, cat)
    if fabric == EFA:
        env = dict(_EFA_ENV)
        if it is not None and it.efa_rdma:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        return FabricEnv(EFA, env)
    if fabric == INFINIBAND:
        env = dict(_INFINIBAND_ENV)
        if it is not None and it.nccl_socket_ifname:
            env["NCCL_SOCKET_IFNAME"] = it.nccl_socket_ifname
        if it is not None and it.nccl_topo_file:
            env["NCCL_TOPO_FILE"] = it.nccl_topo_file
        return FabricEnv(INFINIBAND, env, it.fabric_source if it is not None else "")
    return FabricEnv(TCP, {})


def network_env(tier: Mapping[str, Any], provider: str | None) -> dict[str, str]:
    """Just the environment of :func:`fabric_env` (what ``fab train`` puts in job.json)."""
    return dict(fabric_env(tier, provider).env)
