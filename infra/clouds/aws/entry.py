"""AWS Lambda's entry point for the reaper (scheduled by EventBridge every 5 minutes).

Shipped at the top of the AWS function zip as ``handler.py`` (infra/reaper/handler.py
``ENTRY_MODULE``), so the function's handler setting is :data:`HANDLER`. Lambda's runtime
names the function's region in ``AWS_REGION``; the credentials are the execution role's,
found by boto3 itself.
"""

from __future__ import annotations

from typing import Any

from infra.reaper.handler import ENTRY_MODULE, platform_env, run

NAME = "aws"
HANDLER = f"{ENTRY_MODULE}.handler"  # Lambda's <module>.<function>
SCHEDULE = "rate(5 minutes)"  # EventBridge's schedule expression
REGION_ENV = "AWS_REGION"  # set by Lambda's runtime


def handler(event: Any, context: Any) -> dict[str, Any]:
    """AWS Lambda entry; the event is ignored."""
    env = platform_env(REGION_ENV)
    return run(env.get("GPUFLEET_PROVIDER", NAME), env)
