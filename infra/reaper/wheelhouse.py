"""A cloud function's third-party code, built for the runtime its stack declares.

A cloud whose reaper module sets ``WHEELS`` (its platform's runtime lacks the SDK, and the
SDK's closure has compiled parts) declares beside it the runtime the wheels are for
(``WHEELS_RUNTIME``: the platform's runtime name, its CPython, the glibc it loads against and
its architecture, with the source that says so) and the pure-Python releases that PyPI has
as an sdist only (``WHEELS_SDIST_ONLY``); its folder holds the pinned closure,
``function-requirements.txt``. ``make fc-wheels`` (scripts/fc_wheels.py) fetches the wheels
of every such cloud for exactly that target into ``build/wheels/<cloud>``; the zip carries
those, never this venv's site-packages, whose compiled parts are builds for this
interpreter that the runtime may not import.

Only the zip build imports this module (it is not in the function: not in FUNCTION_MODULES).
"""

from __future__ import annotations

import importlib
import io
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

LOCK_FILE = "function-requirements.txt"  # in the cloud's folder
WHEELHOUSES = Path(__file__).resolve().parents[2] / "build" / "wheels"  # one folder per cloud
MAKE_TARGET = "make fc-wheels"


@dataclass(frozen=True)
class Target:
    """What one cloud's function wheels are built for, as its reaper module declares it."""

    cloud: str
    runtime: str  # the platform's name for it (the stack declares this runtime)
    python: tuple[int, int]
    glibc: tuple[int, int]
    arch: str
    sdist_only: tuple[str, ...]
    sdks: tuple[str, ...]  # what the function imports: the closure's roots
    lock: Path

    @property
    def wheelhouse(self) -> Path:
        """Where ``make fc-wheels`` puts its wheels (read on each use, so a test may move
        WHEELHOUSES)."""
        return WHEELHOUSES / self.cloud

    @property
    def described(self) -> str:
        return (
            f"CPython {self.python[0]}.{self.python[1]}, manylinux {self.arch}, "
            f"glibc <= {self.glibc[0]}.{self.glibc[1]}"
        )


def target(cloud: str) -> Target:
    """The wheel target ``cloud``'s reaper module declares; LookupError when it builds its
    function from no wheels."""
    from infra import clouds

    module = importlib.import_module(f"infra.clouds.{cloud}.reaper")
    if not getattr(module, "WHEELS", False):
        raise LookupError(f"cloud {cloud!r} builds its function from no wheels (WHEELS)")
    runtime = module.WHEELS_RUNTIME
    return Target(
        cloud=cloud,
        runtime=str(runtime["name"]),
        python=tuple(runtime["python"]),
        glibc=tuple(runtime["glibc"]),
        arch=str(runtime["arch"]),
        sdist_only=tuple(getattr(module, "WHEELS_SDIST_ONLY", ())),
        sdks=tuple(module.SDKS),
        lock=clouds.folders()[cloud] / LOCK_FILE,
    )


def targets() -> list[Target]:
    """Every cloud whose function is built from wheels, by name."""
    from infra import clouds

    found = []
    for name in clouds.names("reaper.py"):
        try:
            found.append(target(name))
        except LookupError:
            continue
    return found


# dist-info files that describe one installation, not the package: left out of the zip.
_INSTALL_RECORDS = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})


