"""A resume's node steps on Fabric's mocked SSH session (MockRemote): the exact commands
train-restore and train-start run (job.json written and ``job_runner.py restore`` on every
node before any ``start``), what each says of a restore that worked or failed, and
``fab cancel``'s line for a job that wrote nothing to its checkpoint folder."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from fabric import Connection
from fabric.testing.base import Command, MockRemote
from fabric.testing.fixtures import remote  # noqa: F401  (the pytest fixture)

from bootstrap.fleet.api import Host, HostContext, Options, StepResult
from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord, run_step
from bootstrap.train import steps
from bootstrap.train.options import CancelOptions, JobRef, ResumeCheck, TrainSend
from bootstrap.train.spec import ResumeOptions, resume_changes, resume_spec
from bootstrap.train.steps import (
    RUNNER,
    cancel_step,
    nothing_to_restore,
    restorable_line,
    restored_line,
    runner_command,
    ship_then_command,
    train_restore_step,
    train_start_step,
    write_job_command,
    wrote_nothing_lines,
)

SPEC: dict[str, Any] = {
    "job": "nano-261201-100000-ab12",
    "name": "nano",
    "attempt": 3,
    "resume": True,
    "jobs_dir": "/var/lib/gpufleet/jobs",
    "checkpoint_dir": "/scratch/checkpoints/nano-261201-100000-ab12",
    "workdir": "/var/lib/gpufleet/jobs/work/nano-1234",
    "detach": "fork",
    "args": ["--out_dir={checkpoint_dir}"],
    "resume_args": ["--init_from=resume"],
    "nodes": [
        {"name": "n0", "address": "node0", "port": 22},
        {"name": "n1", "address": "node1", "port": 22},
    ],
}
FOLDER = "/var/lib/gpufleet/jobs/nano-261201-100000-ab12"
RESTORED = {
    "ok": True,
    "detail": "version 7 restored",
    "cause": "",
    "version": 7,
    "step": 2000,
    "files": 2,
    "fetched": 1,
    "kept": 1,
    "bytes": 3_500_000,
    "seconds": 1.2,
}


@pytest.fixture(autouse=True)
def fixed_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's bundle as one fixed value: the node files may change while a test
    runs (being edited), and the expected command must be the one the step sends."""
    monkeypatch.setattr(steps, "bundle", lambda: ("0123456789ab", "UlVOTkVS"))


def run(
    mock: MockRemote,
    step: Any,
    commands: Sequence[Command],
    host: str = "node1",
    spec: Mapping[str, Any] = SPEC,
    tasks: tuple[object, ...] = (TrainSend(),),
) -> StepResult:
    mock.expect(host=host, user="u", commands=list(commands))
    ctx = HostContext(
        host=Host(host, user="u"),
        options=Options(tasks=(JobRef(spec), *tasks)),
    )
    conn = Connection(host, user="u")
    try:
        return run_step(step, conn, ctx)
    finally:
        conn.close()


def ship_only() -> str:
    return ship_then_command(SPEC["jobs_dir"], "true")[1]


def restore_command(rank: int) -> str:
    runner = ship_then_command(SPEC["jobs_dir"], RUNNER)[0]
    return (
        f"{write_job_command(SPEC)}; {runner_command(runner)} restore --job-dir "
        f"{FOLDER} --node-rank {rank}"
    )


def test_a_resume_writes_job_json_then_restores_on_this_node_and_starts_nothing(
    remote: MockRemote,  # noqa: F811
) -> None:
    answer = json.dumps({"ok": True, "restore": RESTORED})
    result = run(
        remote,
        train_restore_step,
        [Command(ship_only()), Command(restore_command(1), out=answer.encode())],
    )
    assert result.status.value == "changed", result.message
    assert result.details["rank"] == 1 and result.details["restore"]["version"] == 7
    assert result.message == (
        "node rank 1: version 7 (step 2000): 2 file(s), 1 fetched (3.5 MB), 1 kept"
    )
    # job.json is the spec as given: placeholders unexpanded, resume_args recorded.
    written = write_job_command(SPEC)
    assert "job.json" in written and "{checkpoint_dir}" not in written  # base64 of the spec


