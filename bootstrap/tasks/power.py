"""`fab start` and `fab stop`: the stack's nodes powered on and off through the cloud's API.

``stop`` saves each node's scratch to the bucket the watchdog's way first and stops only
the nodes whose save worked (``--force``: every node); ``start`` starts them, waits until
each is running and its SSH answers, then brings it back to work: the host key pinned for
its new address, the instance-store scratch re-created and mounted (a stop wipes it), the
watchdog's timer armed. Which instances: the stack outputs' ``nodes[].instance_id``, and
only those the cloud tags with this stack. The cloud calls are each cloud's power.py
(infra/clouds/power.py says what it offers); the laptop's own credentials make them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from invoke import Context
from invoke.exceptions import Exit

from bootstrap.fleet.api import Host, HostContext, Options, Step, StepResult
from bootstrap.fleet.cli import FleetArgs, _console, fleet_task, resolve_fleet
from bootstrap.fleet.hostkeys import (
    Entry,
    KnownHostsFile,
    forget_host,
    host_alias,
    keys_for,
    replace_keys,
)
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import (
    FleetReport,
    HostReport,
    StepRecord,
    emit,
    host_key_settings,
    run_fleet,
    summary_table,
)
from bootstrap.fleet.system import preflight_step
from bootstrap.tasks.scratch import mount_scratch_step
from bootstrap.tasks.watchdog import (
    PREFIX,
    WatchdogOptions,
    save_scratch_step,
    watchdog_running_step,
)
from infra import clouds
from infra.clouds.power import NodePower
from infra.reaper import tags as T

# Stopped, or (Azure) stopped from inside the OS but still allocated: both start.
STARTABLE = ("stopped", "stopped-allocated")
POLL_S = 3.0  # between two reads of the power states, and two SSH knocks
SSH_KNOCK_S = 5.0  # one TCP connect + banner read


@dataclass(frozen=True)
class Target:
    """One host of the run and the instance behind it."""

    host: Host
    instance_id: str
    # Which output gave the address: "host" (the inventory's own: a bastion, a port
    # forward), "public_ip" or "private_ip"; "" for a -H host.
    via: str = ""


def targets(fleet: Fleet) -> list[Target]:
    """Each host's instance id from the stack outputs' nodes (matched by name, else by
    address); a host without one is a one-line error: the cloud cannot be asked."""
    nodes = [n for n in fleet.outputs.get("nodes") or [] if isinstance(n, Mapping)]
    found: list[Target] = []
    for host in fleet.hosts:
        node = next((n for n in nodes if host.name and n.get("name") == host.name), None)
        if node is None:
            addresses = ("host", "public_ip", "private_ip")
            node = next((n for n in nodes if host.address in [n.get(a) for a in addresses]), None)
        iid = node.get("instance_id") if node else None
        if node is None or not isinstance(iid, str) or not iid:
            raise Exit(
                f"gpufleet: {host.label}: no instance_id in the stack outputs' nodes "
                "(give --stack or --inventory with the stack's outputs)",
                code=2,
            )
        via = next((a for a in ("host", "public_ip", "private_ip") if node.get(a)), "")
        found.append(Target(host, iid, via if node.get(via) == host.address else ""))
    return found


def connect_cloud(fleet: Fleet, endpoint: str, env: Mapping[str, str] | None = None) -> Any:
    """The cloud's power client, or a one-line Exit (code 2) before any call."""
    provider, region = fleet.provider, fleet.outputs.get("region")
    if not provider or not isinstance(region, str) or not region or not fleet.stack:
        raise Exit(
            f"gpufleet: {fleet.source or 'the hosts'} names no provider, region and stack: "
            "start and stop need the stack's outputs (--stack or --inventory)",
            code=2,
        )
    try:
        power = clouds.module(provider, "power")
        return power.connect(region, fleet.stack, os.environ if env is None else env, endpoint)
    except (LookupError, ValueError) as exc:
        raise Exit(f"gpufleet: {provider}: {exc}", code=2) from None


def describe(power: Any, ids: Sequence[str]) -> dict[str, NodePower]:
    try:
        found: dict[str, NodePower] = power.describe(list(ids))
    except Exception as exc:  # the cloud could not be read: nothing was touched
        raise Exit(f"gpufleet: the cloud's API did not answer: {_one_line(exc)}", code=1) from None
    return found


