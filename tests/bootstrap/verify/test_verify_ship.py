"""The verify-node step's exact remote commands and their failure paths, on Fabric's own
mocked SSH session (fabric.testing's MockRemote): the Python check, the one-command copy of
the node files, the run, fetching the report and removing the temp folder."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fabric import Connection
from fabric.testing.base import Command, MockRemote
from fabric.testing.fixtures import remote  # noqa: F401  (the pytest fixture)

from bootstrap.fleet.api import Host, HostContext, Options, StepResult
from bootstrap.fleet.runner import run_step
from bootstrap.tasks.verify import verify_node_step
from bootstrap.verify.judge import NODE_SCHEMA, expected_from
from bootstrap.verify.ship import (
    VerifyInputs,
    VerifyOptions,
    node_command,
    remote_bundle,
    ship_command,
)
from infra.catalog import load_catalog

PY = "/opt/gpufleet/venv/bin/python"
DIR = "/tmp/gpufleet-verify.Ab12Cd"
OPTS = VerifyOptions(cpu=True)
EXP = expected_from(None, load_catalog(), tier="t4x1", cpu=True)
REPORT = {
    "schema": NODE_SCHEMA,
    "stage": "local",
    "mode": "cpu",
    "host": {"hostname": "node"},
    "torch": {"torch": "2.13.0+cpu"},
}


def run_verify_node(mock: MockRemote, commands: Sequence[Command]) -> StepResult:
    mock.expect(host="node", user="ubuntu", commands=list(commands))
    ctx = HostContext(
        host=Host("node", user="ubuntu"),
        options=Options(tasks=(VerifyInputs(OPTS, EXP),)),
    )
    conn = Connection("node", user="ubuntu")
    try:
        return run_step(verify_node_step, conn, ctx)
    finally:
        conn.close()


def until_the_report(report: dict[str, Any] | None = None) -> list[Command]:
    return [
        Command(f"test -x {PY}"),
        Command(ship_command(remote_bundle()), out=f"{DIR}\n".encode()),
        Command(node_command(DIR, OPTS, EXP), err=b"verify: torchrun ...\n"),
        Command(f"cat {DIR}/report-local.json", out=json.dumps(report or REPORT).encode()),
    ]


def test_the_node_files_ship_in_one_stable_command() -> None:
    assert remote_bundle() == remote_bundle()  # no time stamps: the same files, one command


def test_a_clean_run_removes_its_folder_and_judges_the_report(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_verify_node(remote, [*until_the_report(), Command(f"rm -rf {DIR}")])
    assert result.details["measurements"]["host"] == {"hostname": "node"}
    assert "cleanup_error" not in result.details["measurements"]


def test_a_folder_that_cannot_be_removed_is_recorded_in_the_report(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_verify_node(
        remote,
        [
            *until_the_report(),
            Command(f"rm -rf {DIR}", err=b"rm: cannot remove: Read-only file system\n", exit=1),
        ],
    )
    assert result.details["measurements"]["cleanup_error"] == (
        f"could not remove {DIR} (exit 1): rm: cannot remove: Read-only file system"
    )


def test_a_missing_node_python_fails_before_anything_is_copied(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_verify_node(remote, [Command(f"test -x {PY}", exit=1)])
    assert result.is_failure and "run `fab install-pytorch` first" in result.message


def test_a_copy_that_fails_says_what_the_node_needs(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_verify_node(
        remote,
        [
            Command(f"test -x {PY}"),
            Command(ship_command(remote_bundle()), err=b"sh: base64: not found\n", exit=127),
        ],
    )
    assert result.is_failure
    assert result.message == (
        "could not copy the verify files to the node (needs base64, tar): sh: base64: not found"
    )


def test_no_report_from_the_node_becomes_a_failed_verdict_and_the_folder_still_goes(
    remote: MockRemote,  # noqa: F811
) -> None:
    commands = [
        *until_the_report()[:2],
        Command(node_command(DIR, OPTS, EXP), err=b"Killed\n", exit=137),
        Command(f"cat {DIR}/report-local.json", err=b"No such file\n", exit=1),
        Command(f"rm -rf {DIR}"),
    ]
    result = run_verify_node(remote, commands)
    assert result.is_failure
    verdict = result.details["verdict"]
    assert verdict.checks[0].detail == "the node wrote no report (exit 137): Killed"


def test_the_health_verdict_is_taken_and_kept_in_the_shipped_folder_before_it_goes(
    remote: MockRemote,  # noqa: F811
) -> None:
    from bootstrap.verify.health.check import HealthOptions, snapshot_command

    health = HealthOptions(python=PY, state_dir="/var/lib/gpufleet")
    snap = {"schema": "gpufleet.health/1", "taken_at": "2026-12-02T01:00:00Z", "errors": []}
    stored = {"file": "/var/lib/gpufleet/health/verdict.json", "bucket": {"status": "skip"}}
    remote.expect(
        host="node",
        user="ubuntu",
        commands=[
            *until_the_report(),
            Command(snapshot_command(DIR, health), out=json.dumps(snap).encode()),
            # The save command carries the verdict itself (base64): any command text will do
            # for the mock as long as it answers; what it sends is test_health_check's.
            Command(None, out=json.dumps(stored).encode()),
            Command(f"rm -rf {DIR}"),
        ],
    )
    ctx = HostContext(
        host=Host("node", user="ubuntu"),
        options=Options(tasks=(VerifyInputs(OPTS, EXP), health)),
    )
    conn = Connection("node", user="ubuntu")
    try:
        result = run_step(verify_node_step, conn, ctx)
    finally:
        conn.close()
    kept = result.details["measurements"]["health_verdict"]
    assert kept["stored"]["file"] == stored["file"]
    assert kept["verdict"]["origin"] == "verify-gpu"
