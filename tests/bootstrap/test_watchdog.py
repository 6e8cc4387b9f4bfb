"""The node watchdog: its loop on a simulated clock, the pre-stop sync to a moto S3 bucket,
spot notices from a fake metadata service, metrics into moto CloudWatch read back by the
reaper, the systemd units, and the file running alone with nothing but the stdlib."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from bootstrap.remote import watchdog as wd
from infra.reaper import core
from infra.reaper.policy import KEEP, STOP, UTC

REMOTE = Path(wd.__file__).resolve().parent
BOOT = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


# ---------------------------------------------------------------- parsers (recorded outputs)


def test_nvidia_smi_query_gives_per_gpu_utilization_and_the_fullest_memory() -> None:
    out = "87, 30000, 81559\n3, 100, 81559\n"
    utils, mem = wd.parse_gpu_query(out) or ((), 0.0)
    assert utils == (87.0, 3.0)
    assert mem == pytest.approx(36.78, abs=0.01)


@pytest.mark.parametrize("out", [None, "", "[N/A], 100, 81559", "garbage"])
def test_unreadable_nvidia_smi_output_is_none(out: str | None) -> None:
    assert wd.parse_gpu_query(out) is None


def test_compute_apps_count_processes_holding_gpu_memory() -> None:
    assert wd.parse_compute_apps("1234, 30000 MiB\n5678, 20 MiB\n") == 2
    assert wd.parse_compute_apps("") == 0
    assert wd.parse_compute_apps(None) is None


def test_ss_counts_established_connections_to_port_22_only() -> None:
    out = (
        "0 0 10.0.1.5:22 203.0.113.9:53122\n"
        "0 0 10.0.1.5:22 203.0.113.9:53188\n"
        "0 0 10.0.1.5:40112 52.94.1.1:443\n"
        "0 0 [::ffff:10.0.1.5]:22 [::ffff:1.2.3.4]:1022\n"
    )
    assert wd.parse_ss(out) == 3
    assert wd.parse_who("ubuntu pts/0 2026-03-01 08:00 (203.0.113.9)\n") == 1


def test_metric_names_match_what_the_reaper_reads() -> None:
    assert (wd.NAMESPACE, wd.METRIC_GPU_UTIL, wd.METRIC_HEARTBEAT, wd.DIMENSION) == (
        core.NAMESPACE,
        core.METRIC_GPU_UTIL,
        core.METRIC_HEARTBEAT,
        core.DIMENSION,
    )
    assert wd.METRIC_GPU_MEM == core.METRIC_GPU_MEM


def test_the_policy_next_to_the_watchdog_is_the_reapers_policy() -> None:
    shipped = (REMOTE / "watchdog_policy.py").read_bytes()
    assert shipped == (REMOTE.parents[1] / "infra" / "reaper" / "policy.py").read_bytes()


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


@dataclass
class FakeUploader:
    probe: FakeProbe
    recorder: Recorder
    ok: bool = True

    def sync(self, source: Path, dest: str, timeout_s: float) -> wd.SyncResult:
        self.recorder.events.append((f"sync {dest}", self.probe.minutes))
        return wd.SyncResult(self.ok, "fake sync" if self.ok else "bucket unreachable")


@dataclass
class FakePublisher:
    recorder: Recorder

    def publish(self, *, at: datetime, gpu_util: float | None, gpu_mem: float | None) -> None:
        self.recorder.published.append({"at": at, "util": gpu_util, "mem": gpu_mem})


def make_config(tmp_path: Path, **kw: Any) -> wd.Config:
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True, exist_ok=True)
    base: dict[str, Any] = {
        "provider": "aws",
        "region": "us-east-1",
        "stack": "a100x8",
        "node": "a100x8-1",
        "role": "worker",
        "tier": "a100x8",
        "bucket": "gpufleet-a100x8-test",
        "scratch_path": str(scratch),
        "state_dir": str(tmp_path / "state"),
    }
    base.update(kw)
    return wd.Config(**base)


def make_dog(
    tmp_path: Path, timeline: Timeline, *, sync_ok: bool = True, **config: Any
) -> tuple[wd.Watchdog, FakeProbe, Recorder]:
    probe = FakeProbe(timeline)
    rec = Recorder()
    dog = wd.Watchdog(
        config=make_config(tmp_path, **config),
        probe=probe,
        uploader=FakeUploader(probe, rec, ok=sync_ok),
        publisher=FakePublisher(rec),
        metadata=None,
        poweroff=lambda: rec.events.append(("poweroff", probe.minutes)),
        warn=rec.warnings.append,
    )
    return dog, probe, rec


def run_until_poweroff(
    dog: wd.Watchdog, probe: FakeProbe, rec: Recorder, until_min: float
) -> float | None:
    """Run the timer's loop (a run, then 15 s idle) until power-off or ``until_min``."""
    while probe.minutes < until_min:
        dog.run_once()
        if any(e == "poweroff" for e, _ in rec.events):
            return next(m for e, m in rec.events if e == "poweroff")
        probe.sleep(15)
    return None


