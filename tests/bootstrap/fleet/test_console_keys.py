"""Host keys read from the EC2 console output are pinned before the first connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap.fleet.console_keys import parse_console_host_keys, with_console_host_keys
from bootstrap.fleet.hostkeys import PublicKey
from tests.bootstrap.conftest import run_fab
from tests.support.moto_server import moto_server
from tests.support.sshd import SshServer, require_sshd, start_sshd, stop_sshd

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK8gEXAMPLEKEYexampleKEYexampleKEYexampleKEYab"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQCexampleRSAkey"


def console(*keys: str, fingerprints: bool = True) -> str:
    """A first-boot serial console the way cloud-init writes it on Ubuntu."""
    lines = [
        "[    3.120341] cloud-init[612]: Cloud-init v. 24.1 running 'init' at Sun, 29 Nov 2026",
        "ci-info: ++++++++++++++++++++++++Net device info+++++++++++++++++++++++++",
    ]
    if fingerprints:
        lines += [
            "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
            "256 SHA256:Yk3kq3zHjvF2mJ0example root@ip-10-42-0-11 (ED25519)",
            "-----END SSH HOST KEY FINGERPRINTS-----",
        ]
    lines += ["-----BEGIN SSH HOST KEY KEYS-----"]
    lines += [f"{k} root@ip-10-42-0-11" for k in keys]
    lines += ["-----END SSH HOST KEY KEYS-----", "[   12.000001] cloud-init[940]: done"]
    return "\n".join(lines) + "\n"


def test_the_key_block_is_read_and_the_fingerprint_block_is_not():
    assert parse_console_host_keys(console(ED, RSA)) == (ED, RSA)


def test_the_last_complete_block_wins_and_a_half_printed_one_is_ignored():
    old = console(RSA)
    new = console(ED)
    truncated = "-----BEGIN SSH HOST KEY KEYS-----\nssh-rsa AAAAB3Nzaoops"
    assert parse_console_host_keys(old + new + truncated) == (ED,)
    assert parse_console_host_keys(truncated) == ()
    assert parse_console_host_keys("no keys here\n") == ()


def test_timestamp_prefixes_and_unknown_lines_are_handled():
    text = "-----BEGIN SSH HOST KEY KEYS-----\n[  9.1] " + ED + " c\nrandom noise\n"
    text += "-----END SSH HOST KEY KEYS-----\n"
    assert parse_console_host_keys(text) == (ED,)


def test_outputs_gain_host_keys_and_failures_fall_back_with_a_note():
    outputs = {
        "nodes": [
            {"name": "a-0", "instance_id": "i-1"},
            {"name": "a-1", "instance_id": "i-2", "host_keys": [RSA]},
            {"name": "a-2", "instance_id": "i-3"},
            {"name": "a-3", "instance_id": "i-4"},
        ]
    }

    def fetch(instance: str) -> str:
        if instance == "i-3":
            raise RuntimeError("UnauthorizedOperation: not allowed")
        return console(ED) if instance == "i-1" else "booting...\n"

    enriched, notes = with_console_host_keys(outputs, fetch)
    keys = [n.get("host_keys") for n in enriched["nodes"]]
    assert keys == [[ED], [RSA], None, None]
    assert any("a-0: 1 host key(s) pinned" in n for n in notes)
    assert any("a-2: console output unreadable (RuntimeError: Unauthorized" in n for n in notes)
    assert any("a-3: no host keys in the console output yet" in n for n in notes)
    assert "host_keys" not in outputs["nodes"][0]  # the input is left as it was


@pytest.fixture
def moto_ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_server(warm=("ec2",)) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", url)
        monkeypatch.setenv("GPUFLEET_CONSOLE_HOST_KEYS", "1")
        yield url


def launch(url: str) -> str:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
    answer = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    return str(answer["Instances"][0]["InstanceId"])


@pytest.fixture(scope="module")
def impostor() -> Iterator[SshServer]:
    require_sshd()
    server = start_sshd()
    try:
        yield server
    finally:
        stop_sshd(server)


def host_pub(server: SshServer) -> str:
    return str(PublicKey.parse((server.workdir / "ssh_host_ed25519_key.pub").read_text()))


@pytest.mark.integration
def test_fab_pins_the_console_keys_and_refuses_a_host_that_presents_another(
    sshd_server: SshServer,
    impostor: SshServer,
    moto_ec2: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import moto.ec2.responses.general as general

    instance = launch(moto_ec2)
    nodes = sshd_server.inventory()["nodes"]
    nodes[0]["instance_id"] = instance
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps(sshd_server.inventory(nodes=nodes)))

    # The console shows the real node's key: pinned before connecting, and the node matches.
    monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", console(host_pub(sshd_server)))
    known = tmp_path / "known_hosts"
    ok = run_fab("status", "--inventory", str(inventory), "--known-hosts", str(known), "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pinned from the console output" in ok.stderr
    assert ok.host()["host_key"]["status"] == "pinned"
    assert known.read_text() == f"[127.0.0.1]:{sshd_server.port} {host_pub(sshd_server)}\n"

    # The console names a key the host at that address does not have: refused at first contact.
    monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", console(host_pub(impostor)))
    fresh = tmp_path / "fresh_known_hosts"
    bad = run_fab("status", "--inventory", str(inventory), "--known-hosts", str(fresh), "--json")
    assert bad.returncode == 1
    assert bad.host()["status"] == "host-key-mismatch"
