"""The reaper's run, independent of the cloud: scan, read metrics, decide, stop, summarise.

A cloud is anything with ``scan``, ``metrics`` and ``stop`` (see :class:`Cloud`); ``aws.py``
and ``alicloud.py`` are the two real ones. Nothing here imports an SDK.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from gpufleet_node.idle_rules import (
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

from . import tags as T
from .catalog_data import load_table

RUNNING = "running"
# The setting that caps attempts per API call, the first included (each cloud its default).
MAX_ATTEMPTS_ENV = "GPUFLEET_MAX_ATTEMPTS"
# More than this between the host's clock and the service's is reported (AWS SigV4 refuses
# requests signed more than 5 minutes off; botocore corrects its own signing clock).
CLOCK_WARN_MINUTES = 5.0


class ConfigError(ValueError):
    """The function's environment is incomplete or wrong."""


def int_env(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number of at least 1 from ``env`` (``default`` when unset or blank)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


@dataclass(frozen=True)
class Invocation:
    """What a cloud module's ``from_env`` gets beside the environment: the keys and the
    account the platform hands this invocation (Function Compute's context), and an API
    endpoint the caller chose (tests, ``teardown.py --endpoint-url``)."""

    credentials: Mapping[str, str] | None = None
    account_id: str | None = None
    endpoint: str | None = None


class ServiceClock:
    """The API's own clock, from the Date header of its answers (second resolution).

    ``now()`` is the last Date seen plus the time elapsed since on this host's monotonic
    clock, so a host whose wall clock is off still judges by the service's time.
    """

    def __init__(self) -> None:
        self._seen: tuple[datetime, float] | None = None

    def observe(self, date_header: str | None) -> None:
        if not date_header:
            return
        try:
            when = parsedate_to_datetime(str(date_header))
        except (TypeError, ValueError, IndexError):
            return
        if when is None or when.tzinfo is None:
            return
        self._seen = (when.astimezone(UTC), time.monotonic())

    def now(self) -> datetime | None:
        if self._seen is None:
            return None
        when, at = self._seen
        return when + timedelta(seconds=time.monotonic() - at)


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    """Consecutive slices of at most ``size``: one API call's worth each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class StopRecord:
    """What the cloud itself says about why a stopped instance stopped.

    ``reclaimed``: True, the cloud reclaimed it (a spot interruption); False, something else
    stopped it (the API, the OS: a person or a guard); None, the record could not be read
    (``error``), which never starts anything. ``cloud_restarts``: the cloud starts it again
    by itself when it has capacity (EC2's persistent request), so the function must not.
    ``at``: when the cloud recorded it, where it says."""

    reclaimed: bool | None
    detail: str
    cloud_restarts: bool = False
    at: datetime | None = None
    error: str | None = None


@dataclass(frozen=True)
class Instance:
    """One managed instance as the scan saw it; provider vocabulary already normalised.

    Tag values are kept as the API returned them (normally strings; anything else is an
    unreadable tag that keeps this instance, and only this one).
    """

    instance_id: str
    state: str  # pending | running | stopping | stopped | other provider states, lowercase
    instance_type: str
    launched_at: datetime | None  # last start: the TTL and boot grace count from here
    tags: Mapping[str, Any]
    spot: bool = False
    prepaid: bool = False  # subscription billing: stopping saves nothing
    problem: str | None = None  # the scan could not read part of this instance
    # Stopped in a mode that still bills its compute (the cloud module says which): a
    # stop cannot be applied to a stopped instance, so it is reported every run.
    billed_while_stopped: bool = False
    # A stopped instance: the cloud's own record of why it stopped (None: the cloud keeps
    # none, or this instance is not stopped).
    stop_record: StopRecord | None = None

    def tag(self, key: str) -> str:
        value = self.tags.get(key, "")
        return value if isinstance(value, str) else ""

    @property
    def stack(self) -> str:
        return self.tag(T.STACK)

    @property
    def role(self) -> str:
        return self.tag(T.ROLE)

    @property
    def managed(self) -> bool:
        return self.tags.get(T.MANAGED_BY) == T.MANAGED_BY_VALUE

    @property
    def protected(self) -> bool:
        """Explicitly protected, or a protected tag nobody can read (kept all the same)."""
        return T.is_protected(self.tags.get(T.PROTECTED, ""))

    @property
    def protected_reason(self) -> str:
        value = self.tags.get(T.PROTECTED, "")
        if isinstance(value, str) and value.strip().lower() in T.PROTECTED_YES:
            return f"protected ({T.PROTECTED}={value.strip()})"
        return f"unknown, {T.PROTECTED} tag {value!r:.40} is neither true nor false: kept"

    def limits(self) -> Limits:
        catalog = load_table().limits(self.tag(T.TIER) or None, self.instance_type)
        limits = resolve_limits(
            tier=self.tag(T.TIER) or None,
            instance_type=self.instance_type,
            idle_minutes_tag=self.tags.get(T.IDLE_MINUTES),
            ttl_hours_tag=self.tags.get(T.TTL_HOURS),
            catalog_idle_minutes=catalog.idle_minutes,
            catalog_ttl_hours=catalog.ttl_hours,
        )
        if catalog.note:
            limits = Limits(
                limits.idle_minutes,
                limits.ttl_hours,
                (*limits.notes, catalog.note),
                limits.unreadable,
            )
        return limits

    def lease(self) -> Lease:
        value = self.tags.get(T.KEEP_ALIVE_UNTIL)
        if value is not None and not isinstance(value, str):
            return Lease(error=f"{T.KEEP_ALIVE_UNTIL} tag {value!r:.40} is not text")
        return Lease.parse(value)


@dataclass(frozen=True)
class Metrics:
    """What the metrics service holds for one instance over the window.

    ``last_heartbeat`` is the newest heartbeat datapoint's timestamp as the service stores
    it. ``error`` is set whenever the answer could not be read in full (a failed call, a
    result missing from the answer, a status other than complete): never "no data".
    """

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


def stop_bisected(
    instance_ids: Sequence[str],
    size: int,
    call: Callable[[Sequence[str]], Any],
    read: Callable[[Sequence[str], Any], StopResult],
    *,
    bisect: Callable[[Exception], bool],
    why: Callable[[Exception], str],
) -> StopResult:
    """Stop in batches of at most ``size``: ``call`` (one stop request) and ``read`` (what
    its answer says of each id). A batch refused for one of its ids (``bisect``) is halved
    until that id stands alone; any other refusal fails the batch's ids (``why``)."""

    def batch(ids: Sequence[str]) -> StopResult:
        try:
            response = call(ids)
        except Exception as exc:
            if len(ids) == 1 or not bisect(exc):
                return StopResult(failed={iid: why(exc) for iid in ids})
            half = len(ids) // 2
            left = batch(ids[:half])
            left.merge(batch(ids[half:]))
            return left
        return read(ids, response)

    result = StopResult()
    for ids in chunks(list(instance_ids), size):
        result.merge(batch(ids))
    return result


@dataclass
class StartResult:
    """What a start call did, by id: started, or why not. ``capacity`` holds the ids the
    cloud refused for want of capacity (the cloud's error code as the reason): the next
    run tries again."""

    started: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # id -> why
    capacity: dict[str, str] = field(default_factory=dict)  # id -> the cloud's error code


class Cloud(Protocol):
    provider: str
    region: str

    def scan(self, stack: str | None) -> list[Instance]: ...

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]: ...

    def stop(self, instance_ids: Sequence[str]) -> StopResult: ...

    # Optional: the service's clock (None when no answer carried a usable Date header).
    # def service_time(self) -> datetime | None: ...
    # Optional: start stopped instances (spot recovery, recovery.py); a cloud without it
    # never has anything started by the function.
    # def start(self, instance_ids: Sequence[str]) -> StartResult: ...
    # Optional, where the cloud keeps no stop reason of its own: write the guard's record
    # (tag STOPPED_BY = value) before a stop; {id: why} for those it could not write.
    # def mark_stopped(self, instance_ids: Sequence[str], value: str) -> dict[str, str]: ...


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
    unknown: bool = False  # kept because something could not be read: reported, not idle
    error: str | None = None  # the reaper could not judge this instance (a bug: exit 1)

    def to_json(self) -> dict[str, Any]:
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
        if self.unknown:
            out["unknown"] = True
        if self.error:
            out["error"] = self.error
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
    # Spot recovery (recovery.py): the stopped spot nodes and the lost ones, each a verdict.
    recoveries: tuple[Any, ...] = ()

    @property
    def failed(self) -> list[InstanceDecision]:
        return [d for d in self.decisions if d.result.startswith("failed")]

    @property
    def problems(self) -> list[str]:
        """What really failed in this run: failed stops, unreadable metrics, judge errors."""
        out = []
        if self.failed:
            out.append(f"{len(self.failed)} stop(s) failed")
        unread = self.summary.get("metrics_unreadable", 0)
        if unread:
            out.append(f"metrics unreadable for {unread} instance(s)")
        silent = self.summary.get("silent_without_evidence", 0)
        if silent:
            out.append(
                f"{silent} instance(s) silent with no other heartbeat arriving since: "
                "metrics ingestion (PutMetricData / PutCustomMetric) may be down"
            )
        billed = self.summary.get("billed_while_stopped", 0)
        if billed:
            out.append(f"{billed} stopped instance(s) still billed for their compute")
        errors = [d for d in self.decisions if d.error]
        if errors:
            out.append(f"{len(errors)} instance(s) could not be judged")
        return out

    @property
    def exit_code(self) -> int:
        """0: every intended stop succeeded (or dry run) and every API answered in full;
        1: a stop failed, a metrics read failed (its instances were kept), or an instance
        could not be judged. A bad tag is reported, never a failure."""
        return 1 if self.problems else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "region": self.region,
            "stack": self.stack,
            "apply": self.apply,
            "now": self.now.astimezone(UTC).isoformat(),
            "decisions": [d.to_json() for d in self.decisions],
            "recoveries": [r.to_json() for r in self.recoveries],
            "summary": self.summary,
        }


