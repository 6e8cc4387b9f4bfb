"""What the bootstrap/train tests share: a clock, a workdir tree and a stack's fleet."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from bootstrap.fleet.hosts import Fleet, parse_stack_outputs

NOW = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def fleet(tier: dict[str, object] | None = None, provider: str = "aws", nodes: int = 2) -> Fleet:
    return parse_stack_outputs(
        {
            "stack": "s",
            "provider": provider,
            "region": "us-east-1",
            "bucket": "gpufleet-s",
            "tier": tier or {"name": "a100x8", "instance_type": "p4d.24xlarge", "efa": True},
            "nodes": [
                {
                    "name": f"n{i}",
                    "role": "head" if i == 0 else "worker",
                    "public_ip": f"203.0.113.{i + 1}",
                    "private_ip": f"10.0.0.{i + 1}",
                }
                for i in range(nodes)
            ],
            "scratch": {"path": "/scratch", "kind": "nvme"},
            "hourly_cost": {"currency": "USD", "billing": "on-demand", "amount": 40.0},
        }
    )
