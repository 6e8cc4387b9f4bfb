"""Checkpoints between a job's GPUFLEET_CHECKPOINT_DIR and the stack's bucket (node side).

Standard library only; shipped by ``fab train`` next to ``job_runner.py`` with the watchdog's
files, and run on the node with its system Python (3.10+), through the watchdog's own store
for the node cloud's ``bucket_store`` (S3 and S3-compatible, or Azure Blob).

Checkpoint versions (issue 39). Whatever the job's layout (a plain ``torch.save`` of
``ckpt.pt``, transformers' ``checkpoint-N/`` folders, ``step-N/``, a
torch.distributed.checkpoint folder), a push uploads the whole checkpoint folder as one
VERSION under the job's ``bucket_prefix`` P::

    P.gpufleet/objects/<sha256>           one object per distinct file content, sent once
    P.gpufleet/versions/<seq:08d>.json    the version's manifest, written LAST

The manifest (schema ``gpufleet.checkpoint-version/1``) names every file with its size and
SHA-256, the step inferred from the files (:func:`infer_step`), and whether the version
REGRESSED (an attempt that restored step s and then wrote an older step). A version whose
manifest is there has every object it names in the bucket; a push cut off half way leaves
objects no manifest names, and a restore never sees them. A restore takes the newest
version that did not regress, all of it or nothing: every file is checked against its
SHA-256 before it takes its name (``bucket.download_file``), a local file is kept only when
its own digest matches, and a local file that differs is moved aside, never deleted.

A push happens only when the folder differs from the newest version and is quiet: no file
changed for ``quiet_s`` before the scan nor while it was uploaded (else "changing, next
sync"); the final push after the job ended needs no quiet period. Digests are cached per
folder by (size, mtime_ns), so an unchanged 10 GB file is not read at every sync. The files a
version holds are marked in the watchdog's record of scratch (``bucket.Manifest``), so the
watchdog does not upload them again.

A torn save never becomes a version (:func:`torn_file`): a changed file that starts as a
zip (torch.save) must have its whole zip directory, and a ``*.safetensors`` file a header
that accounts for its size; else the push sends nothing and says which file and why.

What is left of the old contract (docs/train.md): a local ``step-<N>`` folder without its
``COMPLETE`` marker, or whose marker disagrees with the files beside it, is a save in
progress: it is left out of a version and of ``{newest step-*}``.

gpufleet's own files for a folder (digest cache, locks, the restore's staging folder, the
files set aside) live in ``<scratch>/.gpufleet-ckpt/<job>/``, beside the checkpoint folder's
parent, so the watchdog's sync of ``<scratch>/checkpoints`` never uploads them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import struct
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import bucket, clouds

MARKER = bucket.CHECKPOINT_MARKER
VERSION_SCHEMA = "gpufleet.checkpoint-version/1"
OBJECTS = ".gpufleet/objects/"
VERSIONS = ".gpufleet/versions/"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# A file or folder name that says its step: step-120, checkpoint-400 (transformers' Trainer),
# iter-2000 / iter_2000.pt, ckpt-5.pt.
_STEP_NAME = re.compile(r"^(?:step|checkpoint|iter|ckpt)[-_]?(\d+)(?:\.[A-Za-z0-9]+)*$")
_PICKLE_STEP_KEYS = ("iter_num", "global_step", "step")  # nanoGPT, Lightning, most loops
MAX_PICKLE_BYTES = 32 * 1024 * 1024  # a data.pkl bigger than this is not read for its step
MAX_PICKLE_FILES = 64  # torch.save files looked into per version
QUIET_S = 2.0
# Lines a script prints when it ignores a checkpoint and starts again from step 0; a resumed
# attempt whose output says one of them gets a warning. Each from the script's own source:
# karpathy/nanoGPT train.py, init_from == 'scratch' branch.
FROM_SCRATCH_LINES = ("Initializing a new model from scratch",)


def _utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


# ---------------------------------------------------------------------------- pure rules


def parse_marker(text: str) -> dict[str, int] | None:
    """The file list of a COMPLETE marker, or None when it is not one."""
    try:
        doc = json.loads(text)
        files = doc["files"]
        if not isinstance(files, dict) or not files:
            return None
        out = {str(k): int(v) for k, v in files.items()}
    except (ValueError, KeyError, TypeError):
        return None
    if any(v < 0 or not safe_rel(k) for k, v in out.items()):
        return None
    return out


def safe_rel(rel: str) -> bool:
    """A relative path that stays inside its folder."""
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


def own_temp_file(name: str) -> bool:
    """A file gpufleet itself writes and removes beside the job's (a download in progress,
    an old marker read back): never part of the job's folder."""
    return (
        name.startswith((".marker-", ".gpufleet-"))
        or name.endswith(bucket.PART_SUFFIX)
        or (name.startswith(".") and name.endswith(".part"))
    )


@dataclass(frozen=True)
class LocalFile:
    size: int
    mtime_ns: int