def _stop_order(ids: Iterable[str], by_id: Mapping[str, Instance]) -> list[list[str]]:
    """Workers (and nodes without a role) before heads: a head is the rendezvous host."""
    ids = list(ids)
    first = [i for i in ids if by_id[i].role != "head"]
    last = [i for i in ids if by_id[i].role == "head"]
    return [group for group in (first, last) if group]


def _decide(
    inst: Instance,
    metrics: Metrics | None,
    now: datetime,
    policy: Policy,
    pipeline_at: datetime | None,
) -> Decision:
    if not inst.managed:
        # The scan filters by tag; this guards against a scan that did not.
        return Decision(KEEP, "not managed by gpufleet: never touched")
    if inst.protected:
        unknown = not inst.protected_reason.startswith("protected")
        return Decision(KEEP, inst.protected_reason, unknown=unknown)
    if inst.state != RUNNING and inst.billed_while_stopped:
        return Decision(
            KEEP,
            f"not running ({inst.state}), but its compute is still billed: start it and "
            "let the watchdog or the reaper stop it, which stops billing",
            unknown=True,
        )
    if inst.state != RUNNING:
        return Decision(KEEP, f"not running ({inst.state})")
    if inst.prepaid:
        return Decision(KEEP, "subscription (prepaid) billing: stopping would save nothing")
    if inst.problem or inst.launched_at is None:
        return Decision(
            KEEP, f"unknown, {inst.problem or 'launch time unreadable'}: kept", unknown=True
        )
    limits = inst.limits()
    m = metrics or Metrics(error="no metrics were fetched")
    view = CloudView(
        launched_at=inst.launched_at,
        last_heartbeat=m.last_heartbeat,
        max_gpu_util=m.max_gpu_util,
        metrics_error=m.error,
        watchdog_expected=inst.tag(T.WATCHDOG).strip().lower() != "off",
        pipeline_at=pipeline_at,
    )
    decision = decide_cloud(view, now=now, limits=limits, lease=inst.lease(), policy=policy)
    if limits.notes:
        decision = Decision(
            decision.action,
            f"{decision.reason} [{'; '.join(limits.notes)}]",
            decision.warning,
            unknown=decision.unknown,
        )
    return decision


