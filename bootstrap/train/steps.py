"""The node-side steps of ``fab train``, ``fab jobs``, ``fab logs`` and ``fab cancel``.

Each step ships the job runner (``gpufleet_node.job_runner`` and what it imports, in the
node package's layout, content-addressed, nothing sent when present) and runs one of its
commands; the steps only move bytes and read the runner's JSON answer, every decision is in
:mod:`~bootstrap.train.spec`, :mod:`~bootstrap.train.workdir` and the runner.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json as jsonlib
import secrets
import shlex
import tarfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection

from bootstrap.fleet import node_package
from bootstrap.fleet.api import HostContext, StepFailed, StepResult, step
from bootstrap.fleet.system import sh
from bootstrap.fleet.ttl import read_ttl
from bootstrap.train import check_cache
from bootstrap.train.options import (
    CancelOptions,
    ChartKeep,
    JobRef,
    JobsList,
    LogsOptions,
    ResumeCheck,
    TrainCheck,
    TrainSend,
    WorkdirSync,
)
from bootstrap.train.spec import check_command, judge_check, parse_check, rank_of
from bootstrap.train.workdir import SYNC_MANIFEST, diff_manifest, pack
from bootstrap.verify.health import gate
from gpufleet_node.verify_health import STATE_DIR
from infra.render import wrap

RUNNER = "{runner}"  # in a command given to ship_and_run: how the node runs the job runner
SHIP_FAILED = 97  # ship_and_run's exit status when the runner could not be installed
PREP_FAILED = 98  # train-start's when the job folder could not be written
NO_JOBS = "gpufleet-no-jobs-folder"  # jobs' answer for a node without the jobs folder
# The node tools fab train and the data tasks run (torchrun runs job_launch per rank); what
# they import in the package (job_sync, the bucket client, the node clouds, the names)
# travels with them, not the watchdog, which fab setup installs.
TOOLS = ("job_runner", "job_launch", "data_sync")
REMOTE_FILES = tuple(node_package.closure(*TOOLS))
MARKER = f"{node_package.PACKAGE}/job_runner.py"  # in a shipped folder: the runner is there


def bundle() -> tuple[str, str]:
    """(sha, base64 of a tar.xz) of the node-side runner files, under ``gpufleet_node/``.
    xz, not gzip: the bundle travels inside one command line (Linux caps one argument at
    128 KiB) and xz makes it about a sixth smaller; the node's python3 unpacks it
    (:data:`UNPACK`), so no xz tool is needed there."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for name in REMOTE_FILES:
            data = node_package.source(name).read_bytes()
            digest.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:12], base64.b64encode(buf.getvalue()).decode()


def runner_path(jobs_dir: str, sha: str) -> str:
    """The folder the runner's files are shipped into (``bin-<sha>``, holding gpufleet_node/)."""
    return f"{jobs_dir.rstrip('/')}/bin-{sha}"


def runner_command(root: str, tool: str = "job_runner") -> str:
    """How the node runs a shipped tool: ``python3 -m gpufleet_node.<tool>`` with ``root``
    (:func:`runner_path`) first on PYTHONPATH, the user's own after it."""
    return node_package.module_command(root, tool, keep_pythonpath=True)


def ensure_dir_command(path: str) -> str:
    q = shlex.quote(path)
    return f"mkdir -p {q} 2>/dev/null || sudo -n install -d -o $(id -u) -g $(id -g) {q}"


# The node's python3 unpacks the runner's tar.xz from stdin into argv[1] (a stream: no
# seek); the "data" extraction filter where Python has it (3.12+, the default from 3.14).
UNPACK = (
    "import sys,tarfile;t=tarfile.open(fileobj=sys.stdin.buffer,mode='r|xz');"
    "k={'filter':'data'} if hasattr(tarfile,'data_filter') else {};"
    "t.extractall(sys.argv[1],**k);t.close()"
)


