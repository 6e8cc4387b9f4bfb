"""``fab top``'s pure parts: parsing what a node prints, the marks, both layouts (as golden
text at 80 and 200 columns) and ``--json``. The nodes' outputs are the recorded shapes in
tests/fixtures/top (README there cites each)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from bootstrap.fleet.api import Host
from bootstrap.tasks import top
from bootstrap.train.jobs import merge_jobs
from gpufleet_node.idle_rules import Policy

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "top"
GOLDEN = Path(__file__).resolve().parent / "golden"
NOW = dt.datetime(2026, 12, 2, 3, 40, 0, tzinfo=dt.UTC)
OUTPUTS = {"hourly_cost": {"amount": 6.0, "currency": "USD"}, "nodes": [{}, {}, {}, {}]}


def smi(name: str) -> str:
    return (FIXTURES / name).read_text()


def record(
    job: str, name: str, rank: int, nnodes: int, started: str, line: str, nodes: Any = ()
) -> dict[str, Any]:
    """A job runner ``list`` record (gpufleet_node/job_runner.py's state.json + extras)."""
    return {
        "job": job,
        "name": name,
        "node_rank": rank,
        "nnodes": nnodes,
        "attempt": 1,
        "state": "running",
        "effective": "running",
        "started_at": started,
        "heartbeat_at": "2026-12-02T03:39:58Z",
        "runtime_s_before": 0.0,
        "last_line": line,
        "spec": {"nnodes": nnodes, "created_at": started, "nproc_per_node": 4, "nodes": nodes},
    }


A100S = [{"name": f"a100-{i}", "address": f"10.0.0.{i + 1}", "port": 22} for i in range(2)]
TRAIN = [
    record("train-lm-1", "train-lm", r, 2, "2026-12-02T02:38:00Z", "step 1200 loss 2.31", A100S)
    for r in (0, 1)
]
EVAL = [record("eval-t5-2", "eval-t5", 0, 1, "2026-12-02T03:10:00Z", "loading shard 3/40")]
STALL = {
    "last_decision": {
        "action": "keep",
        "reason": "stalled job: 1 process(es) hold GPU memory at < 5 % utilization for 62 min",
        "warning": "stalled job for 62 min; this node stops in 8 min unless the job makes "
        "progress, or run `fab keep-alive --hours N`",
        "idle_minutes": 62.0,
        "idle_limit_minutes": 30.0,
    },
    "stall_warned": True,
}


def sections(csv: str, jobs: list[dict[str, Any]], watchdog: dict[str, Any] | None = None):
    return {
        "smi": csv,
        "watchdog": json.dumps(watchdog or {}),
        "jobs": json.dumps({"jobs": jobs}),
    }


def scene() -> list[top.NodeView]:
    """Five nodes: two A100 x4 training (sharing a disk: each lists both records), a T4
    whose job starves it, an idle A10G and a node that did not answer."""
    records = [*TRAIN, *EVAL]
    rows = merge_jobs(records, now=NOW, outputs=OUTPUTS)
    policy = Policy()
    hosts = [Host("10.0.0.1", name="a100-0"), Host("10.0.0.2", name="a100-1")]
    views = [
        top.node_view(
            hosts[0],
            sections(smi("a100x4_training.csv"), TRAIN),
            rows,
            TRAIN,
            policy=policy,
            rates={"train-lm-1": 2.5},
        ),
        top.node_view(
            hosts[1],
            sections(smi("a100x4_training.csv"), TRAIN),
            rows,
            TRAIN,
            policy=policy,
            rates={"train-lm-1": 2.5},
        ),
        top.node_view(
            Host("10.0.0.3", name="t4-0"),
            sections(smi("t4x1_starved.csv"), EVAL, STALL),
            rows,
            EVAL,
            policy=policy,
        ),
        top.node_view(
            Host("10.0.0.4", name="a10g-0"),
            sections(smi("a10gx1_power_na.csv"), []),
            rows,
            [],
            policy=policy,
        ),
        top.NodeView("h100-0", "h100-0 (10.0.0.5)", error="no answer (EOFError: ); retrying"),
    ]
    return views


def rendered(width: int) -> str:
    lines = top.render(scene(), width=width, stack="a100x4", at=NOW, interval=3.0)
    return "\n".join(lines) + "\n"


def test_every_gpu_line_of_a_recorded_query_is_read_and_unreadable_fields_are_none() -> None:
    gpus = top.parse_gpus(smi("a100x4_training.csv"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].name == "NVIDIA A100-SXM4-40GB"
    assert (gpus[0].util, gpus[0].mem_used, gpus[0].mem_total) == (98.0, 36814.0, 40960.0)
    assert (gpus[0].power, gpus[0].power_limit, gpus[0].temp) == (372.41, 400.0, 64.0)
    a10g = top.parse_gpus(smi("a10gx1_power_na.csv"))[0]
    assert a10g.power is None and a10g.power_limit is None and a10g.util == 41.0


def test_what_nvidia_smi_prints_without_a_driver_is_no_gpu_and_said_as_it_is() -> None:
    assert top.parse_gpus(smi("driver_gone.txt")) == []
    view = top.node_view(
        Host("10.0.0.9"), sections(smi("driver_gone.txt"), []), [], [], policy=Policy()
    )
    assert view.gpus == () and view.smi_error is not None
    assert view.smi_error.startswith("NVIDIA-SMI has failed")


def test_the_refresh_asks_nvidia_smi_once_for_exactly_the_fields_it_reads() -> None:
    cmd = top.refresh_command("/var/lib/gpufleet/jobs", "/var/lib/gpufleet", "/r/bin-1")
    assert cmd.count("nvidia-smi --query-gpu=") == 1
    fields = ",".join(top.QUERY_FIELDS)
    assert f"--query-gpu={fields} --format=csv,noheader,nounits" in cmd
    assert "/var/lib/gpufleet/watchdog-state.json" in cmd
    assert "python3 -m gpufleet_node.job_runner list --root /var/lib/gpufleet/jobs" in cmd
    assert "PYTHONPATH=/r/bin-1" in cmd


def test_a_node_whose_gpus_sit_under_the_idle_threshold_while_a_job_runs_is_under_fed() -> None:
    views = scene()
    t4 = views[2]
    assert any(m.startswith("under-fed") for m in t4.marks)
    assert f"under {Policy().active_util_pct:g} %" in t4.marks[0]
    # busy GPUs, or no job at all (idle is the watchdog's business), are not under-fed
    assert not any(m.startswith("under-fed") for m in views[0].marks)
    assert views[3].job is None and views[3].marks == ()


def test_the_threshold_is_the_watchdogs_own_policy() -> None:
    gpus = top.parse_gpus(smi("t4x1_starved.csv"))  # 3 %
    job = top.NodeJob("j", "j", 0, "running", 10.0, None, "", "")
    assert top.under_fed(gpus, job, Policy(active_util_pct=10.0)) is not None
    assert top.under_fed(gpus, job, Policy(active_util_pct=3.0, stall_util_pct=3.0)) is None


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"last_decision": {"action": "stop", "reason": "idle 31 min"}}, "STOP"),
        (STALL, "stop soon: stalled job"),
        (
            {
                "last_decision": {
                    "action": "keep",
                    "reason": "idle",
                    "idle_minutes": 27.0,
                    "idle_limit_minutes": 30.0,
                }
            },
            "stop soon: idle 27 of 30 min",
        ),
        (
            {
                "last_decision": {
                    "action": "keep",
                    "reason": "idle",
                    "idle_minutes": 12.0,
                    "idle_limit_minutes": 30.0,
                }
            },
            None,
        ),
        ({}, None),
    ],
)
def test_the_watchdogs_state_file_says_when_it_is_about_to_stop_the_node(
    state: dict[str, Any], expected: str | None
) -> None:
    said = top.stop_soon(state)
    assert (said is None) if expected is None else (said or "").startswith(expected)