def _judgeable(inst: Instance) -> bool:
    """Running, unprotected, pay-as-you-go and readable: the activity rules may judge it."""
    return (
        inst.state == RUNNING
        and not inst.protected
        and not inst.prepaid
        and inst.launched_at is not None
        and not inst.problem
    )


def _pipeline_evidence(
    metrics: Mapping[str, Metrics], skew: timedelta
) -> Callable[[str], datetime | None]:
    """For each instance: the newest heartbeat any *other* instance got into the service,
    moved back by the tolerated skew (that node's clock may run fast)."""
    beats = sorted(
        ((m.last_heartbeat, iid) for iid, m in metrics.items() if m.last_heartbeat and not m.error),
        reverse=True,
    )

    def evidence(iid: str) -> datetime | None:
        for when, other in beats[:2]:
            if other != iid:
                return when - skew
        return None

    return evidence


def _service_now(cloud: Cloud, local: datetime, policy: Policy) -> tuple[datetime, dict[str, Any]]:
    """The clock decisions use: the service's when it told us, else the host's minus the
    tolerated skew (every stop rule is "long enough ago", so an earlier now is the safe one)."""
    clock = getattr(cloud, "service_time", None)
    service = clock() if callable(clock) else None
    if service is None:
        now = local - timedelta(minutes=policy.clock_skew_minutes)
        return now, {
            "source": "host clock minus the tolerated skew (no service Date header seen)",
            "skew_minutes": None,
        }
    skew = (local - service).total_seconds() / 60.0
    info: dict[str, Any] = {"source": "service Date header", "skew_minutes": round(skew, 1)}
    if abs(skew) > CLOCK_WARN_MINUTES:
        info["warning"] = (
            f"this host's clock is {abs(skew):.0f} min {'ahead of' if skew > 0 else 'behind'} "
            "the service's; decisions used the service's clock"
        )
    return service.astimezone(UTC), info


