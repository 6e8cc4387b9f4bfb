"""A run cannot go green by skipping the real parts: one package list, and strict mode fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bootstrap.tasks.test_scratch_loop import LOOP_TOOLS
from tests.support import sshd
from tests.support.real import REQUIRE_ENV, missing_real_part

ROOT = Path(__file__).resolve().parents[1]
INSTALLER = ROOT / "scripts" / "install_system_packages.sh"

TINY_SSHD_TEST = """
from tests.support.sshd import sshd_server  # noqa: F401

def test_uses_the_real_sshd(sshd_server):
    assert sshd_server.port
"""


def listed_packages(path: Path = ROOT / "system-packages.txt") -> list[str]:
    return [w for line in path.read_text().splitlines() for w in line.split("#", 1)[0].split()]


def run_tiny_sshd_test(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_tiny.py").write_text(TINY_SSHD_TEST)
    full_env = {k: v for k, v in os.environ.items() if k != REQUIRE_ENV}
    full_env.update(PYTHONPATH=str(ROOT), GPUFLEET_TEST_SSHD=str(tmp_path / "no-such-sshd"), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_tiny.py"],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the sshd check only gets to the binary as root")
def test_sshd_tests_fail_naming_the_package_when_real_parts_are_required(tmp_path: Path) -> None:
    done = run_tiny_sshd_test(tmp_path, **{REQUIRE_ENV: "1"})
    assert done.returncode == 1, done.stdout
    assert re.search(r"\b1 error\b", done.stdout), done.stdout
    assert "Debian package: openssh-server" in done.stdout
    assert "no-such-sshd" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the sshd check only gets to the binary as root")
def test_sshd_tests_skip_naming_the_package_by_default(tmp_path: Path) -> None:
    done = run_tiny_sshd_test(tmp_path)
    assert done.returncode == 0, done.stdout
    assert re.search(r"\b1 skipped\b", done.stdout), done.stdout
    assert "Debian package: openssh-server" in done.stdout


def test_every_package_a_skip_names_is_in_the_one_list() -> None:
    named = {*sshd.TOOLS.values(), "openssh-server", *LOOP_TOOLS.values(), "systemd"}
    assert named <= set(listed_packages())


def test_ci_installs_through_the_same_script_and_sets_strict_mode() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/install_system_packages.sh" in ci
    assert "apt-get" not in ci  # the list and the command live in one place
    assert f"{REQUIRE_ENV}=1" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/install_system_packages.sh" in makefile
    assert "sudo sh scripts/install_system_packages.sh" in (ROOT / "README.md").read_text()


def installer(tmp_path: Path, *packages: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("dpkg-query") is None:
        missing_real_part(
            "no dpkg-query: the installer's checks need Debian/Ubuntu", package="dpkg"
        )
    listing = tmp_path / "packages.txt"
    listing.write_text("# a test list\n" + "".join(f"{p}   # why\n" for p in packages))
    return subprocess.run(
        ["sh", str(INSTALLER), "--check"],
        env={**os.environ, "GPUFLEET_SYSTEM_PACKAGES": str(listing)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_installer_prints_the_exact_install_command_for_what_is_missing(tmp_path: Path) -> None:
    done = installer(tmp_path, "dpkg", "gpufleet-no-such-package")
    assert done.returncode == 1
    assert "apt-get install -y --no-install-recommends gpufleet-no-such-package'" in done.stderr
    assert " dpkg" not in done.stderr.split("install them with:")[1]


def test_installer_is_silent_when_everything_is_installed(tmp_path: Path) -> None:
    done = installer(tmp_path, "dpkg")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
