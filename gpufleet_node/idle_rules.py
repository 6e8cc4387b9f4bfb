"""The idle decision: pure rules shared by the node watchdog and the cloud reaper.

Standard library only and no imports from the project but its neighbour ``fleet_names.py``
(the tag names, shipped with it everywhere): the node's watchdog runs this module of the node
package and the reaper imports it from there (its function zip packs it under the same
import path, ``gpufleet_node.idle_rules``), so both layers judge idleness by the same code.

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
4. an unreadable lease or limit tag, kept MAX_LEASE_HOURS (14 days) already -> stop: nothing
   unreadable keeps a GPU running for ever, whatever the TTL says.
5. an unreadable lease or limit tag -> keep, reported as unknown (an unreadable signal counts
   as active; the TTL above still bounds the cost).
6. boot grace (up less than 30 min) -> keep.
7. layer-specific activity rules (see each function).

The per-GPU idle limits are not written here: they come from the catalog (infra/catalog), as
the ``catalog_idle_minutes`` / ``catalog_ttl_hours`` a caller passes to :func:`resolve_limits`
(the cloud reaper reads them from the per-instance-type table built into its package; the
node watchdog from its config, which the stack writes from the same catalog).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from . import fleet_names as names

STOP = "stop"
KEEP = "keep"

# The longest lease anyone may take (`fab keep-alive` refuses more). A lease further ahead is
# not honoured: a tag written as "2099-01-01" must not keep a GPU running for ever. The same
# 14 days cap every "unknown" keep (an unreadable lease or limit tag), and bound the limit tags.
MAX_LEASE_HOURS = 24 * 14
MAX_IDLE_MINUTES = MAX_LEASE_HOURS * 60
MAX_TTL_HOURS = MAX_LEASE_HOURS

# Unknown GPU: the longer limit, because stopping too early loses work while stopping too
# late only costs money that the hard TTL bounds.
DEFAULT_IDLE_MINUTES = 30
# Only when the caller has no catalog value (the node watchdog with a config that names a tier
# but no idle minutes): the policy's rule for the expensive tiers, by tier name. The reaper
# always passes the catalog's value; the per-instance-type data lives in the catalog only.
_EXPENSIVE_TIER_PREFIXES = ("a100", "h100", "h200")
EXPENSIVE_IDLE_MINUTES = 15
DEFAULT_TTL_HOURS = 24.0
DEFAULT_TTL_HOURS_X8 = 12.0

# A limit tag is plain ASCII decimal: float() would also take "1e12", "nan", "1_5" and
# non-ASCII digits, none of which anyone means as minutes.
_DECIMAL = re.compile(r"\s*[0-9]{1,7}(?:\.[0-9]{1,6})?\s*", re.ASCII)
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
    # Cloud layer: how far a clock may be off. A node's datapoints carry the node's clock, and
    # the APIs accept a signing clock that far off: AWS SigV4 5 min, Alicloud 15 min
    # (x-acs-date). The reaper judges by the service's clock and counts a heartbeat stale only
    # after stale + skew minutes, so a node +/-12 min off is judged as if it were exact.
    clock_skew_minutes: float = 15.0
    # Cloud layer: how far back metrics are read beyond idle + stale + skew, so several runs
    # (every 5 min) see a heartbeat after it went stale, before it leaves the window.
    lookback_margin_minutes: float = 20.0

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
    unknown: bool = False  # kept because a signal could not be read, not because it is busy

    @property
    def stop(self) -> bool:
        return self.action == STOP


@dataclass(frozen=True)
class Limits:
    """What applies to one instance, resolved from its tags (or the node's config)."""

    idle_minutes: float
    ttl_hours: float | None  # None: opted out explicitly
    notes: tuple[str, ...] = ()  # tag values that were ignored, and why
    unreadable: tuple[str, ...] = ()  # limit tags present but unreadable: keep, report, cap


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


def _tier_rule(tier: str | None) -> float:
    name = (tier or "").strip().lower()
    expensive = name.startswith(_EXPENSIVE_TIER_PREFIXES)
    return float(EXPENSIVE_IDLE_MINUTES if expensive else DEFAULT_IDLE_MINUTES)


def _is_x8(tier: str | None) -> bool:
    return bool(tier and re.search(r"x8\b|x8[-_]|x8$", tier.strip().lower()))


def _number(text: str, *, low_exclusive: float, high: float) -> float | None:
    """A plain decimal in (low, high], else None."""
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if low_exclusive < value <= high else None


def _shown(value: object) -> str:
    """A tag value as a report may print it: one line, bounded, control characters escaped."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def resolve_limits(
    *,
    tier: str | None,
    instance_type: str | None = None,
    idle_minutes_tag: object = None,
    ttl_hours_tag: object = None,
    catalog_idle_minutes: float | None = None,
    catalog_ttl_hours: float | None = None,
) -> Limits:
    """Idle and TTL limits for one instance.

    A valid tag wins; without one, the catalog's value for the instance (passed in by the
    caller), else the documented defaults. A tag that is present but unreadable (not a plain
    decimal, NaN, negative, beyond 14 days, not a string at all) is not replaced by a
    default: the activity rules keep the instance and report it (``unreadable``), and the
    14-day cap still bounds it.
    """
    notes: list[str] = []
    unreadable: list[str] = []
    idle = float(catalog_idle_minutes or _tier_rule(tier))
    if idle_minutes_tag is not None and not (
        isinstance(idle_minutes_tag, str) and not idle_minutes_tag.strip()
    ):
        tagged = (
            _number(idle_minutes_tag, low_exclusive=0, high=MAX_IDLE_MINUTES)
            if isinstance(idle_minutes_tag, str)
            else None
        )
        if tagged is None:
            unreadable.append(
                f"idle-minutes tag {_shown(idle_minutes_tag)} unreadable "
                f"(want minutes, 0 < m <= {MAX_IDLE_MINUTES})"
            )
        else:
            idle = tagged
    default_ttl = DEFAULT_TTL_HOURS_X8 if _is_x8(tier) else DEFAULT_TTL_HOURS
    ttl: float | None = float(catalog_ttl_hours or default_ttl)
    if ttl_hours_tag is not None and not (
        isinstance(ttl_hours_tag, str) and not ttl_hours_tag.strip()
    ):
        if isinstance(ttl_hours_tag, str) and ttl_hours_tag.strip().lower() in _OPT_OUT:
            ttl = None
        else:
            tagged = (
                _number(ttl_hours_tag, low_exclusive=-1, high=MAX_TTL_HOURS)
                if isinstance(ttl_hours_tag, str)
                else None
            )
            if tagged is None:
                unreadable.append(
                    f"ttl-hours tag {_shown(ttl_hours_tag)} unreadable "
                    f"(want hours <= {MAX_TTL_HOURS}, or 'off')"
                )
                ttl = None  # the user's limit is unknown: the 14-day cap applies instead
            else:
                ttl = tagged
    return Limits(
        idle_minutes=idle, ttl_hours=ttl, notes=tuple(notes), unreadable=tuple(unreadable)
    )


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
        return Decision(KEEP, f"protected ({names.PROTECTED}=true)")
    if lease.until is not None and now < lease.until <= now + timedelta(hours=MAX_LEASE_HOURS):
        return Decision(KEEP, f"lease until {format_utc(lease.until)}")
    up = _minutes(now - started_at)
    if limits.ttl_hours is not None and up >= limits.ttl_hours * 60:
        return Decision(
            STOP,
            f"hard TTL {limits.ttl_hours:g} h reached (up {_fmt_minutes(up)}), stops even if busy",
        )
    unreadable = list(limits.unreadable)
    if lease.error is not None:
        unreadable.append(f"lease unreadable: {lease.error}")
    if unreadable and up >= MAX_LEASE_HOURS * 60:
        return Decision(
            STOP,
            f"up {_fmt_minutes(up)}: the {MAX_LEASE_HOURS // 24}-day cap ends the keep for "
            f"{'; '.join(unreadable)}",
        )
    if unreadable:
        return Decision(KEEP, f"unknown, counts as active: {'; '.join(unreadable)}", unknown=True)
    if up < policy.boot_grace_minutes:
        return Decision(
            KEEP, f"boot grace: up {_fmt_minutes(up)} < {policy.boot_grace_minutes:g} min"
        )
    return None


# ---------------------------------------------------------------------------- the TTL ahead

# The watchdog warns this many minutes before the hard TTL stops a node, once each.
TTL_WARN_MINUTES = (60.0, 10.0)


@dataclass(frozen=True)
class TtlStop:
    """When the hard TTL (or the 14-day cap) stops a node, as the guards above decide it.

    ``at`` None: nothing stops it by age (``why`` says: the TTL is off, or it is protected).
    ``why``: "ttl", "lease" (a lease holds the TTL off until ``at``), "cap" (the 14-day cap
    of a node kept for something unreadable), "off" or "protected"."""

    at: datetime | None
    why: str
    ttl_hours: float | None = None


def ttl_stop(
    *, boot_time: datetime, limits: Limits, lease: Lease = Lease(), protected: bool = False
) -> TtlStop:
    """The first time rules 1-4 of the module docstring stop this node whatever it does.

    The TTL (and the cap) fire at the first moment no lease holds: a lease holds at ``t``
    while ``t < until <= t + MAX_LEASE_HOURS``, so a TTL that falls inside a lease moves to
    the lease's end, and one before the lease came within reach does not."""
    if protected:
        return TtlStop(None, "protected", limits.ttl_hours)
    due: list[tuple[datetime, str]] = []
    if limits.ttl_hours is not None:
        due.append((boot_time + timedelta(hours=limits.ttl_hours), "ttl"))
    if limits.unreadable or lease.error is not None:
        due.append((boot_time + timedelta(hours=MAX_LEASE_HOURS), "cap"))
    if not due:
        return TtlStop(None, "off", None)
    at, why = min(due)
    until = lease.until
    if until is not None and until - timedelta(hours=MAX_LEASE_HOURS) <= at < until:
        at, why = until, "lease"
    return TtlStop(at, why, limits.ttl_hours)


