"""``fab recover``: replace a node the cloud deleted, set it up, verify it, let it rejoin.

A node the cloud deleted (a spot instance Tencent repossessed, a failed host) leaves its run
waiting for its node rank. ``fab recover --stack S [--node N]`` replaces that node alone,
through the same Pulumi Automation API path as ``make up`` (infra/automation.py), in stages,
each said in one line with what it did and its time:

  check    the node is gone: it does not answer SSH, and a refresh preview of its
           instance says the cloud no longer has it (a stopped node is not gone)
  refresh  that node's resources alone: the deleted instance leaves the state
  update   that node's resources alone (what depends on them updated in place), once a
           preview of it says it deletes and replaces nothing
  ssh      the new address (the stack's outputs) answers SSH (--ssh-wait, bounded)
  setup    fab setup on that node only
  verify   verify-gpu's health verdict on that node only; a failing verdict stops here,
           and the run keeps waiting: a node never rejoins without a passing verdict
  rejoin   each job the other nodes hold that waits for this node: its job.json with
           the new address, its workdir, and this node rank's supervisor started

Refused in one line before anything changes: an unknown stack or node (exit 2), a node that
answers SSH or that the cloud still has (exit 1: a running node is never replaced). Every
stage is appended to ``stacks/.gpufleet/<stack>-recover.jsonl``; a recover stopped after
its update (no SSH in time, setup or verdict failed) goes on from the SSH wait when run
again. Exit status: 0 recovered (or nothing gone), 1 a stage failed or a refusal, 2 bad
input.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console

from bootstrap.fleet import node_package
from bootstrap.fleet.api import (
    DEFAULT_TORCH_INDEX,
    DEFAULT_VENV,
    Host,
    HostContext,
    Options,
    StepResult,
    step,
)
from bootstrap.fleet.cli import HOST_KEY_OPTIONS_KEY, FleetArgs, fleet_task
from bootstrap.fleet.hostkeys import resolve_settings
from bootstrap.fleet.hosts import Fleet, HostDiscoveryError, parse_stack_outputs
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import HOST_KEY_SETTINGS_KEY, run_fleet
from bootstrap.fleet.system import preflight_step, sh
from bootstrap.tasks.dcgm import DcgmOptions
from bootstrap.tasks.power import ssh_answers
from bootstrap.tasks.setup import setup_steps
from bootstrap.tasks.verify import verify_fleet
from bootstrap.tasks.watchdog import WatchdogOptions
from bootstrap.train.options import JobRef, TrainSend, WorkdirSync
from bootstrap.train.runs import collect_jobs, host_problems, run_steps
from bootstrap.train.spec import DEFAULT_MAX_WORKDIR_MB, JOBS_ROOT, TrainError, rank_of
from bootstrap.train.steps import (
    PREP_FAILED,
    job_dir,
    read_manifest_command,
    runner_command,
    ship_and_run,
    sync_workdir,
    write_job_command,
)
from bootstrap.train.workdir import build_manifest, workdir_files
from bootstrap.verify.expected import expected_from
from bootstrap.verify.health.check import HealthOptions
from bootstrap.verify.replace import NODE_TYPE, instance_urns
from bootstrap.verify.report import save_report
from bootstrap.verify.ship import VerifyOptions
from bootstrap.verify.verdict import FAIL
from bootstrap.verify.verdict_text import overall_line
from infra.catalog import load_catalog
from infra.failover import NodeEngine, UpdateFailed
from infra.render import literal_console, output_width, wrap_prose
from infra.usage import fit

EXIT_DONE, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
DEFAULT_SSH_WAIT_S = 600.0
SSH_POLL_S = 5.0
# A job still in one of these states on the other nodes waits for the lost one (a
# multi-node attempt whose rendezvous waits says running, with waiting_for in fab jobs);
# ended, or interrupted (a supervisor gone too: `fab train --resume`), it waits for nobody.
LIVE_STATES = ("starting", "running")
# Operations of an update preview that would take something away: refused.
DESTRUCTIVE = ("delete", "replace", "delete-replaced", "create-replacement", "discard")


class Refused(Exception):
    """One line saying why nothing (more) is done, and the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.message = message
        self.code = code


