"""``fab recover`` end to end: a real sshd on 127.0.0.1 is the new node.

The stack is h100x8x2's real URNs under the fake engine (recover_fakes.FakeStack): before
the update its node 1 is a closed loopback port (the deleted instance) and after it a
second sshd; node 0 is the session's sshd, holding a two-node job whose head waits for node
rank 1 (started as fab train starts it, its torchrun waiting in the rendezvous). recover
replaces node 1 alone, waits for SSH, runs fab setup and verify-gpu (--cpu) on it, and the
job's node rank 1 rejoins: the run ends succeeded on both nodes. A failing verdict (a
node python that cannot run verify) stops before the rejoin, and the run keeps waiting.
Both sshds are this machine, so both nodes share one disk, as tests/bootstrap/tasks/
test_train_ssh.py's do.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootstrap.tasks import recover
from tests.bootstrap.conftest import REPO, FabResult, node_dir
from tests.bootstrap.tasks.recover_fakes import (
    FakeStack,
    closed_port,
    instance_urn,
    outputs,
    stack_state,
)
from tests.bootstrap.tasks.test_train_ssh import stop_live_jobs
from tests.support.sshd import SshServer, free_port, start_sshd, stop_sshd

pytestmark = pytest.mark.integration

STACK = "h100x8x2"
LOST = f"{STACK}-1"
# Two gloo ranks, one per node, a few all_reduce steps: each says its step and the sum.
SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(5):
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print(f"step {step} rank {dist.get_rank()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def new_node(sshd_server: SshServer) -> Iterator[SshServer]:
    """The replacement instance: another sshd that takes the first one's client key."""
    server = start_sshd()
    auth = server.workdir / "authorized_keys"
    auth.write_text(auth.read_text() + Path(f"{sshd_server.key_path}.pub").read_text())
    try:
        yield server
    finally:
        stop_sshd(server)


@pytest.fixture
def place() -> Iterator[dict[str, Path]]:
    """Scratch, jobs, state and workdir folders the SSH user can write."""
    base = node_dir("gpufleet-recover-")
    paths = {k: base / k for k in ("scratch", "jobs", "state", "work")}
    for p in paths.values():
        p.mkdir()
        p.chmod(0o777)
    (paths["work"] / "tiny.py").write_text(SCRIPT)
    try:
        yield {"base": base, **paths}
    finally:
        stop_live_jobs(paths["jobs"])
        shutil.rmtree(base, ignore_errors=True)


def stack_outputs(head: SshServer, node1_port: int, place: dict[str, Path]) -> dict[str, Any]:
    """The stack's outputs with node 1 at ``node1_port``. No provider, region, bucket or
    tier: the idle watchdog (fab setup) installs only on a node whose bucket it can prove,
    and a tier's GPU count fails these GPU-less nodes' health, so setup and verify judge
    them as a plain -H host (watchdog skipped, a CPU run)."""
    data = outputs(
        STACK,
        [("127.0.0.1", head.port), ("127.0.0.1", node1_port)],
        ssh_user=head.user,
        ssh_key=str(head.key_path),
        scratch={"path": str(place["scratch"]), "kind": "nvme"},
    )
    del data["provider"], data["region"]
    return data


def waiting_job(head: SshServer, place: dict[str, Path], venv: Path, before: dict[str, Any]) -> str:
    """A two-node job started on node 0 only (as fab train starts a node), its torchrun
    waiting in the rendezvous for node rank 1."""
    from fabric import Config
    from invoke import Context

    from bootstrap.fleet.hosts import parse_stack_outputs
    from bootstrap.train.options import JobRef, TrainSend, WorkdirSync
    from bootstrap.train.runs import host_problems, run_steps
    from bootstrap.train.spec import job_spec, parse_request
    from bootstrap.train.steps import train_start_step
    from bootstrap.train.workdir import build_manifest, workdir_files

    req = parse_request(
        script="tiny.py", args="", workdir="", name="tiny", nproc_per_node=1, cpu=True,
        stop_when_done=False, venv=str(venv), jobs_dir=str(place["jobs"]), max_workdir_mb=10,
        sync_interval=60, node_env="", s3_endpoint="", master_port=0, detach="fork",
        cwd=place["work"],
    )  # fmt: skip
    fleet = parse_stack_outputs(before)
    now = dt.datetime.now(dt.UTC)
    spec = job_spec(
        req, fleet, job="tiny-recover", nproc=1, master_addr="127.0.0.1",
        master_port=free_port(), now=now,
    )  # fmt: skip
    local = place["work"]
    send = TrainSend(workdir=WorkdirSync(build_manifest(local, workdir_files(local), 1e7), local,
                                         spec["workdir"]))  # fmt: skip
    head_only = type(fleet)(**{**fleet.__dict__, "hosts": fleet.hosts[:1]})
    report = run_steps(
        Context(Config()), head_only, "train", [train_start_step],
        tasks=(JobRef(spec), send), console=None, connect_timeout=10,
    )  # fmt: skip
    assert not host_problems(report), host_problems(report)
    return str(spec["job"])


def state_of(place: dict[str, Path], job: str, rank: int) -> dict[str, Any] | None:
    path = place["jobs"] / job / f"node-{rank}" / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_recover(
    argv: list[str],
    engine: FakeStack,
    record: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str, str]:
    import fabric.main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(recover, "make_engine", lambda stack: engine)
    monkeypatch.setattr(recover, "log_file", lambda stack: record)
    monkeypatch.setenv("COLUMNS", "200")
    code: object = 0
    try:
        fabric.main.program.run(["fab", "recover", *argv])
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return int(code), out, err  # type: ignore[call-overload]


