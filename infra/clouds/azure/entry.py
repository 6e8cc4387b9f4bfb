"""Azure Functions' entry point for the reaper, called by the timer function in
function_app.py (the module the Functions host imports).

Shipped at the top of the Azure function package as ``handler.py`` (infra/reaper/handler.py
``ENTRY_MODULE``). The identity is the Function App's managed identity, read by the reaper's
own credential (reaper.py); its settings are reaper.py's ``REQUIRED_ENV``.
"""

from __future__ import annotations

from typing import Any

from infra.reaper.handler import platform_env, run

NAME = "azure"


def azure_handler(timer: Any, context: Any) -> dict[str, Any]:
    """Azure Functions entry (timer trigger); the timer is ignored."""
    env = platform_env()  # the host names no region: the stack sets GPUFLEET_REGION
    return run(env.get("GPUFLEET_PROVIDER", NAME), env)
