"""A protocol fake of the Tencent Cloud API 3.0 actions the reaper uses, on 127.0.0.1.

No Tencent Cloud emulator exists, so this speaks just enough of the wire format for the
official SDK: POST /, JSON body, action and version in the X-TC-Action / X-TC-Version
headers, answers ``{"Response": {..., "RequestId"}}`` (errors as ``Response.Error`` with
HTTP 200, as the API does). Every request must carry a valid TC3-HMAC-SHA256 signature: the
fake checks it with :func:`tc3_signature`, written from Tencent's published "Signature v3"
steps and tested against the document's own example (tests/reaper/test_tencent_reaper.py),
not with the SDK's signer.

Actions: CVM DescribeInstances (tag filters or InstanceIds, Offset/Limit), StopInstances (all
or nothing, STOP_CHARGING required), Cloud Monitor GetMonitorData (QCE/CVM Gpuutil), and for
the node STS GetCallerIdentity and Tag TagResources. Faults: throttling, 5xx, answers too
slow for the client's timeout, HTML pages, partial metrics, a skewed Date.

GetMonitorData answers with exactly the fields of the SDK's GetMonitorDataResponse and
DataPoint models (tencentcloud-sdk-python-monitor 3.1.189, tencentcloud/monitor/v20180724/
models.py, read 2026-12-01; tests/reaper/test_tencent_reaper.py checks it): Period,
MetricName, StartTime, EndTime, Msg, DataPoints of Dimensions, Timestamps (Unix seconds,
"the times that have data") and Values (one per timestamp). MaxValues / MinValues /
AvgValues come only with SpecifyStatistics, which the reaper never sends: absent here (the
SDK leaves them None). No recorded real answer was found to replay; the API page
(https://cloud.tencent.com/document/api/248/31014) has an example not read in full here.

COS (the heartbeat objects): ``HEAD /<bucket>/<key>`` over COS's S3-compatible API, path
style, SigV4-signed (checked with botocore's own S3 signer); 200 with ``Last-Modified`` in
RFC 1123 form, as COS's HEAD Object page documents
(https://cloud.tencent.com/document/product/436/7745), or 404.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The metric as Tencent's CVM metrics page names it (infra/clouds/tencent/reaper.py cites it).
METRIC_GPU = "Gpuutil"
SECRET_ID = "AKIDfakefakefakefakefakefakefake"
SECRET_KEY = "fakeSecretKeyForTheLocalFake0000"
PRODUCTS = {  # action -> (service in the credential scope, API version)
    "DescribeInstances": ("cvm", "2017-03-12"),
    "StopInstances": ("cvm", "2017-03-12"),
    "StartInstances": ("cvm", "2017-03-12"),
    "GetMonitorData": ("monitor", "2018-07-24"),
    # What the node watchdog calls beside those (infra/clouds/tencent/node.py).
    "GetCallerIdentity": ("sts", "2018-08-13"),
    "TagResources": ("tag", "2018-08-13"),
}
ACCOUNT_UIN = "100012345678"
_AUTH = re.compile(
    r"^TC3-HMAC-SHA256 Credential=(?P<id>[^/]+)/(?P<date>\d{4}-\d{2}-\d{2})/(?P<service>[a-z]+)"
    r"/tc3_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<sig>[0-9a-f]{64})$"
)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def tc3_signature(
    secret_key: str,
    *,
    method: str,
    uri: str,
    query: str,
    headers: dict[str, str],  # the signed headers, lower-case names
    payload: bytes,
    timestamp: int,
    service: str,
) -> str:
    """TC3-HMAC-SHA256 by the published steps: canonical request, string to sign, the
    derived key (TC3+key -> date -> service -> "tc3_request"), hex HMAC."""
    names = sorted(headers)
    canonical = "\n".join(
        [
            method,
            uri,
            query,
            "".join(f"{n}:{headers[n].strip().lower()}\n" for n in names),
            ";".join(names),
            hashlib.sha256(payload).hexdigest(),
        ]
    )
    date = datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d")
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(
        ["TC3-HMAC-SHA256", str(timestamp), scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(_hmac(_hmac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass
class FakeCvm:
    instance_id: str
    tags: dict[str, str]
    created: str  # "2026-03-01T08:00:00Z", CVM's format
    state: str = "RUNNING"
    instance_type: str = "GT4.4XLARGE96"
    charge_type: str = "POSTPAID_BY_HOUR"
    latest_operation: str | None = None
    refuses_stop: bool = False  # e.g. local disks: STOP_CHARGING is not supported
    public_ip: str = ""
    private_ip: str = "10.0.0.7"


@dataclass
class FakeTencent:
    instances: list[FakeCvm] = field(default_factory=list)
    # instance id -> [(unix seconds, Gpuutil)]
    gpu: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # The bucket's heartbeat objects: key -> Last-Modified (unix seconds, COS's clock).
    bucket: str = "gpufleet-tc-0a1b2c3d-1250000000"
    objects: dict[str, float] = field(default_factory=dict)
    cos_status: int = 0  # answer every COS request with this status (0: normally)
    region: str = "ap-guangzhou"
    secrets: dict[str, str] = field(default_factory=lambda: {SECRET_ID: SECRET_KEY})
    throttle_rate: float = 0.0  # RequestLimitExceeded or a 503, at this rate
    fail_actions: set[str] = field(default_factory=set)  # InternalError
    status_actions: dict[str, int] = field(default_factory=dict)  # answered with this status
    html_actions: set[str] = field(default_factory=set)  # 200 with an HTML page
    slow_actions: dict[str, float] = field(default_factory=dict)  # sleep before answering
    drop_metrics: set[str] = field(default_factory=set)  # ids left out of GetMonitorData
    date_offset_s: float = 0.0  # the service's clock against this machine's
    seed: int = 5
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # why requests were refused
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ actions

    def describe_instances(self, q: dict[str, Any]) -> dict[str, Any]:
        limit, offset = q.get("Limit", 20), q.get("Offset", 0)
        if not isinstance(limit, int) or not 1 <= limit <= 100:
            return _error("InvalidParameterValue.LimitExceeded", "Limit 1..100")
        wanted: dict[str, list[str]] = {}
        for f in q.get("Filters") or []:
            name = f.get("Name", "")
            if not name.startswith("tag:"):
                return _error("InvalidFilter", name)
            wanted[name[4:]] = f.get("Values") or []
        ids = q.get("InstanceIds")
        match = [
            i
            for i in self.instances
            if all(i.tags.get(k) in v for k, v in wanted.items())
            and (ids is None or i.instance_id in ids)
        ]
        page = match[offset : offset + limit]
        return {
            "TotalCount": len(match),
            "InstanceSet": [
                {
                    "InstanceId": i.instance_id,
                    "InstanceState": i.state,
                    "InstanceType": i.instance_type,
                    "CreatedTime": i.created,
                    "InstanceChargeType": i.charge_type,
                    "LatestOperation": i.latest_operation,
                    # the SDK's Instance model: PublicIpAddresses, PrivateIpAddresses
                    "PublicIpAddresses": [i.public_ip] if i.public_ip else None,
                    "PrivateIpAddresses": [i.private_ip],
                    "Tags": [{"Key": k, "Value": v} for k, v in i.tags.items()],
                }
                for i in page
            ],
        }

    def stop_instances(self, q: dict[str, Any]) -> dict[str, Any]:
        if q.get("StoppedMode") != "STOP_CHARGING":
            return _error("InvalidParameterValue", f"fake wants STOP_CHARGING: {q}")
        ids = q.get("InstanceIds") or []
        if not 1 <= len(ids) <= 100:
            return _error("InvalidParameterValue.LimitExceeded", "1..100 ids")
        by_id = {i.instance_id: i for i in self.instances}
        # All or nothing, as the API: the first bad id fails the whole call.
        for iid in ids:
            inst = by_id.get(iid)
            if inst is None:
                return _error("InvalidInstanceId.NotFound", iid)
            if inst.refuses_stop:
                return _error("UnsupportedOperation.StoppedModeStopCharging", iid)
            if inst.state != "RUNNING":
                return _error(f"UnsupportedOperation.InstanceState{inst.state.title()}", iid)
        for iid in ids:
            by_id[iid].state = "STOPPED"
        return {}

    def start_instances(self, q: dict[str, Any]) -> dict[str, Any]:
        """StartInstances (the SDK's StartInstancesRequest: InstanceIds, at most 100), all or
        nothing like StopInstances here."""
        ids = q.get("InstanceIds") or []
        refused = self._refusal(ids, "STOPPED")
        if refused:
            return refused
        for inst in self.instances:
            if inst.instance_id in ids:
                inst.state = "RUNNING"
        return {}

    def _refusal(self, ids: list[str], state: str) -> dict[str, Any] | None:
        """All or nothing: the first id that is unknown or not in ``state`` fails the call."""
        if not 1 <= len(ids) <= 100:
            return _error("InvalidParameterValue.LimitExceeded", "1..100 ids")
        by_id = {i.instance_id: i for i in self.instances}
        for iid in ids:
            inst = by_id.get(iid)
            if inst is None:
                return _error("InvalidInstanceId.NotFound", iid)
            if inst.state != state:
                return _error(f"UnsupportedOperation.InstanceState{inst.state.title()}", iid)
        return None

    def get_monitor_data(self, q: dict[str, Any]) -> dict[str, Any]:
        if q.get("Namespace") != "QCE/CVM" or q.get("MetricName") != METRIC_GPU:
            return _error("InvalidParameterValue", f"{q.get('Namespace')} {q.get('MetricName')}")
        wanted = q.get("Instances") or []
        if not 1 <= len(wanted) <= 50:
            return _error("InvalidParameterValue", "1..50 instances")
        start = datetime.fromisoformat(q["StartTime"]).timestamp()
        end = datetime.fromisoformat(q["EndTime"]).timestamp()
        points = []
        for inst in wanted:
            dims = inst.get("Dimensions") or []
            iid = next((d["Value"] for d in dims if d.get("Name") == "InstanceId"), None)
            if iid is None:
                return _error("InvalidParameterValue", "dimension InstanceId")
            if iid in self.drop_metrics:
                continue
            seen = sorted((t, v) for t, v in self.gpu.get(iid, []) if start <= t <= end)
            points.append(
                {
                    "Dimensions": [{"Name": "InstanceId", "Value": iid}],
                    "Timestamps": [float(t) for t, _ in seen],
                    "Values": [v for _, v in seen],
                }
            )
        return {
            "Period": q.get("Period", 300),
            "MetricName": METRIC_GPU,
            "DataPoints": points,
            "StartTime": q["StartTime"],
            "EndTime": q["EndTime"],
            "Msg": "",
        }

    def get_caller_identity(self, q: dict[str, Any]) -> dict[str, Any]:
        return {
            "Arn": f"qcs::cam::uin/{ACCOUNT_UIN}:roleName/gpufleet-node",
            "AccountId": ACCOUNT_UIN,
            "UserId": "role-id",
            "PrincipalId": ACCOUNT_UIN,
            "Type": "CAMRole",
        }

    def tag_resources(self, q: dict[str, Any]) -> dict[str, Any]:
        by_id = {i.instance_id: i for i in self.instances}
        for name in q.get("ResourceList") or []:
            m = re.fullmatch(rf"qcs::cvm:{self.region}:uin/(\d+):instance/([\w-]+)", name)
            if m is None or m[1] != ACCOUNT_UIN or m[2] not in by_id:
                return _error("InvalidParameterValue.ResourceDescriptionError", name)
        for name in q["ResourceList"]:
            for t in q.get("Tags") or []:
                by_id[name.rsplit("/", 1)[1]].tags[t["TagKey"]] = t["TagValue"]
        return {}

    # ------------------------------------------------------------------ server

    def handle(self, action: str, q: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((action, q))
            if action in self.status_actions:
                return self.status_actions[action], {"message": "fault injected"}
            if action in self.fail_actions:
                return 200, _error("InternalError", "fault injected")
            if self.throttle_rate and self.rng.random() < self.throttle_rate:
                if self.rng.random() < 0.5:
                    return 200, _error("RequestLimitExceeded", "too many requests")
                return 503, {"message": "try later"}
            fn = {
                "DescribeInstances": self.describe_instances,
                "StopInstances": self.stop_instances,
                "StartInstances": self.start_instances,
                "GetMonitorData": self.get_monitor_data,
                "GetCallerIdentity": self.get_caller_identity,
                "TagResources": self.tag_resources,
            }[action]
            return 200, fn(q)

    def head_object(self, path: str, headers: Any) -> tuple[int, dict[str, str]]:
        """COS HEAD Object, path style; the SigV4 signature checked with botocore's."""
        with self.lock:
            self.calls.append(("HeadObject", {"path": path}))
        if not self._sigv4_ok(path, headers):
            with self.lock:
                self.rejected.append("SignatureDoesNotMatch")
            return 403, {}
        if self.cos_status:
            return self.cos_status, {}
        bucket, _, key = path.lstrip("/").partition("/")
        when = self.objects.get(urllib.parse.unquote(key))
        if bucket != self.bucket or when is None:
            return 404, {}
        return 200, {"Last-Modified": formatdate(when, usegmt=True), "Content-Length": "0"}

    def _sigv4_ok(self, path: str, headers: Any) -> bool:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        m = re.match(
            r"AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([\w-]+)/s3/aws4_request, "
            r"SignedHeaders=([\w;-]+), Signature=([0-9a-f]{64})$",
            headers.get("Authorization", ""),
        )
        if m is None or m[1] not in self.secrets or m[2] != self.region:
            return False
        signed = {n: headers.get(n, "") for n in m[3].split(";") if n != "host"}
        request = AWSRequest(
            method="HEAD", url=f"http://{headers.get('Host', '')}{path}", headers=signed
        )
        request.context["timestamp"] = headers.get("x-amz-date", "")
        signer = S3SigV4Auth(
            Credentials(m[1], self.secrets[m[1]], headers.get("x-amz-security-token")),
            "s3",
            self.region,
        )
        want = signer.signature(
            signer.string_to_sign(request, signer.canonical_request(request)), request
        )
        return hmac.compare_digest(want, m[4])

    def check_signature(self, method: str, path: str, headers: Any, body: bytes) -> str | None:
        """None if the request is TC3-signed correctly, else the error code to answer."""
        m = _AUTH.match(headers.get("Authorization", ""))
        action = headers.get("X-TC-Action", "")
        if m is None:
            return "AuthFailure.SignatureFailure"
        if action not in PRODUCTS:
            return "InvalidAction"
        service, version = PRODUCTS[action]
        if m["service"] != service or headers.get("X-TC-Version") != version:
            return "AuthFailure.SignatureFailure"
        if headers.get("X-TC-Region") != self.region:
            return "InvalidParameterValue.Region"
        secret = self.secrets.get(m["id"])
        if secret is None:
            return "AuthFailure.SecretIdNotFound"
        try:
            stamp = int(headers.get("X-TC-Timestamp", ""))
        except ValueError:
            return "AuthFailure.SignatureFailure"
        if abs(stamp - time.time()) > 300:
            return "AuthFailure.SignatureExpire"
        if datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d") != m["date"]:
            return "AuthFailure.SignatureFailure"
        signed = m["signed"].split(";")
        if not {"content-type", "host"} <= set(signed):
            return "AuthFailure.SignatureFailure"
        uri, _, query = path.partition("?")
        want = tc3_signature(
            secret,
            method=method,
            uri=uri,
            query=query,
            headers={n: headers.get(n, "") for n in signed},
            payload=body,
            timestamp=stamp,
            service=service,
        )
        if not hmac.compare_digest(want, m["sig"]):
            return "AuthFailure.SignatureFailure"
        return None

    @contextmanager
    def running(self) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def date_time_string(self, timestamp: float | None = None) -> str:
                return formatdate(time.time() + fake.date_offset_s, usegmt=True)

            def do_HEAD(self) -> None:
                status, headers = fake.head_object(self.path, self.headers)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                action = self.headers.get("X-TC-Action", "")
                why = fake.check_signature("POST", self.path, self.headers, body)
                if why is not None:
                    with fake.lock:
                        fake.rejected.append(why)
                    return self._json(200, _error(why, "refused by the fake"))
                if action in fake.slow_actions:
                    time.sleep(fake.slow_actions[action])
                if action in fake.html_actions:
                    return self._html()
                status, out = fake.handle(action, json.loads(body or b"{}"))
                self._json(status, out)

            def _json(self, status: int, out: dict[str, Any]) -> None:
                if status == 200:
                    out = {"Response": {**out, "RequestId": "fake-request"}}
                data = json.dumps(out).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to answer

            def _html(self) -> None:
                data = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            server.server_close()


def _error(code: str, message: str) -> dict[str, Any]:
    return {"Error": {"Code": code, "Message": message}}