def test_busy_then_idle_node_syncs_then_powers_off_after_the_idle_limit(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 95.0 if m < 60 else 0.0))
    off = run_until_poweroff(dog, probe, rec, 200)
    # Busy until 60 min; active 5 more (window); idle limit 15 for A100 tiers -> ~80 min.
    assert off is not None
    assert 79.5 <= off <= 81.5
    names = [e for e, _ in rec.events]
    assert names[-2].startswith("sync s3://gpufleet-a100x8-test/checkpoints/a100x8-1/")
    assert names[-1] == "poweroff"
    # Every run published a heartbeat and the busiest GPU's utilization.
    assert len(rec.published) >= 45  # one per run: ~49 minutes of runs, ~1 run a minute
    assert rec.published[0]["util"] == 95.0
    assert rec.published[-1]["util"] == 0.0


def test_cheap_tier_waits_30_idle_minutes(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), tier="t4x1")
    off = run_until_poweroff(dog, probe, rec, 200)
    # History starts at 31 min (first run): 30 idle minutes from there.
    assert off is not None
    assert 61 <= off <= 62.5


def test_ssh_session_keeps_an_idle_gpu_alive(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(ssh=lambda m: 1 if m < 120 else 0))
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert 134.5 <= off <= 136.5


def test_lease_file_keeps_an_idle_node_until_it_expires(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline())
    state = Path(dog.config.state_dir)
    state.mkdir(parents=True)
    (state / wd.LEASE_FILE).write_text((BOOT + timedelta(minutes=100)).isoformat())
    off = run_until_poweroff(dog, probe, rec, 300)
    assert off is not None
    # The lease hides nothing from the idle clock: it has run all along, so the stop comes
    # at the first run after the lease ends.
    assert 100 <= off <= 101.5


def test_stalled_job_is_warned_once_then_stopped(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 1.0, procs=lambda m: 1))
    off = run_until_poweroff(dog, probe, rec, 300)
    assert len(rec.warnings) == 1
    assert "stalled job" in rec.warnings[0]
    assert off is not None
    assert 100.5 <= off <= 102.5  # 60 min stall + 10 min after the warning, from 31 min


def test_unreadable_nvidia_smi_never_powers_off_before_the_ttl(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, Timeline(util=lambda m: None, procs=lambda m: None), ttl_hours=3
    )
    off = run_until_poweroff(dog, probe, rec, 400)
    assert off is not None
    assert 180 <= off <= 181.5  # only the hard TTL stops it


def test_failed_sync_postpones_the_power_off_for_a_bounded_time(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), sync_ok=False)
    off = run_until_poweroff(dog, probe, rec, 300)
    syncs = [m for e, m in rec.events if e.startswith("sync")]
    assert off is not None
    assert syncs[0] == pytest.approx(46, abs=1)
    assert off - syncs[0] == pytest.approx(30, abs=1.5)  # sync_failure_grace_minutes
    assert len(syncs) > 10  # retried every run meanwhile


def test_dry_run_decides_and_syncs_but_never_powers_off(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, Timeline(), dry_run=True)
    assert run_until_poweroff(dog, probe, rec, 80) is None
    assert any(e.startswith("sync") for e, _ in rec.events)


def test_history_survives_between_runs_and_is_pruned(tmp_path: Path) -> None:
    dog, probe, _ = make_dog(tmp_path, Timeline(ssh=lambda m: 1))
    for _ in range(200):
        dog.run_once()
        probe.sleep(15)
    state = wd.State.load(dog.state_path)
    span = (state.samples[-1].at - state.samples[0].at).total_seconds() / 60
    assert span <= 80 + 1  # stall window (70) + 10 min margin
    assert state.last_decision["action"] == KEEP


def test_status_reports_the_idle_clock_and_what_keeps_the_node(tmp_path: Path) -> None:
    dog, probe, _ = make_dog(tmp_path, Timeline())
    for _ in range(5):
        dog.run_once()
        probe.sleep(15)
    decision, _state = dog.status()
    assert decision.action == KEEP
    assert decision.idle_minutes is not None
    assert decision.idle_minutes > 4
    assert "idle" in decision.reason