def local_files(root: Path) -> dict[str, LocalFile]:
    """Every regular file under ``root`` as {relative path: (size, mtime_ns)}; hidden
    folders (a save in progress, such as ".tmp-step-12") and gpufleet's own temp files left
    out. Other hidden files are the job's: torch.distributed.checkpoint keeps its index in
    ".metadata", without which the folder cannot be loaded."""
    out: dict[str, LocalFile] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            path = Path(dirpath) / name
            if own_temp_file(name):
                continue
            try:
                st = path.lstat()
            except OSError:
                continue  # removed while we looked
            if path.is_symlink() or not path.is_file():
                continue
            out[path.relative_to(root).as_posix()] = LocalFile(st.st_size, st.st_mtime_ns)
    return out


def local_listing(root: Path) -> dict[str, int]:
    """:func:`local_files` as {relative path: size}."""
    return {rel: f.size for rel, f in local_files(root).items()}


def incomplete_step_dirs(root: Path, files: Mapping[str, LocalFile | int]) -> set[str]:
    """The ``step-<N>`` folders directly under ``root`` that are saves in progress: no
    COMPLETE marker, or one whose list disagrees with the sizes beside it."""
    sizes = {rel: (f if isinstance(f, int) else f.size) for rel, f in files.items()}
    out = set()
    for head in {rel.split("/", 1)[0] for rel in sizes if "/" in rel}:
        if not _STEP_DIR.match(head):
            continue
        try:
            listed = parse_marker((root / head / MARKER).read_text())
        except OSError:
            listed = None
        if listed is None or any(sizes.get(f"{head}/{n}") != s for n, s in listed.items()):
            out.add(head)
    return out


def checkpoint_files(root: Path) -> tuple[dict[str, LocalFile], set[str]]:
    """What a version of ``root`` holds: its files minus step-<N> saves in progress (named
    in the second item)."""
    files = local_files(root)
    partial = incomplete_step_dirs(root, files)
    kept = {rel: f for rel, f in files.items() if rel.split("/", 1)[0] not in partial}
    return kept, partial


# ---------------------------------------------------------------------------- torn saves

# What a zip starts with (its first member's local file header): torch.save's format since
# torch 1.6 (PyTorchStreamWriter) and what every checked zip is (PKWARE APPNOTE.TXT 4.3.7).
ZIP_LOCAL = b"PK\x03\x04"
# The safetensors reference reader refuses larger headers (huggingface/safetensors README).
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
STOPPED_WHILE_SAVING = "the job was stopped while saving?"


def torn_zip(path: Path) -> str:
    """Why the zip at ``path`` is incomplete, "" when it is whole. A zip's central directory
    is written last, at its end: it must parse, and every member's local header and data
    must lie before it. Only the headers are read (no CRC of the data): a save cut short
    (torch.save writes in place, after truncating the file) loses its end first."""
    try:
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            directory = z.start_dir
            for info in z.infolist():
                f.seek(info.header_offset)
                head = f.read(30)
                if len(head) < 30 or head[:4] != ZIP_LOCAL:
                    return f"member {info.filename}: no local header at its offset"
                name_len, extra_len = struct.unpack("<HH", head[26:30])
                end = info.header_offset + 30 + name_len + extra_len + info.compress_size
                if end > directory:
                    return f"member {info.filename}'s data runs past the directory"
    except (zipfile.BadZipFile, ValueError, EOFError, struct.error) as exc:
        if str(exc) == "File is not a zip file":  # zipfile found no end of central directory
            return "no zip directory at its end"
        return f"its zip directory does not parse: {exc}"
    return ""


