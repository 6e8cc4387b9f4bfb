#!/usr/bin/env python3
"""gpufleet node watchdog: stop this GPU node when it is idle, after saving its scratch.

Runs on the node from a systemd timer (gpufleet-watchdog.timer, every ~minute), as root, with
the system Python (3.10+) and nothing but the standard library and the node's own tools
(nvidia-smi, ss, who). Next to it: ``idle_rules.py``, the idle rules (the same file the
cloud reaper runs, infra/reaper/idle_rules.py), and ``bucket.py``, its bucket sync. What
differs per cloud is one module per cloud, ``clouds/<name>.py`` (``clouds.CLOUDS``).

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
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # for mypy only; never executed
    from bootstrap.remote import bucket, clouds, idle_rules
    from bootstrap.remote import fleet_names as names
    from bootstrap.remote.clouds.base import (
        Credentials,
        Metric,
        NodeCloud,
        TagsUnreadable,
        retry_idempotent,
    )
else:
    # Installed side by side in /opt/gpufleet; nothing else is on the node's path. Tests run
    # these files the same way (tests/bootstrap/remote/test_watchdog_alone.py).
    import bucket  # the one object-store client (S3 and compatible, Azure Blob)
    import clouds  # one module per cloud (clouds/<name>.py), found by listing the folder
    import fleet_names as names  # tag and metric names: the reaper's and the stack's own
    import idle_rules  # the idle rules: the reaper's own file (infra/reaper/idle_rules.py)
    from clouds.base import (
        Credentials,
        Metric,
        NodeCloud,
        TagsUnreadable,
        retry_idempotent,
    )

UTC = idle_rules.UTC
LOG = logging.getLogger("gpufleet-watchdog")

CONFIG_PATH = Path("/etc/gpufleet/watchdog.json")
NODE_INFO_PATH = Path("/etc/gpufleet/node.json")  # written at first boot by the stack
STATE_DIR = Path("/var/lib/gpufleet")
JOBS_DIR = "/var/lib/gpufleet/jobs"
LEASE_FILE = "keep-alive-until"
STATE_FILE = "watchdog-state.json"

# A spot notice's sync: at most this long, ending this long before a reclaim time the
# notice names, and never shorter than the floor (a late notice still tries the newest).
SPOT_SYNC_S = 90.0
SPOT_MARGIN_S = 10.0
SPOT_MIN_SYNC_S = 5.0

# ---------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    provider: str  # a key of clouds.CLOUDS (a module in clouds/)
    region: str
    stack: str
    node: str
    role: str = "worker"
    tier: str = ""
    instance_type: str = ""
    instance_id: str = ""  # empty: ask the metadata service
    bucket: str = ""
    scratch_path: str = "/scratch"
    # "nvme": instance store, erased by a stop (unsynced files forbid the power-off);
    # "disk": a data disk that survives the stop. Anything else is taken as "nvme".
    scratch_kind: str = "nvme"
    sync_dirs: tuple[str, ...] = ("checkpoints",)  # relative to scratch_path
    idle_minutes: float | None = None  # None: the tier default
    ttl_hours: float | None = None  # None: the tier default; 0 = off
    samples_per_run: int = 4
    sample_interval_s: float = 15.0
    sync_timeout_s: float = 600.0  # one pre-stop sync, at most
    publish_metrics: bool = True
    dry_run: bool = False  # decide and log, never power off
    endpoint_url: str = ""  # metrics and tag API override (tests)
    storage_endpoint_url: str = ""  # bucket API override (tests, private endpoints)
    metadata_url: str = ""  # metadata service override (tests)
    alicloud_account_id: str = ""
    state_dir: str = str(STATE_DIR)
    jobs_dir: str = JOBS_DIR  # fab train's job folders (their state.json: docs/train.md)

    @classmethod
    def load(cls, path: Path = CONFIG_PATH, node_info: Path = NODE_INFO_PATH) -> Config:
        """The watchdog config, over the first-boot node info; every problem at once."""
        raw: dict[str, Any] = {}
        for source in (node_info, path):
            if source.exists():
                try:
                    raw.update(json.loads(source.read_text()))
                except (OSError, ValueError) as exc:
                    raise ValueError(f"{source}: not readable JSON ({exc})") from None
        if isinstance(raw.get("scratch"), dict):
            raw.setdefault("scratch_path", raw["scratch"].get("path", "/scratch"))
            raw.setdefault("scratch_kind", raw["scratch"].get("kind", "nvme"))
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        problems = [
            f"missing {k!r}" for k in ("provider", "region", "stack", "node") if not data.get(k)
        ]
        known_clouds = clouds.CLOUDS
        if data.get("provider") is not None and data["provider"] not in known_clouds:
            problems.append(
                f"provider must be {' or '.join(known_clouds)}, got {data['provider']!r}"
            )
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        if "sync_dirs" in data:
            data["sync_dirs"] = tuple(data["sync_dirs"])
        return cls(**data)

    def limits(self, tags: dict[str, str] | None = None) -> idle_rules.Limits:
        """Idle and TTL limits: the instance's tags where set (what the reaper reads, and
        what a person changes on a running node), else this config, else the tier's."""
        tags = tags or {}
        ttl = (
            None
            if self.ttl_hours is None
            else ("off" if self.ttl_hours <= 0 else str(self.ttl_hours))
        )
        idle = None if self.idle_minutes is None else str(self.idle_minutes)
        return idle_rules.resolve_limits(
            tier=tags.get(names.TIER) or self.tier or None,
            instance_type=self.instance_type or None,
            idle_minutes_tag=tags.get(names.IDLE_MINUTES) or idle,
            ttl_hours_tag=tags.get(names.TTL_HOURS) or ttl,
        )

    @property
    def scratch_survives_stop(self) -> bool:
        return self.scratch_kind == "disk"


