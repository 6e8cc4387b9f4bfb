"""fab health's report at 80 columns: one line per node with its verdict, each reason and
action beneath, the replace command kept whole so it can be copied."""

from __future__ import annotations

from bootstrap.tasks.health import health_text, replace_lines

VERDICT = {
    "host": "a100x8-0 (203.0.113.10)",
    "status": "failed",
    "taken_at": "2026-12-02T01:00:00Z",
    "reasons": [
        {
            "check": "dcgm",
            "level": "failed",
            "gpu": 0,
            "text": "memory: GPU 0 had uncorrectable memory errors and row remapping failed.",
            "action": "replace the GPU: row remapping failed (unrecoverable memory damage)",
        },
        {"check": "xid", "level": "note", "text": "Xid 13 (2 times)", "action": "restart"},
    ],
}
STORED = {"file": "/var/lib/gpufleet/health/verdict.json", "bucket": {"url": "b/k.json"}}


def test_every_line_fits_80_columns_and_notes_carry_no_action() -> None:
    lines = health_text(VERDICT, STORED, 80).plain.splitlines()
    assert lines[0].startswith("FAILED    a100x8-0 (203.0.113.10)  taken 2026-12-02T01:00:00Z")
    assert all(len(line) <= 80 for line in lines), lines
    assert any(line.strip().startswith("-> replace the GPU") for line in lines)
    assert not any("restart" in line for line in lines)  # a note's action is not shown
    assert lines[-1] == "    kept: /var/lib/gpufleet/health/verdict.json; b/k.json"


def test_piped_output_is_not_wrapped() -> None:
    lines = health_text(VERDICT, STORED, None).plain.splitlines()
    assert any(len(line) > 80 for line in lines)


def test_hosts_from_the_command_line_have_no_urn_to_replace() -> None:
    assert replace_lines(None, ["n-0"]) == [
        "replace: hosts came from -H, not a stack: no Pulumi URN to replace"
    ]
    assert replace_lines("t4x1", []) == []


def test_the_replace_command_is_quoted_whole_for_copying() -> None:
    (line,) = replace_lines("t4x1", ["t4x1-0"])
    assert line == (
        "replace t4x1-0: `pulumi up --stack t4x1 --replace "
        "'urn:pulumi:t4x1::gpufleet::gpufleet:node:GpuNode$aws:ec2/instance:Instance::t4x1-0'`"
    )


# --- fab status's health column ----------------------------------------------------------------


def test_status_reads_the_verdict_its_age_and_its_worst_reason() -> None:
    import datetime as dt
    import json

    from bootstrap.tasks.status import health_summary

    now = dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.UTC)
    verdict = {**VERDICT, "schema": "gpufleet.verdict/1"}
    got = health_summary({"health": json.dumps(verdict), "quarantine": "no"}, now)
    assert (got["status"], got["age"], got["quarantined"]) == ("failed", "2h", False)
    assert got["reason"].startswith("dcgm: memory: GPU 0 had uncorrectable")
    assert health_summary({"health": ""}, now)["status"] == "none"


def test_status_notes_a_verdict_too_old_for_fab_train() -> None:
    from rich.console import Console

    from bootstrap.fleet.api import Host, StepResult
    from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord
    from bootstrap.tasks.status import render_status

    details = {
        "gpu_count": 0,
        "gpu_model": None,
        "driver": None,
        "cuda": None,
        "torch": None,
        "scratch": {"mounted": False},
        "scratch_path": "/scratch",
        "reboot_required": False,
        "uptime_s": 60,
        "health": {"status": "healthy", "age": "2d", "age_hours": 50.0, "quarantined": False},
    }
    step = StepRecord("status", StepResult.ok("no GPU", **details), 0.1)
    report = FleetReport("status", [HostReport(Host("n0"), steps=[step])], 0.1)
    console = Console(width=200, record=True)
    for part in render_status(report):
        console.print(part)
    text = console.export_text()
    assert "healthy 2d" in text and "HEALTH STALE: fab health" in text
