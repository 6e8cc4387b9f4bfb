"""A dataset folder on the node's scratch, and the stack's bucket (node side of fab data-*).

Standard library only; shipped by ``fab train`` and the data tasks next to job_runner.py,
and run on the node with its system Python (3.10+). The bucket is reached through the
watchdog's own client (bucket.py: the node cloud's store, the node's own identity), so a
dataset moves with the same signer, retries and credentials as the checkpoints.

Every command prints progress lines (``progress <done bytes> <total bytes> <text>``) and
then one JSON line with the outcome. What already matches is never moved again, and the
comparison is by content (SHA-256) wherever the bucket recorded one:

* scratch folder vs the laptop: size and SHA-256 of each file (the digests are cached in
  ``<folder>/.gpufleet-digests.json`` by size and mtime, so a re-run reads each file once);
* scratch folder vs the bucket: an upload writes each object with its SHA-256 as metadata
  (bucket.META_SHA256) and, last, the dataset's manifest ``<prefix>.gpufleet-dataset.json``
  (each file's size, SHA-256 and the ETag of the object it describes), so a fetch knows
  every expected digest from one GET. An object the manifest does not describe (another
  tool wrote it, or wrote it again) is known by its own metadata, else by its MD5 ETag /
  Content-MD5 (a multipart ETag by the MD5s of its parts), else by size alone: a fetch
  counts those (``size_only``). ``.gpufleet-data.json`` records, per key, the ETag and
  SHA-256 of what this folder last fetched or uploaded, so a rerun compares the file's
  SHA-256 (cached) with it and sends no request for it.

Every download is checked by the bucket client before the file takes its name
(``download_file``: SHA-256, else MD5, into a ``.gpufleet-part`` file continued only from
the same object version); a push's files are checked the same way by ``place``. Nothing is
deleted at the destination unless ``--delete`` is given (files under the folder that the
source does not have), and never anything in the bucket. Part files left by a killed run
are continued (a fetch's, same object) or removed once older than PART_MAX_AGE_S.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from . import bucket, job_sync

DIGESTS = ".gpufleet-digests.json"
RECORD = ".gpufleet-data.json"
# The dataset's manifest: the last object an upload writes under the prefix, and the copy
# of it a fetch or upload read, in the folder.
MANIFEST = ".gpufleet-dataset.json"
MANIFEST_SCHEMA = "gpufleet.dataset/1"
# A listing that failed: refused, unreachable, or an answer that is no XML.
LIST_ERRORS = (OSError, bucket.StoreError, ET.ParseError)
# Part sizes a multipart ETag may come from: ours (bucket.py), then the aws CLI's and
# boto3's default multipart_chunksize (8 MiB) and a few common settings.
MIB = 1024 * 1024
_PART_SIZES = (8 * MIB, 16 * MIB, 5 * MIB, 64 * MIB, 100 * MIB)
# Defaults of fab data-*'s --deadline and --min-rate (bootstrap/tasks/data.py says them to
# the person; it always passes both). The deadline bounds a whole run of a large dataset;
# a trickle is ended much sooner by the minimum rate.
DEADLINE_S = 24 * 3600.0
MIN_RATE = 100_000.0  # bytes/s, each answer's average once RATE_GRACE_S have passed
RATE_GRACE_S = 10.0
# A part file nobody wrote for this long is a killed run's: removed by the next one.
PART_MAX_AGE_S = 3600.0
# What a person can do about each StoreError.cause (bucket.py), and about a local error.
ADVICE = {
    "throttled": "the bucket kept throttling the node: run it again in a while",
    "denied": "the node's identity may not use the bucket: check its role, or the keys "
    "given with --node-env",
    "credentials": "the node has no credentials for the bucket: attach its role, or give "
    "the keys with --node-env",
    "missing": "an object went away while it was read: run it again",
    "damaged": "the bytes read do not match the SHA-256 the bucket recorded; nothing "
    "damaged was kept: run it again",
    "damaged-upload": "the bucket refused the bytes it received (damaged on the way, or "
    "the file changed while it was sent); nothing damaged was stored: run it again",
    "changed": "the object was replaced while it was read: run it again (it reads the new one)",
    "slow": "the bucket sent less than --min-rate: run it again (what landed stays), or "
    "lower --min-rate",
    "deadline": "past --deadline: run it again (what landed stays), or raise --deadline",
    "unreachable": "the bucket could not be reached: check the endpoint and the node's "
    "network, then run it again",
    "disk": "the node's disk refused a write: free space on its scratch, then run it again",
}


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
    """Each file's [size, mtime_ns, sha256, md5], read again only when size or mtime moved
    (md5 "" until something asks for it: a file the bucket client just checked arrives with
    its SHA-256 and is not read again for it)."""

    def __init__(self, root: Path) -> None:
        self.root, self.path = root, root / DIGESTS
        self.cache: dict[str, list[Any]] = dict(_load(self.path).get("files") or {})
        self.dirty = False

    def _known(self, rel: str, path: Path) -> tuple[os.stat_result, list[Any] | None]:
        st = path.stat()
        known = self.cache.get(rel)
        if known and len(known) == 4 and known[:2] == [st.st_size, st.st_mtime_ns]:
            return st, known
        return st, None

    def of(self, rel: str, path: Path) -> tuple[int, str, str]:
        """(size, sha256, md5) of the file as it is now."""
        st, known = self._known(rel, path)
        if known and known[2] and known[3]:
            return st.st_size, str(known[2]), str(known[3])
        sha, md5 = hashes(path)
        self.cache[rel] = [st.st_size, st.st_mtime_ns, sha, md5]
        self.dirty = True
        return st.st_size, sha, md5

    def sha(self, rel: str, path: Path) -> tuple[int, str]:
        """(size, sha256): the MD5 is read along only when the file is read anyway."""
        st, known = self._known(rel, path)
        if known and known[2]:
            return st.st_size, str(known[2])
        size, sha, _ = self.of(rel, path)
        return size, sha

    def known(self, rel: str, path: Path, sha: str) -> None:
        """``path`` was just written and its SHA-256 checked (by the bucket client)."""
        st = path.stat()
        self.cache[rel] = [st.st_size, st.st_mtime_ns, sha, ""]
        self.dirty = True

    def all(self) -> dict[str, list[Any]]:
        """{relative path: [size, sha256]} of the folder as it is now."""
        out = {}
        for rel, path in walk(self.root):
            out[rel] = list(self.sha(rel, path))
        self.cache = {k: v for k, v in self.cache.items() if k in out}
        return out

    def save(self) -> None:
        if self.dirty and self.root.is_dir():
            _save(self.path, {"files": self.cache})


# ---------------------------------------------------------------------------- the bucket


def same_bytes(path: Path, md5: str, size: int, entry: bucket.Entry) -> bool:
    """Do the file's bytes match the bucket's object, by size and the store's MD5 digest?"""
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


