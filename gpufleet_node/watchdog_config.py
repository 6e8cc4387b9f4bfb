"""The watchdog's config: /etc/gpufleet/watchdog.json over the first-boot node.json
(the stack's facts), checked in one place, and the node cloud it names.

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import clouds, idle_rules
from . import fleet_names as names
from .clouds.base import NodeCloud

CONFIG_PATH = Path("/etc/gpufleet/watchdog.json")
NODE_INFO_PATH = Path("/etc/gpufleet/node.json")  # written at first boot by the stack
STATE_DIR = Path("/var/lib/gpufleet")
JOBS_DIR = "/var/lib/gpufleet/jobs"


@dataclass(frozen=True)
class Config:
    provider: str  # a key of clouds.CLOUDS (a module in clouds/)
    region: str
    stack: str
    node: str
    role: str = "worker"
    tier: str = ""
    instance_type: str = ""
    instance_id: str = ""  # empty: ask the metadata service
    bucket: str = ""
    scratch_path: str = "/scratch"
    # "nvme": instance store, erased by a stop (unsynced files forbid the power-off);
    # "disk": a data disk that survives the stop. Anything else is taken as "nvme".
    scratch_kind: str = "nvme"
    sync_dirs: tuple[str, ...] = ("checkpoints",)  # relative to scratch_path
    idle_minutes: float | None = None  # None: the tier default
    ttl_hours: float | None = None  # None: the tier default; 0 = off
    samples_per_run: int = 4
    sample_interval_s: float = 15.0
    sync_timeout_s: float = 600.0  # one pre-stop sync, at most
    publish_metrics: bool = True
    dry_run: bool = False  # decide and log, never power off
    endpoint_url: str = ""  # metrics and tag API override (tests)
    storage_endpoint_url: str = ""  # bucket API override (tests, private endpoints)
    metadata_url: str = ""  # metadata service override (tests)
    alicloud_account_id: str = ""
    state_dir: str = str(STATE_DIR)
    jobs_dir: str = JOBS_DIR  # fab train's job folders (their state.json: docs/train.md)

    @classmethod
    def load(cls, path: Path = CONFIG_PATH, node_info: Path = NODE_INFO_PATH) -> Config:
        """The watchdog config, over the first-boot node info; every problem at once."""
        raw: dict[str, Any] = {}
        for source in (node_info, path):
            if source.exists():
                try:
                    raw.update(json.loads(source.read_text()))
                except (OSError, ValueError) as exc:
                    raise ValueError(f"{source}: not readable JSON ({exc})") from None
        if isinstance(raw.get("scratch"), dict):
            raw.setdefault("scratch_path", raw["scratch"].get("path", "/scratch"))
            raw.setdefault("scratch_kind", raw["scratch"].get("kind", "nvme"))
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        problems = [
            f"missing {k!r}" for k in ("provider", "region", "stack", "node") if not data.get(k)
        ]
        known_clouds = clouds.CLOUDS
        if data.get("provider") is not None and data["provider"] not in known_clouds:
            problems.append(
                f"provider must be {' or '.join(known_clouds)}, got {data['provider']!r}"
            )
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        if "sync_dirs" in data:
            data["sync_dirs"] = tuple(data["sync_dirs"])
        return cls(**data)

    def limits(self, tags: dict[str, str] | None = None) -> idle_rules.Limits:
        """Idle and TTL limits: the instance's tags where set (what the reaper reads, and
        what a person changes on a running node), else this config, else the tier's."""
        tags = tags or {}
        ttl = (
            None
            if self.ttl_hours is None
            else ("off" if self.ttl_hours <= 0 else str(self.ttl_hours))
        )
        idle = None if self.idle_minutes is None else str(self.idle_minutes)
        return idle_rules.resolve_limits(
            tier=tags.get(names.TIER) or self.tier or None,
            instance_type=self.instance_type or None,
            idle_minutes_tag=tags.get(names.IDLE_MINUTES) or idle,
            ttl_hours_tag=tags.get(names.TTL_HOURS) or ttl,
        )

    @property
    def scratch_survives_stop(self) -> bool:
        return self.scratch_kind == "disk"


def cloud_for(config: Config) -> NodeCloud:
    return clouds.node_cloud(
        config.provider, config.region, config.endpoint_url, config.metadata_url
    )
