"""The node watchdog: its loop on a simulated clock (idle, busy, protected, leased, tags
unreadable, scratch that cannot be saved), the pre-stop sync into a moto S3 bucket, tags and
credentials from fake metadata services, metrics into moto CloudWatch, and the signatures
checked against botocore and the official Alibaba Cloud SDK.

The node files are imported as the node runs them: as the ``gpufleet_node`` package
(``gpufleet_node.watchdog``, ``.idle_rules``, ``.bucket``), whose modules import each other
relatively; tests/gpufleet_node/test_watchdog_alone.py runs it with nothing else."""

from __future__ import annotations

import importlib
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet_node import fleet_names
from infra.reaper import tags as reaper_tags
from tests.gpufleet_node.watchdog_fakes import (
    INSTANCE_ID,
    FakeEcs,
    FakeIMDS,
    closed_port,
    serve,
)
from tests.support.moto_server import moto_server

REMOTE = Path(__file__).resolve().parents[2] / "gpufleet_node"
wd: Any = importlib.import_module("gpufleet_node.watchdog")
# Its concerns, one module each beside it in the package.
wconfig: Any = importlib.import_module("gpufleet_node.watchdog_config")
wprobe: Any = importlib.import_module("gpufleet_node.watchdog_probe")
wmetrics: Any = importlib.import_module("gpufleet_node.watchdog_metrics")
wscratch: Any = importlib.import_module("gpufleet_node.scratch_sync")
wstate: Any = importlib.import_module("gpufleet_node.watchdog_state")
wsignals: Any = importlib.import_module("gpufleet_node.watchdog_signals")
wsync: Any = importlib.import_module("gpufleet_node.bucket")
# The node's clouds, one module each (gpufleet_node/clouds/).
nodeclouds: Any = importlib.import_module("gpufleet_node.clouds")
nodebase: Any = importlib.import_module("gpufleet_node.clouds.base")
aws_node: Any = importlib.import_module("gpufleet_node.clouds.aws")
alicloud_node: Any = importlib.import_module("gpufleet_node.clouds.alicloud")
tencent_node: Any = importlib.import_module("gpufleet_node.clouds.tencent")
azure_node: Any = importlib.import_module("gpufleet_node.clouds.azure")
KEEP, STOP, UTC = wd.idle_rules.KEEP, wd.idle_rules.STOP, wd.idle_rules.UTC

BOOT = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
BUCKET = "gpufleet-a100x8-test"


def test_the_watchdog_is_loaded_from_the_node_package() -> None:
    assert Path(wd.__file__).resolve().parent == REMOTE
    assert wd.idle_rules.__name__ == "gpufleet_node.idle_rules"
    assert wd.bucket is wsync
    # one copy of each module: no flat `idle_rules` beside the package's
    assert "idle_rules" not in sys.modules and "bucket" not in sys.modules


# ---------------------------------------------------------------- parsers (recorded outputs)


def test_nvidia_smi_query_gives_per_gpu_utilization_and_the_fullest_memory() -> None:
    out = "87, 30000, 81559\n3, 100, 81559\n"
    utils, mem = wprobe.parse_gpu_query(out) or ((), 0.0)
    assert utils == (87.0, 3.0)
    assert mem == pytest.approx(36.78, abs=0.01)


@pytest.mark.parametrize("out", [None, "", "[N/A], 100, 81559", "garbage"])
def test_unreadable_nvidia_smi_output_is_none(out: str | None) -> None:
    assert wprobe.parse_gpu_query(out) is None


def test_compute_apps_count_processes_holding_gpu_memory() -> None:
    assert wprobe.parse_compute_apps("1234, 30000 MiB\n5678, 20 MiB\n") == 2
    assert wprobe.parse_compute_apps("") == 0
    assert wprobe.parse_compute_apps(None) is None


def test_ss_counts_established_connections_to_port_22_only() -> None:
    out = (
        "0 0 10.0.1.5:22 203.0.113.9:53122\n"
        "0 0 10.0.1.5:22 203.0.113.9:53188\n"
        "0 0 10.0.1.5:40112 52.94.1.1:443\n"
        "0 0 [::ffff:10.0.1.5]:22 [::ffff:1.2.3.4]:1022\n"
    )
    assert wprobe.parse_ss(out) == 3
    assert wprobe.parse_who("ubuntu pts/0 2026-03-01 08:00 (203.0.113.9)\n") == 1


def test_the_names_next_to_the_watchdog_are_the_reapers_names_file() -> None:
    assert wd.names is fleet_names  # one file: the node's, the reaper's and the stack's
    assert Path(wd.names.__file__).parent == REMOTE
    assert (wd.names.PROTECTED, wd.names.KEEP_ALIVE_UNTIL, wd.names.METRIC_HEARTBEAT) == (
        reaper_tags.PROTECTED,
        reaper_tags.KEEP_ALIVE_UNTIL,
        fleet_names.METRIC_HEARTBEAT,
    )


def test_the_policy_next_to_the_watchdog_is_the_reapers_policy() -> None:
    from infra.reaper import core

    assert core.decide_cloud.__module__ == wd.idle_rules.__name__ == "gpufleet_node.idle_rules"


# ---------------------------------------------------------------- simulated node


@dataclass
class Timeline:
    """What the node does over time: each signal is a function of minutes since boot."""

    util: Callable[[float], float | None] = lambda m: 0.0
    procs: Callable[[float], int | None] = lambda m: 0
    ssh: Callable[[float], int | None] = lambda m: 0