# ---------------------------------------------------------------------------- probes


def run_cmd(argv: Sequence[str], timeout: float = 20.0) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_gpu_query(text: str | None) -> tuple[tuple[float, ...], float] | None:
    """``utilization.gpu,memory.used,memory.total`` CSV -> (per-GPU util, max memory %)."""
    if text is None:
        return None
    utils: list[float] = []
    mem_pct = 0.0
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            return None
        try:
            util, used, total = float(parts[0]), float(parts[1]), float(parts[2])
        except ValueError:  # "[N/A]", "[Not Supported]": unreadable, which counts as active
            return None
        utils.append(util)
        if total > 0:
            mem_pct = max(mem_pct, 100.0 * used / total)
    return (tuple(utils), mem_pct) if utils else None


def parse_compute_apps(text: str | None) -> int | None:
    if text is None:
        return None
    return sum(1 for line in text.strip().splitlines() if line.strip() and line[0].isdigit())


def parse_ss(text: str | None) -> int | None:
    """Established TCP connections whose local port is 22 (sessions and ``ssh -N`` tunnels)."""
    if text is None:
        return None
    count = 0
    for line in text.strip().splitlines():
        cols = line.split()
        # ss -Htn state established: Recv-Q Send-Q Local:Port Peer:Port
        if len(cols) >= 4 and cols[2].rsplit(":", 1)[-1] == "22":
            count += 1
    return count


def parse_who(text: str | None) -> int | None:
    if text is None:
        return None
    return sum(1 for line in text.strip().splitlines() if line.strip())


class Probe(Protocol):
    def now(self) -> dt.datetime: ...
    def sleep(self, seconds: float) -> None: ...
    def boot_time(self) -> dt.datetime: ...
    def gpu(self) -> tuple[tuple[float, ...], float] | None: ...
    def gpu_procs(self) -> int | None: ...
    def ssh(self) -> int | None: ...


