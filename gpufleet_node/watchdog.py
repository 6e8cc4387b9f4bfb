#!/usr/bin/env python3
"""gpufleet node watchdog: stop this GPU node when it is idle, after saving its scratch.

Runs on the node from a systemd timer (gpufleet-watchdog.timer, every ~minute), as root, with
the system Python (3.10+) and nothing but the standard library and the node's own tools
(nvidia-smi, ss, who). This file is the loop; next to it, one module per concern:

    watchdog_config.py   the config files, and the node cloud they name
    watchdog_probe.py    the samples: nvidia-smi, ss, who, /proc/uptime
    watchdog_state.py    what one run leaves the next (history, tags, last decision)
    watchdog_signals.py  what holds the node: leases, protection, fab train jobs
    watchdog_metrics.py  heartbeat and GPU metrics, or a heartbeat object in the bucket
    scratch_sync.py      scratch to the bucket, through ``bucket.py`` (the bucket client)
    idle_rules.py        the idle rules (the cloud reaper's own file)
    clouds/<name>.py     what differs per cloud, one module each (``clouds.CLOUDS``)

One run:
  1. reads its config (/etc/gpufleet/watchdog.json), the sample history and the lease file;
  2. takes a few samples 15 s apart (GPU utilization and compute processes from nvidia-smi,
     SSH sessions and connections from ss/who), checking the spot interruption notice
     before each: a notice saves scratch to the bucket at once;
  3. gathers the other signals (Watchdog.gather_signals: its instance tags for protected,
     lease and limits; unreadable ones count as activity), decides (idle_rules.decide_node),
     publishes heartbeat + GPU metrics + the unsynced file count, logs the decision;
  4. on "stop": saves the checkpoints on scratch to the bucket within a bounded time, then
     powers off (the instance's shutdown behaviour is stop). While checkpoint files are not
     in the bucket it REFUSES to power off and retries every run; only the hard TTL
     overrides that, after one more bounded attempt.

    python3 -m gpufleet_node.watchdog COMMAND (the folder above the package on PYTHONPATH):

    watchdog.py run [--dry-run]   one run, as the timer does (dry: never power off)
    watchdog.py status --json     the idle clock and what keeps the node alive, without acting
    watchdog.py lease --hours N   keep this node N hours: lease file + instance tag
    watchdog.py sync              save scratch to the bucket now
    watchdog.py check-sync        prove the bucket can be written (what fab setup checks)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import bucket, idle_rules
from . import fleet_names as names
from .clouds.base import NodeCloud, TagsUnreadable, retry_idempotent
from .scratch_sync import ScratchSyncer, Syncer
from .watchdog_config import CONFIG_PATH, Config, cloud_for
from .watchdog_metrics import BucketHeartbeat, MetricsPublisher, Publisher
from .watchdog_probe import Probe, SystemProbe, run_cmd, take_sample
from .watchdog_signals import (
    Signals,
    is_protected,
    merge_leases,
    read_jobs,
    read_lease,
    read_quarantine,
    running_job_folders,
    write_lease,
)
from .watchdog_state import (
    STATE_FILE,
    State,
    append_job_log_line,
    append_job_samples,
)

LOG = logging.getLogger("gpufleet-watchdog")


# Who stopped this node, in the stop record (names.STOPPED_BY): this watchdog (idle or
# TTL), or the cloud, as the eviction notice this watchdog saw says.
STOPPED_BY_WATCHDOG = "watchdog"
STOPPED_BY_NOTICE = "spot-notice"
# A spot notice's sync: at most this long, ending this long before a reclaim time the
# notice names, and never shorter than the floor (a late notice still tries the newest).
SPOT_SYNC_S = 90.0
SPOT_MARGIN_S = 10.0
SPOT_MIN_SYNC_S = 5.0
# The file in a running job's node folder that asks its supervisor to push the job's
# checkpoint folder now, not at its next interval (job_runner.py's SYNC_NOW_FILE).
JOB_SYNC_NOW_FILE = "sync-now"


# ---------------------------------------------------------------------------- the run


@dataclass
class Watchdog:
    config: Config
    probe: Probe
    syncer: Syncer
    publisher: Publisher | None
    cloud: NodeCloud | None  # its spot notice; None: no cloud to ask
    poweroff: Callable[[], None]
    warn: Callable[[str], None]
    tags: Callable[[], dict[str, str]] | None  # raises TagsUnreadable
    rules: idle_rules.Policy = field(default_factory=idle_rules.Policy)
    # Writes the stop record (tag gpufleet:stopped-by) where the cloud keeps no stop reason
    # of its own (Azure); None elsewhere. The reaper's function starts a reclaimed spot
    # node again and must tell it from this guard's idle stop (infra/reaper/recovery.py).
    record: Callable[[str], None] | None = None

    @property
    def state_path(self) -> Path:
        return Path(self.config.state_dir) / STATE_FILE

    def gather_signals(self, state: State, now: dt.datetime) -> Signals:
        problems: list[str] = []
        boot = self.probe.boot_time()
        tags: dict[str, str] | None = None
        try:
            if self.tags is None:
                raise TagsUnreadable("no way to read them on this node")
            tags = dict(self.tags())
            state.tags = {"boot": boot.isoformat(), "read_at": now.isoformat(), "tags": tags}
        except TagsUnreadable as exc:
            problems.append(f"instance tags unreadable ({exc})")
        known = tags
        if known is None and state.tags.get("boot"):
            try:
                same_boot = abs((idle_rules.parse_utc(state.tags["boot"]) - boot).total_seconds())
            except (ValueError, TypeError):
                same_boot = float("inf")
            if same_boot < 120:
                known = {str(k): str(v) for k, v in dict(state.tags.get("tags") or {}).items()}
        state_dir = Path(self.config.state_dir)
        leases = [read_lease(state_dir), read_quarantine(state_dir)]
        if known is not None and known.get(names.KEEP_ALIVE_UNTIL, "").strip():
            tag_lease = idle_rules.Lease.parse(known[names.KEEP_ALIVE_UNTIL])
            if tag_lease.error:
                tag_lease = idle_rules.Lease(
                    error=f"{names.KEEP_ALIVE_UNTIL} tag: {tag_lease.error}"
                )
            leases.append(tag_lease)
        if tags is None:
            # Unknown tags count as activity (a lease or protection may be there): the node
            # is never stopped for idleness, and the hard TTL still bounds the cost.
            leases.append(idle_rules.Lease(error=problems[-1]))
        jobs, job_problems = read_jobs(Path(self.config.jobs_dir), boot)
        return Signals(
            protected=known is not None and is_protected(known),
            lease=merge_leases(leases, now),
            limits=self.config.limits(known),
            problems=tuple(problems + job_problems),
            jobs=jobs,
        )

    def decide(self, state: State, signals: Signals, now: dt.datetime) -> idle_rules.Decision:
        return idle_rules.decide_node(
            state.samples,
            now=now,
            boot_time=self.probe.boot_time(),
            limits=signals.limits,
            lease=signals.lease,
            protected=signals.protected,
            role=self.config.role,
            policy=self.rules,
            jobs=signals.jobs,
        )

    def ttl_reached(self, limits: idle_rules.Limits, now: dt.datetime) -> bool:
        up_hours = (now - self.probe.boot_time()).total_seconds() / 3600
        return limits.ttl_hours is not None and up_hours >= limits.ttl_hours

    def status(self, state: State | None = None) -> tuple[idle_rules.Decision, State, Signals]:
        state = state or State.load(self.state_path)
        now = self.probe.now()
        signals = self.gather_signals(state, now)
        return self.decide(state, signals, now), state, signals

    def spot_sync_budget(self, notice: str) -> float:
        """Seconds the sync on a spot notice may take: most of AWS's two minutes, never
        the configured ten; and where the cloud's notice names the reclaim time
        (``spot_deadline``), only until shortly before it, on this node's clock."""
        budget = min(self.config.sync_timeout_s, SPOT_SYNC_S)
        deadline_of = getattr(self.cloud, "spot_deadline", None)
        deadline = deadline_of(notice) if callable(deadline_of) else None
        if deadline is not None:
            left = (deadline - self.probe.now()).total_seconds() - SPOT_MARGIN_S
            budget = max(SPOT_MIN_SYNC_S, min(budget, left))
        return budget

    def _check_spot(self, state: State) -> None:
        if self.cloud is None:
            return
        notice = self.cloud.spot_notice()
        if notice is None or notice == state.spot_notice_synced:
            return
        LOG.warning("spot interruption notice %s: saving scratch now", notice)
        self.write_record(STOPPED_BY_NOTICE)
        budget = self.spot_sync_budget(notice)
        # The running jobs push their checkpoint folders as versions (what a resume
        # restores) while this saves scratch.
        why = f"spot interruption notice {notice}"
        asked = ask_jobs_to_push(self._job_folders(), why, budget, self.probe.now())
        if asked:
            LOG.warning("asked %d running job(s) to push their checkpoints now", asked)
        result = self.syncer.sync(budget)
        LOG.warning("spot sync: %s", result.detail)
        if result.ok:
            state.spot_notice_synced = notice

    def run_once(self) -> idle_rules.Decision:
        state = State.load(self.state_path)
        utils: list[float] = []
        mems: list[float] = []
        taken: list[tuple[idle_rules.Sample, float | None]] = []
        for n in range(max(1, self.config.samples_per_run)):
            if n:
                self.probe.sleep(self.config.sample_interval_s)
            self._check_spot(state)
            sample, mem = take_sample(self.probe)
            state.samples.append(sample)
            taken.append((sample, mem))
            if sample.gpu_util is not None:
                utils.append(sample.max_util)
            if mem is not None:
                mems.append(mem)
        now = self.probe.now()
        append_job_samples(running_job_folders(Path(self.config.jobs_dir)), taken)
        signals = self.gather_signals(state, now)
        if state.tags.get("read_at") == now.isoformat():  # read in this run
            self.clear_old_record(state.tags.get("tags"))
        keep = max(
            signals.limits.idle_minutes + self.rules.activity_window_minutes,
            self.rules.stall_warn_minutes + self.rules.stall_stop_after_warn_minutes,
        )
        state.prune(now, keep + 10)
        decision = self.decide(state, signals, now)
        for problem in signals.problems:
            LOG.warning("%s: counts as activity; only the hard TTL may stop this node", problem)
        LOG.info("%s: %s", decision.action, decision.reason)

        unsynced = self.syncer.unsynced()
        if self.publisher is not None:
            try:
                self.publisher.publish(
                    at=now,
                    gpu_util=max(utils) if utils else None,
                    gpu_mem=max(mems) if mems else None,
                    unsynced=unsynced,
                )
            except Exception as exc:  # metrics are the second layer's input, never fatal here
                LOG.warning("could not publish metrics: %s", exc)

        if decision.warning and not state.stall_warned:
            self.warn(decision.warning)
            state.stall_warned = True
        elif not decision.warning and decision.action == idle_rules.KEEP:
            state.stall_warned = False

        state.last_decision = {
            "at": now.isoformat(),
            "action": decision.action,
            "reason": decision.reason,
            "idle_minutes": decision.idle_minutes,
            # What `fab top` shows from this file: how near the stop is, and why.
            "idle_limit_minutes": signals.limits.idle_minutes,
            "warning": decision.warning,
            "protected": signals.protected,
            "problems": list(signals.problems),
            "unsynced_files": unsynced,
        }
        self.ttl_ahead(state, signals, decision, now)
        if decision.stop:
            self._stop(state, decision, signals, now)
        else:
            state.refused_since = ""
        state.save(self.state_path)
        return decision

    def ttl_ahead(
        self, state: State, signals: Signals, decision: idle_rules.Decision, now: dt.datetime
    ) -> None:
        """Record when the hard TTL stops this node (``state.ttl``: what `fab status` and
        `fab jobs` show), and warn at each of TTL_WARN_MINUTES before it, once each: in the
        journal and on terminals (``warn``) and in every running job's rank logs (what
        `fab logs` prints). The warnings given are kept in the state, for the stop time they
        were given for: a stop that moves (a lease, a new TTL tag, a new boot) re-arms them;
        the jitter of the boot time between runs does not."""
        boot = self.probe.boot_time()
        stop = idle_rules.ttl_stop(
            boot_time=boot, limits=signals.limits, lease=signals.lease, protected=signals.protected
        )
        prev = state.ttl
        warned = [float(t) for t in prev.get("warned") or [] if isinstance(t, int | float)]
        warned_for = str(prev.get("warned_for") or "")
        if stop.at is None or not _near(warned_for, stop.at, TTL_SAME_STOP_S):
            warned, warned_for = [], "" if stop.at is None else stop.at.isoformat()
            told_stop = False
        else:
            told_stop = bool(prev.get("told_stop"))
        if stop.at is not None:
            left = (stop.at - now).total_seconds() / 60
            due = idle_rules.ttl_warning_due(left, warned)
            if due is not None and left > 0 and not decision.stop:
                message = ttl_warning(stop, left)
                self.warn(message)
                told = append_job_log_line(self._job_folders(), _job_line(now, message))
                LOG.info("TTL warning written to %d job log(s)", told)
                warned = sorted(
                    {*warned, *(t for t in idle_rules.TTL_WARN_MINUTES if t >= due)}, reverse=True
                )
            elif decision.stop and left <= 0 and not told_stop:
                message = f"{decision.reason}: stopping this node now"
                append_job_log_line(self._job_folders(), _job_line(now, message))
                told_stop = True
        state.ttl = {
            "boot": boot.isoformat(),
            "at": now.isoformat(),
            "stop_at": None if stop.at is None else stop.at.isoformat(),
            "why": stop.why,
            "ttl_hours": stop.ttl_hours,
            "lease_until": (
                idle_rules.format_utc(signals.lease.until) if signals.lease.until else None
            ),
            "warned": warned,
            "warned_for": warned_for,
            "told_stop": told_stop,
        }

    def write_record(self, guard: str) -> None:
        """Tag this node ``<guard>@<now>`` (bounded tries); a failure is logged, never
        holds the stop: without a record the function keeps the node stopped."""
        if self.record is None:
            return
        value = f"{guard}@{idle_rules.format_utc(self.probe.now())}"
        try:
            self.record(value)
        except Exception as exc:
            LOG.warning("could not write %s=%s: %s", names.STOPPED_BY, value, exc)

    def clear_old_record(self, tags: dict[str, str] | None) -> None:
        """A stop record written before this boot is spent: the node runs again. Cleared
        (set to ""), so a later eviction is not read as this old stop. A record of this
        boot (a notice just seen) stays."""
        value = (tags or {}).get(names.STOPPED_BY, "").strip()
        if self.record is None or not value:
            return
        _, _, when = value.partition("@")
        try:
            written = idle_rules.parse_utc(when)
        except ValueError:
            written = None
        if written is not None and written >= self.probe.boot_time():
            return
        try:
            self.record("")
        except Exception as exc:
            LOG.warning("could not clear %s=%s: %s", names.STOPPED_BY, value, exc)

    def _job_folders(self) -> list[Path]:
        return running_job_folders(Path(self.config.jobs_dir))

    def _stop(
        self, state: State, decision: idle_rules.Decision, signals: Signals, now: dt.datetime
    ) -> None:
        ttl_forced = self.ttl_reached(signals.limits, now)
        result = self.syncer.sync(self.config.sync_timeout_s)  # bounded, even under the TTL
        LOG.warning("pre-stop sync: %s", result.detail)
        state.last_decision["sync"] = result.detail
        left = result.unsynced if result.unsynced is not None else self.syncer.unsynced()
        if not (result.ok and left == 0):
            what = f"{'an unknown number of' if left is None else left} checkpoint file(s)"
            if self.config.scratch_survives_stop:
                LOG.warning("%s not saved, but scratch is a data disk that survives a stop", what)
            elif ttl_forced:
                message = (
                    f"hard TTL reached: powering off after a bounded sync attempt; {what} on "
                    f"scratch NOT saved ({result.detail})"
                )
                LOG.error("%s", message)
                state.last_decision["unsaved_at_ttl"] = message
            else:
                first = not state.refused_since
                state.refused_since = state.refused_since or now.isoformat()
                ttl = signals.limits.ttl_hours
                message = (
                    f"REFUSING to power off: {what} on scratch are not in the bucket "
                    f"({result.detail}); retrying every run"
                    + (f"; the hard TTL ({ttl:g} h) bounds the cost" if ttl is not None else "")
                )
                LOG.error("%s", message)
                state.last_decision["refused"] = message
                state.last_decision["refused_since"] = state.refused_since
                if first:
                    self.warn(message)
                return
        state.refused_since = ""
        if self.config.dry_run:
            LOG.warning("dry run: would power off now (%s)", decision.reason)
            state.last_decision["dry_run"] = "would power off now"
            return
        # Saved before the call: an OS power-off may end this process before it returns.
        state.last_decision["powered_off"] = now.isoformat()
        state.save(self.state_path)
        self.write_record(STOPPED_BY_WATCHDOG)
        try:
            self.poweroff()
        except Exception as exc:
            # An API stop that raised (bounded retries spent) left the node running: the
            # state must not say it stopped; the next run decides again.
            del state.last_decision["powered_off"]
            state.last_decision["poweroff_failed"] = f"{now.isoformat()}: {exc}"
            state.save(self.state_path)
            raise