def ship_command(jobs_dir: str, sha: str, b64: str) -> str:
    """Unpack the runner into ``bin-<sha>/`` unless it is there; content-addressed, so two
    nodes sharing a disk (or two runs at once) never trip over each other."""
    root = shlex.quote(jobs_dir.rstrip("/"))
    final = shlex.quote(f"{jobs_dir.rstrip('/')}/bin-{sha}")
    return (
        f"{ensure_dir_command(jobs_dir)} && if [ ! -f {final}/{MARKER} ]; then "
        f"t=$(mktemp -d {root}/.bin.XXXXXX) && printf %s {b64} | base64 -d | "
        f'python3 -c {shlex.quote(UNPACK)} "$t" && '
        f'(mv -T "$t" {final} 2>/dev/null || rm -rf "$t"); fi; '
        f"test -f {final}/{MARKER}"
    )


def write_file_command(path: str, text: str) -> str:
    b64 = base64.b64encode(text.encode()).decode()
    q = shlex.quote(path)
    parent = shlex.quote(str(Path(path).parent))
    return (
        f"mkdir -p {parent} && t=$(mktemp {parent}/.w.XXXXXX) && printf %s {b64} | "
        f'base64 -d > "$t" && mv "$t" {q}'
    )


def ship_runner(conn: Connection, jobs_dir: str) -> str:
    """Ship the runner (one round trip, nothing sent when present) and return its folder."""
    return ship_and_run(conn, jobs_dir, "")[0]


def ship_then_command(jobs_dir: str, then: str) -> tuple[str, str]:
    """(the runner's folder, a command that ships it unless it is there, then runs ``then``,
    whose ``{runner}`` is the runner's command line, :func:`runner_command`); exit
    SHIP_FAILED when the runner cannot be put there."""
    sha, b64 = bundle()
    path = runner_path(jobs_dir, sha)
    after = f" && {then.replace(RUNNER, runner_command(path))}" if then else ""
    return path, f"{{ {ship_command(jobs_dir, sha, b64)}; }} || exit {SHIP_FAILED}{after}"


def ship_and_run(conn: Connection, jobs_dir: str, then: str) -> tuple[str, Any]:
    """Ship the runner and run ``then`` in one round trip: (its folder, ``then``'s result)."""
    path, command = ship_then_command(jobs_dir, then)
    done = sh(conn, command, timeout=300)
    if done.exited == SHIP_FAILED or (not then and not done.ok):
        why = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        raise StepFailed(f"could not install the job runner in {jobs_dir}: {why}")
    return path, done


def job_dir(spec: Mapping[str, Any]) -> str:
    """The job's folder on its nodes."""
    return f"{str(spec['jobs_dir']).rstrip('/')}/{spec['job']}"


@dataclass(frozen=True)
class NodeJob:
    """A recorded job as one of its nodes runs it."""

    spec: Mapping[str, Any]
    rank: int  # this node's node rank
    job_dir: str

    def command(self, args: str) -> str:
        """``job_runner.py ARGS`` with the runner shipped first, in one round trip."""
        return ship_then_command(self.spec["jobs_dir"], f"{RUNNER} {args}")[1]


def node_job(conn: Connection, ctx: HostContext) -> NodeJob | None:
    """The job of ``ctx.options``' JobRef on this node; None when this host is not a node of
    the job. Its commands ship the runner as they run (NodeJob.command)."""
    del conn  # nothing to ask the node yet
    spec = ctx.options.need(JobRef).spec
    rank = rank_of(spec, ctx.host)
    if rank is None:
        return None
    return NodeJob(spec, rank, job_dir(spec))


def _json_out(done: Any, what: str) -> dict[str, Any]:
    text = str(done.stdout).strip().splitlines()
    try:
        data = jsonlib.loads(text[-1]) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        if done.exited == SHIP_FAILED:
            raise StepFailed(f"{what}: could not install the job runner: {tail}")
        raise StepFailed(f"{what}: no answer from the job runner (exit {done.exited}): {tail}")
    return data


# ---------------------------------------------------------------------------- steps