def _etag(value: Any) -> str:
    """An ETag to compare: S3 quotes it, Blob may not; case says nothing."""
    return str(value or "").strip().strip('"').lower()


def _single_md5(entry: bucket.Entry) -> bool:
    return len(entry.digest) == 32 and "-" not in entry.digest


class Record:
    """What this folder last fetched from or uploaded to the bucket, per key: the object's
    size and ETag, the SHA-256 of its bytes, and what vouched for them (``checked``:
    "sha256" or "md5" when the bucket recorded a digest, "size" when it recorded none)."""

    def __init__(self, root: Path, where: str) -> None:
        self.path = root / RECORD
        raw = _load(self.path)
        same = raw.get("where") == where
        self.where = where
        keys = dict(raw.get("keys") or {}) if same else {}
        # Older records (a list of sizes and mtimes) say nothing about the bytes: dropped.
        self.keys: dict[str, dict[str, Any]] = {
            k: v for k, v in keys.items() if isinstance(v, dict) and v.get("sha256")
        }

    def of(self, key: str, entry: bucket.Entry) -> dict[str, Any] | None:
        """The record of ``key`` if it is of this very object (same size and ETag)."""
        known = self.keys.get(key)
        if (
            known
            and known.get("size") == entry.size
            and _etag(known.get("etag")) == _etag(entry.etag)
        ):
            return known
        return None

    def note(self, key: str, entry: bucket.Entry, sha: str, checked: str) -> None:
        self.keys[key] = {"size": entry.size, "etag": entry.etag, "sha256": sha,
                          "checked": checked}  # fmt: skip

    def save(self) -> None:
        if self.path.parent.is_dir():
            _save(self.path, {"where": self.where, "keys": self.keys})


