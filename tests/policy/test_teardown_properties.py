"""Property tests of the teardown job: random mutations of a fleet never make it stop an
untagged, protected, leased or busy instance.

The fleet starts from the tags the shipped stacks give their nodes (infra.nodes.node_tags) and
is mutated the way real fleets drift: tags dropped or edited by hand, instances of other
stacks and other tools, odd tag spellings, any state, any age, missing or failing metrics.
The reaper's real run (infra.reaper.core.reap, with apply=True) goes against an in-memory
cloud that records every stop call: what the test checks is what would have been stopped.

"Busy" is judged here from the raw signals, not from the reaper's code: a watchdog heartbeat
in the last 5 minutes (true time), or a GPU at 50 % or more in the metrics. A busy instance
may still be stopped by its hard TTL (documented precedence: the TTL bounds the bill even
while busy), so busy instances are generated younger than any TTL they can carry.

Clocks drift too: the host running the reaper is up to 12 minutes off the service's clock,
and a drifted node stamps its heartbeats up to 12 minutes off. Tag values are drawn from the
ones that broke the reaper before (1e12, NaN, non-ASCII digits, null and nested values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpufleet_node.idle_rules import UTC, format_utc
from infra.config import load_stack_file
from infra.nodes import node_tags
from infra.offline import PLACEHOLDER_SSH_KEY
from infra.reaper import tags as T
from infra.reaper.core import Instance, Metrics, StopResult, reap

STACKS = sorted((Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml"))
# Real node tags and instance types of every shipped stack (head and a worker).
BASE_NODES = []
for _path in STACKS:
    _cfg = load_stack_file(_path, {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    for _role in ("head", "worker"):
        BASE_NODES.append((_cfg.instance_type, node_tags(_cfg, _role, f"{_cfg.stack}-0")))
STACK_NAMES = sorted({tags[T.STACK] for _, tags in BASE_NODES})

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the service's clock
PROTECT_VALUES = ("true", "True", "TRUE", " true ", "yes", "1")
NOT_PROTECT_VALUES = ("false", "no", "", "0")
UNREADABLE_PROTECT = ("maybe", "tru", "\x00", None)  # kept all the same (reported unknown)
BAD_NUMBERS: tuple[object, ...] = (
    "1e12",
    "1e400",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "-3",
    "0",
    "99999999",
    "１５",
    "1_5",
    "0x10",
    "15 min",
    "",
    " ",
    "\n",
    "15\x00",
    [],
    {"minutes": 15},
    15,
    None,
    True,
)
BUSY_UTIL = 50.0
FRESH_HEARTBEAT_MIN = 5


class FakeCloud:
    """The Cloud protocol over a fixed fleet; stops are recorded, never performed."""

    provider = "aws"
    region = "us-east-1"

    def __init__(
        self,
        fleet: Sequence[Instance],
        metrics: dict[str, Metrics],
        filters: bool,
        *,
        clock: bool = True,
        omitted: frozenset[str] = frozenset(),
    ):
        self.fleet, self._metrics, self.filters = list(fleet), metrics, filters
        self.stopped: list[str] = []
        self.clock, self.omitted = clock, omitted

    def service_time(self) -> datetime | None:
        return NOW if self.clock else None

    def scan(self, stack: str | None) -> list[Instance]:
        # Half the time the scan ignores the stack filter, as a buggy or wide scan might.
        if self.filters and stack is not None:
            return [i for i in self.fleet if i.tags.get(T.STACK) == stack]
        return list(self.fleet)

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        out = {}
        for iid in instance_ids:
            if iid in self.omitted:  # an answer that left this instance out
                continue
            m = self._metrics.get(iid, Metrics())
            beat = m.last_heartbeat
            heartbeat = beat if beat and start <= beat <= end else None
            out[iid] = Metrics(heartbeat, m.max_gpu_util, m.error)
        return out

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        self.stopped.extend(instance_ids)
        return StopResult(stopped=list(instance_ids))


@dataclass
class Node:
    instance: Instance
    metrics: Metrics
    busy: bool = False
    leased: bool = False
    drifts: list[str] = field(default_factory=list)
    omitted: bool = False


DRIFTS = (
    "unmanaged",
    "protected",
    "protect-word-that-is-not-yes",
    "lease-future",
    "lease-past",
    "lease-garbage",
    "other-stack",
    "no-stack",
    "not-running",
    "prepaid",
    "idle-tag-garbage",
    "ttl-tag",
    "watchdog-off",
    "metrics-error",
    "metrics-omitted",
    "node-clock-skew",
    "young",
)


@st.composite
def nodes(draw: st.DrawFn, index: int) -> Node:
    """A node that the reaper should stop (idle) or keep (busy), then 0-3 random drifts."""
    itype, base = draw(st.sampled_from(BASE_NODES))
    tags: dict[str, str | None] = dict(base)
    busy = draw(st.booleans())
    if busy:
        age = draw(st.floats(min_value=0, max_value=90))  # younger than any TTL it can carry
        signal = draw(st.sampled_from(["heartbeat", "gpu", "both"]))
        fresh = draw(st.floats(0, FRESH_HEARTBEAT_MIN))
        heartbeat = NOW - timedelta(minutes=fresh) if signal != "gpu" else None
        util = draw(st.floats(BUSY_UTIL, 100)) if signal != "heartbeat" else None
    else:  # idle: old enough, watchdog silent, GPUs quiet
        # Younger than any TTL half the time, so the activity rules decide.
        age = draw(st.sampled_from([120.0, 400.0, 700.0, 1500.0, 3 * 24 * 60.0]))
        # Silent long enough to be stale, recent enough to be in the metrics window (or never
        # seen at all, or silent so long that it left the window).
        stale = draw(st.sampled_from([None, 30.0, 42.5, 55.0, 90.0, 600.0]))
        heartbeat = NOW - timedelta(minutes=stale) if stale is not None else None
        util = draw(st.one_of(st.none(), st.floats(0, 5)))
    state, prepaid, error = "running", False, None
    leased = omitted = False
    drifts = draw(st.one_of(st.just([]), st.lists(st.sampled_from(DRIFTS), max_size=3)))
    for drift in drifts:
        if drift == "unmanaged":
            tags[T.MANAGED_BY] = draw(st.sampled_from([None, "terraform", "GPUFLEET", "gpufleet "]))
        elif drift == "protected":
            tags[T.PROTECTED] = draw(st.sampled_from(PROTECT_VALUES))
        elif drift == "protect-word-that-is-not-yes":
            tags[T.PROTECTED] = draw(st.sampled_from(NOT_PROTECT_VALUES + UNREADABLE_PROTECT))
        elif drift.startswith("lease-"):
            minutes = timedelta(minutes=draw(st.integers(1, 600)))
            leased = drift == "lease-future"  # the last lease written is the one that counts
            tags[T.KEEP_ALIVE_UNTIL] = {
                "lease-future": format_utc(NOW + minutes),
                "lease-past": format_utc(NOW - minutes),
                "lease-garbage": draw(
                    st.sampled_from(["tomorrow-ish", "9999-12-31T00:00:00Z", "\x00", [], 7])
                ),
            }[drift]
        elif drift == "other-stack":
            tags[T.STACK] = draw(st.sampled_from(STACK_NAMES))
        elif drift == "no-stack":
            tags[T.STACK] = draw(st.sampled_from([None, ""]))
        elif drift == "not-running":
            state = draw(st.sampled_from(["stopped", "pending", "stopping"]))
        elif drift == "prepaid":
            prepaid = True
        elif drift == "idle-tag-garbage":
            tags[T.IDLE_MINUTES] = draw(st.sampled_from(["5", "abc", *BAD_NUMBERS]))
        elif drift == "ttl-tag":
            # Busy nodes only get TTLs they are younger than (garbage -> the >= 12 h default).
            safe = ["off", "2", "24", "junk", *BAD_NUMBERS]
            safe.remove("0")  # "0" opts out, fine for busy nodes; short TTLs are not
            tags[T.TTL_HOURS] = draw(st.sampled_from(safe if busy else [*safe, "0", "0.5", "1"]))
        elif drift == "watchdog-off":
            tags[T.WATCHDOG] = draw(st.sampled_from(["off", None]))
        elif drift == "metrics-error":
            error = draw(st.sampled_from(["throttled", "CloudWatch: heartbeat PartialData"]))
        elif drift == "metrics-omitted":
            omitted = True
        elif drift == "node-clock-skew" and heartbeat is not None:
            heartbeat += timedelta(minutes=draw(st.floats(-12, 12)))
        elif drift == "young":
            age = draw(st.floats(min_value=0, max_value=age))
    instance = Instance(
        instance_id=f"i-{index:04d}",
        state=state,
        instance_type=itype,
        launched_at=NOW - timedelta(minutes=age),
        tags={k: v for k, v in tags.items() if v is not None or k == T.PROTECTED},
        spot=draw(st.booleans()),
        prepaid=prepaid,
    )
    return Node(instance, Metrics(heartbeat, util, error), busy, leased, drifts, omitted)


fleets = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(*[nodes(i) for i in range(n)])
)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    fleet=fleets,
    stack=st.sampled_from([None, *STACK_NAMES]),
    filters=st.booleans(),
    host_skew=st.floats(-12, 12),
    service_clock=st.booleans(),
)
def test_the_reaper_never_stops_untagged_protected_leased_or_busy_instances(
    fleet: tuple[Node, ...], stack: str | None, filters: bool, host_skew: float, service_clock: bool
) -> None:
    cloud = FakeCloud(
        [n.instance for n in fleet],
        {n.instance.instance_id: n.metrics for n in fleet},
        filters,
        clock=service_clock,
        omitted=frozenset(n.instance.instance_id for n in fleet if n.omitted),
    )
    # The host's clock is off by up to 12 minutes either way; the service's is NOW.
    report = reap(cloud, stack=stack, apply=True, now=NOW + timedelta(minutes=host_skew))
    by_id = {n.instance.instance_id: n for n in fleet}
    assert len(cloud.stopped) == len(set(cloud.stopped)), "an instance was stopped twice"
    for iid in cloud.stopped:
        node = by_id[iid]
        tags = node.instance.tags
        assert tags.get(T.MANAGED_BY) == "gpufleet", f"{iid}: not ours ({tags.get(T.MANAGED_BY)!r})"
        marked = T.PROTECTED in tags and tags[T.PROTECTED] in PROTECT_VALUES + UNREADABLE_PROTECT
        assert not marked, f"{iid}: protected ({tags.get(T.PROTECTED)!r})"
        assert not node.leased, f"{iid}: leased until {tags.get(T.KEEP_ALIVE_UNTIL)}"
        assert not node.busy, f"{iid}: busy ({node.metrics})"
        assert node.instance.state == "running", f"{iid}: was {node.instance.state}"
        assert not node.instance.prepaid, f"{iid}: prepaid, stopping saves nothing"
        if stack is not None:
            assert tags.get(T.STACK) == stack, f"{iid}: belongs to {tags.get(T.STACK)!r}"
        # Nothing unread stops a node, except the TTL or the 14-day cap that bound every keep.
        why = next(d.reason for d in report.decisions if d.instance_id == iid)
        if node.metrics.last_heartbeat is None or node.omitted or node.metrics.error:
            assert "TTL" in why or "cap" in why, f"{iid}: stopped without evidence: {why}"
    event(f"stopped {min(len(cloud.stopped), 3)}{'+' if len(cloud.stopped) >= 3 else ''}")
    # ...and it is not simply stopping nothing: an idle node nobody touched, whose heartbeat
    # went stale inside the metrics window while another node's still arrived, is stopped.
    judged = [n for n in fleet if not n.drifts and stack in (None, n.instance.tags.get(T.STACK))]
    live = [n.metrics.last_heartbeat for n in judged if n.busy and n.metrics.last_heartbeat]
    for node in judged:
        beat = node.metrics.last_heartbeat
        if node.busy or beat is None or not live or not service_clock:
            continue
        if timedelta(minutes=30) <= NOW - beat <= timedelta(minutes=55):
            event("an idle node with a stale heartbeat was checked")
            assert node.instance.instance_id in cloud.stopped, f"idle {node.instance} kept"
    # The report tells the same story as the calls.
    reported = {d.instance_id for d in report.decisions if d.result == "stopped"}
    assert reported == set(cloud.stopped)
