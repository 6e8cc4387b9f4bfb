"""``fab train --max-restarts / --hang-after / --max-cost`` on the laptop (issue 41): the
job.json fields the node's supervisor reads, the one-line refusals, the resume rules, and
what ``fab jobs`` shows of a run's attempts and spend."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap.train.jobs import jobs_table, merge_jobs
from bootstrap.train.spec import (
    ResumeOptions,
    TrainError,
    check_recovery,
    job_spec,
    recovery_options,
    resume_changes,
)
from tests.bootstrap.train.samples import NOW, fleet
from tests.bootstrap.train.test_spec import request


def test_the_options_become_the_nodes_fields(tmp_path: Path) -> None:
    req = request(tmp_path, max_restarts=3, hang_after="10m", max_cost=50.0)
    spec = job_spec(
        req, fleet(nodes=1), job="j", nproc=8, master_addr="10.0.0.1", master_port=29500, now=NOW
    )
    assert (spec["max_restarts"], spec["hang_after_s"], spec["max_cost"]) == (3, 600.0, 50.0)
    assert (spec["hourly_price"], spec["currency"]) == (40.0, "USD")  # one node's price
    plain = job_spec(
        request(tmp_path / "b"), fleet(), job="j", nproc=8, master_addr="a", master_port=1, now=NOW
    )
    assert (plain["max_restarts"], plain["hang_after_s"], plain["max_cost"]) == (0, None, None)
    assert plain["hourly_price"] == 20.0  # 40 USD/h over 2 nodes


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"max_restarts": -1}, "--max-restarts -1: must be 0 or more"),
        ({"hang_after": "ten"}, "--hang-after 'ten': give seconds or a number with s, m or h"),
        ({"hang_after": "0s"}, "--hang-after '0s': must be above 0"),
        ({"max_cost": -5.0}, "--max-cost -5: must be above 0"),
    ],
)
def test_bad_values_are_one_line(given: dict[str, object], says: str) -> None:
    options = {"max_restarts": 0, "hang_after": "", "max_cost": 0.0, **given}
    with pytest.raises(TrainError) as caught:
        recovery_options(**options)  # type: ignore[arg-type]
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_restarts_and_hangs_on_more_nodes_need_the_bucket_and_a_budget_a_price() -> None:
    with pytest.raises(TrainError, match=r"^--max-restarts: on 2 nodes the nodes meet in the"):
        check_recovery({"max_restarts": 2}, nnodes=2, price=1.0, bucket=False)
    with pytest.raises(TrainError, match=r"^--hang-after: on 4 nodes .* this stack has none"):
        check_recovery({"hang_after_s": 60.0}, nnodes=4, price=1.0, bucket=False)
    check_recovery({"max_restarts": 2, "hang_after_s": 60.0}, nnodes=4, price=1.0, bucket=True)
    check_recovery({"max_cost": 9.0}, nnodes=4, price=1.0)  # a budget works on any nodes
    check_recovery({"max_restarts": 2, "hang_after_s": 60.0}, nnodes=1, price=None)
    with pytest.raises(TrainError, match=r"^--max-cost: the stack's outputs give no hourly_cost"):
        check_recovery({"max_cost": 9.0}, nnodes=1, price=None)


def test_a_resume_applies_them_and_refuses_what_the_job_cannot_do() -> None:
    old = {"job": "j", "name": "j", "args": [], "nnodes": 1, "hourly_price": 2.0}
    given = ResumeOptions(max_restarts=2, hang_after="30s", max_cost=10.0)
    assert resume_changes(old, given) == {"max_restarts": 2, "hang_after_s": 30.0, "max_cost": 10.0}
    assert resume_changes({**old, "max_restarts": 2}, ResumeOptions(max_restarts=2)) == {}
    with pytest.raises(TrainError, match=r"^--max-restarts: on 2 nodes"):
        resume_changes({**old, "nnodes": 2}, ResumeOptions(max_restarts=1))
    two = {**old, "nnodes": 2, "bucket": "b"}  # with the stack's bucket: the nodes meet there
    assert resume_changes(two, ResumeOptions(max_restarts=1)) == {"max_restarts": 1}
    with pytest.raises(TrainError, match=r"^--max-cost: the stack's outputs"):
        resume_changes({**old, "hourly_price": None}, ResumeOptions(max_cost=3.0))


def test_fab_jobs_shows_each_attempt_why_it_ended_and_the_spend_against_the_budget() -> None:
    spec = {"nnodes": 1, "nproc_per_node": 2, "created_at": "2026-12-01T09:00:00Z", "max_cost": 30}
    attempts = [
        {
            "attempt": 1,
            "reason": "crash",
            "rank": 1,
            "exit_code": 3,
            "seconds": 600,
            "resumed_from": None,
            "newest_step": 200,
        },
        {
            "attempt": 2,
            "reason": "hang",
            "silent_s": 600.2,
            "seconds": 1200,
            "resumed_from": {"version": 3, "step": 200},
            "newest_step": 400,
        },
        {
            "attempt": 3,
            "reason": "budget",
            "seconds": 300,
            "resumed_from": {"version": 5, "step": 400},
            "newest_step": 450,
        },
    ]
    rec = {
        "job": "lm-1",
        "name": "lm",
        "node_rank": 0,
        "attempt": 3,
        "state": "cancelled",
        "effective": "cancelled",
        "end_reason": "budget",
        "attempts": attempts,
        "started_at": "2026-12-01T09:00:00Z",
        "ended_at": "2026-12-01T09:30:00Z",
        "budget": "spent 30.0100 of 30 USD",
        "spec": spec,
    }
    rows = merge_jobs([rec], now=NOW, outputs=fleet(nodes=1).outputs)
    out = io.StringIO()
    Console(file=out, width=100).print(jobs_table(rows, 100))
    text = out.getvalue()
    assert "budget reached (attempt 3)" in text and "20.00/30 USD" in text
    assert "attempt 1: crash (rank 1, exit 3) after 600s, steps 0 -> 200" in text
    assert "attempt 2: hang (no progress for 600s) after 1200s, steps 200 -> 400" in text
    assert "attempt 3: budget after 300s, steps 400 -> 450" in text
    doc = rows[0].to_json()
    assert doc["end_reason"] == "budget" and len(doc["attempts"]) == 3 and doc["max_cost"] == 30


def test_fab_jobs_shows_a_multi_node_runs_attempts_and_the_node_it_waits_for() -> None:
    spec = {"nnodes": 2, "nproc_per_node": 8, "created_at": "2026-12-01T09:00:00Z"}
    crash = {"attempt": 1, "reason": "crash", "node": 1, "rank": 9, "exit_code": 3}
    crash.update(seconds=600, newest_step=200, lost_s=95.0, lost_steps=38)
    reclaimed = {"attempt": 2, "reason": "reclaimed", "node": 1, "seconds": 300}
    reclaimed.update(resumed_from={"version": 3, "step": 200}, newest_step=300, lost_s=40)
    waits = [
        {"attempt": n, "reason": "waiting", "waiting_for": [1], "seconds": 600} for n in (3, 4, 5)
    ]
    head = {
        "job": "lm-2",
        "name": "lm",
        "node_rank": 0,
        "attempt": 6,
        "state": "running",
        "effective": "running",
        "waiting_for": [1],
        "attempts": [crash, reclaimed, *waits],
        "started_at": "2026-12-01T09:00:00Z",
        "spec": spec,
    }
    worker = {**head, "node_rank": 1, "waiting_for": None, "attempts": []}
    rows = merge_jobs([head, worker], now=NOW, outputs=fleet(nodes=2).outputs)
    out = io.StringIO()
    Console(file=out, width=100).print(jobs_table(rows, 100))
    text = out.getvalue()
    assert "waiting for node 1" in text
    assert "attempt 1: crash (node 1, rank 9, exit 3) after 600s, steps 0 -> 200, lost 95s" in text
    assert "(~38 steps)" in text
    assert "attempt 2: reclaimed (node 1) after 300s, steps 200 -> 300, lost 40s" in text
    assert "attempts 3-5: waiting (for node 1) 3 times, 1800s" in text
    assert rows[0].to_json()["waiting_for"] == [1]


def test_a_spot_stacks_runs_recover_from_a_reclaim_by_default(tmp_path: Path) -> None:
    import dataclasses

    from bootstrap.train.spec import job_spec, spot_stack

    on_demand = fleet()
    spot = dataclasses.replace(
        on_demand,
        outputs={
            **on_demand.outputs,
            "hourly_cost": {"currency": "USD", "billing": "spot", "amount": 12.0},
        },
    )
    assert spot_stack(spot.outputs) and not spot_stack(on_demand.outputs)
    assert not spot_stack({})
    req = request(tmp_path)
    no_bucket = dataclasses.replace(spot, outputs={**spot.outputs, "bucket": ""})
    for f, want in ((spot, True), (on_demand, False), (no_bucket, False)):
        spec = job_spec(req, f, job="j1", nproc=8, master_addr="10.0.0.1", master_port=1, now=NOW)
        assert spec["reclaim_recovery"] is want