@dataclass(frozen=True)
class Begun:
    """A start or stop after its checks: the hosts, their instances as the cloud sees
    them, and the cloud's client; every failure so far was a one-line exit."""

    fleet: Fleet
    found: list[Target]
    power: Any
    nodes: dict[str, NodePower]

    def refusals(self) -> dict[Host, str]:
        stack = str(self.fleet.stack)
        out = {}
        for t in self.found:
            why = refusal(t, self.nodes.get(t.instance_id), stack)
            if why:
                out[t.host] = why
        return out


def begin(c: Context, fleet_args: FleetArgs, endpoint: str) -> Begun:
    fleet = resolve_fleet(c, fleet_args)
    found = targets(fleet)
    power = connect_cloud(fleet, endpoint)
    return Begun(fleet, found, power, describe(power, [t.instance_id for t in found]))


def unsettled(iid: str, state: str) -> str | None:
    """Why an instance cannot be started now (it is on its way somewhere), or None."""
    if state in (*STARTABLE, "running"):
        return None
    return f"instance {iid} is {state}: try again when it has settled"


def refusal(t: Target, node: NodePower | None, stack: str) -> str | None:
    """Why this instance is not ours to touch, or None."""
    if node is None:
        return f"instance {t.instance_id} not found by the cloud's API"
    if node.instance.stack != stack:
        return (
            f"instance {t.instance_id} is not tagged {T.STACK}={stack} "
            f"(tag: {node.instance.stack or 'none'}): not touched"
        )
    return None


def wait_for_states(
    power: Any,
    ids: Sequence[str],
    want: str,
    timeout_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, NodePower]:
    """Poll until every id is in ``want`` or the time is up (bounded); the last reads."""
    deadline = clock() + timeout_s
    seen: dict[str, NodePower] = {}
    while True:
        seen = describe(power, ids)
        if all(i in seen and seen[i].state == want for i in ids) or clock() >= deadline:
            return seen
        sleep(POLL_S)