def reap(
    cloud: Cloud,
    *,
    stack: str | None = None,
    apply: bool = False,
    now: datetime | None = None,
    policy: Policy | None = None,
    price: PriceLookup | None = None,
    recover: bool = False,
    expected: Sequence[str] = (),
) -> Report:
    """One reaper pass. Dry run unless ``apply``; never terminates anything.

    ``recover``: also start the stack's reclaimed spot nodes (recovery.py); ``expected``:
    the stack's node ids, those the scan no longer finds reported as lost.

    ``now`` is this host's clock (default: the system's); decisions use the service's clock
    (:func:`_service_now`). One instance that cannot be judged is kept and reported; the
    others are judged as usual.
    """
    policy = policy or Policy()
    local = (now or datetime.now(UTC)).astimezone(UTC)
    scanned = cloud.scan(stack)
    now, clock_info = _service_now(cloud, local, policy)
    # Another stack's instances never reach the decisions, whatever the scan returned.
    instances = [i for i in scanned if i.managed and (stack is None or i.stack == stack)]
    by_id = {i.instance_id: i for i in instances}
    skew = timedelta(minutes=policy.clock_skew_minutes)

    metrics, broken = _read_metrics(cloud, instances, now, skew, policy)
    evidence = _pipeline_evidence(metrics, skew)

    decided: dict[str, Decision] = {}
    for inst in instances:
        iid = inst.instance_id
        if iid in broken:
            decided[iid] = Decision(KEEP, f"unknown, could not judge: {broken[iid]}", unknown=True)
            continue
        try:
            decided[iid] = _decide(inst, metrics.get(iid), now, policy, evidence(iid))
        except Exception as exc:  # kept and reported; the run reports the failure
            broken[iid] = f"{type(exc).__name__}: {exc}"
            decided[iid] = Decision(KEEP, f"unknown, could not judge: {broken[iid]}", unknown=True)
    to_stop = [iid for iid, d in decided.items() if d.action == STOP]

    results = _stop(cloud, to_stop, by_id, now) if apply else dict.fromkeys(to_stop, "dry run")
    from . import recovery  # imports this module: here, not at the top

    recoveries = recovery.run(
        cloud, instances, now, apply=apply, enabled=recover, expected=expected
    )

    decisions = _decisions(instances, decided, results, broken)
    summary = summarise(decisions, cloud.provider, price, apply=apply)
    summary["metrics_unreadable"] = sum(1 for m in metrics.values() if m.error)
    summary["silent_without_evidence"] = sum(
        1 for d in decisions if d.unknown and "ingestion outage" in d.reason
    )
    summary["billed_while_stopped"] = sum(1 for i in instances if i.billed_while_stopped)
    summary["clock"] = clock_info
    summary["recovery"] = recovery.summary(recoveries)
    return Report(
        provider=cloud.provider,
        region=cloud.region,
        stack=stack,
        apply=apply,
        now=now,
        decisions=decisions,
        summary=summary,
        recoveries=tuple(recoveries),
    )