# A stop time within this of the one warned for is the same stop (the boot time read from
# /proc/uptime moves by a second or so between runs); a lease or a new TTL moves it further.
TTL_SAME_STOP_S = 120.0


def _near(iso: str, when: dt.datetime, seconds: float) -> bool:
    try:
        return abs((idle_rules.parse_utc(iso) - when).total_seconds()) <= seconds
    except (ValueError, TypeError):
        return False


def ask_jobs_to_push(folders: list[Path], why: str, budget_s: float, now: dt.datetime) -> int:
    """Ask the supervisor of each running job (``folders``: their node folders) to push its
    checkpoint folder now, within ``budget_s``: a JOB_SYNC_NOW_FILE ({at, why, budget_s},
    written whole) that it takes at its next look (within seconds). Returns how many were
    asked; a write that fails never stops the watchdog's run."""
    body = json.dumps({"at": idle_rules.format_utc(now), "why": why, "budget_s": budget_s})
    asked = 0
    for folder in folders:
        temp = folder / f".{JOB_SYNC_NOW_FILE}.tmp"
        try:
            temp.write_text(body + "\n")
            os.replace(temp, folder / JOB_SYNC_NOW_FILE)
            asked += 1
        except OSError:
            LOG.warning("could not ask the job in %s to push its checkpoints", folder)
    return asked