@dataclass
class FakeProbe:
    timeline: Timeline
    clock: datetime = BOOT + timedelta(minutes=31)

    @property
    def minutes(self) -> float:
        return (self.clock - BOOT).total_seconds() / 60

    def now(self) -> datetime:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.clock += timedelta(seconds=seconds)

    def boot_time(self) -> datetime:
        return BOOT

    def gpu(self) -> tuple[tuple[float, ...], float] | None:
        u = self.timeline.util(self.minutes)
        return None if u is None else ((u, 0.0), 40.0 if u else 0.0)

    def gpu_procs(self) -> int | None:
        return self.timeline.procs(self.minutes)

    def ssh(self) -> int | None:
        return self.timeline.ssh(self.minutes)


@dataclass
class Recorder:
    events: list[tuple[str, float]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    published: list[dict[str, Any]] = field(default_factory=list)

    def poweroffs(self) -> list[float]:
        return [m for e, m in self.events if e == "poweroff"]

    def syncs(self) -> list[float]:
        return [m for e, m in self.events if e.startswith("sync")]


@dataclass
class FakeSyncer:
    """Stands for the bucket: files on scratch are saved when ``ok``, else they stay."""

    probe: FakeProbe
    recorder: Recorder
    ok: bool = True
    files: int = 2  # checkpoint files on scratch not yet in the bucket
    detail: str = "bucket unreachable"

    def unsynced(self) -> int | None:
        return self.files

    def sync(self, timeout_s: float) -> Any:
        self.recorder.events.append((f"sync {timeout_s:g}", self.probe.minutes))
        if self.ok:
            self.files = 0
            return wsync.SyncResult(True, "fake sync", uploaded=2, unsynced=0)
        return wsync.SyncResult(False, self.detail, unsynced=self.files)


@dataclass
class RecordingSyncer:
    """A real syncer whose calls are recorded on the simulated clock."""

    inner: Any
    probe: FakeProbe
    recorder: Recorder
    results: list[Any] = field(default_factory=list)

    def unsynced(self) -> int | None:
        return self.inner.unsynced()

    def sync(self, timeout_s: float) -> Any:
        self.recorder.events.append((f"sync {timeout_s:g}", self.probe.minutes))
        result = self.inner.sync(timeout_s)
        self.results.append(result)
        return result


@dataclass
class FakePublisher:
    recorder: Recorder

    def publish(
        self, *, at: datetime, gpu_util: float | None, gpu_mem: float | None, **kw: Any
    ) -> None:
        self.recorder.published.append({"at": at, "util": gpu_util, "mem": gpu_mem, **kw})


@dataclass
class Tags:
    """The instance's tags over simulated time; None from ``read`` means unreadable."""

    probe: FakeProbe
    read: Callable[[float], dict[str, str] | None] = lambda m: {}

    def __call__(self) -> dict[str, str]:
        tags = self.read(self.probe.minutes)
        if tags is None:
            raise nodebase.TagsUnreadable("metadata service: HTTP 500")
        return tags


def make_config(tmp_path: Path, **kw: Any) -> Any:
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True, exist_ok=True)
    base: dict[str, Any] = {
        "provider": "aws",
        "region": "us-east-1",
        "stack": "a100x8",
        "node": "a100x8-1",
        "role": "worker",
        "tier": "a100x8",
        "bucket": BUCKET,
        "scratch_path": str(scratch),
        "state_dir": str(tmp_path / "state"),
    }
    base.update(kw)
    return wconfig.Config(**base)


def make_dog(
    tmp_path: Path,
    timeline: Timeline,
    *,
    sync_ok: bool = True,
    tags: Callable[[float], dict[str, str] | None] = lambda m: {},
    **config: Any,
) -> tuple[Any, FakeProbe, Recorder]:
    probe = FakeProbe(timeline)
    rec = Recorder()
    dog = wd.Watchdog(
        config=make_config(tmp_path, **config),
        probe=probe,
        syncer=FakeSyncer(probe, rec, ok=sync_ok),
        publisher=FakePublisher(rec),
        cloud=None,
        poweroff=lambda: rec.events.append(("poweroff", probe.minutes)),
        warn=rec.warnings.append,
        tags=Tags(probe, tags),
    )
    return dog, probe, rec


def run_until_poweroff(dog: Any, probe: FakeProbe, rec: Recorder, until_min: float) -> float | None:
    """Run the timer's loop (a run, then 15 s idle) until power-off or ``until_min``."""
    while probe.minutes < until_min:
        dog.run_once()
        if rec.poweroffs():
            return rec.poweroffs()[0]
        probe.sleep(15)
    return None


def test_busy_then_idle_node_syncs_then_powers_off_after_the_idle_limit(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 95.0 if m < 60 else 0.0))
    off = run_until_poweroff(dog, probe, rec, 200)
    # Busy until 60 min; active 5 more (window); idle limit 15 for A100 tiers -> ~80 min.
    assert off is not None
    assert 79.5 <= off <= 81.5
    names = [e for e, _ in rec.events]
    assert names[-2].startswith("sync")
    assert names[-1] == "poweroff"
    # Every run published a heartbeat, the busiest GPU's utilization and the unsynced count.
    assert len(rec.published) >= 45  # one per run: ~49 minutes of runs, ~1 run a minute
    assert rec.published[0]["util"] == 95.0
    assert rec.published[-1]["util"] == 0.0
    assert rec.published[-1]["unsynced"] == 2


def test_cheap_tier_waits_30_idle_minutes(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), tier="t4x1")
    off = run_until_poweroff(dog, probe, rec, 200)
    # History starts at 31 min (first run): 30 idle minutes from there.
    assert off is not None
    assert 61 <= off <= 62.5


def test_idle_minutes_tag_overrides_the_config_as_the_reaper_reads_it(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(), tier="t4x1", tags=lambda m: {"gpufleet:idle-minutes": "10"}
    )
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert 41 <= off <= 42.5


