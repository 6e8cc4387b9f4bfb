"""Checkpoints between a job's GPUFLEET_CHECKPOINT_DIR and the stack's bucket (node side).

Standard library only; shipped by ``fab train`` next to ``job_runner.py`` with the watchdog's
files, and run on the node with its system Python (3.10+). Uploads ARE the watchdog's scratch
sync (``bucket.sync_scratch``: the job's checkpoint folder is under
``<scratch>/checkpoints``, which the watchdog saves to ``checkpoints/<node>/``), so a job's
periodic upload, the watchdog's pre-stop and spot-notice saves and ``fab cancel`` share one
code path and one record of what is in the bucket. This file adds what a resume needs: which
checkpoint is complete, and fetching it back (through the watchdog's own store for the
node cloud's ``bucket_store``: S3 and S3-compatible, or Azure Blob).

The checkpoint contract (docs/train.md): a checkpoint is a folder ``step-<N>`` (N an
integer, zero-padded or not) under GPUFLEET_CHECKPOINT_DIR that holds a ``COMPLETE`` file,
written last, whose JSON lists the folder's files and their sizes::

    {"step": 120, "files": {"model.pt": 48213}}

A folder without a COMPLETE file, or whose listed files are missing or have other sizes (a
copy cut off half way, locally or in the bucket), is never picked for a resume. Uploads send
every data file of a folder before its COMPLETE file, so a bucket copy is complete exactly
when its marker is there and agrees with the sizes listed next to it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bootstrap.remote import bucket, clouds
else:
    # On the node these files sit side by side; from a checkout the same folder goes on the
    # path, as the watchdog's own tests do (its files import each other the same way).
    _HERE = str(Path(__file__).resolve().parent)
    if _HERE not in sys.path:
        sys.path.append(_HERE)
    import bucket
    import clouds

MARKER = bucket.CHECKPOINT_MARKER
# Written next to the job's files in the bucket after an upload that left nothing behind:
# every file of the checkpoint folder and its size, whatever the job's layout (a plain
# torch.save "snapshot.pt" included). A resume with no step-<N> checkpoint restores it.
FOLDER_MANIFEST = ".gpufleet-folder.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ---------------------------------------------------------------------------- pure rules


@dataclass(frozen=True)
class Checkpoint:
    step: int
    folder: str  # "step-00000120"
    files: Mapping[str, int]  # name inside the folder -> size, from the marker


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
    if any(v < 0 or k.startswith("/") or ".." in k.split("/") for k, v in out.items()):
        return None
    return out


def newest_complete(
    listing: Mapping[str, int], read_marker: Callable[[str], str | None]
) -> Checkpoint | None:
    """The highest-step checkpoint folder whose marker agrees with ``listing``.

    ``listing`` maps paths relative to the checkpoint root ("step-12/model.pt") to sizes;
    ``read_marker(folder)`` returns the text of that folder's COMPLETE file.
    """
    folders: dict[str, int] = {}
    for path in listing:
        head, _, rest = path.partition("/")
        m = _STEP_DIR.match(head)
        if m and rest == MARKER:
            folders[head] = int(m.group(1))
    for folder in sorted(folders, key=lambda f: folders[f], reverse=True):
        text = read_marker(folder)
        files = parse_marker(text) if text is not None else None
        if files is None:
            continue
        if all(listing.get(f"{folder}/{name}") == size for name, size in files.items()):
            return Checkpoint(step=folders[folder], folder=folder, files=files)
    return None


def own_temp_file(name: str) -> bool:
    """A file gpufleet itself writes and removes beside the job's (a marker read back, a
    download in progress, the folder manifest's copy): never part of the job's folder."""
    return name.startswith((".marker-", ".gpufleet-")) or (
        name.startswith(".") and name.endswith(".part")
    )


def local_listing(root: Path) -> dict[str, int]:
    """Every regular file under ``root`` as {relative path: size}; hidden folders (a
    checkpoint being written, such as ".tmp-step-12", or a restore in progress) and
    gpufleet's own temp files left out. Other hidden files are the job's and are listed:
    torch.distributed.checkpoint keeps its index in ".metadata", without which the folder
    cannot be loaded."""
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if own_temp_file(name) or not path.is_file():
                continue
            try:
                out[path.relative_to(root).as_posix()] = path.stat().st_size
            except OSError:
                continue  # removed while we looked
    return out


# ---------------------------------------------------------------------------- stores


class Store(Protocol):
    def list(self, prefix: str) -> dict[str, int]: ...
    def get(self, key: str, dest: Path) -> None: ...


@dataclass
class BucketReader:
    """Listing and reading on top of the watchdog's store for the bucket (S3 and the
    S3-compatible stores, or Azure Blob: same signer, endpoints, retries and credentials as
    its uploads)."""

    store: bucket.BucketStore

    def list(self, prefix: str) -> dict[str, int]:
        return self.store.list_objects(prefix)

    def get(self, key: str, dest: Path) -> None:
        _, _, data = self.store.request("GET", key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        tmp.write_bytes(data)
        tmp.replace(dest)


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


# ---------------------------------------------------------------------------- push / restore


@dataclass
class SyncOutcome:
    ok: bool
    detail: str
    uploaded: int = 0
    newest_step: int | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "uploaded": self.uploaded,
            "newest_step": self.newest_step,
            "seconds": round(self.seconds, 3),
        }


def _key(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}" if prefix else rel


def push(
    checkpoint_dir: Path,
    store: bucket.BucketStore | None,
    node: str,
    deadline_s: float = 600.0,
    prefix: str = "",
) -> SyncOutcome:
    """Upload what is new under ``<scratch>/checkpoints`` with the watchdog's own sync, as the
    head node ``node`` (keys ``checkpoints/<node>/<job>/...``); once nothing is left to
    upload, the folder's manifest goes to ``prefix`` (the job's keys)."""
    scratch = checkpoint_dir.parent.parent
    newest = newest_complete(
        local_listing(checkpoint_dir), lambda f: _read_text(checkpoint_dir / f / MARKER)
    )
    out = bucket.sync_scratch(
        scratch=scratch,
        sync_dirs=(checkpoint_dir.parent.name,),
        node=node,
        store=store,
        timeout_s=deadline_s,
    )
    step = newest.step if newest else None
    if out.ok and store is not None and prefix:
        files = local_listing(checkpoint_dir)
        if files:
            body = json.dumps({"files": files}, sort_keys=True).encode()
            try:
                store.put(_key(prefix, FOLDER_MANIFEST), body, time.monotonic() + 60)
            except (OSError, bucket.StoreError) as exc:
                return SyncOutcome(False, f"{out.detail}; folder manifest not written: {exc}")
    return SyncOutcome(out.ok, out.detail, out.uploaded, step, out.seconds)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


LIST_ERRORS = (OSError, bucket.StoreError, ET.ParseError)


def newest_in_bucket(root: Path, store: Store, prefix: str) -> Checkpoint | None:
    """The newest complete checkpoint under ``prefix`` in the bucket (its markers are read
    through hidden files in ``root``); raises LIST_ERRORS when the bucket cannot be listed."""
    full = store.list(prefix.rstrip("/") + "/" if prefix else "")
    strip = len(prefix.rstrip("/")) + 1 if prefix else 0
    listing = {k[strip:]: v for k, v in full.items()}

    def marker(folder: str) -> str | None:
        tmp = root / f".marker-{folder}"
        try:
            store.get(_key(prefix, f"{folder}/{MARKER}"), tmp)
            return tmp.read_text()
        except (OSError, bucket.StoreError):
            return None
        finally:
            tmp.unlink(missing_ok=True)

    return newest_complete(listing, marker)


def folder_in_bucket(root: Path, store: Store, prefix: str) -> dict[str, int] | None:
    """The job's folder as its manifest lists it, when every file listed is in the bucket
    with that size; None otherwise. Raises LIST_ERRORS when the bucket cannot be listed."""
    listing = store.list(prefix.rstrip("/") + "/" if prefix else "")
    key = _key(prefix, FOLDER_MANIFEST)
    if key not in listing:
        return None
    tmp = root / ".gpufleet-folder.part"
    try:
        store.get(key, tmp)
        files = {str(k): int(v) for k, v in json.loads(tmp.read_text())["files"].items()}
    except (OSError, bucket.StoreError, ValueError, KeyError, TypeError, AttributeError):
        return None
    finally:
        tmp.unlink(missing_ok=True)
    if any(k.startswith("/") or ".." in k.split("/") for k in files):
        return None
    ok = all(listing.get(_key(prefix, rel)) == size for rel, size in files.items())
    return files if ok and files else None


def restore_folder(root: Path, store: Store, prefix: str, files: Mapping[str, int]) -> None:
    """Fetch ``files`` into a hidden folder, then move them under ``root``: a cut-off
    restore leaves no half folder that looks like the job's."""
    tmp = root / ".restore-folder"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel in sorted(files):
            store.get(_key(prefix, rel), tmp / rel)
        for rel in sorted(files):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).replace(root / rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _restore_folder(root: Path, store: Store, prefix: str, started: float) -> SyncOutcome:
    """No step-<N> checkpoint in the bucket: the whole folder, if the node has none of it."""
    local = local_listing(root)
    try:
        files = folder_in_bucket(root, store, prefix)
    except LIST_ERRORS as exc:
        return SyncOutcome(False, f"cannot list the bucket: {exc}")
    if files is None or local:
        where = f"{len(local)} local file(s) kept" if local else "local: none"
        return SyncOutcome(
            True,
            f"no complete checkpoint in the bucket ({where})",
            seconds=time.monotonic() - started,
        )
    try:
        restore_folder(root, store, prefix, files)
    except (OSError, bucket.StoreError) as exc:
        return SyncOutcome(False, f"restore of the job's folder failed: {exc}")
    return SyncOutcome(
        True,
        f"restored the job's folder from the bucket ({len(files)} file(s))",
        uploaded=len(files),
        seconds=time.monotonic() - started,
    )


def restore(root: Path, store: Store, prefix: str) -> SyncOutcome:
    """Put the newest complete checkpoint in the bucket under ``root``; without one, the
    job's whole folder as its manifest lists it (when the node has none of it)."""
    started = time.monotonic()
    try:
        best = newest_in_bucket(root, store, prefix)
    except LIST_ERRORS as exc:
        return SyncOutcome(False, f"cannot list the bucket: {exc}")
    local_best = newest_complete(local_listing(root), lambda f: _read_text(root / f / MARKER))
    if best is None and local_best is None:
        return _restore_folder(root, store, prefix, started)
    if best is None:
        where = "local " + local_best.folder if local_best else "none"
        return SyncOutcome(
            True,
            f"no complete checkpoint in the bucket (local: {where})",
            newest_step=local_best.step if local_best else None,
            seconds=time.monotonic() - started,
        )
    if local_best is not None and local_best.step >= best.step:
        return SyncOutcome(
            True,
            f"kept local {local_best.folder} (the bucket's newest is {best.folder})",
            newest_step=local_best.step,
            seconds=time.monotonic() - started,
        )
    # Fetch into a hidden folder, then rename: a cut-off restore never looks complete.
    tmp = root / f".restore-{best.folder}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    names = sorted(best.files, key=lambda n: n == MARKER)
    try:
        for name in [*names, MARKER] if MARKER not in names else names:
            store.get(_key(prefix, f"{best.folder}/{name}"), tmp / name)
    except (OSError, bucket.StoreError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return SyncOutcome(False, f"restore of {best.folder} failed: {exc}")
    final = root / best.folder
    if final.exists():
        # An incomplete local copy of the same step: keep it aside, never delete it.
        final.rename(root / f".incomplete-{best.folder}-{int(time.time())}")
    tmp.rename(final)
    return SyncOutcome(
        True,
        f"restored {best.folder} from the bucket",
        uploaded=len(names),
        newest_step=best.step,
        seconds=time.monotonic() - started,
    )
