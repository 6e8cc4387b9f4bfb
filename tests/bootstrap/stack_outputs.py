"""The stack outputs of a100x8 on AWS (p4d.24xlarge), as tests of host discovery, verify-gpu's
expectation and the verify-gpu run over SSH read them: one copy, fresh for each caller."""

from __future__ import annotations

import copy
from typing import Any

P4D_TIER: dict[str, Any] = {
    "name": "a100x8",
    "gpu_model": "A100-40GB",
    "gpu_count": 8,
    "gpu_memory_gb": 40,
    "instance_type": "p4d.24xlarge",
    "nvlink": True,
    "nvswitch": True,
    "efa": True,
}

# The tier output of an Azure ND H100 v5 stack (InfiniBand between nodes).
ND_TIER = {
    "name": "h100x8",
    "gpu_model": "H100-80GB",
    "gpu_count": 8,
    "gpu_memory_gb": 80,
    "instance_type": "Standard_ND96isr_H100_v5",
    "nvlink": True,
    "nvswitch": True,
    "efa": False,
    "infiniband": True,
    "infiniband_gbps": 3200,
}


HEAD = {
    "name": "a100x8-0",
    "role": "head",
    "instance_id": "i-0a",
    "public_ip": "1.2.3.4",
    "private_ip": "10.0.1.5",
}


def p4d_tier() -> dict[str, Any]:
    return copy.deepcopy(P4D_TIER)


def p4d_outputs(**overrides: Any) -> dict[str, Any]:
    """One head node unless ``nodes=`` says otherwise; any top-level key can be replaced."""
    data: dict[str, Any] = {
        "stack": "a100x8",
        "provider": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "tier": p4d_tier(),
        "nodes": [dict(HEAD)],
        "ssh_user": "ubuntu",
        "bucket": "gpufleet-a100x8-ab12cd",
        "scratch": {"path": "/scratch", "kind": "nvme", "devices": 8, "size_gb": 8000},
    }
    data.update(copy.deepcopy(overrides))
    return data
