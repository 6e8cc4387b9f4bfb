"""``fab train --notify URL`` on the laptop (issue 41): checked before anything starts, kept
in job.json as notify_url (a resume applies and records a new one), and never shown in
full: the webhook URL carries its token, so fab shows its host only."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap.train.jobs import jobs_table, merge_jobs
from bootstrap.train.spec import ResumeOptions, TrainError, job_spec, resume_changes, resume_spec
from tests.bootstrap.conftest import fab_in_process
from tests.bootstrap.train.samples import NOW, fleet
from tests.bootstrap.train.test_spec import request

SECRET = "XyZ-t0ken-42"
SLACK = f"https://hooks.slack.com/services/T000/B000/{SECRET}"


def test_the_url_goes_to_job_json_as_notify_url(tmp_path: Path) -> None:
    spec = job_spec(
        request(tmp_path, notify=SLACK),
        fleet(nodes=1),
        job="j",
        nproc=8,
        master_addr="10.0.0.1",
        master_port=29500,
        now=NOW,
    )
    assert spec["notify_url"] == SLACK
    plain = job_spec(
        request(tmp_path / "b"), fleet(), job="j", nproc=8, master_addr="a", master_port=1, now=NOW
    )
    assert plain["notify_url"] is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"http://hooks.slack.com/services/T/B/{SECRET}", "--notify: http://hooks.slack.com: "),
        (f"hooks.slack.com/services/{SECRET}", "--notify: give an https:// webhook URL"),
        (f"https://me:{SECRET}@example.org/x", "--notify: https://example.org: no user"),
        (f"http://192.168.1.9/{SECRET}", "--notify: http://192.168.1.9: the webhook URL carries"),
    ],
)
def test_a_url_that_cannot_be_used_is_refused_in_one_line_without_its_token(
    tmp_path: Path, url: str, says: str
) -> None:
    with pytest.raises(TrainError) as caught:
        request(tmp_path, notify=url)
    said = str(caught.value)
    assert said.startswith(says) and "\n" not in said and SECRET not in said
    request(tmp_path / "ok", notify="http://127.0.0.1:8080/hook")  # a local one, for tests


def test_a_resume_applies_and_records_a_new_url_and_refuses_a_bad_one() -> None:
    old = {"job": "j", "name": "j", "args": [], "nnodes": 1, "notify_url": None}
    changes = resume_changes(old, ResumeOptions(notify=SLACK))
    assert changes == {"notify_url": SLACK}
    spec = resume_spec(old, master_addr="a", master_port=1, changes=changes)
    assert spec["notify_url"] == SLACK and spec["changed"] == ["notify_url"]
    kept = resume_spec({**old, "notify_url": SLACK}, master_addr="a", master_port=1)
    assert kept["notify_url"] == SLACK  # a resume without --notify keeps the recorded one
    assert resume_changes({**old, "notify_url": SLACK}, ResumeOptions(notify=SLACK)) == {}
    with pytest.raises(TrainError, match=r"^--notify: give an https://") as caught:
        resume_changes(old, ResumeOptions(notify=f"ftp://x/{SECRET}"))
    assert SECRET not in str(caught.value)


def test_fab_jobs_shows_the_webhooks_host_only() -> None:
    spec = {"nnodes": 1, "nproc_per_node": 2, "created_at": "2026-12-01T09:00:00Z"}
    rec = {
        "job": "lm-1",
        "name": "lm",
        "node_rank": 0,
        "attempt": 1,
        "state": "running",
        "effective": "running",
        "started_at": "2026-12-01T09:00:00Z",
        "spec": {**spec, "notify_url": SLACK},
        "attempts": [{"attempt": 1, "reason": "crash", "seconds": 5, "newest_step": 10}],
    }
    rows = merge_jobs([rec], now=NOW, outputs=fleet(nodes=1).outputs)
    out = io.StringIO()
    Console(file=out, width=100).print(jobs_table(rows, 100))
    doc = json.dumps([r.to_json() for r in rows])
    assert SECRET not in out.getvalue() and SECRET not in doc
    assert rows[0].to_json()["notify"] == "hooks.slack.com"


def test_fab_train_refuses_a_plain_http_webhook_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://hooks.slack.com/services/T/B/{SECRET}"
    code, out, err = fab_in_process(
        ["train", "--script", "scripts/size.py", "--notify", url], capsys, monkeypatch
    )
    said = (out + err).strip()
    assert code == 2, said
    assert said.endswith(
        "--notify: http://hooks.slack.com: the webhook URL carries a token, use https"
    )
    assert len(said.splitlines()) == 1 and SECRET not in said
