"""The one bounded request loop both bucket stores use (``bucket.send_bounded``): how
many tries, which failures earn another, how long it waits, and that the deadline ends it.
Real HTTP against a scripted server on 127.0.0.1; a fake clock where the deadline matters.
"""

from __future__ import annotations

import importlib
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.gpufleet_node.watchdog_fakes import closed_port, serve

wsync: Any = importlib.import_module("gpufleet_node.bucket")

CREDS = {"access_key_id": "testing", "secret": "testing", "token": "", "storage": "tok"}


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    cut_short: bool = False  # promise more bytes than are sent, then close


def xml_error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>said so</Message></Error>".encode()


@dataclass
class Script:
    """Answers in order; the last one repeats. Records each request's method."""

    answers: list[Answer]
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with script.lock:
                    script.seen.append(self.command)
                    n = len(script.seen) - 1
                answer = script.answers[min(n, len(script.answers) - 1)]
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                promised = len(answer.body) + (100 if answer.cut_short else 0)
                self.send_header("Content-Length", str(promised))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.body)
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = _answer

        return Handler


@pytest.fixture
def server() -> Iterator[Callable[..., tuple[Script, str]]]:
    stack: list[Any] = []

    def start(*answers: Answer) -> tuple[Script, str]:
        script = Script(list(answers))
        ctx = serve(script.handler())
        stack.append(ctx)
        return script, ctx.__enter__()

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