# ---------------------------------------------------------------------------- pure parts


def urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


@dataclasses.dataclass(frozen=True)
class NodeTarget:
    """One node's URNs: its instance, and everything a targeted update names."""

    name: str
    instance: str
    urns: tuple[str, ...]
    in_state: bool  # the state still holds the instance


def node_target(resources: Sequence[Mapping[str, Any]], name: str, instance: str) -> NodeTarget:
    """The node's GpuNode component and everything under it in the state, and its instance
    (``instance``: its URN as the offline plan builds it, bootstrap/verify/replace.py)."""
    family = {
        str(r["urn"])
        for r in resources
        if r.get("type") == NODE_TYPE and urn_name(str(r.get("urn"))) == name
    }
    if not family:
        raise Refused(f"the stack's state holds no node {name}: `make up` makes it", EXIT_INVALID)
    grew = True
    while grew:  # children, grandchildren ... of the component
        more = {str(r["urn"]) for r in resources if r.get("parent") in family} - family
        family |= more
        grew = bool(more)
    return NodeTarget(name, instance, tuple(sorted(family | {instance})), instance in family)


def stack_nodes(outputs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    nodes = outputs.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise Refused("the stack's outputs list no nodes: is it deployed (`make up`)?")
    return [n for n in nodes if isinstance(n, Mapping)]


def chosen_nodes(nodes: Sequence[Mapping[str, Any]], given: str) -> list[str]:
    """The node names ``--node`` names (a name, or its index in the stack's nodes: 0 is
    the first); every node when not given."""
    names = [str(n.get("name") or "") for n in nodes]
    if not given:
        return names
    if given in names:
        return [given]
    if given.isdigit() and int(given) < len(names):
        return [names[int(given)]]
    raise Refused(
        f"--node {given}: no such node in the stack (its nodes: {', '.join(names)})",
        EXIT_INVALID,
    )


def address_of(node: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple[str, int]:
    address = node.get("host") or node.get("public_ip") or node.get("private_ip") or ""
    port = node.get("ssh_port") or outputs.get("ssh_port") or 22
    return str(address), int(port)


def wait_ssh(
    address: str,
    port: int,
    wait_s: float,
    *,
    poll_s: float = SSH_POLL_S,
    probe: Callable[[str, int, float], bool] = ssh_answers,
) -> bool:
    """Poll until SSH answers, for at most ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if probe(address, port, max(0.5, min(poll_s, left))):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll_s, left))


def rejoin_spec(spec: Mapping[str, Any], rank: int, host: Host) -> dict[str, Any]:
    """The job's spec with node ``rank`` at the new host's address."""
    nodes = [dict(n) for n in spec.get("nodes") or []]
    nodes[rank] = {**nodes[rank], "address": host.address, "port": host.port, "label": host.label}
    return {**spec, "nodes": nodes}


def waiting_jobs(rows: Sequence[Any], name: str) -> list[tuple[Any, int]]:
    """(job row, node rank) of each live job whose nodes include ``name``."""
    out = []
    for row in rows:
        names = [str(n.get("name") or "") for n in row.spec.get("nodes") or []]
        if row.state in LIVE_STATES and name in names:
            out.append((row, names.index(name)))
    return out


# ---------------------------------------------------------------------------- the record


def log_file(stack: str) -> Path:
    """``stacks/.gpufleet/<stack>-recover.jsonl``, beside `make up`'s own log."""
    from infra.stackfiles import STACKS_DIR

    return Path(STACKS_DIR) / ".gpufleet" / f"{stack}-recover.jsonl"


@dataclasses.dataclass
class Record:
    path: Path

    def write(self, **row: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")

    def unfinished(self, node: str) -> Mapping[str, Any] | None:
        """The last row of ``node`` when its recovery was replaced but not finished."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("node") == node:
                return row if row.get("replaced") and not row.get("finished") else None
        return None


class Stages:
    """One line per stage: what it did, and how long it took."""

    def __init__(self, node: str, record: Record, say: Callable[[str], None]):
        self.node, self.record, self.say = node, record, say
        self.started = time.monotonic()
        self.times: dict[str, float] = {}
        self.replaced = False

    def done(self, stage: str, since: float, text: str, **row: Any) -> float:
        seconds = time.monotonic() - since
        self.times[stage] = seconds
        finished = bool(row.pop("finished", False))
        self.record.write(
            node=self.node, stage=stage, text=text, seconds=round(seconds, 2),
            replaced=self.replaced, finished=finished, **row,
        )  # fmt: skip
        line = f"{stage} {self.node}: {text} ({seconds:.1f} s)"
        self.say("\n".join(wrap_prose(line, _width(), "", "  ")))
        return seconds


def _width() -> int:
    return output_width() or 80


# ---------------------------------------------------------------------------- the stages


@dataclasses.dataclass(frozen=True)
class RecoverOptions:
    ssh_wait: float
    connect_timeout: float
    setup: Options
    verify: VerifyOptions
    state_dir: str
    reports: str
    jobs_dir: str
    rejoin: bool


def make_engine(stack: str) -> NodeEngine:
    """The stack through Pulumi's Automation API (tests replace this with a fake)."""
    from infra.automation import PulumiEngine

    return PulumiEngine(stack, say=lambda text: None)


def _fleet(outputs: Mapping[str, Any], stack: str) -> Fleet:
    try:
        return parse_stack_outputs(outputs, source=f"stack {stack}")
    except HostDiscoveryError as exc:
        raise Refused(str(exc)) from None


def check_gone(
    engine: NodeEngine,
    outputs: Mapping[str, Any],
    node: Mapping[str, Any],
    target: NodeTarget,
    timeout: float,
) -> str:
    """Why ``node`` is gone, in words; Refused when it is not."""
    name = target.name
    address, port = address_of(node, outputs)
    if ssh_answers(address, port, timeout):
        raise Refused(
            f"{name} answers SSH at {address}:{port}: not gone, and a running node is "
            "never replaced (`fab health` judges a sick one)"
        )
    if not target.in_state:
        return f"no SSH at {address}:{port}; its instance already left the state"
    if target.instance not in engine.refresh_would_delete([target.instance]):
        raise Refused(
            f"{name} does not answer SSH at {address}:{port} but the cloud still has its "
            "instance (stopped, or starting): not replaced; `fab start` starts a stopped one"
        )
    return f"no SSH at {address}:{port}; the cloud no longer has its instance"


def replace_node(engine: NodeEngine, target: NodeTarget, stages: Stages) -> None:
    """Refresh, preview, update: that node's URNs only."""
    since = time.monotonic()
    if target.in_state:
        done = engine.refresh_only(list(target.urns))
        stages.done(
            "refresh", since,
            f"{len(target.urns)} URN(s) of this node refreshed; "
            f"{done.get('delete', 0)} left the state (its deleted instance)",
        )  # fmt: skip
    since = time.monotonic()
    plan = engine.preview_only(list(target.urns))
    bad = {op: n for op, n in plan.items() if op in DESTRUCTIVE and n}
    if bad:
        said = ", ".join(f"{n} {op}" for op, n in sorted(bad.items()))
        stages.done("update", since, f"refused: the update would {said}", outcome="refused")
        raise Refused(f"{target.name}: not updated: its targeted update would {said}")
    try:
        done = engine.update_only(list(target.urns))
    except UpdateFailed as exc:
        last = [x for x in exc.text.splitlines() if x.strip()][-1:] or ["no error text"]
        stages.done("update", since, f"failed: {last[0].strip()[:200]}", outcome="failed")
        raise Refused(
            f"{target.name}: the update failed (see above); nothing else changed"
        ) from None
    stages.replaced = True
    said = ", ".join(f"{n} {op}" for op, n in sorted(done.items()) if op != "same" and n)
    stages.done("update", since, f"{len(target.urns)} URN(s) targeted: {said or 'no change'}")


def new_host(engine: NodeEngine, stack: str, name: str) -> tuple[Fleet, Host]:
    fleet = _fleet(engine.outputs(), stack)
    host = next((h for h in fleet.hosts if h.name == name), None)
    if host is None:
        raise Refused(f"the stack's outputs name no node {name} after the update")
    return fleet, host


def _one(fleet: Fleet, host: Host) -> Fleet:
    return dataclasses.replace(fleet, hosts=(host,))


def _setup(c: Context, fleet: Fleet, host: Host, opts: RecoverOptions, console: Any) -> str:
    def make(h: Host) -> HostContext:
        scratch = fleet.scratch
        if opts.setup.scratch_path:
            scratch = dataclasses.replace(scratch, path=opts.setup.scratch_path)
        return fleet.context(h, opts.setup, scratch)

    report = run_fleet(
        "recover: setup",
        [host],
        [preflight_step, *setup_steps()],
        make,
        config=c.config,
        console=console,
        connect_timeout_s=opts.connect_timeout,
    )
    problems = host_problems(report)
    if problems:
        raise Refused(f"setup failed: {problems[0]}")
    steps = report.hosts[0].steps
    changed = [s.name for s in steps if s.result.status.value == "changed"]
    return f"{len(steps)} step(s) ok" + (f", changed: {', '.join(changed)}" if changed else "")


def _verify(c: Context, fleet: Fleet, host: Host, opts: RecoverOptions, console: Any) -> str:
    """The node's verify-gpu verdict, judged alone; Refused (the verdict's line) on FAIL."""
    outputs = dict(fleet.outputs)
    v = opts.verify
    try:
        exp = expected_from(
            outputs, load_catalog(), tier=None, cpu=v.cpu, quick=v.quick, nodes=1,
            scratch=fleet.scratch,
        )  # fmt: skip
    except ValueError as exc:
        raise Refused(f"verify: {exc}") from None
    run = verify_fleet(
        _one(fleet, host),
        exp,
        v,
        outputs=outputs,
        config=c.config,
        console=console,
        connect_timeout_s=opts.connect_timeout,
        health=HealthOptions(python=v.python, state_dir=opts.state_dir),
    )
    path = save_report(run, Path(opts.reports))
    verdict = run.verdicts[0]
    line = overall_line([verdict], verdict.status)
    if verdict.status == FAIL:
        first = verdict.failures[0] if verdict.failures else None
        why = f": {first.name}: {first.detail or first.measured}" if first else ""
        raise Refused(f"{line}{why}; the run keeps waiting, {host.name} not rejoined")
    return f"{line} (report {path})"


def _rejoin(
    c: Context, stack_fleet: Fleet, host: Host, opts: RecoverOptions, stages: Stages
) -> list[str]:
    """Each waiting job restarted on this node rank; the problems, one line each."""
    others = tuple(h for h in stack_fleet.hosts if h.name != host.name)
    since = time.monotonic()
    if not others:
        stages.done("jobs", since, "no other node holds a job record: nothing to rejoin")
        return []
    rows, report = collect_jobs(
        c, dataclasses.replace(stack_fleet, hosts=others), opts.jobs_dir, opts.connect_timeout
    )
    unread = host_problems(report)
    waiting = waiting_jobs(rows, str(host.name))
    names = ", ".join(f"{r.job} (node rank {rank})" for r, rank in waiting) or "none"
    note = f"; {len(unread)} node(s) did not answer" if unread else ""
    stages.done("jobs", since, f"waiting for this node: {names}{note}")
    problems: list[str] = []
    for row, rank in waiting:
        since = time.monotonic()
        said = _rejoin_one(c, stack_fleet, host, row.spec, rank, opts)
        ok = not said.startswith("not ")
        stages.done("rejoin", since, f"job {row.job}: {said}", outcome="ok" if ok else "failed")
        if not ok:
            problems.append(f"job {row.job}: {said}")
    return problems


def _rejoin_one(
    c: Context, fleet: Fleet, host: Host, spec: Mapping[str, Any], rank: int, opts: RecoverOptions
) -> str:
    if rank == 0 and int(spec.get("nnodes") or 1) > 1:
        # The other nodes meet the head at its private address (job.json master_addr),
        # which a new instance does not keep.
        return (
            "not rejoined: its head was replaced and the rendezvous address changed; "
            f"`fab train --resume {spec['job']}` restarts every node"
        )
    local = Path(str(spec.get("local_workdir") or ""))
    if not local.is_dir():
        return f"not rejoined: its workdir {local} is not on this machine"
    try:
        manifest = build_manifest(local, workdir_files(local), DEFAULT_MAX_WORKDIR_MB * 1e6)
    except TrainError as exc:
        return f"not rejoined: {exc}"
    send = TrainSend(workdir=WorkdirSync(manifest, local, str(spec["workdir"])))
    report = run_steps(
        c,
        _one(fleet, host),
        "recover: rejoin",
        [rejoin_step],
        tasks=(JobRef(rejoin_spec(spec, rank, host)), send),
        console=None,
        connect_timeout=opts.connect_timeout,
    )
    problems = host_problems(report)
    if problems:
        return f"not rejoined: {problems[0]}"
    return report.hosts[0].steps[-1].result.message


def rejoin_flag() -> str:
    """`` --rejoin`` when the job runner this checkout ships takes it (the node side of a
    rejoin: gpufleet_node/job_boot.py, ``job_runner start ... --rejoin``), else "": a plain
    start of this node rank, which a run still waiting for it takes as its missing node."""
    text = node_package.source(f"{node_package.PACKAGE}/job_runner.py").read_text("utf-8")
    return " --rejoin" if '"--rejoin"' in text else ""


@step("rejoin")
def rejoin_step(conn: Connection, ctx: HostContext) -> StepResult:
    """On the new node: the runner and the job's workdir shipped, its job.json (this node
    at its new address) written, and this node rank's supervisor started to rejoin."""
    spec = ctx.options.need(JobRef).spec
    workdir = ctx.options.need(TrainSend).workdir
    rank = rank_of(spec, ctx.host)
    if rank is None or workdir is None:
        return StepResult.failed(f"{ctx.host.label} is not a node of job {spec['job']}")
    runner, read = ship_and_run(conn, spec["jobs_dir"], read_manifest_command(workdir.remote))
    if not read.ok:
        return StepResult.failed(f"could not make the workdir {workdir.remote}")
    notes = [sync_workdir(conn, workdir, runner, str(read.stdout))]
    start = (
        f"start --job-dir {shlex.quote(job_dir(spec))} --node-rank {rank} "
        f"--detach {shlex.quote(str(spec.get('detach') or 'auto'))} --wait 120{rejoin_flag()}"
    )
    done = sh(conn, f"{write_job_command(spec)}; {runner_command(runner)} {start}", timeout=180)
    if done.exited == PREP_FAILED:
        return StepResult.failed(f"could not write the job folder: {str(done.stderr)[-300:]}")
    lines = str(done.stdout).strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else {}
    except ValueError:
        out = {}
    if not isinstance(out, dict) or not out.get("ok"):
        why = out.get("error") if isinstance(out, dict) and out.get("error") else None
        tail = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        return StepResult.failed(f"not started: {why or tail or 'no answer from the runner'}")
    state = out.get("state") or {}
    notes.append(
        f"node rank {rank} {state.get('effective')} under {out.get('mode')} "
        f"(pid {state.get('pid')})"
    )
    return StepResult.changed("; ".join(notes), rank=rank, state=state)


# ---------------------------------------------------------------------------- the task


def _pin_new_key(c: Context, stack: str, fleet: Fleet, name: str) -> None:
    """The replaced node has a new SSH host key: pin it (as --accept-new-host-key NAME
    would), every other node's key checked as always."""
    option_file = (c.config.get(HOST_KEY_OPTIONS_KEY) or ("", ""))[0]
    c.config[HOST_KEY_SETTINGS_KEY] = resolve_settings(  # type: ignore[assignment]
        stack=stack, known_hosts=option_file, accept=(name,), stack_keys=fleet.host_keys
    )


def recover_node(
    c: Context,
    engine: NodeEngine,
    stack: str,
    given: str,
    opts: RecoverOptions,
    *,
    say: Callable[[str], None] = print,
    console: Any = None,
) -> dict[str, float]:
    """The whole recovery of one gone node (or of the one gone node the stack has); the
    seconds of each stage. Refused ends it with one line."""
    outputs = engine.outputs()
    nodes = stack_nodes(outputs)
    wanted = chosen_nodes(nodes, given)
    record = Record(log_file(stack))
    rows = {n: record.unfinished(n) for n in wanted}
    resumed = {n: row for n, row in rows.items() if row is not None}
    urns = instance_urns_or_refuse(stack, wanted)
    resources = engine.resources()
    targets = {n: node_target(resources, n, urns[n]) for n in wanted}
    by_name = {str(n.get("name")): n for n in nodes}
    if resumed:
        name = next(iter(resumed))
        stages = Stages(name, record, say)
        stages.replaced = True
        last = resumed[name]
        said = (
            f"{name} was replaced by an earlier recover ({last.get('time')}, stopped at "
            f"{last.get('stage')}): going on from the SSH wait"
        )
        say("\n".join(wrap_prose(said, _width(), "", "  ")))
    else:
        gone: dict[str, str] = {}
        notes: list[str] = []
        for n in wanted:
            try:
                gone[n] = check_gone(engine, outputs, by_name[n], targets[n], opts.connect_timeout)
            except Refused as exc:
                if given:
                    raise
                notes.append(exc.message)
        if not gone:
            raise Refused(f"no node of stack {stack} is gone: nothing to recover", EXIT_DONE)
        if len(gone) > 1:
            raise Refused(
                f"{len(gone)} nodes are gone ({', '.join(gone)}): recover one at a time, "
                "--node NAME"
            )
        name = next(iter(gone))
        stages = Stages(name, record, say)
        stages.done("check", stages.started, f"gone: {gone[name]}")
        replace_node(engine, targets[name], stages)
    return _after_update(c, engine, stack, name, opts, stages, console)


def instance_urns_or_refuse(stack: str, names: Sequence[str]) -> dict[str, str]:
    try:
        urns = instance_urns(stack, names)
    except ValueError as exc:
        raise Refused(str(exc), EXIT_INVALID) from None
    missing = [n for n in names if n not in urns]
    if missing:
        raise Refused(f"stack {stack} declares no node {', '.join(missing)}", EXIT_INVALID)
    return urns


def _after_update(
    c: Context,
    engine: NodeEngine,
    stack: str,
    name: str,
    opts: RecoverOptions,
    stages: Stages,
    console: Any,
) -> dict[str, float]:
    since = time.monotonic()
    fleet, host = new_host(engine, stack, name)
    if not wait_ssh(host.address, host.port, opts.ssh_wait):
        stages.done("ssh", since, f"no SSH at {host.address}:{host.port}", outcome="timeout")
        raise Refused(
            f"{name}: no SSH at {host.address}:{host.port} within {opts.ssh_wait:g} s; "
            "run fab recover again to go on waiting"
        )
    stages.done("ssh", since, f"answers at {host.address}:{host.port}")
    _pin_new_key(c, stack, fleet, name)
    for stage, run in (("setup", _setup), ("verify", _verify)):
        since = time.monotonic()
        try:
            said = run(c, fleet, host, opts, console)
        except Refused as exc:
            stages.done(stage, since, exc.message, outcome="failed")
            raise
        stages.done(stage, since, said)
    problems = _rejoin(c, fleet, host, opts, stages) if opts.rejoin else []
    since = time.monotonic()
    total = time.monotonic() - stages.started
    if problems:
        stages.done("done", since, f"replaced in {total:.0f} s; {len(problems)} job(s) not "
                    "rejoined (above)", outcome="partial")  # fmt: skip
        raise Refused(f"{name}: replaced and verified; not every job rejoined")
    stages.done("done", since, f"replaced, verified and rejoined in {total:.0f} s", finished=True)
    return stages.times


def _console(quiet: bool) -> Console | None:
    console: Console = literal_console(stderr=False)
    return None if quiet else console


_SETUP = Options()
_VERIFY = VerifyOptions()
_HEALTH = HealthOptions()


@fleet_task(
    shared=("stack", "connect_timeout"),
    help={
        "node": "the node to replace: its name (fab status shows them) or its index in the "
        "stack (0: the head); default: the stack's one gone node",
        "ssh_wait": f"seconds to wait for SSH on the new node (default {DEFAULT_SSH_WAIT_S:g})",
        "allow_no_gpu": "setup and verify a node without an NVIDIA GPU (tests, CPU stacks)",
        "venv": f"setup: the node venv (default {DEFAULT_VENV})",
        "torch_index": "setup: auto (CUDA-matched), default (node's pip config) or a URL",
        "watchdog_timer": "setup: arm the idle watchdog's timer (--no-watchdog-timer: no)",
        "dcgm": "setup: install NVIDIA DCGM (--no-dcgm: skip)",
        "cpu": "verify: the training step on CPU (gloo): a CPU run, never a GPU PASS",
        "quick": "verify: inventory, health and GEMM only",
        "python": "verify: the node's Python with torch (default: the venv's)",
        "verify_timeout": f"verify: seconds before its run is killed ({_VERIFY.timeout_s:g})",
        "state_dir": f"the node's state folder for the health verdict ({_HEALTH.state_dir})",
        "reports": "folder for verify's JSON report (default reports/)",
        "jobs_dir": f"job folders on the nodes (default {JOBS_ROOT})",
        "rejoin": "restart the waiting jobs on the new node (--no-rejoin: set up only)",
    },
    bounds={
        "ssh_wait": Bound(0, above=True, example="600"),
        "verify_timeout": Bound(0, above=True, example=f"{_VERIFY.timeout_s:g}"),
    },
)
def recover(
    c: Context,
    fleet_args: FleetArgs,
    node: str = "",
    ssh_wait: float = DEFAULT_SSH_WAIT_S,
    allow_no_gpu: bool = False,
    venv: str = DEFAULT_VENV,
    torch_index: str = DEFAULT_TORCH_INDEX,
    watchdog_timer: bool = True,
    dcgm: bool = True,
    cpu: bool = False,
    quick: bool = False,
    python: str = "",
    verify_timeout: float = _VERIFY.timeout_s,
    state_dir: str = _HEALTH.state_dir,
    reports: str = "reports",
    jobs_dir: str = "",
    rejoin: bool = True,
) -> None:
    """Replace a node the cloud deleted, set it up, verify it, let its jobs rejoin."""
    stack = fleet_args.stack or os.environ.get("PULUMI_STACK", "")
    if not stack:
        raise Exit("gpufleet: recover: --stack STACK: which stack's node to replace", code=2)
    from infra.stackfiles import STACKS_DIR, StackNotFound, find_stack

    try:
        find_stack(stack, STACKS_DIR)
    except StackNotFound as exc:
        raise Exit(f"gpufleet: recover: --stack: {exc}", code=2) from None
    py = python or f"{venv.rstrip('/')}/bin/python"
    opts = RecoverOptions(
        ssh_wait=ssh_wait,
        connect_timeout=fleet_args.connect_timeout,
        setup=Options(
            allow_no_gpu=allow_no_gpu,
            venv=venv,
            torch_index=torch_index,
            tasks=(
                WatchdogOptions(enable_timer=watchdog_timer),
                DcgmOptions(install=dcgm),
                HealthOptions(state_dir=state_dir),
            ),
        ),
        verify=dataclasses.replace(
            _VERIFY, python=py, cpu=cpu, quick=quick, timeout_s=verify_timeout
        ),
        state_dir=state_dir,
        reports=reports,
        jobs_dir=jobs_dir or JOBS_ROOT,
        rejoin=rejoin,
    )
    quiet = os.environ.get("GPUFLEET_QUIET") == "1"

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        engine = make_engine(stack)
        recover_node(c, engine, stack, node, opts, say=say, console=_console(quiet))
    except Exception as exc:
        if isinstance(exc, Refused):
            raise _said(exc) from None
        if not type(exc).__module__.startswith("pulumi"):
            raise
        # The Automation API's own errors (no Pulumi CLI, no such stack in the backend, a
        # refresh that failed): their last line, never a traceback.
        last = [x.strip() for x in str(exc).splitlines() if x.strip()][-1:] or [repr(exc)]
        raise _said(Refused(f"Pulumi: {last[0][:300]}")) from None


def _said(exc: Refused) -> Exit:
    """Say a refusal's line (stderr unless it is the 'nothing to do' answer); its exit."""
    print(fit(f"gpufleet: recover: {exc.message}"), file=sys.stderr if exc.code else sys.stdout)
    return Exit(code=exc.code)
