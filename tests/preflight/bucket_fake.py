"""A local fake of the two object stores' bucket answers the preflight reads, on 127.0.0.1.

- OSS GetBucketInfo (``GET /<bucket>/?bucketInfo``, path-style as the OSS SDK V2 sends it
  with use_path_style): a bucket of the caller answers 200 with
  ``<BucketInfo><Bucket>`` of the SDK's BucketInfo members (Name, Location, CreationDate,
  ExtranetEndpoint, IntranetEndpoint, StorageClass; alibabacloud_oss_v2/models/
  bucket_basic.py, 1.4.1, read 2026-12-05); a free name the ``<Error>`` document with Code
  NoSuchBucket and HTTP 404 (the code the SDK's Client.is_bucket_exist reads as "no such
  bucket"); another account's bucket Code AccessDenied, HTTP 403. Error fields: Code,
  Message, RequestId, HostId, BucketName, EC (as the SDK's ServiceError parses them).
- COS HEAD Bucket (``HEAD /`` at the TENCENTCLOUD_COS_DOMAIN host: the bucket is not in the
  path there, so the fake answers ``cos`` for every name): 200 with x-cos-bucket-region for
  the caller's bucket, 404 for a free name (qcloud_cos CosS3Client.bucket_exists, 1.9.44,
  reads 404 as absent), 403 for another account's. A HEAD answer has no body.

Every request is recorded (method, path, Authorization's scheme) in ``seen``; a request
without an Authorization header is refused 403, as both services refuse anonymous ones.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FREE, MINE, THEIRS = "free", "mine", "theirs"


def oss_error(code: str, message: str, bucket: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
        f"<Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>5C3D9175B6FC201293AD4890</RequestId>"
        "<HostId>oss-cn-hangzhou.aliyuncs.com</HostId>"
        f"<BucketName>{bucket}</BucketName><EC>0015-00000101</EC></Error>"
    ).encode()


def oss_info(bucket: str, location: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<BucketInfo><Bucket>'
        f"<Name>{bucket}</Name><Location>{location}</Location>"
        "<CreationDate>2026-11-01T10:56:21.000Z</CreationDate>"
        f"<ExtranetEndpoint>{location}.aliyuncs.com</ExtranetEndpoint>"
        f"<IntranetEndpoint>{location}-internal.aliyuncs.com</IntranetEndpoint>"
        "<StorageClass>Standard</StorageClass></Bucket></BucketInfo>"
    ).encode()


class BucketFake:
    """oss / cos: FREE, MINE or THEIRS for whatever name is asked; *_region: where MINE is."""

    def __init__(self) -> None:
        self.oss = FREE
        self.oss_region = "oss-cn-shanghai"
        self.cos = FREE
        self.cos_region = "ap-guangzhou"
        self.seen: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                fake.seen.append(fake.record(self))
                self.reply(*fake.oss_answer(self.path, self.headers.get("Authorization")))

            def do_HEAD(self) -> None:
                fake.seen.append(fake.record(self))
                status, headers = fake.cos_answer(self.headers.get("Authorization"))
                self.reply(status, b"", headers)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def record(handler: BaseHTTPRequestHandler) -> dict[str, str]:
        auth = handler.headers.get("Authorization") or ""
        return {"method": handler.command, "path": handler.path, "auth": auth.split(" ")[0][:24]}

    def oss_answer(self, path: str, auth: str | None) -> tuple[int, bytes, dict[str, str]]:
        bucket = path.lstrip("/").split("/")[0].split("?")[0]
        xml = {"Content-Type": "application/xml", "x-oss-request-id": "5C3D9175B6FC201293AD4890"}
        if "bucketInfo" not in path:
            return 400, oss_error("InvalidArgument", "only ?bucketInfo here", bucket), xml
        if not auth:
            return 403, oss_error("AccessDenied", "anonymous access", bucket), xml
        if self.oss == MINE:
            return 200, oss_info(bucket, self.oss_region), xml
        if self.oss == THEIRS:
            return (
                403,
                oss_error("AccessDenied", "You have no right to access this request.", bucket),
                xml,
            )
        return 404, oss_error("NoSuchBucket", "The specified bucket does not exist.", bucket), xml

    def cos_answer(self, auth: str | None) -> tuple[int, dict[str, str]]:
        base = {"x-cos-request-id": "NjVkZjQ0ZjZfOTNhZTJjMGJfMTk"}
        if not auth or self.cos == THEIRS:
            return 403, base
        if self.cos == MINE:
            return 200, {**base, "x-cos-bucket-region": self.cos_region}
        return 404, base

    def __enter__(self) -> BucketFake:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
