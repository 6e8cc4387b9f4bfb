"""gpufleet scratch sync: checkpoints on the node's scratch -> the stack's bucket.

Standard library only, no project imports: this file is installed next to the watchdog
(``/opt/gpufleet/bucket.py``) and runs on the node's system Python (3.10+). It speaks
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
  PUT and part, so a corrupted upload is refused by the service, not recorded as done);
* the record of what is synced (size + mtime of each file when it was uploaded, like
  ``aws s3 sync``) lives on scratch itself (``.gpufleet-sync.json``): it vanishes together
  with an erased instance store, so it can never claim files that are no longer there;
* every request is bounded (socket timeout, a few retries on 5xx/429/network errors, one
  loop for both stores: :func:`send_bounded`) and the whole sync has a deadline, checked
  before each try and each wait between tries;
* nothing is ever deleted from the bucket (no DeleteObject call exists in this file).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

UTC = dt.timezone.utc  # noqa: UP017 (the node's Python may be 3.10)
MANIFEST = ".gpufleet-sync.json"
PART_SUFFIX = ".gpufleet-part"  # a download on its way, continued by the next try
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
    """

    size: int
    digest: str = ""


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
    payload_hash = hashlib.sha256(body).hexdigest()
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


class StoreError(Exception):
    """The bucket refused or could not be reached; ``code`` is the service's error code."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


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


def backoff(attempt: int) -> float:
    """Seconds to wait before try number ``attempt`` (0 is the first): 0, 0.5, 1, 2, 2, ..."""
    return 0.0 if attempt <= 0 else min(2.0, 0.5 * 2 ** (attempt - 1))


def retryable_status(status: int) -> bool:
    """An HTTP answer worth another try: the service failed (5xx) or throttled (429)."""
    return status >= 500 or status == 429


def _past_deadline(last: StoreError | None) -> StoreError:
    return StoreError(
        "sync deadline reached" + (f" (last try: {last})" if last else ""), "Deadline"
    )


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
) -> tuple[int, dict[str, str], bytes]:
    """Send ``build()``'s request in at most ``attempts`` tries: (status, headers, body).

    ``build`` runs again for each try (fresh credentials, signature and date); whatever it
    raises (no credentials) is final. Tried again after :func:`backoff`: 5xx, 429 and
    :data:`TRANSPORT_ERRORS`; any other HTTP answer is final. ``deadline`` (on ``clock``)
    bounds the whole: each try's socket timeout is cut to what is left, and no wait starts
    that would end after it. Raises StoreError: the answer's XML ``<Code>`` (else its
    ``error_header``, else ``HTTP<status>``) with its status; "Unreachable" for a try with no
    answer; "Deadline", naming the last failure, when the deadline ends the tries.
    """
    last: StoreError | None = None
    for attempt in range(max(1, attempts)):
        wait = backoff(attempt)
        if deadline is not None and clock() + wait >= deadline:
            raise _past_deadline(last)
        if wait:
            sleep(wait)
        limit = timeout if deadline is None else min(timeout, deadline - clock())
        if limit <= 0:
            raise _past_deadline(last)
        request = build()
        try:
            with urllib.request.urlopen(request, timeout=limit) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            try:
                data = exc.read() if request.get_method() != "HEAD" else b""
            except TRANSPORT_ERRORS:
                data = b""  # the status alone still says what happened
            code = _xml_text(data, "Code") or (
                exc.headers.get(error_header, "") if error_header else ""
            )
            code = code or f"HTTP{exc.code}"
            message = _xml_text(data, "Message") or exc.reason
            last = StoreError(f"{label}: {code} {message}", code, exc.code)
            if not retryable_status(exc.code):
                raise last from None
        except TRANSPORT_ERRORS as exc:
            reason = getattr(exc, "reason", exc)
            last = StoreError(f"{label}: {reason}", code="Unreachable")
    assert last is not None
    raise last


# ---------------------------------------------------------------------------- the stores

_StoreT = TypeVar("_StoreT", bound="BucketStore")


@dataclass
class BucketStore:
    """What :class:`Store` (S3) and :class:`BlobStore` (Azure) share: where the bucket is,
    how the node builds one, bounded requests (:func:`send_bounded`), put and head. Each
    subclass says how a key becomes a URL and how a request is authorised."""

    bucket: str
    region: str
    credentials: Callable[[], Credentials | None]
    endpoint: str  # scheme://host[:port]
    path_style: bool = False  # an explicit endpoint (tests, private links, Azurite)
    timeout: float = 60.0
    attempts: int = 3
    retry_sleep: Callable[[float], None] = time.sleep
    scheme: ClassVar[str] = ""  # how check_store names the bucket: <scheme>://<bucket>/<key>
    error_header: ClassVar[str] = ""  # the answer's header with the error code, if any
    put_headers: ClassVar[dict[str, str]] = {}  # sent with every single-request upload
    absent_codes: ClassVar[tuple[str, ...]] = ()  # a 404 HEAD with these is "no such key"

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
        self, method: str, key: str, body: bytes, query: str, headers: dict[str, str]
    ) -> urllib.request.Request:
        """One authorised request (called again for each try); raises StoreError
        ("NoCredentials") when there is nothing to authorise it with."""
        raise NotImplementedError

    def request(
        self,
        method: str,
        key: str,
        *,
        body: bytes = b"",
        query: str = "",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request, retried a bounded number of times on 5xx, 429 and network errors."""
        return send_bounded(
            lambda: self.build(method, key, body, query, headers or {}),
            label=f"{method} {key or '/'}",
            attempts=self.attempts,
            timeout=self.timeout,
            deadline=deadline,
            sleep=self.retry_sleep,
            error_header=self.error_header,
        )

    def put(self, key: str, data: bytes, deadline: float | None = None) -> None:
        headers = {**self.put_headers, "Content-MD5": content_md5(data)}
        self.request("PUT", key, body=data, headers=headers, deadline=deadline)

    def head(self, key: str, deadline: float | None = None) -> dict[str, str] | None:
        try:
            return self.request("HEAD", key, deadline=deadline)[1]
        except StoreError as exc:
            if exc.status == 404 and (not self.absent_codes or exc.code in self.absent_codes):
                return None
            raise

    def upload_file(self, key: str, path: Path, size: int, deadline: float) -> None:
        raise NotImplementedError

    def list_entries(self, prefix: str) -> dict[str, Entry]:
        """Every key under ``prefix`` with its size and digest, page after page (bounded)."""
        raise NotImplementedError

    def list_objects(self, prefix: str) -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        return {key: entry.size for key, entry in self.list_entries(prefix).items()}

    def download_file(self, key: str, dest: Path, size: int, deadline: float) -> None:
        """``key`` into ``dest`` in ranged GETs of PART_SIZE (S3 GetObject's and Get Blob's
        ``Range`` header), never the whole object in memory. The bytes go to
        ``<dest>.gpufleet-part`` first and a cut-off download goes on from where that file
        ends; ``dest`` appears only once all ``size`` bytes are there. A store that answers
        a range with the whole object (200, as HTTP allows) is taken whole."""
        part = dest.with_name(dest.name + PART_SUFFIX)
        dest.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        with part.open("ab") as out:
            while have < size:
                end = min(size, have + PART_SIZE) - 1
                status, _, data = self.request(
                    "GET", key, headers={"Range": f"bytes={have}-{end}"}, deadline=deadline
                )
                if status == 200:  # the whole object, whatever we asked
                    out.seek(0)
                    out.truncate()
                    have = 0
                if not data:
                    raise StoreError(f"GET {key}: no bytes at {have} of {size}", "ShortRead")
                out.write(data)
                have += len(data)
        if have != size or part.stat().st_size != size:
            part.unlink(missing_ok=True)
            raise StoreError(f"GET {key}: {have} bytes, the listing said {size}", "ShortRead")
        os.replace(part, dest)

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