@step("train-check")
def train_check_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Can this node run the job? (reads only; torch is imported only for a venv this
    machine has not seen as it is now: check_cache)"""
    x = ctx.options.need(TrainCheck)
    want_port = ctx.host == x.head and not x.master_port
    key = check_cache.entry_key(host_key(conn), ctx.host.address, ctx.host.port, x.python)
    known = check_cache.lookup(key)
    command = check_command(
        x.python,
        x.jobs_dir,
        x.ckpt_parent,
        want_port,
        (known.venv_id, known.torch) if known else None,
    )
    done = sh(conn, f"{command}; {gate.check_lines(x.jobs_dir)}", timeout=60)
    facts = {**parse_check(str(done.stdout)), "cache_key": key}
    why = judge_check(facts, cpu=x.cpu, venv=x.venv, host=ctx.host.label, nproc=x.nproc)
    record = gate.health_record(facts)
    facts.pop("health", None)  # the record keeps what counts of it
    if why:
        return StepResult.failed(why, facts=facts, health=record)
    held = gate.quarantined(record, ctx.host.label)  # waits for its replacement: no override
    if held:
        return StepResult.failed(held, facts=facts, health=record)
    why = gate.refusal(record, ctx.host.label)
    if why and not x.ignore_health:
        return StepResult.failed(why, facts=facts, health=record)
    if why:
        record["override"] = why  # --ignore-health: the job's record says what was ignored
    cached = " (known venv)" if facts.get("torch_cached") == "yes" else ""
    return StepResult.ok(
        f"torch {facts['torch']}{cached}, {facts.get('gpus', '0')} GPU(s), "
        f"systemd {facts['systemd']}"
        f", health {record['status']}" + (" (ignored)" if why else ""),
        facts=facts,
        health=record,
    )


def host_key(conn: Connection) -> str:
    """The node's SSH host key as this connection verified it ("" when unknown)."""
    transport = conn.client.get_transport()
    if transport is None:
        return ""
    key = transport.get_remote_server_key()
    return f"{key.get_name()} {key.fingerprint}"


def sync_workdir(conn: Connection, workdir: WorkdirSync, runner: str, remote_text: str) -> str:
    """Send what changed in the workdir; ``remote_text``: the node's sync manifest, read in
    the round trip that shipped the runner (:func:`read_manifest_command`)."""
    remote_dir, manifest, root = workdir.remote, workdir.manifest, workdir.local
    try:
        remote = dict(jsonlib.loads(remote_text or "{}").get("files") or {})
    except (ValueError, AttributeError):
        remote = {}
    send, delete = diff_manifest(manifest, remote)
    if not send and not delete:
        return f"workdir unchanged ({len(manifest)} file(s))"
    data = pack(root, send, {"files": manifest, "delete": delete})
    tmp = f"{remote_dir.rstrip('/')}/../.upload-{secrets.token_hex(4)}.tar.gz"
    put_bytes(conn, data, tmp)
    q = shlex.quote(remote_dir)
    out = _json_out(
        sh(
            conn,
            f"{runner_command(runner)} unpack --workdir {q} --tar {shlex.quote(tmp)}",
            timeout=300,
        ),
        "workdir update",
    )
    if not out.get("ok"):
        raise StepFailed(f"workdir update refused: {out.get('error')}")
    return f"workdir: {len(send)} file(s) sent ({len(data) / 1e3:.0f} kB), {len(delete)} removed"


def read_manifest_command(remote_dir: str) -> str:
    """The node's copy of the workdir made, and its sync manifest printed ("" when none)."""
    q = shlex.quote(remote_dir)
    return f"{ensure_dir_command(remote_dir)} && {{ cat {q}/{SYNC_MANIFEST} 2>/dev/null; true; }}"


