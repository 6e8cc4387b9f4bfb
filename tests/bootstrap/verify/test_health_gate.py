"""fab train's health gate (bootstrap/verify/health/gate.py): which verdicts keep a node out, in
one line with the command that re-checks it."""

from __future__ import annotations

import datetime as dt
import json

from bootstrap.verify.health import gate as health

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def facts(status: str, hours_ago: float, quarantine: bool = False) -> dict[str, str]:
    taken = (NOW - dt.timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    level = {"healthy": [], "degraded": ["degraded"], "failed": ["failed"]}[status]
    verdict = {
        "schema": "gpufleet.verdict/1",
        "host": "n",
        "taken_at": taken,
        "reasons": [{"check": "xid", "level": lv, "text": "Xid 79"} for lv in level],
    }
    return {"health": json.dumps(verdict), "quarantine": "yes" if quarantine else "no"}


def test_the_state_folder_is_the_jobs_folders_parent() -> None:
    assert health.state_dir_of("/var/lib/gpufleet/jobs") == "/var/lib/gpufleet"
    assert health.state_dir_of("/tmp/x/jobs/") == "/tmp/x"


def test_a_failed_verdict_refuses_with_its_reason_and_the_recheck() -> None:
    record = health.health_record(facts("failed", 2), NOW)
    line = health.refusal(record, "node-0")
    assert line == (
        "node-0: health verdict failed 2h ago (xid: Xid 79): re-check with `fab health`, "
        "or pass --ignore-health to train anyway"
    )


def test_a_verdict_older_than_a_day_refuses_and_a_fresh_one_lets_the_node_in() -> None:
    stale = health.refusal(health.health_record(facts("healthy", 25), NOW), "node-0")
    assert stale is not None and "is 25h old (limit 24 h)" in stale
    assert health.refusal(health.health_record(facts("healthy", 23), NOW), "node-0") is None
    assert health.refusal(health.health_record(facts("degraded", 1), NOW), "node-0") is None


def test_a_node_never_checked_is_let_in_and_recorded_as_none() -> None:
    record = health.health_record({"health": "", "quarantine": "no"}, NOW)
    assert record == {"status": "none", "quarantined": False}
    assert health.refusal(record, "node-0") is None


def test_a_quarantined_node_is_held_whatever_its_verdict() -> None:
    record = health.health_record(facts("healthy", 1, quarantine=True), NOW)
    held = health.quarantined(record, "node-0")
    assert held is not None and "quarantined for replacement" in held
    assert "`fab health --release`" in held
