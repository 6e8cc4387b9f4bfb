"""The idle rules on a simulated clock: every rule, its boundary, and the precedence."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import pytest

from gpufleet_node.idle_rules import (
    KEEP,
    MAX_LEASE_HOURS,
    STOP,
    UTC,
    CloudView,
    Lease,
    Limits,
    Policy,
    Sample,
    decide_cloud,
    decide_node,
    format_utc,
    lookback_minutes,
    parse_utc,
    resolve_limits,
    ttl_stop,
    ttl_warning_due,
)

BOOT = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
A100 = Limits(idle_minutes=15, ttl_hours=24)
T4 = Limits(idle_minutes=30, ttl_hours=24)


def at(minutes: float) -> datetime:
    return BOOT + timedelta(minutes=minutes)


def samples(
    start: float,
    end: float,
    *,
    util: float = 0.0,
    procs: int = 0,
    ssh: int = 0,
    every_s: float = 15,
    gpus: int = 8,
) -> list[Sample]:
    """Samples every 15 s in [start, end) minutes after boot, like the watchdog takes them."""
    out = []
    t = start
    while t < end:
        out.append(Sample(at=at(t), gpu_util=(util,) * gpus, gpu_procs=procs, ssh=ssh))
        t += every_s / 60
    return out


def node(history: Iterable[Sample], now_min: float, limits: Limits = A100, **kw: object):
    return decide_node(list(history), now=at(now_min), boot_time=BOOT, limits=limits, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ limits from tags


def test_catalog_limits_passed_in_are_the_defaults() -> None:
    assert resolve_limits(tier="a100x4", catalog_idle_minutes=15).idle_minutes == 15
    assert resolve_limits(tier="t4x1", catalog_idle_minutes=30).idle_minutes == 30
    assert resolve_limits(tier="a100x8", catalog_ttl_hours=12).ttl_hours == 12


def test_without_catalog_limits_the_policy_rule_by_tier_name_applies() -> None:
    assert resolve_limits(tier="mystery", instance_type="x9.large").idle_minutes == 30
    assert resolve_limits(tier="a100x4").idle_minutes == 15
    assert resolve_limits(tier="h100x8").idle_minutes == 15
    assert resolve_limits(tier="a10x1").idle_minutes == 30  # not taken for an A100


def test_idle_minutes_tag_overrides_the_catalog_default() -> None:
    assert (
        resolve_limits(tier="a100x8", idle_minutes_tag="45", catalog_idle_minutes=15).idle_minutes
        == 45
    )


@pytest.mark.parametrize(
    "value",
    [
        "soon",
        "1e12",
        "1e400",
        "nan",
        "inf",
        "-3",
        "0",
        "1_5",
        "\uff11\uff15",
        "15 min",
        "99999999",
        15,
        None.__class__,
        [],
        {"m": 15},
    ],
)
def test_unreadable_idle_minutes_tag_is_reported_not_replaced(value: object) -> None:
    limits = resolve_limits(tier="a100x8", idle_minutes_tag=value, catalog_idle_minutes=15)
    assert limits.unreadable
    assert "idle-minutes tag" in limits.unreadable[0]
    assert len(limits.unreadable[0]) < 120  # a huge or odd value is shown short, escaped


def test_ttl_defaults_to_24h_and_12h_for_x8_tiers() -> None:
    assert resolve_limits(tier="a100x4").ttl_hours == 24
    assert resolve_limits(tier="a100x8").ttl_hours == 12
    assert resolve_limits(tier="h100x8").ttl_hours == 12


@pytest.mark.parametrize("value", ["off", "0", "none", "Never"])
def test_ttl_opt_out_must_be_explicit(value: str) -> None:
    assert resolve_limits(tier="a100x8", ttl_hours_tag=value).ttl_hours is None


def test_ttl_tag_sets_hours_and_garbage_is_unreadable() -> None:
    assert resolve_limits(tier="t4x1", ttl_hours_tag="6").ttl_hours == 6
    for bad in ("-3", "1e12", "nan", "337", "junk"):
        garbage = resolve_limits(tier="t4x1", ttl_hours_tag=bad)
        assert garbage.unreadable, bad


def test_an_unreadable_tag_keeps_the_node_until_the_14_day_cap() -> None:
    limits = resolve_limits(tier="a100x8", idle_minutes_tag="1e12", ttl_hours_tag="nan")
    view = CloudView(launched_at=BOOT, last_heartbeat=None, max_gpu_util=0.0)
    kept = decide_cloud(view, now=at(13 * 60), limits=limits)
    assert (kept.action, kept.unknown) == (KEEP, True)
    assert "unknown" in kept.reason
    capped = decide_cloud(view, now=at(MAX_LEASE_HOURS * 60), limits=limits)
    assert capped.action == STOP
    assert "14-day cap" in capped.reason


def test_an_unreadable_lease_never_outlasts_the_ttl_or_the_cap() -> None:
    view = CloudView(launched_at=BOOT, last_heartbeat=None, max_gpu_util=None)
    lease = Lease.parse("next tuesday")
    assert decide_cloud(view, now=at(60), limits=A100, lease=lease).action == KEEP
    assert decide_cloud(view, now=at(24 * 60), limits=A100, lease=lease).action == STOP
    no_ttl = Limits(idle_minutes=15, ttl_hours=None)
    assert decide_cloud(view, now=at(13 * 24 * 60), limits=no_ttl, lease=lease).action == KEEP
    assert decide_cloud(view, now=at(14 * 24 * 60), limits=no_ttl, lease=lease).action == STOP


def test_lease_parses_iso_utc_and_reports_garbage() -> None:
    assert Lease.parse("2026-03-01T10:00:00Z").until == at(120)
    assert Lease.parse("2026-03-01T11:00:00+01:00").until == at(120)
    assert Lease.parse("") == Lease()
    assert Lease.parse(None) == Lease()
    broken = Lease.parse("tomorrow")
    assert broken.until is None
    assert broken.error is not None
    assert "ISO 8601" in broken.error


def test_utc_round_trip() -> None:
    assert parse_utc(format_utc(at(61))) == at(61)


def test_policy_rejects_negative_thresholds_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="boot_grace_minutes"):
        Policy(boot_grace_minutes=-1)
    with pytest.raises(ValueError, match="stall_util_pct"):
        Policy(stall_util_pct=20)


# ------------------------------------------------------------------ node: activity


def test_busy_gpu_keeps_the_node() -> None:
    d = node(samples(30, 60, util=95), 60)
    assert d.action == KEEP
    assert "GPU utilization 95 %" in d.reason


def test_one_busy_sample_keeps_the_node_for_the_activity_window() -> None:
    history = samples(30, 50) + samples(50, 50.1, util=40) + samples(50.25, 70)
    assert node(history, 54).action == KEEP
    assert "ago" in node(history, 54).reason


def test_busy_then_idle_stops_after_window_plus_idle_minutes() -> None:
    history = samples(30, 60, util=90) + samples(60, 120)
    # Last busy sample at 59.75; active until 64.75; 15 idle minutes -> stop from 79.75.
    assert node(history, 79.5).action == KEEP
    d = node(history, 79.8)
    assert d.action == STOP
    assert "idle 15 min >= 15 min" in d.reason


def test_utilization_below_10_percent_is_idle() -> None:
    history = samples(30, 60, util=9.9)
    d = node(history, 60)
    assert d.action == STOP


def test_one_busy_gpu_out_of_eight_is_active() -> None:
    busy = [
        Sample(at=s.at, gpu_util=(0, 0, 0, 0, 0, 0, 0, 55), gpu_procs=1, ssh=0)
        for s in samples(30, 60)
    ]
    assert node(busy, 60).action == KEEP


def test_cheap_tier_waits_30_minutes() -> None:
    history = samples(30, 80)
    assert node(history, 59, limits=T4).action == KEEP
    assert node(history, 60.1, limits=T4).action == STOP


def test_ssh_session_keeps_an_idle_gpu_and_the_clock_starts_at_logout() -> None:
    history = samples(30, 60, ssh=1) + samples(60, 100)
    d = node(history, 59.9)
    assert d.action == KEEP
    assert "SSH" in d.reason
    # Logged out at 60 (last SSH sample at 59.75): idle clock from there.
    assert node(history, 74).action == KEEP
    assert node(history, 75).action == STOP


def test_ssh_tunnel_without_terminal_counts_like_a_session() -> None:
    # The sampler counts established :22 connections, so `ssh -N` tunnels show up here.
    assert node(samples(30, 90, ssh=1), 90).action == KEEP


def test_idle_clock_runs_from_first_sample_when_nothing_was_ever_active() -> None:
    history = samples(40, 70)
    assert node(history, 54).action == KEEP
    assert node(history, 55).idle_minutes == pytest.approx(15)
    assert node(history, 55).action == STOP


def test_head_waits_a_little_longer_so_workers_stop_first() -> None:
    history = samples(30, 70)
    assert node(history, 45, role="worker").action == STOP
    assert node(history, 45, role="head").action == KEEP
    assert node(history, 47, role="head").action == STOP


# ------------------------------------------------------------------ node: guards


def test_boot_grace_keeps_a_fresh_node_idle_or_not() -> None:
    d = node(samples(0, 29), 29)
    assert d.action == KEEP
    assert "boot grace" in d.reason


def test_lease_in_the_future_keeps_an_idle_node() -> None:
    lease = Lease(until=at(180))
    d = node(samples(30, 170), 170, lease=lease)
    assert d.action == KEEP
    assert "lease until 2026-03-01T11:00:00Z" in d.reason


def test_expired_lease_no_longer_protects() -> None:
    d = node(samples(30, 170), 170, lease=Lease(until=at(100)))
    assert d.action == STOP


def test_unreadable_lease_counts_as_active_but_not_past_the_ttl() -> None:
    broken = Lease.parse("next tuesday")
    assert node(samples(30, 90), 90, lease=broken).action == KEEP
    assert node(samples(30, 90), 24 * 60, lease=broken).action == STOP


def test_hard_ttl_stops_even_a_busy_node() -> None:
    history = samples(24 * 60 - 10, 24 * 60 + 1, util=100)
    d = node(history, 24 * 60)
    assert d.action == STOP
    assert "hard TTL 24 h" in d.reason


def test_ttl_opt_out_lets_a_busy_node_run() -> None:
    history = samples(48 * 60 - 10, 48 * 60, util=100)
    limits = Limits(idle_minutes=15, ttl_hours=None)
    assert node(history, 48 * 60, limits=limits).action == KEEP


def test_lease_holds_off_the_ttl() -> None:
    d = node(samples(0, 1), 25 * 60, lease=Lease(until=at(26 * 60)))
    assert d.action == KEEP


def test_a_lease_beyond_the_longest_allowed_is_ignored() -> None:
    far = Lease(until=at(25 * 60 + MAX_LEASE_HOURS * 60 + 1))
    d = node(samples(0, 1), 25 * 60, lease=far)
    assert d.action == STOP and "hard TTL" in d.reason
    near = Lease(until=at(25 * 60 + MAX_LEASE_HOURS * 60))
    assert node(samples(0, 1), 25 * 60, lease=near).action == KEEP


def test_protected_beats_everything() -> None:
    assert node(samples(30, 99 * 60, every_s=600), 99 * 60, protected=True).action == KEEP


# ------------------------------------------------------------------ node: unreadable, gaps


def test_unreadable_nvidia_smi_counts_as_active() -> None:
    broken = [Sample(at=at(t), gpu_util=None, gpu_procs=None, ssh=0) for t in range(30, 90)]
    d = node(broken, 89.5)
    assert d.action == KEEP
    assert "GPU utilization and GPU processes unreadable" in d.reason


def test_idle_clock_restarts_after_nvidia_smi_recovers() -> None:
    broken = [Sample(at=at(t), gpu_util=None, gpu_procs=None, ssh=0) for t in range(30, 60)]
    history = broken + samples(60, 120)
    assert node(history, 70).action == KEEP
    assert node(history, 74).action == STOP


def test_unreadable_ssh_counts_as_active() -> None:
    history = [Sample(at=at(t), gpu_util=(0.0,), gpu_procs=0, ssh=None) for t in range(30, 90)]
    assert node(history, 89.5).action == KEEP


def test_no_recent_samples_keeps_the_node() -> None:
    d = node(samples(30, 40), 90)
    assert d.action == KEEP
    assert "no recent samples" in d.reason


def test_a_gap_in_the_history_is_not_idle_time() -> None:
    # Watchdog down from 40 to 60: only the run since 60 counts.
    history = samples(30, 40) + samples(60, 80)
    assert node(history, 70).action == KEEP
    assert node(history, 75).action == STOP


def test_samples_from_before_this_boot_are_ignored() -> None:
    old = [
        Sample(at=BOOT - timedelta(minutes=m), gpu_util=(0.0,), gpu_procs=0, ssh=0) for m in (1, 2)
    ]
    assert node(old + samples(30, 40), 40).action == KEEP


# ------------------------------------------------------------------ node: stalled jobs


def test_job_holding_gpu_memory_at_low_utilization_is_kept_before_the_stall_limit() -> None:
    history = samples(30, 80, util=1, procs=2)
    d = node(history, 80)
    assert d.action == KEEP
    assert "stalled job" in d.reason
    assert d.warning is None


def test_stalled_job_gets_a_warning_at_60_minutes_then_a_stop() -> None:
    history = samples(30, 200, util=2, procs=1)
    warned = node(history, 91)
    assert warned.action == KEEP
    assert warned.warning is not None
    assert "stops in 9 min" in warned.warning
    stopped = node(history, 100.1)
    assert stopped.action == STOP
    assert "stalled job" in stopped.reason


def test_a_progressing_job_resets_the_stall_clock() -> None:
    history = samples(30, 85, util=2, procs=1) + samples(85, 86, util=80, procs=1)
    history += samples(86, 200, util=2, procs=1)
    assert node(history, 100.1).action == KEEP
    assert node(history, 146.1).warning is not None


def test_job_between_stall_and_active_thresholds_stays_until_the_ttl() -> None:
    # 7 % with memory held: not stalled, not busy; the job keeps the node (TTL bounds it).
    history = samples(30, 300, util=7, procs=1)
    d = node(history, 300)
    assert d.action == KEEP
    assert "holding GPU memory" in d.reason


def test_ssh_session_pauses_the_stall_clock() -> None:
    history = samples(30, 150, util=0, procs=1, ssh=1)
    assert node(history, 150).action == KEEP


def test_process_exit_starts_the_idle_clock() -> None:
    history = samples(30, 60, util=0, procs=1) + samples(60, 100)
    assert node(history, 74).action == KEEP
    assert node(history, 75).action == STOP


# ------------------------------------------------------------------ cloud layer


def cloud(
    now_min: float,
    *,
    heartbeat_min: float | None = None,
    util: float | None = None,
    limits: Limits = A100,
    other_min: float | None = None,
    **kw: object,
):
    """The cloud decision at ``now_min``; ``other_min``: when another node's heartbeat last
    reached the service (default: now, as in a fleet whose other nodes are alive)."""
    other = now_min if other_min is None else other_min
    view = CloudView(
        launched_at=BOOT,
        last_heartbeat=None if heartbeat_min is None else at(heartbeat_min),
        max_gpu_util=util,
        metrics_error=kw.pop("metrics_error", None),  # type: ignore[arg-type]
        watchdog_expected=kw.pop("watchdog_expected", True),  # type: ignore[arg-type]
        # As core.reap passes it: the other node's beat moved back by the tolerated skew.
        pipeline_at=at(other) - timedelta(minutes=Policy().clock_skew_minutes),
    )
    return decide_cloud(view, now=at(now_min), limits=limits, **kw)  # type: ignore[arg-type]


def test_cloud_lookback_is_idle_plus_stale_plus_skew_plus_margin() -> None:
    assert lookback_minutes(A100) == 15 + 10 + 15 + 20
    assert lookback_minutes(T4) == 30 + 10 + 15 + 20


def test_fresh_heartbeat_leaves_the_decision_to_the_node() -> None:
    d = cloud(120, heartbeat_min=118, util=0)
    assert d.action == KEEP
    assert "watchdog alive" in d.reason


def test_stale_heartbeat_and_idle_gpu_metrics_stop_the_instance() -> None:
    d = cloud(120, heartbeat_min=90, util=3)
    assert d.action == STOP
    assert "watchdog silent" in d.reason
    assert "GPU at most 3 %" in d.reason


def test_a_heartbeat_is_stale_only_after_stale_plus_skew_minutes() -> None:
    assert cloud(120, heartbeat_min=120 - 24.9, util=0).action == KEEP
    assert cloud(120, heartbeat_min=120 - 25, util=0).action == STOP


@pytest.mark.parametrize("skew", [-12, -5, 0, 5, 12])
def test_a_node_whose_clock_is_12_minutes_off_is_judged_the_same(skew: float) -> None:
    # Alive: it published a minute ago by the true clock; its datapoint carries its clock.
    assert cloud(120, heartbeat_min=119 + skew, util=0).action == KEEP
    # Gone: silent 45 min by the true clock.
    assert cloud(120, heartbeat_min=75 + skew, util=0).action == STOP


def test_stale_heartbeat_with_recent_gpu_activity_keeps() -> None:
    assert cloud(120, heartbeat_min=90, util=80).action == KEEP


def test_a_silence_nobody_else_broke_is_unknown_not_idle() -> None:
    # Every heartbeat stopped at minute 90: an ingestion outage looks exactly like this.
    d = cloud(130, heartbeat_min=90, util=0, other_min=90)
    assert (d.action, d.unknown) == (KEEP, True)
    assert "ingestion outage" in d.reason


def test_a_watchdog_never_seen_is_unknown_and_kept_until_the_ttl() -> None:
    d = cloud(45, heartbeat_min=None, util=None)
    assert (d.action, d.unknown) == (KEEP, True)
    assert "no heartbeat of this boot" in d.reason
    assert cloud(24 * 60, heartbeat_min=None).action == STOP  # the TTL


def test_a_heartbeat_from_before_this_boot_does_not_count_as_seen() -> None:
    d = cloud(120, heartbeat_min=-60, util=0)
    assert (d.action, d.unknown) == (KEEP, True)


def test_cloud_boot_grace_covers_instances_with_no_metrics_yet() -> None:
    assert cloud(20).action == KEEP
    assert "boot grace" in cloud(20).reason


def test_metric_query_failure_counts_as_active() -> None:
    d = cloud(120, metrics_error="ThrottlingException")
    assert (d.action, d.unknown) == (KEEP, True)
    assert "metrics unreadable" in d.reason


def test_watchdog_opt_out_leaves_only_the_ttl() -> None:
    assert cloud(120, watchdog_expected=False).action == KEEP
    assert cloud(24 * 60, watchdog_expected=False).action == STOP


def test_cloud_ttl_stops_a_busy_instance_with_a_live_watchdog() -> None:
    d = cloud(24 * 60 + 1, heartbeat_min=24 * 60, util=100)
    assert d.action == STOP
    assert "hard TTL" in d.reason


def test_cloud_lease_and_protection_keep() -> None:
    assert cloud(120, lease=Lease(until=at(121))).action == KEEP
    assert cloud(120, protected=True).action == KEEP


def test_both_layers_share_the_guards() -> None:
    # Same instance, same clock: the TTL, lease and boot grace read identically.
    for now_min, lease in ((10, Lease()), (13 * 60, Lease()), (13 * 60, Lease(until=at(14 * 60)))):
        limits = Limits(idle_minutes=15, ttl_hours=12)
        n = node(
            samples(max(0, now_min - 5), now_min, util=100), now_min, limits=limits, lease=lease
        )
        c = cloud(now_min, heartbeat_min=now_min, util=100, limits=limits, lease=lease)
        assert (n.action, n.reason) == (c.action, c.reason)


# ---------------------------------------------------------------- the TTL ahead


def test_the_ttl_stops_a_node_its_hours_after_boot() -> None:
    stop = ttl_stop(boot_time=BOOT, limits=A100)
    assert (stop.at, stop.why, stop.ttl_hours) == (at(24 * 60), "ttl", 24)


def test_a_lease_over_the_ttl_moves_the_stop_to_its_end_and_one_before_it_does_not() -> None:
    over = ttl_stop(boot_time=BOOT, limits=A100, lease=Lease(until=at(30 * 60)))
    assert (over.at, over.why) == (at(30 * 60), "lease")
    before = ttl_stop(boot_time=BOOT, limits=A100, lease=Lease(until=at(20 * 60)))
    assert (before.at, before.why) == (at(24 * 60), "ttl")
    # A lease further ahead than the cap at the TTL's time is not honoured then.
    far = at(24 * 60) + timedelta(hours=MAX_LEASE_HOURS, minutes=1)
    assert ttl_stop(boot_time=BOOT, limits=A100, lease=Lease(until=far)).at == at(24 * 60)


def test_the_ttl_stop_agrees_with_the_node_decision_either_side_of_it() -> None:
    busy = samples(0, 31 * 60, util=95.0, every_s=60)
    for lease in (Lease(), Lease(until=at(30 * 60))):
        stop = ttl_stop(boot_time=BOOT, limits=A100, lease=lease).at
        assert stop is not None
        minute = (stop - BOOT).total_seconds() / 60
        before = decide_node(busy, now=at(minute - 1), boot_time=BOOT, limits=A100, lease=lease)
        after = decide_node(busy, now=at(minute), boot_time=BOOT, limits=A100, lease=lease)
        assert (before.action, after.action) == (KEEP, STOP)


def test_no_ttl_is_off_protected_is_never_and_unreadable_is_the_cap() -> None:
    off = Limits(idle_minutes=15, ttl_hours=None)
    stop = ttl_stop(boot_time=BOOT, limits=off)
    assert (stop.at, stop.why) == (None, "off")
    assert ttl_stop(boot_time=BOOT, limits=A100, protected=True).why == "protected"
    assert ttl_stop(boot_time=BOOT, limits=A100, protected=True).at is None
    bad = Limits(idle_minutes=15, ttl_hours=None, unreadable=("ttl-hours tag 'x' unreadable",))
    cap = ttl_stop(boot_time=BOOT, limits=bad)
    assert (cap.at, cap.why) == (BOOT + timedelta(hours=MAX_LEASE_HOURS), "cap")
    held = ttl_stop(boot_time=BOOT, limits=off, lease=Lease(error="lease unreadable"))
    assert held.why == "cap"


@pytest.mark.parametrize(
    ("left", "warned", "due"),
    [
        (61, [], None),
        (60, [], 60),
        (30, [60], None),
        (10, [60], 10),
        (4, [], 10),  # a late first run: the nearer one only
        (4, [60, 10], None),
    ],
)
def test_each_ttl_warning_is_due_once_and_a_late_run_says_the_nearer(
    left: float, warned: list[float], due: float | None
) -> None:
    assert ttl_warning_due(left, warned) == due