def put_bytes(conn: Connection, data: bytes | Path, path: str) -> None:
    """Copy ``data`` (bytes, or a file here: streamed) to ``path`` on the node over SFTP,
    naming a missing SFTP subsystem."""
    try:
        conn.put(str(data) if isinstance(data, Path) else io.BytesIO(data), path)
    except paramiko.SSHException as exc:
        # sshd refuses the subsystem by closing the channel: paramiko says only "Channel
        # closed." while the session itself is fine. A dead session is a lost connection.
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise
        raise StepFailed(
            f"the node's sshd has no SFTP subsystem ({exc}): add `Subsystem sftp "
            "internal-sftp` to /etc/ssh/sshd_config and reload sshd; fab train and "
            "fab data-push copy files over SFTP"
        ) from None


def _send_workdir(
    conn: Connection, ctx: HostContext, spec: Mapping[str, Any]
) -> tuple[str, list[str]]:
    """Ship the runner and, when TrainSend holds a workdir, send what changed in it: (the
    runner's path, what was done). One round trip when nothing changed."""
    workdir = ctx.options.need(TrainSend).workdir
    then = read_manifest_command(workdir.remote) if workdir is not None else "true"
    runner, read = ship_and_run(conn, spec["jobs_dir"], then)
    notes = []
    if workdir is not None:
        if not read.ok:
            why = str(read.stderr).strip()[-300:]
            raise StepFailed(f"could not make the workdir {workdir.remote}: {why}")
        notes.append(sync_workdir(conn, workdir, runner, str(read.stdout)))
    return runner, notes


def write_job_command(spec: Mapping[str, Any]) -> str:
    """The job's folders made and its job.json written (whole: temp file, rename); exit
    PREP_FAILED when they cannot be."""
    prep = " && ".join(
        [
            ensure_dir_command(str(Path(spec["checkpoint_dir"]).parent)),
            ensure_dir_command(spec["checkpoint_dir"]),
            write_file_command(f"{job_dir(spec)}/job.json", jsonlib.dumps(spec, indent=1)),
        ]
    )
    return f"{{ {prep}; }} || exit {PREP_FAILED}"


def _prep_failed(done: Any) -> None:
    if done.exited == PREP_FAILED:
        why = str(done.stderr).strip()[-300:]
        raise StepFailed(f"could not write the job folder: {why}")


@step("train-restore")
def train_restore_step(conn: Connection, ctx: HostContext) -> StepResult:
    """A resume, before any node starts: the workdir sent, job.json written and the newest
    checkpoint version restored into this node's checkpoint folder (job_runner.py restore).
    Nothing is started: the supervisors start only once every node restored."""
    spec = ctx.options.need(JobRef).spec
    rank = rank_of(spec, ctx.host)
    if rank is None:
        return StepResult.failed(f"{ctx.host.label} is not a node of job {spec['job']}")
    runner, notes = _send_workdir(conn, ctx, spec)
    done = sh(
        conn,
        f"{write_job_command(spec)}; {runner_command(runner)} restore --job-dir "
        f"{shlex.quote(job_dir(spec))} --node-rank {rank}",
        timeout=ctx.options.need(TrainSend).restore_timeout,
    )
    _prep_failed(done)
    out = _json_out(done, "restore")
    restore = dict(out.get("restore") or {})
    if not out.get("ok"):
        why = out.get("error") or restore.get("detail") or "no reason given"
        return StepResult.failed(f"restore failed: {why}", rank=rank, restore=restore)
    notes.append(f"node rank {rank}: {restored_line(restore)}")
    return StepResult.changed("; ".join(notes), rank=rank, restore=restore)


def restored_line(restore: Mapping[str, Any]) -> str:
    """What one node's restore put in its checkpoint folder, in words."""
    files = int(restore.get("files") or 0)
    if not files:
        return f"nothing restored ({restore.get('detail') or 'no checkpoint'})"
    what = resumed_from(restore)
    fetched, kept = int(restore.get("fetched") or 0), int(restore.get("kept") or 0)
    moved = f"{fetched} fetched ({float(restore.get('bytes') or 0) / 1e6:.1f} MB)"
    return f"{what}: {files} file(s), {moved}, {kept} kept"


