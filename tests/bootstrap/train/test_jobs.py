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
    # Issue 24: the table showed the last 40 characters, so a line lost its beginning. It
    # has a line of its own now, cut at the width.
    line = "epoch 12 loss 0.4312 lr 0.0003 tokens/s 18234.5 grad-norm 0.81 " * 2
    recs = [record("a", 0, "running", last_line=line), record("a", 1, "running")]
    rows = merge_jobs(recs, now=NOW, outputs=fleet().outputs)
    out = io.StringIO()
    Console(file=out, width=200).print(jobs_table(rows, 80))
    assert "  last: " + line[:69] + "..." in out.getvalue()
    assert max(len(x) for x in out.getvalue().splitlines()) == 80


def ttl(state: str, **kw: object) -> dict[str, object]:
    return {"state": state, **kw}


def test_a_running_job_shows_when_the_ttl_stops_its_first_node() -> None:
    recs = [
        record("a", 0, "running", node_ttl=ttl("left", seconds=5 * 3600, why="ttl")),
        record("a", 1, "running", node_ttl=ttl("left", seconds=3 * 3600 + 60, why="ttl")),
        record("b", 0, "running", node_ttl=ttl("unknown", reason="watchdog silent 25m")),
        record("b", 1, "running", node_ttl=ttl("off", why="off")),
        record("c", 0, "succeeded", node_ttl=ttl("left", seconds=60), ended_at=NOW.isoformat()),
        record("c", 1, "succeeded", ended_at=NOW.isoformat()),
    ]
    rows = {r.job: r for r in merge_jobs(recs, now=NOW, outputs=fleet().outputs)}
    assert rows["a"].ttl == ttl("left", seconds=3 * 3600 + 60, why="ttl")
    assert rows["b"].ttl == ttl("unknown", reason="watchdog silent 25m")
    assert rows["c"].ttl is None  # not running: no node of it to stop
    assert rows["a"].to_json()["ttl"]["seconds"] == 3 * 3600 + 60
    text = jobs_table(list(rows.values()), 80).plain
    a_line = next(x for x in text.splitlines() if x.startswith("a (lm)"))
    assert a_line.endswith("3h01m")
    assert "TTL unknown: watchdog silent 25m" in text
    assert next(x for x in text.splitlines() if x.startswith("c (lm)")).endswith("-")


@pytest.mark.parametrize("columns", ["80", None])
def test_the_jobs_table_fits_80_columns_piped(
    columns: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bootstrap.tasks import train  # the console fab jobs prints with

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    long_job = "llama-2-7b-pretrain-on-twenty-billion-tokens-261202-080000-ab12"
    held = ttl("left", seconds=300 * 3600, why="lease", stop_at="2026-12-14T08:00:00Z")
    recs = [
        record(long_job, 0, "running", name="lm", attempt=3, last_line="x" * 300, node_ttl=held),
        record(long_job, 1, "running", name="lm", attempt=3),
        record("short", 0, "failed", ended_at=NOW.isoformat()),
    ]
    console = train.literal_console()
    console.file = io.StringIO()
    console.print(jobs_table(merge_jobs(recs, now=NOW, outputs=fleet().outputs)))
    lines = console.file.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80, "\n".join(lines)
    assert f"{long_job} (lm)" in lines  # whole, on a line of its own
    row = next(x for x in lines if "running (attempt 3)" in x)
    assert row.rstrip().endswith("12d 12h lease")
    assert any("TTL held off by a lease: stops at 2026-12-14T08:00:00Z" in x for x in lines)


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


def test_the_table_says_where_an_attempt_resumed_from_and_each_nodes_warnings() -> None:
    older = (
        "attempt 2 restored step 2000 (version 7) and then wrote step 100: that version is "
        "kept out of resumes, version 7 stays the newest"
    )
    scratch = "the output says it started from scratch: 'Initializing a new model from scratch'"
    recs = [
        record(
            "lm-1", 0, "running", attempt=2, resumed_from={"version": 7, "step": 2000},
            warnings=[older, scratch],
        ),
        record("lm-1", 1, "running", attempt=2, warnings=[scratch]),
        record("lm-1", 1, "running", attempt=2, warnings=[scratch]),  # a shared disk
    ]  # fmt: skip
    (row,) = merge_jobs(recs, now=NOW, outputs=fleet().outputs)
    assert row.resumed_from == {"version": 7, "step": 2000}
    assert row.warnings == [f"node 0: {older}", f"node 0: {scratch}", f"node 1: {scratch}"]
    doc = row.to_json()
    assert doc["resumed_from"] == {"version": 7, "step": 2000} and len(doc["warnings"]) == 3
    buf = io.StringIO()
    Console(file=buf, width=200).print(jobs_table([row], width=80))
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "  resumed from version 7 (step 2000)" in text
    assert text.count("  warning: node 0: ") == 2 and text.count("  warning: node 1: ") == 1
    # A job without either: nothing more is said.
    (plain,) = merge_jobs([record("b", 0, "running")], now=NOW, outputs=fleet().outputs)
    assert plain.resumed_from is None and plain.warnings == []
