"""``fleet_task`` declares the options every fleet task shares once and hands them to the body
as one ``FleetArgs``; the host-key options reach the runner through the config."""

from __future__ import annotations

from typing import Any

import pytest
from invoke import Context

from bootstrap.fleet.cli import FLEET_OPTIONS, HOST_KEY_OPTIONS_KEY, FleetArgs, fleet_task
from bootstrap.fleet.numbers import Bound

HOURS = {"hours": Bound(1, example="2")}


def flags(t: Any) -> dict[str, Any]:
    return {a.name: a for a in t.get_arguments()}


def test_a_fleet_task_takes_the_shared_options_with_their_kinds_and_help() -> None:
    @fleet_task(help={"hours": "how long"}, bounds=HOURS)
    def lease(c: Context, fleet_args: FleetArgs, hours: int = 2) -> None:
        """Lease."""

    got = flags(lease)
    assert set(got) == {"hours", *FLEET_OPTIONS, "known_hosts", "accept_new_host_key"}
    assert (got["json"].kind, got["connect_timeout"].kind, got["stack"].kind) == (bool, float, str)
    assert got["connect_timeout"].default == 10.0
    assert "SSH handshake" in (got["connect_timeout"].help or "")
    assert got["hours"].help == "how long"


def test_the_body_gets_one_fleet_args_and_its_own_options() -> None:
    seen: list[Any] = []

    @fleet_task(bounds=HOURS)
    def probe(c: Context, fleet_args: FleetArgs, hours: int = 2) -> None:
        """Probe."""
        seen.append((fleet_args, hours))

    c = Context()
    probe(c, hours=3, stack="a100x8", json=True, connect_timeout=4.0, known_hosts="/kh")
    assert seen == [(FleetArgs(stack="a100x8", json=True, connect_timeout=4.0), 3)]
    assert c.config[HOST_KEY_OPTIONS_KEY] == ("/kh", "")


def test_a_numeric_option_without_a_bound_is_refused_when_the_task_is_defined() -> None:
    # Left to invoke, a bad number would be its 22-line traceback.
    with pytest.raises(TypeError, match="give a Bound for hours"):

        @fleet_task()
        def lease(c: Context, fleet_args: FleetArgs, hours: float = 2.0) -> None:
            """Lease."""


def test_a_positional_argument_still_binds_after_fleet_args() -> None:
    seen: list[Any] = []

    @fleet_task(positional=["job"])
    def cancel(c: Context, fleet_args: FleetArgs, job: str | None = None) -> None:
        """Cancel."""
        seen.append((job, fleet_args.inventory))

    cancel(Context(), "j-1", inventory="hosts.json")
    assert seen == [("j-1", "hosts.json")]


def test_a_task_can_leave_a_shared_option_out() -> None:
    @fleet_task(shared=("stack", "inventory"), host_key_options=False)
    def local(c: Context, fleet_args: FleetArgs) -> None:
        """Local."""

    assert set(flags(local)) == {"stack", "inventory"}


def test_a_body_without_fleet_args_second_is_refused() -> None:
    with pytest.raises(TypeError, match="second parameter is fleet_args"):

        @fleet_task()
        def old_style(c: Context, stack: str = "") -> None:
            """Old."""


def test_a_body_declaring_a_shared_option_itself_is_refused() -> None:
    with pytest.raises(TypeError, match="fleet_task adds json itself"):

        @fleet_task()
        def twice(c: Context, fleet_args: FleetArgs, json: bool = False) -> None:
            """Twice."""


def test_an_unknown_shared_option_is_refused() -> None:
    with pytest.raises(TypeError, match="no shared option verbose"):
        fleet_task(shared=("stack", "verbose"))
