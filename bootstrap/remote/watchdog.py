#!/usr/bin/env python3
"""gpufleet node watchdog: stop this GPU node when it is idle, after saving its scratch.

Runs on the node from a systemd timer (gpufleet-watchdog.timer, every ~minute), as root, with
the system Python (3.10+) and nothing but the standard library and the node's own tools
(nvidia-smi, ss, who, aws/ossutil). The idle rules live in ``watchdog_policy.py`` next to
this file: the same code the cloud reaper runs (infra/reaper/policy.py).

One run:
  1. reads its config (/etc/gpufleet/watchdog.json), the sample history and the lease;
  2. takes a few samples 15 s apart (GPU utilization and compute processes from nvidia-smi,
     SSH sessions and connections from ss/who), checking the spot interruption notice
     before each: a notice saves scratch to the bucket at once;
  3. decides (policy.decide_node), publishes heartbeat + GPU metrics, logs the decision;
  4. on "stop": syncs the checkpoints on scratch to the bucket within a bounded time, then
     powers off (the instance's shutdown behaviour is stop). A sync that fails postpones
     the power-off, for at most ``sync_failure_grace_minutes``: money is bounded too.

    watchdog.py run               one run, as the timer does
    watchdog.py status --json     the idle clock and what keeps the node alive, without acting
    watchdog.py lease --hours N   keep this node N hours: lease file + instance tag
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bootstrap.remote import watchdog_policy as policy
else:
    try:  # on the node: the policy file is installed next to this one
        import watchdog_policy as policy
    except ImportError:  # imported as bootstrap.remote.watchdog from a checkout (tests)
        from bootstrap.remote import watchdog_policy as policy

UTC = policy.UTC
LOG = logging.getLogger("gpufleet-watchdog")

CONFIG_PATH = Path("/etc/gpufleet/watchdog.json")
NODE_INFO_PATH = Path("/etc/gpufleet/node.json")  # written at first boot by the stack
STATE_DIR = Path("/var/lib/gpufleet")
LEASE_FILE = "keep-alive-until"
STATE_FILE = "watchdog-state.json"

# The metric contract the reaper reads (infra/reaper/core.py; tests assert they agree).
NAMESPACE = "gpufleet"
METRIC_GPU_UTIL = "GPUUtilization"
METRIC_GPU_MEM = "GPUMemoryUtilization"
METRIC_HEARTBEAT = "Heartbeat"
DIMENSION = "InstanceId"

AWS_IMDS = "http://169.254.169.254"
ALICLOUD_IMDS = "http://100.100.100.200"


# ---------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    provider: str  # aws | alicloud
    region: str
    stack: str
    node: str
    role: str = "worker"
    tier: str = ""
    instance_type: str = ""
    instance_id: str = ""  # empty: ask the metadata service
    bucket: str = ""
    scratch_path: str = "/scratch"
    sync_dirs: tuple[str, ...] = ("checkpoints",)  # relative to scratch_path
    idle_minutes: float | None = None  # None: the tier default
    ttl_hours: float | None = None  # None: the tier default; 0 = off
    samples_per_run: int = 4
    sample_interval_s: float = 15.0
    sync_timeout_s: float = 600.0
    sync_failure_grace_minutes: float = 30.0
    publish_metrics: bool = True
    dry_run: bool = False  # decide and log, never power off
    endpoint_url: str = ""  # metrics API override (tests)
    metadata_url: str = ""  # metadata service override (tests)
    alicloud_account_id: str = ""
    state_dir: str = str(STATE_DIR)

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
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        problems = [
            f"missing {k!r}" for k in ("provider", "region", "stack", "node") if not data.get(k)
        ]
        if data.get("provider") not in (None, "aws", "alicloud"):
            problems.append(f"provider must be aws or alicloud, got {data['provider']!r}")
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        if "sync_dirs" in data:
            data["sync_dirs"] = tuple(data["sync_dirs"])
        return cls(**data)

    def limits(self) -> policy.Limits:
        ttl = (
            None
            if self.ttl_hours is None
            else ("off" if self.ttl_hours <= 0 else str(self.ttl_hours))
        )
        return policy.resolve_limits(
            tier=self.tier or None,
            instance_type=self.instance_type or None,
            idle_minutes_tag=None if self.idle_minutes is None else str(self.idle_minutes),
            ttl_hours_tag=ttl,
        )


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


def take_sample(probe: Probe) -> tuple[policy.Sample, float | None]:
    gpu = probe.gpu()
    sample = policy.Sample(
        at=probe.now(),
        gpu_util=None if gpu is None else gpu[0],
        gpu_procs=probe.gpu_procs(),
        ssh=probe.ssh(),
    )
    return sample, None if gpu is None else gpu[1]


# ---------------------------------------------------------------------------- metadata


class Metadata:
    """The instance metadata service: instance id and spot interruption notices."""

    def __init__(self, provider: str, base_url: str = "", timeout: float = 2.0) -> None:
        self.provider = provider
        self.base = (base_url or (AWS_IMDS if provider == "aws" else ALICLOUD_IMDS)).rstrip("/")
        self.timeout = timeout

    def _get(self, path: str) -> str | None:
        headers = {}
        if self.provider == "aws":
            token = self._aws_token()
            if token:
                headers["X-aws-ec2-metadata-token"] = token
        request = urllib.request.Request(f"{self.base}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _aws_token(self) -> str | None:
        request = urllib.request.Request(
            f"{self.base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def instance_id(self) -> str | None:
        try:
            return self._get("/latest/meta-data/instance-id")
        except (urllib.error.URLError, OSError):
            return None

    def spot_notice(self) -> str | None:
        """The interruption notice (its time or action document), or None when there is none."""
        path = (
            "/latest/meta-data/spot/instance-action"
            if self.provider == "aws"
            else "/latest/meta-data/instance/spot/termination-time"
        )
        try:
            text = self._get(path)
        except (urllib.error.URLError, OSError):
            return None  # no metadata service: nothing to act on
        return text.strip() if text and text.strip() else None

    def role_credentials(self) -> dict[str, str] | None:
        """Temporary credentials of the instance's role (AWS IAM / Alicloud RAM)."""
        base = (
            "/latest/meta-data/iam/security-credentials/"
            if self.provider == "aws"
            else "/latest/meta-data/ram/security-credentials/"
        )
        try:
            role = (self._get(base) or "").strip().splitlines()
            if not role:
                return None
            doc = json.loads(self._get(base + role[0]) or "{}")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return {
            "access_key_id": doc.get("AccessKeyId", ""),
            "secret": doc.get("SecretAccessKey") or doc.get("AccessKeySecret", ""),
            "token": doc.get("Token") or doc.get("SecurityToken", ""),
        }