@dataclass
class Store(BucketStore):
    """One bucket over the S3 REST API, signed with SigV4 (path style: /bucket/key)."""

    scheme: ClassVar[str] = "s3"
    absent_codes: ClassVar[tuple[str, ...]] = ("HTTP404", "NoSuchKey")

    def address(self, key: str) -> tuple[str, str]:
        return self.bucket, ("/" + _quote(key, safe="/-_.~") if key else "")

    def build(
        self, method: str, key: str, body: bytes, query: str, headers: dict[str, str]
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
                etag = (item.findtext(f"{ns}ETag") or "").strip().strip('"').lower()
                out[item.findtext(f"{ns}Key") or ""] = Entry(size, etag)
        return out

    def upload_file(self, key: str, path: Path, size: int, deadline: float) -> None:
        if size <= PART_SIZE:
            self.put(key, path.read_bytes(), deadline)
            return
        part_size = max(PART_SIZE, -(-size // MAX_PARTS))
        _, _, created = self.request("POST", key, query="uploads=", deadline=deadline)
        upload_id = _xml_text(created, "UploadId")
        if not upload_id:
            raise StoreError(f"POST {key}?uploads: no UploadId in the answer", code="BadAnswer")
        query_id = "uploadId=" + _quote(upload_id)
        try:
            etags: list[str] = []
            with path.open("rb") as handle:
                number = 0
                while chunk := handle.read(part_size):
                    number += 1
                    md5 = content_md5(chunk)
                    _, headers, _ = self.request(
                        "PUT",
                        key,
                        body=chunk,
                        query=f"partNumber={number}&{query_id}",
                        headers={"Content-MD5": md5},
                        deadline=deadline,
                    )
                    etags.append(headers.get("etag", ""))
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
        self, method: str, key: str, body: bytes, query: str, headers: dict[str, str]
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
        NextMarker; sizes from each blob's Content-Length, digests from its Content-MD5
        (learn.microsoft.com/en-us/rest/api/storageservices/list-blobs, read 2026-12-02)."""
        out: dict[str, Entry] = {}
        first = {"restype": "container", "comp": "list", "prefix": prefix}

        def more(root: ET.Element, ns: str) -> dict[str, str] | None:
            marker = root.findtext(f"{ns}NextMarker") or ""
            return {**first, "marker": marker} if marker else None

        for root, ns in self._pages(first, more):
            for item in root.iter(f"{ns}Blob"):
                size = item.findtext(f"{ns}Properties/{ns}Content-Length") or "0"
                md5 = (item.findtext(f"{ns}Properties/{ns}Content-MD5") or "").strip()
                try:
                    digest = base64.b64decode(md5, validate=True).hex() if md5 else ""
                except ValueError:
                    digest = ""
                out[item.findtext(f"{ns}Name") or ""] = Entry(int(size), digest)
        return out

    def upload_file(self, key: str, path: Path, size: int, deadline: float) -> None:
        """One Put Blob up to BLOCK_SIZE; above it, Put Block per block then Put Block List
        (uncommitted blocks are discarded by the service after a week: nothing to abort)."""
        if size <= BLOCK_SIZE:
            self.put(key, path.read_bytes(), deadline)
            return
        block_size = max(BLOCK_SIZE, -(-size // MAX_BLOCKS))
        ids: list[str] = []
        with path.open("rb") as handle:
            while chunk := handle.read(block_size):
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
        listing = "".join(f"<Latest>{b}</Latest>" for b in ids)
        body = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{listing}</BlockList>'.encode()
        self.request(
            "PUT",
            key,
            body=body,
            query="comp=blocklist",
            headers={"Content-MD5": content_md5(body)},
            deadline=deadline,
        )


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
