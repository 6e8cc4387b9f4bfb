"""A dataset folder on the node's scratch, and the stack's bucket (node side of fab data-*).

Standard library only; shipped by ``fab train`` and the data tasks next to job_runner.py,
and run on the node with its system Python (3.10+). The bucket is reached through the
watchdog's own client (bucket.py: the node cloud's store, the node's own identity), so a
dataset moves with the same signer, retries and credentials as the checkpoints.

Every command prints progress lines (``progress <done bytes> <total bytes> <text>``) and
then one JSON line with the outcome. What already matches is never moved again:

* scratch folder vs the laptop: size and SHA-256 of each file (the digests are cached in
  ``<folder>/.gpufleet-digests.json`` by size and mtime, so a re-run reads each file once);
* scratch folder vs the bucket: size, and the bucket's digest (S3's ETag, Blob's
  Content-MD5) against the file's MD5 (a multipart ETag against the MD5s of its parts),
  else the record of what this folder last fetched or uploaded (``.gpufleet-data.json``:
  key, size, digest, and the file's size and mtime), for ETags that are no MD5 (SSE-KMS).

Nothing is deleted at the destination unless ``--delete`` is given (files under the folder
that the source does not have), and never anything in the bucket.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bootstrap.remote import bucket, job_sync
else:
    _HERE = str(Path(__file__).resolve().parent)
    if _HERE not in sys.path:
        sys.path.append(_HERE)
    import bucket
    import job_sync

DIGESTS = ".gpufleet-digests.json"
RECORD = ".gpufleet-data.json"
# Part sizes a multipart ETag may come from: ours (bucket.py), then the aws CLI's and
# boto3's default multipart_chunksize (8 MiB) and a few common settings.
MIB = 1024 * 1024
_PART_SIZES = (8 * MIB, 16 * MIB, 5 * MIB, 64 * MIB, 100 * MIB)
DEADLINE_S = 24 * 3600.0  # a whole dataset: long, but bounded


def _ours(name: str) -> bool:
    """Our own bookkeeping inside a folder: never data, never moved, never deleted."""
    return name.startswith(".gpufleet-") or name.endswith(bucket.PART_SUFFIX)


def walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every regular file under ``root``, ours left out."""
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if _ours(name) or path.is_symlink() or not path.is_file():
                continue
            yield path.relative_to(root).as_posix(), path


def hashes(path: Path) -> tuple[str, str]:
    """(sha256, md5) of a file in one read."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def multipart_etag(path: Path, part_size: int) -> str:
    """S3's ETag of a multipart upload of ``path`` in ``part_size`` parts."""
    digests, parts = b"", 0
    with path.open("rb") as f:
        while chunk := f.read(part_size):
            digests += hashlib.md5(chunk, usedforsecurity=False).digest()
            parts += 1
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{parts}"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


class Digests:
    """Each file's [size, mtime_ns, sha256, md5], read again only when size or mtime moved."""

    def __init__(self, root: Path) -> None:
        self.root, self.path = root, root / DIGESTS
        self.cache: dict[str, list[Any]] = dict(_load(self.path).get("files") or {})
        self.dirty = False

    def of(self, rel: str, path: Path) -> tuple[int, str, str]:
        st = path.stat()
        known = self.cache.get(rel)
        if known and known[:2] == [st.st_size, st.st_mtime_ns]:
            return st.st_size, str(known[2]), str(known[3])
        sha, md5 = hashes(path)
        self.cache[rel] = [st.st_size, st.st_mtime_ns, sha, md5]
        self.dirty = True
        return st.st_size, sha, md5

    def all(self) -> dict[str, list[Any]]:
        """{relative path: [size, sha256]} of the folder as it is now."""
        out = {}
        for rel, path in walk(self.root):
            size, sha, _ = self.of(rel, path)
            out[rel] = [size, sha]
        self.cache = {k: v for k, v in self.cache.items() if k in out}
        return out

    def save(self) -> None:
        if self.dirty and self.root.is_dir():
            _save(self.path, {"files": self.cache})