def torn_safetensors(path: Path, size: int) -> str:
    """Why the safetensors file at ``path`` (``size`` bytes) is incomplete, "" when its
    header agrees with its size. The format (https://github.com/huggingface/safetensors,
    README "Format"): 8 bytes, N, "an unsigned little-endian 64-bit integer, containing
    the size of the header"; N bytes of JSON, {name: {"dtype", "shape", "data_offsets":
    [BEGIN, END]}} with offsets relative to the byte buffer after it and an optional
    "__metadata__"; then the byte buffer, which "needs to be entirely indexed, and cannot
    contain holes": the largest END is the buffer's size, ``size - 8 - N``."""
    with open(path, "rb") as f:
        first = f.read(8)
        if len(first) < 8:
            return f"{size} byte(s), less than its 8-byte header length"
        n = int.from_bytes(first, "little")
        if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            return f"its header length says {n} bytes, {size - 8} follow it"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "its JSON header does not parse"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for name, item in header.items():
        if name == "__metadata__":
            continue
        offsets = item.get("data_offsets") if isinstance(item, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            return f"tensor {name} has no data_offsets"
        if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
            return f"tensor {name} has no data_offsets"
        end = max(end, offsets[1])
    if end != size - 8 - n:
        return f"its tensors end at byte {end} of a data buffer of {size - 8 - n} bytes"
    return ""


def torn_file(root: Path, rel: str, size: int) -> str:
    """One line saying why ``root/rel`` is an incomplete save, "" when it is not one that
    can be told: a file that starts as a zip (torch.save) and every ``*.safetensors``."""
    path = root / rel
    if rel.endswith(".safetensors"):
        why = torn_safetensors(path, size)
        return (
            f"{rel} is an incomplete safetensors file ({why}): {STOPPED_WHILE_SAVING}"
            if why
            else ""
        )
    with open(path, "rb") as f:
        if f.read(4) != ZIP_LOCAL:
            return ""
    why = torn_zip(path)
    return (
        f"{rel} is an incomplete torch.save (zip) file ({why}): {STOPPED_WHILE_SAVING}"
        if why
        else ""
    )


def first_torn(root: Path, files: Mapping[str, LocalFile], rels: list[str]) -> tuple[str, str]:
    """(the first of ``rels`` that is an incomplete save, why), or ("", "")."""
    for rel in sorted(rels):
        why = torn_file(root, rel, files[rel].size)
        if why:
            return rel, why
    return "", ""


# ---------------------------------------------------------------------------- the step


class _Inert(dict):  # type: ignore[type-arg,unused-ignore]
    """What a restricted unpickling makes of any class or function: accepts whatever a
    pickle does to it (construct, set state, add items) and does nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        del args, kwargs
        return dict.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        del state

    def append(self, item: Any) -> None:
        del item

    def extend(self, items: Any) -> None:
        del items


class _NoImports(pickle.Unpickler):
    """Reads a pickle without importing or calling anything: every global is an inert
    stub and every persistent id (torch's tensor storages) is None."""

    def find_class(self, module: str, name: str) -> Any:
        del module, name
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        del pid
        return None


def pickle_step(data: bytes) -> tuple[int, str] | None:
    """The top-level int ``iter_num`` / ``global_step`` / ``step`` of a pickled dict."""
    try:
        obj = _NoImports(io.BytesIO(data)).load()
    except Exception:
        return None
    if not isinstance(obj, dict):
        return None
    for key in _PICKLE_STEP_KEYS:
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, key
    return None


def torch_save_step(path: Path) -> tuple[int, str] | None:
    """The step a ``torch.save`` file (a zip holding ``<name>/data.pkl``) records, read
    without torch and without importing anything the pickle names."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return None
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.filename.endswith("data.pkl") and info.file_size <= MAX_PICKLE_BYTES:
                    return pickle_step(z.read(info))
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError, EOFError):
        return None
    return None


def infer_step(root: Path, rels: list[str]) -> tuple[int | None, str]:
    """The step of the files ``rels`` under ``root`` and where it was read: the highest of
    a step-like name (step-N, checkpoint-N, iter-N, ckpt-N), a transformers
    trainer_state.json's global_step, and a torch.save file's top-level int."""
    best: tuple[int, str] | None = None

    def offer(step: int, source: str) -> None:
        nonlocal best
        if best is None or step > best[0]:
            best = (step, source)

    looked = 0
    for rel in sorted(rels):
        parts = rel.split("/")
        for part in parts:
            m = _STEP_NAME.match(part)
            if m:
                offer(int(m.group(1)), f"name {part}")
        if parts[-1] == "trainer_state.json":
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                step = json.loads((root / rel).read_text()).get("global_step")
                if isinstance(step, int) and step >= 0:
                    offer(step, f"{rel} global_step")
        elif parts[-1].endswith((".pt", ".pth", ".ckpt", ".bin", ".tar")):
            if looked >= MAX_PICKLE_FILES:
                continue
            looked += 1
            found = torch_save_step(root / rel)
            if found is not None:
                offer(found[0], f"{rel} {found[1]}")
    return (best[0], best[1]) if best else (None, "")


def started_from_scratch(text: str) -> str:
    """The first line of ``text`` that says the script started from scratch, or ""."""
    for line in text.splitlines():
        if any(phrase in line for phrase in FROM_SCRATCH_LINES):
            return line.strip()[:200]
    return ""


# ---------------------------------------------------------------------------- placeholders

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
PLACEHOLDER_NAMES = ("checkpoint_dir", "job", "attempt", "node_rank", "scratch")


class PlaceholderError(ValueError):
    """An argument names a placeholder that cannot be expanded (one line, for the user)."""


def newest_entry(root: Path, pattern: str) -> Path | None:
    """The entry directly under ``root`` matching ``pattern`` with the highest trailing
    integer, then the newest mtime; step-<N> saves in progress are not entries."""
    best: tuple[int, int, str] | None = None
    found = None
    if not root.is_dir():
        return None
    partial = incomplete_step_dirs(root, local_listing(root))
    for entry in root.glob(pattern):
        if entry.parent != root or entry.name.startswith(".") or entry.name in partial:
            continue
        m = re.search(r"(\d+)\D*$", entry.name)
        try:
            mtime = entry.stat().st_mtime_ns
        except OSError:
            continue
        key = (int(m.group(1)) if m else -1, mtime, entry.name)
        if best is None or key > best:
            best, found = key, entry
    return found.resolve() if found else None


def expand(arg: str, values: Mapping[str, str], root: Path) -> str:
    """``arg`` with its placeholders replaced ({checkpoint_dir}, {job}, {attempt},
    {node_rank}, {scratch}, {newest GLOB}; ``{{``/``}}`` are braces). Raises
    PlaceholderError with one line when one cannot be expanded."""

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if m.group(1) is None:
            raise PlaceholderError(f"argument {arg!r}: a lone {token!r} (write {token * 2})")
        name = m.group(1).strip()
        if name == "newest" or name.startswith("newest "):
            pattern = name[len("newest ") :].strip()
            if not pattern or "/" in pattern:
                raise PlaceholderError(f"argument {arg!r}: {{newest GLOB}} needs a name pattern")
            entry = newest_entry(root, pattern)
            if entry is None:
                raise PlaceholderError(
                    f"argument {arg!r}: nothing in {root} matches {pattern!r} (the restore "
                    "put no such entry there)"
                )
            return str(entry)
        if name not in values:
            known = ", ".join("{" + n + "}" for n in PLACEHOLDER_NAMES)
            raise PlaceholderError(
                f"argument {arg!r}: unknown placeholder {{{name}}} (known: {known}, "
                "{newest GLOB}; {{ and }} are braces)"
            )
        return values[name]

    return _PLACEHOLDER.sub(one, arg)


def expand_args(args: list[str], values: Mapping[str, str], root: Path) -> list[str]:
    return [expand(str(a), values, root) for a in args]


# ---------------------------------------------------------------------------- local state


def workspace(root: Path) -> Path:
    """gpufleet's own folder for the checkpoint folder ``root`` (digest cache, locks,
    staging, files set aside): ``<scratch>/.gpufleet-ckpt/<job>``, outside the folder the
    watchdog syncs, on the same disk (a staged file takes its name by a rename)."""
    candidates = [root.parent.parent / ".gpufleet-ckpt" / root.name, root / ".gpufleet"]
    for place in candidates:
        try:
            place.mkdir(parents=True, exist_ok=True)
            if os.access(place, os.W_OK):
                return place
        except OSError:
            continue
    raise OSError(f"no writable place for gpufleet's files beside {root}")


class LockBusy(TimeoutError):
    """:func:`flock` waited its whole time for a lock someone else holds."""


@contextlib.contextmanager
def flock(path: Path, wait_s: float, what: str) -> Iterator[None]:
    """An exclusive flock on ``path``, waited for at most ``wait_s``; LockBusy (a
    TimeoutError) says who holds it (``what``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusy(f"{what} still running after {wait_s:g} s") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class DigestCache:
    """SHA-256 of each file of a folder by (size, mtime_ns): an unchanged file is not read
    again (``<workspace>/digests.json``)."""

    path: Path
    entries: dict[str, list[Any]] = field(default_factory=dict)  # rel -> [size, mtime, sha]
    hashed_bytes: int = 0

    @classmethod
    def load(cls, path: Path) -> DigestCache:
        try:
            raw = json.loads(path.read_text())
            entries = {str(k): [int(v[0]), int(v[1]), str(v[2])] for k, v in raw.items()}
            return cls(path, entries)
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return cls(path)

    def digest(self, root: Path, rel: str, f: LocalFile) -> str:
        known = self.entries.get(rel)
        if known and known[0] == f.size and known[1] == f.mtime_ns:
            return str(known[2])
        sha = sha256_file(root / rel)
        self.hashed_bytes += f.size
        self.entries[rel] = [f.size, f.mtime_ns, sha]
        return sha

    def remember(self, rel: str, f: LocalFile, sha: str) -> None:
        self.entries[rel] = [f.size, f.mtime_ns, sha]

    def save(self, keep: Mapping[str, object]) -> None:
        self.entries = {k: v for k, v in self.entries.items() if k in keep}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)


def mark_synced(root: Path, store_bucket: str, node: str, files: Mapping[str, LocalFile]) -> None:
    """Mark ``files`` as saved in the watchdog's record of scratch (keys
    ``<checkpoints>/<node>/<job>/<rel>``, as its sync names them), so the watchdog does not
    upload them again: they are in the bucket, as this version's objects."""
    scratch = root.parent.parent
    with contextlib.suppress(OSError):
        manifest = bucket.Manifest.load(scratch, store_bucket)
        for rel, f in files.items():
            key = f"{root.parent.name}/{node}/{root.name}/{rel}"
            manifest.files[key] = [f.size, f.mtime_ns]
        manifest.save()


# ---------------------------------------------------------------------------- stores


def make_store(
    provider: str, bucket: str, region: str, endpoint: str = "", metadata_url: str = ""
) -> bucket.BucketStore | None:
    """The watchdog's store for the stack's bucket (the node cloud's ``bucket_store``,
    as the watchdog's own sync picks it), or None when checkpoints stay here. A bucket
    without its cloud or region is a ValueError: there is no default cloud to guess."""
    if not bucket:
        return None
    missing = [name for name, value in (("provider", provider), ("region", region)) if not value]
    if missing:
        raise ValueError(
            f"bucket {bucket!r} comes without its {' and '.join(missing)}: the job spec "
            "(fab train records the stack's) must name the cloud and region it is in"
        )
    cloud = clouds.node_cloud(provider, region, "", metadata_url)

    def creds() -> dict[str, str] | None:
        # The instance role only on a real node: never the metadata address for a test
        # endpoint (unless a metadata URL is given explicitly, e.g. a local fake).
        if endpoint and not metadata_url:
            return cloud.env_credentials()
        return cloud.credentials()

    return cloud.bucket_store.for_node(
        endpoint=cloud.bucket_endpoint(),
        region=region,
        bucket=bucket,
        credentials=creds,
        endpoint_url=endpoint,
    )


def _key(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}" if prefix else rel


_CODE_CAUSES = {
    "SlowDown": "throttled",
    "ServerBusy": "throttled",
    "HTTP429": "throttled",
    "HTTP503": "throttled",
    "AccessDenied": "denied",
    "HTTP403": "denied",
    "AuthorizationPermissionMismatch": "denied",
    "NoSuchKey": "missing",
    "BlobNotFound": "missing",
    "HTTP404": "missing",
    "NoSuchBucket": "missing",
    "Digest": "damaged",
    "ShortRead": "damaged",
    "TooSlow": "slow",
    "Deadline": "deadline",
    "Unreachable": "unreachable",
    "NoCredentials": "credentials",
}


def cause_of(exc: BaseException) -> str:
    """The contract's word for what went wrong (StoreError.cause, else from its code)."""
    cause = str(getattr(exc, "cause", "") or "")
    if cause:
        return cause
    if isinstance(exc, bucket.StoreError):
        return _CODE_CAUSES.get(exc.code, "error")
    if isinstance(exc, ET.ParseError):
        return "error"
    if isinstance(exc, TimeoutError):
        return "busy"
    return "error"


_WHAT_TO_DO = {
    "throttled": "the bucket is throttling requests: run the resume again in a few minutes",
    "denied": "the node's identity may not read the bucket: check its role or --node-env keys",
    "missing": "an object the version names is gone from the bucket: resume with "
    "--from-scratch, or restore the objects",
    "damaged": "bytes arrived that do not match their SHA-256 (nothing was kept): run the "
    "resume again; if it repeats, the bucket's copy is damaged",
    "changed": "an object changed while it was fetched: run the resume again",
    "slow": "the bucket answered below the minimum rate: check the node's network, then "
    "run the resume again",
    "deadline": "the restore ran out of time: run the resume again (it continues)",
    "unreachable": "the bucket cannot be reached from the node: check its endpoint and "
    "network, then run the resume again",
    "credentials": "the node has no credentials for the bucket: check its role or --node-env",
    "busy": "another restore of this folder is still running: wait for it, then resume",
    "disk": "the node's disk refused the files: free space on scratch, then resume again",
}


def error_line(cause: str, detail: str) -> str:
    """One line: what failed, its cause, and what to do."""
    todo = _WHAT_TO_DO.get(cause, "see the supervisor's log, then run the resume again")
    return f"restore failed ({cause}): {detail}; {todo}"


def _meta_sha(headers: Mapping[str, str]) -> str:
    name = bucket.META_SHA256
    return headers.get(f"x-amz-meta-{name}", "") or headers.get(f"x-ms-meta-{name}", "")


def get_json(store: bucket.BucketStore, key: str, deadline: float) -> dict[str, Any] | None:
    """A small JSON object from the bucket, checked against its SHA-256 metadata when the
    store has it (StoreError "Digest" when it disagrees); None when it is not a JSON object."""
    _, headers, body = store.request("GET", key, deadline=deadline)
    want = _meta_sha(headers)
    if want and hashlib.sha256(body).hexdigest() != want.lower():
        raise bucket.StoreError(f"GET {key}: bytes do not match their SHA-256", code="Digest")
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


# ---------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Version:
    seq: int
    files: Mapping[str, tuple[int, str]]  # rel -> (size, sha256)
    step: int | None
    regressed: bool
    doc: Mapping[str, Any]

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    def summary(self) -> dict[str, Any]:
        return {"seq": self.seq, "step": self.step, "files": len(self.files), "bytes": self.bytes}


def parse_version(seq: int, doc: Mapping[str, Any]) -> Version | None:
    """A version manifest, or None when it is not one (wrong schema, unsafe path, no digest)."""
    if doc.get("schema") != VERSION_SCHEMA or not isinstance(doc.get("files"), dict):
        return None
    files: dict[str, tuple[int, str]] = {}
    try:
        for rel, item in doc["files"].items():
            size, sha = int(item["size"]), str(item["sha256"]).lower()
            if not safe_rel(str(rel)) or size < 0 or not re.fullmatch(r"[0-9a-f]{64}", sha):
                return None
            files[str(rel)] = (size, sha)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    step = doc.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    return Version(seq, files, step, bool(doc.get("regressed")), doc)


def version_seqs(store: bucket.BucketStore, prefix: str) -> list[int]:
    """The sequence numbers of the versions under ``prefix``, newest first."""
    base = _key(prefix, VERSIONS)
    seqs = []
    for key in store.list_entries(base):
        m = re.fullmatch(r"(\d{8,})\.json", key[len(base) :])
        if m:
            seqs.append(int(m.group(1)))
    return sorted(seqs, reverse=True)


def read_version(
    store: bucket.BucketStore, prefix: str, seq: int, deadline: float
) -> Version | None:
    doc = get_json(store, _key(prefix, f"{VERSIONS}{seq:08d}.json"), deadline)
    return parse_version(seq, doc) if doc is not None else None


def newest_versions(
    store: bucket.BucketStore, prefix: str, deadline: float
) -> tuple[Version | None, Version | None, int]:
    """(the newest version, the newest that did not regress, the highest seq listed).
    Raises StoreError / OSError when the bucket cannot be listed or read."""
    seqs = version_seqs(store, prefix)
    newest: Version | None = None
    for seq in seqs:
        v = read_version(store, prefix, seq, deadline)
        if v is None:
            continue
        newest = newest or v
        if not v.regressed:
            return newest, v, seqs[0]
    return newest, None, seqs[0] if seqs else 0


# ---------------------------------------------------------------------------- push


@dataclass
class SyncOutcome:
    ok: bool
    detail: str
    uploaded: int = 0
    newest_step: int | None = None
    seconds: float = 0.0
    version: int | None = None
    pushed: bool = False
    wrote_nothing: bool = False
    regressed: bool = False
    note: str = ""
    bytes_sent: int = 0
    cause: str = ""
    changing: bool = False  # not pushed: the folder was being written
    torn: str = ""  # not pushed: this file is an incomplete save (torn_file)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "uploaded": self.uploaded,
            "newest_step": self.newest_step,
            "seconds": round(self.seconds, 3),
            "version": self.version,
            "pushed": self.pushed,
            "wrote_nothing": self.wrote_nothing,
            "regressed": self.regressed,
            "note": self.note,
            "bytes_sent": self.bytes_sent,
            "changing": self.changing,
            "torn": self.torn,
        }


