"""Glue between Fabric's command line and the parallel runner.

``fab -H a,b task`` normally makes Fabric call the task once per host, one host after the
other. ``FleetExecutor`` (selected by ``tasks.executor_class`` in the repo's fabric.yaml)
leaves tasks made with :func:`fleet_task` un-parameterised and hands them the ``-H`` list
instead, so the runner can work on all hosts at once. Without it (e.g. another fabfile
importing these tasks) the tasks still work, one host per call.

A new task is a few lines::

    @fleet_task(help={**COMMON_HELP})
    def keep_alive(c, hours=2, stack="", inventory="", json=False):
        \"\"\"Extend the idle lease on every node.\"\"\"
        fleet_run(c, "keep-alive", [my_step], stack=stack, inventory=inventory, as_json=json,
                  options=Options(extra={"hours": hours}))
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import fabric
from fabric import Connection
from invoke import Context, Task, task
from invoke.exceptions import Exit
from rich.console import Console

from bootstrap.api import Host, HostContext, Options, Step
from bootstrap.hosts import Fleet, HostDiscoveryError, discover
from bootstrap.runner import FleetReport, emit, run_fleet
from bootstrap.system import preflight, probe_step

CLI_HOSTS_KEY = "gpufleet_cli_hosts"

COMMON_HELP = {
    "stack": "Pulumi stack to read hosts from (default: PULUMI_STACK, then the selected stack)",
    "inventory": "JSON file shaped like the stack outputs (default: $GPUFLEET_INVENTORY)",
    "json": "print one JSON document instead of progress and tables",
    "connect_timeout": "seconds to wait for each host's SSH handshake (default 10)",
}


class FleetExecutor(fabric.Executor):
    """Runs fleet tasks once, with the ``-H`` host list, instead of once per host."""

    def expand_calls(self, calls: list[Any], apply_hosts: bool = True) -> list[Any]:
        host_str = self.core[0].args.hosts.value if apply_hosts else None
        fleet_calls: list[Any] = []
        other_calls: list[Any] = []
        for call in calls:
            target = call if isinstance(call, Task) else getattr(call, "task", None)
            (fleet_calls if getattr(target, "gpufleet_fleet", False) else other_calls).append(call)
        if host_str:
            self.config[CLI_HOSTS_KEY] = [h for h in host_str.split(",") if h.strip()]
        if not fleet_calls:
            return list(super().expand_calls(calls, apply_hosts=apply_hosts))
        # Keep the order of the command line: expand non-fleet calls one by one.
        ret: list[Any] = []
        for call in calls:
            if call in fleet_calls:
                ret.extend(super().expand_calls([call], apply_hosts=False))
            else:
                ret.extend(super().expand_calls([call], apply_hosts=apply_hosts))
        return ret


def fleet_task(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Task[Any]]:
    """``@task`` that marks the task as running on the whole fleet in parallel."""

    # No auto short flags: `-i` would mean the key before the task name and the inventory
    # after it. Long options only, spelled the same on every task.
    kwargs.setdefault("auto_shortflags", False)

    def wrap(fn: Callable[..., Any]) -> Task[Any]:
        t: Task[Any] = task(*args, **kwargs)(fn)
        t.gpufleet_fleet = True  # type: ignore[attr-defined]
        return t

    return wrap


def _cli_hosts(c: Context) -> list[str]:
    if isinstance(c, Connection):
        # Fabric parameterised this call itself (no FleetExecutor): one host per call.
        port = f":{c.port}" if c.port and c.port != 22 else ""
        return [f"{c.user}@{c.host}{port}"]
    hosts = c.config.get(CLI_HOSTS_KEY) or []
    return [str(h) for h in hosts]


def _cli_key(c: Context) -> str | None:
    keys = (c.config.get("connect_kwargs") or {}).get("key_filename")
    if isinstance(keys, list | tuple):
        return str(keys[0]) if keys else None
    return str(keys) if keys else None


def resolve_fleet(c: Context, *, stack: str = "", inventory: str = "") -> Fleet:
    """The hosts for this run, or an Exit with a message saying how to give them."""
    try:
        return discover(
            cli_hosts=_cli_hosts(c),
            inventory=inventory or None,
            stack=stack or None,
            key_filename=_cli_key(c),
            default_user=c.config.get("user") if _cli_hosts(c) else None,
        )
    except HostDiscoveryError as exc:
        raise Exit(f"gpufleet: {exc}", code=2) from None


def _console(as_json: bool) -> Console:
    # Progress and tables go to stderr under --json so stdout stays one parseable document.
    return Console(stderr=as_json, highlight=False, soft_wrap=False)


def fleet_run(
    c: Context,
    task_name: str,
    steps: Sequence[Step],
    *,
    stack: str = "",
    inventory: str = "",
    as_json: bool = False,
    options: Options | None = None,
    readonly: bool = False,
    connect_timeout: float = 10.0,
    render: Callable[[FleetReport], Iterable[Any]] | None = None,
) -> FleetReport:
    """Resolve hosts, run ``steps`` on all of them in parallel, print the summary.

    Every run starts with a probe of the node: ``preflight`` (sudo + supported OS required)
    for tasks that change the node, the read-only ``probe`` when ``readonly``. Exits non-zero
    when any host failed.
    """
    fleet = resolve_fleet(c, stack=stack, inventory=inventory)
    opts = options or Options()
    console = _console(as_json)

    scratch = fleet.scratch
    if opts.scratch_path:
        scratch = dataclasses.replace(scratch, path=opts.scratch_path)

    def make_context(host: Host) -> HostContext:
        return HostContext(
            host=host,
            options=opts,
            tier=fleet.tier,
            scratch=scratch,
            stack=fleet.stack,
        )

    first: Step = probe_step if readonly else preflight
    quiet = as_json or os.environ.get("GPUFLEET_QUIET") == "1"
    report = run_fleet(
        task_name,
        fleet.hosts,
        [first, *steps],
        make_context,
        config=c.config,
        console=None if quiet else console,
        connect_timeout_s=connect_timeout,
    )
    emit(report, as_json=as_json, console=console, render=render)
    sys.stdout.flush()
    return report
