"""What a test does when a real part it drives (sshd, loop devices, systemd-analyze) is missing.

By default it skips, naming the part and the Debian package that provides it. With
``GPUFLEET_REQUIRE_REAL=1`` (``.ci/run`` sets it) it fails instead, so a run can never go green
by skipping the real parts. Skips that hold by design (data absent upstream) do not come here.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_ENV = "GPUFLEET_REQUIRE_REAL"
INSTALL_HINT = "sudo sh scripts/install_system_packages.sh installs every package the tests need"


def real_parts_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def describe(what: str, package: str | None) -> str:
    if package is None:
        return what
    return f"{what} (Debian package: {package}; {INSTALL_HINT})"


def missing_real_part(what: str, *, package: str | None = None) -> NoReturn:
    """Skip the test, or fail it when ``GPUFLEET_REQUIRE_REAL=1``; ``what`` says what is missing."""
    message = describe(what, package)
    if real_parts_required():
        pytest.fail(f"{REQUIRE_ENV}=1 and a real part is missing: {message}", pytrace=False)
    pytest.skip(message)
