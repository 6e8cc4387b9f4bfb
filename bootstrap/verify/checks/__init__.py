"""verify-gpu's checks, one function per check, in the order the verdict lists them.

Each check is registered with :func:`~bootstrap.verify.checks.base.check` (its name, the runs
it belongs to, the catalog thresholds it reads) in the module of its concern; this tuple is
the registry. :mod:`bootstrap.verify.judge` only walks it.
"""

from __future__ import annotations

from bootstrap.verify.checks import bench, collective, health, inventory, storage, topology
from bootstrap.verify.checks.base import CheckSpec

CHECKS: tuple[CheckSpec, ...] = (
    inventory.node_script_crashed,
    inventory.gpu_present,
    inventory.gpu_not_verified,
    inventory.gpu_count,
    inventory.gpu_model,
    inventory.gpu_memory,
    inventory.software,
    inventory.software_cpu,
    inventory.mig,
    health.ecc,
    health.memory_remap,
    health.throttle,
    health.temperature,
    health.persistence,
    health.xid,
    health.fabric_manager,
    health.infiniband,
    topology.nvlink,
    topology.pcie,
    bench.benchmarks,
    bench.gemm,
    bench.hbm,
    collective.allreduce,
    collective.train,
    collective.mfu,
    collective.cross_nodes,
    collective.fabric,
    storage.scratch,
    storage.storage,
)


def thresholds_used(checks: tuple[CheckSpec, ...] = CHECKS) -> frozenset[str]:
    """Every catalog threshold some check reads."""
    return frozenset().union(*(c.thresholds for c in checks))