def test_config_reports_every_missing_field_at_once(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps({"provider": "gcp"}))
    with pytest.raises(ValueError) as exc:
        wd.Config.load(path, node_info=tmp_path / "absent.json")
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
                "scratch": {"path": "/mnt/scratch"},
                "idle_minutes": 30,
                "gpu_model": "T4",
            }
        )
    )
    cfg = tmp_path / "watchdog.json"
    cfg.write_text(json.dumps({"bucket": "b", "idle_minutes": 45}))
    config = wd.Config.load(cfg, node_info=node)
    assert (config.scratch_path, config.role, config.bucket) == ("/mnt/scratch", "head", "b")
    assert config.limits().idle_minutes == 45


# ---------------------------------------------------------------- real local servers


@pytest.fixture(scope="module")
def moto(request: pytest.FixtureRequest) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws(service: str, url: str) -> Any:
    return boto3.client(service, endpoint_url=url, region_name="us-east-1")


@dataclass
class Boto3Uploader:
    """The test's uploader: boto3 against moto S3 (the node uses ``aws s3 sync``)."""

    url: str

    def sync(self, source: Path, dest: str, timeout_s: float) -> wd.SyncResult:
        parsed = urllib.parse.urlparse(dest)
        s3 = aws("s3", self.url)
        n = 0
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            key = parsed.path.lstrip("/") + str(path.relative_to(source))
            s3.upload_file(str(path), parsed.netloc, key)
            n += 1
        return wd.SyncResult(True, f"{n} files")


@pytest.mark.integration
def test_pre_stop_sync_lands_checkpoints_in_the_bucket_before_power_off(
    tmp_path: Path, moto: str
) -> None:
    aws("s3", moto).create_bucket(Bucket="gpufleet-a100x8-test")
    dog, probe, _ = make_dog(tmp_path, Timeline())
    ckpt = Path(dog.config.scratch_path) / "checkpoints"
    (ckpt / "step-100").mkdir()
    (ckpt / "step-100" / "model.pt").write_bytes(b"weights" * 1000)
    (ckpt / "latest").write_text("step-100")
    order: list[str] = []
    uploader = Boto3Uploader(moto)

    class Recording:
        def sync(self, source: Path, dest: str, timeout_s: float) -> wd.SyncResult:
            result = uploader.sync(source, dest, timeout_s)
            order.append("sync")
            return result

    dog.uploader = Recording()
    dog.poweroff = lambda: order.append("poweroff")
    while "poweroff" not in order and probe.minutes < 120:
        dog.run_once()
        probe.sleep(15)
    assert order == ["sync", "poweroff"]
    listed = aws("s3", moto).list_objects_v2(Bucket="gpufleet-a100x8-test")["Contents"]
    keys = sorted(o["Key"] for o in listed)
    assert keys == [
        "checkpoints/a100x8-1/latest",
        "checkpoints/a100x8-1/step-100/model.pt",
    ]


class FakeIMDS:
    """AWS IMDSv2 (token, instance-id, spot/instance-action, role credentials) on loopback."""

    def __init__(self) -> None:
        self.notice: str | None = None
        self.tokens = 0

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                imds.tokens += 1
                self._send(200, "token-1")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                    return self._send(401, "")
                routes = {
                    "/latest/meta-data/instance-id": "i-0123456789abcdef0",
                    "/latest/meta-data/iam/security-credentials/": "gpufleet-node",
                    "/latest/meta-data/iam/security-credentials/gpufleet-node": json.dumps(
                        {"AccessKeyId": "testing", "SecretAccessKey": "testing", "Token": "t"}
                    ),
                }
                if self.path == "/latest/meta-data/spot/instance-action" and imds.notice:
                    return self._send(200, imds.notice)
                if self.path in routes:
                    return self._send(200, routes[self.path])
                return self._send(404, "")

        return Handler


@pytest.fixture
def imds() -> Iterator[tuple[FakeIMDS, str]]:
    fake = FakeIMDS()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield fake, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_spot_interruption_notice_syncs_scratch_at_once_and_only_once(
    tmp_path: Path, imds: tuple[FakeIMDS, str]
) -> None:
    fake, url = imds
    dog, probe, rec = make_dog(tmp_path, Timeline(util=lambda m: 100.0))
    dog.metadata = wd.Metadata("aws", url)
    dog.run_once()
    assert not [e for e, _ in rec.events if e.startswith("sync")]
    fake.notice = json.dumps({"action": "stop", "time": "2026-03-01T08:40:00Z"})
    dog.run_once()
    dog.run_once()
    syncs = [e for e, _ in rec.events if e.startswith("sync")]
    assert len(syncs) == 1  # at once, and not again for the same notice
    assert ("poweroff", pytest.approx(probe.minutes, abs=5)) not in rec.events  # busy: no stop
    assert fake.tokens > 0  # IMDSv2: every read carried a session token


