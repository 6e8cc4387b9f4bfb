"""Tag names on managed instances: a contract shared by the stack, the watchdog and the reaper.

Documented in the README ("Contract: tags"); change only with a migration note.
"""

MANAGED_BY = "managed-by"
MANAGED_BY_VALUE = "gpufleet"
STACK = "gpufleet:stack"
TIER = "gpufleet:tier"
ROLE = "gpufleet:role"  # head | worker: multi-node stacks stop workers before the head
IDLE_MINUTES = "gpufleet:idle-minutes"
TTL_HOURS = "gpufleet:ttl-hours"  # "0" or "off" opts out of the hard TTL explicitly
KEEP_ALIVE_UNTIL = "gpufleet:keep-alive-until"  # ISO 8601 UTC lease
WATCHDOG = "gpufleet:watchdog"  # "on" when the node watchdog is expected to run
PROTECTED = "gpufleet:protected"  # "true": the reaper never touches the instance
