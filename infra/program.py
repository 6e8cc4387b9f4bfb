"""The stack, wired: config -> cloud provider -> components -> outputs.

`infra/__main__.py` calls `run()` under `pulumi up`; `scripts/plan.py` and the tests call
`build()` under Pulumi's mocks. Both go through exactly this code.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.catalog import load_catalog, provider_names
from infra.clouds.base import get_provider
from infra.components.access import Access
from infra.components.args import component_args
from infra.components.guard import IdleGuard
from infra.components.network import Network
from infra.components.node import GpuNode
from infra.components.storage import Storage
from infra.config import ConfigError, StackConfig, parse_config, strip_namespace
from infra.nodes import plan_nodes, tier_summary
from infra.pricing.cost import hourly_estimate

# Stack outputs are a contract (docs/stacks.md, "Stack outputs"); bootstrap reads them.
OUTPUT_DOCS = {
    "stack": "stack name",
    "provider": f"{' | '.join(provider_names())} (a cloud in infra/clouds/)",
    "region": "region the stack lives in",
    "zone": "availability zone of the nodes",
    "tier": "tier summary: GPU model, count, memory, instance type, NVLink, EFA/InfiniBand",
    "nodes": "per node: name, role (head|worker), instance_id, public_ip, private_ip",
    "ssh_user": "user to SSH in as",
    "bucket": "object-storage bucket for datasets, checkpoints and reports",
    "scratch": "scratch mount path, kind (nvme|disk), devices, size_gb",
    "idle": "idle_minutes and ttl_hours the guards enforce",
    "guard": "scheduled reaper function name and schedule",
    "dashboard": "the stack's monitoring view on its cloud: name, console url (or a note why none)",
    "hourly_cost": "estimated cost per hour for all nodes (currency, billing, amount)",
}


def engine_config() -> dict[str, Any]:
    """Every `gpufleet:*` value the engine passed in (set explicitly or through the env)."""
    from pulumi.runtime import config as rc

    raw = dict(rc.get_config_env())
    raw.update(rc.CONFIG.get())
    return strip_namespace(raw)


def require_for_deploy(cfg: StackConfig) -> None:
    if not cfg.ssh_public_key:
        raise ConfigError(
            [
                "gpufleet:sshPublicKey: required to deploy: pulumi config set "
                'gpufleet:sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)" --stack ' + cfg.stack
            ]
        )


def build(cfg: StackConfig) -> dict[str, Any]:
    """Declare every resource of the stack; returns the outputs (values may be Outputs)."""
    require_for_deploy(cfg)
    hourly = hourly_estimate(
        cfg.provider,
        cfg.instance_type,
        cfg.nodes,
        cfg.billing,
        spot_max_price=cfg.spot_max_price,
        subscription_months=cfg.subscription_months or 1,
        region=cfg.region,
    )
    if cfg.max_hourly_cost is not None and hourly["amount"] > cfg.max_hourly_cost:
        raise ConfigError(
            [
                f"gpufleet:maxHourlyCost: this stack costs about {hourly['amount']:g} "
                f"{hourly['currency']}/h ({cfg.nodes}x {cfg.instance_type}, {cfg.billing}), above "
                f"the limit {cfg.max_hourly_cost:g}: raise the limit or use fewer/smaller nodes"
            ]
        )
    cat = load_catalog()
    cloud = get_provider(cfg.provider)
    provider = cloud.provider_resource(cfg.region)
    opts = pulumi.ResourceOptions(providers=[provider])
    name = cfg.stack

    args = component_args(cfg, cat)  # each component gets its own part of the config

    network = Network(name, args.network, cloud, opts)
    storage = Storage(name, args.storage, cloud, opts)
    access = Access(name, args.access, cloud, storage.parts, opts)
    specs = plan_nodes(cfg, cat)
    nodes = [GpuNode(spec, args.node, cloud, network.parts, access.parts, opts) for spec in specs]
    guard = IdleGuard(
        name, args.guard, cloud, [(n.spec, n.parts) for n in nodes], storage.parts, opts
    )

    return {
        "stack": cfg.stack,
        "provider": cfg.provider,
        "region": cfg.region,
        "zone": network.zone,
        "tier": tier_summary(cfg, cat),
        "nodes": pulumi.Output.all(*[n.output() for n in nodes]),
        "ssh_user": cat.providers[cfg.provider].ssh_user,
        "bucket": storage.bucket,
        "scratch": specs[0].scratch.as_output(),
        "idle": {"idle_minutes": cfg.idle_minutes, "ttl_hours": cfg.ttl_hours},
        "guard": {"function": guard.function_name, "schedule": guard.schedule},
        "dashboard": {
            "name": guard.parts.dashboard,
            "url": guard.parts.console_url,
            "note": guard.parts.console_note or None,
        },
        "hourly_cost": hourly,
    }


def run() -> None:
    """Entry point under `pulumi up`: a bad config stops here, before any resource exists."""
    stack = pulumi.get_stack()
    try:
        cfg = parse_config(engine_config(), stack)
        outputs = build(cfg)
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    for key, value in outputs.items():
        pulumi.export(key, value)
