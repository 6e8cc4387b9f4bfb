"""The cloud half of the idle guard, as plain data: the function's name, environment and
package. The provider modules declare the resources from these; what belongs to one cloud
(its handler name and schedule: infra/clouds/<name>/entry.py; a dashboard) is in its folder.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

import pulumi

from infra.components.args import GuardArgs
from infra.config import ConfigError

# Where the function zips a cloud's SDK wants as a local file are written (git-ignored).
BUILD_DIR = Path(__file__).resolve().parents[1] / ".gpufleet-build"


def function_name(stack: str) -> str:
    return f"gpufleet-{stack}-reaper"[:64]


def function_env(args: GuardArgs) -> dict[str, str]:
    """What the scheduled reaper reads (infra/reaper/handler.py)."""
    return {
        "GPUFLEET_PROVIDER": args.provider,
        "GPUFLEET_STACK": args.stack,
        "GPUFLEET_REGION": args.region,
        "GPUFLEET_APPLY": "true",
        "GPUFLEET_RESTART_RECLAIMED": "true" if args.restart_reclaimed else "false",
        "GPUFLEET_NODES": ",".join(args.nodes),
    }


# Built zips, by the digest of their inputs (handler.function_zip_inputs): a plan reuses the
# zip the last plan built instead of unpacking the wheels and compressing ~11 MB again.
ZIP_CACHE = BUILD_DIR / "zip-cache"


@functools.lru_cache(maxsize=4)
def function_zip(provider: str) -> bytes:
    """The reaper as a deterministic zip (same bytes for the same sources): its code, the
    catalog's per-instance-type table, and the SDKs a cloud's runtime lacks (its reaper.py
    says which, and whether from wheels built for that runtime). Built once per content
    digest of its inputs and kept under ZIP_CACHE (vendored SDKs make a zip ~11 MB; building
    it was most of such a plan's time), and once per process. A missing or wrong wheelhouse is bad
    setup, reported as a ConfigError (one line each, naming `make fc-wheels`), before any
    resource exists."""
    from infra.reaper.handler import build_function_zip, function_zip_inputs

    try:
        key = function_zip_inputs(provider)[:16]
        cached = ZIP_CACHE / f"{provider}-inputs-{key}.zip"
        if cached.is_file():
            return cached.read_bytes()
        data = build_function_zip(provider=provider)
    except Exception as exc:
        # The wheelhouse checker (it imports packaging, ~0.1 s) is imported only by a build
        # from wheels (a reaper.py's WHEELS): its error can only come once it is loaded.
        wheelhouse = sys.modules.get("infra.reaper.wheelhouse")
        if wheelhouse is not None and isinstance(exc, wheelhouse.WheelhouseError):
            raise ConfigError(exc.problems) from None
        raise
    _keep(cached, data, re.compile(rf"{re.escape(provider)}-inputs-[0-9a-f]{{16}}\.(zip|tmp)"))
    return data


def _keep(path: Path, data: bytes, own: re.Pattern[str]) -> None:
    """Write `data` to `path` through a .tmp beside it, then remove the older files of the
    same pattern in that folder (one cached zip per provider). A folder that cannot be
    written only costs the next plan a rebuild."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        for old in path.parent.iterdir():
            if own.fullmatch(old.name) and old.name != path.name and old.is_file():
                old.unlink(missing_ok=True)
    except OSError:
        pass


def function_zip_file(provider: str, build_dir: Path | None = None) -> Path:
    """The reaper zip as a file, for the clouds whose SDK takes a path: named
    `<provider>-reaper-<digest>.zip` by its content, written once (through a .tmp beside it).
    Each build leaves one zip per function: the older ones of the same provider, and .tmp
    files a crash left, are removed; only names of that pattern, nothing else in the folder."""
    data = function_zip(provider)
    folder = BUILD_DIR if build_dir is None else build_dir
    path = folder / f"{provider}-reaper-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.is_file() or path.read_bytes() != data:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    for old in stale_function_zips(folder, provider, keep=path.name):
        old.unlink(missing_ok=True)
    return path


def stale_function_zips(folder: Path, provider: str, keep: str) -> list[Path]:
    """The files function_zip_file wrote for `provider` in `folder`, other than `keep`."""
    own = re.compile(rf"{re.escape(provider)}-reaper-[0-9a-f]{{16}}\.(zip|tmp)")
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if own.fullmatch(p.name) and p.name != keep and p.is_file() and not p.is_symlink()
    )


def function_archive(provider: str) -> pulumi.AssetArchive:
    """The same files as a Pulumi archive: inline, so the program writes nothing to disk;
    for a cloud whose runtime has its SDK (nothing vendored: the archive is all text)."""
    with zipfile.ZipFile(io.BytesIO(function_zip(provider))) as zf:
        return pulumi.AssetArchive(
            {n: pulumi.StringAsset(zf.read(n).decode()) for n in sorted(zf.namelist())}
        )