class Clock:
    """time.monotonic() for the loop: sleeping advances it, nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def send(
    url: str, clock: Clock, method: str = "GET", **kw: Any
) -> tuple[int, dict[str, str], bytes]:
    builds = kw.pop("builds", [])

    def build() -> urllib.request.Request:
        builds.append(1)
        return urllib.request.Request(url + "/key", method=method)

    kw.setdefault("attempts", 3)
    kw.setdefault("timeout", 5.0)
    kw.setdefault("rng", lambda: 1.0)  # full jitter drawn at its ceiling: waits are exact
    result: tuple[int, dict[str, str], bytes] = wsync.send_bounded(
        build, label=f"{method} key", sleep=clock.sleep, clock=clock, **kw
    )
    return result


def test_backoff_waits_half_a_second_then_doubles_up_to_two() -> None:
    assert [wsync.backoff(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_after_throttling_the_ceiling_starts_at_one_second_and_stops_at_twenty() -> None:
    assert [wsync.backoff(n, True) for n in range(8)] == [0, 1, 2, 4, 8, 16, 20, 20]


def test_a_failing_service_is_tried_exactly_attempts_times_then_its_error_is_raised(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(503, xml_error("SlowDown")))
    clock = Clock()
    with pytest.raises(wsync.StoreError) as err:
        send(url, clock, attempts=4)
    assert len(script.seen) == 4
    assert clock.slept == [1.0, 2.0, 4.0]  # SlowDown is throttling: the longer ceilings
    assert (err.value.code, err.value.status, err.value.cause) == ("SlowDown", 503, "throttled")
    assert "GET key: SlowDown said so" in str(err.value)


def test_a_throttled_request_is_tried_again_and_the_later_answer_returned(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(429), Answer(200, b"fine"))
    status, _, body = send(url, Clock())
    assert (status, body, len(script.seen)) == (200, b"fine", 2)


def test_a_refusal_is_final_and_not_tried_again(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(403, xml_error("AccessDenied")), Answer(200))
    clock = Clock()
    with pytest.raises(wsync.StoreError, match="AccessDenied") as err:
        send(url, clock)
    assert (len(script.seen), clock.slept, err.value.status) == (1, [], 403)


def test_missing_credentials_end_the_tries_before_any_request(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, _ = server(Answer(200))
    builds: list[int] = []

    def build() -> urllib.request.Request:
        builds.append(1)
        raise wsync.StoreError("no credentials", code="NoCredentials")

    with pytest.raises(wsync.StoreError, match="no credentials"):
        wsync.send_bounded(build, label="GET key", attempts=3, timeout=5.0, sleep=Clock().sleep)
    assert (builds, script.seen) == ([1], [])


def test_a_refused_connection_is_tried_again_and_reported_unreachable() -> None:
    builds: list[int] = []
    clock = Clock()
    with pytest.raises(wsync.StoreError) as err:
        send(closed_port(), clock, builds=builds)
    assert err.value.code == "Unreachable"
    assert (len(builds), clock.slept) == (3, [0.5, 1.0])


def test_an_answer_cut_short_is_tried_again_not_raised_as_a_foreign_error(
    server: Callable[..., tuple[Script, str]],
) -> None:
    # Before the shared loop, http.client.IncompleteRead escaped both stores: not a
    # StoreError, so the watchdog's sync crashed instead of reporting unsaved files.
    script, url = server(Answer(200, b"part", cut_short=True), Answer(200, b"whole"))
    assert send(url, Clock())[2] == b"whole"
    assert len(script.seen) == 2


def test_an_answer_always_cut_short_ends_as_unreachable(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(200, b"part", cut_short=True))
    with pytest.raises(wsync.StoreError) as err:
        send(url, Clock())
    assert (err.value.code, len(script.seen)) == ("Unreachable", 3)
    assert "IncompleteRead" in str(err.value)


def test_the_deadline_ends_the_tries_before_a_wait_that_would_pass_it(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(500, xml_error("InternalError")))
    clock = Clock()
    with pytest.raises(wsync.StoreError) as err:
        send(url, clock, attempts=5, deadline=clock.now + 1.2)
    # Tries at +0 and +0.5; the next wait (1 s) would end at +1.5, past the deadline.
    assert (len(script.seen), clock.slept) == (2, [0.5])
    assert err.value.code == "Deadline"
    assert "last try: GET key: InternalError" in str(err.value)
    assert clock.now <= 1000.0 + 1.2


def test_a_deadline_already_past_sends_nothing(
    server: Callable[..., tuple[Script, str]],
) -> None:
    script, url = server(Answer(200))
    builds: list[int] = []
    clock = Clock()
    with pytest.raises(wsync.StoreError, match=r"^deadline reached$") as err:
        send(url, clock, deadline=clock.now, builds=builds)
    assert (err.value.code, builds, script.seen) == ("Deadline", [], [])


def test_each_try_waits_for_its_answer_no_longer_than_the_deadline_leaves(
    server: Callable[..., tuple[Script, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = server(Answer(503), Answer(503), Answer(200))
    timeouts: list[float] = []
    real = urllib.request.urlopen

    def watched(request: Any, timeout: float) -> Any:
        timeouts.append(timeout)
        return real(request, timeout=timeout)

    monkeypatch.setattr(wsync.urllib.request, "urlopen", watched)
    clock = Clock()
    send(url, clock, timeout=60.0, deadline=clock.now + 10.0)
    assert timeouts == [10.0, 9.0, 7.0]  # after waits of 1 and 2 s (503: throttled)


def test_the_error_code_header_is_read_only_where_the_store_names_it(
    server: Callable[..., tuple[Script, str]],
) -> None:
    # A HEAD answer has no body: Azure puts its code in x-ms-error-code, S3 nowhere.
    _, url = server(Answer(404, headers={"x-ms-error-code": "BlobNotFound"}))
    for header, code in (("x-ms-error-code", "BlobNotFound"), ("", "HTTP404")):
        with pytest.raises(wsync.StoreError) as err:
            send(url, Clock(), method="HEAD", error_header=header)
        assert (err.value.code, err.value.status) == (code, 404)


@pytest.mark.parametrize("kind", ["Store", "BlobStore"])
def test_both_stores_retry_through_the_shared_loop(
    server: Callable[..., tuple[Script, str]], kind: str
) -> None:
    script, url = server(Answer(503), Answer(503), Answer(503), Answer(200))
    store = getattr(wsync, kind).for_node(
        endpoint="https://unused.invalid",
        region="us-east-1",
        bucket="account/container" if kind == "BlobStore" else "bucket",
        credentials=lambda: dict(CREDS),
        endpoint_url=url,
    )
    clock = Clock()
    store.retry_sleep = clock.sleep
    store.retry_rng = lambda: 1.0
    with pytest.raises(wsync.StoreError) as err:
        store.put("checkpoints/step-1", b"weights")
    assert (len(script.seen), clock.slept, err.value.status) == (3, [1.0, 2.0], 503)
    assert script.seen == ["PUT"] * 3


def test_a_sync_whose_answers_are_cut_short_reports_unsaved_files_instead_of_crashing(
    server: Callable[..., tuple[Script, str]], tmp_path: Path
) -> None:
    _, url = server(Answer(200, b"", cut_short=True))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-3")
    store = wsync.Store.for_node(
        endpoint="https://unused.invalid",
        region="us-east-1",
        bucket="bucket",
        credentials=lambda: dict(CREDS),
        endpoint_url=url,
    )
    store.retry_sleep = Clock().sleep
    store.retry_rng = lambda: 1.0
    result = wsync.sync_scratch(
        scratch=tmp_path, sync_dirs=("checkpoints",), node="n0", store=store, timeout_s=60
    )
    assert (result.ok, result.uploaded, result.unsynced) == (False, 0, 1)
    assert "IncompleteRead" in result.detail
