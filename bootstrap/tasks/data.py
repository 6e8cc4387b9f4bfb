"""``fab data-push``, ``fab data-fetch``, ``fab data-pull``: a dataset folder between this
machine, the stack's bucket and the nodes' scratch.

A dataset has a name (default: the folder's) and lives at ``<scratch>/data/<name>/`` on a
node and at ``data/<name>/`` in the bucket. The bucket is always reached from a node, with
the node's own identity and the watchdog's own client (``gpufleet_node/data_sync.py`` on
top of bucket.py, every cloud's store), so this machine needs SSH and no cloud credentials:

* ``data-push DIR``: to every node's scratch over SFTP (``--to scratch``, the default), or
  to the bucket through the head node (``--to bucket``: onto its scratch, then up);
* ``data-fetch NAME``: bucket -> every node's scratch, all nodes at once;
* ``data-pull NAME``: a node's scratch (``--node``) or the bucket (through the head) -> here.

Each run moves only what the destination lacks, compared by size and SHA-256 (between a
node and the bucket: the SHA-256 the dataset's manifest or the object's metadata records,
else the store's MD5 ETag / Content-MD5), so a run cut off half way is finished by running
it again. Every file is checked before it takes its name. ``--deadline`` bounds a whole run
and ``--min-rate`` each answer of the bucket, so a stalled or trickling transfer ends with
one line. Nothing at the destination is deleted unless ``--delete`` asks, and nothing in
the bucket ever is.
"""

from __future__ import annotations

import hashlib
import io
import json as jsonlib
import os
import secrets
import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke import Context

from bootstrap.fleet.api import HostContext, StepFailed, StepResult, step
from bootstrap.fleet.cli import BUCKET_HELP, FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport, emit
from bootstrap.tasks.train import TRAIN_HELP, _fail
from bootstrap.train.runs import run_steps
from bootstrap.train.spec import JOBS_ROOT, TrainError, node_name, validate_name
from bootstrap.train.steps import SHIP_FAILED, put_bytes, runner_command, ship_then_command
from bootstrap.verify.ship import parse_node_env
from infra.render import literal_console

PART = ".gpufleet-part"  # bucket.PART_SUFFIX: a file on its way, never taken for data
PLACE_EVERY_S = 10.0  # a long push puts what arrived in place this often
# --deadline and --min-rate (the node tool, gpufleet_node/data_sync.py, has the same
# defaults in its own units): a day for a whole run of a large dataset, and 0.1 MB/s, far
# below any working link between a node and its bucket, so a trickle ends in
# RATE_GRACE_S plus a little (each answer's average) rather than at the deadline.
DEADLINE_S = 86400.0
MIN_RATE_MB = 0.1
RATE_GRACE_S = 10.0
SSH_SLACK_S = 120.0  # the SSH command outlives the node tool's own deadline by this much
DATA_BOUNDS = {
    "deadline": Bound(0, above=True, example="3600"),
    "min_rate": Bound(0, example="0.5"),
}
DATA_HELP = {
    "name": "the dataset's name (default: the folder's): <scratch>/data/NAME on the nodes, "
    "data/NAME/ in the bucket",
    "delete": "also remove files at the destination that the source does not have "
    "(never in the bucket)",
    "jobs_dir": TRAIN_HELP["jobs_dir"] + "; the node-side tools go there",
    "deadline": "seconds the whole run may take (default 86400, a day); past it the run "
    "stops with one line, and a rerun goes on from what landed",
    "min_rate": "MB/s (1 MB = 1,000,000 bytes) each answer of the bucket must average "
    f"after its first {RATE_GRACE_S:g} s, else it is tried again and a lasting trickle "
    f"ends the run with one line (default {MIN_RATE_MB:g}; 0 turns it off)",
    **BUCKET_HELP,
}


# ---------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class DataPlan:
    """A checked request: what to move, where, with which bucket options."""

    name: str
    node_root: str  # <scratch>/data/<name> on every node
    prefix: str  # data/<name>/ in the bucket
    jobs_dir: str
    bucket: Mapping[str, str]  # bucket, provider, region, s3_endpoint
    env: Mapping[str, str]
    delete: bool
    deadline_s: float = DEADLINE_S
    min_rate: float = MIN_RATE_MB * 1e6  # bytes/s
    started: float = 0.0  # time.monotonic() when the plan was made: the deadline's start

    def left(self) -> float:
        """Seconds of --deadline still left (never below 1: the node tool says it)."""
        return max(1.0, self.started + self.deadline_s - time.monotonic())

    def past(self) -> bool:
        return time.monotonic() >= self.started + self.deadline_s


