"""Tencent SCF's entry point for the reaper (a timer trigger every 5 minutes).

Shipped at the top of the Tencent function zip as ``handler.py`` (infra/reaper/handler.py
``ENTRY_MODULE``), so the function's handler setting is :data:`HANDLER` (SCF's Python
convention: ``main_handler(event, context)``). The execution role's keys are in the
environment (reaper.py ``CREDENTIAL_ENV``).
"""

from __future__ import annotations

import json
from typing import Any

from infra.reaper.handler import ENTRY_MODULE, platform_env, run

NAME = "tencent"
HANDLER = f"{ENTRY_MODULE}.main_handler"  # SCF's <file>.<function>
REGION_ENV = "TENCENTCLOUD_REGION"  # set by SCF's runtime


def main_handler(event: Any, context: Any) -> str:
    """SCF entry (timer trigger); the event is ignored."""
    env = platform_env(REGION_ENV)
    out = run(env.get("GPUFLEET_PROVIDER", NAME), env)
    return json.dumps(out, sort_keys=True)