def ttl_warning_due(minutes_left: float, warned: Sequence[float]) -> float | None:
    """The threshold of TTL_WARN_MINUTES to warn at now, or None: the nearest one reached
    and not yet warned (a run that comes late says the nearer one only, once)."""
    reached = [t for t in TTL_WARN_MINUTES if minutes_left <= t]
    if not reached:
        return None
    nearest = min(reached)
    return None if nearest in warned else nearest


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


@dataclass(frozen=True)
class Jobs:
    """What the node's ``fab train`` job-state files say (README "fab train": the job state
    on the node, written by gpufleet_node/job_runner.py)."""

    running: int = 0  # jobs whose supervisor runs on this node (unreadable files count too)
    ended_at: datetime | None = None  # the latest end of a job in this boot: idle starts there
    stop_when_done: str | None = None  # a job that ended this boot with --stop-when-done


def _stall_decision(run: Sequence[Sample], now: datetime, policy: Policy) -> Decision | None:
    """The stall clock: the trailing samples where processes hold GPU memory at near-zero
    use. None when the latest sample is not stalled."""
    latest = run[-1]
    stall_from: datetime | None = None
    for sample in reversed(run):
        if not _stalled(sample, policy):
            break
        stall_from = sample.at
    if stall_from is None:
        return None
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


