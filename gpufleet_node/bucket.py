"""gpufleet scratch sync: checkpoints on the node's scratch -> the stack's bucket.

Standard library only, no project imports: this module of the node package is installed
with the watchdog (``/opt/gpufleet/gpufleet_node/bucket.py``) and runs on the node's system
Python (3.10+); the reaper imports it from here too (Tencent's heartbeat objects). It speaks
the S3 REST API with AWS Signature Version 4, so one tested code path serves both clouds
(which endpoint is each cloud's: ``bucket_endpoint()`` of its class in clouds/):

* AWS S3: ``https://<bucket>.s3.<region>.amazonaws.com`` (virtual-hosted style).
* Alibaba Cloud OSS through its S3-compatible endpoint,
  ``https://<bucket>.s3.oss-<region>-internal.aliyuncs.com``: "OSS is compatible with the AWS
  S3 API" (https://www.alibabacloud.com/help/en/oss/developer-reference/use-amazon-s3-sdks-to-access-oss).

Azure Blob Storage is not S3-compatible: :class:`BlobStore` speaks its own REST API (Put
Blob, Put Block / Put Block List for large files, Get Blob Properties) with a managed-identity
bearer token and ``x-ms-version``, behind the same methods; the cloud class names its store
(``bucket_store`` of its class in clouds/): no table here maps a kind to a store.

Why not ``aws s3 sync`` / ``ossutil``: nothing installs them on the nodes, and a missing or
broken CLI was exactly how scratch got lost. A built-in sync cannot be missing when the
watchdog runs, has the same code on every image, and is tested here against moto S3.

What it guarantees:

* a file counts as synced only after the bucket acknowledged it (``Content-MD5`` on every
  PUT and part, so a corrupted upload is refused by the service, not recorded as done), and
  every object carries the SHA-256 of its bytes as user metadata (:data:`META_SHA256`);
* a download is checked (that SHA-256, else a single-part MD5) before the file takes its
  name, continues a part file only from the same object version (If-Match on its ETag),
  and ends in bounded time: a total deadline and a minimum rate (a trickle is an error);
* the record of what is synced (size + mtime of each file when it was uploaded, like
  ``aws s3 sync``) lives on scratch itself (``.gpufleet-sync.json``): it vanishes together
  with an erased instance store, so it can never claim files that are no longer there;
* every request is bounded (socket timeout, a few retries with full-jitter backoff on
  5xx/429/network errors that honour Retry-After, one loop for both stores:
  :func:`send_bounded`) and the whole sync has a deadline, checked before each try, each
  wait between tries and each chunk of a body;
* nothing is ever deleted from the bucket (no DeleteObject call exists in this file).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import email.utils
import functools
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

UTC = dt.timezone.utc  # noqa: UP017 (the node's Python may be 3.10)
MANIFEST = ".gpufleet-sync.json"
PART_SUFFIX = ".gpufleet-part"  # a download on its way, continued by the next try
# Beside each part file: the key, size and ETag its bytes came from (JSON). It ends in
# PART_SUFFIX too, so whatever skips part files skips it and sweep_parts removes it.
SIDECAR_SUFFIX = ".gpufleet-sidecar" + PART_SUFFIX
# The user-metadata name holding the SHA-256 (hex) of an object's bytes: S3 header
# x-amz-meta-gpufleetsha256, Blob header x-ms-meta-gpufleetsha256 (Azure metadata names must
# be C# identifiers: no dashes).
META_SHA256 = "gpufleetsha256"
PROBE_KEY = ".gpufleet/sync-check/{node}"
# Files up to this size go in one PUT; larger ones as multipart uploads (S3 allows at most
# 5 GiB in one PUT and 10,000 parts per upload, each part >= 5 MiB but the last:
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html).
PART_SIZE = 64 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS = 10_000

Credentials = dict[str, str]  # access_key_id, secret, token (may be "")


@dataclass(frozen=True)
class Entry:
    """One object of a listing: its size and what the store says about its bytes.

    ``digest`` is S3's ETag without its quotes (the MD5 of a single-PUT object in hex, or
    ``<md5 of the parts' MD5s>-<parts>`` for a multipart upload; neither under SSE-KMS:
    botocore's s3 model, shape ETag) or Blob's Content-MD5 as hex (the List Blobs answer's
    Properties; Azure's ETag says nothing about the bytes); "" when there is none.
    ``etag`` is the object's ETag exactly as the listing gives it (S3 ListObjectsV2 ETag,
    quotes included; Blob List Blobs Properties/Etag), for If-Match; "" when none.
    """

    size: int
    digest: str = ""
    etag: str = ""


# ---------------------------------------------------------------------------- signing


def _quote(value: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(value, safe=safe)


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
    extra: dict[str, str] | None = None,
    payload_hash: str = "",
) -> dict[str, str]:
    """AWS Signature Version 4 headers for one request (docs.aws.amazon.com, "Create a signed
    AWS API request"), so the node needs no SDK.

    ``url``'s path must already be percent-encoded once. S3 signs that path as it is; every
    other service encodes it a second time (the canonical-URI rule of the same page).
    """
    when = (now or dt.datetime.now(UTC)).astimezone(UTC)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = when.strftime("%Y%m%d")
    parts = urllib.parse.urlsplit(url)
    # A caller that already hashed the body (a PUT records its SHA-256 as metadata) hands
    # the hex in: S3 then refuses the PUT if the bytes it got hash otherwise
    # (XAmzContentSHA256Mismatch), so the recorded digest is checked by the service too.
    payload_hash = payload_hash or hashlib.sha256(body).hexdigest()
    headers = {"host": parts.netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    if content_type:
        headers["content-type"] = content_type
    if token:
        headers["x-amz-security-token"] = token
    for name, value in (extra or {}).items():
        headers[name.lower()] = value
    signed = ";".join(sorted(headers))
    canonical_query = "&".join(
        f"{_quote(k)}={_quote(v)}"
        for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    )
    path = parts.path or "/"
    canonical_path = path if service == "s3" else _quote(path, safe="/-_.~")
    canonical = "\n".join(
        [
            method,
            canonical_path,
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


# ---------------------------------------------------------------------------- requests


def content_md5(data: bytes) -> str:
    """The Content-MD5 header: the service refuses a body that does not match it."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def new_sha256() -> Any:
    """The whole-file digest (one place, so scripts/bench_digest.py can measure its cost)."""
    return hashlib.sha256()


# What a failure means to the person who reads it (StoreError.cause), from the service's
# error code or HTTP status. Throttling answers, each from its cloud's documentation:
# * S3: 503 SlowDown, "Please reduce your request rate", retried with exponential backoff
#   (docs.aws.amazon.com/AmazonS3/latest/userguide/ErrorBestPractices.html, and
#   repost.aws/knowledge-center/http-5xx-errors-s3; read 2026-12-05).
# * OSS: 503 DownloadTrafficRateLimitExceeded, UploadTrafficRateLimitExceeded,
#   MetaOperationQpsLimitExceeded, ServiceUnavailable, TotalQpsLimitExceeded,
#   ActiveRequestLimitExceeded, PartitionQpsLimitted; 429 QpsLimitExceeded
#   (alibabacloud.com/help/en/oss/support/http-status-code-503,
#   help.aliyun.com/en/oss/user-guide/429-error, help.aliyun.com/en/oss/user-guide/0026-00000028;
#   read 2026-12-05).
# * COS: its error-code page (tencentcloud.com/document/api/436/46214, updated 2025-05-27,
#   read 2026-12-05) was not readable here past its table of contents: its throttling
#   answers are taken as what every store above uses, any 503 or 429 (the status decides,
#   whatever the code), plus S3's SlowDown, which COS's S3-compatible API returns.
# * Blob: 503 ServerBusy and 500 OperationTimedOut when a partition is at its limit, "use an
#   exponential backoff policy" (docs.azure.cn/en-us/storage/common/
#   scalability-targets-resource-provider, and the BlobErrorCode.ServerBusy /
#   OperationTimedOut pages on learn.microsoft.com; read 2026-12-05).
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "ServerBusy",
        "OperationTimedOut",
        "TooManyRequests",
        "ServiceUnavailable",
        "DownloadTrafficRateLimitExceeded",
        "UploadTrafficRateLimitExceeded",
        "MetaOperationQpsLimitExceeded",
        "TotalQpsLimitExceeded",
        "ActiveRequestLimitExceeded",
        "PartitionQpsLimitted",
        "QpsLimitExceeded",
    }
)
# A body that did not arrive as sent: S3's BadDigest / InvalidDigest (Content-MD5) and
# XAmzContentSHA256Mismatch (x-amz-content-sha256) (docs.aws.amazon.com/AmazonS3/latest/API/
# ErrorResponses.html, read 2026-12-05), Blob's Md5Mismatch, and our own checks.
DAMAGE_CODES = frozenset(
    {
        "Digest",
        "BadDigest",
        "InvalidDigest",
        "XAmzContentSHA256Mismatch",
        "Md5Mismatch",
        "ShortRead",
    }
)
CHANGED_CODES = frozenset({"Changed", "PreconditionFailed", "ConditionNotMet"})
CREDENTIAL_CODES = frozenset(
    {
        "NoCredentials",
        "InvalidAccessKeyId",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "SignatureDoesNotMatch",
        "AuthenticationFailed",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
    }
)
MISSING_CODES = frozenset(
    {"NoSuchKey", "NoSuchBucket", "BlobNotFound", "ContainerNotFound", "NoSuchUpload"}
)
CAUSES = (
    "throttled",
    "denied",
    "missing",
    "damaged",
    "changed",
    "slow",
    "deadline",
    "unreachable",
    "credentials",
    "error",
)


