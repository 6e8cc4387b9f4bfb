"""The reaper's run, independent of the cloud: scan, read metrics, decide, stop, summarise.

A cloud is anything with ``scan``, ``metrics`` and ``stop`` (see :class:`Cloud`); ``aws.py``
and ``alicloud.py`` are the two real ones. Nothing here imports an SDK.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from . import tags as T
from .policy import (
    KEEP,
    STOP,
    UTC,
    CloudView,
    Decision,
    Lease,
    Limits,
    Policy,
    decide_cloud,
    lookback_minutes,
    resolve_limits,
)

# Custom metrics the node watchdog publishes and the reaper reads (README: "Contract: metrics").
# Namespace "gpufleet" on CloudWatch; acs_customMetric_<account id> on CloudMonitor.
NAMESPACE = "gpufleet"
METRIC_GPU_UTIL = "GPUUtilization"  # percent, the busiest GPU of the node at sample time
METRIC_GPU_MEM = "GPUMemoryUtilization"  # percent, the fullest GPU memory of the node
# Value = the node's clock in Unix seconds when it published: the Maximum over any window is
# the latest heartbeat, in one datapoint; SampleCount per minute still draws "alive" graphs.
METRIC_HEARTBEAT = "Heartbeat"
DIMENSION = "InstanceId"  # CloudWatch; CloudMonitor uses "instanceId"

RUNNING = "running"


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    """Consecutive slices of at most ``size``: one API call's worth each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class Instance:
    """One managed instance as the scan saw it; provider vocabulary already normalised."""

    instance_id: str
    state: str  # pending | running | stopping | stopped | other provider states, lowercase
    instance_type: str
    launched_at: datetime  # last start: the TTL and boot grace count from here
    tags: Mapping[str, str]
    spot: bool = False
    prepaid: bool = False  # subscription billing: stopping saves nothing

    @property
    def stack(self) -> str:
        return self.tags.get(T.STACK, "")

    @property
    def role(self) -> str:
        return self.tags.get(T.ROLE, "")

    @property
    def managed(self) -> bool:
        return self.tags.get(T.MANAGED_BY) == T.MANAGED_BY_VALUE

    @property
    def protected(self) -> bool:
        return self.tags.get(T.PROTECTED, "").strip().lower() in {"true", "yes", "1"}

    def limits(self) -> Limits:
        return resolve_limits(
            tier=self.tags.get(T.TIER),
            instance_type=self.instance_type,
            idle_minutes_tag=self.tags.get(T.IDLE_MINUTES),
            ttl_hours_tag=self.tags.get(T.TTL_HOURS),
        )

    def lease(self) -> Lease:
        return Lease.parse(self.tags.get(T.KEEP_ALIVE_UNTIL))


@dataclass(frozen=True)
class Metrics:
    last_heartbeat: datetime | None = None
    max_gpu_util: float | None = None
    error: str | None = None


@dataclass
class StopResult:
    stopped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # id -> why

    def merge(self, other: StopResult) -> None:
        self.stopped.extend(i for i in other.stopped if i not in self.stopped)
        for iid, why in other.failed.items():
            if iid not in self.stopped:
                self.failed[iid] = why


class Cloud(Protocol):
    provider: str
    region: str

    def scan(self, stack: str | None) -> list[Instance]: ...

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]: ...

    def stop(self, instance_ids: Sequence[str]) -> StopResult: ...


# (gpus, price per hour, currency) for a (provider, instance type, spot) or None if unknown.
PriceLookup = Callable[[str, str, bool], "tuple[int, float | None, str] | None"]


@dataclass(frozen=True)
class InstanceDecision:
    instance_id: str
    stack: str
    role: str
    instance_type: str
    state: str
    spot: bool
    action: str
    reason: str
    warning: str | None = None
    result: str = ""  # "stopped" | "dry run" | "failed: ..." | "" for keep

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instance_id": self.instance_id,
            "stack": self.stack,
            "action": self.action,
            "reason": self.reason,
            "role": self.role,
            "instance_type": self.instance_type,
            "state": self.state,
            "spot": self.spot,
        }
        if self.result:
            out["result"] = self.result
        if self.warning:
            out["warning"] = self.warning
        return out


@dataclass(frozen=True)
class Report:
    provider: str
    region: str
    stack: str | None
    apply: bool
    now: datetime
    decisions: tuple[InstanceDecision, ...]
    summary: dict[str, Any]

    @property
    def failed(self) -> list[InstanceDecision]:
        return [d for d in self.decisions if d.result.startswith("failed")]

    @property
    def exit_code(self) -> int:
        """0: every intended stop succeeded (or dry run); 1: some stop failed."""
        return 1 if self.failed else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "region": self.region,
            "stack": self.stack,
            "apply": self.apply,
            "now": self.now.astimezone(UTC).isoformat(),
            "decisions": [d.as_json() for d in self.decisions],
            "summary": self.summary,
        }


def _stop_order(ids: Iterable[str], by_id: Mapping[str, Instance]) -> list[list[str]]:
    """Workers (and nodes without a role) before heads: a head is the rendezvous host."""
    ids = list(ids)
    first = [i for i in ids if by_id[i].role != "head"]
    last = [i for i in ids if by_id[i].role == "head"]
    return [group for group in (first, last) if group]


