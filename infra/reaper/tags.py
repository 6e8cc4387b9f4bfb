"""Tag names on managed instances: a contract shared by the stack, the watchdog and the reaper.

Written once, in fleet_names.py (the file the nodes receive too); this module re-exports the
tags under the names the stack and the reaper have always imported (``tags as T``).
Documented in the README ("Contract: tags"); change only with a migration note.
"""

from gpufleet_node.fleet_names import (
    IDLE_MINUTES,
    KEEP_ALIVE_UNTIL,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    PROTECTED,
    PROTECTED_NO,
    PROTECTED_YES,
    ROLE,
    STACK,
    STOPPED_BY,
    TAG_KEYS,
    TIER,
    TTL_HOURS,
    WATCHDOG,
    is_protected,
)

__all__ = [
    "IDLE_MINUTES",
    "KEEP_ALIVE_UNTIL",
    "MANAGED_BY",
    "MANAGED_BY_VALUE",
    "PROTECTED",
    "PROTECTED_NO",
    "PROTECTED_YES",
    "ROLE",
    "STACK",
    "STOPPED_BY",
    "TAG_KEYS",
    "TIER",
    "TTL_HOURS",
    "WATCHDOG",
    "is_protected",
]
