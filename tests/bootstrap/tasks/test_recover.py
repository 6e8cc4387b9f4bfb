"""``fab recover`` without a node to reach: what it targets and what it refuses.

The engine is tests/bootstrap/tasks/recover_fakes.py's FakeStack over the real URNs of the
h100x8x2 stack (two nodes); "answers SSH" is a loopback port that sends an SSH
identification line, "gone" a closed loopback port plus a cloud that deleted the instance.
fab runs in this process (fabric's own main), with the engine and the record replaced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.tasks import recover
from tests.bootstrap.conftest import REPO
from tests.bootstrap.tasks.recover_fakes import (
    FakeStack,
    closed_port,
    instance_urn,
    outputs,
    ssh_banner,
    stack_state,
)

STACK = "h100x8x2"
LOST = f"{STACK}-1"


def fab(
    argv: list[str],
    engine: FakeStack,
    record: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str, str]:
    """``fab recover ARGV`` in this process: (exit status, stdout, stderr)."""
    import fabric.main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(recover, "make_engine", lambda stack: engine)
    monkeypatch.setattr(recover, "log_file", lambda stack: record)
    code: object = 0
    try:
        fabric.main.program.run(["fab", "recover", *argv])
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    # a line continued past 80 columns goes on indented two spaces: read each whole
    return int(code), out.replace("\n  ", " "), err.replace("\n  ", " ")  # type: ignore[call-overload]


def engine(head_port: int, lost_port: int, *, deleted: bool = True) -> FakeStack:
    before = outputs(STACK, [("127.0.0.1", head_port), ("127.0.0.1", lost_port)])
    after = outputs(STACK, [("127.0.0.1", head_port), ("127.0.0.1", closed_port())])
    gone = {instance_urn(STACK, LOST)} if deleted else set()
    return FakeStack(stack_state(STACK), before, after, gone)


def test_the_node_target_is_that_node_alone_and_its_instance() -> None:
    state = stack_state(STACK)
    urn = instance_urn(STACK, LOST)
    target = recover.node_target(state, LOST, urn)
    assert target.in_state and urn in target.urns
    names = {recover.urn_name(u) for u in target.urns}
    # the node, its instance, EIP, launch template, profile, role and policies: all its own
    assert all(n.startswith(LOST) for n in names), names
    assert len(target.urns) == 8
    others = {r["urn"] for r in state} - set(target.urns)
    assert any(u.endswith(f"::{STACK}-bucket") for u in others)
    assert any(u.endswith(f"::{STACK}-0") for u in others)


def test_a_gone_node_is_refreshed_and_updated_alone_then_waited_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with ssh_banner() as head:
        fake = engine(head, closed_port())
        code, out, err = fab(
            ["--stack", STACK, "--ssh-wait", "1", "--connect-timeout", "1"],
            fake, tmp_path / "r.jsonl", capsys, monkeypatch,
        )  # fmt: skip
    target = recover.node_target(stack_state(STACK), LOST, instance_urn(STACK, LOST))
    # asked about the lost node's instance only; refreshed and updated its URNs only
    assert ("preview_refresh", (instance_urn(STACK, LOST),)) in fake.calls
    assert fake.changed() == [("refresh", target.urns), ("update", target.urns)]
    assert ("preview", target.urns) in fake.calls
    # nothing of the head, the bucket or the network was named
    named = {u for _, urns in fake.calls for u in urns}
    assert named <= set(target.urns)
    # the instance was made again; the dashboard that names it is updated in place
    assert instance_urn(STACK, LOST) in {r["urn"] for r in fake.state}
    lines = out.splitlines()
    assert lines[0].startswith(f"check {LOST}: gone: no SSH at 127.0.0.1:")
    assert lines[1].startswith(f"refresh {LOST}: 8 URN(s) of this node refreshed; 1 left")
    assert lines[2].startswith(f"update {LOST}: 8 URN(s) targeted: 1 create, 1 update")
    assert all(line.rstrip().endswith(" s)") for line in lines[:3])
    # the new address never answered (a closed port): bounded, one line, exit 1
    assert code == 1
    assert "no SSH at 127.0.0.1:" in err and "within 1 s" in err and "Traceback" not in err
    rows = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["check", "refresh", "update", "ssh"]
    assert rows[-1]["replaced"] and not rows[-1]["finished"]


def test_a_second_run_after_the_update_goes_on_from_the_ssh_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "r.jsonl"
    with ssh_banner() as head:
        fake = engine(head, closed_port())
        argv = ["--stack", STACK, "--ssh-wait", "1", "--connect-timeout", "1"]
        first, _, _ = fab(argv, fake, record, capsys, monkeypatch)
        fake.calls.clear()
        second, out, err = fab(argv, fake, record, capsys, monkeypatch)
    assert (first, second) == (1, 1)
    assert "replaced by an earlier recover" in out and "going on from the SSH wait" in out
    assert fake.changed() == []  # not replaced twice
    assert "within 1 s" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--node", "h100x8x2-7"], "--node h100x8x2-7: no such node in the stack"),
        (["--node", "5"], "--node 5: no such node in the stack"),
        (["--ssh-wait", "-1"], "--ssh-wait"),
        (["--ssh-wait", "soon"], "--ssh-wait"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_anything_changes(
    argv: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = engine(closed_port(), closed_port())
    code, _out, err = fab(
        ["--stack", STACK, *argv], fake, tmp_path / "r.jsonl", capsys, monkeypatch
    )
    assert code == 2
    assert says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert fake.changed() == [] and not (tmp_path / "r.jsonl").exists()


def test_an_unknown_or_missing_stack_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine(closed_port(), closed_port())
    code, _, err = fab(["--stack", "nope"], fake, tmp_path / "r.jsonl", capsys, monkeypatch)
    assert code == 2 and "gpufleet: recover: --stack:" in err and "nope" in err
    code, _, err = fab([], fake, tmp_path / "r.jsonl", capsys, monkeypatch)
    assert code == 2 and "--stack STACK" in err
    assert fake.calls == []


def test_a_node_that_answers_ssh_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with ssh_banner() as port:
        fake = engine(closed_port(), port)
        code, out, err = fab(
            ["--stack", STACK, "--node", LOST], fake, tmp_path / "r.jsonl", capsys, monkeypatch
        )
    assert code == 1
    assert f"{LOST} answers SSH at 127.0.0.1:{port}: not gone" in err
    assert fake.changed() == [] and ("preview_refresh", (instance_urn(STACK, LOST),)) not in (
        fake.calls
    )
    assert out == ""


def test_a_silent_node_whose_instance_the_cloud_still_has_is_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine(closed_port(), closed_port(), deleted=False)
    code, _, err = fab(
        ["--stack", STACK, "--node", "1", "--connect-timeout", "1"],
        fake, tmp_path / "r.jsonl", capsys, monkeypatch,
    )  # fmt: skip
    assert code == 1
    assert "the cloud still has its instance" in err
    assert ("preview_refresh", (instance_urn(STACK, LOST),)) in fake.calls
    assert fake.changed() == []


def test_no_gone_node_is_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with ssh_banner() as port:
        fake = engine(port, port)
        code, out, _err = fab(["--stack", STACK], fake, tmp_path / "r.jsonl", capsys, monkeypatch)
    assert code == 0
    assert "no node of stack h100x8x2 is gone: nothing to recover" in out
    assert fake.changed() == []


def test_an_update_that_would_delete_anything_is_not_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = engine(closed_port(), closed_port())
    monkeypatch.setattr(fake, "preview_only", lambda urns: {"create": 1, "delete": 1})
    code, out, _err = fab(
        ["--stack", STACK, "--connect-timeout", "1"], fake, tmp_path / "r.jsonl", capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 1
    assert "refused: the update would 1 delete" in out
    assert [c[0] for c in fake.changed()] == ["refresh"]  # the refresh only: no update


def test_a_failed_update_is_said_in_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine(closed_port(), closed_port())
    # the provider's error as the Automation API's CommandError text ends it
    fake.fail_update = (
        "code: 255\n stdout: ...\n    error: creating EC2 Instance: InsufficientInstanceCapacity"
    )
    code, out, err = fab(
        ["--stack", STACK, "--connect-timeout", "1"], fake, tmp_path / "r.jsonl", capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 1
    assert "update h100x8x2-1: failed: error: creating EC2 Instance" in out
    assert "the update failed" in err and "Traceback" not in err


def test_only_live_jobs_that_name_the_node_wait_for_it() -> None:
    from types import SimpleNamespace

    nodes = [{"name": f"{STACK}-0"}, {"name": LOST}]
    rows = [
        SimpleNamespace(job="a", state="running", spec={"nodes": nodes}),
        SimpleNamespace(job="b", state="starting", spec={"nodes": nodes}),
        SimpleNamespace(job="c", state="succeeded", spec={"nodes": nodes}),
        SimpleNamespace(job="d", state="interrupted", spec={"nodes": nodes}),
        SimpleNamespace(job="e", state="running", spec={"nodes": nodes[:1]}),
    ]
    found = recover.waiting_jobs(rows, LOST)
    assert [(r.job, rank) for r, rank in found] == [("a", 1), ("b", 1)]


def test_two_gone_nodes_are_recovered_one_at_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine(closed_port(), closed_port())
    fake.deleted.add(instance_urn(STACK, f"{STACK}-0"))
    code, _, err = fab(
        ["--stack", STACK, "--connect-timeout", "1"], fake, tmp_path / "r.jsonl", capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 1
    assert "2 nodes are gone (h100x8x2-0, h100x8x2-1): recover one at a time" in err
    assert fake.changed() == []


def test_a_replaced_head_of_a_multi_node_job_is_not_rejoined_alone() -> None:
    from bootstrap.fleet.api import Host

    spec = {"job": "j1", "nnodes": 2, "nodes": [{"name": f"{STACK}-0"}, {"name": LOST}]}
    host = Host("127.0.0.1", port=closed_port(), name=f"{STACK}-0")
    said = recover._rejoin_one(None, None, host, spec, 0, None)  # type: ignore[arg-type]
    assert said.startswith("not rejoined: its head was replaced")
    assert "`fab train --resume j1` restarts every node" in said