def test_ssh_session_keeps_an_idle_gpu_alive(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(ssh=lambda m: 1 if m < 120 else 0))
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert 134.5 <= off <= 136.5


def test_lease_file_keeps_an_idle_node_until_it_expires(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline())
    state = Path(dog.config.state_dir)
    state.mkdir(parents=True)
    (state / wsignals.LEASE_FILE).write_text((BOOT + timedelta(minutes=100)).isoformat())
    off = run_until_poweroff(dog, probe, rec, 300)
    assert off is not None
    # The lease hides nothing from the idle clock: it has run all along, so the stop comes
    # at the first run after the lease ends.
    assert 100 <= off <= 101.5


def test_a_quarantined_node_is_kept_for_its_replacement_and_says_why(tmp_path: Path) -> None:
    from gpufleet_node import verify_health

    dog, probe, rec = make_dog(tmp_path, Timeline())
    state = Path(dog.config.state_dir)
    # fab health --quarantine writes the mark where the watchdog looks (one name, two files).
    assert wsignals.QUARANTINE_FILE == verify_health.QUARANTINE_FILE
    verify_health.store_verdict({"host": "n"}, state, verify_health.QUARANTINE_FILE)
    assert run_until_poweroff(dog, probe, rec, 300) is None
    decision, _, _ = dog.status()
    assert decision.action == "keep" and "quarantined for replacement" in decision.reason


def test_stalled_job_is_warned_once_then_stopped(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 1.0, procs=lambda m: 1))
    off = run_until_poweroff(dog, probe, rec, 300)
    assert len(rec.warnings) == 1
    assert "stalled job" in rec.warnings[0]
    assert off is not None
    assert 100.5 <= off <= 102.5  # 60 min stall + 10 min after the warning, from 31 min


def test_the_last_run_in_the_state_file_says_its_warning_and_the_idle_limit(
    tmp_path: Path,
) -> None:
    """What `fab top` reads from the node to mark one the watchdog is about to stop."""
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 1.0, procs=lambda m: 1))
    while not rec.warnings and probe.minutes < 200:
        dog.run_once()
        probe.sleep(15)
    last = wstate.State.load(dog.state_path).last_decision
    assert last["warning"] == rec.warnings[0] and "stops in" in last["warning"]
    assert last["idle_limit_minutes"] == 15.0  # the A100 tiers' limit
    assert last["idle_minutes"] >= 60


def test_unreadable_nvidia_smi_never_powers_off_before_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(util=lambda m: None, procs=lambda m: None), ttl_hours=3
    )
    off = run_until_poweroff(dog, probe, rec, 400)
    assert off is not None
    assert 180 <= off <= 181.5  # only the hard TTL stops it


def test_dry_run_decides_and_syncs_but_never_powers_off(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), dry_run=True)
    assert run_until_poweroff(dog, probe, rec, 80) is None
    assert rec.syncs()
    assert wstate.State.load(dog.state_path).last_decision["dry_run"] == "would power off now"


def test_a_poweroff_that_raises_is_recorded_as_failed_not_as_powered_off(
    tmp_path: Path,
) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline())

    def refused() -> None:
        rec.events.append(("poweroff", probe.minutes))
        raise OSError("StopInstance: Throttling, retries spent")

    dog.poweroff = refused
    with pytest.raises(OSError, match="Throttling"):
        run_until_poweroff(dog, probe, rec, 200)
    last = wstate.State.load(dog.state_path).last_decision
    assert "powered_off" not in last
    assert "Throttling" in last["poweroff_failed"]


def test_history_survives_between_runs_and_is_pruned(tmp_path: Path) -> None:
    dog, probe, _ = make_dog(tmp_path, Timeline(ssh=lambda m: 1))
    for _ in range(200):
        dog.run_once()
        probe.sleep(15)
    state = wstate.State.load(dog.state_path)
    span = (state.samples[-1].at - state.samples[0].at).total_seconds() / 60
    assert span <= 80 + 1  # stall window (70) + 10 min margin
    assert state.last_decision["action"] == KEEP


def test_status_reports_the_idle_clock_and_what_keeps_the_node(tmp_path: Path) -> None:
    dog, probe, _ = make_dog(tmp_path, Timeline())
    for _ in range(5):
        dog.run_once()
        probe.sleep(15)
    decision, _state, signals = dog.status()
    assert decision.action == KEEP
    assert decision.idle_minutes is not None
    assert decision.idle_minutes > 4
    assert "idle" in decision.reason
    assert signals.problems == ()


# ------------------------------------------------- protected, leased, tags unreadable: no stop


def test_protected_node_is_never_powered_off_not_even_at_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(), ttl_hours=3, tags=lambda m: {"gpufleet:protected": "true"}
    )
    assert run_until_poweroff(dog, probe, rec, 8 * 60) is None
    assert rec.poweroffs() == []
    assert rec.syncs() == []
    assert "protected" in wstate.State.load(dog.state_path).last_decision["reason"]


@pytest.mark.parametrize("value", ["on", " YES ", "maybe"])
def test_watchdog_honours_a_protected_tag_the_reaper_honours(tmp_path: Path, value: str) -> None:
    # The watchdog once read only true/yes/1, while the reaper keeps "on" and any value that
    # is not clearly no: both layers now read the tag by the same rule (fleet_names).
    dog, probe, rec = make_dog(tmp_path, Timeline(), tags=lambda m: {"gpufleet:protected": value})
    assert run_until_poweroff(dog, probe, rec, 4 * 60) is None
    assert "protected" in wstate.State.load(dog.state_path).last_decision["reason"]


