"""Pure planning for GPU nodes: names, tags, scratch layout, billing and the first-boot script.

Everything here is a plain function of StackConfig and the catalog, tested without any engine;
the provider modules turn the results into resources.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from infra.catalog import Catalog, Feature, Gpu, InstanceType, load_catalog
from infra.config import StackConfig
from infra.reaper import tags as T

# Where bootstrap, the watchdog and verify-gpu find what the stack knows about a node.
NODE_INFO_PATH = "/etc/gpufleet/node.json"
EFA_MIN_NODES = 2  # below this, EFA only on the multi-card types (see efa_interfaces)


@dataclass(frozen=True)
class ScratchPlan:
    """How fast scratch is provided: the instance's own NVMe, or a data disk we attach."""

    kind: str  # "nvme" | "disk"
    devices: int
    size_gb: int
    volume_class: str | None  # gp3/io2/PL1..: only for "disk"
    iops: int | None
    throughput_mbs: int | None
    path: str

    def as_output(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kind": self.kind,
            "devices": self.devices,
            "size_gb": self.size_gb,
        }


@dataclass(frozen=True)
class NodeSpec:
    """One GPU node to declare."""

    index: int
    name: str
    role: str  # head | worker
    instance_type: InstanceType
    gpu: Gpu
    scratch: ScratchPlan
    efa_interfaces: int  # 0 = plain ENA networking
    tags: dict[str, str]
    user_data: str


def stack_tags(cfg: StackConfig) -> dict[str, str]:
    """Tags on every taggable resource of the stack (user tags first: ours win)."""
    return {
        **dict(cfg.tags),
        T.MANAGED_BY: T.MANAGED_BY_VALUE,
        T.STACK: cfg.stack,
        T.TIER: cfg.tier,
    }


def node_tags(cfg: StackConfig, role: str, name: str) -> dict[str, str]:
    """Instance tags: what the reaper and the watchdog read (docs/stacks.md, "Contract: tags")."""
    return {
        **stack_tags(cfg),
        "Name": name,
        T.ROLE: role,
        T.IDLE_MINUTES: str(cfg.idle_minutes),
        T.TTL_HOURS: str(cfg.ttl_hours) if cfg.ttl_hours > 0 else "off",
        T.WATCHDOG: "on",
    }


def plan_scratch(cfg: StackConfig, itype: InstanceType) -> ScratchPlan:
    """Local NVMe when the type has it (free, fastest, but ephemeral: the watchdog saves it);
    otherwise a provisioned data disk sized and classed by config."""
    if itype.nvme_count > 0:
        return ScratchPlan(
            "nvme", itype.nvme_count, itype.local_nvme_gb, None, None, None, cfg.scratch_path
        )
    # The performance bought with each class is catalog data (gp3's ceiling, io2's IOPS per GiB).
    disk = load_catalog().providers[cfg.provider].scratch_classes[cfg.scratch_class]
    return ScratchPlan(
        "disk",
        1,
        cfg.scratch_gb,
        cfg.scratch_class,
        disk.provisioned_iops(cfg.scratch_gb),
        disk.throughput_mbs,
        cfg.scratch_path,
    )


def efa_interfaces(cfg: StackConfig, itype: InstanceType) -> int:
    """EFA interfaces to attach: all the type offers, on multi-node stacks, and always on the
    multi-card training types (p4d, p4de, p5.48xlarge): interfaces cannot be added to a running
    instance, so a single node declared without them would have to be replaced to grow."""
    if not itype.efa or not load_catalog().providers[cfg.provider].supports(Feature.EFA):
        return 0
    if cfg.nodes < EFA_MIN_NODES and itype.efa_interfaces <= 1:
        return 0
    return max(1, itype.efa_interfaces)


def efa_layout(efa_interfaces: int) -> list[tuple[int, int, str]]:
    """(network card, device index, interface type) per interface, as AWS recommends for
    multi-card EFA types: an ENA primary on card 0, an EFA-only interface beside it, and one
    EFA-only interface at device 0 of every further card (EC2 user guide, "Maximize network
    bandwidth on instances with multiple network cards")."""
    if efa_interfaces < 1:
        return []
    layout = [(0, 0, "interface"), (0, 1, "efa-only")]
    layout += [(card, 0, "efa-only") for card in range(1, efa_interfaces)]
    return layout


def public_ipv4_at_launch(layout: list[tuple[int, int, str]]) -> bool:
    """Whether EC2 itself gives an instance launched with ``layout`` (efa_layout's list;
    empty: the one default interface) a public IPv4 address: only with one interface.
    EC2 user guide, "Amazon EC2 instance IP addressing", assigning a public IPv4 address
    at launch: "You cannot auto-assign a public IP address if you specify more than one
    network interface" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    using-instance-addressing.html; awsdocs/amazon-ec2-user-guide doc_source/
    using-instance-addressing.md at e3707c4, read 2026-12-01); botocore's EC2 model says
    the same of RunInstances' AssociatePublicIpAddress, which tests/infra/test_nodes.py
    reads. With more interfaces the node needs an Elastic IP on its primary interface,
    and the subnet's MapPublicIpOnLaunch does not help."""
    return len(layout) <= 1


