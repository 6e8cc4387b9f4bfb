"""How ``fab top`` ends: Ctrl-C sets an event instead of raising wherever the main thread
is, the nodes are asked on daemon threads that nothing waits for once the view is
stopped, and a refresh in flight gives way within one poll. Real signals (raised in
this process with ``signal.raise_signal``) and real threads; no node."""

from __future__ import annotations

import io
import signal
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from bootstrap.tasks import top

WAIT_S = 10.0  # the bound on every wait here; the work itself takes milliseconds


@pytest.fixture
def python_handler() -> Iterator[None]:
    """SIGINT as a plain ``python`` process has it (a test runner may put its own)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_sets_the_event_and_a_second_one_raises(python_handler: None) -> None:
    stop = threading.Event()
    with top.ctrl_c_sets(stop):
        signal.raise_signal(signal.SIGINT)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_the_program_put_in_place_is_left_alone() -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        stop = threading.Event()
        with top.ctrl_c_sets(stop):
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT] and not stop.is_set()
    finally:
        signal.signal(signal.SIGINT, before)


def test_every_item_is_asked_in_order_and_never_more_at_once_than_allowed() -> None:
    lock = threading.Lock()
    running, most = [0], [0]

    def ask(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return i * i

    answers = top.ask_each(list(range(20)), ask, threading.Event(), at_once=3)
    assert answers == [i * i for i in range(20)]
    assert 1 <= most[0] <= 3


def test_a_stop_while_nodes_hang_returns_within_a_poll_and_leaves_only_daemons() -> None:
    release = threading.Event()
    started = threading.Barrier(3, timeout=WAIT_S)  # both askers and this test

    def ask(i: int) -> int:
        started.wait()
        release.wait(WAIT_S)  # a node that does not answer
        return i

    stop = threading.Event()

    def ctrl_c_once_both_hang() -> None:
        started.wait()
        stop.set()

    threading.Thread(target=ctrl_c_once_both_hang, daemon=True).start()
    t0 = time.monotonic()
    try:
        assert top.ask_each([0, 1], ask, stop, at_once=2) is None
        took = time.monotonic() - t0
        askers = [t for t in threading.enumerate() if t.name.startswith("fab-top-ask-")]
        assert askers and all(t.daemon for t in askers)
    finally:
        release.set()
    assert took < WAIT_S / 2  # not the hanging node's time


def test_an_ask_that_raises_is_raised_in_the_callers_thread() -> None:
    def ask(i: int) -> int:
        if i == 2:
            raise RuntimeError("node 2 broke")
        return i

    with pytest.raises(RuntimeError, match="node 2 broke"):
        top.ask_each([0, 1, 2, 3], ask, threading.Event(), at_once=2)


class Session:
    """A fleet of one node whose second refresh is interrupted by Ctrl-C and then hangs
    until the view is stopped, as a node past its timeout would."""

    def __init__(self) -> None:
        self.fleet = SimpleNamespace(stack="test")
        self.calls = 0

    def refresh(self, now: Any = None, stop: threading.Event | None = None) -> Any:
        self.calls += 1
        if self.calls == 1:
            return [top.NodeView("n0", "n0 (127.0.0.1)", error="no answer")]
        assert stop is not None
        signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, mid-refresh
        assert stop.wait(WAIT_S)
        return None


def test_ctrl_c_in_a_refresh_ends_the_view_with_what_was_shown(python_handler: None) -> None:
    session, out = Session(), io.StringIO()
    shown = top.run_top(
        session,  # type: ignore[arg-type]  # the view only reads .fleet.stack and refresh
        count=0,
        interval=0.01,
        as_json=True,
        width=80,
        out=out,
        live=False,
    )
    assert session.calls == 2 and len(shown) == 1
    assert len(out.getvalue().splitlines()) == 1  # one refresh, one JSON line
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_between_refreshes_ends_the_wait_at_once() -> None:
    session, stop = Session(), threading.Event()
    threading.Timer(0.05, stop.set).start()
    t0 = time.monotonic()
    shown = top.run_top(
        session,  # type: ignore[arg-type]
        count=0,
        interval=WAIT_S,
        as_json=True,
        width=80,
        out=io.StringIO(),
        live=False,
        stop=stop,
    )
    assert len(shown) == 1 and session.calls == 1
    assert time.monotonic() - t0 < WAIT_S / 2
