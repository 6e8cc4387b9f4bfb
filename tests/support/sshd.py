"""A real OpenSSH server on 127.0.0.1 for tests that drive nodes over SSH.

Usage from any test package (the fixture is session scoped and shared)::

    from tests.support.sshd import sshd_server  # noqa: F401  (re-export the fixture)

    def test_something(sshd_server):
        conn = sshd_server.connection()          # fabric.Connection as the sudo user
        subprocess.run(["fab", *sshd_server.fab_args(), "status"])

The server runs as root (sshd must, to switch users) with its own config, host key and
authorized_keys file in a temp dir; it accepts only keys, only on loopback, and is stopped by
the pid in its PidFile. Two test users exist on the machine while it runs:

- ``gpufleet-node``: passwordless sudo (a typical cloud image user);
- ``gpufleet-nosudo``: no sudo rights (to test how tasks report that).

Requirements: root, ``/usr/sbin/sshd`` (Debian: openssh-server), ``sudo``, ``useradd``.
Tests are skipped with the reason and the package when one is missing, or fail with it under
``GPUFLEET_REQUIRE_REAL=1`` (see :mod:`tests.support.real`). ``GPUFLEET_TEST_SSHD`` points the
fixture at another sshd binary (the tests of this very rule point it at nothing).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node.job_runner import pid_alive
from tests.support.real import describe, missing_real_part

SUDO_USER = "gpufleet-node"
NOSUDO_USER = "gpufleet-nosudo"
SSHD = "/usr/sbin/sshd"
SSHD_ENV = "GPUFLEET_TEST_SSHD"
SUDOERS_FILE = Path("/etc/sudoers.d/gpufleet-tests")
# held while users and the sudoers file are made: xdist workers start their sshd together
USERS_LOCK = Path(tempfile.gettempdir()) / "gpufleet-test-users.lock"
# the tools the server needs besides sshd, and the Debian package of each
TOOLS = {"ssh-keygen": "openssh-client", "sudo": "sudo", "useradd": "passwd", "usermod": "passwd"}


def sshd_path() -> str:
    return os.environ.get(SSHD_ENV) or SSHD


def missing_part() -> tuple[str, str | None] | None:
    """(what is missing, its Debian package) when a real sshd cannot start here, else None."""
    if os.geteuid() != 0:
        return "needs root (sshd switches users; CI runs as root)", None
    if not Path(sshd_path()).exists():
        return f"no sshd at {sshd_path()}", "openssh-server"
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return f"no {tool} on PATH", package
    return None


def skip_reason() -> str | None:
    """Why a real sshd cannot be started here (with the package to install), or None."""
    part = missing_part()
    return None if part is None else describe(*part)


def require_sshd() -> None:
    """Skip the calling test (fail it under GPUFLEET_REQUIRE_REAL=1) when sshd cannot start."""
    part = missing_part()
    if part is not None:
        missing_real_part(f"real sshd unavailable: {part[0]}", package=part[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ensure_user(name: str, *, sudo: bool) -> None:
    """Create a login user for the tests if missing (idempotent, safe to rerun, and safe
    from two pytest-xdist workers at once: one at a time, under a lock file)."""
    with open(USERS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _ensure_user(name, sudo=sudo)


def _ensure_user(name: str, *, sudo: bool) -> None:
    exists = subprocess.run(["id", "-u", name], capture_output=True, check=False).returncode == 0
    if not exists:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True)
    # With UsePAM no, OpenSSH refuses accounts whose password field starts with "!" (locked),
    # which is what useradd writes; "*" means "no password" without the lock.
    subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
    if sudo:
        SUDOERS_FILE.parent.mkdir(parents=True, exist_ok=True)
        rule = f"{name} ALL=(ALL) NOPASSWD:ALL\n"
        if not SUDOERS_FILE.exists() or SUDOERS_FILE.read_text() != rule:
            SUDOERS_FILE.write_text(rule)
            SUDOERS_FILE.chmod(0o440)


def _keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
    )
    return path


@dataclass
class SshServer:
    """A running sshd and how to log in to it."""

    host: str
    port: int
    user: str
    key_path: Path
    wrong_key_path: Path  # a valid key that is not authorized anywhere
    nosudo_user: str
    workdir: Path
    pid: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def host_string(self, user: str | None = None) -> str:
        return f"{user or self.user}@{self.host}:{self.port}"

    def fab_args(self, user: str | None = None, key: Path | None = None) -> list[str]:
        """Core ``fab`` options that target this server (put them before the task name)."""
        return ["-H", self.host_string(user), "-i", str(key or self.key_path)]

    def inventory(self, **overrides: Any) -> dict[str, Any]:
        """Stack-outputs-shaped inventory pointing at this server (``ssh_port``/``ssh_key``)."""
        data: dict[str, Any] = {
            "stack": "local-test",
            "provider": "aws",
            "region": "us-east-1",
            "zone": "us-east-1a",
            "tier": {"name": "local", "gpu_model": None, "gpu_count": 0, "nvswitch": False},
            "nodes": [
                {
                    "name": "local-0",
                    "role": "head",
                    "instance_id": "i-local",
                    "public_ip": self.host,
                    "private_ip": self.host,
                }
            ],
            "ssh_user": self.user,
            "ssh_port": self.port,
            "ssh_key": str(self.key_path),
            "scratch": {"path": "/scratch", "kind": "nvme", "devices": None, "size_gb": None},
        }
        data.update(overrides)
        return data

    def connection(self, user: str | None = None, key: Path | None = None) -> Any:
        from fabric import Connection

        return Connection(
            self.host,
            user=user or self.user,
            port=self.port,
            connect_kwargs={
                "key_filename": [str(key or self.key_path)],
                "look_for_keys": False,
                "allow_agent": False,
            },
        )

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def make_workdir() -> Path:
    """A fresh directory the test users can traverse.

    sshd reads AuthorizedKeysFile *as the logging-in user*, so it cannot live under pytest's
    or mkdtemp's 0700 directories in /tmp.
    """
    path = Path(tempfile.mkdtemp(prefix="gpufleet-sshd-", dir="/var/tmp"))
    path.chmod(0o755)
    return path


def start_sshd(
    workdir: Path | None = None,
    *,
    timeout_s: float = 10.0,
    sftp: bool = True,
    extra_config: Sequence[str] = (),
) -> SshServer:
    """Create the users and keys, start sshd on a free loopback port, wait until it answers.

    ``workdir`` must be traversable by the test users (see :func:`make_workdir`, the default).
    ``sftp=False`` leaves out the SFTP subsystem, as on a node whose sshd_config lacks it.
    ``extra_config`` lines go at the end of sshd_config (e.g. ``SetEnv PATH=...``: a
    node of its own, with its own tools, on a machine the nodes share).
    """
    reason = skip_reason()
    if reason:
        raise RuntimeError(f"cannot start sshd: {reason}")
    if workdir is None:
        workdir = make_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    ensure_user(SUDO_USER, sudo=True)
    ensure_user(NOSUDO_USER, sudo=False)
    host_key = _keygen(workdir / "ssh_host_ed25519_key")
    key = _keygen(workdir / "client_key")
    wrong = _keygen(workdir / "wrong_key")
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{key}.pub").read_text())
    authorized.chmod(0o644)
    port = free_port()
    pidfile = workdir / "sshd.pid"
    log = workdir / "sshd.log"
    config = workdir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "UsePAM no",
                f"PidFile {pidfile}",
                # The files live under a temp dir whose parents sshd would reject.
                "StrictModes no",
                f"AllowUsers {SUDO_USER} {NOSUDO_USER}",
                "MaxStartups 64:30:128",
                "MaxSessions 64",
                "LogLevel VERBOSE",
                # Fabric's put/get speak SFTP; without this line the channel just closes.
                "Subsystem sftp internal-sftp" if sftp else "",
                *extra_config,
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
    sshd = sshd_path()
    subprocess.run([sshd, "-t", "-f", str(config)], check=True, capture_output=True)
    subprocess.run([sshd, "-f", str(config), "-E", str(log)], check=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"sshd did not start on port {port}: {log.read_text()[-2000:]}")
    return SshServer(
        host="127.0.0.1",
        port=port,
        user=SUDO_USER,
        key_path=key,
        wrong_key_path=wrong,
        nosudo_user=NOSUDO_USER,
        workdir=workdir,
        pid=int(pidfile.read_text().strip()),
        log_path=log,
    )


def stop_sshd(server: SshServer, *, remove_workdir: bool = True) -> None:
    """Stop the listener by its pid (never by name: other sshds may run on the machine)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.pid, 15)
    # pid_alive counts a zombie as gone: sshd daemonizes, so PID 1 reaps it, and this
    # container's PID 1 reaps only every 2 s or so (sshd a zombie 0.02 s after SIGTERM, gone
    # 1.9 s later); a zombie holds no port and runs nothing
    for _ in range(100):
        if not pid_alive(server.pid):
            break
        time.sleep(0.02)
    if remove_workdir:
        shutil.rmtree(server.workdir, ignore_errors=True)


@contextlib.contextmanager
def running_sshd() -> Iterator[SshServer]:
    """Context-manager form, for scripts (benchmarks) that are not under pytest."""
    server = start_sshd()
    try:
        yield server
    finally:
        stop_sshd(server)


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[SshServer]:
    """Session-wide sshd on 127.0.0.1 (skips, or fails under GPUFLEET_REQUIRE_REAL=1, with the
    reason and the package when it cannot start here)."""
    require_sshd()
    with running_sshd() as server:
        yield server
