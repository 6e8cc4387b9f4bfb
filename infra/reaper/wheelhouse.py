"""The Alicloud function's third-party code, built for the runtime the stack declares.

Function Compute's ``python3.10`` runtime is CPython 3.10 on Debian 10, x86_64 (Alibaba
Cloud, Function Compute > Python > Overview, runtime table), so glibc 2.28. The zip carries
the wheels that ``make fc-wheels`` fetched for exactly that target into ``build/fc-wheels``,
pinned by ``function-requirements.txt``; never this venv's site-packages, whose compiled
parts are CPython 3.11 builds that the runtime cannot import.

Only the zip build imports this module (it is not in the function: not in FUNCTION_MODULES).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Mapping
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

# The runtime infra/clouds/alicloud/program.py declares, and what it is (see the module docstring).
FC_RUNTIME = "python3.10"
PYTHON = (3, 10)
GLIBC = (2, 28)  # Debian 10 "buster"
ARCH = "x86_64"

LOCK = Path(__file__).with_name("function-requirements.txt")
WHEELHOUSE = Path(__file__).resolve().parents[2] / "build" / "fc-wheels"
MAKE_TARGET = "make fc-wheels"

# dist-info files that describe one installation, not the package: left out of the zip.
_INSTALL_RECORDS = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})


class WheelhouseError(Exception):
    """The wheels cannot make the function: ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def runtime_tags() -> frozenset[Tag]:
    """Every wheel tag CPython 3.10 on manylinux x86_64 (glibc <= 2.28) can import."""
    platforms = [f"manylinux_{GLIBC[0]}_{minor}_{ARCH}" for minor in range(GLIBC[1], 4, -1)]
    platforms += [f"manylinux2014_{ARCH}", f"manylinux2010_{ARCH}", f"manylinux1_{ARCH}"]
    interpreter = f"cp{PYTHON[0]}{PYTHON[1]}"
    return frozenset(cpython_tags(PYTHON, [interpreter], platforms)) | frozenset(
        compatible_tags(PYTHON, interpreter, platforms)
    )


def runtime_environment() -> dict[str, str]:
    """PEP 508 marker values of the runtime (not of the interpreter building the zip)."""
    return dict(
        implementation_name="cpython",
        implementation_version="3.10.0",
        os_name="posix",
        platform_machine=ARCH,
        platform_python_implementation="CPython",
        platform_system="Linux",
        python_full_version="3.10.0",
        python_version="3.10",
        sys_platform="linux",
        platform_release="",
        platform_version="",
        extra="",
    )


def read_lock(path: Path = LOCK) -> dict[str, Version]:
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


def missing_message(wheelhouse: Path) -> str:
    return (
        f"{_shown(wheelhouse)}: no wheels for the Alicloud reaper function (FC runtime "
        f"{FC_RUNTIME}): run `{MAKE_TARGET}` (fetches them from PyPI), then retry"
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
    wheels: Mapping[str, tuple[Path, Version]], roots: Iterable[str]
) -> list[str]:
    env = runtime_environment()
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
                continue  # not for CPython 3.10 on Linux, or behind an extra
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


def check(wheelhouse: Path, roots: Iterable[str], lock: Path = LOCK) -> list[Path]:
    """The wheelhouse's wheels, sorted by name, after proving that they are exactly the
    lock's pins, each built for the runtime, and that together they satisfy every
    requirement of the roots (markers evaluated for the runtime). WheelhouseError if not."""
    wheels_found = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels_found:
        raise WheelhouseError([missing_message(wheelhouse)])
    pins = read_lock(lock)
    accepted = runtime_tags()
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
                f"{path.name}: built for {shown}, which FC's {FC_RUNTIME} (CPython 3.10, "
                f"manylinux x86_64, glibc <= {GLIBC[0]}.{GLIBC[1]}) cannot load: {rerun}"
            )
        if name not in pins:
            problems.append(f"{path.name}: {lock.name} does not pin {name}: {rerun}")
        elif pins[name] != version:
            problems.append(f"{path.name}: {lock.name} pins {name}=={pins[name]}: {rerun}")
    for absent in sorted(set(pins) - set(wheels)):
        problems.append(f"{absent}=={pins[absent]}: pinned, but no wheel of it is here: {rerun}")
    if not problems:
        problems = _closure_problems(wheels, roots)
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