@dataclass(frozen=True)
class DataMove:
    """What the data steps read (in ``Options.tasks``): the plan; for a push this machine's
    files (relative path -> [size, sha256]) and their folder; for a pull where they go."""

    plan: DataPlan
    local: Mapping[str, list[Any]] = field(default_factory=dict)
    source: str = ""
    dest: str = ""
    for_pull: bool = False


def plan_for(fleet: Fleet, name: str, *, jobs_dir: str, s3_endpoint: str, node_env: str,
             delete: bool, deadline: float = DEADLINE_S,
             min_rate: float = MIN_RATE_MB) -> DataPlan:  # fmt: skip
    """The plan, or a TrainError with one line (nothing has moved yet)."""
    try:
        env = parse_node_env(node_env)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    try:
        validate_name(name)
    except TrainError:
        raise TrainError(
            f"dataset name {name!r}: use 1-48 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (--name)"
        ) from None
    outputs = fleet.outputs
    return DataPlan(
        name=name,
        node_root=f"{fleet.scratch.path.rstrip('/')}/data/{name}",
        prefix=f"data/{name}/",
        jobs_dir=jobs_dir or JOBS_ROOT,
        bucket={
            "bucket": str(outputs.get("bucket") or ""),
            "provider": fleet.provider or "",
            "region": str(outputs.get("region") or ""),
            "s3_endpoint": s3_endpoint,
        },
        env=env,
        delete=delete,
        deadline_s=float(deadline),
        min_rate=float(min_rate) * 1e6,
        started=time.monotonic(),
    )


def bucket_url(plan: DataPlan) -> str:
    return f"{plan.bucket['bucket']}/{plan.prefix}"


def need_bucket(plan: DataPlan, stack: str | None) -> None:
    if not plan.bucket["bucket"]:
        raise TrainError(
            f"the stack {stack or '(inventory)'} has no bucket (its outputs name none): "
            "data-push --to scratch reaches the nodes without one"
        )