class _Changing(Exception):
    """A file changed during the push: the version is not written, the next sync tries."""


@dataclass
class _Push:
    root: Path
    store: bucket.BucketStore
    prefix: str
    node: str
    deadline: float
    final: bool
    quiet_s: float
    attempt: int
    restored_from: Mapping[str, Any] | None
    started: float = field(default_factory=time.monotonic)

    def scan(self, cache: DigestCache) -> tuple[dict[str, LocalFile], dict[str, str], set[str]]:
        files, partial = checkpoint_files(self.root)
        if not self.final:
            newest = max((f.mtime_ns for f in files.values()), default=0)
            if time.time_ns() - newest < self.quiet_s * 1e9:
                raise _Changing(f"a file changed in the last {self.quiet_s:g} s")
        digests = {rel: cache.digest(self.root, rel, f) for rel, f in files.items()}
        return files, digests, partial

    def present(self, shas: set[str], trusted: set[str]) -> set[str]:
        """Which of ``shas`` the bucket already holds as an object named by that content
        (an object another push left without a version is checked by its metadata)."""
        base = _key(self.prefix, OBJECTS)
        listed = {k[len(base) :] for k in self.store.list_entries(base)}
        out = shas & trusted & listed
        head = getattr(self.store, "head_sha256", None)
        for sha in sorted((shas & listed) - out):
            if head is not None and str(head(base + sha, self.deadline)).lower() == sha:
                out.add(sha)
        return out

    def upload(
        self, files: Mapping[str, LocalFile], digests: Mapping[str, str], have: set[str]
    ) -> tuple[int, int]:
        sent, sent_bytes = 0, 0
        for rel in sorted(files, key=lambda r: (r.rsplit("/", 1)[-1] == MARKER, r)):
            sha = digests[rel]
            if sha in have:
                continue
            f = files[rel]
            try:
                # With its digest given, a file whose bytes change while they are sent is
                # refused by upload_file (StoreError "Digest") and never committed.
                self.store.upload_file(
                    _key(self.prefix, OBJECTS + sha), self.root / rel, f.size, self.deadline, sha
                )
            except bucket.StoreError as exc:
                if exc.code == "Digest":
                    raise _Changing(f"{rel} changed while it was uploaded") from None
                raise
            have.add(sha)
            sent, sent_bytes = sent + 1, sent_bytes + f.size
        return sent, sent_bytes

    def manifest(
        self,
        seq: int,
        files: Mapping[str, LocalFile],
        digests: Mapping[str, str],
        previous: Version | None,
    ) -> dict[str, Any]:
        changed = [
            r
            for r in files
            if previous is None or previous.files.get(r) != (files[r].size, digests[r])
        ]
        step, source = infer_step(self.root, changed)
        if step is None:
            step, source = infer_step(self.root, list(files))
        restored = dict(self.restored_from) if self.restored_from else None
        below = (
            restored is not None
            and restored.get("step") is not None
            and step is not None
            and step < int(restored["step"])
        )
        note = ""
        if below and restored is not None:
            note = (
                f"step {step} ({source}) is below step {restored['step']} that this attempt "
                f"restored from version {restored.get('version')}: not used by a restore"
            )
        return {
            "schema": VERSION_SCHEMA,
            "seq": seq,
            "created_at": _utcnow(),
            "attempt": self.attempt,
            "node": self.node,
            "files": {r: {"size": files[r].size, "sha256": digests[r]} for r in sorted(files)},
            "step": step,
            "step_source": source,
            "restored_from": (
                {"seq": restored.get("version"), "step": restored.get("step")} if restored else None
            ),
            "regressed": below,
            "note": note,
        }


