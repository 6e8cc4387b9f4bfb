"""``fab train``, ``fab jobs``, ``fab logs``, ``fab cancel``: the user's own job on the fleet.

``fab train --script train.py`` copies the workdir to every node (changed files only), starts
torchrun on each node under a detached supervisor (``gpufleet_node/job_runner.py``: a
systemd transient unit where systemd runs, else a double-forked process with a pid file),
and returns once the job runs everywhere (``--follow``: streams its output until it ends).
Checkpoints in GPUFLEET_CHECKPOINT_DIR go to the stack's bucket while the job runs and when
it ends; ``--resume JOB`` reruns the recorded job from the newest complete one.

Everything decided is a pure function in :mod:`bootstrap.train` (workdir selection and
diff, job id, network environment from the catalog, the job spec, merging the nodes' job
states, the table); the steps only move bytes and run the node-side commands. Bad input
stops with one line and exit status 2 before any node is touched. This module holds the
tasks and their glue.
"""

from __future__ import annotations

import datetime as dt
import json as jsonlib
import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console

from bootstrap.fleet.api import Host
from bootstrap.fleet.cli import BUCKET_HELP, FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport, summary_table
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.tasks.verify import master_address
from bootstrap.train import check_cache
from bootstrap.train.jobs import NARROW_COLUMNS, JobRow, find_job, jobs_table, resumed_text
from bootstrap.train.options import (
    CancelOptions,
    JobRef,
    ResumeCheck,
    TrainCheck,
    TrainSend,
    WorkdirSync,
)
from bootstrap.train.resume import check_restorable, job_to_resume
from bootstrap.train.runs import (
    chart_path,
    collect_jobs,
    follow_logs,
    host_problems,
    job_hosts,
    run_steps,
    warn_unreachable,
    write_chart,
)
from bootstrap.train.spec import (
    DEFAULT_MAX_WORKDIR_MB,
    DEFAULT_SYNC_QUIET_S,
    JOBS_ROOT,
    ResumeOptions,
    TrainError,
    TrainRequest,
    check_bucket_home,
    check_recovery,
    hourly_price,
    job_spec,
    new_job_id,
    notify_option,
    parse_request,
    recovery_options,
    resume_changes,
    resume_spec,
    split_args,
)
from bootstrap.train.steps import (
    cancel_step,
    restored_line,
    resume_check_step,
    resumed_from,
    train_check_step,
    train_restore_step,
    train_start_step,
    wrote_nothing_lines,
)
from bootstrap.train.workdir import build_manifest, kept_back, workdir_files
from bootstrap.verify.health.check import MAX_AGE_HOURS
from gpufleet_node.verify_health import STATE_DIR
from infra.render import literal_console, output_width, wrap, wrap_prose


def _fail(message: str) -> Exit:
    return Exit(f"gpufleet: {message}", code=2)


@contextmanager
def _refusals() -> Iterator[None]:
    """A TrainError (bad input, one line) stops the task with exit status 2."""
    try:
        yield
    except TrainError as exc:
        raise _fail(str(exc)) from None


def _quiet() -> bool:
    return os.environ.get("GPUFLEET_QUIET") == "1"


