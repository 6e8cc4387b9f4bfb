"""Glue between Fabric's command line and the parallel runner.

``fab -H a,b task`` normally makes Fabric call the task once per host, one host after the
other. ``FleetExecutor`` (selected by ``tasks.executor_class`` in the repo's fabric.yaml)
leaves tasks made with :func:`fleet_task` un-parameterised and hands them the ``-H`` list
instead, so the runner can work on all hosts at once. Without it (e.g. another fabfile
importing these tasks) the tasks still work, one host per call.

A new task is a few lines::

    @fleet_task(help={"hours": "how long to lease the nodes"})
    def keep_alive(c, fleet_args, hours=2):
        \"\"\"Extend the idle lease on every node.\"\"\"
        options = Options(tasks=(KeepAlive(hours),))  # the task's own frozen dataclass
        fleet_run(c, "keep-alive", [my_step], fleet_args, options=options)

:func:`fleet_task` declares the options every fleet task shares once (``--stack``,
``--inventory``, ``--json``, ``--connect-timeout``: :class:`FleetArgs`, handed to the body as
``fleet_args``) and gives every fleet task ``--known-hosts FILE`` and
``--accept-new-host-key HOST[,HOST]`` (see ``bootstrap.fleet.hostkeys``), so no task can
connect without checking host keys.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import fabric
from fabric import Connection
from invoke import Context, Task, task
from invoke.exceptions import Exit
from rich.console import Console

from bootstrap.fleet import console_keys
from bootstrap.fleet.api import Host, HostContext, Options, Step
from bootstrap.fleet.console_keys import Fetch
from bootstrap.fleet.hostkeys import KNOWN_HOSTS_ENV, resolve_settings, unmatched_selectors
from bootstrap.fleet.hosts import Fleet, HostDiscoveryError, discover, parse_stack_outputs
from bootstrap.fleet.numbers import Bound, CheckedTask, numeric_params
from bootstrap.fleet.runner import HOST_KEY_SETTINGS_KEY, FleetReport, emit, run_fleet
from bootstrap.fleet.system import preflight_step, probe_step
from infra.catalog import Feature, load_catalog
from infra.render import literal_console

CLI_HOSTS_KEY = "gpufleet_cli_hosts"
# (known_hosts, accept_new_host_key) as given on the task's command line.
HOST_KEY_OPTIONS_KEY = "gpufleet_host_key_options"


@dataclasses.dataclass(frozen=True)
class FleetArgs:
    """The options every fleet task shares: which hosts, how to report, how long to wait."""

    stack: str = ""
    inventory: str = ""
    json: bool = False
    connect_timeout: float = 10.0


FLEET_OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FleetArgs))

FLEET_HELP = {
    "stack": "Pulumi stack to read hosts from (default: PULUMI_STACK, then the selected stack)",
    "inventory": "JSON file shaped like the stack outputs (default: $GPUFLEET_INVENTORY)",
    "json": "print one JSON document instead of progress and tables",
    "connect_timeout": "seconds to wait for each host's SSH handshake (default 10)",
}

# The options of every task that reads or writes the stack's bucket (train, cancel and the
# data tasks): the bucket itself comes from the stack outputs, reached from the nodes with
# their own identity; these say how to reach it where that is not the cloud's own endpoint.
BUCKET_HELP = {
    "s3_endpoint": "S3-compatible endpoint URL for the bucket (tests, MinIO, a private "
    "link; default: the cloud's own)",
    "node_env": "extra environment on the node, KEY=VALUE,... (e.g. the bucket's keys "
    "where the node has no role)",
}

HOST_KEY_HELP = {
    "known_hosts": "file of pinned SSH host keys (default: $"
    + KNOWN_HOSTS_ENV
    + ", then ~/.config/gpufleet/known_hosts/<stack>)",
    "accept_new_host_key": "HOST[,HOST]: pin the new key of these hosts only (address, "
    "address:port or node name), replacing the old one: for a node you replaced",
}
_HOST_KEY_PARAMS = ("known_hosts", "accept_new_host_key")

# A handshake cannot take no time; a negative one used to go on and connect.
FLEET_BOUNDS = {"connect_timeout": Bound(0, above=True, example="10")}


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


def fleet_task(
    *args: Any,
    shared: Sequence[str] = FLEET_OPTIONS,
    host_key_options: bool = True,
    bounds: Mapping[str, Bound] | None = None,
    **kwargs: Any,
) -> Callable[[Callable[..., Any]], Task[Any]]:
    """``@task`` that marks the task as running on the whole fleet in parallel.

    The task takes the ``shared`` options of :class:`FleetArgs` (all of them by default; a
    task that has no JSON document to print leaves ``json`` out), with their help text, and
    its body receives them as one ``fleet_args`` argument. With ``host_key_options`` (the
    default) it also takes ``--known-hosts`` and ``--accept-new-host-key``; they reach the
    runner through the config, so task bodies need not pass them on.

    Every numeric option needs its :class:`~bootstrap.fleet.numbers.Bound` in ``bounds``
    (the shared ones have theirs): the task is refused at import otherwise, so no option
    is left to invoke's parser, whose bad-number error is a traceback.
    """
    unknown = [name for name in shared if name not in FLEET_OPTIONS]
    if unknown:
        raise TypeError(f"fleet_task: no shared option {', '.join(unknown)}")
    # No auto short flags: `-i` would mean the key before the task name and the inventory
    # after it. Long options only, spelled the same on every task.
    kwargs.setdefault("auto_shortflags", False)
    kwargs["help"] = {
        **{name: FLEET_HELP[name] for name in shared},
        **(HOST_KEY_HELP if host_key_options else {}),
        **(kwargs.get("help") or {}),
    }

    def wrap(fn: Callable[..., Any]) -> Task[Any]:
        body = with_fleet_options(fn, tuple(shared), host_key_options=host_key_options)
        params = inspect.signature(body).parameters
        checked = {**FLEET_BOUNDS, **(bounds or {})}
        numeric = numeric_params({n: p.default for n, p in params.items()})
        missing = [name for name in numeric if name not in checked]
        if missing:
            raise TypeError(f"{fn.__qualname__}: give a Bound for {', '.join(missing)}")
        t = task(*args, klass=CheckedTask, **kwargs)(body)
        assert isinstance(t, CheckedTask)
        t.bounds = {name: checked[name] for name in numeric}
        t.gpufleet_fleet = True  # type: ignore[attr-defined]
        return t

    return wrap


def with_fleet_options(
    fn: Callable[..., Any], shared: Sequence[str], *, host_key_options: bool
) -> Callable[..., Any]:
    """``fn(c, fleet_args, ...)`` as a task body that takes the ``shared`` options (and the
    host-key options) as keywords: the first become ``fleet_args``, the others are stored in
    ``c.config`` for :func:`resolve_fleet`."""
    sig = inspect.signature(fn)
    if list(sig.parameters)[1:2] != ["fleet_args"]:
        raise TypeError(f"{fn.__qualname__}: a fleet task's second parameter is fleet_args")
    added = (*shared, *(_HOST_KEY_PARAMS if host_key_options else ()))
    clash = [name for name in added if name in sig.parameters]
    if clash:
        raise TypeError(f"{fn.__qualname__}: fleet_task adds {', '.join(clash)} itself")

    @functools.wraps(fn)
    def body(c: Context, *args: Any, **kw: Any) -> Any:
        fleet_args = FleetArgs(**{name: kw.pop(name) for name in shared if name in kw})
        if host_key_options:
            keys = tuple(str(kw.pop(name, "")) for name in _HOST_KEY_PARAMS)
            c.config[HOST_KEY_OPTIONS_KEY] = keys  # type: ignore[assignment]
        # Positional arguments follow fleet_args, as in the signature invoke sees without it.
        return fn(c, fleet_args, *args, **kw)

    defaults = FleetArgs()
    extra = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=getattr(defaults, name),
            annotation=type(getattr(defaults, name)),
        )
        for name in shared
    ]
    extra += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default="", annotation=str)
        for name in (_HOST_KEY_PARAMS if host_key_options else ())
    ]
    own = [p for name, p in sig.parameters.items() if name != "fleet_args"]
    # invoke builds the task's flags from this signature (the body's own plus the above).
    body.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
    return body


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


def resolve_fleet(c: Context, fleet_args: FleetArgs, *, known_hosts: str = "") -> Fleet:
    """The hosts for this run, or an Exit with a message saying how to give them.

    Also settles the run's host-key settings (file, hosts to re-pin, keys from the stack
    outputs) and leaves them in ``c.config`` for :func:`bootstrap.fleet.runner.run_fleet`.
    """
    stack = fleet_args.stack
    try:
        fleet = discover(
            cli_hosts=_cli_hosts(c),
            inventory=fleet_args.inventory or None,
            stack=stack or None,
            key_filename=_cli_key(c),
            default_user=c.config.get("user") if _cli_hosts(c) else None,
        )
    except HostDiscoveryError as exc:
        raise Exit(f"gpufleet: {exc}", code=2) from None
    fleet = pin_console_host_keys(fleet)
    option_file, accept = c.config.get(HOST_KEY_OPTIONS_KEY) or ("", "")
    settings = resolve_settings(
        stack=fleet.stack or stack or None,
        known_hosts=known_hosts or option_file,
        accept=accept,
        stack_keys=fleet.host_keys,
    )
    unmatched = unmatched_selectors(settings.accept, fleet.hosts)
    if unmatched:
        # A typo here must not pass silently: the person believes a node was re-pinned.
        raise Exit(
            f"gpufleet: --accept-new-host-key {','.join(unmatched)} names no host of this run "
            f"({', '.join(h.label for h in fleet.hosts)}); name hosts by address, "
            "address:port or node name",
            code=2,
        )
    c.config[HOST_KEY_SETTINGS_KEY] = settings  # type: ignore[assignment]
    return fleet


def pin_console_host_keys(fleet: Fleet, fetch: Fetch | None = None) -> Fleet:
    """Where the cloud can (AWS), add the host keys cloud-init printed to each node's console
    (read through the cloud's API with the caller's credentials) to the keys pinned before the
    first connection. Off with GPUFLEET_CONSOLE_HOST_KEYS=0; any failure falls back to trust
    on first use."""
    nodes = fleet.outputs.get("nodes") or []
    info = load_catalog().providers.get(fleet.provider or "")
    if not info or not info.supports(Feature.CONSOLE_HOST_KEYS) or not nodes:
        return fleet
    if not console_keys.enabled():
        return fleet
    try:
        region = str(fleet.outputs.get("region") or "")
        fetch = fetch or console_keys.fetcher_for(info.name, region)
    except Exception as exc:  # boto3 missing or no region: the run goes on, unpinned
        print(f"gpufleet: host keys: console output not read ({exc})", file=sys.stderr)
        return fleet
    enriched, notes = console_keys.with_console_host_keys(fleet.outputs, fetch)
    for note in notes:
        print(f"gpufleet: host keys: {note}", file=sys.stderr)
    try:
        found = parse_stack_outputs(enriched, source="console output").host_keys
    except HostDiscoveryError as exc:
        print(f"gpufleet: host keys: ignored ({exc})", file=sys.stderr)
        return fleet
    # Keys the stack outputs list themselves win over what the console shows.
    return dataclasses.replace(
        fleet, host_keys={**found, **fleet.host_keys}, outputs=MappingProxyType(enriched)
    )


def _console(as_json: bool) -> Console:
    # Progress and tables go to stderr under --json so stdout stays one parseable document.
    # Host names, messages and fingerprints are printed as they are, never read as markup.
    console: Console = literal_console(stderr=as_json)
    return console


def fleet_run(
    c: Context,
    task_name: str,
    steps: Sequence[Step],
    fleet_args: FleetArgs,
    *,
    options: Options | None = None,
    readonly: bool = False,
    render: Callable[[FleetReport], Iterable[Any]] | None = None,
) -> FleetReport:
    """Resolve hosts, run ``steps`` on all of them in parallel, print the summary.

    Every run starts with a probe of the node: ``preflight`` (sudo + supported OS required)
    for tasks that change the node, the read-only ``probe`` when ``readonly``. Exits non-zero
    when any host failed.
    """
    fleet = resolve_fleet(c, fleet_args)
    as_json = fleet_args.json
    opts = options or Options()
    console = _console(as_json)

    scratch = fleet.scratch
    if opts.scratch_path:
        scratch = dataclasses.replace(scratch, path=opts.scratch_path)

    def make_context(host: Host) -> HostContext:
        return fleet.context(host, opts, scratch)

    first: Step = probe_step if readonly else preflight_step
    quiet = as_json or os.environ.get("GPUFLEET_QUIET") == "1"
    report = run_fleet(
        task_name,
        fleet.hosts,
        [first, *steps],
        make_context,
        config=c.config,
        console=None if quiet else console,
        connect_timeout_s=fleet_args.connect_timeout,
    )
    emit(report, as_json=as_json, console=console, render=render, read_only=readonly)
    sys.stdout.flush()
    return report