def resumed_from(restore: Mapping[str, Any]) -> str:
    """``version 3 (step 200)``: which version a restore took (and its step, when known)."""
    version, step_ = restore.get("version"), restore.get("step")
    if version is None:
        where = "the node's own checkpoint folder"
        return where if step_ is None else f"{where} (step {step_})"
    return f"version {version}" + (f" (step {step_})" if step_ is not None else "")


@step("train-start")
def train_start_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Copy the runner and the workdir, write job.json, start the detached supervisor: two
    round trips when the workdir is unchanged (ship + read its manifest; write + start).
    After train-restore (TrainSend ``restored``) the folder is ready: start only, one trip."""
    spec = ctx.options.need(JobRef).spec
    rank = rank_of(spec, ctx.host)
    if rank is None:
        return StepResult.failed(f"{ctx.host.label} is not a node of job {spec['job']}")
    notes: list[str] = []
    start = (
        f"start --job-dir {shlex.quote(job_dir(spec))} --node-rank {rank} "
        f"--detach {spec.get('detach', 'auto')} --wait 120"
    )
    if ctx.options.need(TrainSend).restored:
        command = ship_then_command(spec["jobs_dir"], f"{RUNNER} {start}")[1]
    else:
        runner, notes = _send_workdir(conn, ctx, spec)
        command = f"{write_job_command(spec)}; {runner_command(runner)} {start}"
    started = sh(conn, command, timeout=180)
    _prep_failed(started)
    out = _json_out(started, "start")
    if not out.get("ok"):
        return StepResult.failed(f"job not started: {out.get('error')}")
    state = out["state"]
    notes.append(
        f"node rank {rank}: {state.get('effective')} under {out['mode']} (pid {state['pid']})"
    )
    return StepResult.changed("; ".join(notes), rank=rank, mode=out["mode"], state=state)


@step("jobs")
def jobs_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Every job state this node holds (reads only, apart from shipping the runner): one
    round trip."""
    listing_of = ctx.options.need(JobsList)
    jobs_dir = listing_of.jobs_dir
    q = shlex.quote(jobs_dir)
    # No jobs folder: nothing to list, and nothing shipped (fab jobs creates nothing).
    _, listing = ship_then_command(jobs_dir, f"{RUNNER} list --root {q}")
    done = sh(conn, f"if [ -d {q} ]; then {listing}; else echo {NO_JOBS}; fi", timeout=300)
    if str(done.stdout).strip() == NO_JOBS:
        return StepResult.ok("no jobs on this node", jobs=[])
    if done.exited == SHIP_FAILED:
        why = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        raise StepFailed(f"could not install the job runner in {jobs_dir}: {why}")
    out = _json_out(done, "list")
    jobs = list(out.get("jobs") or [])
    # The time before the hard TTL stops this node, as fab status reads it: only a node
    # with jobs is asked (one more round trip).
    ttl = read_ttl(conn, str(listing_of.state_dir or STATE_DIR)) if jobs else None
    return StepResult.ok(f"{len(jobs)} job record(s)", jobs=jobs, now=out.get("now"), ttl=ttl)


class LineWriter:
    """Forwards whole lines from one host's stream to a shared output, under a lock."""

    def __init__(self, out: Any, lock: threading.Lock, prefix: str = "") -> None:
        self.out, self.lock, self.prefix, self.buffer = out, lock, prefix, ""

    def write(self, data: str) -> int:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        if lines:
            with self.lock:
                for line in lines:
                    self.out.write(f"{self.prefix}{line}\n")
                self.out.flush()
        return len(data)

    def flush(self) -> None:
        pass


