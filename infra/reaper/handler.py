"""The reaper as a cloud function: the run every entry point calls, the registry of the
clouds' reaper modules and the function's package.

Each cloud's entry point lives in its folder (infra/clouds/<name>/entry.py, the platform's
function signature and its handler name, schedule and region variable) and is shipped at
the top of that cloud's package as ``handler.py`` (:data:`ENTRY_MODULE`). Every entry reads
its settings from the environment variables that the stack sets (:func:`platform_env`) and
calls :func:`run`:

  GPUFLEET_PROVIDER   the cloud whose reaper module makes the client (default: the
                      entry's own cloud)
  GPUFLEET_STACK      only this stack's instances (required: a function never reaps others)
  GPUFLEET_REGION     region to scan (default: the region the platform names, each entry
                      its own variable)
  GPUFLEET_APPLY      "true" to stop; anything else is a dry run that only logs
  GPUFLEET_RESTART_RECLAIMED    "false" to leave reclaimed spot nodes stopped; anything
                                else (the default) starts them again (recovery.py)
  GPUFLEET_NODES                the stack's node ids, comma separated: one the scan no
                                longer finds is reported as lost
  GPUFLEET_MAX_ATTEMPTS         attempts per API call, the first included: 1 = no retry
                                (each cloud's reaper.py says its default)
  GPUFLEET_ENDPOINT_URL         an alternative API endpoint (tests); the function logs a
                                warning line whenever it is set. scripts/teardown.py never
                                reads it (its --endpoint-url flag is the only way there).

A cloud's own settings (its account, identity or retry mode) are read by its reaper.py's
``from_env``, which documents them.

A failed stop, a metrics read that failed, or an instance that could not be judged makes
the invocation fail after logging, so the platform's error metric and any alarm on it see
it. A bad tag value does not: that instance is kept and reported.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core import Cloud, ConfigError, Invocation, Report, reap
from .recovery import expected_nodes

PACKAGE = "gpufleet_reaper"  # the package name inside the function archive
# The cloud's entry point at the top of its archive: ``<ENTRY_MODULE>.py``, from its folder's
# ENTRY_PART.py (so a platform's handler setting reads "handler.<function>").
ENTRY_MODULE = "handler"
ENTRY_PART = "entry"


def platform_env(region_env: str = "") -> dict[str, str]:
    """The function's environment, GPUFLEET_REGION filled (when unset) from ``region_env``,
    the variable in which the entry's platform names the function's own region."""
    env = dict(os.environ)
    if not env.get("GPUFLEET_REGION") and region_env and env.get(region_env):
        env["GPUFLEET_REGION"] = env[region_env]
    return env


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


# A cloud module's ``from_env``: its client, configured from the function's environment and
# what this invocation was handed.
FromEnv = Callable[[str, Mapping[str, str], Invocation], Cloud]
Entries = list[tuple[str, bytes]]

# This package's own files in the function (the cloud-neutral reaper: handler.py's imports,
# transitively). A new module here is not shipped until it is listed: the clean-interpreter
# test catches a miss. Each cloud's reaper.py travels beside them as ``<cloud>.py``.
NEUTRAL_MODULES = (
    "__init__.py",
    "catalog_data.py",
    "core.py",
    "handler.py",
    "recovery.py",
    "tags.py",
)
# What the reaper shares with the nodes, packed from the node package under its own import
# path (``gpufleet_node/`` beside this package in the function): the idle rules, the tag and
# metric names, and the node's own bucket client (Tencent's heartbeat objects).
NODE_PACKAGE = "gpufleet_node"
NODE_MODULES = ("__init__.py", "bucket.py", "fleet_names.py", "idle_rules.py")


def node_module_files() -> list[tuple[str, bytes]]:
    """(path in the function zip, bytes) of :data:`NODE_MODULES`, from the node package."""
    import gpufleet_node

    here = Path(gpufleet_node.__file__).resolve().parent
    return [(f"{NODE_PACKAGE}/{n}", (here / n).read_bytes()) for n in NODE_MODULES]


def _in_function() -> bool:
    """True inside the function archive (this package is ``gpufleet_reaper``, each cloud a
    module beside this one); False in the repository (each cloud's folder under
    infra/clouds/)."""
    return __package__ == PACKAGE


def _cloud_names() -> tuple[str, ...]:
    """The clouds with a reaper: in the repository the folders under infra/clouds/ that
    have a reaper.py; in the function the modules the archive carries beside this one."""
    if not _in_function():
        from infra import clouds

        return clouds.names("reaper.py")
    here = Path(__file__).resolve().parent
    return tuple(sorted(p.stem for p in here.glob("*.py") if p.name not in NEUTRAL_MODULES))


@dataclass(frozen=True)
class CloudEntry:
    """How the reaper reaches one cloud: its reaper module, whose ``from_env`` makes the
    client (the module, and so its SDK, imported only then). What the function zip carries
    for it is the module's own declaration: VENDOR_SDK (the platform's runtime lacks the
    SDK), SDKS (the distributions vendored, with their dependency closure) and WHEELS (that
    closure from wheels built for the runtime, infra/reaper/wheelhouse.py, or from this
    venv's pure-Python files); a cloud folder with a package.py lays the zip out itself."""

    name: str

    @property
    def module(self) -> str:
        """The cloud's reaper module: infra/clouds/<name>/reaper.py in the repository,
        ``<name>.py`` beside this one in the function."""
        if _in_function():
            return f"{PACKAGE}.{self.name}"
        return f"infra.clouds.{self.name}.reaper"

    def _declared(self) -> Any:
        return importlib.import_module(self.module)

    @property
    def vendor_sdk(self) -> bool:
        return bool(self._declared().VENDOR_SDK)

    @property
    def sdks(self) -> tuple[str, ...]:
        return tuple(self._declared().SDKS)

    @property
    def wheels(self) -> bool:
        return bool(self._declared().WHEELS)

    @property
    def source(self) -> Path:
        """The reaper module's file, shipped as ``<name>.py``."""
        return Path(str(self._declared().__file__))

    @property
    def entry(self) -> Path:
        """The cloud's function entry point (its folder's ``entry.py``), shipped at the top
        of its archive as ``handler.py``; FileNotFoundError when the folder has none."""
        from infra import clouds

        if self.name not in clouds.names(f"{ENTRY_PART}.py"):
            raise FileNotFoundError(f"cloud {self.name!r} has no {ENTRY_PART}.py: no function")
        return clouds.folders()[self.name] / f"{ENTRY_PART}.py"

    @property
    def layout(self) -> Callable[[Entries], Entries] | None:
        """The cloud's own zip layout (its folder's package.py ``entries``), given the same
        dependency walk as every vendored zip (:func:`sdk_closure`); None: the common one."""
        if _in_function():
            return None
        from infra import clouds

        if self.name not in clouds.names("package.py"):
            return None
        entries = clouds.module(self.name, "package").entries

        def lay_out(common: Entries) -> Entries:
            laid: Entries = entries(common, sdk_closure)
            return laid

        return lay_out

    def from_env(self) -> FromEnv:
        """The module's constructor, importing it (and so its SDK, lazily) only now."""
        make: FromEnv = self._declared().from_env
        return make


class _Found(Mapping[str, CloudEntry]):
    """The reaper's clouds, found on each use (never listed by hand): one entry per cloud
    with a reaper module."""

    def __getitem__(self, name: str) -> CloudEntry:
        if name not in _cloud_names():
            raise KeyError(name)
        return CloudEntry(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_cloud_names())

    def __len__(self) -> int:
        return len(_cloud_names())


CLOUDS: Mapping[str, CloudEntry] = _Found()


def _known() -> str:
    return " or ".join(repr(name) for name in CLOUDS)


def make_cloud(
    provider: str,
    env: Mapping[str, str],
    *,
    credentials: Mapping[str, str] | None = None,
    account_id: str | None = None,
    endpoint: str | None = None,
) -> Cloud:
    """The cloud for ``provider``; ``endpoint`` only when the caller passes it explicitly
    (the environment's GPUFLEET_ENDPOINT_URL is read by :func:`run`, which logs it)."""
    region = env.get("GPUFLEET_REGION") or ""
    if not region:
        raise ConfigError("GPUFLEET_REGION is not set (and the platform gave no region)")
    entry = CLOUDS.get(provider)
    if entry is None:
        raise ConfigError(f"GPUFLEET_PROVIDER must be {_known()}, got {provider!r}")
    make = entry.from_env()
    return make(region, env, Invocation(credentials, account_id, endpoint))


def run(
    provider: str,
    env: Mapping[str, str],
    *,
    credentials: Mapping[str, str] | None = None,
    account_id: str | None = None,
) -> dict[str, Any]:
    stack = env.get("GPUFLEET_STACK", "").strip()
    if not stack:
        raise ConfigError("GPUFLEET_STACK is not set: the function only reaps its own stack")
    endpoint = env.get("GPUFLEET_ENDPOINT_URL", "").strip() or None
    if endpoint:
        print(
            json.dumps(
                {
                    "warning": f"GPUFLEET_ENDPOINT_URL={endpoint!r}: API calls go there, not to "
                    f"the {provider} endpoint of the region"
                },
                sort_keys=True,
            )
        )
    cloud = make_cloud(
        provider, env, credentials=credentials, account_id=account_id, endpoint=endpoint
    )
    report = reap(
        cloud,
        stack=stack,
        apply=_truthy(env.get("GPUFLEET_APPLY")),
        recover=restart_reclaimed(env),
        expected=expected_nodes(env),
    )
    return _log_and_check(report)


def restart_reclaimed(env: Mapping[str, str]) -> bool:
    """GPUFLEET_RESTART_RECLAIMED: on unless it says false (the stack's
    gpufleet:restartReclaimed)."""
    value = env.get("GPUFLEET_RESTART_RECLAIMED", "").strip().lower()
    return value not in {"0", "false", "no", "off"}


def _log_and_check(report: Report) -> dict[str, Any]:
    stops = [d.to_json() for d in report.decisions if d.action == "stop"]
    noted = [
        d.to_json() for d in report.decisions if d.action != "stop" and (d.warning or d.unknown)
    ]
    recoveries = [r.to_json() for r in report.recoveries]
    for line in stops + noted + recoveries:
        print(json.dumps(line, sort_keys=True))
    out = {
        "summary": report.summary,
        "stops": stops,
        "recoveries": recoveries,
        "apply": report.apply,
    }
    print(json.dumps({"summary": report.summary}, sort_keys=True))
    if report.problems:
        ids = ", ".join(
            d.instance_id for d in report.decisions if d.result.startswith("failed") or d.error
        )
        raise RuntimeError(
            f"gpufleet reaper: {'; '.join(report.problems)}" + (f": {ids}" if ids else "")
        )
    return out


# A fixed date: zip entries carry timestamps, and the same sources must give the same bytes
# so `pulumi up` sees no change when nothing changed.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)

# The function's files in this package: the neutral reaper and every cloud's module.
FUNCTION_MODULES = NEUTRAL_MODULES + tuple(f"{name}.py" for name in CLOUDS)
# What a cloud's function imports beyond the standard library is its reaper module's SDKS:
# for a cloud built from wheels (WHEELS) the whole closure is pinned in its folder's
# function-requirements.txt and vendored from wheels built for the function's runtime
# (infra/reaper/wheelhouse.py; `make fc-wheels` fetches them); otherwise from this venv's
# closure (below). A runtime that ships the SDK (VENDOR_SDK false) gets only the code and
# the table.
# Compiled speed-ups with a pure-Python fallback in the same package: left out, so those
# packages import on any CPython (the fallback is what they run without the extension).
_PURE_FALLBACK = frozenset(
    {"aiohttp", "multidict", "yarl", "frozenlist", "propcache", "charset-normalizer"}
)
_DIST_INFO_SKIP = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sdk_closure(roots: tuple[str, ...]) -> list[Any]:
    """The installed distributions the roots need, following Requires-Dist.

    Requirements behind an extra are not followed; one with an environment marker that is
    not installed (e.g. a backport for older Pythons) is skipped, any other missing one is
    an error: the zip must not be built incomplete.
    """
    from importlib import metadata

    seen: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = _dist_key(name)
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise FileNotFoundError(
                f"{name} is not installed: pip install -r requirements.txt first"
            ) from None
        seen[key] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            dep = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
            if dep is None:
                continue
            if marker.strip():
                try:
                    metadata.distribution(dep.group(1))
                except metadata.PackageNotFoundError:
                    continue  # a marker-gated requirement this interpreter does not need
            todo.append(dep.group(1))
    return [seen[k] for k in sorted(seen)]


def _vendored_files(dists: list[Any]) -> list[tuple[str, bytes]]:
    entries = []
    for dist in dists:
        key = _dist_key(dist.metadata["Name"])
        for f in dist.files or []:
            parts = Path(str(f)).parts
            name = str(f).replace("\\", "/")
            if not parts or parts[0] == ".." or "__pycache__" in parts or name.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info") and parts[-1] in _DIST_INFO_SKIP:
                continue
            if key in _PURE_FALLBACK and name.endswith((".so", ".pyd")):
                continue
            if parts[0].endswith(".pth") or name.endswith(".pth"):
                continue
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                entries.append((name, path.read_bytes()))
    return entries


# A cloud's reaper module imports the neutral reaper by its repository name; in the function
# it sits beside it in this package, so those imports become relative (as pip's vendoring
# rewrites the imports of what it vendors).
_REPO_IMPORT = re.compile(r"^(\s*)from infra\.reaper(?:\.(\w+))? import ", re.MULTILINE)


def function_module(source: str) -> bytes:
    """A cloud's reaper.py as the function carries it: ``from infra.reaper.core import``
    becomes ``from .core import``, ``from infra.reaper import`` ``from . import``. Any other
    import of the repository refuses the build: the function has only this package."""

    def relative(m: re.Match[str]) -> str:
        return f"{m.group(1)}from .{m.group(2) or ''} import "

    return _shipped(source, relative, "reaper")


def entry_module(source: str) -> bytes:
    """A cloud's entry.py as the top of its archive carries it: ``from infra.reaper.handler
    import`` becomes ``from gpufleet_reaper.handler import`` (the entry is not inside the
    package, so absolutely). Any other import of the repository refuses the build."""

    def absolute(m: re.Match[str]) -> str:
        return f"{m.group(1)}from {PACKAGE}{'.' + m.group(2) if m.group(2) else ''} import "

    return _shipped(source, absolute, "entry")


def _shipped(source: str, rewrite: Callable[[re.Match[str]], str], module: str) -> bytes:
    """``source`` with its imports of the reaper package rewritten; ValueError when the
    cloud's ``module`` imports anything else of the repository."""
    shipped = _REPO_IMPORT.sub(rewrite, source)
    left = re.findall(r"^\s*(?:from|import) (?:infra|bootstrap|policy|scripts)\b.*$", shipped, re.M)
    if left:
        raise ValueError(f"a cloud's {module} imports beyond the reaper package: {left[0].strip()}")
    return shipped.encode()


def function_zip_inputs(provider: str, *, wheelhouse: Path | None = None) -> str:
    """The sha256 of everything build_function_zip(provider=...) reads, so a zip built once
    can be reused until one of them changes (reaper_deploy caches by it): this builder and
    the wheelhouse checker, the shipped modules, the cloud folder's Python files (a package.py
    layout and its entry file live there), the catalog table, and the vendored part's
    identity: each wheel's name, size and mtime with the lock for a cloud built from wheels,
    else every installed distribution's metadata folder and its RECORD's size and mtime
    (pip rewrites it on any install). A site-packages file edited by hand in place is not
    seen: reinstall it."""
    import hashlib

    from .catalog_data import TABLE_FILE, table_json

    if provider not in CLOUDS:
        raise ValueError(f"provider must be {_known()}, got {provider!r}")
    digest = hashlib.sha256()

    def add(name: str, data: bytes) -> None:
        digest.update(f"{name}\0{len(data)}\0".encode() + data)

    here = Path(__file__).resolve().parent
    add("zip-date", repr(_ZIP_DATE).encode())
    for n in sorted({*NEUTRAL_MODULES, "wheelhouse.py"}):
        add(n, (here / n).read_bytes())
    for name, data in node_module_files():
        add(name, data)
    entry = CLOUDS[provider]
    for name, other in sorted(CLOUDS.items()):
        add(f"cloud:{name}", other.source.read_bytes())
    for path in sorted(entry.source.parent.glob("*.py")):
        add(f"folder:{path.name}", path.read_bytes())
    from infra.catalog import load_catalog

    add(TABLE_FILE, table_json(load_catalog()))
    if entry.layout is None and not entry.vendor_sdk:
        return digest.hexdigest()
    if entry.wheels and entry.layout is None:
        from . import wheelhouse as wh  # packaging, for a cloud built from wheels only

        to = wh.target(provider)
        add("lock", to.lock.read_bytes())
        for whl in sorted((wheelhouse or to.wheelhouse).glob("*.whl")):
            st = whl.stat()
            add(f"wheel:{whl.name}", f"{st.st_size}:{st.st_mtime_ns}".encode())
        return digest.hexdigest()
    for name, stamp in installed_distributions():
        add(f"dist:{name}", stamp.encode())
    return digest.hexdigest()


def installed_distributions() -> list[tuple[str, str]]:
    """(path of its metadata folder, size and mtime of its RECORD) of every distribution
    on sys.path, in path order: what importlib.metadata.distributions() finds, named by
    their ``<name>-<version>.dist-info`` folders. pip rewrites a distribution's RECORD
    whenever it installs it, so its stamp changes with any install. Read by stat, without
    parsing each METADATA and RECORD (155 distributions here: about 0.4 s of every Azure
    and Tencent plan)."""
    found: list[tuple[str, str]] = []
    for entry in sys.path:
        folder = Path(entry or ".")
        try:
            infos = sorted(folder.glob("*.dist-info")) + sorted(folder.glob("*.egg-info"))
        except OSError:
            continue
        for info in infos:
            marker = info / ("RECORD" if info.suffix == ".dist-info" else "PKG-INFO")
            try:
                st = marker.stat() if info.is_dir() else info.stat()
            except OSError:
                continue
            found.append((f"{folder}/{info.name}", f"{st.st_size}:{st.st_mtime_ns}"))
    return found


def build_function_zip(
    source_dir: Path | None = None,
    *,
    provider: str,
    catalog: Any = None,
    wheelhouse: Path | None = None,
) -> bytes:
    """The function archive: the cloud's entry point at the top as ``handler.py``
    (:func:`entry_module`), this package as ``gpufleet_reaper/``
    with the catalog's per-instance-type table (``instance_types.json``), the node package's
    shared modules as ``gpufleet_node/`` (:data:`NODE_MODULES`), and the SDKs'
    closure beside it where the runtime lacks them: for a cloud built from wheels (WHEELS)
    unpacked from the wheelhouse (default ``build/wheels/<cloud>``), whose wheels are checked
    against the lock and the runtime first (WheelhouseError); otherwise copied from the
    installed distributions.

    Deterministic (sorted entries, fixed dates and modes) and pure: reads the sources, the
    wheels and the installed distributions, writes nothing.
    """
    from .catalog_data import TABLE_FILE, table_json

    src = source_dir or Path(__file__).resolve().parent
    if not (src / "handler.py").is_file():
        raise FileNotFoundError(f"{src} has no handler.py: not the reaper package")
    if provider not in CLOUDS:
        raise ValueError(f"provider must be {_known()}, got {provider!r}")
    if catalog is None:
        from infra.catalog import load_catalog

        catalog = load_catalog()
    entry_source = CLOUDS[provider].entry.read_text(encoding="utf-8")
    entries = [(f"{ENTRY_MODULE}.py", entry_module(entry_source))]
    entries += [(f"{PACKAGE}/{n}", (src / n).read_bytes()) for n in NEUTRAL_MODULES]
    entries += node_module_files()
    entries += [
        (f"{PACKAGE}/{name}.py", function_module(entry.source.read_text(encoding="utf-8")))
        for name, entry in CLOUDS.items()
    ]
    entries.append((f"{PACKAGE}/{TABLE_FILE}", table_json(catalog)))
    layout = CLOUDS[provider].layout
    if layout is not None:
        entries = layout(entries)
    elif CLOUDS[provider].vendor_sdk:
        entry = CLOUDS[provider]
        if entry.wheels:
            from . import wheelhouse as wh

            vendored = wh.unpack(wh.check(wh.target(provider), wheelhouse))
            clash = sorted({n for n, _ in entries} & {n for n, _ in vendored})
            if clash:
                raise wh.WheelhouseError(
                    [f"{n}: a vendored wheel installs the function's own file" for n in clash]
                )
            entries += vendored
        else:
            entries += _vendored_files(sdk_closure(entry.sdks))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(dict(entries).items()):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, so the mode above is honoured
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    return buf.getvalue()