def push(
    checkpoint_dir: Path,
    store: bucket.BucketStore | None,
    node: str,
    deadline_s: float = 600.0,
    prefix: str = "",
    *,
    final: bool = False,
    quiet_s: float = QUIET_S,
    attempt: int = 1,
    restored_from: Mapping[str, Any] | None = None,
) -> SyncOutcome:
    """Upload the checkpoint folder as a new version under ``prefix`` when it differs from
    the newest one and is quiet (``final``: the job ended, no quiet period needed). One push
    at a time on this node (a flock). ``restored_from`` ({"version", "step"}):
    what this attempt restored; a version below that step is marked regressed."""
    started = time.monotonic()
    if store is None:
        n = len(local_listing(checkpoint_dir))
        return SyncOutcome(False, f"no bucket configured: {n} file(s) cannot be saved")
    try:
        ws = workspace(checkpoint_dir)
        # One push at a time on this node (all its jobs: they share its disk and uplink); a
        # periodic one waits a minute at most and the next sync tries again.
        lock = ws.parent / "push.lock" if ws.parent.name == ".gpufleet-ckpt" else ws / "push.lock"
        wait = deadline_s if final else min(60.0, deadline_s)
        with flock(lock, wait, "another checkpoint push on this node"):
            p = _Push(
                checkpoint_dir,
                store,
                prefix,
                node,
                started + deadline_s,
                final,
                quiet_s,
                attempt,
                restored_from,
                started,
            )
            return _push_locked(p, DigestCache.load(ws / "digests.json"))
    except _Changing as exc:
        return SyncOutcome(
            True,
            f"checkpoint folder changing ({exc}), next sync",
            seconds=_since(started),
            changing=True,
        )
    except (bucket.StoreError, OSError, ET.ParseError) as exc:
        return SyncOutcome(False, str(exc), seconds=_since(started), cause=cause_of(exc))