TRAIN_HELP = {
    "script": "the training script, run by torchrun on every node (path on this machine)",
    "args": "arguments for the script, as one quoted string; {checkpoint_dir}, {job}, "
    "{attempt}, {node_rank}, {scratch} and {newest GLOB} are filled in on the node "
    "({{ }}: a brace); with --resume: replaces the recorded ones",
    "resume_args": "arguments added after --args on every attempt that restored a "
    'checkpoint, e.g. "--init_from=resume" (same placeholders)',
    "workdir": "folder copied to the nodes (default: the script's folder); .gitignore is "
    "honoured, .git never copied",
    "name": "a name for the job (default: the script's name); JOB arguments accept it",
    "nproc_per_node": "processes per node (default: one per GPU; 1 with --cpu)",
    "cpu": "run on CPUs with gloo (no GPU needed): for tests and dry runs",
    "stop_when_done": "stop the nodes once the job ended and its last checkpoint is in the bucket",
    "follow": "stream the job's output until it ends; exit with its status",
    "resume": "JOB (id or name) or 'auto': rerun a recorded job from its newest complete "
    "checkpoint in the bucket; --args, --resume-args, --venv, --node-env, "
    "--nproc-per-node, --sync-interval, --sync-quiet, --s3-endpoint, --detach, "
    "--stop-when-done, --max-restarts, --hang-after, --max-cost, --notify given with it "
    "replace the recorded ones",
    "venv": f"the node venv with torch (default {DEFAULT_VENV}, made by fab setup)",
    "jobs_dir": f"job folders on the nodes (default {JOBS_ROOT})",
    "max_workdir_mb": f"refuse a workdir over this size (default {DEFAULT_MAX_WORKDIR_MB:g})",
    "sync_interval": "seconds between checkpoint uploads while the job runs (default 60)",
    "sync_quiet": "seconds the checkpoint folder must stay unchanged before an upload while "
    f"the job runs (default {DEFAULT_SYNC_QUIET_S:g})",
    "node_env": "extra environment for the job, KEY=VALUE,...",
    "max_restarts": "restart the run this many times after a crash or a hang, each from its "
    "newest checkpoint with --resume-args (default 0; on more nodes through the bucket)",
    "hang_after": "no new output on any rank and no new checkpoint for this long (90, 30s, "
    "10m, 2h) is a hang: the ranks are stopped and, with restarts left, restarted",
    "max_cost": "stop the run (its checkpoint pushed) once it cost this much: every "
    "node-hour of every attempt at the stack's hourly price, in its currency",
    "notify": "a webhook URL (Slack, Teams, Feishu/Lark, DingTalk, or any JSON endpoint; "
    "https) told when an attempt ends and a restart waits, and when the run ends; a "
    "secret: fab shows its host only",
    "s3_endpoint": BUCKET_HELP["s3_endpoint"],
    "master_port": "rendezvous port on the head (default: a free one)",
    "detach": "auto (systemd where it runs, else a supervised process; the default), "
    "systemd or fork",
    "from_scratch": "with --resume: start again from step 0 when there is no checkpoint "
    "to restore (refused otherwise)",
    "rerun": "with --resume: run a job that already succeeded again",
    "ignore_health": f"train on nodes whose health verdict is failed or over {MAX_AGE_HOURS:g} h "
    "old (fab health); the job's record says so",
}

# The node's own ceiling (its GPUs, or its CPUs with --cpu) is judged once its facts are in.
TRAIN_BOUNDS = {
    "nproc_per_node": Bound(1, example="2"),
    "max_workdir_mb": Bound(0, above=True, example="500"),
    "sync_interval": Bound(0, above=True, example="60"),
    "sync_quiet": Bound(0, above=True, example="2"),
    "max_restarts": Bound(0, example="3"),
    "max_cost": Bound(0, above=True, example="50"),
    "master_port": Bound(0, high=65535, example="29500"),
}


def _checked_node_facts(
    c: Context,
    fleet: Fleet,
    check: TrainCheck,
    resume: tuple[JobRef, ResumeCheck] | None,
    console: Console,
    quiet: bool,
    timeout: float,
) -> tuple[dict[Host, dict[str, Any]], Mapping[str, Any] | None]:
    """Every node's train-check facts, and for a resume (``resume``: the job and what its
    check reads) what the head can restore, asked on the same connection; refuses the whole
    job when one node is not ready."""
    steps: list[Any] = [train_check_step]
    if resume is not None:
        steps.append(resume_check_step)
    checked = run_steps(
        c,
        fleet,
        "train",
        steps,
        tasks=(check, *(resume or ())),
        console=None if quiet else console,
        connect_timeout=timeout,
    )
    problems = host_problems(checked)
    if problems:
        warn_unreachable(checked)  # on stderr, as every other refusal
        raise _fail(
            f"{len(problems)} of {len(fleet.hosts)} node(s) not ready: nothing started "
            f"(a {len(fleet.hosts)}-node job needs every node)"
        )
    facts = {}
    for h in checked.hosts:
        details = next(s for s in h.steps if s.name == "train-check").result.details
        facts[h.host] = {**details["facts"], "health": details.get("health")}
    found = next(
        (
            s.result.details["restorable"]
            for h in checked.hosts
            for s in h.steps
            if s.name == "resume-check" and "restorable" in s.result.details
        ),
        None,
    )
    # What the nodes said of their venvs, for the next launch to skip the torch import.
    check_cache.remember(
        {
            f["cache_key"]: check_cache.Known(f["venv_id"], f["torch"])
            for f in facts.values()
            if f.get("venv_id") and f.get("torch")
        }
    )
    return facts, found


