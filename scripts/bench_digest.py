#!/usr/bin/env python3
"""Benchmark: what the SHA-256 of every transfer costs, in MB/s with and without, same run.

    python scripts/bench_digest.py                 # 512 MiB, 2 rounds, the local server
    python scripts/bench_digest.py --mib 256 --rounds 3 --server moto --json

bucket.Store uploads a file (multipart, as every file over PART_SIZE goes) and downloads it
(ranged GETs into a part file, fsync, rename) against an S3 server on 127.0.0.1, each
twice per round: once as shipped (the file's SHA-256 taken before the upload and again as
its parts go, and over every byte downloaded, checked before the file takes its name), and
once with that digest replaced by a no-op (bucket.new_sha256), which is how the transfer
ran before issue 39. Everything else is in both: SigV4's hash of each part and its
Content-MD5 (the service's own checks), the disk, the loopback. Rounds alternate the order.

``--server local`` (default) is a small S3 subset in its own process serving files from a
temporary folder (PutObject, multipart, ranged GetObject, HeadObject; no signature checks):
as fast as this machine's disk and loopback go, so the digest's share is not hidden behind
a slow fake. ``--server moto`` runs moto's S3 instead (slower: it keeps and hashes every
object itself).

Exit status (docs/exit-status.md): 0 measured; 1 a transfer failed; 2 bad input.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from gpufleet_node import bucket  # noqa: E402
from infra.usage import OneLineParser, fit, whole_number  # noqa: E402

MIB = 1024 * 1024
CREDS = {"access_key_id": "bench", "secret": "bench", "token": ""}


class NoDigest:
    """A stand-in for hashlib.sha256(): no work, and the hex the caller expects."""

    hex = ""

    def update(self, data: bytes) -> None:
        return

    def hexdigest(self) -> str:
        return NoDigest.hex


# ---------------------------------------------------------------------------- local S3


def serve_local(folder: Path) -> None:
    """The local S3 subset on 127.0.0.1: prints its port, serves until stdin closes."""
    meta: dict[str, dict[str, str]] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _path(self) -> tuple[Path, dict[str, str]]:
            split = urllib.parse.urlsplit(self.path)
            name = urllib.parse.unquote(split.path).strip("/").replace("/", "__")
            return folder / name, dict(urllib.parse.parse_qsl(split.query, True))

        def _reply(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body_to(self, path: Path) -> None:
            left = int(self.headers.get("Content-Length") or 0)
            with path.open("wb") as out:
                while left > 0:
                    chunk = self.rfile.read(min(left, 4 * MIB))
                    if not chunk:
                        break
                    out.write(chunk)
                    left -= len(chunk)

        def do_PUT(self) -> None:
            path, q = self._path()
            if "partNumber" in q:
                self._body_to(
                    path.with_name(f"{path.name}.{q['uploadId']}.{int(q['partNumber']):05d}")
                )
                return self._reply(200, headers={"ETag": f'"{uuid.uuid4().hex}"'})
            self._body_to(path)
            with lock:
                meta[path.name] = {
                    k: v for k, v in self.headers.items() if k.lower().startswith("x-amz-meta-")
                }
            self._reply(200, headers={"ETag": f'"{uuid.uuid4().hex}"'})

        def do_POST(self) -> None:
            path, q = self._path()
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if "uploads" in q:
                upload = uuid.uuid4().hex
                with lock:
                    meta[path.name] = {
                        k: v for k, v in self.headers.items() if k.lower().startswith("x-amz-meta-")
                    }
                return self._reply(200, f"<R><UploadId>{upload}</UploadId></R>".encode())
            parts = sorted(path.parent.glob(f"{path.name}.{q['uploadId']}.*"))
            with path.open("wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 8 * MIB)
                    part.unlink()
            etag = f'"{uuid.uuid4().hex}-{len(parts)}"'
            self._reply(200, f"<R><ETag>{etag}</ETag></R>".encode())

        def do_DELETE(self) -> None:
            self._reply(204)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path, _ = self._path()
            if not path.exists():
                return self._reply(404, b"<Error><Code>NoSuchKey</Code></Error>")
            size = path.stat().st_size
            match = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            start, end = (int(match.group(1)), int(match.group(2))) if match else (0, size - 1)
            end = min(end, size - 1)
            self.send_response(206 if match else 200)
            with lock:
                for key, value in meta.get(path.name, {}).items():
                    self.send_header(key, value)
            self.send_header("ETag", '"bench-1"')
            if match:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header(
                "Content-Length", str(end - start + 1 if self.command == "GET" else size)
            )
            self.end_headers()
            if self.command == "HEAD":
                return
            with path.open("rb") as src:
                self.wfile.flush()
                os.sendfile(self.connection.fileno(), src.fileno(), start, end - start + 1)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    print(server.server_port, flush=True)
    sys.stdin.read()  # until the parent closes it
    server.shutdown()


@contextmanager
def local_server(folder: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-dir", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def moto_s3() -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="bench-digest")
        yield url
    finally:
        server.stop()


# ---------------------------------------------------------------------------- measuring


def transfer(
    store: Any, source: Path, dest: Path, size: int, digest: bool, truth: str
) -> dict[str, float]:
    """One upload and one download; seconds each. Without the digest, new_sha256 is a no-op
    that answers the true hex, so every comparison still passes."""
    real = bucket.new_sha256
    if not digest:
        NoDigest.hex = truth
        bucket.new_sha256 = NoDigest
    try:
        key = f"bench/{uuid.uuid4().hex}"
        started = time.perf_counter()
        recorded = store.upload_file(key, source, size, time.monotonic() + 3600)
        up = time.perf_counter() - started
        dest.unlink(missing_ok=True)
        started = time.perf_counter()
        got = store.download_file(key, dest, size, time.monotonic() + 3600)
        down = time.perf_counter() - started
    finally:
        bucket.new_sha256 = real
    if recorded != truth or got.sha256 != truth:
        raise bucket.StoreError(f"{key}: digest {recorded} / {got.sha256}, {truth} expected")
    return {"upload_s": up, "download_s": down}


def measure(mib: int, rounds: int, server: str) -> dict[str, Any]:
    size = mib * MIB
    with tempfile.TemporaryDirectory(prefix="bench-digest-") as tmp:
        folder = Path(tmp)
        (folder / "served").mkdir()
        source = folder / "source.bin"
        with source.open("wb") as handle:
            for _ in range(mib):
                handle.write(os.urandom(MIB))
        truth = hashlib.sha256(source.read_bytes()).hexdigest()
        started = time.perf_counter()
        hashlib.sha256(source.read_bytes()).hexdigest()
        hash_alone = size / MIB / (time.perf_counter() - started)
        runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
        serving = local_server(folder / "served") if server == "local" else moto_s3()
        with serving as url:
            store = bucket.Store.for_node(
                endpoint="https://unused.invalid",
                region="us-east-1",
                bucket="bench-digest",
                credentials=lambda: dict(CREDS),
                endpoint_url=url,
            )
            store.timeout = 600.0
            for n in range(rounds):
                order = (True, False) if n % 2 == 0 else (False, True)
                for digest in order:
                    took = transfer(store, source, folder / "dest.bin", size, digest, truth)
                    runs["with" if digest else "without"].append(took)
    out: dict[str, Any] = {"mib": mib, "rounds": rounds, "server": server}
    out["sha256_alone_mb_s"] = round(hash_alone, 1)
    for way in ("upload", "download"):
        for label in ("with", "without"):
            seconds = statistics.median(r[f"{way}_s"] for r in runs[label])
            out[f"{way}_{label}_mb_s"] = round(mib / seconds, 1)
        out[f"{way}_ratio"] = round(out[f"{way}_with_mb_s"] / out[f"{way}_without_mb_s"], 3)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['mib']} MiB through bucket.Store, {result['server']} S3 on 127.0.0.1, "
        f"median of {result['rounds']} round(s) (MiB/s)",
        f"  SHA-256 alone over the file in memory: {result['sha256_alone_mb_s']:.0f}",
    ]
    for way in ("upload", "download"):
        lines.append(
            f"  {way:8s} with digest {result[f'{way}_with_mb_s']:8.1f}   without "
            f"{result[f'{way}_without_mb_s']:8.1f}   with/without {result[f'{way}_ratio']:.3f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=whole_number(1, 8192), default=512, help="file size (512)")
    parser.add_argument("--rounds", type=whole_number(1, 20), default=2, help="rounds (2)")
    parser.add_argument("--server", choices=("local", "moto"), default="local", help="S3 server")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--serve-dir", help="internal: run the local S3 subset on this folder")
    args = parser.parse_args(argv)
    if args.serve_dir:
        serve_local(Path(args.serve_dir))
        return 0
    try:
        result = measure(args.mib, args.rounds, args.server)
    except (bucket.StoreError, OSError) as exc:
        print(fit(f"bench_digest.py: {exc}"), file=sys.stderr)
        return 1
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