def local_files(root: Path) -> dict[str, list[Any]]:
    """{relative path: [size, sha256]} of every regular file under ``root``."""
    out: dict[str, list[Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".gpufleet-") or name.endswith(PART) or path.is_symlink():
                continue
            if path.is_file():
                out[path.relative_to(root).as_posix()] = [path.stat().st_size, _sha256(path)]
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_send(local: Mapping[str, list[Any]], there: Mapping[str, list[Any]]) -> list[str]:
    """What the destination lacks or holds with other bytes."""
    return sorted(rel for rel, entry in local.items() if list(there.get(rel) or []) != entry)


def moved_line(sent: int, nbytes: int, kept: int, removed: int) -> str:
    """One short line per host and step (the host's label goes in front of it, and the
    whole fits 80 columns): what moved, what was there already, what went."""
    line = f"moved {sent} ({size_text(nbytes)}), kept {kept}"
    return line + (f", removed {removed}" if removed else "")


def size_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def short(rel: str, width: int = 24) -> str:
    """A file's name cut to ``width`` from the left: the end says which file it is."""
    return rel if len(rel) <= width else "..." + rel[-(width - 3) :]


# ---------------------------------------------------------------------------- node calls


class TickWriter:
    """Turns the node tool's ``progress <done> <total> <text>`` lines into the host's live
    line; keeps the rest (its JSON answer) for the step."""

    def __init__(self, ctx: HostContext, what: str) -> None:
        self.ctx, self.what, self.buffer = ctx, what, ""

    def write(self, data: str) -> int:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            parts = line.split(" ", 3)
            if parts[0] == "progress" and len(parts) >= 3 and parts[1].isdigit():
                done, total = int(parts[1]), int(parts[2]) or 1
                text = f"{self.what}: {size_text(done)} of {size_text(total)}"
                name = parts[3].rsplit(" ", 1)[0] if len(parts) > 3 else ""
                self.ctx.tick(text + (f" ({short(name)})" if name else ""), done / total)
        return len(data)

    def flush(self) -> None:
        pass


def node_tool(
    conn: Connection,
    ctx: HostContext,
    command: str,
    doc: Mapping[str, Any],
    *,
    args: str = "",
    what: str = "",
) -> dict[str, Any]:
    """Run ``data_sync.py COMMAND --root <the dataset> ARGS`` with ``doc`` on its stdin,
    within what is left of --deadline (the tool's own, and the SSH command's a little
    later); its JSON answer (a StepFailed when it has none, or says it failed)."""
    plan = ctx.options.need(DataMove).plan
    if plan.past():
        raise StepFailed(f"{command}: " + _past(plan, "before it began"))
    root, _ = ship_then_command(plan.jobs_dir, "")  # the folder the tools are shipped into
    tool = runner_command(root, "data_sync")
    left = plan.left()
    limits = f"--deadline {left:.0f} --min-rate {plan.min_rate:.0f} --rate-grace {RATE_GRACE_S:g}"
    # The tools shipped (when they are not there) and run in one round trip.
    _, cmd = ship_then_command(
        plan.jobs_dir,
        f"{tool} {command} --root {shlex.quote(plan.node_root)} {limits} {args}",
    )
    timeout = left + SSH_SLACK_S
    err = io.StringIO()
    done = conn.run(
        cmd.strip(),
        warn=True,
        hide=False,
        timeout=timeout,
        in_stream=io.StringIO(jsonlib.dumps({**doc, "env": dict(plan.env)})),
        out_stream=TickWriter(ctx, what or command),
        err_stream=err,
    )
    lines = str(done.stdout).strip().splitlines()
    try:
        answer = jsonlib.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = (err.getvalue() or str(done.stdout)).strip()[-300:]
        if done.exited == SHIP_FAILED:
            raise StepFailed(f"could not install the node tools in {plan.jobs_dir}: {tail}")
        raise StepFailed(f"{command}: no answer from the node's data tool: {tail}")
    if not answer.get("ok"):
        raise StepFailed(f"{command}: {answer.get('error')}")
    return answer


def _bucket_args(plan: DataPlan, *, delete: bool = False) -> str:
    b = plan.bucket
    args = [
        f"--prefix {shlex.quote(plan.prefix)}",
        f"--bucket {shlex.quote(b['bucket'])}",
        f"--provider {shlex.quote(b['provider'])}",
        f"--region {shlex.quote(b['region'])}",
    ]
    if b["s3_endpoint"]:
        args.append(f"--s3-endpoint {shlex.quote(b['s3_endpoint'])}")
    if delete:
        args.append("--delete")
    return " ".join(args)


# ---------------------------------------------------------------------------- steps


@step("data-push")
def data_push_step(conn: Connection, ctx: HostContext) -> StepResult:
    """This machine's folder -> the node's scratch, only what the node lacks."""
    move = ctx.options.need(DataMove)
    plan, local = move.plan, move.local
    dirs = sorted({str(Path(rel).parent) for rel in local} - {"."})
    there = node_tool(conn, ctx, "prepare", {"dirs": dirs})["files"]
    send = to_send(local, there)
    token = secrets.token_hex(4)  # this push's part names: nodes sharing a disk never clash
    total, done, placed_at = sum(local[rel][0] for rel in send) or 1, 0, time.monotonic()
    batch: list[str] = []
    for rel in send:
        if plan.past():
            # What arrived goes in place first: the rerun sends only the rest.
            node_tool(conn, ctx, "place", {"files": {r: local[r] for r in batch}, "token": token})
            raise StepFailed(_past(plan, f"{send.index(rel)} of {len(send)} file(s) sent"))
        ctx.tick(f"push: {size_text(done)} of {size_text(total)} ({short(rel)})", done / total)
        put_bytes(conn, Path(move.source) / rel, f"{plan.node_root}/{rel}.{token}{PART}")
        done += local[rel][0]
        batch.append(rel)
        if time.monotonic() - placed_at >= PLACE_EVERY_S:
            # What arrived is put in place now: a push cut off later keeps it.
            node_tool(conn, ctx, "place", {"files": {r: local[r] for r in batch}, "token": token})
            batch, placed_at = [], time.monotonic()
    keep = sorted(local) if plan.delete else None
    doc = {"files": {r: local[r] for r in batch}, "keep": keep, "token": token}
    placed = node_tool(conn, ctx, "place", doc)
    removed = int(placed.get("removed") or 0)
    line = moved_line(len(send), done, len(local) - len(send), removed)
    result = StepResult.changed if send or removed else StepResult.ok
    return result(line, sent=send)


@step("data-upload")
def data_upload_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The node's copy -> the bucket, with the node's own identity."""
    plan = ctx.options.need(DataMove).plan
    out = node_tool(conn, ctx, "upload", {}, args=_bucket_args(plan), what="upload")
    return _moved(out)


@step("data-fetch")
def data_fetch_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The bucket -> the node's scratch, with the node's own identity."""
    move = ctx.options.need(DataMove)
    plan = move.plan
    delete = plan.delete and not move.for_pull
    out = node_tool(conn, ctx, "fetch", {}, args=_bucket_args(plan, delete=delete),
                    what="fetch")  # fmt: skip
    return _moved(out)


def _moved(out: Mapping[str, Any]) -> StepResult:
    line = moved_line(int(out["moved"]), int(out["bytes"]), int(out["kept"]),
                      int(out.get("removed") or 0))  # fmt: skip
    if out.get("size_only"):
        # Objects another tool wrote without any digest: only their size could be checked.
        line += f", {int(out['size_only'])} by size only"
    result = StepResult.changed if out["moved"] or out.get("removed") else StepResult.ok
    return result(line, **dict(out))


@step("data-get")
def data_get_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The node's copy -> this machine, only what is missing here."""
    move = ctx.options.need(DataMove)
    plan = move.plan
    dest = Path(move.dest)
    there = node_tool(conn, ctx, "prepare", {"create": False})["files"]
    if not there:
        raise StepFailed(f"{plan.node_root} on the node is empty: nothing to pull")
    here = local_files(dest) if dest.is_dir() else {}
    fetch = to_send(there, here)
    total, done = sum(there[rel][0] for rel in fetch) or 1, 0
    for rel in fetch:
        if plan.past():
            raise StepFailed(_past(plan, f"{fetch.index(rel)} of {len(fetch)} file(s) here"))
        ctx.tick(f"pull: {size_text(done)} of {size_text(total)} ({short(rel)})", done / total)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + PART)
        conn.get(f"{plan.node_root}/{rel}", str(part))
        if [part.stat().st_size, _sha256(part)] != list(there[rel]):
            part.unlink()
            raise StepFailed(f"{rel} arrived damaged (size or SHA-256 differ): run it again")
        part.replace(target)
        done += there[rel][0]
    removed = 0
    if plan.delete:
        for rel in sorted(set(here) - set(there)):
            (dest / rel).unlink()
            removed += 1
    line = moved_line(len(fetch), done, len(there) - len(fetch), removed)
    result = StepResult.changed if fetch or removed else StepResult.ok
    return result(line, got=fetch)


