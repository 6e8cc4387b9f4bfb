"""Host-key pinning over real SSH: first use records, a changed key fails, accept re-pins.

Two real sshds with different host keys stand for a node and its replacement. A small TCP
forwarder is "the node's address" (like an elastic IP): pointing it at the second sshd is
what replacing the node behind the same address looks like to a client.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric import Connection

from bootstrap.fleet.api import Host, HostContext, StepResult, step
from bootstrap.fleet.hostkeys import PublicKey, resolve_settings
from bootstrap.fleet.runner import run_fleet
from tests.bootstrap.conftest import FabResult, run_fab, unwrap_progress
from tests.support.sshd import SshServer, start_sshd, stop_sshd

pytestmark = pytest.mark.integration


class Forwarder:
    """A loopback TCP port whose new connections go to whichever sshd it points at."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # listener closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture(scope="module")
def replacement(sshd_server: SshServer) -> Iterator[SshServer]:
    """A second sshd with its own host key that lets in the same client key (a new node)."""
    server = start_sshd()
    (server.workdir / "authorized_keys").write_text(Path(f"{sshd_server.key_path}.pub").read_text())
    try:
        yield server
    finally:
        stop_sshd(server)


@pytest.fixture
def address(sshd_server: SshServer) -> Iterator[Forwarder]:
    forwarder = Forwarder(sshd_server.port)
    try:
        yield forwarder
    finally:
        forwarder.close()


def host_pub(server: SshServer) -> PublicKey:
    return PublicKey.parse((server.workdir / "ssh_host_ed25519_key.pub").read_text())


def keygen_fingerprint(server: SshServer) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(server.workdir / "ssh_host_ed25519_key.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]


def fab_status(server: SshServer, ports: list[int], *extra: str) -> FabResult:
    hosts = ",".join(f"{server.user}@127.0.0.1:{p}" for p in ports)
    return run_fab("-H", hosts, "-i", str(server.key_path), "status", *extra)


def by_port(result: FabResult) -> dict[int, dict[str, object]]:
    return {int(h["port"]): h for h in result.doc["hosts"]}


def test_first_connection_records_the_host_key_and_the_next_one_must_match(
    sshd_server: SshServer, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    first = fab_status(sshd_server, [sshd_server.port], "--known-hosts", str(kh))
    assert first.returncode == 0, first.stdout + first.stderr
    fp = keygen_fingerprint(sshd_server)
    assert (
        f"recorded host key {fp} (ssh-ed25519) for [127.0.0.1]:{sshd_server.port}" in first.stdout
    )
    # The file holds exactly the server's host public key, in OpenSSH's format, mode 0600.
    assert kh.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}\n"
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600

    second = fab_status(sshd_server, [sshd_server.port], "--known-hosts", str(kh), "--json")
    assert second.returncode == 0, second.stderr
    key = second.host()["host_key"]
    assert key["status"] == "matched" and key["fingerprint"] == fp
    assert kh.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}\n"

    # The fingerprint can be compared out of band (e.g. with the instance's console output).
    shown = run_fab(*sshd_server.fab_args(), "host-keys", "--known-hosts", str(kh))
    assert shown.returncode == 0, shown.stderr
    assert fp in shown.stdout and f"[127.0.0.1]:{sshd_server.port}" in shown.stdout


