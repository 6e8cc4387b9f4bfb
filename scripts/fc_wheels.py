#!/usr/bin/env python3
"""Fetch the wheels of every cloud function built from wheels, for its runtime.

`make fc-wheels` (and so `make setup`) runs this. A cloud whose reaper module sets WHEELS
declares the runtime its function runs on (WHEELS_RUNTIME: its CPython, glibc and
architecture), and its folder pins the closure (function-requirements.txt); the zip must
carry wheels built for that target, not this venv's builds. Every pin is downloaded as a
wheel for that CPython on manylinux (`pip download --no-deps --only-binary=:all: --platform
... --python-version X.Y --implementation cp`); the few pure-Python packages the cloud
declares published only as an sdist (WHEELS_SDIST_ONLY) are built into wheels here and must
come out `py3-none-any`. Then each folder is checked exactly as the zip build checks it
(infra/reaper/wheelhouse.py) and only then replaces the old one: build/wheels/<cloud>.

Exit status: 0 done; 1 pip failed (no network? its message is above); 2 a lock is
malformed or the wheels do not make the function (one line per problem).

    python scripts/fc_wheels.py                      # into build/wheels/<cloud>
    python scripts/fc_wheels.py --into /tmp/wheels   # /tmp/wheels/<cloud>
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

from infra.reaper import wheelhouse as wh  # noqa: E402

PIP_TIMEOUT_S = 900  # the whole download; pip bounds each request and retry itself
EXIT_PIP, EXIT_INVALID = 1, 2


def platforms(to: wh.Target) -> tuple[str, ...]:
    """pip download's own platform names: manylinux2014 (glibc 2.17), plus the newest
    manylinux the runtime's glibc loads."""
    return (f"manylinux2014_{to.arch}", f"manylinux_{to.glibc[0]}_{to.glibc[1]}_{to.arch}")


def download_command(python: str, to: wh.Target, lock: Path, into: Path) -> list[str]:
    cmd = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += [f"--no-binary={name}" for name in to.sdist_only]
    for platform in platforms(to):
        cmd += ["--platform", platform]
    cmd += ["--python-version", f"{to.python[0]}.{to.python[1]}", "--implementation", "cp"]
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


def build(to: wh.Target, into: Path, lock: Path) -> int:
    """One cloud's wheels into ``into``; an exit status."""
    try:
        wh.read_lock(lock)
    except OSError as exc:
        print(f"{to.cloud}: cannot read {lock}: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    except wh.WheelhouseError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_INVALID
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if not _pip(download_command(sys.executable, to, lock, partial)):
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
        wheels = wh.check(to, partial, lock=lock)
    except wh.WheelhouseError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_INVALID
    shutil.rmtree(into, ignore_errors=True)
    partial.rename(into)
    print(f"{len(wheels)} wheels for {to.cloud}'s {to.runtime} in {into}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--into", type=Path, default=wh.WHEELHOUSES, help="the folder of one folder per cloud"
    )
    parser.add_argument(
        "--lock", type=Path, default=None, help="a pinned closure instead of the cloud's own"
    )
    parser.add_argument("--cloud", default=None, help="only this cloud (default: every one)")
    args = parser.parse_args(argv)
    chosen = [t for t in wh.targets() if args.cloud in (None, t.cloud)]
    if not chosen:
        known = ", ".join(t.cloud for t in wh.targets()) or "none"
        if args.cloud is not None:
            print(
                f"--cloud: {args.cloud!r} builds no wheels; those that do: {known}",
                file=sys.stderr,
            )
            return EXIT_INVALID
        print("fc_wheels: no cloud builds its function from wheels: nothing to fetch")
        return 0
    for to in chosen:
        rc = build(to, args.into / to.cloud, args.lock or to.lock)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