@pytest.mark.parametrize("value", ["false", "off", " No ", "0", ""])
def test_a_protected_tag_that_says_no_leaves_an_idle_node_to_its_limit(
    tmp_path: Path, value: str
) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), tags=lambda m: {"gpufleet:protected": value})
    assert run_until_poweroff(dog, probe, rec, 4 * 60) is not None


def test_protected_node_stays_protected_when_its_tags_become_unreadable(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path,
        Timeline(),
        ttl_hours=3,
        tags=lambda m: {"gpufleet:protected": "True"} if m < 60 else None,
    )
    assert run_until_poweroff(dog, probe, rec, 8 * 60) is None
    last = wstate.State.load(dog.state_path).last_decision
    assert "protected" in last["reason"]
    assert last["problems"] and "instance tags unreadable" in last["problems"][0]


def test_lease_tag_holds_an_idle_node_past_the_ttl_until_it_ends(tmp_path: Path) -> None:
    until = wd.idle_rules.format_utc(BOOT + timedelta(hours=5))
    dog, probe, rec = make_dog(
        tmp_path, Timeline(), ttl_hours=3, tags=lambda m: {"gpufleet:keep-alive-until": until}
    )
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert 300 <= off <= 301.5  # the first run after the lease; never while it held


def test_lease_file_written_by_keep_alive_holds_past_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), ttl_hours=3)
    wsignals.write_lease(dog.config, 5, BOOT, None)
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert off >= 300


def test_unreadable_tags_count_as_activity_and_only_the_ttl_stops(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), ttl_hours=3, tags=lambda m: None)
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert 180 <= off <= 181.5
    assert rec.syncs()[-1] <= off  # a sync attempt came first
    problems = wstate.State.load(dog.state_path).last_decision["problems"]
    assert "instance tags unreadable (metadata service: HTTP 500)" in problems


def test_unparseable_lease_tag_keeps_the_node_until_the_ttl_only(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(), ttl_hours=3, tags=lambda m: {"gpufleet:keep-alive-until": "soon"}
    )
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert 180 <= off <= 181.5


def test_far_future_lease_tag_is_ignored_and_the_idle_rules_decide(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(), tags=lambda m: {"gpufleet:keep-alive-until": "2099-01-01T00:00:00Z"}
    )
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert off < 60


def test_without_a_tag_reader_the_node_is_kept_until_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), ttl_hours=2)
    dog.tags = None
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    assert off is not None
    assert 120 <= off <= 121.5


# ------------------------------------------------- scratch that cannot be saved: no power-off


def test_failed_sync_refuses_the_power_off_until_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False, ttl_hours=4)
    off = run_until_poweroff(dog, probe, rec, 8 * 60)
    syncs = rec.syncs()
    assert syncs[0] == pytest.approx(46, abs=1)  # the idle stop was due here...
    assert off is not None
    assert 240 <= off <= 241.5  # ...and refused every run until the hard TTL
    assert len(syncs) > 150  # retried every run meanwhile
    assert syncs[-1] <= off  # the TTL power-off came after one more bounded attempt
    assert len(rec.warnings) == 1  # the users on the node were told once
    assert "REFUSING to power off: 2 checkpoint file(s)" in rec.warnings[0]
    last = wstate.State.load(dog.state_path).last_decision
    assert "NOT saved" in last["unsaved_at_ttl"]


def test_refusal_is_in_the_status_and_the_published_unsynced_count(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False)
    assert run_until_poweroff(dog, probe, rec, 70) is None
    state = wstate.State.load(dog.state_path)
    assert state.refused_since
    assert state.last_decision["refused"].startswith("REFUSING to power off")
    assert all(p["unsynced"] == 2 for p in rec.published)


def test_sync_that_recovers_saves_then_powers_off(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False)
    assert run_until_poweroff(dog, probe, rec, 90) is None
    dog.syncer.ok = True
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert off <= 91.5
    assert dog.syncer.files == 0
    assert not wstate.State.load(dog.state_path).refused_since


def test_persistent_scratch_disk_does_not_hold_the_power_off(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False, scratch_kind="disk")
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert off < 50  # the disk survives the stop: nothing is lost by powering off


def test_ttl_disabled_and_scratch_unsaved_means_no_power_off_ever(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False, ttl_hours=0)
    assert run_until_poweroff(dog, probe, rec, 13 * 60) is None  # past every default TTL
    assert "hard TTL" not in wstate.State.load(dog.state_path).last_decision["refused"]


def test_config_reports_every_missing_field_at_once(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps({"provider": "gcp"}))
    with pytest.raises(ValueError) as exc:
        wconfig.Config.load(path, node_info=tmp_path / "absent.json")
    text = str(exc.value)
    for word in ("'region'", "'stack'", "'node'", "aws or alicloud"):
        assert word in text


