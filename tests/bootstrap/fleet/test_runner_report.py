"""The per-host summary and --json document, built from recorded step results."""

from __future__ import annotations

import json
import socket

import paramiko
from rich.console import Console

from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.runner import (
    FleetReport,
    HostReport,
    StepRecord,
    classify_connect_error,
    summary_table,
    verdict_line,
)


def report(*hosts: HostReport) -> FleetReport:
    return FleetReport("setup", list(hosts), 1.0)


def test_a_driver_install_needing_a_reboot_is_in_the_verdict_and_json() -> None:
    h = HostReport(
        Host("1.2.3.4", name="a100x8-0"),
        steps=[
            StepRecord(
                "install-driver",
                StepResult.changed("installed nvidia-open-580", reboot_required=True),
                120.0,
            )
        ],
    )
    r = report(h)
    assert "REBOOT REQUIRED on a100x8-0 (1.2.3.4)" in verdict_line(r)
    assert r.to_json()["hosts"][0]["reboot_required"] is True


def test_json_document_is_serialisable_even_with_odd_details() -> None:
    h = HostReport(
        Host("h"), steps=[StepRecord("s", StepResult.ok("fine", when=object(), ids={1, 2}), 0.1)]
    )
    doc = json.loads(json.dumps(report(h).to_json()))
    assert doc["ok"] is True and doc["changed"] is False
    assert doc["hosts"][0]["steps"][0]["details"]["ids"] == [1, 2]


def test_only_skipped_steps_are_not_reported_as_ok() -> None:
    h = HostReport(Host("h"), steps=[StepRecord("gpu", StepResult.skipped("no GPU"), 0.0)])
    assert h.status == "skipped"


def test_unreachable_host_fails_the_run_and_appears_in_the_table() -> None:
    down = HostReport(Host("10.0.0.9"), connection_error="unreachable", connection_message="x")
    up = HostReport(Host("10.0.0.8"), steps=[StepRecord("s", StepResult.ok("fine"), 0.1)])
    r = report(up, down)
    assert [h.host.address for h in r.failed_hosts] == ["10.0.0.9"]
    console = Console(record=True, width=120)
    console.print(summary_table(r))
    text = console.export_text()
    assert "unreachable" in text and "10.0.0.8" in text
    assert verdict_line(r).startswith("1 of 2 host(s) failed: 10.0.0.9")


def test_connection_errors_are_named_for_people() -> None:
    host = Host("node", user="ubuntu", port=22, key_filename="/k")
    kind, message = classify_connect_error(paramiko.AuthenticationException("x"), host)
    assert kind == "auth-failed" and "/k" in message and "wrong key" in message
    kind, message = classify_connect_error(socket.gaierror(-2, "Name or service not known"), host)
    assert kind == "unreachable" and "unknown host name" in message
    kind, _ = classify_connect_error(TimeoutError(), host)
    assert kind == "unreachable"