def recover_args(place: dict[str, Path], venv: Path, *extra: str) -> list[str]:
    return [
        "--stack", STACK, "--connect-timeout", "5", "--ssh-wait", "60",
        "--allow-no-gpu", "--torch-index", "default", "--venv", str(venv),
        "--no-watchdog-timer", "--no-dcgm", "--cpu", "--quick",
        "--state-dir", str(place["state"]), "--reports", str(place["base"] / "reports"),
        "--jobs-dir", str(place["jobs"]), *extra,
    ]  # fmt: skip


def stage_seconds(out: str) -> dict[str, float]:
    """Each stage line's seconds: '<stage> <node>: ... (<s> s)'."""
    found: dict[str, float] = {}
    for line in out.splitlines():
        if line.split(" ", 1)[0] in (
            "check",
            "refresh",
            "update",
            "ssh",
            "setup",
            "verify",
            "jobs",
            "rejoin",
            "done",
        ) and line.endswith(" s)"):
            found[line.split(" ", 1)[0]] = float(line.rsplit("(", 1)[1].split()[0])  # fmt: skip
    return found


@pytest.mark.slow
def test_a_deleted_node_is_replaced_set_up_verified_and_its_job_rejoins(
    sshd_server: SshServer,
    new_node: SshServer,
    node_venv: tuple[Path, FabResult],
    place: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout + installed.stderr
    before = stack_outputs(sshd_server, closed_port(), place)
    after = stack_outputs(sshd_server, new_node.port, place)
    fake = FakeStack(stack_state(STACK), before, after, {instance_urn(STACK, LOST)})
    job = waiting_job(sshd_server, place, venv, before)
    assert (state_of(place, job, 0) or {}).get("state") in ("starting", "running")
    started = time.monotonic()
    code, out, err = run_recover(
        recover_args(place, venv), fake, tmp_path / "r.jsonl", capsys, monkeypatch
    )
    took = time.monotonic() - started
    assert code == 0, out[-4000:] + err[-4000:]
    target = recover.node_target(stack_state(STACK), LOST, instance_urn(STACK, LOST))
    assert fake.changed() == [("refresh", target.urns), ("update", target.urns)]
    seconds = stage_seconds(out)
    for stage in ("check", "refresh", "update", "ssh", "setup", "verify", "jobs", "rejoin"):
        assert stage in seconds, (stage, out)
    assert "verify-gpu: CPU-ONLY" in out
    assert f"jobs {LOST}: waiting for this node: {job} (node rank 1)" in out
    assert f"rejoin {LOST}: job {job}:" in out and "node rank 1" in out
    # the run ends on both nodes: rank 1 rejoined, the head's rendezvous completed
    answered = started + sum(seconds[s] for s in ("check", "refresh", "update", "ssh"))
    rank1 = place["jobs"] / job / "logs" / "rank-1.log"
    first_step: float | None = None
    deadline = time.monotonic() + 180
    states: tuple[Any, Any] = (None, None)
    while time.monotonic() < deadline:
        if first_step is None and rank1.exists() and "step 0 rank 1" in rank1.read_text():
            first_step = time.monotonic()
        states = (state_of(place, job, 0), state_of(place, job, 1))
        if all(s and s.get("state") in ("succeeded", "failed") for s in states):
            break
        time.sleep(0.2)
    assert [s and s.get("state") for s in states] == ["succeeded", "succeeded"], states
    log = (place["jobs"] / job / "logs" / "rank-1.log").read_text()
    assert "step 4 rank 1 sum 3" in log
    assert first_step is not None
    print(
        f"recover stages (s): {seconds}; fab recover {took:.1f} s; node answering SSH to "
        f"its first step {first_step - answered:.1f} s"
    )


@pytest.mark.slow
def test_a_failing_verdict_stops_before_the_rejoin_and_the_run_keeps_waiting(
    sshd_server: SshServer,
    new_node: SshServer,
    node_venv: tuple[Path, FabResult],
    place: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    venv, _ = node_venv
    # a node whose python cannot run verify: it writes no report and exits 3
    broken = place["scratch"] / "broken-python"
    broken.write_text("#!/bin/sh\necho 'worker died' >&2\nexit 3\n")
    broken.chmod(0o755)
    before = stack_outputs(sshd_server, closed_port(), place)
    after = stack_outputs(sshd_server, new_node.port, place)
    fake = FakeStack(stack_state(STACK), before, after, {instance_urn(STACK, LOST)})
    record = tmp_path / "r.jsonl"
    code, out, err = run_recover(
        recover_args(place, venv, "--python", str(broken)), fake, record, capsys, monkeypatch
    )
    assert code == 1
    assert "verify-gpu: FAIL" in err and "not rejoined" in err and "Traceback" not in err
    assert f"verify {LOST}: verify-gpu: FAIL" in out
    assert "rejoin " not in out and "jobs " not in out
    assert not list(place["jobs"].glob("*/node-1"))  # nothing started for node rank 1
    rows = [json.loads(x) for x in record.read_text().splitlines()]
    assert (rows[-1]["stage"], rows[-1]["outcome"]) == ("verify", "failed")
    assert rows[-1]["replaced"] and not rows[-1]["finished"]
    # run again with a python that works: it goes on from the SSH wait, not replaced twice
    fake.calls.clear()
    code, out, err = run_recover(
        recover_args(place, venv, "--no-rejoin"), fake, record, capsys, monkeypatch
    )
    assert code == 0, out[-3000:] + err[-3000:]
    assert "going on from the SSH wait" in out and fake.changed() == []
    assert "verify-gpu: CPU-ONLY" in out