def _read_metrics(
    cloud: Cloud,
    instances: list[Instance],
    now: datetime,
    skew: timedelta,
    policy: Policy,
) -> tuple[dict[str, Metrics], dict[str, str]]:
    """Metrics of the instances the activity rules may judge, and why any could not be read.

    Grouped by lookback, because one GetMetricData call has one time range. The window reaches
    skew minutes past now: a node whose clock runs fast stamps its datapoints in the service's
    future."""
    by_lookback: dict[float, list[str]] = {}
    broken: dict[str, str] = {}
    for inst in instances:
        try:
            if _judgeable(inst):
                minutes = lookback_minutes(inst.limits(), policy)
                by_lookback.setdefault(minutes, []).append(inst.instance_id)
        except Exception as exc:  # one instance's data must not stop the run for the others
            broken[inst.instance_id] = f"{type(exc).__name__}: {exc}"
    metrics: dict[str, Metrics] = {}
    for minutes, ids in sorted(by_lookback.items()):
        # Whole minutes: CloudWatch periods are multiples of 60 s.
        # The start reaches skew minutes further back too: a slow node stamps its beats late.
        start = now - timedelta(minutes=math.ceil(minutes)) - skew
        got = cloud.metrics(ids, start=start, end=now + skew)
        for iid in ids:
            # An id the answer left out is unreadable, never "no data".
            metrics[iid] = got.get(iid) or Metrics(error="missing from the metrics answer")
    return metrics, broken


def _stop(
    cloud: Cloud, to_stop: list[str], by_id: dict[str, Instance], now: datetime
) -> dict[str, str]:
    """Stop the decided instances in order; what happened to each, by id. Where the cloud
    keeps no stop reason of its own (it has ``mark_stopped``), a spot node gets the reaper's
    record first, so the recovery never starts it again; a record that could not be
    written does not hold the stop (without one, the recovery does not start it either)."""
    results: dict[str, str] = {}
    mark = getattr(cloud, "mark_stopped", None)
    for group in _stop_order(to_stop, by_id):
        spot = [i for i in group if by_id[i].spot]
        if callable(mark) and spot:
            from .recovery import record_value

            # A failed record is reported by the recovery as "no record": never started.
            with contextlib.suppress(Exception):
                mark(spot, record_value("reaper", now))
        outcome = cloud.stop(group)
        for iid in outcome.stopped:
            results[iid] = "stopped"
        for iid, why in outcome.failed.items():
            results[iid] = f"failed: {why}"
        for iid in group:
            results.setdefault(iid, "failed: the stop call did not report this instance")
    return results


def _decisions(
    instances: list[Instance],
    decided: dict[str, Decision],
    results: dict[str, str],
    broken: dict[str, str],
) -> tuple[InstanceDecision, ...]:
    """One row per instance, by stack and id."""
    return tuple(
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
            unknown=decided[inst.instance_id].unknown,
            error=broken.get(inst.instance_id),
        )
        for inst in sorted(instances, key=lambda i: (i.stack, i.instance_id))
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
        "unknown": sum(1 for d in decisions if d.unknown),
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