def parse_manifest(data: bytes) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256", "etag"}} of a dataset manifest; {} for anything
    else (a file of that name another tool wrote is not ours to trust)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        return {}
    out = {}
    for rel, item in dict(doc.get("files") or {}).items():
        if (
            isinstance(item, dict)
            and isinstance(item.get("size"), int)
            and isinstance(item.get("sha256"), str)
            and len(item["sha256"]) == 64
        ):
            out[str(rel)] = {"size": item["size"], "sha256": item["sha256"].lower(),
                             "etag": str(item.get("etag") or "")}  # fmt: skip
    return out


def manifest_bytes(files: Mapping[str, Mapping[str, Any]]) -> bytes:
    doc = {"schema": MANIFEST_SCHEMA, "files": {rel: dict(files[rel]) for rel in sorted(files)}}
    return json.dumps(doc, sort_keys=True, indent=0).encode()


def read_manifest(
    store: bucket.BucketStore,
    prefix: str,
    listing: Mapping[str, bucket.Entry],
    root: Path,
    deadline: float,
) -> dict[str, dict[str, Any]]:
    """The dataset's manifest from the bucket (one GET, checked like every download, into
    the folder's copy of it), {} when the prefix has none."""
    entry = listing.get(prefix + MANIFEST)
    if entry is None:
        return {}
    local = root / MANIFEST
    store.download_file(prefix + MANIFEST, local, entry.size, deadline, etag=entry.etag)
    return parse_manifest(local.read_bytes())


class Knowledge:
    """What the bucket says of each object's bytes: the manifest's SHA-256 where it
    describes that very object (same size and ETag), else this folder's record of it."""

    def __init__(
        self,
        store: bucket.BucketStore,
        prefix: str,
        manifest: Mapping[str, Mapping[str, Any]],
        record: Record,
        deadline: float,
    ) -> None:
        self.store, self.prefix, self.manifest, self.record = store, prefix, manifest, record
        self.deadline = deadline

    def expected(self, rel: str, entry: bucket.Entry) -> tuple[str, str]:
        """(sha256, how the bucket vouches for it: "sha256", "md5", "size") or ("", "")."""
        item = self.manifest.get(rel)
        if item and item["size"] == entry.size and _etag(item["etag"]) == _etag(entry.etag):
            return str(item["sha256"]), "sha256"
        known = self.record.of(self.prefix + rel, entry)
        if known:
            return str(known["sha256"]), str(known.get("checked") or "size")
        return "", ""

    def holds(self, rel: str, path: Path, entry: bucket.Entry, digests: Digests) -> str:
        """How the file at ``path`` was found to hold the object's bytes ("sha256", "md5",
        "size": only the size and this folder's own record), or "" when it does not."""
        size, sha = digests.sha(rel, path)
        if size != entry.size:
            return ""
        want, how = self.expected(rel, entry)
        if want:
            return how if sha == want else ""
        if _single_md5(entry):
            return "md5" if digests.of(rel, path)[2] == entry.digest.lower() else ""
        meta = self.store.head_sha256(self.prefix + rel, self.deadline)
        if meta:
            return "sha256" if sha == meta.lower() else ""
        md5 = digests.of(rel, path)[2]
        return "md5" if same_bytes(path, md5, size, entry) else ""


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