@step("logs")
def logs_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Print (or follow) this node's rank logs of one job."""
    x = ctx.options.need(LogsOptions)
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    args = f"follow --job-dir {shlex.quote(job.job_dir)} --node-rank {job.rank}"
    if x.rank is not None:
        args += f" --rank {int(x.rank)}"
    if x.follow:
        args += " --follow"
    if x.this_attempt:
        args += " --this-attempt"
    writer = LineWriter(x.out, x.lock)
    try:
        done = conn.run(
            job.command(args),
            warn=True,
            hide=False,
            in_stream=False,
            out_stream=writer,
            err_stream=writer,
        )
    except Exception as exc:  # a dropped connection: the job is detached and goes on
        return StepResult.failed(
            f"connection lost ({exc.__class__.__name__}); the job keeps running on the node: "
            f"`fab logs {job.spec['job']} --follow` to watch again"
        )
    writer.write("\n" if writer.buffer else "")
    if done.exited == SHIP_FAILED:
        return StepResult.failed(f"could not install the job runner in {job.spec['jobs_dir']}")
    if not done.ok:
        return StepResult.failed(f"log reader exited {done.exited}")
    return StepResult.ok(f"node rank {job.rank} logs")


@step("cancel")
def cancel_step(conn: Connection, ctx: HostContext) -> StepResult:
    """SIGTERM the node's ranks, wait, SIGKILL what is left, upload the last checkpoint."""
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    given = ctx.options.need(CancelOptions)
    wait, endpoint = float(given.wait), given.s3_endpoint
    out = _json_out(
        sh(
            conn,
            job.command(
                f"cancel --job-dir {shlex.quote(job.job_dir)} --node-rank {job.rank} "
                f"--wait {wait:g}" + (f" --s3-endpoint {shlex.quote(endpoint)}" if endpoint else "")
            ),
            timeout=wait + 700,
        ),
        "cancel",
    )
    if not out.get("ok"):
        return StepResult.failed(f"cancel failed: {out.get('error')}")
    state = out.get("state") or {}
    final = out.get("sync") or state.get("final_sync") or {}
    sync = f"; last checkpoint: {final.get('detail')}" if final else ""
    note = f" ({out['note']})" if out.get("note") else ""
    message = f"node rank {job.rank}: {state.get('effective')}{note}{sync}"
    # The job saved nothing where gpufleet looks (its script writes elsewhere): said apart.
    empty = {"wrote_nothing": str(final.get("detail") or "")} if final.get("wrote_nothing") else {}
    if out.get("changed") is False:  # it had ended already: nothing was stopped
        return StepResult.ok(message, state=state, **empty)
    return StepResult.changed(message, state=state, **empty)


def wrote_nothing_lines(report: Any, job: str, width: int) -> list[str]:
    """After ``fab cancel``'s table: a line for each node whose job wrote nothing to its
    checkpoint folder (the sync's ``wrote_nothing``), with the sync's own detail."""
    out: list[str] = []
    for h in report.hosts:
        for s in h.steps:
            detail = s.result.details.get("wrote_nothing") if s.name == "cancel" else None
            if detail is None:
                continue
            said = detail or "the job wrote nothing to its checkpoint folder"
            out += wrap(
                f"job {job} on {h.host.label}: {said}; a script saves there when its "
                "output folder is {checkpoint_dir} in --args or $GPUFLEET_CHECKPOINT_DIR "
                "(docs/train.md)",
                width,
                "gpufleet: ",
                "  ",
            )
    return out


@step("history")
def history_step(conn: Connection, ctx: HostContext) -> StepResult:
    """This node's events and GPU samples of one job (what its chart is drawn from)."""
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    cmd = job.command(f"history --job-dir {shlex.quote(job.job_dir)} --node-rank {job.rank}")
    out = _json_out(sh(conn, cmd, timeout=60), "history")
    return StepResult.ok(
        f"{len(out.get('samples') or [])} sample(s), {len(out.get('events') or [])} event(s)",
        node_rank=job.rank,
        history=out,
    )