def test_config_reads_the_first_boot_node_info_under_the_watchdog_config(tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    node.write_text(
        json.dumps(
            {
                "stack": "t4",
                "provider": "aws",
                "region": "us-east-1",
                "node": "t4-0",
                "role": "head",
                "tier": "t4x1",
                "scratch": {"path": "/mnt/scratch", "kind": "disk"},
                "idle_minutes": 30,
                "gpu_model": "T4",
            }
        )
    )
    cfg = tmp_path / "watchdog.json"
    cfg.write_text(json.dumps({"bucket": "b", "idle_minutes": 45}))
    config = wconfig.Config.load(cfg, node_info=node)
    assert (config.scratch_path, config.role, config.bucket) == ("/mnt/scratch", "head", "b")
    assert config.scratch_survives_stop
    assert config.limits().idle_minutes == 45


# ---------------------------------------------------------------- real local servers


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def imds() -> Iterator[tuple[FakeIMDS, str]]:
    fake = FakeIMDS(tags={"managed-by": "gpufleet", "gpufleet:stack": "a100x8"})
    with serve(fake.handler()) as url:
        yield fake, url


def aws(service: str, url: str) -> Any:
    return boto3.client(service, endpoint_url=url, region_name="us-east-1")


def fresh_bucket(moto: str, name: str) -> str:
    s3 = aws("s3", moto)
    s3.create_bucket(Bucket=name)
    return name


def write_checkpoints(scratch: Path) -> dict[str, bytes]:
    ckpt = scratch / "checkpoints"
    (ckpt / "step-100").mkdir(parents=True, exist_ok=True)
    files = {"step-100/model.pt": b"weights" * 1000, "latest": b"step-100"}
    for rel, data in files.items():
        (ckpt / rel).write_bytes(data)
    return files


def real_dog(
    tmp_path: Path, url: str, creds: Any, **config: Any
) -> tuple[Any, FakeProbe, Recorder]:
    """A simulated-clock node whose syncer is the real one, talking to ``url``."""
    dog, probe, rec = make_dog(tmp_path, Timeline(), storage_endpoint_url=url, **config)
    syncer = wscratch.ScratchSyncer(dog.config, creds, retry_sleep=lambda s: None)
    dog.syncer = RecordingSyncer(syncer, probe, rec)
    return dog, probe, rec


def keys_in(moto: str, bucket: str) -> list[str]:
    listed = aws("s3", moto).list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def env_creds() -> dict[str, str]:
    return {"access_key_id": "testing", "secret": "testing", "token": ""}


@pytest.mark.integration
def test_pre_stop_sync_lands_checkpoints_in_the_bucket_before_power_off(
    tmp_path: Path, moto: str
) -> None:
    bucket = fresh_bucket(moto, "gpufleet-sync-ok")
    dog, probe, rec = real_dog(tmp_path, moto, env_creds, bucket=bucket)
    files = write_checkpoints(Path(dog.config.scratch_path))
    off = run_until_poweroff(dog, probe, rec, 120)
    assert off is not None
    assert [e.split()[0] for e, _ in rec.events] == ["sync", "poweroff"]
    assert keys_in(moto, bucket) == sorted(f"checkpoints/a100x8-1/{k}" for k in files)
    body = aws("s3", moto).get_object(Bucket=bucket, Key="checkpoints/a100x8-1/latest")["Body"]
    assert body.read() == b"step-100"


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault",
    ["missing bucket", "sync endpoint refuses connections", "no credentials on the node"],
)
def test_unsaveable_scratch_delays_the_stop_is_reported_and_is_saved_once_possible(
    tmp_path: Path, moto: str, fault: str
) -> None:
    bucket = f"gpufleet-fault-{abs(hash(fault)) % 10**8}"
    url = closed_port() if fault == "sync endpoint refuses connections" else moto
    state = {"creds": fault != "no credentials on the node"}

    def creds() -> dict[str, str] | None:
        return env_creds() if state["creds"] else None

    dog, probe, rec = real_dog(tmp_path, url, creds, bucket=bucket)
    write_checkpoints(Path(dog.config.scratch_path))
    assert run_until_poweroff(dog, probe, rec, 3 * 60) is None  # idle since 31 min
    results = dog.syncer.results
    assert len(results) > 100
    assert not any(r.ok for r in results)
    expected = {
        "missing bucket": "NoSuchBucket",
        "sync endpoint refuses connections": "Connection refused",
        "no credentials on the node": "no credentials for the bucket",
    }[fault]
    assert expected in results[-1].detail
    last = wstate.State.load(dog.state_path).last_decision
    assert last["refused"].startswith("REFUSING to power off: 2 checkpoint file(s)")
    assert expected in last["refused"]
    assert rec.published[-1]["unsynced"] == 2

    # The fault is repaired: the next run saves everything, then powers off.
    fresh_bucket(moto, bucket)
    state["creds"] = True
    dog.syncer.inner = wscratch.ScratchSyncer(
        wd.dataclasses.replace(dog.config, storage_endpoint_url=moto), creds
    )
    off = run_until_poweroff(dog, probe, rec, 4 * 60)
    assert off is not None
    assert len(keys_in(moto, bucket)) == 2


@pytest.mark.integration
def test_ttl_powers_off_only_after_a_bounded_sync_attempt(tmp_path: Path, moto: str) -> None:
    dog, probe, rec = real_dog(
        tmp_path, moto, env_creds, bucket="gpufleet-never-created", ttl_hours=1
    )
    dog.config = wd.dataclasses.replace(dog.config, sync_timeout_s=5)
    write_checkpoints(Path(dog.config.scratch_path))
    off = run_until_poweroff(dog, probe, rec, 3 * 60)
    assert off is not None
    assert 60 <= off <= 61.5
    assert rec.events[-2][0] == "sync 5"  # the attempt, with its bound, right before
    assert rec.events[-1] == ("poweroff", off)