def _last_activity(run: Sequence[Sample], now: datetime, policy: Policy) -> Decision | datetime:
    """Where the idle clock starts: the end of the last activity, or the start of the known
    run; a KEEP decision instead while that activity is recent enough to hold the node."""
    latest = run[-1]
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
            return active_until
        return sample.at
    return run[0].at


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
    jobs: Jobs = Jobs(),
) -> Decision:
    """The watchdog's decision from the sample history (oldest first or not: it is sorted).

    ``jobs``: a running job keeps the node active, but the stall rule still applies to it
    (GPU memory held at near-zero utilization is not busy); when the last job ends the idle
    clock starts at its end; a job run with ``--stop-when-done`` stops the node once it ended,
    unless it is protected or leased (the watchdog saves scratch before powering off).

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
    lease_holds = lease.error is not None or (
        lease.until is not None and now < lease.until <= now + timedelta(hours=MAX_LEASE_HOURS)
    )
    done = jobs.stop_when_done and not jobs.running
    if done and (guard is None or guard.action == KEEP) and not (protected or lease_holds):
        return Decision(STOP, f"job {jobs.stop_when_done} ended and asked --stop-when-done")
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

    stall = _stall_decision(run, now, policy)
    if stall is not None:
        return stall

    if jobs.running:
        return Decision(KEEP, f"{jobs.running} running job(s) (fab train)", idle_minutes=0.0)

    active = _last_activity(run, now, policy)
    if isinstance(active, Decision):
        return active
    idle_since = active
    if jobs.ended_at is not None and idle_since < jobs.ended_at <= now:
        idle_since = jobs.ended_at  # a job ran until then (perhaps on CPUs only)
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
    """What the reaper knows about one running instance.

    Every time here is on the metrics service's clock: datapoint timestamps as the service
    stores them, never the node-supplied value of a heartbeat.
    """

    launched_at: datetime
    last_heartbeat: datetime | None  # newest heartbeat datapoint in the window, None if none
    max_gpu_util: float | None  # maximum over the window, None if no datapoint
    metrics_error: str | None = None  # the metric query failed or was incomplete for it
    watchdog_expected: bool = True  # gpufleet:watchdog tag is not "off"
    # Newest datapoint the metrics service carried from another source (another node's
    # heartbeat): proof that ingestion worked after this node fell silent.
    pipeline_at: datetime | None = None


def lookback_minutes(limits: Limits, policy: Policy = Policy()) -> float:
    """How far back the reaper reads metrics for an instance with these limits."""
    return (
        limits.idle_minutes
        + policy.heartbeat_stale_minutes
        + policy.clock_skew_minutes
        + policy.lookback_margin_minutes
    )


def stale_after_minutes(policy: Policy = Policy()) -> float:
    """A heartbeat this old (service clock) is stale even from a node whose clock is off."""
    return policy.heartbeat_stale_minutes + policy.clock_skew_minutes


def decide_cloud(
    view: CloudView,
    *,
    now: datetime,
    limits: Limits,
    lease: Lease = Lease(),
    protected: bool = False,
    policy: Policy = Policy(),
) -> Decision:
    """The reaper's decision: act only where the node's own watchdog cannot, and only on
    positive evidence.

    ``now`` is the service's clock. A stop needs one of: the hard TTL (or the 14-day cap), or
    a heartbeat that was seen in the window and then went stale, while the service carried
    other data after it (so the silence is the node's, not an ingestion outage), with no GPU
    activity in the window. Anything less (no datapoint at all, a failed or partial query,
    an unreadable tag) keeps the instance and reports it as unknown: the TTL bounds the cost.
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
        return Decision(KEEP, f"unknown, metrics unreadable: {view.metrics_error}", unknown=True)
    if not view.watchdog_expected:
        return Decision(KEEP, f"watchdog opted out ({names.WATCHDOG}=off): only the TTL applies")
    lookback = lookback_minutes(limits, policy)
    stale = stale_after_minutes(policy)
    skew = timedelta(minutes=policy.clock_skew_minutes)
    if view.last_heartbeat is None or view.last_heartbeat < view.launched_at - skew:
        return Decision(
            KEEP,
            f"unknown, no heartbeat of this boot in the last {lookback:g} min (watchdog not "
            "running, or its metrics never arrived): only the TTL applies",
            unknown=True,
        )
    silent = _minutes(now - view.last_heartbeat)
    if silent < stale:
        return Decision(
            KEEP,
            f"watchdog alive (heartbeat {_fmt_minutes(max(silent, 0.0))} ago) decides on node",
        )
    if view.max_gpu_util is not None and view.max_gpu_util >= policy.active_util_pct:
        return Decision(
            KEEP,
            f"watchdog silent but GPU reached {view.max_gpu_util:.0f} % "
            f"in the last {lookback:g} min",
        )
    # The service must have carried another datapoint at least stale minutes after this
    # node's last one (pipeline_at already allows for that other clock running fast).
    gap = policy.heartbeat_stale_minutes
    if view.pipeline_at is None or _minutes(view.pipeline_at - view.last_heartbeat) < gap:
        return Decision(
            KEEP,
            f"unknown, heartbeat silent {_fmt_minutes(silent)} but no other datapoint reached "
            "the metrics service since, so an ingestion outage is not ruled out",
            unknown=True,
        )
    gpu_text = (
        "no GPU datapoint"
        if view.max_gpu_util is None
        else f"GPU at most {view.max_gpu_util:.0f} %"
    )
    return Decision(
        STOP,
        f"watchdog silent (last heartbeat {_fmt_minutes(silent)} ago, stale after {stale:g} min"
        f", while other data still arrived) and {gpu_text} in the last {lookback:g} min",
    )