def test_a_changed_host_key_fails_that_host_while_the_other_host_runs(
    sshd_server: SshServer, replacement: SshServer, address: Forwarder, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    ports = [address.port, sshd_server.port]
    recorded = fab_status(sshd_server, ports, "--known-hosts", str(kh), "--json")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert {h["host_key"]["status"] for h in recorded.doc["hosts"]} == {"recorded"}
    pinned = kh.read_text()

    address.target_port = replacement.port  # the node behind the address was replaced
    result = fab_status(sshd_server, ports, "--known-hosts", str(kh), "--json")

    assert result.returncode == 1
    hosts = by_port(result)
    assert hosts[sshd_server.port]["status"] == "ok"
    changed = hosts[address.port]
    assert changed["status"] == "host-key-mismatch" and changed["steps"] == []
    message = str(changed["error"])
    assert f"expected {keygen_fingerprint(sshd_server)} (ssh-ed25519)" in message
    assert f"presented {keygen_fingerprint(replacement)} (ssh-ed25519)" in message
    assert str(kh) in message
    assert f"--accept-new-host-key 127.0.0.1:{address.port}" in message
    assert f"forget-host-key --known-hosts {kh}" in message
    assert kh.read_text() == pinned  # never silently replaced
    # --json carries both fingerprints for a machine to read.
    key = changed["host_key"]
    assert isinstance(key, dict)
    assert (key["status"], key["fingerprint"], key["previous"]) == (
        "mismatch",
        keygen_fingerprint(replacement),
        [keygen_fingerprint(sshd_server)],
    )


@pytest.mark.slow
def test_accept_new_host_key_repins_only_the_named_host(
    sshd_server: SshServer, replacement: SshServer, address: Forwarder, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    ports = [address.port, sshd_server.port]
    assert fab_status(sshd_server, ports, "--known-hosts", str(kh), "--json").returncode == 0
    address.target_port = replacement.port

    accepted = fab_status(
        sshd_server,
        ports,
        "--known-hosts",
        str(kh),
        "--accept-new-host-key",
        f"127.0.0.1:{address.port}",
    )
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert (
        f"replaced host key for [127.0.0.1]:{address.port} in {kh}: was "
        f"{keygen_fingerprint(sshd_server)} (ssh-ed25519), now {keygen_fingerprint(replacement)}"
    ) in unwrap_progress(accepted.stdout)
    assert sorted(kh.read_text().splitlines()) == sorted(
        [
            f"[127.0.0.1]:{address.port} {host_pub(replacement)}",
            f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}",
        ]
    )
    again = fab_status(sshd_server, ports, "--known-hosts", str(kh), "--json")
    assert again.returncode == 0
    assert {h["host_key"]["status"] for h in again.doc["hosts"]} == {"matched"}

    # The flag is for a node someone replaced: naming a host that is not in the run is an error.
    typo = fab_status(sshd_server, ports, "--known-hosts", str(kh), "--accept-new-host-key", "x")
    assert typo.returncode == 2
    assert "--accept-new-host-key x names no host of this run" in typo.stderr


@pytest.mark.slow
def test_the_commands_the_mismatch_message_gives_do_forget_the_old_key(
    sshd_server: SshServer, replacement: SshServer, address: Forwarder, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    assert fab_status(sshd_server, [address.port], "--known-hosts", str(kh)).returncode == 0
    address.target_port = replacement.port
    refused = fab_status(sshd_server, [address.port], "--known-hosts", str(kh), "--json")
    message = str(refused.host()["error"])
    keygen = message.split("(or `", 1)[1].split("`", 1)[0]
    assert keygen.startswith("ssh-keygen -R ")
    subprocess.run(shlex.split(keygen), check=True, capture_output=True)
    assert kh.read_text() == ""
    rerecorded = fab_status(sshd_server, [address.port], "--known-hosts", str(kh), "--json")
    assert rerecorded.host()["host_key"]["status"] == "recorded"
    assert kh.read_text() == f"[127.0.0.1]:{address.port} {host_pub(replacement)}\n"

    fab = message.split("forget the old key with `", 1)[1].split("`", 1)[0]
    args = shlex.split(fab)
    assert args[0] == "fab"
    forgot = run_fab(*args[1:])
    assert forgot.returncode == 0, forgot.stderr
    assert f"forgot {keygen_fingerprint(replacement)} (ssh-ed25519) from {kh}" in forgot.stdout
    assert kh.read_text() == ""


def test_openssh_reads_the_file_and_refuses_a_replaced_host_too(
    sshd_server: SshServer, replacement: SshServer, address: Forwarder, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    assert fab_status(sshd_server, [address.port], "--known-hosts", str(kh)).returncode == 0

    def ssh() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "ssh",
                "-F",
                "/dev/null",
                "-o",
                f"UserKnownHostsFile={kh}",
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-i",
                str(sshd_server.key_path),
                "-p",
                str(address.port),
                f"{sshd_server.user}@127.0.0.1",
                "echo pinned-ok",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    ok = ssh()
    assert ok.returncode == 0 and ok.stdout.strip() == "pinned-ok", ok.stderr
    address.target_port = replacement.port
    refused = ssh()
    assert refused.returncode != 0
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr


def test_host_keys_in_the_stack_outputs_are_pinned_before_the_first_connection(
    sshd_server: SshServer, replacement: SshServer, tmp_path: Path
) -> None:
    inventory = tmp_path / "hosts.json"
    nodes = sshd_server.inventory()["nodes"]
    nodes[0]["host_keys"] = [str(host_pub(sshd_server))]
    inventory.write_text(json.dumps(sshd_server.inventory(nodes=nodes)))
    pinned = run_fab("status", "--inventory", str(inventory), "--json")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    key = pinned.host()["host_key"]
    assert (key["status"], key["origin"]) == ("pinned", "stack outputs")
    # No --known-hosts: the stack's own file under the (test) home, 0600 in a 0700 directory.
    kh = Path.home() / ".config/gpufleet/known_hosts/local-test"
    assert key["known_hosts"] == str(kh)
    assert kh.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}\n"
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600
    assert stat.S_IMODE(kh.parent.stat().st_mode) == 0o700

    # Outputs that name another key: refused on the very first connection, nothing recorded.
    nodes[0]["host_keys"] = [str(host_pub(replacement))]
    inventory.write_text(json.dumps(sshd_server.inventory(nodes=nodes)))
    other = tmp_path / "other_known_hosts"
    refused = run_fab(
        "status", "--inventory", str(inventory), "--known-hosts", str(other), "--json"
    )
    assert refused.returncode == 1
    assert refused.host()["status"] == "host-key-mismatch"
    assert "from the stack outputs, pinned" in str(refused.host()["error"])
    assert other.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(replacement)}\n"


def test_two_threads_meeting_a_new_host_at_once_record_it_once(
    sshd_server: SshServer, tmp_path: Path
) -> None:
    @step("noop")
    def noop(conn: Connection, ctx: HostContext) -> StepResult:
        return StepResult.ok("connected")

    hosts = [
        Host(
            "127.0.0.1",
            user=sshd_server.user,
            port=sshd_server.port,
            name=f"n{i}",
            key_filename=str(sshd_server.key_path),
        )
        for i in range(4)
    ]
    kh = tmp_path / "known_hosts"
    report = run_fleet(
        "noop",
        hosts,
        [noop],
        lambda h: HostContext(host=h),
        host_keys=resolve_settings(stack=None, known_hosts=str(kh)),
    )
    assert [h.status for h in report.hosts] == ["ok"] * 4, [
        h.connection_message for h in report.hosts
    ]
    statuses = sorted(h.host_key.status for h in report.hosts if h.host_key)
    assert statuses == ["matched", "matched", "matched", "recorded"]
    assert kh.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}\n"