def test_a_failed_restore_fails_the_node_with_the_runners_cause_and_what_to_do(
    remote: MockRemote,  # noqa: F811
) -> None:
    why = "throttled: the bucket answered 503 SlowDown to every GET for 300 s; try again later"
    answer = json.dumps(
        {"ok": False, "restore": {**RESTORED, "ok": False, "cause": "throttled"}, "error": why}
    )
    failed = Command(restore_command(0), out=answer.encode(), exit=1)
    result = run(remote, train_restore_step, [Command(ship_only()), failed], host="node0")
    assert result.status.value == "failed"
    assert result.message == f"restore failed: {why}"
    assert result.details["restore"]["cause"] == "throttled"


def test_a_runner_without_the_restore_command_is_a_failure_not_a_start(
    remote: MockRemote,  # noqa: F811
) -> None:
    usage = "job_runner.py: error: argument command: invalid choice: 'restore'"
    result = run(
        remote, train_restore_step,
        [Command(ship_only()), Command(restore_command(1), err=usage.encode(), exit=2)],
    )  # fmt: skip
    assert result.status.value == "failed" and "invalid choice: 'restore'" in result.message


def test_after_every_node_restored_train_start_only_starts(
    remote: MockRemote,  # noqa: F811
) -> None:
    start = ship_then_command(
        SPEC["jobs_dir"],
        f"{RUNNER} start --job-dir {FOLDER} --node-rank 1 --detach fork --wait 120",
    )[1]
    answer = json.dumps({"ok": True, "mode": "fork", "state": {"effective": "running", "pid": 42}})
    result = run(
        remote,
        train_start_step,
        [Command(start, out=answer.encode())],
        tasks=(TrainSend(restored=True),),
    )
    assert result.status.value == "changed"
    assert result.message == "node rank 1: running under fork (pid 42)"


@pytest.mark.parametrize(
    ("restore", "says"),
    [
        (RESTORED, "version 7 (step 2000): 2 file(s), 1 fetched (3.5 MB), 1 kept"),
        ({**RESTORED, "step": None}, "version 7: 2 file(s)"),
        (
            {"ok": True, "files": 0, "detail": "nothing in the bucket"},
            "nothing restored (nothing in the bucket)",
        ),
        (
            {"ok": True, "files": 3, "kept": 3, "version": None, "detail": "no bucket"},
            "the node's own checkpoint folder: 3 file(s)",
        ),
    ],
)
def test_a_restore_is_said_with_its_version_and_step(restore: Mapping[str, Any], says: str) -> None:
    assert restored_line(restore).startswith(says)


def test_the_resume_check_reads_versions_and_the_older_answer() -> None:
    versions = {
        "local_files": 0,
        "checkpoint_dir": "/scratch/checkpoints/j",
        "bucket": "b/checkpoints/n0/j/",
        "versions": [{"seq": 1, "step": 100, "files": 2}, {"seq": 2, "step": 200, "files": 2}],
    }
    assert restorable_line(versions) == (
        "no local files; version 2 (2 file(s), step 200) in b/checkpoints/n0/j/"
    )
    assert not nothing_to_restore(versions)
    one = {**versions, "versions": None, "version": {"seq": 4, "step": None, "files": ["a"]}}
    assert restorable_line(one).endswith("version 4 (1 file(s)) in b/checkpoints/n0/j/")
    empty = {**versions, "versions": [], "bucket_step": None}
    assert nothing_to_restore(empty)
    assert restorable_line(empty) == (
        "no local files; no complete checkpoint in b/checkpoints/n0/j/"
    )


