"""The idle decision: pure rules shared by the node watchdog and the cloud reaper.

Standard library only and no project imports: this very file is copied to every node next
to the watchdog (``bootstrap/remote/watchdog_policy.py`` is a link to it), so both layers
judge idleness by the same code.

Two entry points, one per layer, built on the same guards:

* :func:`decide_node` sees everything a node can observe (per-GPU utilization, compute
  processes holding GPU memory, SSH sessions, the lease file, uptime) as a history of
  timestamped samples, and keeps no other state: the history *is* the state.
* :func:`decide_cloud` sees what the cloud APIs show (tags, launch time, the node's
  heartbeat and GPU utilization metrics) and acts only when the node's own watchdog has
  fallen silent, or when the hard TTL is reached.

Precedence, first match wins (the same in both layers):

1. ``protected`` -> keep (an explicit hands-off).
2. a lease in the future, at most MAX_LEASE_HOURS ahead -> keep. A lease is an explicit,
   time-bounded promise to pay, so it also holds off the hard TTL; a lease further ahead is
   ignored (the other rules decide, and the TTL applies).
3. hard TTL reached (time since launch/boot) -> stop, even while busy.
4. an unreadable lease -> keep (an unreadable signal counts as active; the TTL above still
   bounds the cost).
5. boot grace (up less than 30 min) -> keep.
6. layer-specific activity rules (see each function).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

STOP = "stop"
KEEP = "keep"

# Per GPU family: minutes of continuous idleness before a stop. The expensive tiers are
# reaped sooner (reference/idle-teardown.md, "Policy we want").
IDLE_MINUTES_BY_FAMILY: dict[str, int] = {
    "t4": 30,
    "a10": 30,
    "v100": 30,
    "l4": 30,
    "a100": 15,
    "h100": 15,
    "h200": 15,
}
# Unknown GPU: the longer limit, because stopping too early loses work while stopping too
# late only costs money that the hard TTL bounds.
# The longest lease anyone may take (`fab keep-alive` refuses more). A lease further ahead is
# not honoured: a tag written as "2099-01-01" must not keep a GPU running for ever.
MAX_LEASE_HOURS = 24 * 14

DEFAULT_IDLE_MINUTES = 30
DEFAULT_TTL_HOURS = 24.0
DEFAULT_TTL_HOURS_X8 = 12.0

# Instance type prefixes -> GPU family, for instances whose tier tag is missing.
# AWS: https://aws.amazon.com/ec2/instance-types/ (accelerated computing);
# Alicloud: https://www.alibabacloud.com/help/en/ecs/user-guide/gpu-accelerated-compute-optimized-and-vgpu-accelerated-instance-families-1
_FAMILY_BY_TYPE_PREFIX: tuple[tuple[str, str], ...] = (
    ("p5", "h100"),
    ("p4d", "a100"),
    ("p4de", "a100"),
    ("p3", "v100"),
    ("g4dn", "t4"),
    ("g5", "a10"),
    ("g6", "l4"),
    ("ecs.gn8", "h100"),
    ("ecs.gn7e", "a100"),
    ("ecs.gn7-", "a100"),
    ("ecs.gn7i", "a10"),
    ("ecs.gn6v", "v100"),
    ("ecs.gn6e", "v100"),
    ("ecs.gn6i", "t4"),
)
# Not datetime.UTC: this file also runs on the node's Python 3.10 (Ubuntu 22.04).
UTC = timezone.utc  # noqa: UP017
_OPT_OUT = {"0", "off", "none", "never", "false", "no"}


@dataclass(frozen=True)
class Policy:
    """Thresholds; every default is the documented one and appears only here."""

    active_util_pct: float = 10.0  # any GPU at or above this in a sample = active
    activity_window_minutes: float = 5.0  # a busy sample keeps the node active this long
    boot_grace_minutes: float = 30.0
    stall_util_pct: float = 5.0  # processes hold GPU memory but every GPU below this
    stall_warn_minutes: float = 60.0  # stalled this long: warn
    stall_stop_after_warn_minutes: float = 10.0  # ...and stop this much later
    max_sample_gap_minutes: float = 5.0  # a longer gap in the history is unknown time
    head_lag_minutes: float = 2.0  # a head waits this much longer so its workers go first
    heartbeat_stale_minutes: float = 10.0  # cloud layer: a silent watchdog after this long

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or math.isnan(value) or value < 0:
                raise ValueError(f"Policy.{field.name} must be a number >= 0, got {value!r}")
        if self.stall_util_pct > self.active_util_pct:
            raise ValueError(
                "Policy.stall_util_pct must not exceed active_util_pct "
                f"({self.stall_util_pct} > {self.active_util_pct})"
            )


@dataclass(frozen=True)
class Decision:
    action: str  # STOP | KEEP
    reason: str
    warning: str | None = None  # e.g. a stalled job about to be stopped
    idle_minutes: float | None = None  # the idle clock, when one is running

    @property
    def stop(self) -> bool:
        return self.action == STOP


@dataclass(frozen=True)
class Limits:
    """What applies to one instance, resolved from its tags (or the node's config)."""

    idle_minutes: float
    ttl_hours: float | None  # None: opted out explicitly
    notes: tuple[str, ...] = ()  # tag values that were ignored, and why


@dataclass(frozen=True)
class Lease:
    until: datetime | None = None
    error: str | None = None  # the lease exists but cannot be read

    @classmethod
    def parse(cls, text: str | None) -> Lease:
        if text is None or not text.strip():
            return cls()
        try:
            return cls(until=parse_utc(text))
        except ValueError as exc:
            return cls(error=str(exc))


# ---------------------------------------------------------------------------- parsing


def parse_utc(text: str) -> datetime:
    """ISO 8601 -> aware UTC datetime. A naive value is taken as UTC (the contract's zone)."""
    raw = text.strip()
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"not an ISO 8601 UTC time: {text!r} (expected e.g. 2026-01-31T18:00:00Z)"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_utc(value: datetime) -> str:
    return value.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_family(tier: str | None, instance_type: str | None = None) -> str | None:
    """GPU family from the tier name (``a100x8``, ``h100-x1``) or else the instance type."""
    if tier:
        name = tier.strip().lower()
        # Longest family first so "a100x4" is not taken for "a10".
        for family in sorted(IDLE_MINUTES_BY_FAMILY, key=len, reverse=True):
            if name.startswith(family):
                return family
    if instance_type:
        itype = instance_type.strip().lower()
        for prefix, family in sorted(_FAMILY_BY_TYPE_PREFIX, key=lambda p: -len(p[0])):
            if itype.startswith(prefix):
                return family
    return None


def _is_x8(tier: str | None) -> bool:
    return bool(tier and re.search(r"x8\b|x8[-_]|x8$", tier.strip().lower()))


def resolve_limits(
    *,
    tier: str | None,
    instance_type: str | None = None,
    idle_minutes_tag: str | None = None,
    ttl_hours_tag: str | None = None,
) -> Limits:
    """Idle and TTL limits for one instance: the tags when valid, else the tier defaults."""
    notes: list[str] = []
    family = gpu_family(tier, instance_type)
    idle = float(IDLE_MINUTES_BY_FAMILY.get(family or "", DEFAULT_IDLE_MINUTES))
    if idle_minutes_tag is not None and idle_minutes_tag.strip():
        try:
            tagged = float(idle_minutes_tag)
            if not math.isfinite(tagged) or tagged <= 0:
                raise ValueError
            idle = tagged
        except ValueError:
            notes.append(f"idle-minutes tag {idle_minutes_tag!r} ignored (want minutes > 0)")
    ttl: float | None = DEFAULT_TTL_HOURS_X8 if _is_x8(tier) else DEFAULT_TTL_HOURS
    if ttl_hours_tag is not None and ttl_hours_tag.strip():
        if ttl_hours_tag.strip().lower() in _OPT_OUT:
            ttl = None
        else:
            try:
                tagged = float(ttl_hours_tag)
                if not math.isfinite(tagged) or tagged < 0:
                    raise ValueError
                ttl = tagged
            except ValueError:
                notes.append(f"ttl-hours tag {ttl_hours_tag!r} ignored (want hours, or 'off')")
    return Limits(idle_minutes=idle, ttl_hours=ttl, notes=tuple(notes))


# ---------------------------------------------------------------------------- guards


def _minutes(delta: timedelta) -> float:
    return delta.total_seconds() / 60.0


def _fmt_minutes(minutes: float) -> str:
    if minutes >= 120:
        return f"{minutes / 60:.1f} h"
    return f"{minutes:.0f} min"


def _guards(
    *,
    now: datetime,
    started_at: datetime,
    limits: Limits,
    lease: Lease,
    protected: bool,
    policy: Policy,
) -> Decision | None:
    """Rules 1-5 of the module docstring; None when the activity rules must decide."""
    if protected:
        return Decision(KEEP, "protected (gpufleet:protected=true)")
    if lease.until is not None and now < lease.until <= now + timedelta(hours=MAX_LEASE_HOURS):
        return Decision(KEEP, f"lease until {format_utc(lease.until)}")
    up = _minutes(now - started_at)
    if limits.ttl_hours is not None and up >= limits.ttl_hours * 60:
        return Decision(
            STOP,
            f"hard TTL {limits.ttl_hours:g} h reached (up {_fmt_minutes(up)}), stops even if busy",
        )
    if lease.error is not None:
        return Decision(KEEP, f"lease unreadable, counts as active: {lease.error}")
    if up < policy.boot_grace_minutes:
        return Decision(
            KEEP, f"boot grace: up {_fmt_minutes(up)} < {policy.boot_grace_minutes:g} min"
        )
    return None


# ---------------------------------------------------------------------------- node layer


@dataclass(frozen=True)
class Sample:
    """One observation on the node. ``None`` in a field means that signal was unreadable."""

    at: datetime
    gpu_util: tuple[float, ...] | None  # percent, one per GPU
    gpu_procs: int | None  # compute processes holding GPU memory
    ssh: int | None  # interactive sessions + established connections to :22

    @property
    def unreadable(self) -> list[str]:
        missing = []
        if self.gpu_util is None:
            missing.append("GPU utilization")
        if self.gpu_procs is None:
            missing.append("GPU processes")
        if self.ssh is None:
            missing.append("SSH sessions")
        return missing

    @property
    def max_util(self) -> float:
        return max(self.gpu_util or (0.0,))


def _activity(sample: Sample, policy: Policy) -> str | None:
    """Why this sample shows activity, or None when it is idle."""
    missing = sample.unreadable
    if missing:
        return f"{' and '.join(missing)} unreadable (counts as active)"
    if sample.max_util >= policy.active_util_pct:
        return f"GPU utilization {sample.max_util:.0f} %"
    if sample.ssh:
        return f"{sample.ssh} SSH session(s)/connection(s)"
    if sample.gpu_procs:
        # A process holding GPU memory is a job even between bursts (data loading, eval,
        # checkpointing); the stall rule bounds how long a job at near-zero utilization lasts.
        return f"{sample.gpu_procs} process(es) holding GPU memory"
    return None


def _stalled(sample: Sample, policy: Policy) -> bool:
    return (
        not sample.unreadable
        and bool(sample.gpu_procs)
        and not sample.ssh
        and sample.max_util < policy.stall_util_pct
    )


def decide_node(
    samples: Sequence[Sample],
    *,
    now: datetime,
    boot_time: datetime,
    limits: Limits,
    lease: Lease = Lease(),
    protected: bool = False,
    role: str | None = None,
    policy: Policy = Policy(),
) -> Decision:
    """The watchdog's decision from the sample history (oldest first or not: it is sorted).

    Samples from before this boot are ignored, and a gap longer than
    ``max_sample_gap_minutes`` restarts the idle clock: time nobody watched is not idle time.
    """
    guard = _guards(
        now=now,
        started_at=boot_time,
        limits=limits,
        lease=lease,
        protected=protected,
        policy=policy,
    )
    if guard is not None:
        return guard
    history = sorted((s for s in samples if boot_time <= s.at <= now), key=lambda s: s.at)
    max_gap = timedelta(minutes=policy.max_sample_gap_minutes)
    if not history or now - history[-1].at > max_gap:
        return Decision(KEEP, "no recent samples (watchdog just started or was not running)")

    # The trailing run of samples with no gap longer than max_gap: what we know for sure.
    run_start = len(history) - 1
    while run_start > 0 and history[run_start].at - history[run_start - 1].at <= max_gap:
        run_start -= 1
    run = history[run_start:]

    latest = run[-1]
    if latest.unreadable:
        return Decision(KEEP, _activity(latest, policy) or "unreadable")

    # Stall clock: the trailing samples where processes hold GPU memory at near-zero use.
    stall_from: datetime | None = None
    for sample in reversed(run):
        if not _stalled(sample, policy):
            break
        stall_from = sample.at
    if stall_from is not None:
        stalled = _minutes(now - stall_from)
        stop_at = policy.stall_warn_minutes + policy.stall_stop_after_warn_minutes
        what = (
            f"stalled job: {latest.gpu_procs} process(es) hold GPU memory at "
            f"< {policy.stall_util_pct:g} % utilization for {_fmt_minutes(stalled)}"
        )
        if stalled >= stop_at:
            return Decision(STOP, what, idle_minutes=stalled)
        if stalled >= policy.stall_warn_minutes:
            return Decision(
                KEEP,
                what,
                warning=f"{what}; this node stops in {_fmt_minutes(stop_at - stalled)} "
                "unless the job makes progress, or run `fab keep-alive --hours N`",
                idle_minutes=stalled,
            )
        return Decision(
            KEEP, f"{what} (warning at {policy.stall_warn_minutes:g} min)", idle_minutes=stalled
        )

    # Idle clock: from the end of the last activity, or from the start of the known run.
    idle_since = run[0].at
    for sample in reversed(run):
        why = _activity(sample, policy)
        if why is None:
            continue
        if sample is latest:
            return Decision(KEEP, why, idle_minutes=0.0)
        if sample.max_util >= policy.active_util_pct:
            # A busy GPU sample keeps the node active for the activity window after it.
            active_until = sample.at + timedelta(minutes=policy.activity_window_minutes)
            if active_until > now:
                ago = _fmt_minutes(_minutes(now - sample.at))
                return Decision(KEEP, f"{why} {ago} ago", idle_minutes=0.0)
            idle_since = active_until
        else:
            idle_since = sample.at
        break
    idle = max(0.0, _minutes(now - idle_since))
    limit = limits.idle_minutes + (policy.head_lag_minutes if role == "head" else 0.0)
    if idle >= limit:
        return Decision(
            STOP,
            f"idle {_fmt_minutes(idle)} >= {limit:g} min (no GPU use, SSH, job or lease)",
            idle_minutes=idle,
        )
    return Decision(KEEP, f"idle {_fmt_minutes(idle)} of {limit:g} min", idle_minutes=idle)


# ---------------------------------------------------------------------------- cloud layer


@dataclass(frozen=True)
class CloudView:
    """What the reaper knows about one running instance."""

    launched_at: datetime
    last_heartbeat: datetime | None  # latest heartbeat within the lookback, None if none
    max_gpu_util: float | None  # maximum over the lookback, None if no datapoint
    metrics_error: str | None = None  # the metric query failed for this instance
    watchdog_expected: bool = True  # gpufleet:watchdog tag is not "off"


def lookback_minutes(limits: Limits, policy: Policy = Policy()) -> float:
    """How far back the reaper reads metrics for an instance with these limits."""
    return limits.idle_minutes + policy.heartbeat_stale_minutes


def decide_cloud(
    view: CloudView,
    *,
    now: datetime,
    limits: Limits,
    lease: Lease = Lease(),
    protected: bool = False,
    policy: Policy = Policy(),
) -> Decision:
    """The reaper's decision: act only where the node's own watchdog cannot.

    A fresh heartbeat means the watchdog is alive and decides on the node (it sees SSH,
    jobs and stalls that the cloud cannot). A silent watchdog plus no GPU activity in the
    metrics over ``idle + stale`` minutes means nobody is guarding the node: stop it.
    """
    guard = _guards(
        now=now,
        started_at=view.launched_at,
        limits=limits,
        lease=lease,
        protected=protected,
        policy=policy,
    )
    if guard is not None:
        return guard
    if view.metrics_error is not None:
        return Decision(KEEP, f"metrics unreadable, counts as active: {view.metrics_error}")
    if not view.watchdog_expected:
        return Decision(KEEP, "watchdog opted out (gpufleet:watchdog=off): only the TTL applies")
    lookback = lookback_minutes(limits, policy)
    if view.last_heartbeat is not None:
        silent = _minutes(now - view.last_heartbeat)
        if silent < policy.heartbeat_stale_minutes:
            return Decision(
                KEEP,
                f"watchdog alive (heartbeat {_fmt_minutes(max(silent, 0.0))} ago) decides on node",
            )
    up = _minutes(now - view.launched_at)
    if up < lookback:
        # Too young for the metrics to cover the whole lookback: wait for a full window.
        return Decision(KEEP, f"no heartbeat yet, up {_fmt_minutes(up)} < {lookback:g} min")
    if view.max_gpu_util is not None and view.max_gpu_util >= policy.active_util_pct:
        return Decision(
            KEEP,
            f"watchdog silent but GPU reached {view.max_gpu_util:.0f} % "
            f"in the last {lookback:g} min",
        )
    silent_text = (
        f"no heartbeat in the last {lookback:g} min"
        if view.last_heartbeat is None
        else f"last heartbeat {_fmt_minutes(_minutes(now - view.last_heartbeat))} ago"
    )
    gpu_text = (
        "no GPU metrics" if view.max_gpu_util is None else f"GPU at most {view.max_gpu_util:.0f} %"
    )
    return Decision(
        STOP, f"watchdog silent ({silent_text}) and {gpu_text} in the last {lookback:g} min"
    )
