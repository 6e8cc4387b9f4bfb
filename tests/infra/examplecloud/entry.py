"""The throwaway cloud's function entry point, shipped at the top of its function zip as
handler.py: its platform calls ``handler.example_handler`` every 5 minutes and names the
function's region in EXAMPLECLOUD_REGION."""

from __future__ import annotations

from typing import Any

from infra.reaper.handler import ENTRY_MODULE, platform_env, run

NAME = "examplecloud"
HANDLER = f"{ENTRY_MODULE}.example_handler"
SCHEDULE = "every 5 minutes"
REGION_ENV = "EXAMPLECLOUD_REGION"


def example_handler(event: Any, context: Any) -> dict[str, Any]:
    env = platform_env(REGION_ENV)
    return run(env.get("GPUFLEET_PROVIDER", NAME), env)
