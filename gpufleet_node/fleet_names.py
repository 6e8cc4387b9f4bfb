"""The names gpufleet's parts agree on: instance tag keys and values, and the custom metrics.

The one source of these names (README "Contract: tags" and "Contract: metrics"; change them
only with a migration note). Standard library only, no imports at all: this module of the
node package is shipped to every node with the watchdog and packaged into the reaper's
function zip under the same import path, and the stack (infra/), the policy pack (policy/)
and the tests import it from here (``infra.reaper.tags`` re-exports the tags). A test fails
when one of these strings is written out anywhere else in infra/, bootstrap/, policy/,
scripts/ or gpufleet_node/ (tests/test_fleet_names.py).
"""

# ---------------------------------------------------------------------------- tags

MANAGED_BY = "managed-by"
MANAGED_BY_VALUE = "gpufleet"
STACK = "gpufleet:stack"
TIER = "gpufleet:tier"
ROLE = "gpufleet:role"  # head | worker: multi-node stacks stop workers before the head
IDLE_MINUTES = "gpufleet:idle-minutes"
TTL_HOURS = "gpufleet:ttl-hours"  # "0" or "off" opts out of the hard TTL explicitly
KEEP_ALIVE_UNTIL = "gpufleet:keep-alive-until"  # ISO 8601 UTC lease
WATCHDOG = "gpufleet:watchdog"  # "on" when the node watchdog is expected to run
PROTECTED = "gpufleet:protected"  # "true": no guard ever stops the instance
# "<guard>@<ISO 8601 UTC>": who stopped a spot node, written by the guard just before its
# stop where the cloud keeps no reason of its own (Azure): watchdog, reaper, or spot-notice
# (the node saw the cloud's eviction notice). Cleared ("") by the watchdog once the node runs
# again. The reaper's function starts a reclaimed spot node again, never a guard's stop.
# Not in TAG_KEYS (the tags the stack sets): only a stopped spot node carries it.
STOPPED_BY = "gpufleet:stopped-by"

# The protected tag's values, as every layer reads them (lower case, stripped): a value that
# is in neither set is unknown, and an unknown protection is honoured.
PROTECTED_YES = frozenset({"true", "yes", "1", "on"})
PROTECTED_NO = frozenset({"", "false", "no", "0", "off"})

TAG_KEYS = (
    MANAGED_BY,
    STACK,
    TIER,
    ROLE,
    IDLE_MINUTES,
    TTL_HOURS,
    KEEP_ALIVE_UNTIL,
    WATCHDOG,
    PROTECTED,
)

# ---------------------------------------------------------------------------- metrics

# Custom metrics the node watchdog publishes and the reaper reads. Namespace "gpufleet" on
# CloudWatch; CloudMonitor keeps custom metrics under acs_customMetric_<account id>.
NAMESPACE = "gpufleet"
METRIC_GPU_UTIL = "GPUUtilization"  # percent, the busiest GPU of the node at sample time
METRIC_GPU_MEM = "GPUMemoryUtilization"  # percent, the fullest GPU memory of the node
# Value = the node's clock in Unix seconds when it published. The reaper never reads the value
# (a node's clock can be off): it reads the datapoints' timestamps as the service stores them.
METRIC_HEARTBEAT = "Heartbeat"
# How many checkpoint files on the node's scratch are not in the bucket (None: not sent).
METRIC_UNSYNCED = "UnsyncedCheckpointFiles"
DIMENSION = "InstanceId"  # CloudWatch's dimension: the instance id
CMS_DIMENSION = "instanceId"  # CloudMonitor's spelling of the same dimension
CMS_GROUP_ID = "0"  # CloudMonitor custom metrics' GroupId: no application group

METRIC_NAMES = (METRIC_GPU_UTIL, METRIC_GPU_MEM, METRIC_HEARTBEAT, METRIC_UNSYNCED)
# Where no custom-metric service takes a heartbeat (Tencent: PutMonitorData is disused), the
# node writes one object per instance in the stack's bucket: <prefix><instance id>. The
# reaper reads the object's Last-Modified, which the storage service stamps, never its body.
HEARTBEAT_OBJECT_PREFIX = "gpufleet/heartbeat/"


def is_protected(value: object) -> bool:
    """Whether a protected tag value holds the instance: yes, or anything not clearly no
    (a value nobody can read is honoured; the hard TTL does not override it)."""
    return not (isinstance(value, str) and value.strip().lower() in PROTECTED_NO)