def _job_line(now: dt.datetime, message: str) -> str:
    return f"{idle_rules.format_utc(now)} gpufleet watchdog: {message}"


def ttl_warning(stop: idle_rules.TtlStop, minutes_left: float) -> str:
    """The line a job's log and the journal get before the hard TTL: when, and how to
    extend (a lease holds the TTL off until it ends, at most MAX_LEASE_HOURS ahead)."""
    assert stop.at is not None
    when = idle_rules.format_utc(stop.at)
    left = f"{max(1, round(minutes_left))} min"
    if stop.why == "lease":
        what = f"the lease ends at {when} (in {left}) and the hard TTL has passed"
    elif stop.why == "cap":
        what = f"the {idle_rules.MAX_LEASE_HOURS // 24}-day cap is reached at {when} (in {left})"
    else:
        what = f"the hard TTL ({stop.ttl_hours:g} h) is reached at {when} (in {left})"
    return (
        f"{what}: this node stops then, even mid-job, after a bounded checkpoint sync; "
        f"to keep it longer, run `fab keep-alive --hours N` (N <= {idle_rules.MAX_LEASE_HOURS}"
        "): it holds the node until N hours from now"
    )


def wall(message: str) -> None:
    LOG.warning("%s", message)
    run_cmd(["wall", f"gpufleet watchdog: {message}"])