class WheelhouseError(Exception):
    """The wheels cannot make the function: ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def runtime_tags(to: Target) -> frozenset[Tag]:
    """Every wheel tag the target's CPython on manylinux (its glibc or older) can import."""
    glibc, arch, python = to.glibc, to.arch, to.python
    platforms = [f"manylinux_{glibc[0]}_{minor}_{arch}" for minor in range(glibc[1], 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    interpreter = f"cp{python[0]}{python[1]}"
    return frozenset(cpython_tags(python, [interpreter], platforms)) | frozenset(
        compatible_tags(python, interpreter, platforms)
    )


def runtime_environment(to: Target) -> dict[str, str]:
    """PEP 508 marker values of the runtime (not of the interpreter building the zip)."""
    version = f"{to.python[0]}.{to.python[1]}"
    return dict(
        implementation_name="cpython",
        implementation_version=f"{version}.0",
        os_name="posix",
        platform_machine=to.arch,
        platform_python_implementation="CPython",
        platform_system="Linux",
        python_full_version=f"{version}.0",
        python_version=version,
        sys_platform="linux",
        platform_release="",
        platform_version="",
        extra="",
    )


def read_lock(path: Path) -> dict[str, Version]:
    """``name==version`` per line (comments and blank lines aside), canonical names."""
    pins: dict[str, Version] = {}
    problems = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        try:
            if not sep or not name.strip():
                raise InvalidVersion(line)
            pinned = Version(version.strip())
        except InvalidVersion:
            problems.append(f"{path.name}:{number}: {line!r} is not name==version")
            continue
        key = canonicalize_name(name.strip())
        if key in pins:
            problems.append(f"{path.name}:{number}: {key} is pinned twice")
        pins[key] = pinned
    if problems:
        raise WheelhouseError(problems)
    return pins


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def missing_message(to: Target, wheelhouse: Path) -> str:
    return (
        f"{_shown(wheelhouse)}: no wheels for the {to.cloud} reaper function (runtime "
        f"{to.runtime}): run `{MAKE_TARGET}` (fetches them from PyPI), then retry"
    )


def _metadata(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        ]
        if len(names) != 1:
            raise WheelhouseError([f"{wheel.name}: not one .dist-info/METADATA in the wheel"])
        headers = HeaderParser().parsestr(zf.read(names[0]).decode("utf-8"))
    return headers.get_all("Requires-Dist") or []


def _closure_problems(
    wheels: Mapping[str, tuple[Path, Version]], roots: Iterable[str], to: Target
) -> list[str]:
    env = runtime_environment(to)
    problems = []
    needed: set[str] = set()
    todo = [canonicalize_name(r) for r in roots]
    for root in todo:
        if root not in wheels:
            problems.append(f"{root}: the function imports it, but no wheel of it is here")
    todo = [r for r in todo if r in wheels]
    while todo:
        key = todo.pop()
        if key in needed:
            continue
        needed.add(key)
        path, _ = wheels[key]
        for line in _metadata(path):
            try:
                req = Requirement(line)
            except InvalidRequirement:
                problems.append(f"{path.name}: unreadable requirement {line!r}")
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # not for the runtime's CPython on Linux, or behind an extra
            dep = canonicalize_name(req.name)
            if dep not in wheels:
                problems.append(f"{path.name} needs {req}, which the lock does not pin")
            else:
                if not req.specifier.contains(wheels[dep][1], prereleases=True):
                    problems.append(f"{path.name} needs {req}, the lock pins {wheels[dep][1]}")
                todo.append(dep)
    for unused in sorted(set(wheels) - needed):
        problems.append(f"{unused}: pinned, but nothing the function imports needs it")
    return problems


def check(
    to: Target,
    wheelhouse: Path | None = None,
    roots: Iterable[str] | None = None,
    lock: Path | None = None,
) -> list[Path]:
    """The wheelhouse's wheels (default: the target's), sorted by name, after proving that
    they are exactly the lock's pins, each built for the runtime, and that together they
    satisfy every requirement of the roots (default: the cloud's SDKS; markers evaluated
    for the runtime). WheelhouseError if not."""
    wheelhouse = wheelhouse or to.wheelhouse
    lock = lock or to.lock
    wheels_found = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels_found:
        raise WheelhouseError([missing_message(to, wheelhouse)])
    pins = read_lock(lock)
    accepted = runtime_tags(to)
    rerun = f"rerun `{MAKE_TARGET}`"
    problems = []
    for other in sorted(wheelhouse.iterdir()):
        if other.suffix != ".whl" and not other.name.startswith("."):
            problems.append(f"{other.name}: not a wheel (only wheels are vendored): {rerun}")
    wheels: dict[str, tuple[Path, Version]] = {}
    for path in wheels_found:
        try:
            name, version, _, tags = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion):
            problems.append(f"{path.name}: not a wheel file name")
            continue
        if name in wheels:
            problems.append(f"{path.name}: a second wheel of {name}: {rerun}")
            continue
        wheels[name] = (path, version)
        if not tags & accepted:
            shown = ", ".join(sorted(str(t) for t in tags))
            problems.append(
                f"{path.name}: built for {shown}, which {to.runtime} ({to.described}) "
                f"cannot load: {rerun}"
            )
        if name not in pins:
            problems.append(f"{path.name}: {lock.name} does not pin {name}: {rerun}")
        elif pins[name] != version:
            problems.append(f"{path.name}: {lock.name} pins {name}=={pins[name]}: {rerun}")
    for absent in sorted(set(pins) - set(wheels)):
        problems.append(f"{absent}=={pins[absent]}: pinned, but no wheel of it is here: {rerun}")
    if not problems:
        problems = _closure_problems(wheels, to.sdks if roots is None else roots, to)
    if problems:
        raise WheelhouseError(problems)
    return [wheels[k][0] for k in sorted(wheels)]


def _installed_name(member: str) -> str | None:
    """Where a wheel member lands on sys.path, or None when it is left out."""
    parts = PurePosixPath(member).parts
    if not parts or member.endswith("/") or ".." in parts:
        return None
    if "__pycache__" in parts or member.endswith((".pyc", ".pth")):
        return None
    top = parts[0]
    if top.endswith(".dist-info") and parts[-1] in _INSTALL_RECORDS | {"RECORD.jws", "RECORD.p7s"}:
        return None
    if top.endswith(".data"):
        # purelib/platlib install beside the packages; scripts, headers, data do not import.
        if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
            return "/".join(parts[2:])
        return None
    return member


def unpack(wheels: Iterable[Path]) -> list[tuple[str, bytes]]:
    """The files the wheels install, as (path in the zip, bytes); a path two wheels both
    install with different bytes is an error (one would silently win)."""
    files: dict[str, tuple[str, bytes]] = {}
    problems = []
    for wheel in wheels:
        with zipfile.ZipFile(io.BytesIO(wheel.read_bytes())) as zf:
            for info in zf.infolist():
                name = _installed_name(info.filename)
                if name is None:
                    continue
                data = zf.read(info)
                seen = files.get(name)
                if seen is not None and seen[1] != data:
                    problems.append(f"{name}: installed by both {seen[0]} and {wheel.name}")
                files[name] = (wheel.name, data)
    if problems:
        raise WheelhouseError(problems)
    return [(name, data) for name, (_, data) in sorted(files.items())]