def infiniband(cfg: StackConfig, itype: InstanceType) -> bool:
    """InfiniBand between nodes: the size's HCAs come with the VM (nothing is attached, unlike
    EFA interfaces), so every stack of an InfiniBand type has them, a single node included.
    That mirrors the multi-card EFA types, which get their interfaces on one node too: the
    node's NCCL settings are the same whether the stack has one node or grows to several.
    Only where the cloud supports the feature (catalog data, never the provider's name)."""
    return itype.infiniband and load_catalog().providers[cfg.provider].supports(Feature.INFINIBAND)


def needs_placement_group(cfg: StackConfig, itype: InstanceType) -> bool:
    """A cluster placement group keeps nodes on the same spine (where the cloud has one)."""
    if not load_catalog().providers[cfg.provider].supports(Feature.PLACEMENT_GROUP):
        return False
    return cfg.nodes > 1 or efa_interfaces(cfg, itype) > 0


def node_name(cfg: StackConfig, index: int) -> str:
    return f"{cfg.stack}-{index}"


def render_user_data(
    cfg: StackConfig, name: str, role: str, itype: InstanceType, gpu: Gpu, scratch: ScratchPlan
) -> str:
    """First-boot script: records what the stack knows about this node for bootstrap and the
    watchdog, and sets the hostname. Installation itself is `fab setup`'s job (idempotent,
    observable, re-runnable), not cloud-init's."""
    info = {
        "stack": cfg.stack,
        "provider": cfg.provider,
        "region": cfg.region,
        "tier": cfg.tier,
        "node": name,
        "role": role,
        "gpu_model": gpu.key,
        "instance_type": itype.name,
        "gpu_count": itype.gpus,
        "scratch": scratch.as_output(),
        "idle_minutes": cfg.idle_minutes,
        "ttl_hours": cfg.ttl_hours,
    }
    body = json.dumps(info, indent=2, sort_keys=True)
    if not re.fullmatch(r"[a-z0-9-]{1,63}", name):
        raise ValueError(f"node name {name!r} is not a valid hostname")
    return "\n".join(
        [
            "#!/bin/bash",
            "# gpufleet first boot: record the node's identity; `fab setup` does the rest.",
            "set -euo pipefail",
            "install -d -m 0755 /etc/gpufleet",
            f"cat > {NODE_INFO_PATH} <<'GPUFLEET_EOF'",
            body,
            "GPUFLEET_EOF",
            f"hostnamectl set-hostname {name} || true",
            f"install -d -m 0755 {scratch.path}",
            "",
        ]
    )


def plan_nodes(cfg: StackConfig, catalog: Catalog | None = None) -> list[NodeSpec]:
    """One NodeSpec per node; node 0 is the head (rendezvous host, stopped last)."""
    cat = catalog or load_catalog()
    itype = cat.instance(cfg.provider, cfg.instance_type)
    gpu = cat.gpu_for(itype)
    scratch = plan_scratch(cfg, itype)
    efa = efa_interfaces(cfg, itype)
    specs = []
    for i in range(cfg.nodes):
        name = node_name(cfg, i)
        role = "head" if i == 0 else "worker"
        specs.append(
            NodeSpec(
                index=i,
                name=name,
                role=role,
                instance_type=itype,
                gpu=gpu,
                scratch=scratch,
                efa_interfaces=efa,
                tags=node_tags(cfg, role, name),
                user_data=render_user_data(cfg, name, role, itype, gpu, scratch),
            )
        )
    return specs


def tier_summary(cfg: StackConfig, catalog: Catalog | None = None) -> dict[str, object]:
    """The ``tier`` stack output. ``efa`` and ``infiniband`` say which fabric links the nodes
    (bootstrap sets NCCL's environment from them: bootstrap/fleet/interconnect.py);
    ``infiniband_gbps`` is the size's total InfiniBand bandwidth (0 without InfiniBand)."""
    cat = catalog or load_catalog()
    itype = cat.instance(cfg.provider, cfg.instance_type)
    gpu = cat.gpu_for(itype)
    ib = infiniband(cfg, itype)
    return {
        "name": cfg.tier,
        "profile": cfg.profile,
        "gpu_model": gpu.key,
        "gpu_count": itype.gpus,
        "gpu_memory_gb": gpu.memory_gb,
        "instance_type": itype.name,
        "nvlink": itype.nvlink,
        "nvswitch": itype.nvswitch,
        "efa": efa_interfaces(cfg, itype) > 0,
        "infiniband": ib,
        "infiniband_gbps": itype.infiniband_gbps if ib else 0,
    }