# ---------------------------------------------------------------------------- metrics


def sigv4_headers(
    *,
    method: str,
    url: str,
    body: bytes,
    region: str,
    service: str,
    access_key_id: str,
    secret: str,
    token: str = "",
    now: dt.datetime | None = None,
    content_type: str = "application/x-www-form-urlencoded; charset=utf-8",
) -> dict[str, str]:
    """AWS Signature Version 4 headers for one request (docs.aws.amazon.com, "Create a signed
    AWS API request"), so the node needs no SDK."""
    when = (now or dt.datetime.now(UTC)).astimezone(UTC)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = when.strftime("%Y%m%d")
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc
    payload_hash = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    if content_type:
        headers["content-type"] = content_type
    if token:
        headers["x-amz-security-token"] = token
    signed = ";".join(sorted(headers))
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    )
    canonical = "\n".join(
        [
            method,
            urllib.parse.quote(parts.path or "/", safe="/-_.~"),
            canonical_query,
            "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in headers.items() if k != "host"}
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return out


def alicloud_rpc_query(
    params: dict[str, str],
    *,
    access_key_id: str,
    secret: str,
    token: str = "",
    method: str = "POST",
    now: dt.datetime | None = None,
) -> str:
    """Alicloud RPC signature v1 (HMAC-SHA1), as the RPC API reference describes it."""
    import base64

    when = (now or dt.datetime.now(UTC)).astimezone(UTC)
    full = {
        **params,
        "Format": "JSON",
        "AccessKeyId": access_key_id,
        "SignatureMethod": "HMAC-SHA1",
        "SignatureVersion": "1.0",
        "SignatureNonce": uuid.uuid4().hex,
        "Timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if token:
        full["SecurityToken"] = token

    def enc(value: str) -> str:
        return urllib.parse.quote(value, safe="-_.~")

    canonical = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(full.items()))
    to_sign = f"{method}&{enc('/')}&{enc(canonical)}"
    digest = hmac.new(f"{secret}&".encode(), to_sign.encode(), hashlib.sha1).digest()
    full["Signature"] = base64.b64encode(digest).decode()
    return urllib.parse.urlencode(full)


class Publisher(Protocol):
    def publish(
        self, *, at: dt.datetime, gpu_util: float | None, gpu_mem: float | None
    ) -> None: ...


@dataclass
class MetricsPublisher:
    """Heartbeat + GPU metrics to CloudWatch (query API) or CloudMonitor (PutCustomMetric)."""

    config: Config
    instance_id: str
    credentials: Callable[[], dict[str, str] | None]
    timeout: float = 10.0

    def publish(self, *, at: dt.datetime, gpu_util: float | None, gpu_mem: float | None) -> None:
        creds = self.credentials()
        if not creds:
            raise RuntimeError("no credentials for metrics (instance role or environment)")
        values: list[tuple[str, float, str]] = [
            (METRIC_HEARTBEAT, float(int(at.timestamp())), "None")
        ]
        if gpu_util is not None:
            values.append((METRIC_GPU_UTIL, gpu_util, "Percent"))
        if gpu_mem is not None:
            values.append((METRIC_GPU_MEM, gpu_mem, "Percent"))
        if self.config.provider == "aws":
            self._cloudwatch(values, at, creds)
        else:
            self._cloudmonitor(values, at, creds)

    def _cloudwatch(
        self, values: list[tuple[str, float, str]], at: dt.datetime, creds: dict[str, str]
    ) -> None:
        url = self.config.endpoint_url or f"https://monitoring.{self.config.region}.amazonaws.com"
        url = url.rstrip("/") + "/"
        params = {"Action": "PutMetricData", "Version": "2010-08-01", "Namespace": NAMESPACE}
        stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for n, (name, value, unit) in enumerate(values, start=1):
            prefix = f"MetricData.member.{n}"
            params.update(
                {
                    f"{prefix}.MetricName": name,
                    f"{prefix}.Value": repr(value),
                    f"{prefix}.Unit": unit,
                    f"{prefix}.Timestamp": stamp,
                    f"{prefix}.Dimensions.member.1.Name": DIMENSION,
                    f"{prefix}.Dimensions.member.1.Value": self.instance_id,
                }
            )
        body = urllib.parse.urlencode(params).encode()
        headers = sigv4_headers(
            method="POST",
            url=url,
            body=body,
            region=self.config.region,
            service="monitoring",
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        )
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            resp.read()

    def _cloudmonitor(
        self, values: list[tuple[str, float, str]], at: dt.datetime, creds: dict[str, str]
    ) -> None:
        url = self.config.endpoint_url or f"https://metrics.{self.config.region}.aliyuncs.com"
        params = {
            "Action": "PutCustomMetric",
            "Version": "2019-01-01",
            "RegionId": self.config.region,
        }
        for n, (name, value, _unit) in enumerate(values, start=1):
            params.update(
                {
                    f"MetricList.{n}.MetricName": name,
                    f"MetricList.{n}.GroupId": "0",
                    f"MetricList.{n}.Dimensions": json.dumps({"instanceId": self.instance_id}),
                    f"MetricList.{n}.Time": str(int(at.timestamp() * 1000)),
                    f"MetricList.{n}.Type": "0",
                    f"MetricList.{n}.Values": json.dumps({"value": value}),
                }
            )
        body = alicloud_rpc_query(
            params,
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        ).encode()
        request = urllib.request.Request(
            url.rstrip("/") + "/",
            data=body,
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            answer = json.loads(resp.read() or b"{}")
        if str(answer.get("Code", "200")) != "200":
            raise RuntimeError(f"PutCustomMetric: {answer.get('Code')} {answer.get('Message')}")


def write_lease_tag(
    config: Config, instance_id: str, until: str, creds: dict[str, str], timeout: float = 10.0
) -> None:
    """Set the gpufleet:keep-alive-until tag on this instance, so the reaper sees the lease."""
    key = "gpufleet:keep-alive-until"  # infra/reaper/tags.py KEEP_ALIVE_UNTIL
    if config.provider == "aws":
        url = (config.endpoint_url or f"https://ec2.{config.region}.amazonaws.com").rstrip("/")
        url += "/"
        body = urllib.parse.urlencode(
            {
                "Action": "CreateTags",
                "Version": "2016-11-15",
                "ResourceId.1": instance_id,
                "Tag.1.Key": key,
                "Tag.1.Value": until,
            }
        ).encode()
        headers = sigv4_headers(
            method="POST",
            url=url,
            body=body,
            region=config.region,
            service="ec2",
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        )
    else:
        url = (config.endpoint_url or f"https://ecs.{config.region}.aliyuncs.com").rstrip("/")
        url += "/"
        body = alicloud_rpc_query(
            {
                "Action": "TagResources",
                "Version": "2014-05-26",
                "RegionId": config.region,
                "ResourceType": "instance",
                "ResourceId.1": instance_id,
                "Tag.1.Key": key,
                "Tag.1.Value": until,
            },
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        ).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        resp.read()


def write_lease(
    config: Config, hours: float, now: dt.datetime, tagger: Callable[[str], None] | None
) -> dict[str, Any]:
    """The lease file (what this watchdog reads) and the instance tag (what the reaper reads)."""
    if not 0 < hours <= policy.MAX_LEASE_HOURS:
        raise ValueError(
            f"--hours must be more than 0 and at most {policy.MAX_LEASE_HOURS}, got {hours}"
        )
    until = policy.format_utc(now + dt.timedelta(hours=hours))
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


def env_or_role_credentials(metadata: Metadata) -> Callable[[], dict[str, str] | None]:
    def get() -> dict[str, str] | None:
        env = os.environ
        if env.get("AWS_ACCESS_KEY_ID") and metadata.provider == "aws":
            return {
                "access_key_id": env["AWS_ACCESS_KEY_ID"],
                "secret": env.get("AWS_SECRET_ACCESS_KEY", ""),
                "token": env.get("AWS_SESSION_TOKEN", ""),
            }
        if env.get("ALIBABA_CLOUD_ACCESS_KEY_ID") and metadata.provider == "alicloud":
            return {
                "access_key_id": env["ALIBABA_CLOUD_ACCESS_KEY_ID"],
                "secret": env.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ""),
                "token": env.get("ALIBABA_CLOUD_SECURITY_TOKEN", ""),
            }
        return metadata.role_credentials()

    return get


# ---------------------------------------------------------------------------- sync


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    detail: str
    seconds: float = 0.0


class Uploader(Protocol):
    def sync(self, source: Path, dest: str, timeout_s: float) -> SyncResult: ...


def sync_command(provider: str, source: Path, dest: str) -> list[str] | None:
    """The node's own copy tool: ``aws s3 sync`` or ``ossutil cp -r -u`` (only newer files)."""
    if provider == "aws" and shutil.which("aws"):
        return ["aws", "s3", "sync", str(source), dest, "--only-show-errors", "--no-progress"]
    if provider == "alicloud":
        tool = shutil.which("ossutil") or shutil.which("ossutil64")
        if tool:
            return [tool, "cp", "-r", "-u", "-f", str(source), dest]
    return None


@dataclass
class CommandUploader:
    provider: str

    def sync(self, source: Path, dest: str, timeout_s: float) -> SyncResult:
        argv = sync_command(self.provider, source, dest)
        if argv is None:
            tool = "aws CLI" if self.provider == "aws" else "ossutil"
            return SyncResult(False, f"no {tool} on this node: cannot save scratch")
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return SyncResult(False, f"sync timed out after {timeout_s:.0f} s", timeout_s)
        took = time.monotonic() - started
        if done.returncode != 0:
            return SyncResult(
                False, f"{argv[0]} exit {done.returncode}: {done.stderr.strip()[:300]}", took
            )
        return SyncResult(True, f"synced {source} -> {dest}", took)


def sync_scratch(config: Config, uploader: Uploader, timeout_s: float | None = None) -> SyncResult:
    """Every ``sync_dirs`` under scratch to s3://|oss://bucket/checkpoints/<node>/, bounded."""
    if not config.bucket:
        return SyncResult(False, "no bucket configured: cannot save scratch")
    scheme = "s3" if config.provider == "aws" else "oss"
    budget = timeout_s if timeout_s is not None else config.sync_timeout_s
    deadline = time.monotonic() + budget
    done: list[str] = []
    for rel in config.sync_dirs:
        source = Path(config.scratch_path) / rel
        if not source.is_dir():
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return SyncResult(False, f"sync budget of {budget:.0f} s spent before {source}", budget)
        dest = f"{scheme}://{config.bucket}/{rel.strip('/')}/{config.node}/"
        result = uploader.sync(source, dest, left)
        if not result.ok:
            return result
        done.append(str(source))
    took = budget - max(0.0, deadline - time.monotonic())
    return SyncResult(True, f"synced {', '.join(done) or 'nothing (no checkpoint dirs)'}", took)


# ---------------------------------------------------------------------------- state


@dataclass
class State:
    samples: list[policy.Sample] = field(default_factory=list)
    stall_warned: bool = False
    spot_notice_synced: str = ""  # the notice we already saved scratch for
    sync_failed_since: str = ""  # ISO time of the first failed pre-stop sync
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
                    policy.Sample(
                        at=policy.parse_utc(s["at"]),
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
            sync_failed_since=str(raw.get("sync_failed_since", "")),
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
            "sync_failed_since": self.sync_failed_since,
            "last_decision": self.last_decision,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: a crash mid-write never leaves half a history

    def prune(self, now: dt.datetime, keep_minutes: float) -> None:
        cutoff = now - dt.timedelta(minutes=keep_minutes)
        self.samples = [s for s in self.samples if s.at >= cutoff]


def read_lease(state_dir: Path) -> policy.Lease:
    path = state_dir / LEASE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return policy.Lease()
    except OSError as exc:
        return policy.Lease(error=f"{path}: {exc}")
    return policy.Lease.parse(text)


# ---------------------------------------------------------------------------- the run


@dataclass
class Watchdog:
    config: Config
    probe: Probe
    uploader: Uploader
    publisher: Publisher | None
    metadata: Metadata | None
    poweroff: Callable[[], None]
    warn: Callable[[str], None]
    rules: policy.Policy = field(default_factory=policy.Policy)

    @property
    def state_path(self) -> Path:
        return Path(self.config.state_dir) / STATE_FILE

    def _check_spot(self, state: State) -> None:
        if self.metadata is None:
            return
        notice = self.metadata.spot_notice()
        if notice is None or notice == state.spot_notice_synced:
            return
        LOG.warning("spot interruption notice %s: saving scratch now", notice)
        # AWS gives two minutes: the sync gets most of it, never the configured ten.
        result = sync_scratch(
            self.config, self.uploader, timeout_s=min(self.config.sync_timeout_s, 90.0)
        )
        LOG.warning("spot sync: %s", result.detail)
        if result.ok:
            state.spot_notice_synced = notice

    def status(self, state: State | None = None) -> tuple[policy.Decision, State]:
        state = state or State.load(self.state_path)
        decision = policy.decide_node(
            state.samples,
            now=self.probe.now(),
            boot_time=self.probe.boot_time(),
            limits=self.config.limits(),
            lease=read_lease(Path(self.config.state_dir)),
            role=self.config.role,
            policy=self.rules,
        )
        return decision, state

    def run_once(self) -> policy.Decision:
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
        keep = max(
            self.config.limits().idle_minutes + self.rules.activity_window_minutes,
            self.rules.stall_warn_minutes + self.rules.stall_stop_after_warn_minutes,
        )
        state.prune(now, keep + 10)
        decision, _ = self.status(state)
        LOG.info("%s: %s", decision.action, decision.reason)

        if self.publisher is not None:
            try:
                self.publisher.publish(
                    at=now,
                    gpu_util=max(utils) if utils else None,
                    gpu_mem=max(mems) if mems else None,
                )
            except Exception as exc:  # metrics are the second layer's input, never fatal here
                LOG.warning("could not publish metrics: %s", exc)

        if decision.warning and not state.stall_warned:
            self.warn(decision.warning)
            state.stall_warned = True
        elif not decision.warning and decision.action == policy.KEEP:
            state.stall_warned = False

        state.last_decision = {
            "at": now.isoformat(),
            "action": decision.action,
            "reason": decision.reason,
            "idle_minutes": decision.idle_minutes,
        }
        if decision.stop:
            self._stop(state, decision, now)
        else:
            state.sync_failed_since = ""
        state.save(self.state_path)
        return decision

    def _stop(self, state: State, decision: policy.Decision, now: dt.datetime) -> None:
        result = sync_scratch(self.config, self.uploader)
        LOG.warning("pre-stop sync: %s", result.detail)
        if not result.ok:
            first = policy.parse_utc(state.sync_failed_since) if state.sync_failed_since else now
            state.sync_failed_since = first.isoformat()
            waited = (now - first).total_seconds() / 60
            if waited < self.config.sync_failure_grace_minutes:
                state.last_decision["postponed"] = f"sync failed ({result.detail}); retrying"
                return
            LOG.error(
                "sync failing for %.0f min: powering off anyway (money is bounded too)", waited
            )
        state.last_decision["synced"] = result.detail
        if self.config.dry_run:
            LOG.warning("dry run: would power off now (%s)", decision.reason)
            return
        state.save(self.state_path)
        self.poweroff()


def system_poweroff() -> None:
    # Instance-initiated shutdown: the stack sets its behaviour to "stop", never terminate.
    subprocess.run(["systemctl", "poweroff"], check=False)


def wall(message: str) -> None:
    LOG.warning("%s", message)
    run_cmd(["wall", f"gpufleet watchdog: {message}"])


def build(config: Config) -> Watchdog:
    metadata = Metadata(config.provider, config.metadata_url)
    publisher: Publisher | None = None
    if config.publish_metrics:
        instance_id = config.instance_id or metadata.instance_id() or ""
        if instance_id:
            publisher = MetricsPublisher(config, instance_id, env_or_role_credentials(metadata))
        else:
            LOG.warning("no instance id (config or metadata): metrics not published")
    return Watchdog(
        config=config,
        probe=SystemProbe(),
        uploader=CommandUploader(config.provider),
        publisher=publisher,
        metadata=metadata,
        poweroff=system_poweroff,
        warn=wall,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpufleet idle watchdog")
    parser.add_argument("command", choices=["run", "status", "lease"])
    parser.add_argument("--config", default=str(CONFIG_PATH))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hours", type=float, help="lease: keep this node for N hours")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        config = Config.load(Path(args.config))
    except ValueError as exc:
        print(f"watchdog: {exc}", file=sys.stderr)
        return 2
    dog = build(config)
    if args.command == "lease":
        if args.hours is None:
            print("watchdog: lease needs --hours N", file=sys.stderr)
            return 2
        metadata = Metadata(config.provider, config.metadata_url)
        instance_id = config.instance_id or metadata.instance_id() or ""
        creds = env_or_role_credentials(metadata)

        def tag(until: str) -> None:
            found = creds()
            if not instance_id or not found:
                raise RuntimeError("no instance id or credentials on this node")
            write_lease_tag(config, instance_id, until, found)

        try:
            out = write_lease(config, args.hours, dog.probe.now(), tag)
        except ValueError as exc:
            print(f"watchdog: {exc}", file=sys.stderr)
            return 2
        print(
            json.dumps(out) if args.json else f"lease until {out['lease_until']} (tag {out['tag']})"
        )
        return 0
    if args.command == "status":
        decision, state = dog.status()
        lease = read_lease(Path(config.state_dir))
        out = {
            "node": config.node,
            "role": config.role,
            "action": decision.action,
            "reason": decision.reason,
            "warning": decision.warning,
            "idle_minutes": decision.idle_minutes,
            "idle_limit_minutes": config.limits().idle_minutes,
            "lease_until": policy.format_utc(lease.until) if lease.until else None,
            "samples": len(state.samples),
            "last_run": state.last_decision,
        }
        print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return 0
    dog.run_once()
    return 0


if __name__ == "__main__":
    sys.exit(main())
