"""The nodes' job records merged into one row per job, finding a job, and the table."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from bootstrap.train.jobs import find_job, jobs_table, merge_jobs
from bootstrap.train.spec import TrainError
from tests.bootstrap.train.samples import NOW, fleet


def record(job: str, rank: int, state: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "job": job,
        "name": "lm",
        "node_rank": rank,
        "attempt": 1,
        "state": state,
        "effective": state,
        "started_at": "2026-12-01T09:00:00Z",
        "heartbeat_at": "2026-12-01T09:30:00Z",
        "ended_at": None,
        "spec": {"nnodes": 2, "nproc_per_node": 2, "created_at": "2026-12-01T09:00:00Z"},
    }
    base.update(kw)
    return base


def test_nodes_disagreeing_show_the_worst_state_and_a_shared_disk_counts_once() -> None:
    recs = [
        record("a", 0, "succeeded", ended_at="2026-12-01T09:30:00Z", last_line="done"),
        record("a", 1, "succeeded", ended_at="2026-12-01T09:29:00Z"),
        record("a", 1, "succeeded", ended_at="2026-12-01T09:29:00Z"),  # same disk, read twice
        record("b", 0, "running", effective="interrupted"),
        record("b", 1, "running"),
    ]
    rows = {r.job: r for r in merge_jobs(recs, now=NOW, outputs=fleet().outputs)}
    assert rows["a"].state == "succeeded" and rows["a"].runtime_s == 1800
    assert rows["a"].cost == pytest.approx(20.0 * 2 * 0.5)  # 40 USD/h for 2 nodes, 30 min
    assert rows["b"].state == "interrupted"
    # An interrupted job cost money until its last heartbeat, not until now.
    assert rows["b"].runtime_s == 1800


def test_the_jobs_table_keeps_the_start_of_a_long_last_line() -> None:
    # Issue 24: the table showed the last 40 characters, so a line lost its beginning.
    line = "epoch 12 loss 0.4312 lr 0.0003 tokens/s 18234.5 grad-norm 0.81"
    recs = [record("a", 0, "running", last_line=line), record("a", 1, "running")]
    rows = merge_jobs(recs, now=NOW, outputs=fleet().outputs)
    out = io.StringIO()
    Console(file=out, width=200).print(jobs_table(rows))
    assert line[:37] + "..." in out.getvalue() and "grad-norm" not in out.getvalue()


def test_a_running_job_runs_until_now_and_earlier_attempts_add_up() -> None:
    recs = [record("c", 0, "running", runtime_s_before=600.0), record("c", 1, "running")]
    (row,) = merge_jobs(recs, now=NOW, outputs={})
    assert row.state == "running" and row.runtime_s == 3600 + 600 and row.cost is None


def test_a_job_is_found_by_id_or_by_its_newest_name_else_one_line() -> None:
    rows = merge_jobs(
        [
            record("lm-1", 0, "failed"),
            record(
                "lm-2",
                0,
                "running",
                started_at="2026-12-01T09:10:00Z",
                spec={"nnodes": 1, "created_at": "2026-12-01T09:10:00Z"},
            ),
        ],
        now=NOW,
        outputs={},
    )
    assert find_job(rows, "lm-1").job == "lm-1"
    assert find_job(rows, "lm").job == "lm-2"
    with pytest.raises(TrainError, match="no job 'zz' on these nodes"):
        find_job(rows, "zz")