@pytest.mark.integration
def test_sync_uploads_only_what_changed_and_large_files_in_parts(
    tmp_path: Path, moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wsync, "PART_SIZE", wsync.MIN_PART_SIZE)
    bucket = fresh_bucket(moto, "gpufleet-sync-parts")
    config = make_config(tmp_path, bucket=bucket, storage_endpoint_url=moto)
    syncer = wscratch.ScratchSyncer(config, env_creds)
    scratch = Path(config.scratch_path)
    big = bytes(range(256)) * (12 * 1024 * 1024 // 256 + 7)  # 12 MiB + a bit: 3 parts
    (scratch / "checkpoints" / "shard-0.pt").write_bytes(big)
    (scratch / "checkpoints" / "latest").write_text("0")
    assert syncer.unsynced() == 2
    first = syncer.sync(60)
    assert first.ok, first.detail
    assert (first.uploaded, first.unsynced, syncer.unsynced()) == (2, 0, 0)
    got = aws("s3", moto).get_object(Bucket=bucket, Key="checkpoints/a100x8-1/shard-0.pt")
    assert got["Body"].read() == big
    assert got["ETag"].strip('"').endswith("-3")  # a multipart upload of 3 parts

    again = syncer.sync(60)
    assert (again.ok, again.uploaded) == (True, 0)
    (scratch / "checkpoints" / "latest").write_text("1")
    assert syncer.unsynced() == 1
    assert syncer.sync(60).uploaded == 1


def test_sync_record_lives_on_scratch_so_an_erased_store_is_all_unsynced(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    scratch = Path(config.scratch_path)
    write_checkpoints(scratch)
    manifest = wsync.Manifest(scratch / wsync.MANIFEST, BUCKET)
    for f in wsync.local_files(scratch, config.sync_dirs, config.node):
        manifest.files[f.key] = [f.size, f.mtime_ns]
    manifest.save()
    assert wsync.pending(scratch, config.sync_dirs, config.node, BUCKET) == []
    # Another bucket (a redeployed stack) has none of them.
    assert len(wsync.pending(scratch, config.sync_dirs, config.node, "other")) == 2
    (scratch / wsync.MANIFEST).write_text("{garbage")
    assert len(wsync.pending(scratch, config.sync_dirs, config.node, BUCKET)) == 2


@pytest.mark.integration
def test_check_sync_proves_the_bucket_is_writable_and_names_a_missing_one(
    tmp_path: Path, moto: str
) -> None:
    bucket = fresh_bucket(moto, "gpufleet-check")
    ok = wscratch.ScratchSyncer(
        make_config(tmp_path, bucket=bucket, storage_endpoint_url=moto), env_creds
    )
    assert ok.check() == f"wrote and read back s3://{bucket}/.gpufleet/sync-check/a100x8-1"
    missing = wscratch.ScratchSyncer(
        make_config(tmp_path, bucket="gpufleet-absent", storage_endpoint_url=moto), env_creds
    )
    with pytest.raises(wsync.StoreError, match="NoSuchBucket"):
        missing.check()
    with pytest.raises(wsync.StoreError, match="no bucket configured"):
        wscratch.ScratchSyncer(make_config(tmp_path, bucket=""), env_creds).check()


def test_bucket_urls_are_virtual_hosted_on_both_clouds_and_path_style_on_an_override() -> None:
    def creds() -> None:
        return None

    aws_store = wsync.Store.for_node(
        endpoint=aws_node.AwsNode("us-east-1").bucket_endpoint(),
        region="us-east-1",
        bucket="b",
        credentials=creds,
    )
    want = "https://b.s3.us-east-1.amazonaws.com/checkpoints/n/a%20b"
    assert aws_store.url("checkpoints/n/a b") == want
    oss = wsync.Store.for_node(
        endpoint=alicloud_node.AlicloudNode("cn-beijing").bucket_endpoint(),
        region="cn-beijing",
        bucket="b",
        credentials=creds,
    )
    assert oss.url("k") == "https://b.s3.oss-cn-beijing-internal.aliyuncs.com/k"
    local = wsync.Store.for_node(
        endpoint=aws_node.AwsNode("r").bucket_endpoint(),
        region="r",
        bucket="b",
        credentials=creds,
        endpoint_url="http://127.0.0.1:1/",
    )
    assert local.url("k", "uploads=") == "http://127.0.0.1:1/b/k?uploads="


# ---------------------------------------------------------------- tags and metadata


def aws_tags(metadata_url: str) -> dict[str, str]:
    def no_credentials() -> None:
        raise AssertionError("IMDS tags need no credentials")

    return dict(
        aws_node.AwsNode("us-east-1", metadata_url=metadata_url).instance_tags("", no_credentials)
    )


@pytest.mark.integration
def test_aws_tags_come_from_imds_with_a_session_token(imds: tuple[FakeIMDS, str]) -> None:
    fake, url = imds
    fake.tags = {"gpufleet:protected": "true", "gpufleet:keep-alive-until": "2026-03-01T12:00:00Z"}
    assert aws_tags(url) == fake.tags
    assert fake.tokens >= 1


@pytest.mark.integration
def test_aws_tags_not_enabled_in_imds_are_unreadable_not_empty(imds: tuple[FakeIMDS, str]) -> None:
    fake, url = imds
    fake.tags = None
    with pytest.raises(nodebase.TagsUnreadable, match="InstanceMetadataTags"):
        aws_tags(url)
    fake.tags, fake.down = {"a": "b"}, True
    with pytest.raises(nodebase.TagsUnreadable, match="metadata service"):
        aws_tags(url)
    with pytest.raises(nodebase.TagsUnreadable):
        aws_tags(closed_port())


@pytest.mark.integration
def test_alicloud_metadata_uses_its_hardened_mode_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)  # the RAM role's, then
    fake = FakeIMDS(provider="alicloud")
    with serve(fake.handler()) as url:
        cloud = alicloud_node.AlicloudNode("cn-beijing", metadata_url=url)
        assert cloud.instance_id() == INSTANCE_ID
        assert cloud.credentials() == {
            "access_key_id": "ak",
            "secret": "secret",
            "token": "st",
        }
    assert fake.tokens >= 2


@pytest.mark.integration
def test_alicloud_tags_come_from_list_tag_resources_signed_as_the_sdk_signs(tmp_path: Path) -> None:
    ecs = FakeEcs(tags={INSTANCE_ID: {"gpufleet:protected": "true", "gpufleet:stack": "s"}})
    with serve(ecs.handler()) as url:
        config = make_config(tmp_path, provider="alicloud", region="cn-beijing", endpoint_url=url)
        creds = {"access_key_id": "ak", "secret": "secret", "token": "st"}
        cloud = wconfig.cloud_for(config)
        tags = cloud.instance_tags(INSTANCE_ID, lambda: creds)
        assert tags == {"gpufleet:protected": "true", "gpufleet:stack": "s"}
        assert ecs.bad_signatures == 0
        call = ecs.calls[-1]
        assert (call["Action"], call["ResourceType"], call["SecurityToken"]) == (
            "ListTagResources",
            "instance",
            "st",
        )
        ecs.fail = 503
        with pytest.raises(nodebase.TagsUnreadable, match="HTTP 503"):
            cloud.instance_tags(INSTANCE_ID, lambda: creds)
        with pytest.raises(nodebase.TagsUnreadable, match="no credentials"):
            cloud.instance_tags(INSTANCE_ID, lambda: None)


def test_alicloud_node_role_may_list_tags_so_the_watchdog_can_read_its_own() -> None:
    from infra.clouds.alicloud.program import node_policy

    doc = json.loads(node_policy("gpufleet-s-abc", "s"))
    allows = [st for st in doc["Statement"] if st["Effect"] == "Allow"]
    assert any("ecs:ListTagResources" in st["Action"] for st in allows)
    denies = [st for st in doc["Statement"] if st["Effect"] == "Deny"]
    assert not any("ecs:ListTagResources" in st["Action"] for st in denies)


def test_the_fakes_list_tag_resources_answer_is_what_the_official_sdk_parses() -> None:
    from alibabacloud_ecs20140526 import models

    answer = {
        "RequestId": "r",
        "NextToken": "",
        "TagResources": {
            "TagResource": [
                {"ResourceId": "i-1", "ResourceType": "instance", "TagKey": "k", "TagValue": "v"}
            ]
        },
    }
    body = models.ListTagResourcesResponseBody().from_map(answer)
    item = body.tag_resources.tag_resource[0]
    assert (item.resource_id, item.tag_key, item.tag_value) == ("i-1", "k", "v")


@pytest.mark.integration
def test_spot_interruption_notice_syncs_scratch_at_once_and_only_once(
    tmp_path: Path, imds: tuple[FakeIMDS, str]
) -> None:
    fake, url = imds
    dog, _probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 100.0))
    dog.cloud = aws_node.AwsNode("us-east-1", metadata_url=url)
    dog.run_once()
    assert not rec.syncs()
    fake.notice = json.dumps({"action": "stop", "time": "2026-03-01T08:40:00Z"})
    dog.run_once()
    dog.run_once()
    assert len(rec.syncs()) == 1  # at once, and not again for the same notice
    assert rec.events[0][0] == "sync 90"  # bounded well inside the two-minute warning
    assert not rec.poweroffs()  # busy: no stop
    assert fake.tokens > 0  # IMDSv2: every read carried a session token