def ssh_answers(address: str, port: int, timeout_s: float = SSH_KNOCK_S) -> bool:
    """One knock: a TCP connection that sends an SSH banner (``SSH-``), within
    ``timeout_s``; no address is no answer."""
    if not address:
        return False
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_ssh(
    host: Host,
    deadline: float,
    *,
    knock: Callable[[str, int], bool] = ssh_answers,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    while True:
        if knock(host.address, host.port):
            return True
        if clock() >= deadline:
            return False
        sleep(POLL_S)


def moved_host(t: Target, node: NodePower) -> Host:
    """The host at the address the node has now, of the kind it was reached by (public or
    private); unchanged when the inventory names its own address, -H named it, or the
    cloud keeps the address (a static IP)."""
    address = {"public_ip": node.public_ip, "private_ip": node.private_ip}.get(t.via)
    if not address or address == t.host.address:
        return t.host
    return dataclasses.replace(t.host, address=address)


def carry_host_keys(store: KnownHostsFile, old: Host, new: Host) -> str:
    """The node kept its disk, so its host keys: pin them for the new address too (a key
    another machine left pinned there is dropped), as forget-host-key then a first
    connection would, without trusting whatever answers first."""
    before, after = host_alias(old.address, old.port), host_alias(new.address, new.port)
    if before == after:
        return ""

    def move(entries: list[Entry]) -> tuple[list[Entry], int]:
        keys = keys_for(entries, before)
        if not keys:  # nothing to carry: forget what another machine left, as forget-host-key
            return forget_host(entries, after)[0], 0
        moved, _removed = replace_keys(entries, after, keys)
        return moved, len(keys)

    count = store.update(move)
    if count:
        return f"{count} host key(s) of {before} now pinned for {after} too"
    return f"no key pinned for {before}: the first connection to {after} records one"


def cloud_record(name: str, result: StepResult) -> StepRecord:
    return StepRecord(name, result, 0.0)


def merged_report(
    task: str, order: Sequence[Host], first: Mapping[Host, StepRecord], ran: FleetReport | None
) -> FleetReport:
    """One report in the hosts' order: each host's cloud record, then what ran on it."""
    by_host = {h.host: h for h in (ran.hosts if ran else [])}
    hosts: list[HostReport] = []
    for host in order:
        report = by_host.get(host) or HostReport(host)
        if host in first:
            report.steps.insert(0, first[host])
        hosts.append(report)
    return FleetReport(task, hosts, ran.seconds if ran else 0.0)


def node_lines(report: FleetReport) -> Iterable[str]:
    """One line per node: the failure, or what the cloud did and how each step on the
    node ended."""
    for h in report.hosts:
        if h.connection_error:
            yield f"{h.host.label}: {h.connection_error}: {h.connection_message}"
            continue
        bad = [s for s in h.steps if s.result.is_failure]
        if bad:
            yield f"{h.host.label}: FAILED: {bad[0].name}: {bad[0].result.message}"
            continue
        cloud = [s.result.message for s in h.steps if s.name == report.task]
        steps = [
            f"{s.name} {s.result.status.value}"
            for s in h.steps
            if s.name not in (report.task, "preflight")
        ]
        yield f"{h.host.label}: " + "; ".join([*cloud, *steps])


def _render(report: FleetReport) -> list[Any]:
    return [summary_table(report), *node_lines(report)]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def _run_on_nodes(
    c: Context,
    task: str,
    fleet: Fleet,
    hosts: Sequence[Host],
    steps: Sequence[Step],
    options: Options,
    fleet_args: FleetArgs,
) -> FleetReport | None:
    if not hosts:
        return None

    def make_context(host: Host) -> HostContext:
        return fleet.context(host, options)

    quiet = fleet_args.json or os.environ.get("GPUFLEET_QUIET") == "1"
    return run_fleet(
        task,
        hosts,
        [preflight_step, *steps],
        make_context,
        config=c.config,
        console=None if quiet else _console(fleet_args.json),
        connect_timeout_s=fleet_args.connect_timeout,
    )


_SHARED_HELP = {
    "api_endpoint": "the cloud's compute API URL instead of its own (tests)",
    "prefix": f"where the watchdog is on the node (default {PREFIX})",
    "etc": "its config directory (default /etc/gpufleet)",
}


@fleet_task(
    help={
        "timeout": "seconds to wait for the nodes to run and answer SSH (default 600)",
        "watchdog_timer": "arm the watchdog's systemd timer (--no-watchdog-timer: only check "
        "that the watchdog answers, for hosts without systemd)",
        **_SHARED_HELP,
    },
    bounds={"timeout": Bound(0, high=3600, above=True, example="600")},
)
def start(
    c: Context,
    fleet_args: FleetArgs,
    timeout: float = 600.0,
    watchdog_timer: bool = True,
    api_endpoint: str = "",
    prefix: str = "",
    etc: str = "",
) -> None:
    """Start the stack's stopped nodes, wait for SSH, re-create scratch, arm the watchdog."""
    run = begin(c, fleet_args, api_endpoint)
    fleet, found, power, nodes = run.fleet, run.found, run.power, run.nodes
    refused_here = run.refusals()
    first: dict[Host, StepRecord] = {}
    wanted: list[Target] = []
    for t in found:
        why = refused_here.get(t.host)
        state = nodes[t.instance_id].state if why is None else ""
        if why is None:
            why = unsettled(t.instance_id, state)
        if why:
            first[t.host] = cloud_record("start", StepResult.failed(why))
        else:
            wanted.append(t)
    began = time.monotonic()
    to_start = [t.instance_id for t in wanted if nodes[t.instance_id].state in STARTABLE]
    refused = power.start(to_start) if to_start else {}
    waiting = [t.instance_id for t in wanted if t.instance_id not in refused]
    now = wait_for_states(power, waiting, "running", timeout) if waiting else {}
    deadline = began + timeout
    store = KnownHostsFile(host_key_settings(c.config).path)
    ready: list[Host] = []
    for t in wanted:
        iid = t.instance_id
        node = now.get(iid)
        if iid in refused:
            first[t.host] = cloud_record("start", StepResult.failed(f"{iid}: {refused[iid]}"))
            continue
        if node is None or node.state != "running":
            state = node.state if node else "unknown"
            first[t.host] = cloud_record(
                "start", StepResult.failed(f"{iid} still {state} after {timeout:g} s")
            )
            continue
        host = moved_host(t, node)
        if not wait_for_ssh(host, deadline):
            first[host] = cloud_record(
                "start", StepResult.failed(f"{iid} runs but SSH on {host.label} does not answer")
            )
            continue
        verb = "started" if iid in to_start else "already running"
        notes = [f"{iid} {verb}, SSH answers after {time.monotonic() - began:.0f} s"]
        if host.address != t.host.address:
            notes.append(
                f"address {t.host.address} -> {host.address} (pulumi up --refresh updates the "
                "stack outputs; until then pass -H)"
            )
            notes.append(carry_host_keys(store, t.host, host))
        first[host] = cloud_record(
            "start",
            StepResult.changed("; ".join(n for n in notes if n))
            if iid in to_start
            else StepResult.ok("; ".join(notes)),
        )
        ready.append(host)
    options = WatchdogOptions(enable_timer=watchdog_timer, prefix=prefix, etc=etc).as_options()
    ran = _run_on_nodes(
        c, "start", fleet, ready, [mount_scratch_step, watchdog_running_step], options, fleet_args
    )
    # Each node under the address it has now (its old one when it never came back).
    at = {h.name or h.address: h for h in first}
    order = [at.get(t.host.name or t.host.address, t.host) for t in found]
    report = merged_report("start", order, first, ran)
    emit(report, as_json=fleet_args.json, console=_console(fleet_args.json), render=_render)


@fleet_task(
    help={
        "force": "stop every node, even one whose scratch was not saved or that runs a job",
        "timeout": "seconds to wait for the nodes to read as stopped (default 600)",
        "sync_timeout": "seconds each node may spend saving scratch (default: the watchdog's)",
        **_SHARED_HELP,
    },
    bounds={
        "timeout": Bound(0, high=3600, above=True, example="600"),
        "sync_timeout": Bound(0, high=86400, example="1800"),
    },
)
def stop(
    c: Context,
    fleet_args: FleetArgs,
    force: bool = False,
    timeout: float = 600.0,
    sync_timeout: float = 0.0,
    api_endpoint: str = "",
    prefix: str = "",
    etc: str = "",
) -> None:
    """Save each node's scratch to the bucket, then stop it through the cloud's API."""
    run = begin(c, fleet_args, api_endpoint)
    fleet, found, power, nodes = run.fleet, run.found, run.power, run.nodes
    refused_here = run.refusals()
    skip: dict[Host, StepRecord] = {}
    running: list[Target] = []
    for t in found:
        why = refused_here.get(t.host)
        if why:
            skip[t.host] = cloud_record("stop", StepResult.failed(why))
        elif nodes[t.instance_id].state == "stopped":
            skip[t.host] = cloud_record("stop", StepResult.ok(f"{t.instance_id} already stopped"))
        else:
            running.append(t)
    options = Options(
        force=force,
        tasks=(WatchdogOptions(sync_timeout_s=sync_timeout, prefix=prefix, etc=etc),),
    )
    ran = _run_on_nodes(
        c, "stop", fleet, [t.host for t in running], [save_scratch_step], options, fleet_args
    )
    saved = {h.host for h in (ran.hosts if ran else []) if not h.failed}
    go = [t for t in running if t.host in saved or force]
    refused = power.stop([t.instance_id for t in go]) if go else {}
    stopping = [t.instance_id for t in go if t.instance_id not in refused]
    now = wait_for_states(power, stopping, "stopped", timeout) if stopping else {}
    last: dict[Host, StepRecord] = {}
    for t in running:
        last[t.host] = cloud_record("stop", _stop_result(t, t in go, refused, now))
    report = merged_report("stop", [t.host for t in found], skip, ran)
    for h in report.hosts:
        if h.host in last:
            h.steps.append(last[h.host])
    emit(report, as_json=fleet_args.json, console=_console(fleet_args.json), render=_render)


def _stop_result(
    t: Target, asked: bool, refused: Mapping[str, str], now: Mapping[str, NodePower]
) -> StepResult:
    iid = t.instance_id
    if not asked:
        return StepResult.failed(f"{iid} not stopped: its scratch was not saved")
    if iid in refused:
        return StepResult.failed(f"{iid}: {refused[iid]}")
    node = now.get(iid)
    if node is None or node.state != "stopped":
        state = node.state if node else "unknown"
        return StepResult.changed(f"{iid} asked to stop; still {state} (fab start later)")
    if node.instance.billed_while_stopped:
        return StepResult.changed(
            f"{iid} stopped, but its compute is still billed: the cloud stopped it in "
            "standard mode (economical mode is not offered for local-disk, classic-network "
            "or subscription instances)"
        )
    return StepResult.changed(f"{iid} stopped")
