"""Alibaba Cloud Function Compute's entry point for the reaper (a timer trigger).

Shipped at the top of the Alicloud function zip as ``handler.py`` (infra/reaper/handler.py
``ENTRY_MODULE``), so the function's handler setting is :data:`HANDLER`. The credentials,
the region and the account come from FC's context.
"""

from __future__ import annotations

import json
from typing import Any

from infra.reaper.handler import ENTRY_MODULE, platform_env, run

NAME = "alicloud"
HANDLER = f"{ENTRY_MODULE}.fc_handler"  # FC's <file>.<function>
SCHEDULE = "@every 5m"  # the timer trigger's cronExpression
REGION_ENV = "FC_REGION"  # set by FC's runtime (after the context's region)


def fc_handler(event: Any, context: Any) -> str:
    """Function Compute entry (timer trigger): credentials come from the context."""
    env = platform_env()
    region = env.get("GPUFLEET_REGION") or getattr(context, "region", None) or env.get(REGION_ENV)
    if region:
        env["GPUFLEET_REGION"] = str(region)
    creds = getattr(context, "credentials", None)
    credentials: dict[str, str] | None = None
    if creds is not None:
        # FC's Python runtimes name these in snake_case; older ones in camelCase.
        credentials = {
            key: str(getattr(creds, key, None) or getattr(creds, camel, "") or "")
            for key, camel in (
                ("access_key_id", "accessKeyId"),
                ("access_key_secret", "accessKeySecret"),
                ("security_token", "securityToken"),
            )
        }
    out = run(
        env.get("GPUFLEET_PROVIDER", NAME),
        env,
        credentials=credentials,
        account_id=getattr(context, "account_id", None),
    )
    return json.dumps(out, sort_keys=True)
