"""Spot recovery: which of the stack's stopped spot nodes the function starts again.

A spot node the cloud stops rather than deletes (EC2 interruption behavior stop, Alibaba's
economical-mode Stop, Azure's Deallocate) is started again once the cloud has capacity: by
the cloud itself where it does so, else by this function. It must never start a node that
a guard stopped for idleness, nor one a person stopped: it tells them apart from the
cloud's own record (:class:`~infra.reaper.core.StopRecord`, each cloud's reaper.py says
where it reads it) and, where the cloud keeps none, from the record the guards write just
before their stop (tag ``gpufleet:stopped-by`` = ``<guard>@<time>``). When unsure it does
not start, and says why: a started idle node burns money.

One start per node per run (the function runs every few minutes: that is the back-off);
a refusal for capacity is reported as "waiting for capacity (<the cloud's code>)" and
tried again next run, for at most :data:`RECOVERY_HOURS` after the reclaim.

A node the stack expects (GPUFLEET_NODES) that the scan no longer finds, or finds deleted,
is reported as "lost: <id> (<reason>)": nothing here replaces it (``fab recover``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet_node.idle_rules import UTC, parse_utc

from . import tags as T
from .core import Instance, StartResult

STOPPED = "stopped"
# The guards that stop a node for idleness or its TTL: their record keeps it stopped.
GUARDS = ("watchdog", "reaper")
# The node's watchdog saw the cloud's own eviction notice (Azure Scheduled Events Preempt).
NOTICE = "spot-notice"
# A node's eviction notice counts for a stop at most this long after it (the notice comes
# 30 s or more before the eviction; Azure Scheduled Events Preempt).
NOTICE_BEFORE_STOP = timedelta(minutes=30)
# A reclaim older than this is no longer started by the function (bounded retries).
RECOVERY_HOURS = 24.0
# States a scan may list for an instance the cloud deleted or is deleting: EC2's
# shutting-down/terminated; CVM's SHUTDOWN "停止待销毁" (stopped, to be destroyed: a
# repossessed spot instance), TERMINATING and LAUNCH_FAILED (tencentcloud-sdk-python-cvm
# 3.1.178 models.py, Instance.InstanceState), as infra/clouds/tencent/reaper.py names them.
GONE_STATES = frozenset(
    {"terminated", "shutting-down", "shutdown", "terminating", "launch-failed", "deleting"}
)

START = "start"
CLOUD_RESTARTS = "cloud restarts"
KEEP = "keep"
LOST = "lost"


def record_value(guard: str, when: datetime) -> str:
    """The STOPPED_BY tag a guard writes just before its stop: ``<guard>@<UTC time>``."""
    return f"{guard}@{when.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def parse_record(value: Any) -> tuple[str, datetime | None] | None:
    """(guard, when) of a STOPPED_BY value; None when there is none (unset or cleared)."""
    if not isinstance(value, str) or not value.strip():
        return None
    who, _, when = value.strip().partition("@")
    try:
        at = parse_utc(when) if when else None
    except ValueError:
        at = None
    return who.strip().lower(), at


@dataclass(frozen=True)
class Recovery:
    """The function's verdict on one stopped spot node, or one lost node."""

    instance_id: str
    verdict: str  # START | CLOUD_RESTARTS | KEEP | LOST
    reason: str
    role: str = ""
    result: str = ""  # started | dry run | waiting for capacity (code) | failed: ...

    @property
    def line(self) -> str:
        """One line of the function's report."""
        if self.verdict == LOST:
            return f"lost: {self.instance_id} ({self.reason})"
        if self.verdict == CLOUD_RESTARTS:
            return f"reclaimed: {self.instance_id}: {self.reason}"
        if self.verdict == START:
            return f"reclaimed: {self.instance_id}: {self.result or 'to start'} ({self.reason})"
        return f"stopped: {self.instance_id}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        out = {
            "instance_id": self.instance_id,
            "recovery": self.verdict,
            "reason": self.reason,
            "line": self.line,
        }
        if self.result:
            out["result"] = self.result
        return out


def judge(inst: Instance, now: datetime, *, enabled: bool, can_start: bool) -> Recovery | None:
    """The verdict on one scanned instance: None unless it is a stopped spot node."""
    if inst.state != STOPPED or not inst.spot:
        return None
    iid, role = inst.instance_id, inst.role

    def keep(why: str) -> Recovery:
        return Recovery(iid, KEEP, why, role)

    if inst.protected:
        return keep(f"{inst.protected_reason}: never started by the function")
    rec = inst.stop_record
    if rec is not None and rec.reclaimed and rec.cloud_restarts:
        return Recovery(iid, CLOUD_RESTARTS, f"{rec.detail}: the cloud restarts it", role)
    raw = inst.tags.get(T.STOPPED_BY)
    guard = parse_record(raw)
    if guard is not None and guard[0] in GUARDS:
        when = guard[1].strftime("%Y-%m-%d %H:%M UTC") if guard[1] else "an unknown time"
        return keep(f"stopped by the {guard[0]} at {when} (idle or TTL): not started")
    at: datetime | None
    if rec is not None:
        if rec.reclaimed is None:
            return keep(f"stop reason unreadable ({rec.error or rec.detail}): not started")
        if not rec.reclaimed:
            return keep(f"not a reclaim ({rec.detail}): a person's or a guard's stop, kept")
        detail, at = rec.detail, rec.at
    elif guard is not None and guard[0] == NOTICE:
        detail, at = f"the node saw the eviction notice ({T.STOPPED_BY}={raw})", guard[1]
        if at is None or (
            inst.launched_at is not None and at < inst.launched_at - NOTICE_BEFORE_STOP
        ):
            # A notice long before the VM's last operation (Azure: its deallocation) is
            # not what stopped it: a stale record, never a reason to start.
            return keep(f"{detail} is older than its last stop or start: not started")
    elif guard is not None:
        return keep(f"{T.STOPPED_BY}={str(raw)[:40]!r} is not a record this reads: not started")
    else:
        return keep(
            "stopped with no record of who stopped it (a person, or an eviction the node "
            "did not see): not started; `fab start` starts it"
        )
    if at is not None and now - at > timedelta(hours=RECOVERY_HOURS):
        return keep(
            f"reclaimed ({detail}) more than {RECOVERY_HOURS:g} h ago: no longer started by "
            "the function; `fab start` starts it"
        )
    if not enabled:
        return keep(f"reclaimed ({detail}); recovery is off for this stack")
    if not can_start:
        return keep(f"reclaimed ({detail}); this cloud's function cannot start nodes")
    return Recovery(iid, START, detail, role)