@pytest.mark.integration
def test_published_metrics_are_what_the_reaper_reads(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, imds_url = imds
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")  # credentials come from the instance role
    config = make_config(tmp_path, endpoint_url=moto, metadata_url=imds_url)
    metadata = wd.Metadata("aws", imds_url)
    instance_id = metadata.instance_id()
    assert instance_id == "i-0123456789abcdef0"
    publisher = wd.MetricsPublisher(config, instance_id, wd.env_or_role_credentials(metadata))
    now = datetime.now(UTC).replace(microsecond=0)
    publisher.publish(at=now - timedelta(minutes=3), gpu_util=91.0, gpu_mem=55.0)
    publisher.publish(at=now - timedelta(minutes=1), gpu_util=4.0, gpu_mem=55.0)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    from infra.reaper.aws import AwsCloud

    seen = AwsCloud("us-east-1", endpoint_url=moto).metrics(
        [instance_id], start=now - timedelta(minutes=25), end=now + timedelta(seconds=1)
    )[instance_id]
    assert seen.error is None
    assert seen.max_gpu_util == 91.0
    assert seen.last_heartbeat == now - timedelta(minutes=1)


def test_sigv4_matches_botocore_for_the_same_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = "https://monitoring.us-east-1.amazonaws.com/"
    body = b"Action=PutMetricData&Version=2010-08-01&Namespace=gpufleet"
    when = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    ours = wd.sigv4_headers(
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


def test_alicloud_rpc_signature_verifies_with_the_secret() -> None:
    query = wd.alicloud_rpc_query(
        {"Action": "PutCustomMetric", "Version": "2019-01-01"},
        access_key_id="id",
        secret="secret",
        now=datetime(2026, 3, 1, tzinfo=UTC),
    )
    params = dict(urllib.parse.parse_qsl(query))
    signature = params.pop("Signature")

    def enc(v: str) -> str:
        return urllib.parse.quote(v, safe="-_.~")

    canonical = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(params.items()))
    to_sign = f"POST&{enc('/')}&{enc(canonical)}"
    expected = base64.b64encode(hmac.new(b"secret&", to_sign.encode(), hashlib.sha1).digest())
    assert signature == expected.decode()
    assert params["SignatureMethod"] == "HMAC-SHA1"


# ---------------------------------------------------------------- on its own, and systemd


def test_watchdog_runs_alone_with_only_the_standard_library(tmp_path: Path) -> None:
    node_dir = tmp_path / "opt"
    node_dir.mkdir()
    shutil.copy(REMOTE / "watchdog.py", node_dir / "watchdog.py")
    shutil.copy(REMOTE / "watchdog_policy.py", node_dir / "watchdog_policy.py")  # follows link
    config = tmp_path / "watchdog.json"
    config.write_text(
        json.dumps(
            {
                "provider": "aws",
                "region": "us-east-1",
                "stack": "s",
                "node": "s-0",
                "tier": "t4x1",
                "state_dir": str(tmp_path / "state"),
                "publish_metrics": False,
                "metadata_url": "http://127.0.0.1:9",
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(node_dir / "watchdog.py"),
            "status",
            "--config",
            str(config),
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["action"] == KEEP
    assert out["idle_limit_minutes"] == 30


def test_watchdog_cli_rejects_a_bad_config_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "watchdog.json"
    config.write_text("{not json")
    assert wd.main(["status", "--config", str(config)]) == 2


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (apt package: systemd)")
    units = [REMOTE / "gpufleet-watchdog.service", REMOTE / "gpufleet-watchdog.timer"]
    for unit in units:
        shutil.copy(unit, tmp_path / unit.name)
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [ln for ln in done.stderr.splitlines() if "gpufleet-watchdog" in ln]
    assert done.returncode == 0, done.stderr
    assert not problems, problems


def test_timer_rearms_after_reboot_and_runs_continuously() -> None:
    timer = (REMOTE / "gpufleet-watchdog.timer").read_text()
    assert "WantedBy=timers.target" in timer
    assert "OnBootSec=" in timer
    assert "OnUnitInactiveSec=15s" in timer
    service = (REMOTE / "gpufleet-watchdog.service").read_text()
    assert "Type=oneshot" in service
    assert "/opt/gpufleet/watchdog.py run" in service


def test_stop_decision_constant_is_shared() -> None:
    assert STOP == "stop"


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
    out = wd.write_lease(
        config,
        3,
        BOOT,
        lambda until: wd.write_lease_tag(config, iid, until, creds),
    )
    assert out["tag"] == "set"
    assert out["lease_until"] == "2026-03-01T11:00:00Z"
    assert (Path(config.state_dir) / wd.LEASE_FILE).read_text().strip() == out["lease_until"]
    tags = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["Tags"]
    assert {"Key": "gpufleet:keep-alive-until", "Value": out["lease_until"]} in tags
    with pytest.raises(ValueError, match="at most 336"):
        wd.write_lease(config, 400, BOOT, None)