def _since(started: float) -> float:
    return time.monotonic() - started


def _push_locked(p: _Push, cache: DigestCache) -> SyncOutcome:
    try:
        files, digests, partial = p.scan(cache)
    finally:
        cache.save(local_files(p.root))
    skipped = f"; {len(partial)} save(s) in progress left out" if partial else ""
    if not files:
        return SyncOutcome(
            True,
            f"the job wrote nothing to its checkpoint folder ({p.root}){skipped}",
            wrote_nothing=not partial,
            seconds=_since(p.started),
        )
    newest, _, top = newest_versions(p.store, p.prefix, p.deadline)
    current = {rel: (f.size, digests[rel]) for rel, f in files.items()}
    if newest is not None and dict(newest.files) == current:
        mark_synced(p.root, p.store.bucket, p.node, files)
        return SyncOutcome(
            True,
            f"unchanged since version {newest.seq} (step {newest.step}){skipped}",
            newest_step=newest.step,
            seconds=_since(p.started),
            version=newest.seq,
        )
    # A torn save (a kill or a final push mid torch.save) never becomes a version.
    changed = [rel for rel in files if newest is None or newest.files.get(rel) != current[rel]]
    torn, why = first_torn(p.root, files, changed)
    if torn:
        kept = f"the bucket keeps version {newest.seq}" if newest else "the bucket has no version"
        detail = f"{why} No version uploaded; {kept}"
        return SyncOutcome(False, detail, seconds=_since(p.started), cause="torn", torn=torn)
    trusted = {sha for _, sha in newest.files.values()} if newest else set()
    have = p.present(set(digests.values()), trusted)
    sent, sent_bytes = p.upload(files, digests, have)
    after, _ = checkpoint_files(p.root)
    moved = sorted(rel for rel, f in files.items() if after.get(rel) != f)
    if moved:
        raise _Changing(f"{moved[0]} changed while the folder was uploaded")
    doc = p.manifest(top + 1, files, digests, newest)
    body = json.dumps(doc, indent=1, sort_keys=True).encode()
    p.store.put(_key(p.prefix, f"{VERSIONS}{top + 1:08d}.json"), body, p.deadline)
    mark_synced(p.root, p.store.bucket, p.node, files)
    took = _since(p.started)
    total = sum(f.size for f in files.values())
    detail = (
        f"version {top + 1} (step {doc['step']}): {len(files)} file(s), {total / 1e6:.1f} MB; "
        f"{sent} object(s) sent ({sent_bytes / 1e6:.1f} MB) in {took:.1f} s{skipped}"
    )
    if doc["regressed"]:
        detail += f"; REGRESSED: {doc['note']}"
    return SyncOutcome(
        True,
        detail,
        uploaded=sent,
        newest_step=doc["step"],
        seconds=took,
        version=top + 1,
        pushed=True,
        regressed=bool(doc["regressed"]),
        note=str(doc["note"]),
        bytes_sent=sent_bytes,
    )


