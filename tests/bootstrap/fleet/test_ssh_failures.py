"""Each way an SSH connection fails is one clear line per host, and never a paramiko traceback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import paramiko
import pytest

from bootstrap.fleet.api import Host
from bootstrap.fleet.runner import KeyFileMissing, classify_connect_error
from tests.bootstrap.conftest import run_fab

HOST = Host("127.0.0.1", user="u", port=2200, key_filename="/keys/id")


def test_refused_says_refused_and_suggests_sshd() -> None:
    exc = paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.1", 2200): OSError(111, "x")})
    kind, message = classify_connect_error(exc, HOST, 5)
    assert kind == "unreachable" and "connection refused" in message


def test_timed_out_says_how_long_it_waited() -> None:
    kind, message = classify_connect_error(TimeoutError(), HOST, 5)
    assert kind == "unreachable" and "timed out within 5 s" in message


def test_a_silent_port_is_named_as_no_ssh_banner() -> None:
    exc = paramiko.SSHException("Error reading SSH protocol banner")
    kind, message = classify_connect_error(exc, HOST, 2.5)
    assert kind == "unreachable"
    assert "accepted the connection but sent no SSH banner within 2.5 s" in message


def test_a_missing_key_file_is_named_not_called_unreachable() -> None:
    kind, message = classify_connect_error(KeyFileMissing("/keys/id"), HOST)
    assert kind == "key-missing" and "key file /keys/id does not exist" in message
    assert "unreachable" not in message


def test_auth_and_host_key_failures_keep_their_own_kinds() -> None:
    assert classify_connect_error(paramiko.AuthenticationException("x"), HOST)[0] == "auth-failed"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.integration
def test_fab_against_a_silent_port_says_no_banner_once_without_a_traceback(
    silent_port: int, tmp_path
) -> None:
    key = tmp_path / "id"
    key.write_text("not used: the handshake never gets that far\n")
    result = run_fab(
        "-H",
        f"u@127.0.0.1:{silent_port}",
        "-i",
        str(key),
        "status",
        "--connect-timeout",
        "1",
        "--json",
        timeout=120,
    )
    assert result.returncode == 1
    host = json.loads(result.stdout)["hosts"][0]
    assert "sent no SSH banner within 1 s" in host["error"]
    assert "Traceback" not in result.stderr and "paramiko" not in result.stderr


@pytest.mark.integration
def test_fab_with_a_missing_key_file_names_the_file(tmp_path) -> None:
    missing = tmp_path / "no-such-key"
    result = run_fab("-H", "u@127.0.0.1:9", "-i", str(missing), "status", "--json", timeout=120)
    assert result.returncode == 1
    host = json.loads(result.stdout)["hosts"][0]
    assert host["status"] == "key-missing" and str(missing) in host["error"]
    assert "Traceback" not in result.stderr
