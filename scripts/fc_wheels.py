#!/usr/bin/env python3
"""Fetch the Alicloud reaper function's wheels, for its runtime, into build/fc-wheels.

`make fc-wheels` (and so `make setup`) runs this. Function Compute's python3.10 runtime is
CPython 3.10 on Debian 10 x86_64, so the zip must carry wheels built for that, not this
venv's CPython 3.11 builds. Every pin of infra/reaper/function-requirements.txt is
downloaded as a wheel for CPython 3.10 on manylinux x86_64 (`pip download --no-deps
--only-binary=:all: --platform ... --python-version 3.10 --implementation cp`); the few
pure-Python packages published only as an sdist (SDIST_ONLY) are built into wheels here and
must come out `py3-none-any`. Then the folder is checked exactly as the zip build checks it
(infra/reaper/wheelhouse.py) and only then replaces the old one.

Exit status: 0 done; 1 pip failed (no network? its message is above); 2 the lock is
malformed or the wheels do not make the function (one line per problem).

    python scripts/fc_wheels.py                      # into build/fc-wheels
    python scripts/fc_wheels.py --into /tmp/wheels
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra.reaper import handler  # noqa: E402
from infra.reaper import wheelhouse as wh  # noqa: E402

# Pinned releases that PyPI has as an sdist only, each pure Python (no extension module):
# built into a wheel by this venv's setuptools. The check refuses anything but py3-none-any.
SDIST_ONLY = ("alibabacloud-tea",)
# pip download's own platform names: manylinux2014 (glibc 2.17) as the brief names it, plus
# manylinux_2_28, the newest that Debian 10's glibc 2.28 loads.
PLATFORMS = (f"manylinux2014_{wh.ARCH}", f"manylinux_{wh.GLIBC[0]}_{wh.GLIBC[1]}_{wh.ARCH}")
PIP_TIMEOUT_S = 900  # the whole download; pip bounds each request and retry itself
EXIT_PIP, EXIT_INVALID = 1, 2


def wheel_sdks() -> tuple[str, ...]:
    """The SDKs the wheelhouse must hold: those of every cloud whose reaper zip is built from
    wheels (WHEELS in its infra/clouds/<name>/reaper.py, which also lists its SDKS)."""
    return tuple(sdk for cloud in handler.CLOUDS.values() if cloud.wheels for sdk in cloud.sdks)


def download_command(python: str, lock: Path, into: Path) -> list[str]:
    cmd = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += [f"--no-binary={name}" for name in SDIST_ONLY]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["--python-version", f"{wh.PYTHON[0]}.{wh.PYTHON[1]}", "--implementation", "cp"]
    return [*cmd, "--dest", str(into), "--requirement", str(lock)]


def build_command(python: str, sdists: Sequence[Path], into: Path) -> list[str]:
    # No build isolation: the venv's pinned setuptools builds them, so the same inputs give
    # the same wheel (an isolated build would take whatever setuptools the index has today).
    cmd = [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    return [*cmd, "--wheel-dir", str(into), *map(str, sdists)]


def sdists_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip")))


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INVALID, f"{self.prog}: {message} (see --help)\n")


def _pip(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, timeout=PIP_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        print(f"fc_wheels: pip took over {PIP_TIMEOUT_S} s; stopped", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=wh.WHEELHOUSE, help="the wheel folder")
    parser.add_argument("--lock", type=Path, default=wh.LOCK, help="the pinned closure")
    args = parser.parse_args(argv)
    try:
        wh.read_lock(args.lock)
    except OSError as exc:
        print(f"--lock: cannot read {args.lock}: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    except wh.WheelhouseError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_INVALID
    into: Path = args.into
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if not _pip(download_command(sys.executable, args.lock, partial)):
        print("fc_wheels: pip download failed (its message is above)", file=sys.stderr)
        return EXIT_PIP
    sdists = sdists_in(partial)
    if sdists:
        if not _pip(build_command(sys.executable, sdists, partial)):
            print("fc_wheels: building the sdist-only wheels failed", file=sys.stderr)
            return EXIT_PIP
        for sdist in sdists:
            sdist.unlink()
    try:
        wheels = wh.check(partial, wheel_sdks(), args.lock)
    except wh.WheelhouseError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_INVALID
    shutil.rmtree(into, ignore_errors=True)
    partial.rename(into)
    print(f"{len(wheels)} wheels for FC's {wh.FC_RUNTIME} in {into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