# ---------------------------------------------------------------------------- restore


@dataclass
class RestoreOutcome:
    ok: bool
    detail: str
    cause: str = ""
    version: int | None = None
    step: int | None = None
    files: int = 0  # files the attempt starts from: the version's, else the local folder's
    fetched: int = 0
    kept: int = 0
    bytes: int = 0  # fetched
    seconds: float = 0.0
    aside: str = ""  # where local files that differed were moved

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "cause": self.cause,
            "version": self.version,
            "step": self.step,
            "files": self.files,
            "fetched": self.fetched,
            "kept": self.kept,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "aside": self.aside,
        }


def restore(
    root: Path,
    store: bucket.BucketStore,
    prefix: str,
    deadline_s: float = 6 * 3600.0,
    node: str = "",
    version: int | None = None,
) -> RestoreOutcome:
    """The newest version that did not regress into ``root``, all of it or nothing (see the
    module's docstring). Nodes sharing the folder take turns (a flock); a later one finds
    the digests matching. ``node``: mark the files in this node's watchdog record.
    ``version``: exactly that version instead (a multi-node run's other nodes restore the
    one the head restored: job_group.py); one not in the bucket fails as ``missing``."""
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        ws = workspace(root)
        with flock(ws / "restore.lock", deadline_s, "another restore of this folder"):
            out = _restore_locked(root, store, prefix, ws, started + deadline_s, node, version)
    except (bucket.StoreError, OSError, ET.ParseError) as exc:
        cause = cause_of(exc)
        if isinstance(exc, OSError) and exc.errno in (28, 122):  # ENOSPC, EDQUOT
            cause = "disk"
        return RestoreOutcome(False, str(exc), cause, seconds=_since(started))
    out.seconds = _since(started)
    return out


