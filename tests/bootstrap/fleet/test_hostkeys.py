"""Host-key pinning without a network: keys, known_hosts lines, the file, the task options."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap import ns
from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.hostkeys import (
    Entry,
    HostKeyError,
    HostKeyEvent,
    HostKeyFileError,
    KnownHostsFile,
    PublicKey,
    add_key,
    entry_for,
    fingerprint,
    forget_host,
    host_alias,
    keys_for,
    known_hosts_path,
    mismatch_message,
    parse_known_hosts,
    render_known_hosts,
    replace_keys,
    resolve_settings,
    selector_matches,
    stack_file_name,
    unmatched_selectors,
)
from bootstrap.fleet.hosts import HostDiscoveryError, parse_stack_outputs
from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord, classify_connect_error
from bootstrap.fleet.runner import summary_table as table_of

# Made with ssh-keygen (OpenSSH 9.2); the fingerprints are what `ssh-keygen -lf` printed.
A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB5Jfak8MxB2v2gVpyjzNtto5ihN8k4li1vhXMnKdEnj node-a"
A_FP = "SHA256:KVSqgumQYI+s5VKBhbbbHkK6Nka/zbl0bZitv8Ufxwg"
B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILcBNtj/ddsEBbz3kDZnE3cjdfI7JNUuRYc9M0jGJv/l node-b"
B_FP = "SHA256:VvmmHkOe39j9NiP5NJ0JlFcn1ABMgyMvYAKMoQ/eVNk"
C = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBG4z5tSu3t/FbSFn1R4V"
    "3TMPSz7pNxknsStrYlBbseQbrOPiwTi8bdpyWIDdyv1Wy46APQDR/xulZpfSBj937lU= node-c"
)
C_FP = "SHA256:Tj4oqgN+n7L96FggIW0CFmnzXr8yUUeG4r9wDQeITd0"
# `ssh-keygen -H` of "[10.0.0.7]:2222 <A>"
A_HASHED = "|1|ByIha6gyx3pQE/TiQDY+RdMxrtk=|FNkyJKUZlVMsmFW5HUPzzhrfOBM= " + " ".join(A.split()[:2])

KEY_A, KEY_B, KEY_C = PublicKey.parse(A), PublicKey.parse(B), PublicKey.parse(C)


def test_fingerprints_are_the_ones_ssh_keygen_prints() -> None:
    assert KEY_A.fingerprint == A_FP
    assert KEY_C.fingerprint == C_FP
    assert fingerprint(KEY_B.blob) == B_FP


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ssh-ed25519", "expected 'TYPE BASE64"),
        ("ssh-ed25519 not*base64", "not valid base64"),
        ("ssh-rsa " + A.split()[1], "holds a 'ssh-ed25519'"),
        ("ssh-ed25519 AAAA", "truncated"),
    ],
)
def test_malformed_public_keys_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        PublicKey.parse(text)


def test_hosts_are_filed_the_way_openssh_looks_them_up() -> None:
    assert host_alias("10.0.0.7", 22) == "10.0.0.7"
    assert host_alias("10.0.0.7", 2222) == "[10.0.0.7]:2222"
    assert host_alias("Node-1.Example.COM", 22) == "node-1.example.com"
    assert host_alias("::1", 2222) == "[::1]:2222"


def test_hashed_entries_match_their_host_and_no_other() -> None:
    entries = parse_known_hosts(A_HASHED + "\n")
    assert keys_for(entries, "[10.0.0.7]:2222") == [KEY_A]
    assert keys_for(entries, "[10.0.0.7]:2223") == []
    assert keys_for(entries, "10.0.0.7") == []


def test_rewriting_a_file_keeps_comments_markers_and_lines_it_cannot_read() -> None:
    text = "\n".join(
        [
            "# pinned by hand",
            "",
            f"10.0.0.1,10.0.0.2 {A}",
            f"@cert-authority *.example.com {C}",
            "10.0.0.3 ssh-ed25519 garbage!!",
            f"[10.0.0.4]:2222 {B}",
        ]
    )
    entries = parse_known_hosts(text)
    assert render_known_hosts(entries) == text + "\n"
    merged = add_key(entries, "10.0.0.9", KEY_C).entries
    assert render_known_hosts(merged) == text + "\n" + f"10.0.0.9 {C.rsplit(' ', 1)[0]}\n"
    # Marker lines and unreadable lines never pin anything.
    assert keys_for(entries, "*.example.com") == []
    assert keys_for(entries, "10.0.0.3") == []


def test_a_first_key_is_added_and_the_same_key_again_changes_nothing() -> None:
    first = add_key([], "[10.0.0.7]:2222", KEY_A)
    assert first.outcome == "added"
    assert render_known_hosts(first.entries) == f"[10.0.0.7]:2222 {KEY_A}\n"
    again = add_key(first.entries, "[10.0.0.7]:2222", KEY_A)
    assert again.outcome == "present" and again.entries == first.entries


def test_another_key_of_the_same_type_is_a_conflict_never_a_replacement() -> None:
    entries = add_key([], "10.0.0.7", KEY_A).entries
    clash = add_key(entries, "10.0.0.7", KEY_B)
    assert clash.outcome == "conflict"
    assert clash.existing == (KEY_A,)
    assert clash.entries == entries


def test_a_key_of_another_type_is_added_next_to_the_pinned_one() -> None:
    entries = add_key([], "10.0.0.7", KEY_A).entries
    both = add_key(entries, "10.0.0.7", KEY_C)
    assert both.outcome == "added"
    assert keys_for(both.entries, "10.0.0.7") == [KEY_A, KEY_C]


def test_a_revoked_key_is_never_a_pinned_key() -> None:
    entries = parse_known_hosts(f"10.0.0.7 {A}\n@revoked * {A}\n")
    assert keys_for(entries, "10.0.0.7") == []


def test_forgetting_a_host_keeps_the_other_names_on_a_shared_line() -> None:
    entries = parse_known_hosts(f"10.0.0.1,10.0.0.2 {A}\n{A_HASHED}\n10.0.0.3 {B}\n")
    kept, removed = forget_host(entries, "10.0.0.1")
    assert removed == [KEY_A]
    assert render_known_hosts(kept) == f"10.0.0.2 {A}\n{A_HASHED}\n10.0.0.3 {B}\n"
    kept, removed = forget_host(kept, "[10.0.0.7]:2222")
    assert removed == [KEY_A]
    assert render_known_hosts(kept) == f"10.0.0.2 {A}\n10.0.0.3 {B}\n"
    assert forget_host(kept, "10.0.0.99") == (kept, [])


def test_replacing_a_hosts_keys_drops_every_old_type() -> None:
    entries = parse_known_hosts(f"10.0.0.7 {A}\n10.0.0.7 {C}\n10.0.0.8 {A}\n")
    new, removed = replace_keys(entries, "10.0.0.7", [KEY_B])
    assert removed == [KEY_A, KEY_C]
    assert keys_for(new, "10.0.0.7") == [KEY_B]
    assert keys_for(new, "10.0.0.8") == [KEY_A]


@pytest.mark.parametrize(
    ("stack", "name"),
    [
        ("a100x8", "a100x8"),
        ("acme/gpufleet/a100x8", "acme_gpufleet_a100x8"),
        ("../../etc/passwd", "_.._etc_passwd"),
        (None, "default"),
        ("", "default"),
    ],
)
def test_each_stack_gets_its_own_file_name(stack: str | None, name: str) -> None:
    assert stack_file_name(stack) == name


def test_the_file_is_the_option_then_the_environment_then_one_per_stack() -> None:
    env = {"HOME": "/home/me"}
    assert known_hosts_path("a100x8", env=env) == (
        Path("/home/me/.config/gpufleet/known_hosts/a100x8"),
        "stack a100x8",
    )
    xdg = {**env, "XDG_CONFIG_HOME": "/cfg"}
    assert known_hosts_path(None, env=xdg)[0] == Path("/cfg/gpufleet/known_hosts/default")
    with_env = {**env, "GPUFLEET_KNOWN_HOSTS": "/etc/gpufleet/kh"}
    assert known_hosts_path("a100x8", env=with_env) == (
        Path("/etc/gpufleet/kh"),
        "$GPUFLEET_KNOWN_HOSTS",
    )
    assert known_hosts_path("a100x8", option="/x/kh", env=with_env) == (
        Path("/x/kh"),
        "--known-hosts",
    )


def test_accept_new_host_key_names_hosts_by_address_port_alias_or_node_name() -> None:
    host = Host("10.0.0.7", user="ubuntu", port=2222, name="a100x8-1")
    for selector in ("10.0.0.7", "10.0.0.7:2222", "[10.0.0.7]:2222", "a100x8-1", "u@10.0.0.7"):
        assert selector_matches(selector, host), selector
    assert not selector_matches("10.0.0.70", host)
    assert not selector_matches("a100x8-0", host)
    other = Host("10.0.0.8", name="a100x8-0")
    assert unmatched_selectors(["a100x8-1", "10.0.0.9"], [host, other]) == ["10.0.0.9"]
    settings = resolve_settings(stack="s", accept="a100x8-1, ", env={"HOME": "/h"})
    assert settings.accept == ("a100x8-1",)
    assert settings.accepts(host) and not settings.accepts(other)


def test_a_mismatch_message_gives_both_fingerprints_the_file_and_the_ways_out() -> None:
    host = Host("10.0.0.7", user="ubuntu", port=2222)
    message = mismatch_message(host, presented=KEY_B, expected=[KEY_A], path=Path("/k/known hosts"))
    assert f"expected {A_FP} (ssh-ed25519)" in message
    assert f"presented {B_FP} (ssh-ed25519)" in message
    assert "--accept-new-host-key 10.0.0.7:2222" in message
    assert "`fab -H ubuntu@10.0.0.7:2222 forget-host-key --known-hosts '/k/known hosts'`" in message
    assert "`ssh-keygen -R '[10.0.0.7]:2222' -f '/k/known hosts'`" in message


def test_host_key_problems_are_named_in_the_per_host_summary() -> None:
    host = Host("10.0.0.7")
    assert classify_connect_error(HostKeyError("HOST KEY MISMATCH ..."), host) == (
        "host-key-mismatch",
        "HOST KEY MISMATCH ...",
    )
    assert classify_connect_error(HostKeyFileError("bad mode"), host)[0] == "host-key-error"


def test_a_recorded_key_shows_in_the_summary_and_the_json(tmp_path: Path) -> None:
    event = HostKeyEvent("recorded", "10.0.0.7", KEY_A, tmp_path / "kh")
    where = tmp_path / "kh"
    assert event.message == (
        f"recorded host key {A_FP} (ssh-ed25519) for 10.0.0.7 in {where} (first connection)"
    )
    h = HostReport(
        Host("10.0.0.7"), steps=[StepRecord("s", StepResult.ok("fine"), 0.1)], host_key=event
    )
    report = FleetReport("status", [h], 1.0)
    console = Console(record=True, width=300)
    console.print(table_of(report))
    assert f"recorded host key {A_FP}" in console.export_text()
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["hosts"][0]["host_key"]["status"] == "recorded"
    assert doc["hosts"][0]["host_key"]["fingerprint"] == A_FP
    matched = HostKeyEvent("matched", "10.0.0.7", KEY_A, tmp_path / "kh")
    h.host_key = matched
    console = Console(record=True, width=300)
    console.print(table_of(report))
    assert "host-key" not in console.export_text()  # a matching key is not news


def test_a_mismatch_event_names_the_presented_and_the_pinned_key(tmp_path: Path) -> None:
    event = HostKeyEvent("mismatch", "10.0.0.7", KEY_B, tmp_path / "kh", (KEY_A,))
    assert event.message == (
        f"host key {B_FP} (ssh-ed25519) for 10.0.0.7 does not match "
        f"{A_FP} (ssh-ed25519) pinned in {tmp_path / 'kh'}"
    )
    assert not event.noteworthy  # the host's error already says it, at length
    assert event.to_json()["previous"] == [A_FP]


def test_the_file_is_written_0600_in_a_0700_directory(tmp_path: Path) -> None:
    store = KnownHostsFile(tmp_path / "gpufleet" / "known_hosts" / "a100x8")
    result = store.update(lambda entries: (add_key(entries, "10.0.0.7", KEY_A).entries, "done"))
    assert result == "done"
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert store.path.read_text() == f"10.0.0.7 {KEY_A}\n"
    assert [p.name for p in store.path.parent.iterdir() if not p.name.startswith(".")] == ["a100x8"]


def test_a_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    path.write_text(f"10.0.0.7 {A}\n")
    path.chmod(0o666)
    with pytest.raises(HostKeyFileError, match=r"writable by other users \(mode 0666\).*chmod 600"):
        KnownHostsFile(path).read()


def test_writes_go_through_a_symlink_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_text(f"10.0.0.1 {A}\n")
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    KnownHostsFile(link).update(lambda e: (add_key(e, "10.0.0.2", KEY_B).entries, None))
    assert link.is_symlink()
    assert target.read_text() == f"10.0.0.1 {A}\n10.0.0.2 {KEY_B}\n"


def test_concurrent_updates_from_many_threads_all_land(tmp_path: Path) -> None:
    store = KnownHostsFile(tmp_path / "kh")
    start = threading.Barrier(16)

    def pin(i: int) -> None:
        start.wait()
        store.update(lambda e: (add_key(e, f"10.0.0.{i}", KEY_A).entries, None))

    threads = [threading.Thread(target=pin, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = parse_known_hosts(store.path.read_text())
    assert sorted(e.patterns[0] for e in entries) == sorted(f"10.0.0.{i}" for i in range(16))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".kh.new.")]  # no temp files left


def test_stack_outputs_may_carry_host_keys_per_node() -> None:
    outputs = {
        "stack": "a100x8",
        "ssh_user": "ubuntu",
        "nodes": [
            {
                "name": "a100x8-0",
                "role": "head",
                "public_ip": "1.2.3.4",
                "private_ip": "10.0.1.5",
                "host_keys": [A, C],
            },
            {"name": "a100x8-1", "role": "worker", "public_ip": "1.2.3.5"},
        ],
    }
    fleet = parse_stack_outputs(outputs)
    assert fleet.host_keys == {"1.2.3.4": (KEY_A, KEY_C), "10.0.1.5": (KEY_A, KEY_C)}
    settings = resolve_settings(stack=fleet.stack, stack_keys=fleet.host_keys, env={"HOME": "/h"})
    assert settings.keys_from_stack(fleet.hosts[0]) == (KEY_A, KEY_C)
    assert settings.keys_from_stack(fleet.hosts[1]) == ()


@pytest.mark.parametrize(
    ("host_keys", "error"),
    [
        ("ssh-ed25519 AAAA", r"nodes\[0\]\.host_keys: expected a list"),
        ([42], r"nodes\[0\]\.host_keys\[0\]: expected a 'TYPE BASE64' string"),
        ([A, "ssh-rsa " + A.split()[1]], r"nodes\[0\]\.host_keys\[1\]: key labelled 'ssh-rsa'"),
    ],
)
def test_bad_host_keys_in_the_stack_outputs_are_named(host_keys: object, error: str) -> None:
    outputs = {"nodes": [{"public_ip": "1.2.3.4", "host_keys": host_keys}]}
    with pytest.raises(HostDiscoveryError, match=error):
        parse_stack_outputs(outputs)


def test_every_fleet_task_that_connects_takes_the_host_key_options() -> None:
    connecting = {n: t for n, t in ns.tasks.items() if n not in ("forget-host-key", "host-keys")}
    assert {"setup", "status", "install-driver", "verify-gpu"} <= set(connecting)
    for name, t in connecting.items():
        options = {a.name for a in t.get_arguments()}
        assert {"known_hosts", "accept_new_host_key"} <= options, name


def test_a_task_cannot_declare_the_host_key_options_twice() -> None:
    from bootstrap.fleet.cli import fleet_task

    def clashing(c: object, fleet_args: object, known_hosts: str = "") -> None:
        del c, fleet_args, known_hosts

    with pytest.raises(TypeError, match="adds known_hosts itself"):
        fleet_task()(clashing)


def test_entries_compare_by_content() -> None:
    assert entry_for("10.0.0.7", KEY_A) == Entry(f"10.0.0.7 {KEY_A}", None, ("10.0.0.7",), KEY_A)
