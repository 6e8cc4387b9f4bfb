"""The cloud half of the idle guard, as plain data: schedule, function package, environment
and dashboard layout. The provider modules declare the resources from these.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pulumi

from infra.config import StackConfig

# The metric names are the reaper's contract with the watchdog; one definition, there.
from infra.reaper.core import (
    DIMENSION,
    METRIC_GPU_MEM,
    METRIC_GPU_UTIL,
    METRIC_HEARTBEAT,
    NAMESPACE,
)

AWS_SCHEDULE = "rate(5 minutes)"
ALICLOUD_CRON = "@every 5m"
LAMBDA_HANDLER = "handler.handler"
FC_HANDLER = "handler.fc_handler"


def function_name(stack: str) -> str:
    return f"gpufleet-{stack}-reaper"[:64]


def function_env(cfg: StackConfig) -> dict[str, str]:
    """What the scheduled reaper reads (infra/reaper/handler.py)."""
    return {
        "GPUFLEET_PROVIDER": cfg.provider,
        "GPUFLEET_STACK": cfg.stack,
        "GPUFLEET_REGION": cfg.region,
        "GPUFLEET_APPLY": "true",
    }


def function_zip() -> bytes:
    """The reaper's code as a deterministic zip (same bytes for the same sources)."""
    from infra.reaper.handler import build_function_zip

    return build_function_zip()


def function_archive() -> pulumi.AssetArchive:
    """The same files as a Pulumi archive: inline, so the program writes nothing to disk."""
    with zipfile.ZipFile(io.BytesIO(function_zip())) as zf:
        return pulumi.AssetArchive(
            {n: pulumi.StringAsset(zf.read(n).decode()) for n in sorted(zf.namelist())}
        )


def dashboard_body(region: str, instance_ids: list[str]) -> dict[str, Any]:
    """A CloudWatch dashboard: GPU utilisation, GPU memory and heartbeat per node."""

    def widget(title: str, metric: str, stat: str, y: int) -> dict[str, Any]:
        return {
            "type": "metric",
            "x": 0,
            "y": y,
            "width": 24,
            "height": 6,
            "properties": {
                "title": title,
                "region": region,
                "stat": stat,
                "period": 60,
                "view": "timeSeries",
                "metrics": [[NAMESPACE, metric, DIMENSION, i] for i in instance_ids],
            },
        }

    return {
        "widgets": [
            widget("GPU utilisation (%)", METRIC_GPU_UTIL, "Maximum", 0),
            widget("GPU memory used (%)", METRIC_GPU_MEM, "Maximum", 6),
            widget("Watchdog heartbeat", METRIC_HEARTBEAT, "SampleCount", 12),
        ]
    }