@pytest.mark.integration
def test_heartbeat_datapoints_carry_the_services_time_not_the_nodes_clock(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, imds_url = imds
    fake.instance_id = "i-0heartbeat0clock0"  # its own datapoints only (moto's store is shared)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")  # credentials come from the instance role
    config = make_config(tmp_path, endpoint_url=moto, metadata_url=imds_url)
    cloud = wconfig.cloud_for(config)
    instance_id = cloud.instance_id()
    assert instance_id == fake.instance_id
    publisher = wmetrics.MetricsPublisher(cloud, instance_id, cloud.credentials)
    real_now = datetime.now(UTC)
    node_clock = real_now - timedelta(minutes=12)  # a node 12 minutes slow
    publisher.publish(at=node_clock, gpu_util=91.0, gpu_mem=55.0, unsynced=3)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    cw = aws("cloudwatch", moto)
    dims = [{"Name": "InstanceId", "Value": instance_id}]
    beats = cw.get_metric_statistics(
        Namespace="gpufleet",
        MetricName="Heartbeat",
        Dimensions=dims,
        StartTime=real_now - timedelta(minutes=30),
        EndTime=real_now + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )["Datapoints"]
    assert len(beats) == 1
    stamp = beats[0]["Timestamp"]
    assert abs((stamp - real_now).total_seconds()) < 120  # received now, not 12 min ago
    assert beats[0]["Maximum"] == float(int(node_clock.timestamp()))  # the skew stays visible
    unsynced = cw.get_metric_statistics(
        Namespace="gpufleet",
        MetricName="UnsyncedCheckpointFiles",
        Dimensions=dims,
        StartTime=real_now - timedelta(minutes=30),
        EndTime=real_now + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )["Datapoints"]
    assert unsynced[0]["Maximum"] == 3.0

    from infra.clouds.aws.reaper import AwsCloud

    seen = AwsCloud("us-east-1", endpoint_url=moto).metrics(
        [instance_id], start=real_now - timedelta(minutes=25), end=real_now + timedelta(minutes=1)
    )[instance_id]
    assert seen.error is None
    assert seen.max_gpu_util == 91.0
    assert seen.last_heartbeat is not None


@pytest.mark.integration
def test_alicloud_metrics_carry_no_node_time_and_are_signed_as_the_sdk_signs(
    tmp_path: Path,
) -> None:
    ecs = FakeEcs()
    with serve(ecs.handler()) as url:
        config = make_config(tmp_path, provider="alicloud", region="cn-beijing", endpoint_url=url)
        creds = {"access_key_id": "ak", "secret": "secret", "token": "st"}
        publisher = wmetrics.MetricsPublisher(wconfig.cloud_for(config), INSTANCE_ID, lambda: creds)
        publisher.publish(at=BOOT, gpu_util=50.0, gpu_mem=None, unsynced=0)
    assert ecs.bad_signatures == 0
    sent = ecs.metrics[0]
    names = {v for k, v in sent.items() if k.endswith(".MetricName")}
    assert names == {"Heartbeat", "GPUUtilization", "UnsyncedCheckpointFiles"}
    assert not [k for k in sent if k.endswith(".Time")]


def test_sigv4_matches_botocore_for_the_same_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = "https://monitoring.us-east-1.amazonaws.com/"
    body = b"Action=PutMetricData&Version=2010-08-01&Namespace=gpufleet"
    when = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    ours = nodebase.sigv4_headers(
        method="POST",
        url=url,
        body=body,
        region="us-east-1",
        service="monitoring",
        access_key_id="AKIDEXAMPLE",
        secret="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        now=when,
    )
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={
            "content-type": ours["content-type"],
            "x-amz-content-sha256": ours["x-amz-content-sha256"],
        },
    )
    signer = SigV4Auth(
        Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        "monitoring",
        "us-east-1",
    )
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: when.replace(tzinfo=None))
    signer.add_auth(request)
    assert ours["Authorization"] == request.headers["Authorization"]