def _report_started(
    started: FleetReport,
    spec: Mapping[str, Any],
    restore: Mapping[str, Any] | None,
    json: bool,
    console: Console,
    nodes: int,
) -> None:
    """The start's table (or JSON document) and the line saying what to run next; exit 1
    when a node did not start. ``restore``: the head's restore answer on a resume."""
    if json:
        doc = {**started.to_json(), "job": spec["job"], "attempt": spec["attempt"]}
        if restore is not None:
            doc["restore"] = dict(restore)
        sys.stdout.write(jsonlib.dumps(doc, indent=2, default=str) + "\n")
    else:
        console.print(summary_table(started))
    if started.failed_hosts:
        if len(started.failed_hosts) == nodes:
            # No node has the job: a `fab cancel` hint would only answer "no job".
            console.print(f"job {spec['job']}: not started on any node", highlight=False)
        else:
            console.print(
                f"job {spec['job']}: not started on every node; `fab cancel {spec['job']}` "
                "stops the nodes where it did start",
                highlight=False,
            )
        raise Exit(code=1)
    if json:
        return
    where = f"on {nodes} node(s) x {spec['nproc_per_node']} process(es)"
    if restore is None:
        said = f"job {spec['job']} running {where}"
    elif int(restore.get("files") or 0):
        # Only a restore that put the checkpoint in place is a resume.
        said = f"job {spec['job']} resumed {where}, from {resumed_from(restore)}"
    else:
        said = f"job {spec['job']} restarted {where}, from step 0: {restored_line(restore)}"
    width = output_width() or NARROW_COLUMNS
    hint = f"`fab logs {spec['job']} --follow`, `fab jobs`, `fab cancel {spec['job']}`"
    for line in [*wrap(said, width), *wrap_prose(hint, width)]:
        console.print(line, highlight=False, soft_wrap=True)


def _follow_to_end(c: Context, fleet: Fleet, spec: Mapping[str, Any], timeout: float) -> None:
    """Stream the job's log until it ends; exit 1 unless it succeeded."""
    # A resume's --follow shows the new attempt, not the earlier ones again (issue 24).
    resumed = int(spec.get("attempt") or 1) > 1
    follow_logs(
        c, fleet, spec, rank=None, follow=True, connect_timeout=timeout, this_attempt=resumed
    )
    rows, _ = collect_jobs(c, fleet, spec["jobs_dir"], timeout)
    final = next((r for r in rows if r.job == spec["job"]), None)
    state = final.state if final else "unknown"
    print(f"job {spec['job']}: {state}", file=sys.stderr)
    if state != "succeeded":
        raise Exit(code=1)


def _new_request(**options: Any) -> tuple[TrainRequest, dict[str, list[Any]]]:
    """A new job's request (``parse_request``'s options) and its workdir's manifest."""
    with _refusals():
        req = parse_request(**options, cwd=Path.cwd())
        return req, build_manifest(
            req.workdir, workdir_files(req.workdir), req.max_workdir_mb * 1e6
        )