class SystemProbe:
    """The real node: nvidia-smi, ss, who, /proc/uptime."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def boot_time(self) -> dt.datetime:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return self.now() - dt.timedelta(seconds=uptime)

    def gpu(self) -> tuple[tuple[float, ...], float] | None:
        return parse_gpu_query(
            run_cmd(
                [
                    "nvidia-smi",
                    "--query-gpu=utilization.gpu,memory.used,memory.total",
                    "--format=csv,noheader,nounits",
                ]
            )
        )

    def gpu_procs(self) -> int | None:
        return parse_compute_apps(
            run_cmd(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"])
        )

    def ssh(self) -> int | None:
        connections = parse_ss(run_cmd(["ss", "-Htn", "state", "established"]))
        sessions = parse_who(run_cmd(["who"]))
        if connections is None and sessions is None:
            return None
        return max(connections or 0, sessions or 0)


def take_sample(probe: Probe) -> tuple[idle_rules.Sample, float | None]:
    gpu = probe.gpu()
    sample = idle_rules.Sample(
        at=probe.now(),
        gpu_util=None if gpu is None else gpu[0],
        gpu_procs=probe.gpu_procs(),
        ssh=probe.ssh(),
    )
    return sample, None if gpu is None else gpu[1]


# ---------------------------------------------------------------------------- clouds


def cloud_for(config: Config) -> NodeCloud:
    return clouds.node_cloud(
        config.provider, config.region, config.endpoint_url, config.metadata_url
    )


# ---------------------------------------------------------------------------- metrics and lease


class Publisher(Protocol):
    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None: ...


@dataclass
class MetricsPublisher:
    """Heartbeat + GPU metrics + the unsynced file count, through the node's cloud.

    No datapoint carries the node's clock as its time: both services then stamp it with the
    time they received it ("If not specified, the default value is the time the metric data
    was received", CloudWatch MetricDatum.Timestamp; CloudMonitor PutCustomMetric's ``Time``
    is optional), so the reaper judges staleness on the service's clock and a node whose
    clock is off cannot look fresh or stale. The heartbeat's *value* is still the node's Unix
    time: the difference to the datapoint's timestamp shows the node's clock skew.
    """

    cloud: NodeCloud
    instance_id: str
    credentials: Callable[[], Credentials | None]

    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None:
        creds = self.credentials()
        if not creds:
            raise RuntimeError("no credentials for metrics (instance role or environment)")
        values: list[Metric] = [(names.METRIC_HEARTBEAT, float(int(at.timestamp())), "None")]
        if gpu_util is not None:
            values.append((names.METRIC_GPU_UTIL, gpu_util, "Percent"))
        if gpu_mem is not None:
            values.append((names.METRIC_GPU_MEM, gpu_mem, "Percent"))
        if unsynced is not None:
            values.append((names.METRIC_UNSYNCED, float(unsynced), "Count"))
        self.cloud.put_metrics(self.instance_id, values, creds)


@dataclass
class BucketHeartbeat:
    """The heartbeat where the cloud's metrics service takes none (Tencent: PutMonitorData
    is disused): this node's object ``<HEARTBEAT_OBJECT_PREFIX><instance id>`` in the
    stack's bucket, written again every run. The reaper reads only its Last-Modified, which
    the storage service stamps on its own clock; the body (this node's clock and last
    values) is for people. GPU utilization reaches the reaper through the cloud's own agent
    (infra/clouds/tencent/reaper.py)."""

    store: Callable[[], bucket.BucketStore | None]
    instance_id: str
    timeout_s: float = 30.0

    def publish(
        self,
        *,
        at: dt.datetime,
        gpu_util: float | None,
        gpu_mem: float | None,
        unsynced: int | None = None,
    ) -> None:
        store = self.store()
        if store is None:
            raise RuntimeError("no bucket configured: no heartbeat object written")
        body = {
            "node_time": idle_rules.format_utc(at),
            "gpu_util": gpu_util,
            "gpu_mem": gpu_mem,
            "unsynced": unsynced,
        }
        key = names.HEARTBEAT_OBJECT_PREFIX + self.instance_id
        store.put(key, json.dumps(body).encode(), deadline=time.monotonic() + self.timeout_s)


def write_lease(
    config: Config, hours: float, now: dt.datetime, tagger: Callable[[str], None] | None
) -> dict[str, Any]:
    """The lease file (what this watchdog reads) and the instance tag (what the reaper reads)."""
    if not 0 < hours <= idle_rules.MAX_LEASE_HOURS:
        raise ValueError(
            f"--hours must be more than 0 and at most {idle_rules.MAX_LEASE_HOURS}, got {hours}"
        )
    until = idle_rules.format_utc(now + dt.timedelta(hours=hours))
    path = Path(config.state_dir) / LEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(until + "\n")
    out: dict[str, Any] = {"lease_until": until, "file": str(path), "tag": "not set"}
    if tagger is not None:
        try:
            tagger(until)
            out["tag"] = "set"
        except Exception as exc:  # the file alone still keeps this node's watchdog away
            out["tag"] = f"failed: {exc}"
    return out


# ---------------------------------------------------------------------------- sync


SyncResult = bucket.SyncResult


class Syncer(Protocol):
    """Saves scratch to the bucket (bucket.py); fakes in the tests."""

    def unsynced(self) -> int | None:
        """Checkpoint files on scratch that are not in the bucket; None when unknown."""
        ...

    def sync(self, timeout_s: float) -> SyncResult: ...


@dataclass
class ScratchSyncer:
    """The node's own sync: every ``sync_dirs`` under scratch -> <bucket>/<dir>/<node>/."""

    config: Config
    credentials: Callable[[], Credentials | None]
    retry_sleep: Callable[[float], None] = time.sleep

    def store(self) -> bucket.BucketStore | None:
        if not self.config.bucket:
            return None
        cloud = cloud_for(self.config)
        store = cloud.bucket_store.for_node(
            endpoint=cloud.bucket_endpoint(),
            region=self.config.region,
            bucket=self.config.bucket,
            credentials=self.credentials,
            endpoint_url=self.config.storage_endpoint_url,
        )
        store.retry_sleep = self.retry_sleep
        return store

    def unsynced(self) -> int | None:
        try:
            return len(
                bucket.pending(
                    Path(self.config.scratch_path),
                    self.config.sync_dirs,
                    self.config.node,
                    self.config.bucket,
                )
            )
        except OSError:
            return None

    def sync(self, timeout_s: float) -> SyncResult:
        return bucket.sync_scratch(
            scratch=Path(self.config.scratch_path),
            sync_dirs=self.config.sync_dirs,
            node=self.config.node,
            store=self.store(),
            timeout_s=timeout_s,
        )

    def check(self) -> str:
        store = self.store()
        if store is None:
            raise bucket.StoreError("no bucket configured: scratch cannot be saved", "NoBucket")
        return bucket.check_store(store, self.config.node)