def _past(plan: DataPlan, counts: str) -> str:
    return (f"deadline: past --deadline {plan.deadline_s:g} s ({counts}): run it again (what "
            "landed stays), or raise --deadline")  # fmt: skip


# ---------------------------------------------------------------------------- tasks


def _plan(c: Context, fleet_args: FleetArgs, name: str, **options: Any) -> tuple[Fleet, DataPlan]:
    fleet = resolve_fleet(c, fleet_args)
    try:
        return fleet, plan_for(fleet, name, **options)
    except TrainError as exc:
        raise _fail(str(exc)) from None


def _move(
    c: Context,
    fleet: Fleet,
    fleet_args: FleetArgs,
    task: str,
    steps: list[Any],
    move: DataMove,
    route: str,
) -> FleetReport:
    """Run ``steps`` on ``fleet``'s hosts at once, one progress line per host and step,
    under one line saying where the data goes (``route``)."""
    quiet = fleet_args.json or os.environ.get("GPUFLEET_QUIET") == "1"
    console = literal_console(stderr=fleet_args.json)
    if not quiet:
        console.print(f"{task}: {route} ({len(fleet.hosts)} node(s))", highlight=False)
    report = run_steps(
        c,
        fleet,
        task,
        steps,
        tasks=(move,),
        console=None if quiet else console,
        connect_timeout=fleet_args.connect_timeout,
    )
    emit(report, as_json=fleet_args.json, console=console)
    sys.stdout.flush()
    return report


def _head(fleet: Fleet, node: str = "") -> Fleet:
    """The fleet cut to one host: ``node`` (a name, address or address:port), else the
    head; a name that matches no host is refused."""
    if not node:
        return replace(fleet, hosts=fleet.hosts[:1])
    for h in fleet.hosts:
        if node in (h.name, h.address, f"{h.address}:{h.port}", node_name(h)):
            return replace(fleet, hosts=(h,))
    known = ", ".join(h.label for h in fleet.hosts)
    raise _fail(f"--node {node}: no such host in this run ({known})")


def _source(path: str | None) -> Path:
    if not path:
        raise _fail("give the folder to push: fab data-push DIR [--to scratch|bucket]")
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise _fail(f"{path}: no such folder (data-push sends a folder and what is in it)")
    return root


