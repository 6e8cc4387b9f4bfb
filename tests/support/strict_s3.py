"""A strict front for moto's S3: it refuses a request body that does not match its
Content-MD5 or its x-amz-content-sha256, as S3 does, and forwards everything else.

Why: moto 5.2.5 stores a PUT whose body was damaged on the way (checked here with a byte
flipped by tests/support/fault_proxy.py: both a wrong Content-MD5 and a wrong
x-amz-content-sha256 were answered 200), so a test of "the store refuses a damaged
upload" would pass against moto while proving nothing. S3's own rules, from its error-code
list (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html, and the same list as
S3-compatible stores publish it, e.g. docs.netapp.com/us-en/storagegrid/s3/
error-responses.html; read 2026-12-05):

* InvalidDigest (400): "The Content-MD5 you specified is not valid" (not base64 of 16 bytes);
* BadDigest (400): "The Content-MD5 you specified did not match what we received";
* XAmzContentSHA256Mismatch (400): "The provided 'x-amz-content-sha256' header does not
  match what was computed" (SigV4 signs the payload's hash; docs.aws.amazon.com/AmazonS3/
  latest/API/sig-v4-header-based-auth.html: the header's value may instead be
  UNSIGNED-PAYLOAD or a STREAMING-* marker, which are not hashes and are not checked here).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.fault_proxy import FaultProxy, fault_proxy

NOT_A_HASH = ("UNSIGNED-PAYLOAD", "STREAMING-")


def s3_body_refusal(
    method: str, headers: dict[str, str], body: bytes
) -> tuple[int, str, str] | None:
    """S3's answer to a request whose body does not match its digests, or None."""
    md5 = headers.get("content-md5")
    if md5 is not None:
        try:
            given = base64.b64decode(md5, validate=True)
        except (binascii.Error, ValueError):
            given = b""
        if len(given) != 16:
            return 400, "InvalidDigest", "The Content-MD5 you specified is not valid."
        if given != hashlib.md5(body, usedforsecurity=False).digest():
            return 400, "BadDigest", "The Content-MD5 you specified did not match what we received."
    sha = headers.get("x-amz-content-sha256", "")
    if sha and not sha.startswith(NOT_A_HASH) and sha.lower() != hashlib.sha256(body).hexdigest():
        return (
            400,
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        )
    return None


@contextmanager
def strict_s3(upstream: str) -> Iterator[FaultProxy]:
    """The strict front on 127.0.0.1 in front of ``upstream`` (moto); its ``url`` is what
    clients (or a fault proxy) talk to. It can carry faults of its own, as any FaultProxy."""
    with fault_proxy(upstream, refuse=s3_body_refusal) as front:
        yield front