def build(config: Config) -> Watchdog:
    cloud = cloud_for(config)
    creds = cloud.credentials
    instance_id = config.instance_id or cloud.instance_id() or ""
    publisher: Publisher | None = None
    if config.publish_metrics and getattr(cloud, "heartbeat_in_bucket", False):
        if instance_id:
            publisher = BucketHeartbeat(ScratchSyncer(config, creds).store, instance_id)
        else:
            LOG.warning("no instance id (config or metadata): no heartbeat object written")
    elif config.publish_metrics and not getattr(cloud, "publishes_metrics", True):
        LOG.info("%s: this cloud has no custom-metric report action: none published", cloud.name)
    elif config.publish_metrics:
        if instance_id:
            publisher = MetricsPublisher(cloud, instance_id, creds)
        else:
            LOG.warning("no instance id (config or metadata): metrics not published")

    record: Callable[[str], None] | None = None
    if getattr(cloud, "writes_stop_record", False) and instance_id:

        def record(value: str) -> None:
            found = creds()
            if found is None:
                raise RuntimeError("no credentials on this node")
            retry_idempotent(lambda: cloud.write_tag(instance_id, names.STOPPED_BY, value, found))

    return Watchdog(
        config=config,
        probe=SystemProbe(),
        syncer=ScratchSyncer(config, creds),
        publisher=publisher,
        cloud=cloud,
        poweroff=cloud.poweroff,
        warn=wall,
        tags=lambda: cloud.instance_tags(instance_id, creds),
        record=record,
    )