def test_cancel_says_when_the_job_wrote_nothing_to_its_checkpoint_folder(
    remote: MockRemote,  # noqa: F811
) -> None:
    detail = "the job wrote nothing to /scratch/checkpoints/j: nothing to upload"
    final = {"ok": True, "detail": detail, "wrote_nothing": True, "newest_step": None}
    answer = json.dumps({"ok": True, "state": {"effective": "cancelled", "final_sync": final}})
    cancel = ship_then_command(
        SPEC["jobs_dir"], f"{RUNNER} cancel --job-dir {FOLDER} --node-rank 0 --wait 5"
    )[1]
    result = run(
        remote,
        cancel_step,
        [Command(cancel, out=answer.encode())],
        host="node0",
        tasks=(CancelOptions(wait=5),),
    )
    assert result.details["wrote_nothing"] == detail
    report = FleetReport(
        task="cancel",
        seconds=0.1,
        hosts=[
            HostReport(
                host=Host("node0", name="n0"),
                steps=[StepRecord(name="cancel", result=result, seconds=0.1)],
            )
        ],
    )
    lines = wrote_nothing_lines(report, "j", 80)
    assert lines[0].startswith("gpufleet: job j on ") and detail[:20] in lines[0]
    assert all(len(line) <= 80 for line in lines), lines
    assert "{checkpoint_dir}" in " ".join(lines)
    # A job that saved something: no such line.
    saved = {**final, "wrote_nothing": False, "detail": "1 file uploaded"}
    done = json.dumps({"ok": True, "state": {"effective": "cancelled", "final_sync": saved}})
    other = run(
        remote,
        cancel_step,
        [Command(cancel, out=done.encode())],
        host="node0",
        tasks=(CancelOptions(wait=5),),
    )
    assert "wrote_nothing" not in other.details


def test_a_resume_that_changes_the_bucket_endpoint_is_checked_with_it_in_a_folder_of_its_own(
    remote: MockRemote,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(steps.secrets, "token_hex", lambda n: "cafe")
    proposed = {**SPEC, "s3_endpoint": "http://127.0.0.1:9000"}
    folder = f"{FOLDER}.check-cafe"
    check = ship_then_command(
        SPEC["jobs_dir"],
        f"{steps.write_file_command(folder + '/job.json', json.dumps(proposed, indent=1))} && "
        f"{RUNNER} restorable --job-dir {folder}; rc=$?; rm -rf {folder}; exit $rc",
    )[1]
    answer = {"ok": True, "local_files": 0, "checkpoint_dir": "/c", "bucket": "b/p/",
              "version": {"seq": 3, "step": 30, "files": 1}}  # fmt: skip
    result = run(
        remote, steps.resume_check_step, [Command(check, out=json.dumps(answer).encode())],
        host="node0", tasks=(ResumeCheck(proposed),),
    )  # fmt: skip
    assert result.status.value == "ok" and result.message.endswith(
        "version 3 (1 file(s), step 30) in b/p/"
    )


def test_a_resume_given_sync_quiet_writes_it_in_the_job_json_it_restores_with(
    remote: MockRemote,  # noqa: F811
) -> None:
    """``fab train --resume JOB --sync-quiet 0.5``: the new attempt's job.json, written on
    the node before its restore, holds sync_quiet_s (the supervisor's push reads it)."""
    old = {**SPEC, "attempt": 2, "sync_quiet_s": 2.0}
    changes = resume_changes(old, ResumeOptions(sync_quiet=0.5))
    spec = resume_spec(old, master_addr="node0", master_port=29500, changes=changes)
    runner = ship_then_command(SPEC["jobs_dir"], RUNNER)[0]
    restore = (
        f"{write_job_command(spec)}; {runner_command(runner)} restore --job-dir {FOLDER} "
        "--node-rank 1"
    )
    answer = json.dumps({"ok": True, "restore": RESTORED})
    result = run(
        remote, train_restore_step, [Command(ship_only()), Command(restore, out=answer.encode())],
        spec=spec,
    )  # fmt: skip
    assert result.status.value == "changed", result.message
    sent = re.search(r"printf %s (\S+) \| base64 -d", restore)
    assert sent is not None
    written = json.loads(base64.b64decode(sent.group(1)))
    assert written["sync_quiet_s"] == 0.5 and written["changed"] == ["sync_quiet_s"]
    assert written["attempt"] == 3