def lost(instances: Iterable[Instance], expected: Sequence[str]) -> list[Recovery]:
    """The expected nodes (instance ids, or node names: the Name tag the stack sets, an
    Azure VM's name) the scan did not find, or found deleted."""
    seen: dict[str, Instance] = {}
    for inst in instances:
        seen[inst.instance_id] = inst
        name = inst.tag("Name")
        if name and (name not in seen or seen[name].state in GONE_STATES):
            seen[name] = inst  # a live node of that name wins over a deleted one
    out = []
    for node in expected:
        found = seen.get(node)
        if found is None:
            out.append(Recovery(node, LOST, "gone from the cloud: deleted or repossessed"))
        elif found.state in GONE_STATES:
            why = f"{found.instance_id} {found.state} by the cloud"
            out.append(Recovery(node, LOST, why, found.role))
    return out


def start(cloud: Any, verdicts: list[Recovery], *, apply: bool) -> list[Recovery]:
    """Start the nodes judged START, heads first (the rendezvous host), one call per role
    group; a call that raises is every id's failure, never the run's."""
    todo = [v for v in verdicts if v.verdict == START]
    if not todo:
        return verdicts
    results: dict[str, str] = {}
    if not apply:
        results = {v.instance_id: "dry run" for v in todo}
    else:
        heads = [v.instance_id for v in todo if v.role == "head"]
        rest = [v.instance_id for v in todo if v.role != "head"]
        for group in (heads, rest):
            if group:
                results.update(_start_group(cloud, group))
    return [
        Recovery(v.instance_id, v.verdict, v.reason, v.role, results.get(v.instance_id, ""))
        if v.verdict == START
        else v
        for v in verdicts
    ]


def _start_group(cloud: Any, ids: list[str]) -> dict[str, str]:
    try:
        outcome: StartResult = cloud.start(ids)
    except Exception as exc:  # retried next run
        why = f"{type(exc).__name__}: {exc}"[:200]
        return {iid: f"failed: {why}; tried again next run" for iid in ids}
    out: dict[str, str] = {}
    for iid in outcome.started:
        out[iid] = "started"
    for iid, code in outcome.capacity.items():
        out[iid] = f"waiting for capacity ({code}); tried again next run"
    for iid, why in outcome.failed.items():
        out.setdefault(iid, f"failed: {why}; tried again next run")
    for iid in ids:
        out.setdefault(iid, "failed: the start call did not report it; tried again next run")
    return out


def run(
    cloud: Any,
    instances: Sequence[Instance],
    now: datetime,
    *,
    apply: bool,
    enabled: bool,
    expected: Sequence[str] = (),
) -> list[Recovery]:
    """The recovery pass of one run: verdicts on the stopped spot nodes (started when
    ``apply`` and recovery is ``enabled``), then the lost ones. One that cannot be judged
    is kept and reported, never the run's failure."""
    can_start = callable(getattr(cloud, "start", None))
    verdicts: list[Recovery] = []
    for inst in sorted(instances, key=lambda i: i.instance_id):
        try:
            verdict = judge(inst, now, enabled=enabled, can_start=can_start)
        except Exception as exc:
            verdict = Recovery(inst.instance_id, KEEP, f"could not judge: {exc}"[:200])
        if verdict is not None:
            verdicts.append(verdict)
    verdicts = start(cloud, verdicts, apply=apply)
    return verdicts + lost(instances, expected)


def summary(verdicts: Sequence[Recovery]) -> dict[str, Any]:
    def count(pred: Any) -> int:
        return sum(1 for v in verdicts if pred(v))

    return {
        "reclaimed_to_start": count(lambda v: v.verdict == START),
        "started": count(lambda v: v.result == "started"),
        "waiting_for_capacity": count(lambda v: v.result.startswith("waiting for capacity")),
        "start_failed": count(lambda v: v.result.startswith("failed")),
        "cloud_restarts": count(lambda v: v.verdict == CLOUD_RESTARTS),
        "stopped_kept": count(lambda v: v.verdict == KEEP),
        "lost": count(lambda v: v.verdict == LOST),
    }


def expected_nodes(env: Mapping[str, str]) -> tuple[str, ...]:
    """GPUFLEET_NODES: the stack's node ids, comma separated (the stack sets it)."""
    raw = env.get("GPUFLEET_NODES", "")
    return tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