def classify(code: str, status: int) -> str:
    """One of CAUSES for a failure with this error code and HTTP status."""
    if code == "Deadline":
        return "deadline"
    if code == "TooSlow":
        return "slow"
    if code == "Unreachable":
        return "unreachable"
    if code in DAMAGE_CODES:
        return "damaged"
    if code in CHANGED_CODES or status == 412:
        return "changed"
    if code in THROTTLE_CODES or status in (429, 503):
        return "throttled"
    if code in CREDENTIAL_CODES or status == 401:
        return "credentials"
    if status == 403:
        return "denied"
    if code in MISSING_CODES or status == 404:
        return "missing"
    return "error"


class StoreError(Exception):
    """The bucket refused or could not be reached; ``code`` is the service's error code (or
    ours: Deadline, TooSlow, Unreachable, Digest, Changed, ShortRead), ``cause`` what it
    means to a person (one of CAUSES)."""

    def __init__(self, message: str, code: str = "", status: int = 0, cause: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.cause = cause or classify(code, status)


def _xml_text(body: bytes, name: str) -> str:
    """The text of the first element called ``name``, whatever its namespace."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return ""
    for element in root.iter():
        if element.tag == name or element.tag.endswith("}" + name):
            return (element.text or "").strip()
    return ""


# A try that got no usable answer: refused, reset or timed out (OSError, URLError), an
# answer cut short or garbled (http.client.HTTPException: IncompleteRead, BadStatusLine), or
# a URL urllib cannot send (ValueError). Each is tried again.
TRANSPORT_ERRORS = (urllib.error.URLError, OSError, http.client.HTTPException, ValueError)
CHUNK = 1024 * 1024  # one body read: the deadline and the rate are checked between reads
MAX_ERROR_BODY = 64 * 1024  # an error answer's XML is small; more is not read
MIN_RATE = 64 * 1024  # bytes/s: a body slower than this on average ...
RATE_GRACE_S = 30.0  # ... once this long has passed since the request, is given up
MAX_RETRY_AFTER = 60.0  # the longest wait a Retry-After answer buys (within the deadline)


def backoff(attempt: int, throttled: bool = False) -> float:
    """The most seconds to wait before try number ``attempt`` (0 is the first): 0, 0.5, 1,
    2, 2, ...; after a throttling answer 0, 1, 2, 4, 8, 16, 20, ... The wait itself is drawn
    between 0 and this ("full jitter": docs.aws.amazon.com/sdkref/latest/guide/
    feature-retry-behavior.html and the AWS Architecture Blog's "Exponential Backoff And
    Jitter", read 2026-12-05), so nodes throttled together do not come back together."""
    if attempt <= 0:
        return 0.0
    if throttled:
        return min(20.0, 1.0 * 2 ** (attempt - 1))
    return min(2.0, 0.5 * 2 ** (attempt - 1))


def retryable_status(status: int) -> bool:
    """An HTTP answer worth another try: the service failed (5xx) or throttled (429)."""
    return status >= 500 or status == 429


def retry_after(value: str, now: float | None = None) -> float:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP-date, RFC 9110
    section 10.2.3); 0 when absent or unreadable."""
    value = (value or "").strip()
    if not value:
        return 0.0
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    wall = time.time() if now is None else now
    return max(0.0, when.timestamp() - wall)


def _past_deadline(last: StoreError | None) -> StoreError:
    return StoreError("deadline reached" + (f" (last try: {last})" if last else ""), "Deadline")


class _CallerError(Exception):
    """What a caller's callback raised (a full disk, a changed object): passed on as it is,
    never taken for a network failure and tried again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _socket_of(resp: Any) -> Any:
    """The socket under an http.client answer, to shorten its timeout as the deadline
    nears (best effort: None when urllib's objects are shaped otherwise)."""
    fp = getattr(resp, "fp", None)
    for _ in range(3):  # HTTPError -> HTTPResponse -> BufferedReader -> SocketIO
        raw = getattr(fp, "raw", None)
        sock = getattr(raw, "_sock", None)
        if sock is not None and hasattr(sock, "settimeout"):
            return sock
        fp = getattr(fp, "fp", None) or raw
    return None


def read_body(
    resp: Any,
    sink: Callable[[bytes], None],
    *,
    label: str,
    started: float,
    timeout: float,
    deadline: float | None,
    min_rate: float,
    rate_grace_s: float,
    clock: Callable[[], float],
    limit: int = 0,
) -> int:
    """Stream ``resp``'s body to ``sink`` in reads of at most CHUNK; the number of bytes.

    Between reads: past ``deadline`` raises StoreError("Deadline"); slower than ``min_rate``
    bytes/s on average once ``rate_grace_s`` have passed since ``started`` raises
    StoreError("TooSlow"). Each read waits at most ``timeout`` (and never past the deadline)
    for its first byte, so a stalled body ends too. A body shorter than its Content-Length
    raises http.client.IncompleteRead. ``limit`` > 0 stops reading after that many bytes.
    """
    read = getattr(resp, "read1", None) or resp.read
    sock = _socket_of(resp)
    got = 0
    while True:
        now = clock()
        if deadline is not None and now >= deadline:
            raise StoreError(f"{label}: deadline reached after {got} bytes of the body", "Deadline")
        if sock is not None:
            wait = timeout if deadline is None else min(timeout, deadline - now)
            with contextlib.suppress(OSError):
                sock.settimeout(max(0.001, wait))
        want = CHUNK if not limit else min(CHUNK, limit - got)
        if want <= 0:
            return got
        data = read(want)
        if not data:
            left = getattr(resp, "length", None)
            if isinstance(left, int) and left > 0:
                raise http.client.IncompleteRead(b"", left)
            return got
        got += len(data)
        try:
            sink(data)
        except Exception as exc:  # the caller's, passed on unchanged
            raise _CallerError(exc) from exc
        elapsed = clock() - started
        if min_rate > 0 and elapsed > rate_grace_s and got / elapsed < min_rate:
            raise StoreError(
                f"{label}: {got} bytes in {elapsed:.0f} s, slower than {min_rate:.0f} bytes/s "
                "(the store's min_rate)",
                "TooSlow",
            )


def _answer_error(
    exc: urllib.error.HTTPError,
    request: urllib.request.Request,
    read_error: Callable[[Any, Callable[[bytes], None]], object],
    *,
    label: str,
    error_header: str,
) -> StoreError:
    """The StoreError an HTTP error answer means: its XML ``<Code>`` (else ``error_header``,
    else ``HTTP<status>``) and ``<Message>`` (else the reason), read from at most
    MAX_ERROR_BODY bytes of its body by ``read_error(response, sink)``; a body that cannot
    be read leaves the status alone to say what happened."""
    data = bytearray()
    if request.get_method() != "HEAD":
        with contextlib.suppress(*TRANSPORT_ERRORS, StoreError, _CallerError):
            read_error(exc, data.extend)
    code = _xml_text(bytes(data), "Code") or (
        exc.headers.get(error_header, "") if error_header else ""
    )
    code = code or f"HTTP{exc.code}"
    message = _xml_text(bytes(data), "Message") or exc.reason
    return StoreError(f"{label}: {code} {message}", code, exc.code)


def send_bounded(
    build: Callable[[], urllib.request.Request],
    *,
    label: str,
    attempts: int,
    timeout: float,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    error_header: str = "",
    clock: Callable[[], float] = time.monotonic,
    rng: Callable[[], float] = random.random,
    sink: Callable[[bytes], None] | None = None,
    on_answer: Callable[[int, dict[str, str]], None] | None = None,
    min_rate: float = 0.0,
    rate_grace_s: float = RATE_GRACE_S,
) -> tuple[int, dict[str, str], bytes]:
    """Send ``build()``'s request in at most ``attempts`` tries: (status, headers, body).

    ``build`` runs again for each try (fresh credentials, signature, date and Range); what
    it raises (no credentials) is final. Tried again after a wait drawn by ``rng`` below
    :func:`backoff` (the throttling ceiling after a throttling answer), or as long as the
    answer's Retry-After asks (at most MAX_RETRY_AFTER): 5xx, 429, a body slower than
    ``min_rate`` and :data:`TRANSPORT_ERRORS`; any other HTTP answer is final. ``deadline``
    (on ``clock``) bounds the whole: each try's socket timeout is cut to what is left, the
    body is read in chunks with the deadline checked between them, and no wait starts that
    would end after it.

    With ``sink`` the body goes there as it arrives (the returned body is b""), after
    ``on_answer(status, headers)``; what either raises is passed on, not tried again.
    Raises StoreError: the answer's XML ``<Code>`` (else its ``error_header``, else
    ``HTTP<status>``) with its status; "Unreachable" for a try with no answer; "TooSlow";
    "Deadline", naming the last failure, when the deadline ends the tries.
    """
    last: StoreError | None = None
    wait_floor = 0.0
    throttled = False
    for attempt in range(max(1, attempts)):
        wait = max(rng() * backoff(attempt, throttled), wait_floor) if attempt else 0.0
        if deadline is not None and clock() + wait >= deadline:
            raise _past_deadline(last)
        if wait:
            sleep(wait)
        limit = timeout if deadline is None else min(timeout, deadline - clock())
        if limit <= 0:
            raise _past_deadline(last)
        request = build()
        # Both bodies (the answer's, an error's) are read on this try's clock and deadline.
        read = functools.partial(
            read_body, label=label, started=clock(), deadline=deadline, rate_grace_s=rate_grace_s
        )
        try:
            with urllib.request.urlopen(request, timeout=limit) as resp:
                headers = {k.lower(): v for k, v in resp.headers.items()}
                chunks: list[bytes] = []
                if on_answer is not None:
                    try:
                        on_answer(resp.status, headers)
                    except Exception as exc:  # the caller's
                        raise _CallerError(exc) from exc
                sink_to = sink if sink is not None else chunks.append
                read(resp, sink_to, timeout=limit, min_rate=min_rate, clock=clock)
                return resp.status, headers, b"".join(chunks)
        except _CallerError as exc:
            raise exc.error from None
        except urllib.error.HTTPError as exc:
            read_error = functools.partial(
                read, timeout=min(limit, 10.0), min_rate=0.0, clock=clock, limit=MAX_ERROR_BODY
            )
            last = _answer_error(exc, request, read_error, label=label, error_header=error_header)
            if not retryable_status(exc.code):
                raise last from None
            throttled = last.cause == "throttled"
            wait_floor = min(MAX_RETRY_AFTER, retry_after(exc.headers.get("Retry-After", "")))
        except StoreError as exc:
            if exc.code != "TooSlow":
                raise  # the deadline: nothing is left to try with
            last, throttled, wait_floor = exc, False, 0.0
        except TRANSPORT_ERRORS as exc:
            reason = getattr(exc, "reason", exc)
            last = StoreError(f"{label}: {reason}", code="Unreachable")
            throttled, wait_floor = False, 0.0
    assert last is not None
    raise last


# ---------------------------------------------------------------------------- downloads


@dataclass(frozen=True)
class Downloaded:
    """What :meth:`BucketStore.download_file` checked: the file's SHA-256 (hex) and against
    what: "sha256" (the caller's or the object's recorded digest), "md5" (a single-part
    ETag or Blob's Content-MD5) or "size" (the store recorded nothing)."""

    sha256: str
    checked: str


def _bare_etag(etag: str) -> str:
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


def _quoted_etag(etag: str) -> str:
    return f'"{_bare_etag(etag)}"'


def sidecar_of(part: Path) -> Path:
    return part.with_name(part.name[: -len(PART_SUFFIX)] + SIDECAR_SUFFIX)


def sweep_parts(root: Path, older_than_s: float) -> int:
    """Remove ``*.gpufleet-part`` files (part files and their sidecars) under ``root`` not
    modified for ``older_than_s`` seconds, as a killed run leaves them; how many went. A
    younger one may belong to a download still running and stays."""
    if not root.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    removed = 0
    for path in root.rglob("*" + PART_SUFFIX):
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_mtime > cutoff:
                continue
            path.unlink()
            removed += 1
        except OSError:
            continue  # gone meanwhile, or not ours to remove
    return removed


_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")


class _Download:
    """One download's state: the part file, its sidecar, what the store said."""

    def __init__(self, store: BucketStore, key: str, dest: Path, size: int, etag: str) -> None:
        self.store, self.key, self.dest, self.size = store, key, dest, size
        self.part = dest.with_name(dest.name + PART_SUFFIX)
        self.side = dest.with_name(dest.name + SIDECAR_SUFFIX)
        self.etag = etag  # the version every ranged GET asks for (If-Match); "" unknown yet
        self.pinned = bool(etag)
        self.meta_sha256 = ""
        self.md5 = ""  # hex: a single-part ETag or Blob's Content-MD5 of the whole blob
        self.hasher = new_sha256()
        self.have = 0
        self.out: Any = None
        self.expect_start = 0

    def open(self) -> None:
        """Continue the part file only when its sidecar names this key, size and ETag."""
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        keep = 0
        try:
            side = json.loads(self.side.read_text())
            have = self.part.stat().st_size
            if (
                side.get("key") == self.key
                and side.get("size") == self.size
                and side.get("etag")
                and (not self.etag or _bare_etag(side["etag"]) == _bare_etag(self.etag))
                and have <= self.size
            ):
                keep = have
                self.etag = str(side["etag"])
                self.meta_sha256 = str(side.get("sha256", ""))
                self.md5 = str(side.get("md5", ""))
        except (OSError, ValueError, TypeError, AttributeError):
            keep = 0
        self.out = self.part.open("r+b" if keep else "wb")
        if keep:
            self.out.truncate(keep)
            while chunk := self.out.read(CHUNK):
                self.hasher.update(chunk)
        self.have = keep

    def restart(self) -> None:
        """The object changed: drop what we have and its version."""
        self.out.seek(0)
        self.out.truncate()
        self.hasher = new_sha256()
        self.have = 0
        self.etag = ""
        self.meta_sha256 = self.md5 = ""
        self.side.unlink(missing_ok=True)

    def headers(self) -> dict[str, str]:
        end = min(self.size, self.have + PART_SIZE) - 1
        self.expect_start = self.have
        out = {"Range": f"bytes={self.have}-{end}"}
        if self.etag:
            out["If-Match"] = _quoted_etag(self.etag)
        return out

    def answer(self, status: int, headers: dict[str, str]) -> None:
        label = f"GET {self.key}"
        if status == 200:  # the whole object, whatever we asked
            total = int(headers.get("content-length", "-1"))
            if self.have:
                self.out.seek(0)
                self.out.truncate()
                self.hasher = new_sha256()
                self.have = 0
        else:
            match = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", headers.get("content-range", ""))
            if not match:
                raise StoreError(f"{label}: a {status} answer without Content-Range", "BadAnswer")
            if int(match.group(1)) != self.expect_start:
                raise StoreError(
                    f"{label}: asked from byte {self.expect_start}, got from {match.group(1)}",
                    "BadAnswer",
                )
            total = int(match.group(3)) if match.group(3) != "*" else self.size
        if total != self.size:
            raise StoreError(
                f"{label}: the object is {total} bytes, {self.size} expected: it was replaced; "
                "list it again",
                "Changed",
            )
        etag = headers.get("etag", "")
        if self.etag and etag and _bare_etag(etag) != _bare_etag(self.etag):
            raise StoreError(f"{label}: ETag {etag}, {self.etag} expected", "Changed", 412)
        meta = headers.get(self.store.meta_header, "").strip().lower()
        md5 = self.store.whole_md5(status, headers)
        if etag and (etag != self.etag or meta != self.meta_sha256 or md5 != self.md5):
            self.etag, self.meta_sha256, self.md5 = etag, meta, md5
            record = {"key": self.key, "size": self.size, "etag": etag, "sha256": meta, "md5": md5}
            self.side.write_text(json.dumps(record))

    def write(self, data: bytes) -> None:
        if self.have + len(data) > self.size:
            raise StoreError(f"GET {self.key}: more than {self.size} bytes", "Changed")
        self.out.write(data)
        self.hasher.update(data)
        self.have += len(data)

    def finish(self, sha256: str, restarted: bool) -> Downloaded:
        """Check the part file, then (and only then) give it its name."""
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        got = self.hasher.hexdigest()
        expected, checked, md5 = (sha256 or self.meta_sha256).strip().lower(), "size", ""
        if self.part.stat().st_size != self.size:
            self.discard()
            raise StoreError(
                f"GET {self.key}: {self.have} bytes, {self.size} expected", "ShortRead"
            )
        if expected:
            checked = "sha256"
        elif self.md5:
            checked = "md5"
            hasher = hashlib.md5(usedforsecurity=False)
            with self.part.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    hasher.update(chunk)
            got_md5 = hasher.hexdigest()
            expected, md5 = self.md5, got_md5
        if checked != "size" and (md5 or got) != expected:
            self.discard()
            why = " (the object was replaced while it was read)" if restarted else ""
            raise StoreError(
                f"GET {self.key}: the bytes read do not match its {checked} {expected}{why}; "
                "nothing was kept: run it again, and if it repeats the stored object is damaged",
                "Digest",
            )
        os.replace(self.part, self.dest)
        self.side.unlink(missing_ok=True)
        return Downloaded(got, checked)

    def discard(self) -> None:
        if self.out is not None and not self.out.closed:
            self.out.close()
        self.part.unlink(missing_ok=True)
        self.side.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- the stores

_StoreT = TypeVar("_StoreT", bound="BucketStore")
MAX_RESTARTS = 2  # a download whose object changed under it starts over at most this often


@dataclass
class BucketStore:
    """What :class:`Store` (S3) and :class:`BlobStore` (Azure) share: where the bucket is,
    how the node builds one, bounded requests (:func:`send_bounded`), put, head and the
    checked download. Each subclass says how a key becomes a URL and how a request is
    authorised."""

    bucket: str
    region: str
    credentials: Callable[[], Credentials | None]
    endpoint: str  # scheme://host[:port]
    path_style: bool = False  # an explicit endpoint (tests, private links, Azurite)
    timeout: float = 60.0
    attempts: int = 3
    retry_sleep: Callable[[float], None] = time.sleep
    retry_rng: Callable[[], float] = random.random  # full jitter: the wait is rng() * ceiling
    min_rate: float = MIN_RATE  # bytes/s on average, below which a body is given up ...
    rate_grace_s: float = RATE_GRACE_S  # ... once this long has passed since its request
    clock: Callable[[], float] = time.monotonic
    scheme: ClassVar[str] = ""  # how check_store names the bucket: <scheme>://<bucket>/<key>
    error_header: ClassVar[str] = ""  # the answer's header with the error code, if any
    put_headers: ClassVar[dict[str, str]] = {}  # sent with every single-request upload
    absent_codes: ClassVar[tuple[str, ...]] = ()  # a 404 HEAD with these is "no such key"
    meta_header: ClassVar[str] = ""  # the header carrying META_SHA256 (lower case)

    @classmethod
    def for_node(
        cls: type[_StoreT],
        *,
        endpoint: str,
        region: str,
        bucket: str,
        credentials: Callable[[], Credentials | None],
        endpoint_url: str = "",
    ) -> _StoreT:
        """``endpoint``: the cloud's own API (the watchdog's cloud class says which:
        ``bucket_endpoint()``), the bucket in front of its host; ``endpoint_url``: an
        override (tests, private links), the bucket in the path."""
        cls.check_bucket(bucket)
        if endpoint_url:
            return cls(bucket, region, credentials, endpoint_url.rstrip("/"), path_style=True)
        return cls(bucket, region, credentials, endpoint.rstrip("/"))

    @classmethod
    def check_bucket(cls, bucket: str) -> None:
        """Raise StoreError for a bucket name this kind of store cannot address."""

    def address(self, key: str) -> tuple[str, str]:
        """Who owns ``key`` (the bucket, or Azure's storage account: in front of the host, or
        first in the path) and the rest of its path."""
        raise NotImplementedError

    def url(self, key: str, query: str = "") -> str:
        owner, path = self.address(key)
        scheme, host = self.endpoint.split("://", 1)
        if self.path_style:
            path = f"/{owner}{path}"
        else:
            host = f"{owner}.{host}"
        return f"{scheme}://{host}{path or '/'}" + (f"?{query}" if query else "")

    def build(
        self,
        method: str,
        key: str,
        body: bytes,
        query: str,
        headers: dict[str, str],
        payload_sha256: str = "",
    ) -> urllib.request.Request:
        """One authorised request (called again for each try); raises StoreError
        ("NoCredentials") when there is nothing to authorise it with. ``payload_sha256``:
        the body's SHA-256 when the caller has it already."""
        raise NotImplementedError

    def request(
        self,
        method: str,
        key: str,
        *,
        body: bytes = b"",
        query: str = "",
        headers: dict[str, str] | Callable[[], dict[str, str]] | None = None,
        deadline: float | None = None,
        payload_sha256: str = "",
        sink: Callable[[bytes], None] | None = None,
        on_answer: Callable[[int, dict[str, str]], None] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request, retried a bounded number of times on 5xx, 429, a body slower than
        ``min_rate`` and network errors (:func:`send_bounded`). ``headers`` may be a function,
        called for each try (a ranged GET asks from where the last try ended)."""

        def build() -> urllib.request.Request:
            sent = headers() if callable(headers) else (headers or {})
            return self.build(method, key, body, query, sent, payload_sha256)

        return send_bounded(
            build,
            label=f"{method} {key or '/'}",
            attempts=self.attempts,
            timeout=self.timeout,
            deadline=deadline,
            sleep=self.retry_sleep,
            error_header=self.error_header,
            clock=self.clock,
            rng=self.retry_rng,
            sink=sink,
            on_answer=on_answer,
            min_rate=self.min_rate,
            rate_grace_s=self.rate_grace_s,
        )

    def put(self, key: str, data: bytes, deadline: float | None = None, sha256: str = "") -> str:
        """One PUT of ``data`` with its Content-MD5 and its SHA-256 as META_SHA256; the hex
        SHA-256 of the bytes sent. A ``sha256`` that does not match ``data`` is refused
        before anything is sent (it would record a wrong digest)."""
        digest = hashlib.sha256(data).hexdigest()
        if sha256 and sha256.lower() != digest:
            raise StoreError(
                f"PUT {key}: its bytes hash to {digest}, not the {sha256} given: the file "
                "changed since its digest was taken; take it again",
                "Digest",
            )
        headers = {
            **self.put_headers,
            "Content-MD5": content_md5(data),
            self.meta_header: digest,
        }
        self.request(
            "PUT", key, body=data, headers=headers, deadline=deadline, payload_sha256=digest
        )
        return digest

    def head(self, key: str, deadline: float | None = None) -> dict[str, str] | None:
        try:
            return self.request("HEAD", key, deadline=deadline)[1]
        except StoreError as exc:
            if exc.status == 404 and (not self.absent_codes or exc.code in self.absent_codes):
                return None
            raise

    def head_sha256(self, key: str, deadline: float | None = None) -> str:
        """The object's META_SHA256 (hex, lower case); "" when it has none or is absent."""
        headers = self.head(key, deadline)
        return (headers or {}).get(self.meta_header, "").strip().lower()

    def upload_file(
        self, key: str, path: Path, size: int, deadline: float, sha256: str = ""
    ) -> str:
        """Upload ``path`` (``size`` bytes) with its SHA-256 recorded as META_SHA256; the
        hex SHA-256 of the bytes sent. A file that changes while it is sent (its bytes no
        longer ``sha256``, or not ``size`` long) raises StoreError("Digest") and is not
        committed."""
        raise NotImplementedError

    def _whole(self, key: str, path: Path, size: int, deadline: float, sha256: str) -> str:
        data = path.read_bytes()
        if len(data) != size:
            raise StoreError(
                f"PUT {key}: {path} is {len(data)} bytes now, {size} when listed: it is being "
                "written; run it again once it is complete",
                "Digest",
            )
        return self.put(key, data, deadline, sha256)

    def list_entries(self, prefix: str) -> dict[str, Entry]:
        """Every key under ``prefix`` with its size and digest, page after page (bounded)."""
        raise NotImplementedError

    def list_objects(self, prefix: str) -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        return {key: entry.size for key, entry in self.list_entries(prefix).items()}

    def whole_md5(self, status: int, headers: dict[str, str]) -> str:
        """The MD5 (hex) of the whole object that a GET answer states, "" when none."""
        return ""

    def download_file(
        self,
        key: str,
        dest: Path,
        size: int,
        deadline: float,
        *,
        sha256: str = "",
        etag: str = "",
    ) -> Downloaded:
        """``key`` into ``dest``, checked before ``dest`` takes its name.

        The bytes go to ``<dest>.gpufleet-part`` in ranged GETs of at most PART_SIZE, never
        the whole object in memory, with a sidecar (``SIDECAR_SUFFIX``) naming the key, size
        and ETag; a part file is continued only when its sidecar names the same three, and
        every GET once the ETag is known (from ``etag`` or the first answer) carries
        ``If-Match``: a 412 (the object was replaced) starts over, at most MAX_RESTARTS
        times. The SHA-256 of the whole file is compared with ``sha256``, else the object's
        META_SHA256, else a single-part MD5 ETag / Blob Content-MD5 is checked; a mismatch
        removes the part file and raises StoreError("Digest"); ``dest`` is never created or
        replaced with bytes that failed. A try cut short keeps its bytes and the next one
        continues after them. A store that answers a range with the whole object (200, as
        HTTP allows) is taken whole.
        """
        job = _Download(self, key, dest, size, etag)
        job.open()
        restarts = 0
        rounds = 0
        max_rounds = 4 * max(1, self.attempts) + 2 * (size // PART_SIZE + 1)
        try:
            while job.have < size:
                rounds += 1
                before = job.have
                try:
                    self.request(
                        "GET",
                        key,
                        headers=job.headers,
                        deadline=deadline,
                        sink=job.write,
                        on_answer=job.answer,
                    )
                except StoreError as exc:
                    if exc.cause == "changed" and not job.pinned:
                        restarts += 1
                        if restarts > MAX_RESTARTS:
                            raise StoreError(
                                f"GET {key}: the object changed {restarts} times while it was "
                                "read; run it again when nothing writes it",
                                "Changed",
                                exc.status,
                            ) from None
                        job.restart()
                        continue
                    if exc.cause == "changed":
                        raise StoreError(
                            f"{exc} (the version listed, ETag {etag}, is gone: list again)",
                            "Changed",
                            exc.status,
                        ) from None
                    # A try cut off after it moved forward earns another round (bounded)
                    # instead of ending the download: a connection cut mid-body loses
                    # nothing. A body too slow had its tries: a trickle ends here.
                    if job.have > before and exc.cause == "unreachable" and rounds < max_rounds:
                        continue
                    raise
            return job.finish(sha256, restarts > 0)
        except BaseException as exc:
            if job.out is not None and not job.out.closed:
                job.out.close()
            # Bytes of a version that is gone, or none at all, are not worth keeping; any
            # other part file (with its sidecar) is what the next run continues from.
            if job.have == 0 or (isinstance(exc, StoreError) and exc.cause == "changed"):
                job.discard()
            raise

    def _pages(
        self, first: dict[str, str], next_params: Callable[[ET.Element, str], dict[str, str] | None]
    ) -> Iterator[tuple[ET.Element, str]]:
        """The listing's XML pages: ``first`` query, then whatever ``next_params`` says
        from each page, at most MAX_LIST_PAGES (10 M keys at 1,000 a page)."""
        params: dict[str, str] | None = first
        for _ in range(MAX_LIST_PAGES):
            if params is None:
                return
            query = urllib.parse.urlencode(sorted(params.items()), quote_via=urllib.parse.quote)
            _, _, body = self.request("GET", "", query=query)
            try:
                root = ET.fromstring(body)
            except ET.ParseError:
                raise StoreError("the listing is not XML", code="BadListing") from None
            ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            yield root, ns
            params = next_params(root, ns)
        if params is not None:
            raise StoreError(f"more than {MAX_LIST_PAGES} listing pages", code="BadListing")


def _file_sha256(path: Path, size: int, deadline: float) -> str:
    """The SHA-256 of ``path``'s first ``size`` bytes, read in chunks (the deadline checked)."""
    hasher = new_sha256()
    with path.open("rb") as handle:
        left = size
        while left > 0:
            if time.monotonic() >= deadline:
                raise StoreError(f"deadline reached while hashing {path}", "Deadline")
            chunk = handle.read(min(CHUNK * 8, left))
            if not chunk:
                break
            hasher.update(chunk)
            left -= len(chunk)
    return str(hasher.hexdigest())


def _changed_while_sent(key: str, path: Path, got: str, want: str, sent: int, size: int) -> None:
    if sent != size or (want and got != want.lower()):
        raise StoreError(
            f"PUT {key}: {path} changed while it was sent ({sent} of {size} bytes, SHA-256 "
            f"{got}, {want or 'n/a'} expected); nothing was committed: run it again",
            "Digest",
        )


@dataclass
class Store(BucketStore):
    """One bucket over the S3 REST API, signed with SigV4 (path style: /bucket/key)."""

    scheme: ClassVar[str] = "s3"
    absent_codes: ClassVar[tuple[str, ...]] = ("HTTP404", "NoSuchKey")
    # User metadata travels as x-amz-meta-<name> on PutObject / CreateMultipartUpload and
    # comes back on GetObject / HeadObject (docs.aws.amazon.com/AmazonS3/latest/userguide/
    # UsingMetadata.html, read 2026-12-05).
    meta_header: ClassVar[str] = "x-amz-meta-" + META_SHA256

    def address(self, key: str) -> tuple[str, str]:
        return self.bucket, ("/" + _quote(key, safe="/-_.~") if key else "")

    def build(
        self,
        method: str,
        key: str,
        body: bytes,
        query: str,
        headers: dict[str, str],
        payload_sha256: str = "",
    ) -> urllib.request.Request:
        creds = self.credentials()
        if not creds or not creds.get("access_key_id"):
            raise StoreError(
                "no credentials for the bucket (instance role or environment)",
                code="NoCredentials",
            )
        url = self.url(key, query)
        signed = sigv4_headers(
            method=method,
            url=url,
            body=body,
            region=self.region,
            service="s3",
            access_key_id=creds["access_key_id"],
            secret=creds.get("secret", ""),
            token=creds.get("token", ""),
            # Always a type with a body: urllib would otherwise send it as a form.
            content_type={"PUT": "application/octet-stream", "POST": "application/xml"}.get(
                method, ""
            ),
            extra=headers,
            payload_hash=payload_sha256,
        )
        req = urllib.request.Request(url, data=body or None, method=method, headers=signed)
        if method in ("PUT", "POST"):
            req.add_header("Content-Length", str(len(body)))
        return req

    def list_entries(self, prefix: str) -> dict[str, Entry]:
        """ListObjectsV2 under ``prefix``, following NextContinuationToken."""
        out: dict[str, Entry] = {}

        def more(root: ET.Element, ns: str) -> dict[str, str] | None:
            token = root.findtext(f"{ns}NextContinuationToken") or ""
            if (root.findtext(f"{ns}IsTruncated") or "false") != "true" or not token:
                return None
            return {"list-type": "2", "prefix": prefix, "continuation-token": token}

        for root, ns in self._pages({"list-type": "2", "prefix": prefix}, more):
            for item in root.iter(f"{ns}Contents"):
                size = int(item.findtext(f"{ns}Size") or 0)
                given = (item.findtext(f"{ns}ETag") or "").strip()
                digest = given.strip('"').lower()
                out[item.findtext(f"{ns}Key") or ""] = Entry(size, digest, given)
        return out

    def whole_md5(self, status: int, headers: dict[str, str]) -> str:
        """A single-part ETag is the MD5 of the bytes unless the object is encrypted with
        SSE-KMS or SSE-C (docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html, ETag;
        read 2026-12-05); a multipart one (``<hex>-<parts>``) never is."""
        kms = " ".join(
            headers.get(h, "")
            for h in (
                "x-amz-server-side-encryption",
                "x-oss-server-side-encryption",
                "x-cos-server-side-encryption",
            )
        ).lower()
        if "kms" in kms or headers.get("x-amz-server-side-encryption-customer-algorithm"):
            return ""
        etag = _bare_etag(headers.get("etag", "")).lower()
        return etag if _MD5_HEX.match(etag) else ""

    def upload_file(
        self, key: str, path: Path, size: int, deadline: float, sha256: str = ""
    ) -> str:
        if size <= PART_SIZE:
            return self._whole(key, path, size, deadline, sha256)
        # CreateMultipartUpload carries the metadata, so the digest is needed before the
        # first part: taken in a first pass unless given, and checked again as parts go.
        want = (sha256 or _file_sha256(path, size, deadline)).lower()
        part_size = max(PART_SIZE, -(-size // MAX_PARTS))
        _, _, created = self.request(
            "POST",
            key,
            query="uploads=",
            headers={self.meta_header: want},
            deadline=deadline,
        )
        upload_id = _xml_text(created, "UploadId")
        if not upload_id:
            raise StoreError(f"POST {key}?uploads: no UploadId in the answer", code="BadAnswer")
        query_id = "uploadId=" + _quote(upload_id)
        try:
            etags: list[str] = []
            whole = new_sha256()
            sent = 0
            with path.open("rb") as handle:
                number = 0
                while sent < size and (chunk := handle.read(min(part_size, size - sent))):
                    number += 1
                    whole.update(chunk)
                    sent += len(chunk)
                    _, headers, _ = self.request(
                        "PUT",
                        key,
                        body=chunk,
                        query=f"partNumber={number}&{query_id}",
                        headers={"Content-MD5": content_md5(chunk)},
                        deadline=deadline,
                    )
                    etags.append(headers.get("etag", ""))
                if handle.read(1):
                    sent += 1  # grew since it was listed
            _changed_while_sent(key, path, whole.hexdigest(), want, sent, size)
            parts = "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
                for n, etag in enumerate(etags, start=1)
            )
            body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
            _, _, done = self.request("POST", key, body=body, query=query_id, deadline=deadline)
            # CompleteMultipartUpload can fail with HTTP 200 and an <Error> body.
            if _xml_text(done, "Code") and not _xml_text(done, "ETag"):
                raise StoreError(f"complete {key}: {_xml_text(done, 'Code')}", code="Complete")
        except BaseException:
            # A half upload costs storage; the node may abort its own (AbortMultipartUpload).
            with contextlib.suppress(StoreError):
                self.request("DELETE", key, query=query_id, deadline=time.monotonic() + 10)
            raise
        return want


# ---------------------------------------------------------------------------- Azure Blob

# Bearer tokens need 2017-11-09 or later; this one is documented for every call used here.
BLOB_API_VERSION = "2021-08-06"
BLOCK_SIZE = 64 * 1024 * 1024  # Put Block: up to 4000 MiB each, at most 50,000 per blob
MAX_LIST_PAGES = 10_000  # a listing's pages (S3 and Blob answer up to 1,000 keys each)
MAX_BLOCKS = 50_000


@dataclass
class BlobStore(BucketStore):
    """One Blob container, ``bucket`` = ``<storage account>/<container>`` (the stack's
    ``bucket`` output on Azure), authorised with a bearer token for ``storage.azure.com``.

    ``credentials()`` returns the node's credentials; the token is their ``storage`` entry
    (AzureNode in clouds/azure.py asks the metadata service for it). Same guarantees as
    :class:`Store`: ``Content-MD5`` on every write (the service refuses a corrupted body),
    bounded retries on 5xx / 429 / network errors, the deadline checked before each request.
    Path style (tests, Azurite): /account/container/blob.
    """

    scheme: ClassVar[str] = "azureblob"
    error_header: ClassVar[str] = "x-ms-error-code"  # HEAD answers carry no body
    put_headers: ClassVar[dict[str, str]] = {"x-ms-blob-type": "BlockBlob"}
    # Metadata is x-ms-meta-<name> on Put Blob and Put Block List, and comes back on Get
    # Blob / Get Blob Properties; names must be C# identifiers (no dashes)
    # (learn.microsoft.com/en-us/rest/api/storageservices/setting-and-retrieving-properties-
    # and-metadata-for-blob-resources, read 2026-12-05).
    meta_header: ClassVar[str] = "x-ms-meta-" + META_SHA256

    @classmethod
    def check_bucket(cls, bucket: str) -> None:
        if bucket.count("/") != 1 or not all(bucket.split("/")):
            raise StoreError(
                f"bucket {bucket!r}: Azure needs <storage account>/<container>", code="Bucket"
            )

    def address(self, key: str) -> tuple[str, str]:
        account, container = self.bucket.split("/", 1)
        return account, f"/{container}" + ("/" + _quote(key, safe="/-_.~") if key else "")

    def build(
        self,
        method: str,
        key: str,
        body: bytes,
        query: str,
        headers: dict[str, str],
        payload_sha256: str = "",
    ) -> urllib.request.Request:
        token = (self.credentials() or {}).get("storage", "")
        if not token:
            raise StoreError(
                "no storage token for the container (the VM's managed identity)",
                code="NoCredentials",
            )
        sent = {
            "Authorization": f"Bearer {token}",
            "x-ms-version": BLOB_API_VERSION,
            "x-ms-date": dt.datetime.now(UTC).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            **headers,
        }
        req = urllib.request.Request(
            self.url(key, query), data=body or None, method=method, headers=sent
        )
        if method in ("PUT", "POST"):
            req.add_header("Content-Length", str(len(body)))
            req.add_header("Content-Type", "application/octet-stream")
        return req

    def list_entries(self, prefix: str) -> dict[str, Entry]:
        """List Blobs (``restype=container&comp=list``) under ``prefix``, following
        NextMarker; sizes from each blob's Content-Length, digests from its Content-MD5,
        ETags from its Etag (learn.microsoft.com/en-us/rest/api/storageservices/list-blobs,
        read 2026-12-02)."""
        out: dict[str, Entry] = {}
        first = {"restype": "container", "comp": "list", "prefix": prefix}

        def more(root: ET.Element, ns: str) -> dict[str, str] | None:
            marker = root.findtext(f"{ns}NextMarker") or ""
            return {**first, "marker": marker} if marker else None

        for root, ns in self._pages(first, more):
            for item in root.iter(f"{ns}Blob"):
                size = item.findtext(f"{ns}Properties/{ns}Content-Length") or "0"
                md5 = (item.findtext(f"{ns}Properties/{ns}Content-MD5") or "").strip()
                etag = (item.findtext(f"{ns}Properties/{ns}Etag") or "").strip()
                out[item.findtext(f"{ns}Name") or ""] = Entry(int(size), _md5_hex(md5), etag)
        return out

    def whole_md5(self, status: int, headers: dict[str, str]) -> str:
        """Get Blob states the whole blob's MD5 in Content-MD5 when it reads all of it, and
        in x-ms-blob-content-md5 when it reads a range (Content-MD5 is then the range's,
        and only when asked for) (learn.microsoft.com/en-us/rest/api/storageservices/
        get-blob, and the SDKs' BlobDownloadHeaders.blobContentMD5; read 2026-12-05)."""
        if status == 206:
            return _md5_hex(headers.get("x-ms-blob-content-md5", ""))
        return _md5_hex(headers.get("content-md5", ""))

    def upload_file(
        self, key: str, path: Path, size: int, deadline: float, sha256: str = ""
    ) -> str:
        """One Put Blob up to BLOCK_SIZE; above it, Put Block per block then Put Block List
        with the digest as metadata (uncommitted blocks are discarded by the service after
        a week: nothing to abort; a file that changed meanwhile is never committed)."""
        if size <= BLOCK_SIZE:
            return self._whole(key, path, size, deadline, sha256)
        block_size = max(BLOCK_SIZE, -(-size // MAX_BLOCKS))
        ids: list[str] = []
        whole = new_sha256()
        sent = 0
        with path.open("rb") as handle:
            while sent < size and (chunk := handle.read(min(block_size, size - sent))):
                whole.update(chunk)
                sent += len(chunk)
                block = base64.b64encode(f"{len(ids):08d}".encode()).decode()
                ids.append(block)
                self.request(
                    "PUT",
                    key,
                    body=chunk,
                    query="comp=block&blockid=" + _quote(block),
                    headers={"Content-MD5": content_md5(chunk)},
                    deadline=deadline,
                )
            if handle.read(1):
                sent += 1
        got = str(whole.hexdigest())
        _changed_while_sent(key, path, got, sha256, sent, size)
        listing = "".join(f"<Latest>{b}</Latest>" for b in ids)
        body = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{listing}</BlockList>'.encode()
        self.request(
            "PUT",
            key,
            body=body,
            query="comp=blocklist",
            headers={"Content-MD5": content_md5(body), self.meta_header: got},
            deadline=deadline,
        )
        return got


def _md5_hex(b64: str) -> str:
    try:
        return base64.b64decode(b64.strip(), validate=True).hex() if b64.strip() else ""
    except ValueError:
        return ""


# ---------------------------------------------------------------------------- what to sync


@dataclass(frozen=True)
class LocalFile:
    key: str  # object key in the bucket
    path: Path
    size: int
    mtime_ns: int


# A checkpoint folder's marker (job_sync.MARKER, docs/train.md): it lists the folder's files,
# so it goes up after every other file of its folder and its presence in the bucket means
# the files it lists were sent first.
CHECKPOINT_MARKER = "COMPLETE"


def _upload_order(path: Path) -> tuple[Path, bool, str]:
    return path.parent, path.name == CHECKPOINT_MARKER, path.name


def local_files(scratch: Path, sync_dirs: Sequence[str], node: str) -> Iterator[LocalFile]:
    """Every regular file under ``scratch/<dir>`` -> key ``<dir>/<node>/<relative path>``,
    folder by folder, a checkpoint's marker after the files beside it."""
    for rel in sync_dirs:
        source = scratch / rel
        if not source.is_dir():
            continue
        prefix = rel.strip("/")
        for path in sorted(source.rglob("*"), key=_upload_order):
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                stat = path.stat()
            except OSError:
                continue  # vanished while we walked (a job rotating checkpoints)
            key = f"{prefix}/{node}/{path.relative_to(source).as_posix()}"
            yield LocalFile(key, path, stat.st_size, stat.st_mtime_ns)


@dataclass
class Manifest:
    """What this scratch has already saved, and to which bucket (lives on scratch)."""

    path: Path
    bucket: str
    files: dict[str, list[int]] = field(default_factory=dict)  # key -> [size, mtime_ns]

    @classmethod
    def load(cls, scratch: Path, bucket: str) -> Manifest:
        path = scratch / MANIFEST
        try:
            raw = json.loads(path.read_text())
            if raw.get("bucket") == bucket and isinstance(raw.get("files"), dict):
                files = {str(k): [int(v[0]), int(v[1])] for k, v in raw["files"].items()}
                return cls(path, bucket, files)
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            pass  # unknown: everything counts as unsynced, which is the safe side
        return cls(path, bucket)

    def synced(self, f: LocalFile) -> bool:
        return self.files.get(f.key) == [f.size, f.mtime_ns]

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"bucket": self.bucket, "files": self.files}))
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    detail: str
    seconds: float = 0.0
    uploaded: int = 0
    unsynced: int | None = None  # files still not in the bucket; None: unknown


def pending(scratch: Path, sync_dirs: Sequence[str], node: str, bucket: str) -> list[LocalFile]:
    manifest = Manifest.load(scratch, bucket)
    return [f for f in local_files(scratch, sync_dirs, node) if not manifest.synced(f)]


def sync_scratch(
    *,
    scratch: Path,
    sync_dirs: Sequence[str],
    node: str,
    store: BucketStore | None,
    timeout_s: float,
) -> SyncResult:
    """Upload every file not yet saved, oldest record first, within ``timeout_s``."""
    started = time.monotonic()
    deadline = started + timeout_s
    bucket = store.bucket if store is not None else ""
    todo = pending(scratch, sync_dirs, node, bucket)
    if not todo:
        return SyncResult(True, "nothing to save: every checkpoint file is in the bucket", 0, 0, 0)
    if store is None:
        return SyncResult(
            False, f"no bucket configured: {len(todo)} file(s) cannot be saved", 0.0, 0, len(todo)
        )
    manifest = Manifest.load(scratch, bucket)
    uploaded = 0
    try:
        for f in todo:
            if time.monotonic() >= deadline:
                raise StoreError(f"sync budget of {timeout_s:.0f} s spent", code="Deadline")
            store.upload_file(f.key, f.path, f.size, deadline)
            manifest.files[f.key] = [f.size, f.mtime_ns]
            uploaded += 1
            manifest.save()  # a crash or a deadline keeps what already landed
    except (StoreError, OSError) as exc:
        left = len(todo) - uploaded
        return SyncResult(
            False,
            f"{exc} ({uploaded} uploaded, {left} file(s) not saved)",
            time.monotonic() - started,
            uploaded,
            left,
        )
    # Files written while we uploaded are caught by this second look, not lost.
    left = len(pending(scratch, sync_dirs, node, bucket))
    took = time.monotonic() - started
    return SyncResult(
        left == 0,
        f"saved {uploaded} file(s) to {bucket} in {took:.1f} s"
        + (f"; {left} changed meanwhile" if left else ""),
        took,
        uploaded,
        left,
    )


def check_store(store: BucketStore, node: str) -> str:
    """Prove the path works: write a small probe object and read its size back."""
    key = PROBE_KEY.format(node=node)
    data = f"gpufleet sync check from {node} at {dt.datetime.now(UTC).isoformat()}\n".encode()
    deadline = time.monotonic() + 60
    store.put(key, data, deadline)
    head = store.head(key, deadline)
    if head is None or int(head.get("content-length", "-1")) != len(data):
        raise StoreError(f"probe {key} was written but does not read back", code="Probe")
    return f"wrote and read back {store.scheme}://{store.bucket}/{key}"