def _decide(inst: Instance, metrics: Metrics | None, now: datetime, policy: Policy) -> Decision:
    if not inst.managed:
        # The scan filters by tag; this guards against a scan that did not.
        return Decision(KEEP, "not managed by gpufleet: never touched")
    if inst.protected:
        return Decision(KEEP, "protected (gpufleet:protected=true)")
    if inst.state != RUNNING:
        return Decision(KEEP, f"not running ({inst.state})")
    if inst.prepaid:
        return Decision(KEEP, "subscription (prepaid) billing: stopping would save nothing")
    limits = inst.limits()
    m = metrics or Metrics(error="no metrics were fetched")
    view = CloudView(
        launched_at=inst.launched_at,
        last_heartbeat=m.last_heartbeat,
        max_gpu_util=m.max_gpu_util,
        metrics_error=m.error,
        watchdog_expected=inst.tags.get(T.WATCHDOG, "on").strip().lower() != "off",
    )
    decision = decide_cloud(view, now=now, limits=limits, lease=inst.lease(), policy=policy)
    if limits.notes:
        decision = Decision(
            decision.action, f"{decision.reason} [{'; '.join(limits.notes)}]", decision.warning
        )
    return decision


def reap(
    cloud: Cloud,
    *,
    stack: str | None = None,
    apply: bool = False,
    now: datetime | None = None,
    policy: Policy | None = None,
    price: PriceLookup | None = None,
) -> Report:
    """One reaper pass. Dry run unless ``apply``; never terminates anything."""
    policy = policy or Policy()
    now = (now or datetime.now(UTC)).astimezone(UTC)
    scanned = cloud.scan(stack)
    # Another stack's instances never reach the decisions, whatever the scan returned.
    instances = [i for i in scanned if i.managed and (stack is None or i.stack == stack)]
    by_id = {i.instance_id: i for i in instances}

    # Metrics only for instances the activity rules may judge, grouped by lookback, because
    # one GetMetricData call has one time range.
    by_lookback: dict[float, list[str]] = {}
    for inst in instances:
        if inst.state == RUNNING and not inst.protected and not inst.prepaid:
            minutes = lookback_minutes(inst.limits(), policy)
            by_lookback.setdefault(minutes, []).append(inst.instance_id)
    metrics: dict[str, Metrics] = {}
    for minutes, ids in sorted(by_lookback.items()):
        # Whole minutes: CloudWatch periods are multiples of 60 s.
        start = now - timedelta(minutes=math.ceil(minutes))
        metrics.update(cloud.metrics(ids, start=start, end=now))

    decided = {
        i.instance_id: _decide(i, metrics.get(i.instance_id), now, policy) for i in instances
    }
    to_stop = [iid for iid, d in decided.items() if d.action == STOP]

    results: dict[str, str] = {}
    if apply:
        for group in _stop_order(to_stop, by_id):
            outcome = cloud.stop(group)
            for iid in outcome.stopped:
                results[iid] = "stopped"
            for iid, why in outcome.failed.items():
                results[iid] = f"failed: {why}"
            for iid in group:
                results.setdefault(iid, "failed: the stop call did not report this instance")
    else:
        results = {iid: "dry run" for iid in to_stop}

    decisions = tuple(
        InstanceDecision(
            instance_id=inst.instance_id,
            stack=inst.stack,
            role=inst.role,
            instance_type=inst.instance_type,
            state=inst.state,
            spot=inst.spot,
            action=decided[inst.instance_id].action,
            reason=decided[inst.instance_id].reason,
            warning=decided[inst.instance_id].warning,
            result=results.get(inst.instance_id, ""),
        )
        for inst in sorted(instances, key=lambda i: (i.stack, i.instance_id))
    )
    return Report(
        provider=cloud.provider,
        region=cloud.region,
        stack=stack,
        apply=apply,
        now=now,
        decisions=decisions,
        summary=summarise(decisions, cloud.provider, price, apply=apply),
    )


def summarise(
    decisions: Sequence[InstanceDecision],
    provider: str,
    price: PriceLookup | None,
    *,
    apply: bool,
) -> dict[str, Any]:
    """Counts, and the GPU-hours and money per hour that the stops save (or would save)."""
    stops = [d for d in decisions if d.action == STOP]
    saving = [d for d in stops if d.result in {"stopped", "dry run"}]
    gpus = 0
    money: dict[str, float] = {}
    unknown: set[str] = set()
    for d in saving:
        found = price(provider, d.instance_type, d.spot) if price else None
        if found is None:
            unknown.add(d.instance_type)
            continue
        count, per_hour, currency = found
        gpus += count
        if per_hour is None:
            unknown.add(d.instance_type)
        else:
            money[currency] = round(money.get(currency, 0.0) + per_hour, 4)
    summary: dict[str, Any] = {
        "instances": len(decisions),
        "stop": len(stops),
        "keep": len(decisions) - len(stops),
        "stopped": sum(1 for d in stops if d.result == "stopped"),
        "failed": sum(1 for d in stops if d.result.startswith("failed")),
        "dry_run": not apply,
        "gpus_stopped": gpus,
        "gpu_hours_saved_per_hour": gpus,
        "saved_per_hour": money,
    }
    if unknown:
        summary["price_unknown"] = sorted(unknown)
    return summary
