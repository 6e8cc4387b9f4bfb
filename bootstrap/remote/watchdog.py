#!/usr/bin/env python3
"""gpufleet node watchdog: stop this GPU node when it is idle, after saving its scratch.

Runs on the node from a systemd timer (gpufleet-watchdog.timer, every ~minute), as root, with
the system Python (3.10+) and nothing but the standard library and the node's own tools
(nvidia-smi, ss, who). Next to it: ``idle_rules.py``, the idle rules (the same file the
cloud reaper runs, infra/reaper/idle_rules.py), and ``bucket.py``, its bucket sync. What
differs per cloud is one class per cloud (section "clouds", registry ``CLOUDS``).

One run:
  1. reads its config (/etc/gpufleet/watchdog.json), the sample history and the lease file;
  2. takes a few samples 15 s apart (GPU utilization and compute processes from nvidia-smi,
     SSH sessions and connections from ss/who), checking the spot interruption notice
     before each: a notice saves scratch to the bucket at once;
  3. gathers the other signals (Watchdog.gather_signals: its instance tags for protected,
     lease and limits; unreadable ones count as activity), decides (policy.decide_node),
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
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # for mypy only; never executed
    from bootstrap.remote import bucket
    from bootstrap.remote import fleet_names as names
    from bootstrap.remote import idle_rules as policy
else:
    # Installed side by side in /opt/gpufleet; nothing else is on the node's path. Tests run
    # these files the same way (tests/bootstrap/remote/test_watchdog_alone.py).
    import bucket  # the one object-store client (S3 and compatible, Azure Blob)
    import fleet_names as names  # tag and metric names: the reaper's and the stack's own
    import idle_rules as policy

UTC = policy.UTC
LOG = logging.getLogger("gpufleet-watchdog")

CONFIG_PATH = Path("/etc/gpufleet/watchdog.json")
NODE_INFO_PATH = Path("/etc/gpufleet/node.json")  # written at first boot by the stack
STATE_DIR = Path("/var/lib/gpufleet")
JOBS_DIR = "/var/lib/gpufleet/jobs"
LEASE_FILE = "keep-alive-until"
STATE_FILE = "watchdog-state.json"

LEASE_TAG_ATTEMPTS = 3  # fab keep-alive's CreateTags / TagResources, bounded
# A spot notice's sync: at most this long, ending this long before a reclaim time the
# notice names, and never shorter than the floor (a late notice still tries the newest).
SPOT_SYNC_S = 90.0
SPOT_MARGIN_S = 10.0
SPOT_MIN_SYNC_S = 5.0

# ---------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    provider: str  # a key of CLOUDS
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
    jobs_dir: str = JOBS_DIR  # fab train's job folders (their state.json: README "fab train")

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
        if data.get("provider") is not None and data["provider"] not in CLOUDS:
            problems.append(f"provider must be {' or '.join(CLOUDS)}, got {data['provider']!r}")
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        if "sync_dirs" in data:
            data["sync_dirs"] = tuple(data["sync_dirs"])
        return cls(**data)

    def limits(self, tags: dict[str, str] | None = None) -> policy.Limits:
        """Idle and TTL limits: the instance's tags where set (what the reaper reads, and
        what a person changes on a running node), else this config, else the tier's."""
        tags = tags or {}
        ttl = (
            None
            if self.ttl_hours is None
            else ("off" if self.ttl_hours <= 0 else str(self.ttl_hours))
        )
        idle = None if self.idle_minutes is None else str(self.idle_minutes)
        return policy.resolve_limits(
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


class TagsUnreadable(Exception):
    """The instance's tags could not be read; the message says why (logged and published)."""


Credentials = bucket.Credentials  # access_key_id, secret, token (may be "")
Metric = tuple[str, float, str]  # name, value, unit


class TokenMetadata:
    """A metadata service of the ``/latest/meta-data/`` kind. In token mode (``token_header``
    set) a session token from ``PUT /latest/api/token``, asked for ``ttl_s`` seconds in
    ``ttl_header``, goes with every read in ``token_header``; without one, plain GETs (each
    cloud class below says which).

    Reads that fail for the network raise (callers decide what an unreadable answer means);
    a 404 is ``None``, the service's way of saying "not here".
    """

    def __init__(
        self,
        base_url: str,
        token_header: str = "",
        ttl_header: str = "",
        ttl_s: int = 300,
        timeout: float = 2.0,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self._token_header = token_header
        self._ttl_header = ttl_header
        self._ttl_s = ttl_s

    def get(self, path: str) -> str | None:
        headers = {}
        token = self._token()
        if token:
            headers[self._token_header] = token
        request = urllib.request.Request(f"{self.base}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _token(self) -> str | None:
        if not self._token_header:
            return None  # a service without session tokens
        request = urllib.request.Request(
            f"{self.base}/latest/api/token",
            method="PUT",
            headers={self._ttl_header: str(self._ttl_s)},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def read(self, path: str) -> str | None:
        """The stripped text at ``path``; None when it is absent, empty or unreachable."""
        try:
            text = self.get(path)
        except (urllib.error.URLError, OSError):
            return None  # no metadata service: nothing to act on
        return text.strip() if text and text.strip() else None

    def role_credentials(self, base: str, fields: tuple[str, str, str]) -> Credentials | None:
        """Temporary credentials of the instance's role, listed under ``base``; ``fields``
        are the document's names for the key id, the secret and the session token. None
        when there is no role, or its document is not an object with a key id."""
        try:
            role = (self.get(base) or "").strip().splitlines()
            if not role:
                return None
            doc = json.loads(self.get(base + role[0].strip()) or "{}")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        key_id, secret, token = fields
        if not isinstance(doc, dict) or not doc.get(key_id):
            return None
        return {
            "access_key_id": str(doc[key_id]),
            "secret": str(doc.get(secret) or ""),
            "token": str(doc.get(token) or ""),
        }


def env_credentials(keys: tuple[str, str, str]) -> Credentials | None:
    """Credentials from the environment variables ``keys`` (key id, secret, token), if set."""
    key, secret, token = keys
    env = os.environ
    if not env.get(key):
        return None
    return {"access_key_id": env[key], "secret": env.get(secret, ""), "token": env.get(token, "")}


sigv4_headers = bucket.sigv4_headers  # one signer for metrics, tags and the bucket


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


def tc3_headers(
    *,
    service: str,
    host: str,
    action: str,
    version: str,
    region: str,
    payload: bytes,
    secret_id: str,
    secret_key: str,
    token: str = "",
    timestamp: int | None = None,
) -> dict[str, str]:
    """Tencent Cloud API 3.0 headers for a JSON POST to ``/``, signed TC3-HMAC-SHA256 as the
    "Signature v3" steps describe (cloud.tencent.com/document/api/213/30654): canonical
    request over content-type and host, string to sign with the UTC date's credential scope,
    the key derived TC3+secret -> date -> service -> "tc3_request"."""
    stamp = int(time.time()) if timestamp is None else timestamp
    date = dt.datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d")
    content_type = "application/json"
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            f"content-type:{content_type}\nhost:{host}\n",
            "content-type;host",
            hashlib.sha256(payload).hexdigest(),
        ]
    )
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(
        ["TC3-HMAC-SHA256", str(stamp), scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )

    def mac(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    key = mac(mac(mac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers = {
        "Authorization": (
            f"TC3-HMAC-SHA256 Credential={secret_id}/{scope}, "
            f"SignedHeaders=content-type;host, Signature={signature}"
        ),
        "Content-Type": content_type,
        "Host": host,
        "X-TC-Action": action,
        "X-TC-Version": version,
        "X-TC-Timestamp": str(stamp),
        "X-TC-Region": region,
    }
    if token:
        headers["X-TC-Token"] = token
    return headers


def system_poweroff() -> None:
    # Instance-initiated shutdown: the stack sets its behaviour to "stop", never terminate.
    subprocess.run(["systemctl", "poweroff"], check=False)


# ---------------------------------------------------------------------------- clouds
#
# Everything this node knows about its cloud lives in one class per cloud below, picked from
# CLOUDS by the config's "provider"; nothing else in this file, bucket.py or
# job_sync.py names a cloud (tests/infra/test_provider_knowledge.py fails if one does).
# Adding a cloud is one class here and one CLOUDS entry. The class must provide (NodeCloud):
#
#   Cls(region, endpoint_url="", metadata_url="")   endpoint_url overrides the cloud's API
#       (tags, metrics) and metadata_url its metadata service; both are for tests and
#       private endpoints, "" means the cloud's own.
#   name                          the provider's name, as the stack's config spells it
#   instance_id()                 this instance's id from the metadata service, or None
#   env_credentials()             API credentials from the cloud's usual environment
#                                 variables, or None (they override the instance's role)
#   credentials()                 env_credentials(), else the instance role's temporary
#                                 credentials from the metadata service, else None
#   spot_notice()                 the spot/preemption notice (any non-empty text that
#                                 changes per notice), or None when there is none or it
#                                 cannot be read
#   instance_tags(id, creds)      this instance's own tags; raises TagsUnreadable, never
#                                 guesses ({} only when it has none). ``creds`` is a
#                                 callable, called only by a cloud whose tag read needs it
#   write_tag(id, key, value, creds)   set one tag on this instance (the lease); raises on
#                                 failure (urllib's errors: retry_idempotent retries 5xx/429)
#   put_metrics(id, metrics, creds)    publish [(name, value, unit)] as custom metrics
#                                 in names.NAMESPACE (fleet_names.py), dimension: the
#                                 instance id, with NO timestamp (the service stamps
#                                 them); raises
#   bucket_endpoint()             scheme://host of the bucket's API in region (the store
#                                 puts the bucket, or Azure's storage account, in front)
#   bucket_store                  ClassVar: the bucket.py client for the cloud's object
#                                 store (bucket.Store: S3 or compatible; bucket.BlobStore)
#   poweroff()                    stop this instance so that billing for its GPUs ends and
#                                 its disks stay (the watchdog calls it only after its sync)
#
# Credentials are {"access_key_id", "secret", "token"} (bucket.Credentials). Every
# network call is bounded by ``timeout``. The shared helpers above (TokenMetadata,
# sigv4_headers, alicloud_rpc_query, env_credentials, system_poweroff) may be reused, and a
# cloud whose metadata service speaks /latest/meta-data/ states its data in a MetadataNode
# subclass (addresses, token headers, role fields, spot path, environment variables).


class NodeCloud(Protocol):
    """One cloud, as the node sees it (see the comment above for each member's contract)."""

    name: ClassVar[str]
    bucket_store: ClassVar[type[bucket.BucketStore]]

    def __init__(self, region: str, endpoint_url: str = "", metadata_url: str = "") -> None: ...

    def instance_id(self) -> str | None: ...
    def env_credentials(self) -> Credentials | None: ...
    def credentials(self) -> Credentials | None: ...
    def spot_notice(self) -> str | None: ...
    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]: ...
    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None: ...
    def put_metrics(
        self, instance_id: str, metrics: Sequence[Metric], creds: Credentials
    ) -> None: ...
    def bucket_endpoint(self) -> str: ...
    def poweroff(self) -> None: ...


@dataclass
class MetadataNode:
    """What the clouds whose metadata service speaks ``/latest/meta-data/`` share (AWS,
    Alicloud, Tencent): this instance's id, its role's temporary credentials and the spot
    notice read there (:class:`TokenMetadata`), API keys from the environment. A subclass
    states only its data below, and the API calls that differ (tags, metrics, power-off).
    """

    region: str
    endpoint_url: str = ""
    metadata_url: str = ""
    timeout: float = 10.0
    metadata_base: ClassVar[str] = ""  # the service's own address
    token_header: ClassVar[str] = ""  # the session token's header; "" for plain GETs
    token_ttl_header: ClassVar[str] = ""  # the header that asks for a token's lifetime
    token_ttl_s: ClassVar[int] = 300
    instance_id_path: ClassVar[str] = "/latest/meta-data/instance-id"
    role_path: ClassVar[str] = ""  # lists the role; the role's name under it: its keys
    role_fields: ClassVar[tuple[str, str, str]] = ("", "", "")  # key id, secret, token
    spot_path: ClassVar[str] = ""  # the spot notice (404 while there is none)
    env_keys: ClassVar[tuple[str, str, str]] = ("", "", "")  # key id, secret, token
    # S3 and the S3-compatible OSS and COS: one client (bucket.Store), the cloud's endpoint.
    bucket_store: ClassVar[type[bucket.BucketStore]] = bucket.Store

    @property
    def metadata(self) -> TokenMetadata:
        return TokenMetadata(
            self.metadata_url or self.metadata_base,
            self.token_header,
            self.token_ttl_header,
            self.token_ttl_s,
        )

    def instance_id(self) -> str | None:
        return self.metadata.read(self.instance_id_path)

    def env_credentials(self) -> Credentials | None:
        return env_credentials(self.env_keys)

    def credentials(self) -> Credentials | None:
        return self.env_credentials() or self.metadata.role_credentials(
            self.role_path, self.role_fields
        )

    def spot_notice(self) -> str | None:
        return self.metadata.read(self.spot_path)


@dataclass
class AwsNode(MetadataNode):
    """EC2: IMDSv2 (``X-aws-ec2-metadata-token``, docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    configuring-instance-metadata-service.html; the stack sets ``http_tokens = "required"``),
    tags from IMDS, CloudWatch PutMetricData and EC2 CreateTags over the query API signed
    with SigV4, S3 for the bucket, and an instance-initiated shutdown that stops."""

    name: ClassVar[str] = "aws"
    metadata_base = "http://169.254.169.254"
    token_header = "X-aws-ec2-metadata-token"
    token_ttl_header = "X-aws-ec2-metadata-token-ttl-seconds"
    role_path = "/latest/meta-data/iam/security-credentials/"
    role_fields = ("AccessKeyId", "SecretAccessKey", "Token")
    spot_path = "/latest/meta-data/spot/instance-action"
    env_keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """From IMDS, ``/latest/meta-data/tags/instance/`` (the stack enables
        ``instance_metadata_tags``; docs.aws.amazon.com/AWSEC2/latest/UserGuide/
        work-with-tags-in-IMDS.html): no API call, no credentials."""
        del instance_id, creds
        metadata = self.metadata
        try:
            listing = metadata.get("/latest/meta-data/tags/instance")
            if listing is None:
                raise TagsUnreadable(
                    "instance tags are not in the metadata service (is InstanceMetadataTags "
                    "enabled on the instance?)"
                )
            tags: dict[str, str] = {}
            for key in (k.strip() for k in listing.splitlines()):
                if not key:
                    continue
                value = metadata.get("/latest/meta-data/tags/instance/" + urllib.parse.quote(key))
                if value is None:
                    raise TagsUnreadable(f"tag {key!r} listed but not readable")
                tags[key] = value
            return tags
        except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
            raise TagsUnreadable(f"metadata service: {exc}") from None

    def _query(self, service: str, params: dict[str, str], creds: Credentials) -> None:
        host = f"https://{service}.{self.region}.amazonaws.com"
        url = (self.endpoint_url or host).rstrip("/") + "/"
        body = urllib.parse.urlencode(params).encode()
        headers = sigv4_headers(
            method="POST",
            url=url,
            body=body,
            region=self.region,
            service=service,
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        )
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            resp.read()

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        params = {
            "Action": "CreateTags",
            "Version": "2016-11-15",
            "ResourceId.1": instance_id,
            "Tag.1.Key": key,
            "Tag.1.Value": value,
        }
        self._query("ec2", params, creds)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        params = {"Action": "PutMetricData", "Version": "2010-08-01", "Namespace": names.NAMESPACE}
        for n, (name, value, unit) in enumerate(metrics, start=1):
            prefix = f"MetricData.member.{n}"
            params.update(
                {
                    f"{prefix}.MetricName": name,
                    f"{prefix}.Value": repr(value),
                    f"{prefix}.Unit": unit,
                    f"{prefix}.Dimensions.member.1.Name": names.DIMENSION,
                    f"{prefix}.Dimensions.member.1.Value": instance_id,
                }
            )
        self._query("monitoring", params, creds)

    def bucket_endpoint(self) -> str:
        return f"https://s3.{self.region}.amazonaws.com"

    def poweroff(self) -> None:
        system_poweroff()  # the stack sets instance_initiated_shutdown_behavior = "stop"


@dataclass
class AlicloudNode(MetadataNode):
    """ECS: the metadata service in security hardening mode (``X-aliyun-ecs-metadata-token``,
    alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata), the RAM role's STS
    credentials, tags through ListTagResources and the lease through TagResources (ECS RPC
    API), CloudMonitor PutCustomMetric, all signed with RPC signature v1; OSS through its
    S3-compatible endpoint for the bucket; power-off through StopInstance in economical
    mode (:meth:`poweroff`)."""

    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "alicloud"
    metadata_base = "http://100.100.100.200"
    token_header = "X-aliyun-ecs-metadata-token"
    token_ttl_header = "X-aliyun-ecs-metadata-token-ttl-seconds"
    role_path = "/latest/meta-data/ram/security-credentials/"
    role_fields = ("AccessKeyId", "AccessKeySecret", "SecurityToken")
    spot_path = "/latest/meta-data/instance/spot/termination-time"
    env_keys = (
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        "ALIBABA_CLOUD_SECURITY_TOKEN",
    )

    def _rpc(self, service: str, params: dict[str, str], creds: Credentials) -> bytes:
        """One signed RPC call (a POST form); the answer's body. Raises urllib's errors."""
        host = f"https://{service}.{self.region}.aliyuncs.com"
        url = (self.endpoint_url or host).rstrip("/") + "/"
        body = alicloud_rpc_query(
            params,
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
        ).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return bytes(resp.read())

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """Through the ECS API (ListTagResources, signed with the node's RAM role;
        help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-listtagresources).
        Alicloud's metadata service does not offer tags to everyone yet
        (ModifyInstanceMetadataOptions: InstanceMetadataTags is "in invitational preview")."""
        if not instance_id:
            raise TagsUnreadable("no instance id (config or metadata service)")
        found = creds()
        if not found:
            raise TagsUnreadable("no credentials (instance RAM role or environment)")
        tags: dict[str, str] = {}
        token = ""
        for _page in range(5):  # 20 tags per instance at most; bounded anyway
            params = {
                "Action": "ListTagResources",
                "Version": "2014-05-26",
                "RegionId": self.region,
                "ResourceType": "instance",
                "ResourceId.1": instance_id,
            }
            if token:
                params["NextToken"] = token
            try:
                answer = json.loads(self._rpc("ecs", params, found) or b"{}")
            except urllib.error.HTTPError as exc:
                try:
                    detail = json.loads(exc.read() or b"{}").get("Code", "")
                except ValueError:
                    detail = ""
                raise TagsUnreadable(
                    f"ListTagResources: HTTP {exc.code} {detail}".strip()
                ) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise TagsUnreadable(f"ListTagResources: {exc}") from None
            if not isinstance(answer, dict) or "TagResources" not in answer:
                raise TagsUnreadable(f"ListTagResources: unexpected answer {str(answer)[:120]}")
            for item in (answer.get("TagResources") or {}).get("TagResource") or []:
                if item.get("ResourceId") in (None, instance_id) and "TagKey" in item:
                    tags[str(item["TagKey"])] = str(item.get("TagValue") or "")
            token = str(answer.get("NextToken") or "")
            if not token:
                return tags
        raise TagsUnreadable("ListTagResources: more pages than an instance can have tags")

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        params = {
            "Action": "TagResources",
            "Version": "2014-05-26",
            "RegionId": self.region,
            "ResourceType": "instance",
            "ResourceId.1": instance_id,
            "Tag.1.Key": key,
            "Tag.1.Value": value,
        }
        answer = self._rpc("ecs", params, creds)
        try:
            ok = "RequestId" in json.loads(answer or b"{}")
        except ValueError:
            ok = False
        if not ok:  # a proxy's or captive portal's 200 is not a tag written
            raise ValueError(f"TagResources: not an API answer: {answer[:120]!r}")

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        # CloudMonitor keeps custom metrics under acs_customMetric_<account>; the reaper
        # reads them there by name and dimension (infra/clouds/alicloud/reaper.py).
        params = {"Action": "PutCustomMetric", "Version": "2019-01-01", "RegionId": self.region}
        for n, (name, value, _unit) in enumerate(metrics, start=1):
            params.update(
                {
                    f"MetricList.{n}.MetricName": name,
                    f"MetricList.{n}.GroupId": names.CMS_GROUP_ID,
                    f"MetricList.{n}.Dimensions": json.dumps({names.CMS_DIMENSION: instance_id}),
                    f"MetricList.{n}.Type": "0",
                    f"MetricList.{n}.Values": json.dumps({"value": value}),
                }
            )
        answer = json.loads(self._rpc("metrics", params, creds) or b"{}")
        if str(answer.get("Code", "200")) != "200":
            raise RuntimeError(f"PutCustomMetric: {answer.get('Code')} {answer.get('Message')}")

    def bucket_endpoint(self) -> str:
        # OSS's S3-compatible API (alibabacloud.com/help/en/oss/developer-reference/
        # use-amazon-s3-sdks-to-access-oss), on the internal endpoint: traffic stays in the
        # region's network, and it is the one the March 2025 custom-domain rule for new
        # users' public endpoints does not restrict.
        return f"https://s3.oss-{self.region}-internal.aliyuncs.com"

    def stop_instance(self, instance_id: str, creds: Credentials) -> None:
        """ECS StopInstance in economical mode (StoppedMode=StopCharging): billing for
        the vCPUs, memory and GPUs ends, the disks stay. Economical mode applies only to
        a stop through the API: a shutdown from inside the OS stops the instance in the
        account's default mode, standard (still billed) unless the account turned
        economical mode on by default. Parameters as the SDK's StopInstanceRequest names
        them (it takes no RegionId). Raises AlicloudApiError for an error answer."""
        params = {
            "Action": "StopInstance",
            "Version": "2014-05-26",
            "InstanceId": instance_id,
            "StoppedMode": "StopCharging",
            "ForceStop": "false",
        }
        try:
            answer = json.loads(self._rpc("ecs", params, creds) or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                code = str(json.loads(exc.read() or b"{}").get("Code") or "")
            except ValueError:
                code = ""
            raise AlicloudApiError("StopInstance", exc.code, code) from None
        if not isinstance(answer, dict) or "RequestId" not in answer:
            raise ValueError(f"StopInstance: not an API answer: {str(answer)[:120]}")

    def poweroff(self) -> None:
        """Stop this instance through the API in economical mode, with the node's RAM
        role (its policy allows ecs:StopInstance on this instance alone). Throttling,
        5xx and network errors are retried, bounded (:func:`retry_idempotent`); when
        they persist this raises, the instance keeps running idle and the next run tries
        again. When the API refuses (no credentials, RAM denies, a 4xx) it powers off
        from inside the OS instead: the instance stops in the account's default mode,
        which bills the GPUs unless economical mode is on by default, and the reaper
        reports every instance stopped in standard mode until someone starts it and
        stops it in economical mode (README, "Alibaba Cloud")."""
        instance_id = self.instance_id()
        creds = self.credentials()
        if not instance_id or not creds:
            LOG.error("cannot call StopInstance (no instance id or credentials): OS poweroff")
            system_poweroff()
            return
        try:
            retry_idempotent(
                lambda: self.stop_instance(instance_id, creds),
                sleep=self.sleep,
                transient=lambda exc: isinstance(exc, AlicloudApiError) and exc.transient,
            )
        except AlicloudApiError as exc:
            if exc.transient:
                raise
            LOG.error("%s: refused, so OS poweroff (standard mode: still billed)", exc)
            system_poweroff()


# Throttling and the service's own transient errors (ECS API error codes).
_ALICLOUD_TRANSIENT = ("Throttling", "ServiceUnavailable", "InternalError", "UnknownError")


class AlicloudApiError(RuntimeError):
    """An Alicloud RPC error answer: its HTTP status and ``Code``."""

    def __init__(self, action: str, status: int, code: str) -> None:
        super().__init__(f"{action}: HTTP {status} {code}".strip())
        self.status = status
        self.code = code

    @property
    def transient(self) -> bool:
        return bucket.retryable_status(self.status) or self.code.startswith(_ALICLOUD_TRANSIENT)


_TENCENT_RETRYABLE = ("RequestLimitExceeded", "InternalError", "ResourceUnavailable")


class TencentApiError(RuntimeError):
    """A Tencent Cloud API answer with ``Response.Error`` (HTTP 200, as the API answers)."""

    def __init__(self, action: str, code: str, message: str) -> None:
        super().__init__(f"{action}: {code}: {message}"[:300])
        self.code = code


@dataclass
class TencentNode(MetadataNode):
    """CVM: the metadata service (metadata.tencentyun.com, cloud.tencent.com/document/
    product/213/4934) for the instance id and the CAM role's temporary keys
    (``cam/security-credentials/<role>``: TmpSecretId, TmpSecretKey, Token), the spot
    reclaim notice at ``/latest/meta-data/spot/termination-time`` (404 while there is none;
    tencentcloud.com/document/product/213/32487), its tags through CVM DescribeInstances and
    the lease through the Tag API's TagResources (account uin from STS GetCallerIdentity),
    every call TC3-HMAC-SHA256 signed (:func:`tc3_headers`); COS through its S3-compatible
    API for the bucket; power-off through StopInstances with STOP_CHARGING.

    No custom metrics: Cloud Monitor's report action (PutMonitorData) is disused
    (tencentcloud.com/document/api/248/35974). The heartbeat is an object in the stack's
    bucket (:class:`BucketHeartbeat`), and the GPU utilization the reaper reads is the
    monitoring agent's own (QCE/CVM Gpuutil; `fab setup` installs the agent), see
    infra/clouds/tencent/reaper.py.
    """

    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "tencent"
    publishes_metrics: ClassVar[bool] = False
    heartbeat_in_bucket: ClassVar[bool] = True
    metadata_base = "http://metadata.tencentyun.com"  # plain GETs: no session token
    role_path = "/latest/meta-data/cam/security-credentials/"
    role_fields = ("TmpSecretId", "TmpSecretKey", "Token")
    spot_path = "/latest/meta-data/spot/termination-time"
    # The notice's text: the repossession time, "2018-08-18 12:05:33", on the instance's
    # own clock in UTC+8 (tencentcloud.com/document/product/213/32487, read 2026-12-01).
    spot_time_format: ClassVar[str] = "%Y-%m-%d %H:%M:%S"
    spot_zone: ClassVar[dt.timezone] = dt.timezone(dt.timedelta(hours=8))
    env_keys = ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN")

    def spot_deadline(self, notice: str) -> dt.datetime | None:
        """When the instance is repossessed, from the notice; None when it is no such time
        (the watchdog then takes its fixed budget)."""
        try:
            when = dt.datetime.strptime(notice.strip(), self.spot_time_format)
        except ValueError:
            return None
        return when.replace(tzinfo=self.spot_zone).astimezone(UTC)

    def api(
        self, service: str, action: str, version: str, params: dict[str, Any], creds: Credentials
    ) -> dict[str, Any]:
        """One signed API 3.0 call; its ``Response`` object. Raises urllib's errors for the
        network and HTTP, TencentApiError for an error answer, ValueError for a non-API one."""
        host = f"{service}.tencentcloudapi.com"
        url = "https://" + host + "/"
        if self.endpoint_url:
            url = self.endpoint_url.rstrip("/") + "/"
            host = urllib.parse.urlsplit(url).netloc
        body = json.dumps(params).encode()
        headers = tc3_headers(
            service=service,
            host=host,
            action=action,
            version=version,
            region=self.region,
            payload=body,
            secret_id=creds["access_key_id"],
            secret_key=creds["secret"],
            token=creds.get("token", ""),
        )
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            raw = resp.read()
        answer = json.loads(raw or b"{}")
        response = answer.get("Response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or "RequestId" not in response:
            raise ValueError(f"{action}: not an API answer: {raw[:120]!r}")
        error = response.get("Error")
        if isinstance(error, dict):
            raise TencentApiError(action, str(error.get("Code")), str(error.get("Message")))
        return response

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """Through CVM DescribeInstances for this one instance (its ``Tags``); the metadata
        service does not list tags."""
        if not instance_id:
            raise TagsUnreadable("no instance id (config or metadata service)")
        found = creds()
        if not found:
            raise TagsUnreadable("no credentials (instance CAM role or environment)")
        params = {"InstanceIds": [instance_id], "Limit": 1}
        try:
            answer = self.api("cvm", "DescribeInstances", "2017-03-12", params, found)
        except urllib.error.HTTPError as exc:
            raise TagsUnreadable(f"DescribeInstances: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError, TencentApiError) as exc:
            raise TagsUnreadable(f"DescribeInstances: {exc}") from None
        listed = answer.get("InstanceSet")
        if not isinstance(listed, list) or len(listed) != 1:
            raise TagsUnreadable(f"DescribeInstances: {instance_id} not in the answer")
        raw = listed[0].get("Tags") if isinstance(listed[0], dict) else None
        if raw is None:
            return {}
        if not isinstance(raw, list):
            raise TagsUnreadable("DescribeInstances: Tags is not a list")
        return {
            str(t["Key"]): str(t.get("Value") or "")
            for t in raw
            if isinstance(t, dict) and isinstance(t.get("Key"), str)
        }

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        who = self.api("sts", "GetCallerIdentity", "2018-08-13", {}, creds)
        uin = str(who.get("AccountId") or "")
        if not uin.isdigit():
            raise ValueError(f"GetCallerIdentity: no account uin in {str(who)[:120]}")
        resource = f"qcs::cvm:{self.region}:uin/{uin}:instance/{instance_id}"
        params = {"ResourceList": [resource], "Tags": [{"TagKey": key, "TagValue": value}]}
        self.api("tag", "TagResources", "2018-08-13", params, creds)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        raise RuntimeError(
            "Tencent Cloud Monitor has no custom-metric report action (PutMonitorData is "
            "disused): the heartbeat is an object in the bucket (BucketHeartbeat)"
        )

    def bucket_endpoint(self) -> str:
        # COS's S3-compatible API (cloud.tencent.com/document/product/436/37421), SigV4 with
        # the region as the signing region; from a CVM in the same region the request stays
        # on Tencent's internal network.
        return f"https://cos.{self.region}.myqcloud.com"

    def poweroff(self) -> None:
        """StopInstances with STOP_CHARGING: a shutdown from inside the OS would leave the
        charging mode to the account's default. Raises when the stop is not accepted (the
        next run tries again); never falls back to a stop that keeps charging."""
        instance_id = self.instance_id()
        creds = self.credentials()
        if not instance_id or not creds:
            raise RuntimeError("cannot stop: no instance id or no credentials")
        params = {
            "InstanceIds": [instance_id],
            "StopType": "SOFT_FIRST",
            "StoppedMode": "STOP_CHARGING",
        }

        def stop() -> None:
            self.api("cvm", "StopInstances", "2017-03-12", params, creds)

        # Bounded; throttling, 5xx and the API's own transient error codes are retried.
        retry_idempotent(
            stop,
            sleep=self.sleep,
            transient=lambda exc: (
                isinstance(exc, TencentApiError) and exc.code.startswith(_TENCENT_RETRYABLE)
            ),
        )


# Scheduled Events (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events): an
# eviction of a Spot VM is an event of type "Preempt" naming this VM; NotBefore is at least
# 30 seconds after it appears.
PREEMPT = "Preempt"
IMDS_API = "2021-02-01"
SCHEDULED_EVENTS_API = "2020-07-01"
ARM_API_COMPUTE = "2024-07-01"
ARM_API_TAGS = "2021-04-01"
ARM = "https://management.azure.com"
AUDIENCES = {
    "token": "https://management.azure.com/",  # ARM: tags, deallocate
    "monitor": "https://monitoring.azure.com/",  # custom metrics
    "storage": "https://storage.azure.com/",  # the blob container
}


def parse_scheduled_events(text: str | None, vm_name: str) -> str | None:
    """The eviction notice in a Scheduled Events answer, or None.

    A notice is a ``Preempt`` event whose Resources name this VM (or name none); its text is
    ``Preempt <EventId> <NotBefore>``, which changes per eviction. An unreadable answer is
    None: a notice only triggers an extra sync, it never stops anything.
    """
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return None
    for event in events:
        if not isinstance(event, dict) or event.get("EventType") != PREEMPT:
            continue
        resources = event.get("Resources")
        if isinstance(resources, list) and resources and vm_name not in resources:
            continue
        return f"{PREEMPT} {event.get('EventId', '?')} {event.get('NotBefore', '')}".strip()
    return None


class AzureImds:
    """Azure's Instance Metadata Service: plain GETs with ``Metadata: true`` (it refuses a
    request without it, and any request carrying X-Forwarded-For)."""

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def get_json(self, path: str, **query: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return json.loads(resp.read().decode() or "null")


@dataclass
class AzureNode:
    """Azure VM: IMDS (169.254.169.254, ``Metadata: true``) for its identity (compute.name,
    resourceId, location) and its own tags (``compute.tagsList``), managed-identity tokens
    from IMDS for ARM, Azure Monitor and Blob Storage; heartbeat + GPU metrics as Azure
    Monitor custom metrics on the regional ``<location>.monitoring.azure.com`` endpoint; the
    lease tag through ARM's Tags - Update At Scope (Merge); the bucket is a Blob container
    (bucket.BlobStore); Spot eviction from Scheduled Events (Preempt).

    Power-off is a deallocation through ARM with the VM's managed identity, never an OS
    shutdown: a VM shut down from inside is "Stopped" and still billed for its compute (and
    its GPUs); only a deallocated VM is not. The watchdog calls it after the scratch sync
    (deallocation erases the local NVMe). Raises when ARM does not accept it (the next run
    tries again); it never falls back to a shutdown that keeps billing.
    """

    region: str
    endpoint_url: str = ""  # ARM and the metrics endpoint (tests: one local fake for both)
    metadata_url: str = ""
    timeout: float = 10.0
    sleep: Callable[[float], None] = time.sleep
    name: ClassVar[str] = "azure"
    bucket_store: ClassVar[type[bucket.BucketStore]] = bucket.BlobStore

    @property
    def imds(self) -> AzureImds:
        return AzureImds(self.metadata_url or "http://169.254.169.254")

    def compute(self) -> dict[str, Any] | None:
        try:
            doc = self.imds.get_json("/metadata/instance/compute", **{"api-version": IMDS_API})
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def instance_id(self) -> str | None:
        """The VM's name: what the reaper and the stack call the instance."""
        doc = self.compute()
        name = doc.get("name") if doc else None
        return str(name) if name else None

    def resource_id(self) -> str:
        doc = self.compute() or {}
        rid = str(doc.get("resourceId") or "")
        if not rid.startswith("/subscriptions/"):
            raise RuntimeError("IMDS gave no resourceId for this VM")
        return rid

    def env_credentials(self) -> Credentials | None:
        return None  # no key pair exists for a managed identity: the tokens come from IMDS

    def credentials(self) -> Credentials | None:
        """Managed-identity tokens for each audience this node calls (AUDIENCES); None when
        IMDS has no identity to give. ``token`` is ARM's."""
        found: Credentials = {"access_key_id": "managed-identity", "secret": ""}
        for key, resource in AUDIENCES.items():
            try:
                doc = self.imds.get_json(
                    "/metadata/identity/oauth2/token",
                    **{"api-version": "2018-02-01", "resource": resource},
                )
            except (urllib.error.URLError, OSError, ValueError):
                return None
            token = doc.get("access_token") if isinstance(doc, dict) else None
            if not isinstance(token, str) or not token:
                return None
            found[key] = token
        return found

    def spot_notice(self) -> str | None:
        try:
            doc = self.imds.get_json(
                "/metadata/scheduledevents", **{"api-version": SCHEDULED_EVENTS_API}
            )
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return parse_scheduled_events(json.dumps(doc), self.instance_id() or "")

    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]:
        """From IMDS ``compute.tagsList``: no API call, no token."""
        del instance_id, creds
        try:
            doc = self.imds.get_json("/metadata/instance/compute", **{"api-version": IMDS_API})
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TagsUnreadable(f"metadata service: {exc}") from None
        listed = doc.get("tagsList") if isinstance(doc, dict) else None
        if not isinstance(listed, list):
            raise TagsUnreadable("IMDS compute has no tagsList")
        tags: dict[str, str] = {}
        for item in listed:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise TagsUnreadable(f"tagsList entry {str(item)[:60]!r} is not a tag")
            tags[item["name"]] = str(item.get("value") or "")
        return tags

    def _send(self, method: str, url: str, token: str, body: Any = None) -> int:
        data = json.dumps(body).encode() if body is not None else b""
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            resp.read()
            return int(resp.status)

    def _arm(self) -> str:
        return (self.endpoint_url or ARM).rstrip("/")

    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None:
        del instance_id
        url = f"{self._arm()}{self.resource_id()}/providers/Microsoft.Resources/tags/default"
        body = {"operation": "Merge", "properties": {"tags": {key: value}}}
        self._send("PATCH", f"{url}?api-version={ARM_API_TAGS}", creds["token"], body)

    def put_metrics(self, instance_id: str, metrics: Sequence[Metric], creds: Credentials) -> None:
        """One POST per metric (the custom metrics API takes one metric per request), on the
        VM's resource id, namespace ``gpufleet``, no dimensions.

        Azure needs the datapoint's ``time`` in the body (it does not stamp it on receipt, as
        CloudWatch and CloudMonitor do) and accepts only times from 20 minutes in the past to
        5 minutes in the future: the node's clock (kept by the Azure host's time sync) is
        bounded by the service, and the reaper reads the minute buckets it stored.
        """
        del instance_id
        base = self.endpoint_url or f"https://{self.region}.monitoring.azure.com"
        url = f"{base.rstrip('/')}{self.resource_id()}/metrics"
        when = dt.datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        token = creds.get("monitor") or ""
        if not token:
            raise RuntimeError("no Azure Monitor token (the VM's managed identity)")
        for name, value, _unit in metrics:
            body = {
                "time": when,
                "data": {
                    "baseData": {
                        "metric": name,
                        "namespace": names.NAMESPACE,
                        "dimNames": [],
                        "series": [
                            {"dimValues": [], "min": value, "max": value, "sum": value, "count": 1}
                        ],
                    }
                },
            }
            self._send("POST", url, token, body)

    def bucket_endpoint(self) -> str:
        # The storage account goes in front of the host (bucket.BlobStore).
        return "https://blob.core.windows.net"

    def poweroff(self) -> None:
        """Deallocate this VM through ARM (202 Accepted: the platform finishes it)."""
        creds = self.credentials()
        if not creds:
            raise RuntimeError("cannot deallocate: no managed-identity token from IMDS")
        url = f"{self._arm()}{self.resource_id()}/deallocate?api-version={ARM_API_COMPUTE}"

        def deallocate() -> None:
            status = self._send("POST", url, creds["token"])
            if status not in (200, 202):
                raise RuntimeError(f"deallocate answered HTTP {status}")

        retry_idempotent(deallocate, sleep=self.sleep)  # bounded; throttling, 5xx retried


# The registry: provider name -> its class. The only place that maps a name to a cloud.
CLOUDS: dict[str, type[NodeCloud]] = {
    AwsNode.name: AwsNode,
    AlicloudNode.name: AlicloudNode,
    TencentNode.name: TencentNode,
    AzureNode.name: AzureNode,
}


def node_cloud(
    provider: str, region: str, endpoint_url: str = "", metadata_url: str = ""
) -> NodeCloud:
    """The class for ``provider`` (a ValueError naming the known ones for any other)."""
    try:
        cls = CLOUDS[provider]
    except KeyError:
        raise ValueError(f"provider must be {' or '.join(CLOUDS)}, got {provider!r}") from None
    return cls(region, endpoint_url=endpoint_url, metadata_url=metadata_url)


def cloud_for(config: Config) -> NodeCloud:
    return node_cloud(config.provider, config.region, config.endpoint_url, config.metadata_url)


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
            "node_time": policy.format_utc(at),
            "gpu_util": gpu_util,
            "gpu_mem": gpu_mem,
            "unsynced": unsynced,
        }
        key = names.HEARTBEAT_OBJECT_PREFIX + self.instance_id
        store.put(key, json.dumps(body).encode(), deadline=time.monotonic() + self.timeout_s)


def retry_idempotent(
    call: Callable[[], None],
    attempts: int = LEASE_TAG_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    transient: Callable[[Exception], bool] | None = None,
) -> None:
    """Run an idempotent API call (setting a tag, a stop), trying again when the API was
    slow, unreachable or throttled (5xx, 429), or raised what ``transient`` says will pass
    (an API's own throttling code); a refusal (other 4xx) is final. Each try builds and signs
    its request anew, so the Alicloud nonce never repeats. Bounded: ``attempts`` tries,
    2 s, 4 s, ... apart."""
    for attempt in range(attempts):
        try:
            call()
            return
        except urllib.error.HTTPError as exc:
            if not bucket.retryable_status(exc.code) or attempt == attempts - 1:
                raise
        except (urllib.error.URLError, TimeoutError, OSError):
            if attempt == attempts - 1:
                raise
        except Exception as exc:
            if transient is None or not transient(exc) or attempt == attempts - 1:
                raise
        sleep(2.0 * (attempt + 1))


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
    samples: list[policy.Sample] = field(default_factory=list)
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


def read_lease(state_dir: Path) -> policy.Lease:
    path = state_dir / LEASE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return policy.Lease()
    except OSError as exc:
        return policy.Lease(error=f"{path}: {exc}")
    return policy.Lease.parse(text)


# ---------------------------------------------------------------------------- signals


@dataclass(frozen=True)
class Signals:
    """Everything besides the GPU/SSH samples that decides a run, gathered in one place
    (:meth:`Watchdog.gather_signals`). A new kind of activity (a job's own heartbeat, say)
    belongs there: it either holds the node like a lease does (``lease``) or is reported as
    unreadable (``problems``), which counts as activity until the hard TTL."""

    protected: bool
    lease: policy.Lease
    limits: policy.Limits
    problems: tuple[str, ...] = ()  # what could not be read: logged, published in status
    jobs: policy.Jobs = field(default_factory=policy.Jobs)  # fab train jobs (read_jobs)


def _pid_runs(pid: int, name: bytes) -> bool:
    try:
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists, or there is no /proc to tell: an unknown counts as active
    return name in cmd


def read_jobs(jobs_dir: Path, boot: dt.datetime) -> tuple[policy.Jobs, list[str]]:
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
            end = policy.parse_utc(str(st.get("ended_at") or ""))
        except ValueError:
            continue
        if end >= boot:
            ended.append(end)
            if st.get("stop_when_done") and not st.get("syncing"):
                stop_when_done = str(st.get("job"))
    jobs = policy.Jobs(running, max(ended) if ended else None, stop_when_done)
    return jobs, problems


def merge_leases(leases: Sequence[policy.Lease], now: dt.datetime) -> policy.Lease:
    """The lease that holds: the latest valid one; else an error if any was unreadable."""
    cap = now + dt.timedelta(hours=policy.MAX_LEASE_HOURS)
    valid = [lease.until for lease in leases if lease.until and now < lease.until <= cap]
    if valid:
        return policy.Lease(until=max(valid))
    errors = [lease.error for lease in leases if lease.error]
    if errors:
        return policy.Lease(error="; ".join(errors))
    ends = [lease.until for lease in leases if lease.until]
    return policy.Lease(until=max(ends)) if ends else policy.Lease()


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
    rules: policy.Policy = field(default_factory=policy.Policy)

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
                same_boot = abs((policy.parse_utc(state.tags["boot"]) - boot).total_seconds())
            except (ValueError, TypeError):
                same_boot = float("inf")
            if same_boot < 120:
                known = {str(k): str(v) for k, v in dict(state.tags.get("tags") or {}).items()}
        leases = [read_lease(Path(self.config.state_dir))]
        if known is not None and known.get(names.KEEP_ALIVE_UNTIL, "").strip():
            tag_lease = policy.Lease.parse(known[names.KEEP_ALIVE_UNTIL])
            if tag_lease.error:
                tag_lease = policy.Lease(error=f"{names.KEEP_ALIVE_UNTIL} tag: {tag_lease.error}")
            leases.append(tag_lease)
        if tags is None:
            # Unknown tags count as activity (a lease or protection may be there): the node
            # is never stopped for idleness, and the hard TTL still bounds the cost.
            leases.append(policy.Lease(error=problems[-1]))
        jobs, job_problems = read_jobs(Path(self.config.jobs_dir), boot)
        return Signals(
            protected=known is not None and is_protected(known),
            lease=merge_leases(leases, now),
            limits=self.config.limits(known),
            problems=tuple(problems + job_problems),
            jobs=jobs,
        )

    def decide(self, state: State, signals: Signals, now: dt.datetime) -> policy.Decision:
        return policy.decide_node(
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

    def ttl_reached(self, limits: policy.Limits, now: dt.datetime) -> bool:
        up_hours = (now - self.probe.boot_time()).total_seconds() / 3600
        return limits.ttl_hours is not None and up_hours >= limits.ttl_hours

    def status(self, state: State | None = None) -> tuple[policy.Decision, State, Signals]:
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
        elif not decision.warning and decision.action == policy.KEEP:
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
        self, state: State, decision: policy.Decision, signals: Signals, now: dt.datetime
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
        "lease_until": policy.format_utc(signals.lease.until) if signals.lease.until else None,
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