def failure(exc: BaseException, counts: str, sending: bool = False) -> str:
    """One line: the cause in a word, what happened, what was done, what to do
    (``sending``: the node was uploading)."""
    if isinstance(exc, bucket.StoreError):
        cause = str(getattr(exc, "cause", "") or "error")
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        cause = "disk"
    else:
        cause = "error"
    text = " ".join(str(exc).split())
    key = f"{cause}-upload" if sending and f"{cause}-upload" in ADVICE else cause
    advice = ADVICE.get(key, "run it again; if it fails the same way, the line above "
                               "says what the bucket answered")  # fmt: skip
    return f"{cause}: {text} ({counts}): {advice}"


def fetch(
    root: Path,
    store: bucket.BucketStore,
    prefix: str,
    *,
    delete: bool = False,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Every object under ``prefix`` into ``root`` (its key less the prefix), but those the
    folder already has; with ``delete``, files of the folder the bucket does not list go.
    ``deadline`` (time.monotonic) bounds the whole."""
    started = time.monotonic()
    deadline = started + DEADLINE_S if deadline is None else deadline
    prefix = prefix.rstrip("/") + "/"
    try:
        entries = store.list_entries(prefix)
        listing = _from(entries, prefix)
    except LIST_ERRORS as exc:
        return {"ok": False, "error": failure(exc, f"cannot list {store.bucket}/{prefix}")}
    if not listing:
        return {"ok": False, "error": f"nothing under {store.bucket}/{prefix}"}
    root.mkdir(parents=True, exist_ok=True)
    swept = bucket.sweep_parts(root, PART_MAX_AGE_S)
    digests, record = Digests(root), Record(root, f"{store.bucket}/{prefix}")
    progress = Progress(sum(e.size for e in listing.values()))
    moved = kept = moved_bytes = size_only = 0
    try:
        manifest = read_manifest(store, prefix, entries, root, deadline)
        know = Knowledge(store, prefix, manifest, record, deadline)
        for rel in sorted(listing):
            entry, path, key = listing[rel], root / rel, prefix + rel
            how = know.holds(rel, path, entry, digests) if path.is_file() else ""
            if how:
                kept, size_only = kept + 1, size_only + (how == "size")
                record.note(key, entry, digests.sha(rel, path)[1], how)
                progress.add(entry.size, f"{rel} already here")
                continue
            want, vouched = know.expected(rel, entry)
            got = store.download_file(
                key,
                path,
                entry.size,
                deadline,
                # A digest of our own making (a record from a size-only fetch) is no
                # evidence of the bucket's bytes: the client goes by the object's own.
                sha256=want if vouched in ("sha256", "md5") else "",
                etag=entry.etag,
            )
            digests.known(rel, path, got.sha256)
            record.note(key, entry, got.sha256, got.checked)
            record.save()  # an interrupted fetch keeps what landed
            moved, moved_bytes = moved + 1, moved_bytes + entry.size
            size_only += got.checked == "size"
            progress.add(entry.size, f"{rel} fetched")
    except (OSError, bucket.StoreError) as exc:
        digests.save()
        record.save()
        return {"ok": False, "error": failure(exc, f"{moved} fetched, {kept} already here")}
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
        "size_only": size_only,
        "swept": swept,
        "seconds": round(time.monotonic() - started, 3),
    }


def _from(entries: Mapping[str, bucket.Entry], prefix: str) -> dict[str, bucket.Entry]:
    return {
        k[len(prefix) :]: e
        for k, e in entries.items()
        if k.startswith(prefix)
        and not k.endswith("/")
        and _safe(k[len(prefix) :])
        and not _ours(k.rsplit("/", 1)[-1])
    }


def upload(
    root: Path, store: bucket.BucketStore, prefix: str, *, deadline: float | None = None
) -> dict[str, Any]:
    """Every file of ``root`` to ``prefix`` in the bucket, but those it holds already (by
    SHA-256 where the bucket recorded one), each with its SHA-256 as metadata; then the
    dataset's manifest, last, when it changed."""
    started = time.monotonic()
    deadline = started + DEADLINE_S if deadline is None else deadline
    prefix = prefix.rstrip("/") + "/"
    if not root.is_dir():
        return {"ok": False, "error": f"no folder {root} on the node"}
    try:
        entries = store.list_entries(prefix)
    except LIST_ERRORS as exc:
        return {"ok": False, "error": failure(exc, f"cannot list {store.bucket}/{prefix}")}
    swept = bucket.sweep_parts(root, PART_MAX_AGE_S)
    files = list(walk(root))
    digests, record = Digests(root), Record(root, f"{store.bucket}/{prefix}")
    progress = Progress(sum(p.stat().st_size for _, p in files))
    moved = kept = moved_bytes = 0
    ours: dict[str, tuple[Path, str]] = {}  # rel -> (path, sha256) of every file sent or kept
    try:
        old = read_manifest(store, prefix, entries, root, deadline)
        know = Knowledge(store, prefix, old, record, deadline)
        for rel, path in files:
            key, (size, sha) = prefix + rel, digests.sha(rel, path)
            entry = entries.get(key)
            ours[rel] = (path, sha)
            if entry is not None and know.holds(rel, path, entry, digests):
                kept += 1
                progress.add(size, f"{rel} already in the bucket")
                continue
            store.upload_file(key, path, size, deadline, sha256=sha)
            moved, moved_bytes = moved + 1, moved_bytes + size
            progress.add(size, f"{rel} uploaded")
        # The manifest goes up last, after every object it names, from what the bucket
        # lists now: each entry the ETag of the very object its SHA-256 is of.
        after = _from(store.list_entries(prefix), prefix)
        new = new_manifest(store, prefix, after, old, ours, record, digests, deadline)
        if new != old or prefix + MANIFEST not in entries:
            store.put(prefix + MANIFEST, manifest_bytes(new), deadline)
    except LIST_ERRORS as exc:
        digests.save()
        record.save()
        counts = f"{moved} uploaded, {kept} already there"
        return {"ok": False, "error": failure(exc, counts, sending=True)}
    digests.save()
    record.save()
    progress.add(0, "done", force=True)
    return {
        "ok": True,
        "moved": moved,
        "kept": kept,
        "bytes": moved_bytes,
        "removed": 0,
        "swept": swept,
        "seconds": round(time.monotonic() - started, 3),
    }


def new_manifest(
    store: bucket.BucketStore,
    prefix: str,
    after: Mapping[str, bucket.Entry],
    old: Mapping[str, Mapping[str, Any]],
    ours: Mapping[str, tuple[Path, str]],
    record: Record,
    digests: Digests,
    deadline: float,
) -> dict[str, dict[str, Any]]:
    """The manifest of what the bucket holds under ``prefix`` now: our files whose object
    is found to hold our bytes (another run may have written one since), the old
    manifest's entries of objects nobody replaced, and for the rest the object's own
    SHA-256 metadata where it has one."""
    out: dict[str, dict[str, Any]] = {}
    for rel, entry in after.items():
        item = old.get(rel)
        if rel in ours:
            path, sha = ours[rel]
            if _single_md5(entry):  # the MD5 is in the digest cache: no request
                size, _, md5 = digests.of(rel, path)
                mine = entry.size == size and entry.digest.lower() == md5
                got = sha if mine else store.head_sha256(prefix + rel, deadline).lower()
            else:  # a multipart ETag: one HEAD, not two more reads of a large file
                got = store.head_sha256(prefix + rel, deadline).lower()
        elif item and item["size"] == entry.size and _etag(item["etag"]) == _etag(entry.etag):
            got = str(item["sha256"])
        else:
            got = store.head_sha256(prefix + rel, deadline).lower()
        if got:
            out[rel] = {"size": entry.size, "sha256": got, "etag": entry.etag}
        if rel in ours and got == ours[rel][1]:
            record.note(prefix + rel, entry, got, "sha256")
        elif rel in ours and not got:
            # A store that keeps neither our metadata nor an MD5 (only a size): this folder
            # knows what it sent there, the manifest vouches for nothing.
            record.note(prefix + rel, entry, ours[rel][1], "size")
    return out


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
    """Make ``root`` and the folders a push will fill (``create``); say what it holds.
    Part files of a killed push (``<rel>.<token>.gpufleet-part``, a name no later push
    reuses) go once nobody wrote them for PART_MAX_AGE_S."""
    if not create and not root.is_dir():
        return {"ok": False, "error": f"no folder {root} on the node"}
    for rel in [""] + [d for d in dirs if _safe(d)]:
        (root / rel).mkdir(parents=True, exist_ok=True)
    swept = bucket.sweep_parts(root, PART_MAX_AGE_S) if root.is_dir() else 0
    digests = Digests(root)
    files = digests.all()
    digests.save()
    return {"ok": True, "files": files, "swept": swept}


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
        os.replace(part, target)  # only now, checked, does it take its name
        digests.known(rel, target, got_sha)
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
    # A body slower than this on average, once the grace has passed, ends the try.
    store.min_rate = args.min_rate
    store.rate_grace_s = args.rate_grace
    return store


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, 0 or more")
    return value


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
    p.add_argument(
        "--deadline",
        type=_seconds,
        default=DEADLINE_S,
        help="seconds the whole command may take, waiting for the folder included",
    )
    p.add_argument(
        "--min-rate",
        type=_seconds,
        default=MIN_RATE,
        help="bytes/s each bucket answer must average after --rate-grace (0: off)",
    )
    p.add_argument(
        "--rate-grace",
        type=_seconds,
        default=RATE_GRACE_S,
        help="seconds each answer has before --min-rate applies",
    )
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.deadline
    # The rest comes on stdin as JSON (file lists, and the job-style --node-env, which is
    # kept out of the process's arguments where ps would show it).
    doc = json.loads(sys.stdin.read() or "{}")
    for key, value in (doc.get("env") or {}).items():
        os.environ[str(key)] = str(value)
    try:
        with folder_lock(args.root, deadline):
            out = _command(args, doc, deadline)
    except (OSError, ValueError, KeyError, bucket.StoreError) as exc:
        out = {"ok": False, "error": str(exc)}
    print(json.dumps(out))
    return 0 if out.get("ok") else 1


@contextlib.contextmanager
def folder_lock(root: Path, deadline: float | None = None) -> Iterator[None]:
    """One command at a time per folder: nodes that share a disk (and two runs at once)
    take turns, and the later one finds the bytes there already. The wait ends at
    ``deadline`` (a run left behind by a killed fab may still hold the folder)."""
    wait = math.inf if deadline is None else deadline - time.monotonic()
    with contextlib.ExitStack() as held:
        try:
            lock = root.parent / f".gpufleet-lock-{root.name}"
            held.enter_context(job_sync.flock(lock, wait, "another data-* run"))
        except job_sync.LockBusy:
            raise bucket.StoreError(
                f"another data-* run still holds {root} on this node at --deadline", "Deadline"
            ) from None
        yield


def _command(args: argparse.Namespace, doc: Mapping[str, Any], deadline: float) -> dict[str, Any]:
    if args.command == "prepare":
        return prepare(args.root, list(doc.get("dirs") or []), doc.get("create", True))
    if args.command == "place":
        keep = set(doc["keep"]) if doc.get("keep") is not None else None
        return place(args.root, dict(doc.get("files") or {}), keep, str(doc["token"]))
    if args.command == "fetch":
        return fetch(args.root, _store(args), args.prefix, delete=args.delete, deadline=deadline)
    return upload(args.root, _store(args), args.prefix, deadline=deadline)


if __name__ == "__main__":
    sys.exit(main())