@step("chart")
def chart_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The job's chart into its folder on the head (beside job.json), then into the
    bucket beside its checkpoints, with the job's own credentials."""
    job = node_job(conn, ctx)
    if job is None or job.rank != 0:
        return StepResult.skipped("the chart is kept on the job's head node")
    chart = ctx.options.need(ChartKeep)
    path = f"{job.job_dir}/{chart.name}"
    put_bytes(conn, chart.png, path)
    cmd = job.command(f"put --job-dir {shlex.quote(job.job_dir)} --file {shlex.quote(path)}")
    out = _json_out(sh(conn, cmd, timeout=180), "put")
    if not out.get("ok"):
        why = out.get("error") or "upload failed"
        return StepResult.failed(f"{path} written, not uploaded: {why}", node_path=path)
    where = f"{out.get('bucket')}/{out['key']}" if out.get("key") else None
    return StepResult.ok(
        f"{path}" + (f", {where}" if where else f" ({out.get('detail')})"),
        node_path=path,
        bucket_key=where,
    )


@step("resume-check")
def resume_check_step(conn: Connection, ctx: HostContext) -> StepResult:
    """What a resume would start from, on the head: its checkpoint folder and the bucket."""
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    if job.rank != 0:  # the head answers for the job (it saves the checkpoints)
        return StepResult.skipped("not the job's head")
    out = _json_out(
        sh(conn, restorable_command(job, ctx.options.need(ResumeCheck).proposed), timeout=300),
        "resume check",
    )
    if not out.get("ok"):
        return StepResult.failed(f"cannot tell what to resume from: {out.get('error')}")
    return StepResult.ok(restorable_line(out), restorable=out)


def restorable_command(job: NodeJob, proposed: Mapping[str, Any] | None) -> str:
    """``job_runner.py restorable`` of the recorded job; with ``proposed`` (ResumeCheck: the
    recorded spec with what this resume changes: its endpoint, its credentials in
    --node-env) the check reads that spec, from a folder of its own removed after it: the
    recorded job.json is not changed before the check passed."""
    if not proposed:
        return job.command(f"restorable --job-dir {shlex.quote(job.job_dir)}")
    folder = f"{job.job_dir}.check-{secrets.token_hex(4)}"
    q = shlex.quote(folder)
    written = write_file_command(f"{folder}/job.json", jsonlib.dumps(proposed, indent=1))
    then = f"{written} && {RUNNER} restorable --job-dir {q}; rc=$?; rm -rf {q}; exit $rc"
    return ship_then_command(str(job.spec["jobs_dir"]), then)[1]


def newest_version(found: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The newest version ``job_runner.py restorable`` found in the bucket ({seq, step,
    files}), from its ``version`` or the newest of its ``versions``; None when none."""
    one = found.get("version")
    if isinstance(one, Mapping):
        return one
    many = [v for v in found.get("versions") or [] if isinstance(v, Mapping)]
    return max(many, key=lambda v: int(v.get("seq") or 0)) if many else None


def _count(value: Any) -> int:
    """A count the runner gives as a number or as the list of what it counts."""
    if isinstance(value, list | tuple | dict):
        return len(value)
    return int(value or 0)


def restorable_line(found: Mapping[str, Any]) -> str:
    """What ``job_runner.py restorable`` found, in words."""
    local = int(found.get("local_files") or 0)
    where = f"{local} file(s) in {found.get('checkpoint_dir')}" if local else "no local files"
    if not found.get("bucket"):
        return f"{where}; no bucket"
    version = newest_version(found)
    if version is not None:
        step_ = version.get("step")
        at = f", step {step_}" if step_ is not None else ""
        files = _count(version.get("files"))
        return f"{where}; version {version.get('seq')} ({files} file(s){at}) in {found['bucket']}"
    step_, files = found.get("bucket_step"), int(found.get("bucket_files") or 0)
    kept = f"step {step_}" if step_ is not None else "no complete checkpoint"
    if step_ is None and files:
        kept = f"the job's folder ({files} file(s))"
    return f"{where}; {kept} in {found['bucket']}"


def nothing_to_restore(found: Mapping[str, Any]) -> bool:
    stored = (
        newest_version(found) is not None
        or found.get("bucket_step") is not None
        or found.get("bucket_files")
    )
    return not found.get("local_files") and not stored
