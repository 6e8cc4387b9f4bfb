"""The AWS stack's CloudWatch dashboard: its body (GPU utilisation, GPU memory and the
watchdog's heartbeat per node) and the console's address of it."""

from __future__ import annotations

from typing import Any

# The metric names are the reaper's contract with the watchdog; one definition, there.
from gpufleet_node.fleet_names import (
    DIMENSION,
    METRIC_GPU_MEM,
    METRIC_GPU_UTIL,
    METRIC_HEARTBEAT,
    NAMESPACE,
)


def cloudwatch_console_url(region: str, name: str) -> str:
    """The CloudWatch console's address of a dashboard (the console's own link form,
    ``#dashboards:name=``; CloudWatch documents no other)."""
    return (
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
        f"#dashboards:name={name}"
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