def _lease_command(config: Config, dog: Watchdog, hours: float | None, as_json: bool) -> int:
    if hours is None:
        print("watchdog: lease needs --hours N", file=sys.stderr)
        return 2
    cloud = cloud_for(config)
    instance_id = config.instance_id or cloud.instance_id() or ""

    def tag(until: str) -> None:
        found = cloud.credentials()
        if not instance_id or not found:
            raise RuntimeError("no instance id or credentials on this node")
        retry_idempotent(lambda: cloud.write_tag(instance_id, names.KEEP_ALIVE_UNTIL, until, found))

    try:
        out = write_lease(config, hours, dog.probe.now(), tag)
    except ValueError as exc:
        print(f"watchdog: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out) if as_json else f"lease until {out['lease_until']} (tag {out['tag']})")
    return 0


def _status_command(config: Config, dog: Watchdog, as_json: bool) -> int:
    decision, state, signals = dog.status()
    out = {
        "node": config.node,
        "role": config.role,
        "action": decision.action,
        "reason": decision.reason,
        "warning": decision.warning,
        "idle_minutes": decision.idle_minutes,
        "idle_limit_minutes": signals.limits.idle_minutes,
        "ttl_hours": signals.limits.ttl_hours,
        "protected": signals.protected,
        "lease_until": idle_rules.format_utc(signals.lease.until) if signals.lease.until else None,
        "unreadable": list(signals.problems),
        "running_jobs": signals.jobs.running,
        "unsynced_files": dog.syncer.unsynced(),
        "power_off_refused_since": state.refused_since or None,
        "samples": len(state.samples),
        "last_run": state.last_decision,
    }
    print(json.dumps(out) if as_json else "\n".join(f"{k}: {v}" for k, v in out.items()))
    return 0


def _sync_command(dog: Watchdog, timeout: float | None, check: bool, as_json: bool) -> int:
    syncer = dog.syncer
    if check:
        if not isinstance(syncer, ScratchSyncer):
            print("watchdog: no bucket sync on this node", file=sys.stderr)
            return 1
        try:
            detail, ok = syncer.check(), True
        except (bucket.StoreError, OSError) as exc:
            detail, ok = f"the bucket cannot be written: {exc}", False
        out: dict[str, Any] = {"ok": ok, "detail": detail}
    else:
        result = syncer.sync(timeout if timeout is not None else dog.config.sync_timeout_s)
        ok = result.ok
        out = {"ok": ok, "detail": result.detail, "uploaded": result.uploaded}
        out["unsynced_files"] = result.unsynced
    print(json.dumps(out) if as_json else out["detail"])
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpufleet idle watchdog")
    parser.add_argument(
        "command",
        choices=["run", "status", "lease", "sync", "check-sync"],
        help="run: one run, as the timer does; status: what keeps this node (reads only); "
        "lease: keep it --hours N; sync: save scratch to the bucket now; check-sync: prove "
        "the bucket can be written (a small probe object)",
    )
    parser.add_argument("--config", default=str(CONFIG_PATH))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hours", type=float, help="lease: keep this node for N hours")
    parser.add_argument("--timeout", type=float, help="sync: seconds at most")
    parser.add_argument(
        "--dry-run", action="store_true", help="run: decide, sync and log, never power off"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        config = Config.load(Path(args.config))
    except (ValueError, TypeError) as exc:
        print(f"watchdog: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        config = dataclasses.replace(config, dry_run=True)
    dog = build(config)
    if args.command == "lease":
        return _lease_command(config, dog, args.hours, args.json)
    if args.command == "status":
        return _status_command(config, dog, args.json)
    if args.command in ("sync", "check-sync"):
        return _sync_command(dog, args.timeout, args.command == "check-sync", args.json)
    decision = dog.run_once()
    if args.json:
        print(json.dumps(State.load(dog.state_path).last_decision | {"action": decision.action}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
