"""Checkpoints between a job's GPUFLEET_CHECKPOINT_DIR and the stack's bucket (node side).

Standard library only; shipped by ``fab train`` next to ``job_runner.py`` and run on the node
with its system Python (3.10+). Requests are signed with the watchdog's own SigV4 signer
(``watchdog.py`` is shipped alongside), so the node needs neither an SDK nor the aws CLI.

The checkpoint contract (README "fab train"): a checkpoint is a folder ``step-<N>`` (N an
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
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bootstrap.remote import watchdog
else:
    try:  # on the node: shipped next to this file
        import watchdog
    except ImportError:  # imported from a checkout (tests)
        from bootstrap.remote import watchdog

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# Keys go into the URL unencoded (the signer quotes the path once): keep them to characters
# that need no quoting, and say which files were left out otherwise.
_SAFE_KEY = re.compile(r"^[A-Za-z0-9._~/=+-]+$")


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


def local_listing(root: Path) -> dict[str, int]:
    """Every regular file under ``root`` as {relative path: size}; temp folders left out."""
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        # A checkpoint being written (example: ".tmp-step-12") is never uploaded.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if name.startswith(".") or not path.is_file():
                continue
            try:
                out[path.relative_to(root).as_posix()] = path.stat().st_size
            except OSError:
                continue  # removed while we looked
    return out


def upload_plan(local: Mapping[str, int], remote: Mapping[str, int]) -> list[str]:
    """Files to upload, data before markers: what the bucket lacks or holds at another size."""
    todo = [p for p, size in local.items() if remote.get(p) != size]
    # Markers last (sorted after everything else), so a cut-off upload leaves no marker.
    return sorted(todo, key=lambda p: (p.rsplit("/", 1)[-1] == MARKER, p))


# ---------------------------------------------------------------------------- stores


class Store(Protocol):
    def list(self, prefix: str) -> dict[str, int]: ...
    def get(self, key: str, dest: Path) -> None: ...
    def put(self, source: Path, key: str) -> None: ...


Credentials = Callable[[], "dict[str, str] | None"]


def env_credentials() -> dict[str, str] | None:
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID"):
        return {
            "access_key_id": env["AWS_ACCESS_KEY_ID"],
            "secret": env.get("AWS_SECRET_ACCESS_KEY", ""),
            "token": env.get("AWS_SESSION_TOKEN", ""),
        }
    return None


@dataclass
class S3Store:
    """The few S3 calls a checkpoint needs, over HTTPS with SigV4 (no SDK on the node).

    Objects are sent with a single PUT each (S3's limit: 5 GB per object), read into memory.
    """

    bucket: str
    region: str
    credentials: Credentials
    endpoint: str = ""  # path-style override, e.g. http://127.0.0.1:5000 (tests, MinIO)
    timeout: float = 120.0

    def _url(self, key: str, query: str = "") -> str:
        if self.endpoint:
            base = f"{self.endpoint.rstrip('/')}/{self.bucket}"
        else:
            base = f"https://{self.bucket}.s3.{self.region}.amazonaws.com"
        return f"{base}/{key}" + (f"?{query}" if query else "")

    def _call(self, method: str, url: str, body: bytes = b"") -> bytes:
        creds = self.credentials()
        if not creds:
            raise RuntimeError("no credentials for the bucket (instance role or environment)")
        headers = watchdog.sigv4_headers(
            method=method,
            url=url,
            body=body,
            region=self.region,
            service="s3",
            access_key_id=creds["access_key_id"],
            secret=creds["secret"],
            token=creds.get("token", ""),
            content_type="",
        )
        request = urllib.request.Request(
            url, data=body if method == "PUT" else None, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            data: bytes = resp.read()
            return data

    def list(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        token = ""
        for _ in range(10_000):  # bounded: 10 M objects
            params = {"list-type": "2", "prefix": prefix}
            if token:
                params["continuation-token"] = token
            query = urllib.parse.urlencode(sorted(params.items()), quote_via=urllib.parse.quote)
            root = ET.fromstring(self._call("GET", self._url("", query)))
            ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            for item in root.iter(f"{ns}Contents"):
                key = item.findtext(f"{ns}Key") or ""
                out[key] = int(item.findtext(f"{ns}Size") or 0)
            token = root.findtext(f"{ns}NextContinuationToken") or ""
            if (root.findtext(f"{ns}IsTruncated") or "false") != "true" or not token:
                break
        return out

    def get(self, key: str, dest: Path) -> None:
        data = self._call("GET", self._url(key))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        tmp.write_bytes(data)
        tmp.replace(dest)

    def put(self, source: Path, key: str) -> None:
        self._call("PUT", self._url(key), source.read_bytes())


@dataclass
class OssutilStore:
    """Alicloud OSS through the node's ``ossutil`` (the tool the watchdog also uses)."""

    bucket: str
    tool: str

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [self.tool, *args], capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"ossutil {args[0]}: {done.stderr.strip()[:300]}")
        return done.stdout

    def list(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        url = f"oss://{self.bucket}/"
        for line in self._run("ls", "-s", "--all-versions=false", url + prefix).splitlines():
            # "LastModifiedTime  Size(B)  StorageClass  ETAG  ObjectName" rows
            parts = line.split()
            if len(parts) >= 5 and parts[-1].startswith(url) and parts[-5].isdigit():
                out[parts[-1][len(url) :]] = int(parts[-5])
        return out

    def get(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._run("cp", "-f", f"oss://{self.bucket}/{key}", str(dest))

    def put(self, source: Path, key: str) -> None:
        self._run("cp", "-f", str(source), f"oss://{self.bucket}/{key}")


def make_store(
    provider: str, bucket: str, region: str, endpoint: str = "", metadata_url: str = ""
) -> Store | None:
    """The store for the stack's bucket, or None when checkpoints stay on the node."""
    if not bucket:
        return None
    if provider == "alicloud":
        tool = shutil.which("ossutil") or shutil.which("ossutil64")
        if not tool:
            raise RuntimeError("no ossutil on this node: cannot reach the OSS bucket")
        return OssutilStore(bucket, tool)
    role = watchdog.Metadata("aws", metadata_url) if metadata_url or not endpoint else None

    def creds() -> dict[str, str] | None:
        # Environment first; the instance role only on a real node (never for a test endpoint
        # without an explicit metadata URL).
        return env_credentials() or (role.role_credentials() if role else None)

    return S3Store(bucket, region or "us-east-1", creds, endpoint)


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


def push(root: Path, store: Store, prefix: str, deadline_s: float = 600.0) -> SyncOutcome:
    """Upload what the bucket lacks under ``prefix``; markers last; bounded in time."""
    started = time.monotonic()
    local = local_listing(root)
    newest = newest_complete(local, lambda f: _read_text(root / f / MARKER))
    try:
        remote_full = store.list(prefix.rstrip("/") + "/" if prefix else "")
    except (OSError, urllib.error.URLError, RuntimeError, ET.ParseError) as exc:
        return SyncOutcome(False, f"cannot list the bucket: {exc}")
    strip = len(prefix.rstrip("/")) + 1 if prefix else 0
    remote = {k[strip:]: v for k, v in remote_full.items()}
    todo = upload_plan(local, remote)
    skipped = [p for p in todo if not _SAFE_KEY.match(p)]
    done = 0
    for rel in todo:
        if rel in skipped:
            continue
        if time.monotonic() - started > deadline_s:
            return SyncOutcome(
                False, f"sync budget of {deadline_s:.0f} s spent after {done} file(s)", done
            )
        try:
            store.put(root / rel, _key(prefix, rel))
        except FileNotFoundError:
            continue  # pruned by the job meanwhile
        except (OSError, urllib.error.URLError, RuntimeError) as exc:
            return SyncOutcome(False, f"upload of {rel} failed: {exc}", done)
        done += 1
    note = f"; {len(skipped)} file(s) with unsafe names left out" if skipped else ""
    step = newest.step if newest else None
    return SyncOutcome(
        True,
        f"{done} file(s) uploaded, newest complete step {step if step is not None else '-'}{note}",
        done,
        step,
        time.monotonic() - started,
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def restore(root: Path, store: Store, prefix: str) -> SyncOutcome:
    """Put the newest complete checkpoint in the bucket under ``root`` (nothing else)."""
    started = time.monotonic()
    try:
        full = store.list(prefix.rstrip("/") + "/" if prefix else "")
    except (OSError, urllib.error.URLError, RuntimeError, ET.ParseError) as exc:
        return SyncOutcome(False, f"cannot list the bucket: {exc}")
    strip = len(prefix.rstrip("/")) + 1 if prefix else 0
    listing = {k[strip:]: v for k, v in full.items()}
    local = local_listing(root)
    local_best = newest_complete(local, lambda f: _read_text(root / f / MARKER))

    def marker(folder: str) -> str | None:
        tmp = root / f".marker-{folder}"
        try:
            store.get(_key(prefix, f"{folder}/{MARKER}"), tmp)
            return tmp.read_text()
        except (OSError, urllib.error.URLError, RuntimeError):
            return None
        finally:
            tmp.unlink(missing_ok=True)

    best = newest_complete(listing, marker)
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
    except (OSError, urllib.error.URLError, RuntimeError) as exc:
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
