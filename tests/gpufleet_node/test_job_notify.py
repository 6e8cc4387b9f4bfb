"""Telling the person who walked away (issue 41, ``--notify``): the body each webhook service
documents, the bounded tries, and a real supervisor (torchrun, two gloo ranks, moto S3)
posting to a webhook on 127.0.0.1 that answers, fails or never answers; the URL (a secret)
never in the node's state, events or log."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import job_notify
from tests.gpufleet_node import test_job_recovery as recovery
from tests.gpufleet_node.test_job_recovery import job, state, supervise

# The recovery tests' moto S3 on 127.0.0.1 and its bucket, as fixtures here too.
moto_url = recovery.moto_url
endpoint = recovery.endpoint

TOKEN = "T0KEN-s3cr3t-8a1f"

# ---------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("url", "service"),
    [
        ("https://hooks.slack.com/services/T000/B000/XXXX", "slack"),
        ("https://contoso.webhook.office.com/webhookb2/abc@def/IncomingWebhook/x/y", "teams"),
        ("https://prod-12.westus.logic.azure.com:443/workflows/abc/triggers/manual", "teams"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/0000-1111", "feishu"),
        ("https://open.larksuite.com/open-apis/bot/v2/hook/0000-1111", "feishu"),
        ("https://oapi.dingtalk.com/robot/send?access_token=abc", "dingtalk"),
        ("https://hooks.example.org/gpufleet", "generic"),
        ("https://evilhooks.slack.com.example.org/x", "generic"),
    ],
)
def test_the_service_is_told_by_the_urls_host(url: str, service: str) -> None:
    assert job_notify.service_of(url) == service


def test_each_service_gets_the_body_it_documents() -> None:
    text = "gpufleet job r1: crash\nlook closer: fab logs r1, fab jobs"
    assert job_notify.payload("slack", text) == {"text": text}
    assert job_notify.payload("feishu", text) == {"msg_type": "text", "content": {"text": text}}
    assert job_notify.payload("dingtalk", text) == {"msgtype": "text", "text": {"content": text}}
    teams = job_notify.payload("teams", text)
    assert teams["type"] == "message" and teams["text"] == text
    (card,) = teams["attachments"]
    assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert card["content"]["type"] == "AdaptiveCard"
    assert card["content"]["body"] == [{"type": "TextBlock", "text": text, "wrap": True}]
    generic = job_notify.payload("generic", text, {"job": "r1", "reason": "crash"})
    assert generic == {"job": "r1", "reason": "crash", "text": text}
    for body in (job_notify.payload(s, text) for s in ("slack", "teams", "feishu", "dingtalk")):
        json.dumps(body)  # each a JSON document


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.slack.com/services/x", "http://hooks.slack.com: the webhook URL carries"),
        ("http://10.0.0.5/hook", "http://10.0.0.5: the webhook URL carries a token, use https"),
        ("ftp://example.org/x", "give an https:// webhook URL"),
        ("hooks.slack.com/services/x", "give an https:// webhook URL"),
        ("https://user:pw@example.org/x", "https://example.org: no user or password"),
        ("https://example.org:99999/x", "not a URL"),
    ],
)
def test_a_url_that_cannot_take_the_messages_is_one_line_without_its_token(
    url: str, says: str
) -> None:
    problem = job_notify.check_url(url)
    assert problem is not None and problem.startswith(says) and "\n" not in problem
    assert "services/x" not in problem and "pw" not in problem


def test_https_anywhere_and_http_only_to_this_machine() -> None:
    assert job_notify.check_url("https://hooks.slack.com/services/T/B/X") is None
    assert job_notify.check_url("http://127.0.0.1:8080/hook") is None
    assert job_notify.check_url("http://localhost/hook") is None
    assert job_notify.host_of("https://oapi.dingtalk.com/robot/send?access_token=zz") == (
        "oapi.dingtalk.com"
    )


def test_a_message_says_what_why_steps_spend_and_the_fab_command() -> None:
    text = job_notify.message(
        {
            "job": "r1-20261205",
            "name": "lm",
            "what": "crash, restart 1 of 2 in 10 s",
            "attempt_line": "attempt 1: crash (rank 1, exit 3) after 12s, steps 0 -> 20",
            "spent": 0.4149,
            "max_cost": 5,
            "currency": "USD",
        }
    )
    assert text == (
        "gpufleet job r1-20261205 (lm): crash, restart 1 of 2 in 10 s\n"
        "attempt 1: crash (rank 1, exit 3) after 12s, steps 0 -> 20; spent 0.41 of 5 USD; "
        "look closer: fab logs r1-20261205, fab jobs"
    )
    assert len(text.splitlines()) == 2


# ---------------------------------------------------------------------------- a local webhook


class Hook:
    """A webhook on 127.0.0.1: ``mode`` ok (200), fail (500), bad (400) or hang (answers
    after ``hang_s``); ``got`` the JSON bodies, ``paths`` the paths asked."""

    def __init__(self, mode: str = "ok", hang_s: float = 3.0) -> None:
        self.mode, self.hang_s = mode, hang_s
        self.got: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.asked = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                hook.asked += 1
                hook.paths.append(self.path)
                if hook.mode == "hang":
                    time.sleep(hook.hang_s)
                code = {"ok": 200, "fail": 500, "bad": 400}.get(hook.mode, 200)
                if code == 200:
                    hook.got.append(json.loads(body))
                with_body = b'{"ok": true}' if code == 200 else b"no"
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(with_body)))
                    self.end_headers()
                    self.wfile.write(with_body)
                except OSError:
                    pass  # the client gave up (its timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/{TOKEN}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    try:
        yield h
    finally:
        h.stop()


def test_a_webhook_that_answers_500_is_tried_a_few_times_then_given_up(hook: Hook) -> None:
    hook.mode = "fail"
    began = time.monotonic()
    out = job_notify.post(hook.url, {"text": "x"}, tries=3, timeout=1.0, backoff=(0.1, 0.2))
    assert (out["ok"], out["tries"], out["status"], out["error"]) == (False, 3, 500, "HTTP 500")
    assert hook.asked == 3 and time.monotonic() - began < 3
    hook.mode, hook.asked = "bad", 0  # a 400 says the same body fails again: one try
    assert job_notify.post(hook.url, {"text": "x"}, tries=3, backoff=(0.1,))["tries"] == 1
    assert hook.asked == 1


def test_a_webhook_that_never_answers_costs_at_most_the_bounded_tries(hook: Hook) -> None:
    hook.mode, hook.hang_s = "hang", 5.0
    began = time.monotonic()
    out = job_notify.post(hook.url, {"text": "x"}, tries=2, timeout=0.5, backoff=(0.2,))
    took = time.monotonic() - began
    assert not out["ok"] and out["tries"] == 2 and "timed out" in out["error"], out
    assert TOKEN not in out["error"] and took < 2.5, took


def test_a_refused_connection_is_an_error_without_the_url() -> None:
    h = Hook()
    url = h.url
    h.stop()  # nothing listens there now
    out = job_notify.post(url, {"text": "x"}, tries=2, timeout=0.5, backoff=(0.1,))
    assert not out["ok"] and out["tries"] == 2 and out["error"] and TOKEN not in out["error"]


def test_the_notifier_sends_in_order_and_never_waits_for_the_webhook(hook: Hook) -> None:
    recorded: list[dict[str, Any]] = []
    logged: list[str] = []
    notifier = job_notify.Notifier(
        hook.url,
        record=lambda event, **detail: recorded.append({"event": event, **detail}),
        log=logged.append,
        tries=2,
        timeout=0.5,
        backoff=(0.1,),
    )
    hook.mode, hook.hang_s = "hang", 2.0
    began = time.monotonic()
    notifier.send("attempt_end", job="r1", what="crash, restart 1 of 2 in 10 s")
    notifier.send("run_end", job="r1", what="succeeded after 2 attempt(s)")
    assert time.monotonic() - began < 0.2  # queued: the supervisor goes on at once
    notifier.close(wait_s=10)
    assert [r["kind"] for r in recorded] == ["attempt_end", "run_end"]
    assert all(not r["ok"] and r["host"] == "127.0.0.1" for r in recorded)
    assert len(logged) == 2 and all(TOKEN not in line for line in [*logged, str(recorded)])


# ---------------------------------------------------------------------------- real supervisors


def _secret_nowhere(job_dir: Path, *texts: str) -> None:
    """The webhook's token in no file of the node's job folder but job.json, nor in
    ``texts`` (the supervisor's output)."""
    for path in job_dir.rglob("*"):
        if path.is_file() and path.name != "job.json":
            assert TOKEN not in path.read_text(errors="replace"), path
    for text in texts:
        assert TOKEN not in text


def test_a_crash_and_the_restarted_runs_end_reach_the_webhook(
    tmp_path: Path, endpoint: str, hook: Hook
) -> None:
    job_dir = job(
        tmp_path, endpoint, {"FAULT": "crash"}, max_restarts=2, notify_url=hook.url, name="lm"
    )
    done = supervise(job_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert state(job_dir)["state"] == "succeeded"
    first, last = hook.got  # one message per event, in order
    assert first["kind"] == "attempt_end" and first["reason"] == "crash"
    assert first["text"].startswith("gpufleet job r1 (lm): crash, restart 1 of 2 in 0.5 s\n")
    assert "attempt 1: crash (rank 1, exit 3) after" in first["text"]
    assert "steps 0 -> 20" in first["text"] and "fab logs r1, fab jobs" in first["text"]
    assert last["kind"] == "run_end" and last["state"] == "succeeded"
    assert last["text"].startswith("gpufleet job r1 (lm): succeeded after 2 attempt(s)\n")
    assert "attempt 2: succeeded after" in last["text"] and "steps 20 -> 40" in last["text"]
    assert hook.paths == [f"/hook/{TOKEN}"] * 2
    sent = [e for e in _events(job_dir) if e["event"] == "notify"]
    assert [(e["kind"], e["ok"], e["host"]) for e in sent] == [
        ("attempt_end", True, "127.0.0.1"),
        ("run_end", True, "127.0.0.1"),
    ]
    _secret_nowhere(job_dir, done.stdout, done.stderr)
    print(f"\nnotify: {first['text']!r}\n        {last['text']!r}")


def test_the_budget_reached_is_one_message(tmp_path: Path, endpoint: str, hook: Hook) -> None:
    job_dir = job(
        tmp_path,
        endpoint,
        {"STEPS": "100000"},
        max_restarts=3,
        max_cost=0.010,  # 10 s of one node: torch starts and saves first, loaded or not
        hourly_price=3.6,
        currency="USD",
        notify_url=hook.url,
    )
    done = supervise(job_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    (only,) = hook.got
    assert only["kind"] == "run_end" and only["reason"] == "budget"
    assert only["text"].startswith(
        "gpufleet job r1: budget reached: ranks stopped, checkpoint pushed\n"
    )
    assert "of 0.01 USD" in only["text"] and "attempt 1: budget after" in only["text"]
    _secret_nowhere(job_dir, done.stdout, done.stderr)


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_a_webhook_that_fails_or_never_answers_does_not_hold_the_job(
    tmp_path: Path, endpoint: str, hook: Hook, mode: str
) -> None:
    hook.mode, hook.hang_s = mode, 30.0
    job_dir = job(
        tmp_path,
        endpoint,
        {"FAULT": "crash"},
        max_restarts=1,
        notify_url=hook.url,
        notify_tries=2,
        notify_timeout_s=1.0,
    )
    began = time.monotonic()
    done = supervise(job_dir)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    now = state(job_dir)
    assert now["state"] == "succeeded" and [a["reason"] for a in now["attempts"]] == [
        "crash",
        "succeeded",
    ]
    sent = [e for e in _events(job_dir) if e["event"] == "notify"]
    assert [(e["kind"], e["ok"], e["tries"]) for e in sent] == [
        ("attempt_end", False, 2),
        ("run_end", False, 2),
    ]
    assert hook.got == [] and "notify: run_end not sent to 127.0.0.1 after 2 tries" in done.stdout
    # Two messages of 2 tries (1 s timeout, 1 s back-off): at most ~6 s, mostly while the
    # job ran; the crash test alone takes 13 s here.
    assert took < 40, took
    _secret_nowhere(job_dir, done.stdout, done.stderr)
    print(f"\nwebhook {mode}: run ended after {took:.1f} s, messages recorded as not sent")


def test_a_worker_node_never_notifies(tmp_path: Path, endpoint: str, hook: Hook) -> None:
    from gpufleet_node import job_runner

    job_dir = job(tmp_path, endpoint, {}, notify_url=hook.url)
    assert job_runner.Supervisor(job_dir, 1).make_notifier() is None
    assert job_runner.Supervisor(job_dir, 0).make_notifier() is not None


def _events(job_dir: Path) -> list[dict[str, Any]]:
    from gpufleet_node import job_runner

    return list(job_runner.history(job_dir, 0)["events"])