# ---------------------------------------------------------------------------- the bucket


def same_bytes(path: Path, md5: str, size: int, entry: bucket.Entry) -> bool:
    """Do the file's bytes match the bucket's object, by size and the store's digest?"""
    if entry.size != size or not entry.digest:
        return False
    digest = entry.digest.lower()
    if "-" not in digest:
        return digest == md5
    try:
        parts = int(digest.rsplit("-", 1)[1])
    except ValueError:
        return False
    ours = max(bucket.PART_SIZE, -(-size // bucket.MAX_PARTS))
    for part_size in (ours, *_PART_SIZES):
        count = max(1, math.ceil(size / part_size))
        if count == parts and multipart_etag(path, part_size) == digest:
            return True
    return False


class Record:
    """What this folder last fetched from or uploaded to the bucket, per key."""

    def __init__(self, root: Path, where: str) -> None:
        self.path = root / RECORD
        raw = _load(self.path)
        same = raw.get("where") == where
        self.where = where
        self.keys: dict[str, list[Any]] = dict(raw.get("keys") or {}) if same else {}

    def matches(self, key: str, entry: bucket.Entry, path: Path) -> bool:
        known = self.keys.get(key)
        if not known or not path.is_file():
            return False
        st = path.stat()
        return known == [entry.size, entry.digest, st.st_size, st.st_mtime_ns]

    def note(self, key: str, entry: bucket.Entry, path: Path) -> None:
        st = path.stat()
        self.keys[key] = [entry.size, entry.digest, st.st_size, st.st_mtime_ns]

    def save(self) -> None:
        if self.path.parent.is_dir():
            _save(self.path, {"where": self.where, "keys": self.keys})


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


class Progress:
    """``progress <done> <total> <text>`` lines, at most one a second (and the last)."""

    def __init__(self, total: int, out: Any = None, clock: Callable[[], float] = time.monotonic):
        self.total, self.done, self.out, self.clock = total, 0, out or sys.stdout, clock
        self.last = -1.0

    def add(self, n: int, text: str, force: bool = False) -> None:
        self.done += n
        now = self.clock()
        if force or now - self.last >= 1.0:
            self.last = now
            self.out.write(f"progress {self.done} {self.total} {text}\n")
            self.out.flush()


def fetch(
    root: Path, store: bucket.BucketStore, prefix: str, *, delete: bool = False
) -> dict[str, Any]:
    """Every object under ``prefix`` into ``root`` (its key less the prefix), but those the
    folder already has; with ``delete``, files of the folder the bucket does not list go."""
    started = time.monotonic()
    prefix = prefix.rstrip("/") + "/"
    try:
        listing = {
            k[len(prefix) :]: e
            for k, e in store.list_entries(prefix).items()
            if not k.endswith("/") and _safe(k[len(prefix) :])
        }
    except job_sync.LIST_ERRORS as exc:
        return {"ok": False, "error": f"cannot list {store.bucket}/{prefix}: {exc}"}
    if not listing:
        return {"ok": False, "error": f"nothing under {store.bucket}/{prefix}"}
    root.mkdir(parents=True, exist_ok=True)
    digests, record = Digests(root), Record(root, f"{store.bucket}/{prefix}")
    progress = Progress(sum(e.size for e in listing.values()))
    moved = kept = moved_bytes = 0
    deadline = time.monotonic() + DEADLINE_S
    try:
        for rel in sorted(listing):
            entry, path, key = listing[rel], root / rel, prefix + rel
            if path.is_file() and (
                record.matches(key, entry, path)
                or same_bytes(path, digests.of(rel, path)[2], path.stat().st_size, entry)
            ):
                kept += 1
                record.note(key, entry, path)
                progress.add(entry.size, f"{rel} already here")
                continue
            store.download_file(key, path, entry.size, deadline)
            _, _, md5 = digests.of(rel, path)
            if entry.digest and "-" not in entry.digest and md5 != entry.digest:
                path.unlink()
                raise bucket.StoreError(f"{key}: the bytes read do not match its digest", "Digest")
            record.note(key, entry, path)
            record.save()  # an interrupted fetch keeps what landed
            moved, moved_bytes = moved + 1, moved_bytes + entry.size
            progress.add(entry.size, f"{rel} fetched")
    except (OSError, bucket.StoreError) as exc:
        digests.save()
        record.save()
        return {"ok": False, "error": f"{exc} ({moved} fetched, {kept} already here)"}
    removed = prune(root, set(listing)) if delete else 0
    digests.save()
    record.save()
    progress.add(0, "done", force=True)
    return {
        "ok": True,
        "moved": moved,
        "kept": kept,
        "bytes": moved_bytes,
        "removed": removed,
        "seconds": round(time.monotonic() - started, 3),
    }


def upload(root: Path, store: bucket.BucketStore, prefix: str) -> dict[str, Any]:
    """Every file of ``root`` to ``prefix`` in the bucket, but those it holds already."""
    started = time.monotonic()
    prefix = prefix.rstrip("/") + "/"
    if not root.is_dir():
        return {"ok": False, "error": f"no folder {root} on the node"}
    try:
        listing = store.list_entries(prefix)
    except job_sync.LIST_ERRORS as exc:
        return {"ok": False, "error": f"cannot list {store.bucket}/{prefix}: {exc}"}
    files = list(walk(root))
    digests, record = Digests(root), Record(root, f"{store.bucket}/{prefix}")
    progress = Progress(sum(p.stat().st_size for _, p in files))
    moved = kept = moved_bytes = 0
    sent: list[tuple[str, Path]] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        for rel, path in files:
            key, (size, _, md5) = prefix + rel, digests.of(rel, path)
            entry = listing.get(key)
            if entry is not None and (
                record.matches(key, entry, path) or same_bytes(path, md5, size, entry)
            ):
                kept += 1
                record.note(key, entry, path)
                progress.add(size, f"{rel} already in the bucket")
                continue
            store.upload_file(key, path, size, deadline)
            sent.append((key, path))
            moved, moved_bytes = moved + 1, moved_bytes + size
            progress.add(size, f"{rel} uploaded")
    except (OSError, bucket.StoreError) as exc:
        digests.save()
        return {"ok": False, "error": f"{exc} ({moved} uploaded, {kept} already there)"}
    if sent:
        # What the bucket says of what we just sent, so the next run knows it by its record
        # even when its ETag is no MD5.
        with contextlib.suppress(*job_sync.LIST_ERRORS):
            after = store.list_entries(prefix)
            for key, path in sent:
                if key in after:
                    record.note(key, after[key], path)
    digests.save()
    record.save()
    progress.add(0, "done", force=True)
    return {
        "ok": True,
        "moved": moved,
        "kept": kept,
        "bytes": moved_bytes,
        "removed": 0,
        "seconds": round(time.monotonic() - started, 3),
    }


# ---------------------------------------------------------------------------- the laptop


def _safe(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


def prune(root: Path, keep: set[str]) -> int:
    """Remove the files under ``root`` that are not in ``keep`` (ours stay)."""
    removed = 0
    for rel, path in list(walk(root)):
        if rel not in keep:
            path.unlink()
            removed += 1
    return removed


def prepare(root: Path, dirs: list[str], create: bool = True) -> dict[str, Any]:
    """Make ``root`` and the folders a push will fill (``create``); say what it holds."""
    if not create and not root.is_dir():
        return {"ok": False, "error": f"no folder {root} on the node"}
    for rel in [""] + [d for d in dirs if _safe(d)]:
        (root / rel).mkdir(parents=True, exist_ok=True)
    digests = Digests(root)
    files = digests.all()
    digests.save()
    return {"ok": True, "files": files}


def place(
    root: Path, files: Mapping[str, list[Any]], keep: set[str] | None, token: str
) -> dict[str, Any]:
    """Move the files a push sent (``<rel>.<token>.gpufleet-part``: one name per push, so
    two nodes on one disk never write the same part) into place once each one's size and
    SHA-256 are what the laptop said; ``keep``: prune what the laptop does not have."""
    digests = Digests(root)
    placed, bad = 0, []
    for rel, (size, sha) in sorted(files.items()):
        if not _safe(rel):
            continue
        part = root / f"{rel}.{token}{bucket.PART_SUFFIX}"
        target = root / rel
        if not part.is_file():
            there = target.is_file() and digests.of(rel, target)[:2] == (int(size), sha)
            if not there:  # else another push on this disk placed the same bytes first
                bad.append(rel)
            continue
        got_sha, _ = hashes(part)
        if part.stat().st_size != int(size) or got_sha != sha:
            part.unlink()
            bad.append(rel)
            continue
        os.replace(part, root / rel)
        digests.of(rel, root / rel)
        placed += 1
    removed = prune(root, keep) if keep is not None else 0
    digests.all()
    digests.save()
    if bad:
        return {"ok": False, "error": f"{len(bad)} file(s) arrived damaged: {bad[:3]}"}
    return {"ok": True, "placed": placed, "removed": removed}


# ---------------------------------------------------------------------------- command line


def _store(args: argparse.Namespace) -> bucket.BucketStore:
    store = job_sync.make_store(args.provider, args.bucket, args.region, args.s3_endpoint)
    if store is None:
        raise bucket.StoreError("the stack has no bucket", "NoBucket")
    return store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gpufleet data sync (node side of fab data-*)")
    p.add_argument("command", choices=["prepare", "place", "fetch", "upload"])
    p.add_argument("--root", type=Path, required=True, help="the folder on the node")
    p.add_argument("--prefix", default="", help="fetch/upload: the folder in the bucket")
    p.add_argument("--bucket", default="")
    p.add_argument("--provider", default="", help="the stack's cloud (no default)")
    p.add_argument("--region", default="")
    p.add_argument("--s3-endpoint", default="")
    p.add_argument("--delete", action="store_true", help="fetch: remove what the bucket lacks")
    args = p.parse_args(argv)
    # The rest comes on stdin as JSON (file lists, and the job-style --node-env, which is
    # kept out of the process's arguments where ps would show it).
    doc = json.loads(sys.stdin.read() or "{}")
    for key, value in (doc.get("env") or {}).items():
        os.environ[str(key)] = str(value)
    try:
        with folder_lock(args.root):
            out = _command(args, doc)
    except (OSError, ValueError, KeyError, bucket.StoreError) as exc:
        out = {"ok": False, "error": str(exc)}
    print(json.dumps(out))
    return 0 if out.get("ok") else 1


@contextlib.contextmanager
def folder_lock(root: Path) -> Iterator[None]:
    """One command at a time per folder: nodes that share a disk (and two runs at once)
    take turns, and the later one finds the bytes there already."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f".gpufleet-lock-{root.name}").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _command(args: argparse.Namespace, doc: Mapping[str, Any]) -> dict[str, Any]:
    if args.command == "prepare":
        return prepare(args.root, list(doc.get("dirs") or []), doc.get("create", True))
    if args.command == "place":
        keep = set(doc["keep"]) if doc.get("keep") is not None else None
        return place(args.root, dict(doc.get("files") or {}), keep, str(doc["token"]))
    if args.command == "fetch":
        return fetch(args.root, _store(args), args.prefix, delete=args.delete)
    return upload(args.root, _store(args), args.prefix)


if __name__ == "__main__":
    sys.exit(main())