@fleet_task(
    positional=["source"],
    bounds=DATA_BOUNDS,
    help={
        "source": "the folder on this machine",
        "to": "scratch (every node's, the default) or bucket (through the head node)",
        **DATA_HELP,
    },
)
def data_push(
    c: Context,
    fleet_args: FleetArgs,
    source: str | None = None,  # None: invoke fills a positional only while it is None
    to: str = "scratch",
    name: str = "",
    delete: bool = False,
    jobs_dir: str = "",
    s3_endpoint: str = "",
    node_env: str = "",
    deadline: float = DEADLINE_S,
    min_rate: float = MIN_RATE_MB,
) -> None:
    """Send a folder to every node's scratch, or to the bucket; only what is missing."""
    root = _source(source)
    if to not in ("scratch", "bucket"):
        raise _fail(f"--to {to!r}: scratch (every node) or bucket (through the head)")
    if delete and to == "bucket":
        raise _fail("--delete with --to bucket: gpufleet never deletes in the bucket")
    fleet, plan = _plan(c, fleet_args, name or root.name, jobs_dir=jobs_dir,
                        s3_endpoint=s3_endpoint, node_env=node_env, delete=delete,
                        deadline=deadline, min_rate=min_rate)  # fmt: skip
    steps: list[Any] = [data_push_step]
    if to == "bucket":
        try:
            need_bucket(plan, fleet.stack)
        except TrainError as exc:
            raise _fail(str(exc)) from None
        fleet, steps = _head(fleet), [data_push_step, data_upload_step]
    route = f"{root} -> {plan.node_root}" + (f" -> {bucket_url(plan)}" if to == "bucket" else "")
    move = DataMove(plan, local=local_files(root), source=str(root))
    _move(c, fleet, fleet_args, "data-push", steps, move, route)


@fleet_task(
    positional=["name"], bounds=DATA_BOUNDS, help={**DATA_HELP, "name": "the dataset (data/NAME/)"}
)
def data_fetch(
    c: Context,
    fleet_args: FleetArgs,
    name: str | None = None,
    delete: bool = False,
    jobs_dir: str = "",
    s3_endpoint: str = "",
    node_env: str = "",
    deadline: float = DEADLINE_S,
    min_rate: float = MIN_RATE_MB,
) -> None:
    """Copy a dataset from the bucket to every node's scratch, all nodes at once."""
    if not name:
        raise _fail("name the dataset: fab data-fetch NAME (data/NAME/ in the bucket)")
    fleet, plan = _plan(c, fleet_args, name, jobs_dir=jobs_dir, s3_endpoint=s3_endpoint,
                        node_env=node_env, delete=delete, deadline=deadline,
                        min_rate=min_rate)  # fmt: skip
    try:
        need_bucket(plan, fleet.stack)
    except TrainError as exc:
        raise _fail(str(exc)) from None
    route = f"{bucket_url(plan)} -> {plan.node_root}"
    _move(c, fleet, fleet_args, "data-fetch", [data_fetch_step], DataMove(plan), route)


@fleet_task(
    positional=["name"],
    bounds=DATA_BOUNDS,
    help={
        **DATA_HELP,
        "name": "the dataset",
        "node": "pull from this node's scratch (name, address or address:port); default: "
        "from the bucket, through the head node",
        "dest": "the folder here (default: ./NAME)",
    },
)
def data_pull(
    c: Context,
    fleet_args: FleetArgs,
    name: str | None = None,
    node: str = "",
    dest: str = "",
    delete: bool = False,
    jobs_dir: str = "",
    s3_endpoint: str = "",
    node_env: str = "",
    deadline: float = DEADLINE_S,
    min_rate: float = MIN_RATE_MB,
) -> None:
    """Copy a dataset here from a node's scratch or from the bucket; only what is missing."""
    if not name:
        raise _fail("name the dataset: fab data-pull NAME [--node NODE] [--dest DIR]")
    target = Path(dest or name).expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise _fail(f"--dest {dest or name}: a file is in the way (give a folder)")
    fleet, plan = _plan(c, fleet_args, name, jobs_dir=jobs_dir, s3_endpoint=s3_endpoint,
                        node_env=node_env, delete=delete, deadline=deadline,
                        min_rate=min_rate)  # fmt: skip
    steps: list[Any] = [data_get_step]
    if not node:
        try:
            need_bucket(plan, fleet.stack)
        except TrainError as exc:
            raise _fail(str(exc)) from None
        steps = [data_fetch_step, data_get_step]
    one = _head(fleet, node)
    route = ("" if node else f"{bucket_url(plan)} -> ") + f"{plan.node_root} -> {target}"
    move = DataMove(plan, dest=str(target), for_pull=True)
    _move(c, one, fleet_args, "data-pull", steps, move, route)