def sweep(folder: Path, older_than_s: float) -> int:
    """Part files of killed transfers under ``folder`` (bucket.sweep_parts)."""
    sweep_parts = getattr(bucket, "sweep_parts", None)
    if sweep_parts is None or not folder.is_dir():
        return 0
    with contextlib.suppress(OSError):
        return int(sweep_parts(folder, older_than_s))
    return 0


def _restore_locked(
    root: Path,
    store: bucket.BucketStore,
    prefix: str,
    ws: Path,
    deadline: float,
    node: str,
    version: int | None = None,
) -> RestoreOutcome:
    staging = ws / "staging"
    sweep(staging, 6 * 3600.0)  # a part file younger than that is continued instead
    sweep(root, 3600.0)
    if version is not None:
        good = read_version(store, prefix, version, deadline)
        if good is None:
            why = f"version {version} is not a readable checkpoint version in the bucket"
            return RestoreOutcome(False, why, "missing")
    else:
        newest, good, _ = newest_versions(store, prefix, deadline)
    if good is None:
        n = len(local_listing(root))
        why = "no checkpoint version in the bucket"
        if newest is not None:
            why = f"every version in the bucket regressed (newest: {newest.seq})"
        return RestoreOutcome(True, f"{why}: the local folder is reused ({n} file(s))", files=n)
    cache = DigestCache.load(ws / "digests.json")
    local = local_files(root)
    kept, fetch = [], []
    for rel, (size, sha) in sorted(good.files.items()):
        f = local.get(rel)
        # The local copy only once its own bytes match (never the cache: bit rot keeps mtime).
        if f is not None and f.size == size and sha256_file(root / rel) == sha:
            kept.append(rel)
            cache.remember(rel, f, sha)
        else:
            fetch.append(rel)
    for rel in fetch:
        size, sha = good.files[rel]
        dest = staging / rel
        if dest.is_file() and dest.stat().st_size == size and sha256_file(dest) == sha:
            continue  # staged whole by a try that failed later
        store.download_file(_key(prefix, OBJECTS + sha), dest, size, deadline, sha256=sha)
    aside = _place(root, staging, fetch, ws, good, cache)
    cache.save(local_files(root))
    shutil.rmtree(staging, ignore_errors=True)
    if node:
        placed = local_files(root)
        mark_synced(root, store.bucket, node, {r: placed[r] for r in good.files if r in placed})
    fetched_bytes = sum(good.files[r][0] for r in fetch)
    detail = (
        f"restored version {good.seq} (step {good.step}): {len(fetch)} file(s) fetched "
        f"({fetched_bytes / 1e6:.1f} MB), {len(kept)} kept"
    )
    if aside:
        detail += f"; local files that differed moved to {aside}"
    return RestoreOutcome(
        True,
        detail,
        version=good.seq,
        step=good.step,
        files=len(good.files),
        fetched=len(fetch),
        kept=len(kept),
        bytes=fetched_bytes,
        aside=aside,
    )


def _place(
    root: Path, staging: Path, fetch: list[str], ws: Path, good: Version, cache: DigestCache
) -> str:
    """Every verified staged file takes its name; whatever stood in its way (a differing
    file, a folder or file where a folder must be) is moved aside first, never deleted."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")  # noqa: UP017
    aside = ws / "aside" / f"{stamp}-v{good.seq}"
    used = False
    for rel in fetch:
        target = root / rel
        parts = rel.split("/")
        for i in range(1, len(parts)):
            up = root.joinpath(*parts[:i])
            if up.is_symlink() or (up.exists() and not up.is_dir()):
                _move(up, aside / "/".join(parts[:i]))
                used = True
        if target.is_symlink() or target.exists():
            _move(target, aside / rel)
            used = True
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)
        st = target.stat()
        cache.remember(rel, LocalFile(st.st_size, st.st_mtime_ns), good.files[rel][1])
    return str(aside) if used else ""


def _move(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dest)
    except OSError:
        shutil.move(str(src), str(dest))  # another disk: copied, then removed


def newest_restorable(
    store: bucket.BucketStore, prefix: str, deadline_s: float = 120.0
) -> dict[str, Any] | None:
    """The version a restore would take ({seq, step, files, bytes}), None when none."""
    _, good, _ = newest_versions(store, prefix, time.monotonic() + deadline_s)
    return good.summary() if good else None


LIST_ERRORS = (OSError, bucket.StoreError, ET.ParseError)