# ---------------------------------------------------------------------------- state


@dataclass
class State:
    samples: list[idle_rules.Sample] = field(default_factory=list)
    stall_warned: bool = False
    spot_notice_synced: str = ""  # the notice we already saved scratch for
    refused_since: str = ""  # ISO time since when power-off is refused (unsynced scratch)
    # The last tags read in this boot ({"boot": ISO, "read_at": ISO, "tags": {...}}): when a
    # later read fails, a node once seen protected stays protected.
    tags: dict[str, Any] = field(default_factory=dict)
    last_decision: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> State:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()  # a lost history only restarts the idle clock
        samples = []
        for s in raw.get("samples", []):
            try:
                samples.append(
                    idle_rules.Sample(
                        at=idle_rules.parse_utc(s["at"]),
                        gpu_util=None if s.get("gpu_util") is None else tuple(s["gpu_util"]),
                        gpu_procs=s.get("gpu_procs"),
                        ssh=s.get("ssh"),
                    )
                )
            except (KeyError, ValueError, TypeError):
                continue
        return cls(
            samples=samples,
            stall_warned=bool(raw.get("stall_warned")),
            spot_notice_synced=str(raw.get("spot_notice_synced", "")),
            refused_since=str(raw.get("refused_since", "")),
            tags=dict(raw.get("tags") or {}),
            last_decision=dict(raw.get("last_decision", {})),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "samples": [
                {
                    "at": s.at.astimezone(UTC).isoformat(),
                    "gpu_util": None if s.gpu_util is None else list(s.gpu_util),
                    "gpu_procs": s.gpu_procs,
                    "ssh": s.ssh,
                }
                for s in self.samples
            ],
            "stall_warned": self.stall_warned,
            "spot_notice_synced": self.spot_notice_synced,
            "refused_since": self.refused_since,
            "tags": self.tags,
            "last_decision": self.last_decision,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: a crash mid-write never leaves half a history

    def prune(self, now: dt.datetime, keep_minutes: float) -> None:
        cutoff = now - dt.timedelta(minutes=keep_minutes)
        self.samples = [s for s in self.samples if s.at >= cutoff]


def read_lease(state_dir: Path) -> idle_rules.Lease:
    path = state_dir / LEASE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return idle_rules.Lease()
    except OSError as exc:
        return idle_rules.Lease(error=f"{path}: {exc}")
    return idle_rules.Lease.parse(text)


# ---------------------------------------------------------------------------- signals


@dataclass(frozen=True)
class Signals:
    """Everything besides the GPU/SSH samples that decides a run, gathered in one place
    (:meth:`Watchdog.gather_signals`). A new kind of activity (a job's own heartbeat, say)
    belongs there: it either holds the node like a lease does (``lease``) or is reported as
    unreadable (``problems``), which counts as activity until the hard TTL."""

    protected: bool
    lease: idle_rules.Lease
    limits: idle_rules.Limits
    problems: tuple[str, ...] = ()  # what could not be read: logged, published in status
    jobs: idle_rules.Jobs = field(default_factory=idle_rules.Jobs)  # fab train jobs (read_jobs)


def _pid_runs(pid: int, name: bytes) -> bool:
    try:
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists, or there is no /proc to tell: an unknown counts as active
    return name in cmd


def read_jobs(jobs_dir: Path, boot: dt.datetime) -> tuple[idle_rules.Jobs, list[str]]:
    """This node's ``fab train`` jobs from their state files (the job runner's contract): a
    job runs while its state is starting/running in this boot and its supervisor lives."""
    try:
        current_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        current_boot = ""
    running, problems = 0, []
    ended: list[dt.datetime] = []
    stop_when_done: str | None = None
    for path in sorted(jobs_dir.glob("*/node-*/state.json")) if jobs_dir.is_dir() else []:
        try:
            st = json.loads(path.read_text())
            state = str(st["state"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            running += 1  # an unreadable signal counts as activity
            problems.append(f"job state {path} unreadable ({exc.__class__.__name__})")
            continue
        if state in ("starting", "running"):
            same_boot = not st.get("boot_id") or not current_boot or st["boot_id"] == current_boot
            if same_boot and _pid_runs(int(st.get("pid") or 0), b"job_runner.py"):
                running += 1
            continue
        try:
            end = idle_rules.parse_utc(str(st.get("ended_at") or ""))
        except ValueError:
            continue
        if end >= boot:
            ended.append(end)
            if st.get("stop_when_done") and not st.get("syncing"):
                stop_when_done = str(st.get("job"))
    jobs = idle_rules.Jobs(running, max(ended) if ended else None, stop_when_done)
    return jobs, problems


def merge_leases(leases: Sequence[idle_rules.Lease], now: dt.datetime) -> idle_rules.Lease:
    """The lease that holds: the latest valid one; else an error if any was unreadable."""
    cap = now + dt.timedelta(hours=idle_rules.MAX_LEASE_HOURS)
    valid = [lease.until for lease in leases if lease.until and now < lease.until <= cap]
    if valid:
        return idle_rules.Lease(until=max(valid))
    errors = [lease.error for lease in leases if lease.error]
    if errors:
        return idle_rules.Lease(error="; ".join(errors))
    ends = [lease.until for lease in leases if lease.until]
    return idle_rules.Lease(until=max(ends)) if ends else idle_rules.Lease()


def is_protected(tags: dict[str, str]) -> bool:
    """As the reaper reads it: protected unless the tag clearly says no (an unknown value
    such as "on" or "maybe" holds the node too)."""
    return names.is_protected(tags.get(names.PROTECTED, ""))


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
        leases = [read_lease(Path(self.config.state_dir))]
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
        result = self.syncer.sync(self.spot_sync_budget(notice))
        LOG.warning("spot sync: %s", result.detail)
        if result.ok:
            state.spot_notice_synced = notice

    def run_once(self) -> idle_rules.Decision:
        state = State.load(self.state_path)
        utils: list[float] = []
        mems: list[float] = []
        for n in range(max(1, self.config.samples_per_run)):
            if n:
                self.probe.sleep(self.config.sample_interval_s)
            self._check_spot(state)
            sample, mem = take_sample(self.probe)
            state.samples.append(sample)
            if sample.gpu_util is not None:
                utils.append(sample.max_util)
            if mem is not None:
                mems.append(mem)
        now = self.probe.now()
        signals = self.gather_signals(state, now)
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
            "protected": signals.protected,
            "problems": list(signals.problems),
            "unsynced_files": unsynced,
        }
        if decision.stop:
            self._stop(state, decision, signals, now)
        else:
            state.refused_since = ""
        state.save(self.state_path)
        return decision

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
        try:
            self.poweroff()
        except Exception as exc:
            # An API stop that raised (bounded retries spent) left the node running: the
            # state must not say it stopped; the next run decides again.
            del state.last_decision["powered_off"]
            state.last_decision["poweroff_failed"] = f"{now.isoformat()}: {exc}"
            state.save(self.state_path)
            raise


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

    return Watchdog(
        config=config,
        probe=SystemProbe(),
        syncer=ScratchSyncer(config, creds),
        publisher=publisher,
        cloud=cloud,
        poweroff=cloud.poweroff,
        warn=wall,
        tags=lambda: cloud.instance_tags(instance_id, creds),
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
