"""The pure parts of `fab start` / `fab stop`: which instance each host is, where a started
node answers now, its pinned host keys following it there, and the bounded waits."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.hostkeys import KnownHostsFile, PublicKey, host_alias, keys_for
from bootstrap.fleet.hosts import parse_stack_outputs
from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord
from bootstrap.tasks.power import (
    Target,
    carry_host_keys,
    moved_host,
    node_lines,
    targets,
    unsettled,
    wait_for_ssh,
    wait_for_states,
)
from infra.clouds.power import NodePower
from infra.reaper.core import Instance
from tests.bootstrap.stack_outputs import p4d_outputs


def new_key() -> PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    public = ed25519.Ed25519PrivateKey.generate().public_key()
    line = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return PublicKey.parse(line.decode())


KEY = new_key()


def node(state: str, public: str | None = None) -> NodePower:
    inst = Instance("i-0a", state, "p4d.24xlarge", datetime(2026, 12, 1, tzinfo=UTC), {})
    return NodePower(inst, public_ip=public, private_ip="10.0.1.5")


def test_each_host_is_matched_to_its_instance_id_by_node_name() -> None:
    fleet = parse_stack_outputs(p4d_outputs())
    (t,) = targets(fleet)
    assert (t.host.address, t.instance_id, t.via) == ("1.2.3.4", "i-0a", "public_ip")


def test_a_host_without_an_instance_id_is_a_usage_error() -> None:
    outputs = p4d_outputs(nodes=[{"name": "n", "public_ip": "1.2.3.4"}])
    with pytest.raises(Exit) as caught:
        targets(parse_stack_outputs(outputs))
    assert caught.value.code == 2 and "no instance_id" in str(caught.value.message)


def test_a_started_node_is_reached_at_the_address_the_cloud_gives_it_now() -> None:
    host = Host("1.2.3.4", "ubuntu", name="a100x8-0")
    moved = moved_host(Target(host, "i-0a", "public_ip"), node("running", "5.6.7.8"))
    assert moved.address == "5.6.7.8" and moved.name == "a100x8-0"
    # A static address (None), the same one, the inventory's own host or -H: unchanged,
    # never the private address of a node reached by its public one.
    for via, public in (("public_ip", None), ("public_ip", "1.2.3.4"), ("host", "5.6.7.8")):
        assert moved_host(Target(host, "i-0a", via), node("running", public)) == host
    assert moved_host(Target(host, "i-0a", ""), node("running", "5.6.7.8")) == host
    inside = Host("10.0.9.9")
    assert moved_host(Target(inside, "i-0a", "private_ip"), node("running")).address == "10.0.1.5"


def test_the_nodes_pinned_keys_follow_it_to_its_new_address(tmp_path: Path) -> None:
    store = KnownHostsFile(tmp_path / "known_hosts")
    old, new = Host("1.2.3.4"), Host("5.6.7.8")
    stale = new_key()  # another machine's, pinned when it had that address
    store.update(lambda e: _pin(e, host_alias("1.2.3.4", 22), KEY))
    store.update(lambda e: _pin(e, host_alias("5.6.7.8", 22), stale))

    note = carry_host_keys(store, old, new)

    assert note == "1 host key(s) of 1.2.3.4 now pinned for 5.6.7.8 too"
    entries = store.read()
    assert keys_for(entries, "5.6.7.8") == [KEY]  # the stale key of another machine is gone
    assert keys_for(entries, "1.2.3.4") == [KEY]
    assert carry_host_keys(store, old, old) == ""


def test_with_nothing_pinned_to_carry_a_stale_key_at_the_new_address_is_forgotten(
    tmp_path: Path,
) -> None:
    store = KnownHostsFile(tmp_path / "known_hosts")
    store.update(lambda e: _pin(e, host_alias("5.6.7.8", 22), new_key()))
    note = carry_host_keys(store, Host("1.2.3.4"), Host("5.6.7.8"))
    assert note == "no key pinned for 1.2.3.4: the first connection to 5.6.7.8 records one"
    assert keys_for(store.read(), "5.6.7.8") == []


def _pin(entries: list, alias: str, key: PublicKey) -> tuple[list, None]:  # type: ignore[type-arg]
    from bootstrap.fleet.hostkeys import replace_keys

    return replace_keys(entries, alias, [key])[0], None


class FakePower:
    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.reads = 0

    def describe(self, ids: list[str]) -> dict[str, NodePower]:
        state = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        return {i: node(state) for i in ids}


def test_waiting_for_a_state_ends_when_it_is_reached() -> None:
    power = FakePower(["pending", "pending", "running"])
    seen = wait_for_states(power, ["i-0a"], "running", 60, sleep=lambda _s: None)
    assert seen["i-0a"].state == "running" and power.reads == 3


def test_waiting_for_a_state_is_bounded_by_the_timeout() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    power = FakePower(["stopping"])
    seen = wait_for_states(power, ["i-0a"], "stopped", 10, sleep=sleep, clock=lambda: now[0])
    assert seen["i-0a"].state == "stopping" and power.reads == 5  # 0, 3, 6, 9, 12 s


def test_waiting_for_ssh_knocks_until_the_deadline_then_gives_up() -> None:
    now = [0.0]
    knocks: list[tuple[str, int]] = []

    def sleep(s: float) -> None:
        now[0] += s

    def knock(address: str, port: int) -> bool:
        knocks.append((address, port))
        return False

    host = Host("127.0.0.1", port=2222)
    assert not wait_for_ssh(host, 7.0, knock=knock, sleep=sleep, clock=lambda: now[0])
    assert knocks == [("127.0.0.1", 2222)] * 4  # 0, 3, 6, 9 s
    assert wait_for_ssh(host, 0.0, knock=lambda a, p: True, sleep=sleep, clock=lambda: 99.0)


def test_each_node_ends_with_one_line_what_the_cloud_did_or_what_failed() -> None:
    good, bad = Host("127.0.0.1", name="n-0"), Host("127.0.0.2", name="n-1")
    steps = [
        ("stop", StepResult.changed("i-0a stopped")),
        ("preflight", StepResult.ok("Debian")),
        ("save-scratch", StepResult.ok("saved")),
    ]
    report = FleetReport(
        "stop",
        [
            HostReport(good, steps=[StepRecord(n, r, 0.0) for n, r in steps]),
            HostReport(bad, steps=[StepRecord("save-scratch", StepResult.failed("no bucket"), 0)]),
        ],
        1.0,
    )
    assert list(node_lines(report)) == [
        "n-0 (127.0.0.1): i-0a stopped; save-scratch ok",
        "n-1 (127.0.0.2): FAILED: save-scratch: no bucket",
    ]


def test_a_stopped_or_still_allocated_node_starts_and_one_on_its_way_is_refused() -> None:
    for state in ("stopped", "stopped-allocated", "running"):
        assert unsettled("i-0a", state) is None
    assert (
        unsettled("i-0a", "stopping") == "instance i-0a is stopping: try again when it has settled"
    )