def test_s3_sigv4_matches_botocores_s3_signer_for_a_part_upload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    store = wsync.Store("bkt", "eu-west-1", lambda: None, "https://s3.eu-west-1.amazonaws.com")
    url = store.url("checkpoints/node-0/step 1/model+x.pt", "partNumber=2&uploadId=a%2Fb")
    body = b"part-bytes"
    when = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    md5 = wsync.content_md5(body)
    ours = wsync.sigv4_headers(
        method="PUT",
        url=url,
        body=body,
        region="eu-west-1",
        service="s3",
        access_key_id="AKIDEXAMPLE",
        secret="secret",
        token="session",
        now=when,
        content_type="application/octet-stream",
        extra={"Content-MD5": md5},
    )
    request = AWSRequest(
        method="PUT",
        url=url,
        data=body,
        headers={
            "content-type": "application/octet-stream",
            "x-amz-content-sha256": ours["x-amz-content-sha256"],
            "content-md5": md5,
        },
    )
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: when.replace(tzinfo=None))
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret", "session"), "s3", "eu-west-1").add_auth(
        request
    )
    assert ours["Authorization"] == request.headers["Authorization"]


def test_alicloud_rpc_signature_is_what_the_official_sdk_computes() -> None:
    from alibabacloud_tea_openapi.utils import Utils

    query = alicloud_node.alicloud_rpc_query(
        {"Action": "PutCustomMetric", "Version": "2019-01-01", "MetricList.1.Values": '{"v": 1}'},
        access_key_id="id",
        secret="secret",
        token="sts/token+x",
        now=datetime(2026, 3, 1, tzinfo=UTC),
    )
    params = dict(urllib.parse.parse_qsl(query))
    signature = params.pop("Signature")
    assert signature == Utils.get_rpcsignature(params, "POST", "secret")
    assert signature != Utils.get_rpcsignature(params, "POST", "other")
    assert params["SignatureMethod"] == "HMAC-SHA1"


@pytest.mark.integration
def test_lease_writes_the_file_and_tags_the_instance_for_the_reaper(
    tmp_path: Path, moto: str
) -> None:
    ec2 = aws("ec2", moto)
    iid = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    config = make_config(tmp_path, endpoint_url=moto)
    creds = {"access_key_id": "testing", "secret": "testing"}
    out = wsignals.write_lease(
        config,
        3,
        BOOT,
        lambda until: wconfig.cloud_for(config).write_tag(
            iid, wd.names.KEEP_ALIVE_UNTIL, until, creds
        ),
    )
    assert out["tag"] == "set"
    assert out["lease_until"] == "2026-03-01T11:00:00Z"
    assert (Path(config.state_dir) / wsignals.LEASE_FILE).read_text().strip() == out["lease_until"]
    tags = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["Tags"]
    assert {"Key": "gpufleet:keep-alive-until", "Value": out["lease_until"]} in tags
    with pytest.raises(ValueError, match="at most 336"):
        wsignals.write_lease(config, 400, BOOT, None)


def test_watchdog_cli_rejects_a_bad_config_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "watchdog.json"
    config.write_text("{not json")
    assert wd.main(["status", "--config", str(config)]) == 2


def _failing(errors: list[BaseException]) -> tuple[Callable[[], None], list[int]]:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        if errors:
            raise errors.pop(0)

    return call, calls


def test_lease_tag_write_is_tried_again_when_the_api_times_out_or_throttles() -> None:
    import urllib.error

    throttled = urllib.error.HTTPError("http://127.0.0.1/", 503, "SlowDown", {}, None)  # type: ignore[arg-type]
    call, calls = _failing([TimeoutError("timed out"), throttled])
    slept: list[float] = []
    nodebase.retry_idempotent(call, attempts=3, sleep=slept.append)
    assert len(calls) == 3 and slept == [2.0, 4.0]


def test_lease_tag_write_stops_at_a_refusal_and_after_its_last_attempt() -> None:
    import urllib.error

    refused = urllib.error.HTTPError("http://127.0.0.1/", 403, "Forbidden", {}, None)  # type: ignore[arg-type]
    call, calls = _failing([refused])
    with pytest.raises(urllib.error.HTTPError):
        nodebase.retry_idempotent(call, attempts=3, sleep=lambda _s: None)
    assert len(calls) == 1
    call, calls = _failing([TimeoutError("t1"), TimeoutError("t2"), TimeoutError("t3")])
    with pytest.raises(TimeoutError, match="t3"):
        nodebase.retry_idempotent(call, attempts=3, sleep=lambda _s: None)
    assert len(calls) == 3