def test_the_job_on_a_node_has_its_rank_runtime_and_the_cost_fab_jobs_gives_it() -> None:
    rows = merge_jobs([*TRAIN, *EVAL], now=NOW, outputs=OUTPUTS)
    views = scene()
    worker, head = views[1].job, views[0].job
    assert head is not None and head.rank == 0  # by the job's node list, not the last record
    assert worker is not None and (worker.name, worker.rank) == ("train-lm", 1)
    row = next(r for r in rows if r.job == "train-lm-1")
    assert worker.runtime_s == row.runtime_s == 62 * 60
    assert worker.cost == row.cost == pytest.approx(6.0 / 4 * 2 * 62 / 60)


def test_the_step_rate_comes_from_the_step_numbers_two_refreshes_log() -> None:
    clock = top.StepClock()
    rows = merge_jobs(TRAIN, now=NOW, outputs=OUTPUTS)
    assert clock.update(rows, 100.0) == {}
    later = [dict(r, last_line="step 1230 loss 2.30") for r in TRAIN]
    assert clock.update(merge_jobs(later, now=NOW, outputs=OUTPUTS), 110.0) == {"train-lm-1": 3.0}
    assert top.logged_step("epoch 2 step=77 loss 1.0") == 77 and top.logged_step("eval") is None


@pytest.mark.parametrize("width", [80, 200])
def test_the_layout_at_this_width_is_the_golden_shape(width: int) -> None:
    golden = GOLDEN / f"top_{width}.txt"
    text = rendered(width)
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()
    assert max(len(line) for line in text.splitlines()) <= width


def test_narrow_is_one_line_per_node_and_wide_one_per_gpu() -> None:
    narrow, wide = rendered(80).splitlines(), rendered(200).splitlines()
    assert sum("4xA100" in line for line in narrow) == 2
    assert sum("NVIDIA A100-SXM4-40GB" in line for line in wide) == 8
    # the last log line only fits the wide layout
    assert "step 1200 loss 2.31" in rendered(200) and "step 1200" not in rendered(80)


def test_json_is_one_document_per_refresh_with_every_node() -> None:
    doc = json.loads(top.refresh_json(scene(), stack="a100x4", at=NOW))
    assert doc["at"] == "2026-12-02T03:40:00Z" and len(doc["nodes"]) == 5
    t4 = doc["nodes"][2]
    assert t4["gpus"][0]["util_pct"] == 3.0 and t4["job"]["name"] == "eval-t5"
    assert [m.split(":")[0] for m in t4["marks"]] == ["under-fed", "stop soon"]
    assert doc["nodes"][4]["reachable"] is False