def _job_spec_for(
    c: Context,
    fleet: Fleet,
    req: TrainRequest | None,
    old: Mapping[str, Any] | None,
    *,
    venv: str,
    changes: Mapping[str, Any],
    attempt: int,
    ignore_health: bool,
    console: Console,
    quiet: bool,
    timeout: float,
) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The spec to start: a new job from ``req`` or the next attempt of ``old`` (with the
    ``changes`` its resume was given), once every node passed train-check; and for a
    resume, what the head can restore."""
    if old is None:
        with _refusals():
            check_bucket_home(fleet)
    if old is None:
        python = f"{(venv or DEFAULT_VENV).rstrip('/')}/bin/python"
    else:
        python = str(changes.get("python") or old["python"])
    head = fleet.hosts[0]
    nproc = req.nproc_per_node if req else int(changes.get("nproc_per_node") or 0)
    check = TrainCheck(
        head=head,
        python=python,
        venv=str(Path(python).parent.parent),
        jobs_dir=req.jobs_dir if req else str(old["jobs_dir"]) if old else JOBS_ROOT,
        ckpt_parent=f"{fleet.scratch.path.rstrip('/')}/checkpoints",
        cpu=req.cpu if req else bool(old and old.get("cpu")),
        master_port=req.master_port if req else 0,
        nproc=nproc or (int(old["nproc_per_node"]) if old else 0),
        ignore_health=ignore_health,
    )
    # A resume's check reads the bucket as the new attempt will (its --s3-endpoint, its
    # --node-env credentials).
    resume = (
        None if old is None else (JobRef(old), ResumeCheck({**old, **changes} if changes else None))
    )
    facts, found = _checked_node_facts(c, fleet, check, resume, console, quiet, timeout)
    port = (req.master_port if req else 0) or int(facts[head].get("port") or 29500)
    addr = master_address(fleet.outputs, fleet, None)
    # Each node's health verdict as this attempt found it (and any --ignore-health override).
    checked = {h.label: f["health"] for h, f in facts.items()}
    if old is not None:
        spec = resume_spec(
            old, master_addr=addr, master_port=port, changes=changes, attempt=attempt
        )
        return {**spec, "health": checked}, found
    assert req is not None
    now = dt.datetime.now(dt.UTC)
    gpus = min(int(f.get("gpus") or 0) for f in facts.values())
    nproc = req.nproc_per_node or (1 if req.cpu else gpus)
    job = new_job_id(req.name, now, secrets.token_hex(2))
    spec = job_spec(req, fleet, job=job, nproc=nproc, master_addr=addr, master_port=port, now=now)
    return {**spec, "health": checked}, None


def _restore_everywhere(
    c: Context,
    fleet: Fleet,
    spec: Mapping[str, Any],
    manifest: dict[str, list[Any]] | None,
    *,
    console: Console | None,
    timeout: float,
) -> Mapping[str, Any]:
    """A resume's restore on every node before any node starts (the workdir sent and
    job.json written on the way): the head's restore answer, or Exit 1 with one line per
    node that did not restore and nothing started."""
    send = TrainSend(workdir=_workdir(spec, manifest))
    report = run_steps(
        c,
        fleet,
        "train",
        [train_restore_step],
        tasks=(JobRef(spec), send),
        console=console,
        connect_timeout=timeout,
    )
    problems = host_problems(report)
    if problems:
        for line in problems:
            print(f"gpufleet: {line}", file=sys.stderr)
        print(
            f"gpufleet: job {spec['job']}: not resumed: {len(problems)} of "
            f"{len(fleet.hosts)} node(s) could not restore its checkpoint; nothing started",
            file=sys.stderr,
        )
        raise Exit(code=1)
    answers = {
        int(s.result.details.get("rank") or 0): dict(s.result.details.get("restore") or {})
        for h in report.hosts
        for s in h.steps
        if s.name == "train-restore"
    }
    return answers.get(0) or {}


def _start(
    c: Context,
    fleet: Fleet,
    spec: Mapping[str, Any],
    manifest: dict[str, list[Any]] | None,
    *,
    console: Console | None,
    timeout: float,
    restored: bool = False,
) -> FleetReport:
    """Send the workdir (when ``manifest``), write job.json, start every node's supervisor;
    after a restore (``restored``) the nodes have both: start only."""
    send = TrainSend(workdir=None if restored else _workdir(spec, manifest), restored=restored)
    return run_steps(
        c,
        fleet,
        "train",
        [train_start_step],
        tasks=(JobRef(spec), send),
        console=console,
        connect_timeout=timeout,
    )


def _workdir(spec: Mapping[str, Any], manifest: dict[str, list[Any]] | None) -> WorkdirSync | None:
    """The workdir to send with the job (None without a manifest: nothing to send)."""
    if manifest is None:
        return None
    return WorkdirSync(manifest, Path(str(spec.get("local_workdir"))), spec["workdir"])


@fleet_task(help=TRAIN_HELP, bounds=TRAIN_BOUNDS)
def train(
    c: Context,
    fleet_args: FleetArgs,
    script: str = "",
    args: str | None = None,
    resume_args: str | None = None,
    workdir: str = "",
    name: str = "",
    nproc_per_node: int = 0,
    cpu: bool = False,
    stop_when_done: bool = False,
    follow: bool = False,
    resume: str = "",
    venv: str = "",
    jobs_dir: str = "",
    max_workdir_mb: float = DEFAULT_MAX_WORKDIR_MB,
    sync_interval: float = 0.0,
    node_env: str = "",
    s3_endpoint: str = "",
    master_port: int = 0,
    detach: str = "",
    sync_quiet: float = 0.0,
    max_restarts: int = 0,
    hang_after: str = "",
    max_cost: float = 0.0,
    notify: str = "",
    from_scratch: bool = False,
    rerun: bool = False,
    ignore_health: bool = False,
) -> None:
    """Run a PyTorch script with torchrun on every node, detached; checkpoints to the bucket."""
    json, timeout = fleet_args.json, fleet_args.connect_timeout
    quiet = bool(json or _quiet())
    console = literal_console(stderr=quiet)
    if resume and script:
        raise _fail("--resume reruns the recorded script: drop --script (or start a new job)")
    if (from_scratch or rerun) and not resume:
        raise _fail("--from-scratch and --rerun go with --resume JOB")
    req: TrainRequest | None = None
    manifest: dict[str, list[Any]] | None = None
    given = ResumeOptions(
        args=args,
        resume_args=resume_args,
        workdir=workdir,
        name=name,
        nproc_per_node=nproc_per_node,
        cpu=cpu,
        stop_when_done=stop_when_done,
        venv=venv,
        sync_interval=sync_interval,
        node_env=node_env,
        s3_endpoint=s3_endpoint,
        detach=detach,
        sync_quiet=sync_quiet,
        max_restarts=max_restarts,
        hang_after=hang_after,
        max_cost=max_cost,
        notify=notify,
    )
    if resume:
        # What needs no node is refused before any is contacted; the rest once the
        # job's record is read (resume_changes).
        with _refusals():
            split_args("--args", args)
            split_args("--resume-args", resume_args)
            recovery_options(max_restarts, hang_after, max_cost)
            if notify:
                notify_option(notify)
        if workdir:
            raise _fail(
                "--workdir: a resume runs from the job's recorded workdir; start a new job "
                "for another one"
            )
    else:
        req, manifest = _new_request(
            script=script,
            args=args,
            resume_args=resume_args,
            workdir=workdir,
            name=name,
            nproc_per_node=nproc_per_node,
            cpu=cpu,
            stop_when_done=stop_when_done,
            venv=venv,
            jobs_dir=jobs_dir,
            max_workdir_mb=max_workdir_mb,
            sync_interval=sync_interval,
            node_env=node_env,
            s3_endpoint=s3_endpoint,
            master_port=master_port,
            detach=detach,
            sync_quiet=sync_quiet,
            max_restarts=max_restarts,
            hang_after=hang_after,
            max_cost=max_cost,
            notify=notify,
        )
    fleet = resolve_fleet(c, fleet_args)
    if len({(h.address, h.port) for h in fleet.hosts}) != len(fleet.hosts):
        raise _fail("the same host is listed twice: each node takes one node rank")

    old: Mapping[str, Any] | None = None
    changes: dict[str, Any] = {}
    attempt = 0
    if resume:
        with _refusals():
            found = job_to_resume(c, fleet, resume, jobs_dir, max_workdir_mb, timeout, rerun)
            if found is not None:
                changes = resume_changes(found[0], given)
        if found is None:
            print("gpufleet: nothing to resume: no interrupted job on these nodes")
            return
        old, fleet, manifest, attempt = found
    elif req is not None:
        with _refusals():
            check_recovery(
                {"max_restarts": max_restarts, "hang_after_s": hang_after, "max_cost": max_cost},
                nnodes=len(fleet.hosts),
                price=(hourly_price(fleet.outputs) or (None,))[0],
                bucket=bool(fleet.outputs.get("bucket")),
            )
        _say_kept_back(req.workdir, console)
    spec, restorable = _job_spec_for(
        c,
        fleet,
        req,
        old,
        venv=venv,
        changes=changes,
        attempt=attempt,
        ignore_health=ignore_health,
        console=console,
        quiet=quiet,
        timeout=timeout,
    )
    restore: Mapping[str, Any] | None = None
    if old is not None:
        with _refusals():
            check_restorable(old, restorable, from_scratch, console)
        if changes:
            said = (
                f"gpufleet: job {spec['job']}, attempt {spec['attempt']}: "
                f"{', '.join(_option_names(changes))} as given now (recorded in its job.json)"
            )
            for line in wrap(said, output_width() or NARROW_COLUMNS):
                console.print(line, highlight=False, soft_wrap=True)
        restore = _restore_everywhere(
            c, fleet, spec, manifest, console=None if quiet else console, timeout=timeout
        )
    started = _start(
        c,
        fleet,
        spec,
        manifest,
        console=None if quiet else console,
        timeout=timeout,
        restored=old is not None,
    )
    _report_started(started, spec, restore, json, console, len(fleet.hosts))
    if follow:
        _follow_to_end(c, fleet, spec, timeout)


def _say_kept_back(workdir: Path, console: Console) -> None:
    """Name what .gitignore keeps from the nodes (a script's data, often): the job that
    reads it would die on the node with FileNotFoundError."""
    for line in kept_back(workdir).lines(output_width() or NARROW_COLUMNS):
        console.print(line, highlight=False, soft_wrap=True)


# The job.json field a resume option changes, by the option's name.
_OPTION_OF = {
    "args": "--args",
    "resume_args": "--resume-args",
    "nproc_per_node": "--nproc-per-node",
    "python": "--venv",
    "sync_interval_s": "--sync-interval",
    "sync_quiet_s": "--sync-quiet",
    "env": "--node-env",
    "s3_endpoint": "--s3-endpoint",
    "detach": "--detach",
    "stop_when_done": "--stop-when-done",
    "max_restarts": "--max-restarts",
    "hang_after_s": "--hang-after",
    "max_cost": "--max-cost",
    "notify_url": "--notify",
}


def _option_names(changes: Mapping[str, Any]) -> list[str]:
    return [_OPTION_OF.get(k, k) for k in changes]


@fleet_task(
    help={
        "jobs_dir": TRAIN_HELP["jobs_dir"],
        "state_dir": f"the nodes' gpufleet state folder, where the watchdog records when the "
        f"hard TTL stops them ({STATE_DIR})",
    }
)
def jobs(c: Context, fleet_args: FleetArgs, jobs_dir: str = "", state_dir: str = "") -> None:
    """Every job on the fleet: state, start, runtime, cost so far, TTL left, last log line."""
    fleet = resolve_fleet(c, fleet_args)
    rows, report = collect_jobs(
        c, fleet, jobs_dir or JOBS_ROOT, fleet_args.connect_timeout, state_dir or str(STATE_DIR)
    )
    warn_unreachable(report)
    # Each job's chart, where `fab logs JOB` has drawn one on this machine.
    charts = {r.job: chart_path(r.job) for r in rows if chart_path(r.job).is_file()}
    if fleet_args.json:
        doc = {
            "jobs": [r.to_json() | {"chart": str(charts.get(r.job) or "") or None} for r in rows],
            "unreachable": host_problems(report),
        }
        sys.stdout.write(jsonlib.dumps(doc, indent=2) + "\n")
    else:
        console = literal_console()
        console.print(jobs_table(rows))
        for job, path in charts.items():
            console.print(f"chart of {job}: {path}", soft_wrap=True)
    if report.failed_hosts:
        raise Exit(code=1)


def _resolve(
    c: Context, fleet_args: FleetArgs, ref: str | None, jobs_dir: str
) -> tuple[Fleet, JobRow]:
    if not ref:
        raise _fail("name the job: its id or --name (`fab jobs` lists them)")
    fleet = resolve_fleet(c, fleet_args)
    rows, report = collect_jobs(c, fleet, jobs_dir or JOBS_ROOT, fleet_args.connect_timeout)
    warn_unreachable(report)
    with _refusals():
        row = find_job(rows, ref)
    return job_hosts(fleet, row.spec), row


@fleet_task(
    positional=["job"],
    # The output is the job's own lines, streamed: there is no JSON document to print.
    shared=("stack", "inventory", "connect_timeout"),
    help={
        "job": "the job's id or name",
        "follow": "keep printing until the job ends (a dropped connection leaves it running)",
        "rank": "only this global rank",
        "jobs_dir": TRAIN_HELP["jobs_dir"],
    },
    bounds={"rank": Bound(0, example="0")},
)
def logs(
    c: Context,
    fleet_args: FleetArgs,
    job: str | None = None,
    follow: bool = False,
    rank: int = -1,
    jobs_dir: str = "",
) -> None:
    """A job's output, every rank (prefixed) or one; --follow tails it."""
    fleet, row = _resolve(c, fleet_args, job, jobs_dir)
    world = row.nnodes * int(row.spec.get("nproc_per_node") or 1)
    if rank >= world:
        raise _fail(f"--rank {rank}: job {row.job} has ranks 0-{world - 1}")
    report = follow_logs(
        c,
        fleet,
        row.spec,
        rank=None if rank < 0 else rank,
        follow=follow,
        connect_timeout=fleet_args.connect_timeout,
    )
    _say_attempt(row)
    _chart(c, fleet, row, fleet_args.connect_timeout)
    if report.failed_hosts:
        warn_unreachable(report)
        raise Exit(code=1)


def _say_attempt(row: JobRow) -> None:
    """After the job's lines (stdout), on stderr: where its attempt resumed from and each
    warning its nodes recorded, one line each."""
    width = output_width(sys.stderr) or NARROW_COLUMNS
    said = []
    if row.resumed_from is not None:
        said += wrap(
            f"job {row.job} attempt {row.attempt} {resumed_text(row.resumed_from)}",
            width,
            "gpufleet: ",
        )
    for warning in row.warnings:
        said += wrap(warning, width, f"gpufleet: job {row.job}: warning: ", "  ")
    for line in said:
        print(line, file=sys.stderr)


def _chart(c: Context, fleet: Fleet, row: JobRow, connect_timeout: float) -> None:
    """The job's chart after its logs, said on stderr (stdout is the job's own lines); a
    chart that cannot be drawn never fails the logs."""
    try:
        path, notes = write_chart(c, fleet, row, connect_timeout=connect_timeout)
    except Exception as exc:
        path, notes = None, [f"chart not drawn: {exc.__class__.__name__}: {exc}"]
    for note in notes:
        print(f"gpufleet: {note}", file=sys.stderr)
    if path is not None:
        print(f"gpufleet: chart of {row.job}: {path}", file=sys.stderr)


@fleet_task(
    positional=["job"],
    help={
        "job": "the job's id or name",
        "wait": "seconds to wait after SIGTERM before SIGKILL (default 60)",
        "jobs_dir": TRAIN_HELP["jobs_dir"],
        "s3_endpoint": "S3-compatible endpoint for the last checkpoint's save (default: "
        "the job's own, as fab train was given it)",
    },
    bounds={"wait": Bound(0, example="60")},
)
def cancel(
    c: Context,
    fleet_args: FleetArgs,
    job: str | None = None,
    wait: float = 60.0,
    jobs_dir: str = "",
    s3_endpoint: str = "",
) -> None:
    """Stop a job gracefully (SIGTERM, bounded wait, SIGKILL); its last checkpoint is saved."""
    fleet, row = _resolve(c, fleet_args, job, jobs_dir)
    json = fleet_args.json
    console = literal_console(stderr=bool(json))
    report = run_steps(
        c,
        fleet,
        "cancel",
        [cancel_step],
        tasks=(JobRef(row.spec), CancelOptions(wait=wait, s3_endpoint=s3_endpoint)),
        console=None if (json or _quiet()) else console,
        connect_timeout=fleet_args.connect_timeout,
    )
    if json:
        sys.stdout.write(jsonlib.dumps(report.to_json(), indent=2, default=str) + "\n")
    else:
        console.print(summary_table(report))
        for line in wrote_nothing_lines(report, row.job, output_width() or NARROW_COLUMNS):
            console.print(line, highlight=False, soft_wrap=True)
    if report.failed_hosts:
        raise Exit(code=1)
