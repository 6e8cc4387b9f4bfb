"""Host discovery: stack outputs, inventory files, -H strings, and what happens without pulumi."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bootstrap.fleet.api import Host
from bootstrap.fleet.hosts import (
    HostDiscoveryError,
    discover,
    parse_host_string,
    parse_stack_outputs,
)
from tests.bootstrap.stack_outputs import HEAD, p4d_outputs


def outputs(**overrides: Any) -> dict[str, Any]:
    worker = {
        "name": "a100x8-1",
        "role": "worker",
        "instance_id": "i-0b",
        "public_ip": "3.4.5.6",
        "private_ip": "10.0.1.6",
    }
    defaults: dict[str, Any] = {
        "nodes": [worker, dict(HEAD)],
        "idle": {"idle_minutes": 15, "ttl_hours": 12},
        "hourly_cost": {"currency": "USD", "billing": "on-demand", "amount": 21.958},
    }
    return p4d_outputs(**{**defaults, **overrides})


def test_stack_outputs_give_hosts_user_tier_and_scratch_head_first() -> None:
    fleet = parse_stack_outputs(outputs())
    assert [h.name for h in fleet.hosts] == ["a100x8-0", "a100x8-1"]
    assert fleet.hosts[0] == Host("1.2.3.4", user="ubuntu", port=22, name="a100x8-0", role="head")
    assert fleet.tier.nvswitch and fleet.tier.gpu_model == "A100-40GB"
    assert fleet.scratch.devices == 8 and fleet.scratch.path == "/scratch"


def test_the_fabric_flags_of_the_tier_output_are_read_and_checked() -> None:
    fleet = parse_stack_outputs(outputs())
    assert (fleet.tier.efa, fleet.tier.infiniband) == (True, False)
    nd = outputs(tier={"name": "h100x8", "infiniband": True, "infiniband_gbps": 3200})
    assert parse_stack_outputs(nd).tier.infiniband is True
    with pytest.raises(HostDiscoveryError, match=r"tier.infiniband: expected true or false"):
        parse_stack_outputs(outputs(tier={"name": "h100x8", "infiniband": "yes"}))


def test_inventory_extras_set_port_key_and_per_node_host() -> None:
    data = outputs(ssh_port=2222, ssh_key="/keys/id")
    data["nodes"][0]["host"] = "bastion-fwd.example"
    data["nodes"][0]["ssh_port"] = 2200
    fleet = parse_stack_outputs(data)
    worker = next(h for h in fleet.hosts if h.role == "worker")
    head = next(h for h in fleet.hosts if h.role == "head")
    assert (worker.address, worker.port, worker.key_filename) == (
        "bastion-fwd.example",
        2200,
        "/keys/id",
    )
    assert (head.address, head.port) == ("1.2.3.4", 2222)


def test_private_ip_is_used_when_a_node_has_no_public_ip() -> None:
    data = outputs()
    data["nodes"][0]["public_ip"] = None
    fleet = parse_stack_outputs(data)
    assert any(h.address == "10.0.1.6" for h in fleet.hosts)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("nodes"), "missing 'nodes'"),
        (lambda d: d.update(nodes=[]), "is the stack deployed"),
        (lambda d: d.update(ssh_port="ssh"), "port must be an integer"),
        (lambda d: d.update(ssh_port=70000), "outside 1-65535"),
        (lambda d: d["nodes"][0].update(public_ip=None, private_ip=None), "no address"),
        (lambda d: d.update(scratch={"kind": "ramdisk"}), "not one of 'nvme', 'disk'"),
    ],
)
def test_malformed_outputs_name_the_field(mutate: Any, message: str) -> None:
    data = outputs()
    mutate(data)
    with pytest.raises(HostDiscoveryError, match=message):
        parse_stack_outputs(data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.2.3.4", Host("1.2.3.4", user="ubuntu")),
        ("root@node", Host("node", user="root")),
        ("me@127.0.0.1:2222", Host("127.0.0.1", user="me", port=2222)),
        ("[::1]:2200", Host("::1", user="ubuntu", port=2200)),
        ("fe80::1", Host("fe80::1", user="ubuntu")),
    ],
)
def test_host_strings_like_fab_dash_h(text: str, expected: Host) -> None:
    assert parse_host_string(text, default_user="ubuntu") == expected


@pytest.mark.parametrize("bad", ["", "@host", "host:port", "[::1", "host:0"])
def test_bad_host_strings_are_rejected(bad: str) -> None:
    with pytest.raises(HostDiscoveryError):
        parse_host_string(bad)


def test_cli_hosts_override_the_inventory_but_keep_its_metadata(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps(outputs()))
    fleet = discover(cli_hosts=["10.9.9.9:2022"], inventory=str(inv), env={})
    assert fleet.hosts == (Host("10.9.9.9", user="ubuntu", port=2022),)
    assert fleet.scratch.devices == 8


def test_inventory_from_the_environment_variable(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps(outputs()))
    fleet = discover(env={"GPUFLEET_INVENTORY": str(inv)}, key_filename="/k")
    assert len(fleet.hosts) == 2
    assert all(h.key_filename == "/k" for h in fleet.hosts)


def test_missing_pulumi_cli_says_so_and_suggests_inventory_or_dash_h(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(HostDiscoveryError) as exc:
        discover(stack="a100x8", env={})
    assert "pulumi CLI is not installed" in str(exc.value)
    assert "--inventory" in str(exc.value) and "-H" in str(exc.value)


def test_dash_h_never_needs_pulumi_even_with_pulumi_stack_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    fleet = discover(cli_hosts=["me@h"], env={"PULUMI_STACK": "a100x8"})
    assert fleet.hosts == (Host("h", user="me"),)


def test_pulumi_stack_output_is_read_from_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in `pulumi` executable that prints what the real one prints for
    # `pulumi stack output --json --stack a100x8`, and records its arguments.
    fake = tmp_path / "pulumi"
    args_file = tmp_path / "args"
    out_file = tmp_path / "out.json"
    out_file.write_text(json.dumps(outputs()))
    fake.write_text(f'#!/bin/sh\necho "$@" > {args_file}\n/bin/cat {out_file}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    fleet = discover(env={"PULUMI_STACK": "a100x8"})
    assert args_file.read_text().split() == ["stack", "output", "--json", "--stack", "a100x8"]
    assert fleet.stack == "a100x8" and len(fleet.hosts) == 2


def test_a_failing_pulumi_explains_how_to_select_a_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "pulumi"
    fake.write_text("#!/bin/sh\necho 'error: no stack selected' >&2\nexit 255\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostDiscoveryError, match=r"no stack selected.*--stack"):
        discover(env={})
