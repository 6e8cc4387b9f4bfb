"""``fab train``, ``fab jobs``, ``fab logs``, ``fab cancel``: the user's own job on the fleet.

``fab train --script train.py`` copies the workdir to every node (changed files only), starts
torchrun on each node under a detached supervisor (``bootstrap/remote/job_runner.py``: a
systemd transient unit where systemd runs, else a double-forked process with a pid file),
and returns once the job runs everywhere (``--follow``: streams its output until it ends).
Checkpoints in GPUFLEET_CHECKPOINT_DIR go to the stack's bucket while the job runs and when
it ends; ``--resume JOB`` reruns the recorded job from the newest complete one.

Everything decided here is a pure function (workdir selection and diff, job id, network
environment from the catalog, the job spec, merging the nodes' job states, the table); the
steps only move bytes and run the node-side commands. Bad input stops with one line and exit
status 2 before any node is touched.
"""

from __future__ import annotations

import base64
import datetime as dt
import fnmatch
import hashlib
import io
import json as jsonlib
import os
import re
import secrets
import shlex
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from bootstrap.fleet.api import Host, HostContext, Options, StepFailed, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.interconnect import network_env
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport, run_fleet, summary_table
from bootstrap.fleet.system import probe_step, sh
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.tasks.verify import master_address
from bootstrap.verify.ship import parse_node_env
from infra.render import literal_console

REMOTE_DIR = Path(__file__).resolve().parents[1] / "remote"
REMOTE_FILES = (
    "job_runner.py",
    "job_launch.py",
    "job_sync.py",
    # What job_sync imports: the bucket client and the node clouds (whose bucket_store it
    # uses), with the tag names they read; not the watchdog, which fab setup installs.
    "bucket.py",
    "fleet_names.py",
    # The node clouds, one module each (the folder as it is: no list here).
    *(f"clouds/{p.name}" for p in sorted((REMOTE_DIR / "clouds").glob("*.py"))),
)
JOBS_ROOT = "/var/lib/gpufleet/jobs"
DEFAULT_MAX_WORKDIR_MB = 200.0
SPEC_SCHEMA = "gpufleet.job/1"
SYNC_MANIFEST = ".gpufleet-sync.json"
PLAN_MEMBER = ".gpufleet-plan.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")
# Which state wins when the nodes of one job disagree: the worst news first.
_STATE_ORDER = ("cancelled", "failed", "interrupted", "starting", "running", "succeeded")


class TrainError(Exception):
    """Bad input: one line for the person at the keyboard; nothing was changed."""


def _fail(message: str) -> Exit:
    return Exit(f"gpufleet: {message}", code=2)


# ---------------------------------------------------------------------------- workdir


def git_files(root: Path) -> list[str] | None:
    """Files git would keep under ``root`` (tracked + untracked, minus ignored), or None
    when ``root`` is not inside a git work tree (or git is missing)."""
    try:
        done = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    names = [n for n in done.stdout.decode(errors="surrogateescape").split("\0") if n]
    return sorted(n for n in names if (root / n).is_file() and not (root / n).is_symlink())


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool
    base: str  # the folder (relative to the workdir) whose .gitignore holds the rule


def parse_gitignore(text: str, base: str = "") -> list[IgnoreRule]:
    """The subset of gitignore(5) that matters for a workdir: globs, ``!`` negation, a
    trailing ``/`` for folders, a leading or inner ``/`` anchoring, ``**``."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(IgnoreRule(line.lstrip("/"), negate, dir_only, anchored, base))
    return rules


def _rule_matches(rule: IgnoreRule, rel: str, is_dir: bool) -> bool:
    if rule.dir_only and not is_dir:
        return False
    if rule.base:
        if not rel.startswith(rule.base + "/"):
            return False
        rel = rel[len(rule.base) + 1 :]
    if rule.anchored:
        pattern = rule.pattern
        if fnmatch.fnmatchcase(rel, pattern):
            return True
        return "**" in pattern and fnmatch.fnmatchcase(rel, pattern.replace("**/", ""))
    return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], rule.pattern)


def is_ignored(rules: Sequence[IgnoreRule], rel: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:  # the last matching rule decides, as in git
        if _rule_matches(rule, rel, is_dir):
            ignored = not rule.negate
    return ignored


def walk_files(root: Path) -> list[str]:
    """Files under ``root`` without git: .gitignore files honoured, .git never entered."""
    out: list[str] = []
    rules: list[IgnoreRule] = []

    def visit(folder: Path, rel_folder: str) -> None:
        gi = folder / ".gitignore"
        if gi.is_file():
            rules.extend(parse_gitignore(gi.read_text(errors="replace"), rel_folder))
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            if entry.name == ".git" or entry.is_symlink():
                continue
            if entry.is_dir():
                if not is_ignored(rules, rel, True):
                    visit(entry, rel)
            elif entry.is_file() and not is_ignored(rules, rel, False):
                out.append(rel)

    visit(root, "")
    return out


def workdir_files(root: Path) -> list[str]:
    files = git_files(root)
    if files is None:
        files = walk_files(root)
    return [f for f in files if ".git" not in Path(f).parts and f != SYNC_MANIFEST]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(root: Path, files: Iterable[str], limit_bytes: float) -> dict[str, list[Any]]:
    """{relative path: [size, sha256]}; a TrainError when the total is over the limit."""
    sizes = {f: (root / f).stat().st_size for f in files}
    total = sum(sizes.values())
    if total > limit_bytes:
        biggest = sorted(sizes, key=lambda f: -sizes[f])[:3]
        top = ", ".join(f"{f} ({sizes[f] / 1e6:.1f} MB)" for f in biggest)
        raise TrainError(
            f"workdir {root} holds {total / 1e6:.1f} MB to copy, over the "
            f"{limit_bytes / 1e6:.0f} MB limit (largest: {top}); list data and checkpoints "
            "in .gitignore (read them from the bucket instead), or raise --max-workdir-mb"
        )
    return {f: [sizes[f], sha256_file(root / f)] for f in sorted(sizes)}


def diff_manifest(
    local: Mapping[str, Sequence[Any]], remote: Mapping[str, Sequence[Any]]
) -> tuple[list[str], list[str]]:
    """(files to send, files to delete): only what changed since the last sync; a file is
    deleted on the node only if an earlier sync put it there and the laptop no longer has it."""
    send = sorted(f for f, entry in local.items() if list(remote.get(f) or []) != list(entry))
    delete = sorted(f for f in remote if f not in local)
    return send, delete


def pack(root: Path, names: Sequence[str], plan: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            tar.add(str(root / name), arcname=name, recursive=False)
        data = jsonlib.dumps(plan).encode()
        info = tarfile.TarInfo(PLAN_MEMBER)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def workdir_slug(path: Path) -> str:
    """The node folder of a laptop workdir: its name plus a hash of where it lives."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", path.resolve().name) or "workdir"
    return f"{name}-{digest}"


# ---------------------------------------------------------------------------- the plan


def validate_name(name: str) -> str:
    if not _NAME.match(name):
        raise TrainError(
            f"--name {name!r}: use 1-48 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return name


def new_job_id(name: str, now: dt.datetime, token: str) -> str:
    """``<name>-<UTC yymmdd-HHMMSS>-<4 hex>``: sortable, unique, safe in paths and units."""
    return f"{name}-{now.astimezone(dt.UTC).strftime('%y%m%d-%H%M%S')}-{token[:4]}"


def bucket_prefix(head_name: str, job: str) -> str:
    """Where a job's checkpoints live in the bucket: the watchdog's own layout for the
    head's scratch (``checkpoints/<node>/``), plus the job's folder."""
    return f"checkpoints/{head_name}/{job}/"


def node_name(host: Host) -> str:
    return host.name or re.sub(r"[^A-Za-z0-9_.-]", "-", f"{host.address}-{host.port}")


@dataclass(frozen=True)
class TrainRequest:
    """What ``fab train`` was asked, checked and completed with defaults."""

    script: str  # relative to the workdir
    args: tuple[str, ...]
    workdir: Path
    name: str
    nproc_per_node: int  # 0: one per GPU
    cpu: bool
    stop_when_done: bool
    venv: str
    jobs_dir: str
    max_workdir_mb: float
    sync_interval_s: float
    node_env: Mapping[str, str]
    s3_endpoint: str
    master_port: int  # 0: a free port on the head
    detach: str


def parse_request(
    *,
    script: str,
    args: str,
    workdir: str,
    name: str,
    nproc_per_node: int,
    cpu: bool,
    stop_when_done: bool,
    venv: str,
    jobs_dir: str,
    max_workdir_mb: float,
    sync_interval: float,
    node_env: str,
    s3_endpoint: str,
    master_port: int,
    detach: str,
    cwd: Path,
) -> TrainRequest:
    """Every check that needs no node, or a TrainError with one line."""
    if not script:
        raise TrainError("--script is required: fab train --script train.py [--args '...']")
    path = (cwd / script).resolve()
    if not path.is_file():
        raise TrainError(f"--script {script}: no such file")
    root = (cwd / workdir).resolve() if workdir else path.parent
    if not root.is_dir():
        raise TrainError(f"--workdir {workdir}: no such folder")
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        raise TrainError(f"--script {script} is not inside the workdir {root}") from None
    try:
        argv = tuple(shlex.split(args))
    except ValueError as exc:
        raise TrainError(f"--args {args!r}: {exc}") from None
    if nproc_per_node < 0:
        raise TrainError(f"--nproc-per-node {nproc_per_node}: must be 1 or more")
    if max_workdir_mb <= 0:
        raise TrainError("--max-workdir-mb must be above 0")
    if sync_interval <= 0:
        raise TrainError("--sync-interval must be above 0 seconds")
    if detach not in ("auto", "systemd", "fork"):
        raise TrainError(f"--detach {detach!r}: one of auto, systemd, fork")
    if not 0 <= master_port <= 65535:
        raise TrainError(f"--master-port {master_port}: outside 0-65535")
    try:
        extra_env = parse_node_env(node_env)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    return TrainRequest(
        script=rel,
        args=argv,
        workdir=root,
        name=validate_name(name or Path(rel).stem.replace("_", "-")),
        nproc_per_node=nproc_per_node,
        cpu=cpu,
        stop_when_done=stop_when_done,
        venv=venv or DEFAULT_VENV,
        jobs_dir=jobs_dir or JOBS_ROOT,
        max_workdir_mb=max_workdir_mb,
        sync_interval_s=sync_interval,
        node_env=extra_env,
        s3_endpoint=s3_endpoint,
        master_port=master_port,
        detach=detach,
    )


def job_spec(
    req: TrainRequest,
    fleet: Fleet,
    *,
    job: str,
    nproc: int,
    master_addr: str,
    master_port: int,
    now: dt.datetime,
) -> dict[str, Any]:
    """The job.json every node gets (its node rank is passed separately)."""
    outputs = fleet.outputs
    head = fleet.hosts[0]
    env = network_env(dict(outputs.get("tier") or {}), fleet.provider)
    if req.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu means CPU, even on a GPU node
    env.update(req.node_env)
    scratch = fleet.scratch.path.rstrip("/") or "/"
    bucket = str(outputs.get("bucket") or "")
    return {
        "schema": SPEC_SCHEMA,
        "job": job,
        "name": req.name,
        "attempt": 1,
        "resume": False,
        "created_at": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "script": req.script,
        "args": list(req.args),
        "local_workdir": str(req.workdir),
        "workdir": f"{req.jobs_dir.rstrip('/')}/work/{workdir_slug(req.workdir)}",
        "python": f"{req.venv.rstrip('/')}/bin/python",
        "nnodes": len(fleet.hosts),
        "nproc_per_node": nproc,
        "cpu": req.cpu,
        "master_addr": master_addr,
        "master_port": master_port,
        "env": env,
        "checkpoint_dir": f"{scratch}/checkpoints/{job}",
        "bucket": bucket,
        "bucket_prefix": bucket_prefix(node_name(head), job) if bucket else "",
        "sync_node": node_name(head),  # the watchdog's <node> in checkpoints/<node>/
        "provider": fleet.provider or "",
        "region": str(outputs.get("region") or ""),
        "s3_endpoint": req.s3_endpoint,
        "sync_interval_s": req.sync_interval_s,
        "stop_when_done": req.stop_when_done,
        "detach": req.detach,
        "jobs_dir": req.jobs_dir,
        "nodes": [
            {"name": node_name(h), "address": h.address, "port": h.port, "label": h.label}
            for h in fleet.hosts
        ],
    }


def resume_spec(
    old: Mapping[str, Any], *, master_addr: str, master_port: int, stop_when_done: bool
) -> dict[str, Any]:
    spec = dict(old)
    spec.update(
        attempt=int(old.get("attempt") or 1) + 1,
        resume=True,
        master_addr=master_addr,
        master_port=master_port,
        stop_when_done=bool(stop_when_done or old.get("stop_when_done")),
    )
    return spec


def rank_of(spec: Mapping[str, Any], host: Host) -> int | None:
    """This host's node rank in a recorded job (by address and port, else by node name)."""
    nodes = list(spec.get("nodes") or [])
    for i, n in enumerate(nodes):
        if n.get("address") == host.address and int(n.get("port") or 22) == host.port:
            return i
    for i, n in enumerate(nodes):
        if host.name and n.get("name") == host.name:
            return i
    return None


# ---------------------------------------------------------------------------- node checks


def check_command(req_python: str, jobs_dir: str, ckpt_parent: str, want_port: bool) -> str:
    py = shlex.quote(req_python)
    lines = [
        "echo python3=$(python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' "
        "2>/dev/null)",
        f"echo torch=$({py} -c 'import torch; print(torch.__version__)' 2>/dev/null)",
        "echo gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')",
        "echo cpus=$(nproc 2>/dev/null)",
        "echo systemd=$(test -d /run/systemd/system && echo yes || echo no)",
        "echo sudo=$(sudo -n true 2>/dev/null && echo yes || echo no)",
    ]
    for key, path in (("jobs_dir", jobs_dir), ("ckpt_dir", ckpt_parent)):
        q = shlex.quote(path)
        lines.append(
            f'p={q}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            f'echo {key}=$(test -w "$p" && echo writable || echo root-only)'
        )
    if want_port:
        lines.append(
            "echo port=$(python3 -c 'import socket; s = socket.socket(); "
            's.bind(("", 0)); print(s.getsockname()[1])\')'
        )
    return "; ".join(lines)


def parse_check(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def judge_check(
    facts: Mapping[str, str], *, cpu: bool, venv: str, host: str, nproc: int = 0
) -> str | None:
    """Why this node cannot run the job (one line), or None. ``nproc`` (0: the default, one
    per GPU) may not exceed the node's GPUs, or its CPUs with ``cpu``."""
    py = facts.get("python3", "")
    try:
        major, minor = (int(x) for x in py.split(".")[:2])
        old = (major, minor) < (3, 10)
    except ValueError:
        old = True
    if old:
        return f"{host}: the job runner needs python3 >= 3.10 on the node (found {py or 'none'})"
    if not facts.get("torch"):
        return (
            f"{host}: torch is not installed in {venv} on the node: run `fab setup` "
            "(or `fab install-pytorch`), or pass --venv"
        )
    if not cpu and int(facts.get("gpus") or 0) == 0:
        return f"{host}: no NVIDIA GPU on the node: pass --cpu to run the job on CPUs with gloo"
    why = _too_many_processes(facts, cpu=cpu, nproc=nproc)
    if why:
        return f"{host}: {why}"
    for key in ("jobs_dir", "ckpt_dir"):
        if facts.get(key) != "writable" and facts.get("sudo") != "yes":
            return f"{host}: cannot create the {key.replace('_', ' ')} (no write access, no sudo)"
    return None


def _too_many_processes(facts: Mapping[str, str], *, cpu: bool, nproc: int) -> str | None:
    # More ranks than GPUs puts two on one card (NCCL refuses it), and more than CPUs
    # under gloo only thrashes: either way torchrun would start spawning to no use.
    what, have = ("CPU(s)", facts.get("cpus")) if cpu else ("GPU(s)", facts.get("gpus"))
    if not nproc or not (have or "").isdigit() or nproc <= int(have or 0):
        return None
    return f"--nproc-per-node {nproc}: the node has {have} {what}; give at most {have}"


# ---------------------------------------------------------------------------- node files


def bundle() -> tuple[str, str]:
    """(sha, base64 of a tar.gz) of the node-side runner files."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in REMOTE_FILES:
            data = (REMOTE_DIR / name).read_bytes()
            digest.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:12], base64.b64encode(buf.getvalue()).decode()


def runner_path(jobs_dir: str, sha: str) -> str:
    return f"{jobs_dir.rstrip('/')}/bin-{sha}/job_runner.py"


def ensure_dir_command(path: str) -> str:
    q = shlex.quote(path)
    return f"mkdir -p {q} 2>/dev/null || sudo -n install -d -o $(id -u) -g $(id -g) {q}"


def ship_command(jobs_dir: str, sha: str, b64: str) -> str:
    """Unpack the runner into ``bin-<sha>/`` unless it is there; content-addressed, so two
    nodes sharing a disk (or two runs at once) never trip over each other."""
    root = shlex.quote(jobs_dir.rstrip("/"))
    final = shlex.quote(f"{jobs_dir.rstrip('/')}/bin-{sha}")
    return (
        f"{ensure_dir_command(jobs_dir)} && if [ ! -f {final}/job_runner.py ]; then "
        f"t=$(mktemp -d {root}/.bin.XXXXXX) && printf %s {b64} | base64 -d | "
        f'tar -xzf - -C "$t" && (mv -T "$t" {final} 2>/dev/null || rm -rf "$t"); fi; '
        f"test -f {final}/job_runner.py"
    )


def write_file_command(path: str, text: str) -> str:
    b64 = base64.b64encode(text.encode()).decode()
    q = shlex.quote(path)
    parent = shlex.quote(str(Path(path).parent))
    return (
        f"mkdir -p {parent} && t=$(mktemp {parent}/.w.XXXXXX) && printf %s {b64} | "
        f'base64 -d > "$t" && mv "$t" {q}'
    )


def _runner(conn: Connection, jobs_dir: str) -> str:
    """Ship the runner (one round trip, nothing sent when present) and return its path."""
    sha, b64 = bundle()
    done = sh(conn, ship_command(jobs_dir, sha, b64), timeout=120)
    if not done.ok:
        why = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        raise StepFailed(f"could not install the job runner in {jobs_dir}: {why}")
    return runner_path(jobs_dir, sha)


def job_dir(spec: Mapping[str, Any]) -> str:
    """The job's folder on its nodes."""
    return f"{str(spec['jobs_dir']).rstrip('/')}/{spec['job']}"


@dataclass(frozen=True)
class NodeJob:
    """A recorded job as one of its nodes runs it."""

    spec: Mapping[str, Any]
    rank: int  # this node's node rank
    runner: str  # the job runner's path on the node
    job_dir: str


def node_job(conn: Connection, ctx: HostContext) -> NodeJob | None:
    """The job of ``ctx.options.extra["spec"]`` on this node, with its runner shipped; None
    when this host is not a node of the job (the runner is then not shipped)."""
    spec = ctx.options.extra["spec"]
    rank = rank_of(spec, ctx.host)
    if rank is None:
        return None
    return NodeJob(spec, rank, _runner(conn, spec["jobs_dir"]), job_dir(spec))


def _json_out(done: Any, what: str) -> dict[str, Any]:
    text = str(done.stdout).strip().splitlines()
    try:
        data = jsonlib.loads(text[-1]) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        raise StepFailed(f"{what}: no answer from the job runner (exit {done.exited}): {tail}")
    return data


# ---------------------------------------------------------------------------- steps


@step("train-check")
def train_check_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Can this node run the job? (reads only)"""
    x = ctx.options.extra
    want_port = ctx.host == x["head"] and not x.get("master_port")
    done = sh(
        conn,
        check_command(x["python"], x["jobs_dir"], x["ckpt_parent"], want_port),
        timeout=60,
    )
    facts = parse_check(str(done.stdout))
    why = judge_check(
        facts, cpu=x["cpu"], venv=x["venv"], host=ctx.host.label, nproc=int(x.get("nproc") or 0)
    )
    if why:
        return StepResult.failed(why, facts=facts)
    return StepResult.ok(
        f"torch {facts['torch']}, {facts.get('gpus', '0')} GPU(s), systemd {facts['systemd']}",
        facts=facts,
    )


def sync_workdir(conn: Connection, ctx: HostContext, runner: str) -> str:
    x = ctx.options.extra
    remote_dir: str = x["remote_workdir"]
    manifest: dict[str, list[Any]] = x["manifest"]
    root: Path = x["local_workdir"]
    q = shlex.quote(remote_dir)
    got = sh(conn, f"{ensure_dir_command(remote_dir)} && cat {q}/{SYNC_MANIFEST} 2>/dev/null")
    try:
        remote = dict(jsonlib.loads(str(got.stdout) or "{}").get("files") or {})
    except ValueError:
        remote = {}
    send, delete = diff_manifest(manifest, remote)
    if not send and not delete:
        return f"workdir unchanged ({len(manifest)} file(s))"
    data = pack(root, send, {"files": manifest, "delete": delete})
    tmp = f"{remote_dir.rstrip('/')}/../.upload-{secrets.token_hex(4)}.tar.gz"
    put_bytes(conn, data, tmp)
    out = _json_out(
        sh(
            conn,
            f"python3 {shlex.quote(runner)} unpack --workdir {q} --tar {shlex.quote(tmp)}",
            timeout=300,
        ),
        "workdir update",
    )
    if not out.get("ok"):
        raise StepFailed(f"workdir update refused: {out.get('error')}")
    return f"workdir: {len(send)} file(s) sent ({len(data) / 1e3:.0f} kB), {len(delete)} removed"


def put_bytes(conn: Connection, data: bytes, path: str) -> None:
    """Copy ``data`` to ``path`` on the node over SFTP, naming a missing SFTP subsystem."""
    try:
        conn.put(io.BytesIO(data), path)
    except paramiko.SSHException as exc:
        # sshd refuses the subsystem by closing the channel: paramiko says only "Channel
        # closed." while the session itself is fine. A dead session is a lost connection.
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise
        raise StepFailed(
            f"the node's sshd has no SFTP subsystem ({exc}): add `Subsystem sftp "
            "internal-sftp` to /etc/ssh/sshd_config and reload sshd; fab train copies "
            "the workdir over SFTP"
        ) from None


@step("train-start")
def train_start_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Copy the runner and the workdir, write job.json, start the detached supervisor."""
    x = ctx.options.extra
    spec: dict[str, Any] = x["spec"]
    rank = rank_of(spec, ctx.host)
    if rank is None:
        return StepResult.failed(f"{ctx.host.label} is not a node of job {spec['job']}")
    runner = _runner(conn, spec["jobs_dir"])
    notes = []
    if x.get("manifest") is not None:
        notes.append(sync_workdir(conn, ctx, runner))
    folder = job_dir(spec)
    prep = " && ".join(
        [
            ensure_dir_command(str(Path(spec["checkpoint_dir"]).parent)),
            ensure_dir_command(spec["checkpoint_dir"]),
            write_file_command(f"{folder}/job.json", jsonlib.dumps(spec, indent=1)),
        ]
    )
    made = sh(conn, prep, timeout=60)
    if not made.ok:
        raise StepFailed(f"could not write the job folder: {str(made.stderr).strip()[-300:]}")
    out = _json_out(
        sh(
            conn,
            f"python3 {shlex.quote(runner)} start --job-dir {shlex.quote(folder)} "
            f"--node-rank {rank} --detach {spec.get('detach', 'auto')} --wait 120",
            timeout=180,
        ),
        "start",
    )
    if not out.get("ok"):
        return StepResult.failed(f"job not started: {out.get('error')}")
    state = out["state"]
    notes.append(
        f"node rank {rank}: {state.get('effective')} under {out['mode']} (pid {state['pid']})"
    )
    return StepResult.changed("; ".join(notes), rank=rank, mode=out["mode"], state=state)


@step("jobs")
def jobs_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Every job state this node holds (reads only, apart from shipping the runner)."""
    jobs_dir = ctx.options.extra["jobs_dir"]
    if not sh(conn, f"test -d {shlex.quote(jobs_dir)}").ok:
        return StepResult.ok("no jobs on this node", jobs=[])
    runner = _runner(conn, jobs_dir)
    out = _json_out(
        sh(conn, f"python3 {shlex.quote(runner)} list --root {shlex.quote(jobs_dir)}", timeout=60),
        "list",
    )
    jobs = list(out.get("jobs") or [])
    return StepResult.ok(f"{len(jobs)} job record(s)", jobs=jobs, now=out.get("now"))


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
    x = ctx.options.extra
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    cmd = (
        f"python3 {shlex.quote(job.runner)} follow --job-dir {shlex.quote(job.job_dir)} "
        f"--node-rank {job.rank}"
    )
    if x.get("rank") is not None:
        cmd += f" --rank {int(x['rank'])}"
    if x.get("follow"):
        cmd += " --follow"
    if x.get("this_attempt"):
        cmd += " --this-attempt"
    writer = LineWriter(x["out"], x["lock"])
    try:
        done = conn.run(
            cmd, warn=True, hide=False, in_stream=False, out_stream=writer, err_stream=writer
        )
    except Exception as exc:  # a dropped connection: the job is detached and goes on
        return StepResult.failed(
            f"connection lost ({exc.__class__.__name__}); the job keeps running on the node: "
            f"`fab logs {job.spec['job']} --follow` to watch again"
        )
    writer.write("\n" if writer.buffer else "")
    if not done.ok:
        return StepResult.failed(f"log reader exited {done.exited}")
    return StepResult.ok(f"node rank {job.rank} logs")


@step("cancel")
def cancel_step(conn: Connection, ctx: HostContext) -> StepResult:
    """SIGTERM the node's ranks, wait, SIGKILL what is left, upload the last checkpoint."""
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    wait = float(ctx.options.extra.get("wait", 120.0))
    endpoint = str(ctx.options.extra.get("s3_endpoint") or "")
    out = _json_out(
        sh(
            conn,
            f"python3 {shlex.quote(job.runner)} cancel --job-dir {shlex.quote(job.job_dir)} "
            f"--node-rank {job.rank} --wait {wait:g}"
            + (f" --s3-endpoint {shlex.quote(endpoint)}" if endpoint else ""),
            timeout=wait + 700,
        ),
        "cancel",
    )
    if not out.get("ok"):
        return StepResult.failed(f"cancel failed: {out.get('error')}")
    state = out.get("state") or {}
    final = state.get("final_sync") or {}
    sync = f"; last checkpoint: {final.get('detail')}" if final else ""
    note = f" ({out['note']})" if out.get("note") else ""
    message = f"node rank {job.rank}: {state.get('effective')}{note}{sync}"
    if out.get("changed") is False:  # it had ended already: nothing was stopped
        return StepResult.ok(message, state=state)
    return StepResult.changed(message, state=state)


@step("resume-check")
def resume_check_step(conn: Connection, ctx: HostContext) -> StepResult:
    """What a resume would start from, on the head: its checkpoint folder and the bucket."""
    job = node_job(conn, ctx)
    if job is None:
        return StepResult.skipped("not a node of this job")
    out = _json_out(
        sh(
            conn,
            f"python3 {shlex.quote(job.runner)} restorable --job-dir {shlex.quote(job.job_dir)}",
            timeout=300,
        ),
        "resume check",
    )
    if not out.get("ok"):
        return StepResult.failed(f"cannot tell what to resume from: {out.get('error')}")
    return StepResult.ok(restorable_line(out), restorable=out)


def restorable_line(found: Mapping[str, Any]) -> str:
    """What ``job_runner.py restorable`` found, in words."""
    local = int(found.get("local_files") or 0)
    where = f"{local} file(s) in {found.get('checkpoint_dir')}" if local else "no local files"
    if not found.get("bucket"):
        return f"{where}; no bucket"
    step_, files = found.get("bucket_step"), int(found.get("bucket_files") or 0)
    kept = f"step {step_}" if step_ is not None else "no complete checkpoint"
    if step_ is None and files:
        kept = f"the job's folder ({files} file(s))"
    return f"{where}; {kept} in {found['bucket']}"


def nothing_to_restore(found: Mapping[str, Any]) -> bool:
    stored = found.get("bucket_step") is not None or found.get("bucket_files")
    return not found.get("local_files") and not stored


# ---------------------------------------------------------------------------- job table


@dataclass
class JobRow:
    job: str
    name: str
    state: str
    started_at: str | None
    runtime_s: float
    nnodes: int
    attempt: int
    last_line: str
    spec: Mapping[str, Any]
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    cost: float | None = None
    currency: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "name": self.name,
            "state": self.state,
            "started_at": self.started_at,
            "runtime_s": round(self.runtime_s, 1),
            "nnodes": self.nnodes,
            "attempt": self.attempt,
            "cost": None if self.cost is None else round(self.cost, 4),
            "currency": self.currency or None,
            "last_line": self.last_line,
            "nodes": {str(k): v.get("effective") for k, v in sorted(self.nodes.items())},
        }


def _parse_time(text: Any) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def hourly_per_node(outputs: Mapping[str, Any]) -> tuple[float, str] | None:
    """The stack's hourly price for one node (its ``hourly_cost`` covers every node)."""
    cost = outputs.get("hourly_cost") or {}
    nodes = outputs.get("nodes") or []
    try:
        amount = float(cost["amount"])
    except (KeyError, TypeError, ValueError):
        return None
    return amount / max(1, len(nodes)), str(cost.get("currency") or "")


def merge_jobs(
    records: Iterable[Mapping[str, Any]], *, now: dt.datetime, outputs: Mapping[str, Any]
) -> list[JobRow]:
    """One row per job from every node's state records (a node sharing a disk with another
    reports the same record twice: records are keyed by job and node rank)."""
    by_job: dict[str, dict[int, dict[str, Any]]] = {}
    specs: dict[str, Mapping[str, Any]] = {}
    for rec in records:
        job = str(rec.get("job"))
        by_job.setdefault(job, {})[int(rec.get("node_rank") or 0)] = dict(rec)
        if rec.get("spec"):
            specs[job] = rec["spec"]
    price = hourly_per_node(outputs)
    rows = []
    for job, nodes in by_job.items():
        states = {str(n.get("effective") or n.get("state")) for n in nodes.values()}
        state = next((s for s in _STATE_ORDER if s in states), sorted(states)[0])
        spec = specs.get(job, {})
        nnodes = int(spec.get("nnodes") or max(nodes) + 1)
        if len(nodes) < nnodes and state in ("running", "starting", "succeeded"):
            state = "unknown" if state == "succeeded" else state
        head = nodes.get(0) or next(iter(nodes.values()))
        started = _parse_time(head.get("started_at"))
        ended = [_parse_time(n.get("ended_at")) for n in nodes.values()]
        beats = [_parse_time(n.get("heartbeat_at")) for n in nodes.values()]
        end: dt.datetime | None
        if state in ("running", "starting"):
            end = now
        elif all(ended):
            end = max(e for e in ended if e)
        else:  # interrupted: the last sign of life
            end = max((b for b in beats if b), default=started)
        runtime = float(head.get("runtime_s_before") or 0.0)
        if started and end:
            runtime += max(0.0, (end - started).total_seconds())
        row = JobRow(
            job=job,
            name=str(head.get("name") or job),
            state=state,
            started_at=str(spec.get("created_at") or head.get("started_at") or ""),
            runtime_s=runtime,
            nnodes=nnodes,
            attempt=int(head.get("attempt") or 1),
            last_line=str(head.get("last_line") or ""),
            spec=spec,
            nodes=nodes,
        )
        if price is not None:
            row.cost = price[0] * nnodes * runtime / 3600.0
            row.currency = price[1]
        rows.append(row)
    return sorted(rows, key=lambda r: (r.started_at or "", r.job))


def find_job(rows: Sequence[JobRow], ref: str) -> JobRow:
    """JOB given as an id, or as a --name (the newest job of that name)."""
    for row in rows:
        if row.job == ref:
            return row
    named = [r for r in rows if r.name == ref]
    if named:
        return named[-1]
    known = ", ".join(r.job for r in rows[-5:]) or "none"
    raise TrainError(f"no job {ref!r} on these nodes (newest: {known}); `fab jobs` lists them")


def fmt_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def jobs_table(rows: Sequence[JobRow]) -> Table:
    table = Table(title=f"{len(rows)} job(s)")
    for col in ("job", "state", "started (UTC)", "runtime", "cost", "last log line"):
        table.add_column(col, overflow="fold")
    for r in rows:
        cost = "-" if r.cost is None else f"{r.cost:.2f} {r.currency}".strip()
        started = (r.started_at or "-")[5:16].replace("T", " ") or "-"
        label = r.job if r.name in r.job else f"{r.job} ({r.name})"
        state = r.state if r.attempt == 1 else f"{r.state} (attempt {r.attempt})"
        line = r.last_line
        shown = line if len(line) <= LAST_LINE_WIDTH else line[: LAST_LINE_WIDTH - 3] + "..."
        table.add_row(label, state, started, fmt_duration(r.runtime_s), cost, shown)
    return table


# The start of a log line says what it is ("epoch 12 loss ..."); the end is cut instead.
LAST_LINE_WIDTH = 40


# ---------------------------------------------------------------------------- plumbing


def _quiet() -> bool:
    return os.environ.get("GPUFLEET_QUIET") == "1"


def _context_factory(fleet: Fleet, extra: Mapping[str, Any]) -> Callable[[Host], HostContext]:
    options = Options(extra=dict(extra))

    def make(host: Host) -> HostContext:
        return HostContext(
            host=host,
            options=options,
            tier=fleet.tier,
            scratch=fleet.scratch,
            stack=fleet.stack,
            outputs=fleet.outputs,
        )

    return make


def _run(
    c: Context,
    fleet: Fleet,
    name: str,
    steps: Sequence[Any],
    extra: Mapping[str, Any],
    *,
    console: Console | None,
    connect_timeout: float,
) -> FleetReport:
    return run_fleet(
        name,
        fleet.hosts,
        [probe_step, *steps],
        _context_factory(fleet, extra),
        config=c.config,
        console=console,
        connect_timeout_s=connect_timeout,
    )


def _problems(report: FleetReport) -> list[str]:
    out = []
    for h in report.hosts:
        if h.connection_error:
            out.append(h.connection_message)
            continue
        for s in h.steps:
            if s.result.is_failure:
                msg = s.result.message
                out.append(msg if msg.startswith(h.host.label) else f"{h.host.label}: {msg}")
                break
    return out


def collect_jobs(
    c: Context, fleet: Fleet, jobs_dir: str, connect_timeout: float
) -> tuple[list[JobRow], FleetReport]:
    report = _run(
        c,
        fleet,
        "jobs",
        [jobs_step],
        {"jobs_dir": jobs_dir},
        console=None,
        connect_timeout=connect_timeout,
    )
    records: list[Mapping[str, Any]] = []
    for h in report.hosts:
        for s in h.steps:
            if s.name == "jobs":
                records.extend(s.result.details.get("jobs") or [])
    return merge_jobs(records, now=dt.datetime.now(dt.UTC), outputs=fleet.outputs), report


def _warn_unreachable(report: FleetReport) -> None:
    for line in _problems(report):
        print(f"gpufleet: {line}", file=sys.stderr)


def _follow(
    c: Context,
    fleet: Fleet,
    spec: Mapping[str, Any],
    *,
    rank: int | None,
    follow: bool,
    connect_timeout: float,
    this_attempt: bool = False,
) -> FleetReport:
    extra = {
        "spec": spec,
        "rank": rank,
        "follow": follow,
        "this_attempt": this_attempt,
        "out": sys.stdout,
        "lock": threading.Lock(),
    }
    return _run(c, fleet, "logs", [logs_step], extra, console=None, connect_timeout=connect_timeout)


def _job_hosts(fleet: Fleet, spec: Mapping[str, Any]) -> Fleet:
    hosts = tuple(h for h in fleet.hosts if rank_of(spec, h) is not None)
    return Fleet(
        hosts=hosts or fleet.hosts,
        stack=fleet.stack,
        provider=fleet.provider,
        tier=fleet.tier,
        scratch=fleet.scratch,
        source=fleet.source,
        host_keys=fleet.host_keys,
        outputs=fleet.outputs,
    )


# ---------------------------------------------------------------------------- tasks

TRAIN_HELP = {
    "script": "the training script, run by torchrun on every node (path on this machine)",
    "args": "arguments for the script, as one quoted string",
    "workdir": "folder copied to the nodes (default: the script's folder); .gitignore is "
    "honoured, .git never copied",
    "name": "a name for the job (default: the script's name); JOB arguments accept it",
    "nproc_per_node": "processes per node (default: one per GPU; 1 with --cpu)",
    "cpu": "run on CPUs with gloo (no GPU needed): for tests and dry runs",
    "stop_when_done": "stop the nodes once the job ended and its last checkpoint is in the bucket",
    "follow": "stream the job's output until it ends; exit with its status",
    "resume": "JOB (id or name) or 'auto': rerun a recorded job from its newest complete "
    "checkpoint in the bucket",
    "venv": f"the node venv with torch (default {DEFAULT_VENV}, made by fab setup)",
    "jobs_dir": f"job folders on the nodes (default {JOBS_ROOT})",
    "max_workdir_mb": f"refuse a workdir over this size (default {DEFAULT_MAX_WORKDIR_MB:g})",
    "sync_interval": "seconds between checkpoint uploads while the job runs (default 60)",
    "node_env": "extra environment for the job, KEY=VALUE,...",
    "s3_endpoint": "S3-compatible endpoint for the bucket (tests, MinIO)",
    "master_port": "rendezvous port on the head (default: a free one)",
    "detach": "auto (systemd where it runs, else a supervised process), systemd or fork",
    "from_scratch": "with --resume: start again from step 0 when there is no checkpoint "
    "to restore (refused otherwise)",
    "rerun": "with --resume: run a job that already succeeded again",
}

# The node's own ceiling (its GPUs, or its CPUs with --cpu) is judged once its facts are in.
TRAIN_BOUNDS = {
    "nproc_per_node": Bound(1, example="2"),
    "max_workdir_mb": Bound(0, above=True, example="500"),
    "sync_interval": Bound(0, above=True, example="60"),
    "master_port": Bound(0, high=65535, example="29500"),
}


def _job_to_resume(
    c: Context,
    fleet: Fleet,
    resume: str,
    jobs_dir: str,
    max_workdir_mb: float,
    timeout: float,
    rerun: bool = False,
) -> tuple[Mapping[str, Any], Fleet, dict[str, list[Any]] | None] | None:
    """The recorded job ``--resume`` names (``auto``: the newest interrupted one), the hosts
    it ran on and its workdir's manifest when the workdir is still here; None: nothing to
    resume. Refuses, before anything starts, a job still running or a host list without its
    nodes."""
    rows, report = collect_jobs(c, fleet, jobs_dir or JOBS_ROOT, timeout)
    if report.failed_hosts:
        _warn_unreachable(report)
        raise _fail("cannot resume: not every node answered (see above); nothing started")
    try:
        if resume == "auto":
            stopped = [r for r in rows if r.state == "interrupted"]
            if not stopped:
                return None
            row = stopped[-1]
        else:
            row = find_job(rows, resume)
    except TrainError as exc:
        raise _fail(str(exc)) from None
    if row.state in ("running", "starting"):
        raise _fail(f"job {row.job} is {row.state}: `fab cancel {row.job}` first")
    if row.state == "succeeded" and not rerun:
        raise _fail(f"job {row.job} already succeeded: nothing to resume (--rerun runs it again)")
    old = row.spec
    fleet = _job_hosts(fleet, old)
    if len(fleet.hosts) != int(old.get("nnodes") or 1):
        raise _fail(
            f"job {row.job} ran on {old.get('nnodes')} node(s); {len(fleet.hosts)} of them "
            "are in this host list: give the job's hosts (fab jobs shows them)"
        )
    manifest = None
    local = Path(str(old.get("local_workdir") or ""))
    if local.is_dir():
        try:
            manifest = build_manifest(local, workdir_files(local), max_workdir_mb * 1e6)
        except TrainError as exc:
            raise _fail(str(exc)) from None
    return old, fleet, manifest


def _checked_node_facts(
    c: Context,
    fleet: Fleet,
    extra: Mapping[str, Any],
    console: Console,
    quiet: bool,
    timeout: float,
) -> dict[Host, dict[str, Any]]:
    """Every node's train-check facts; refuses the whole job when one node is not ready."""
    checked = _run(
        c,
        fleet,
        "train",
        [train_check_step],
        dict(extra),
        console=None if quiet else console,
        connect_timeout=timeout,
    )
    problems = _problems(checked)
    if problems:
        _warn_unreachable(checked)  # on stderr, as every other refusal
        raise _fail(
            f"{len(problems)} of {len(fleet.hosts)} node(s) not ready: nothing started "
            f"(a {len(fleet.hosts)}-node job needs every node)"
        )
    return {
        h.host: dict(next(s for s in h.steps if s.name == "train-check").result.details["facts"])
        for h in checked.hosts
    }


def _report_started(
    started: FleetReport,
    spec: Mapping[str, Any],
    resumed: bool,
    json: bool,
    console: Console,
    nodes: int,
) -> None:
    """The start's table (or JSON document) and the line saying what to run next; exit 1
    when a node did not start."""
    if json:
        doc = {**started.to_json(), "job": spec["job"], "attempt": spec["attempt"]}
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
    verb = "resumed" if resumed else "running"
    if not json:
        console.print(
            f"job {spec['job']} {verb} on {nodes} node(s) x "
            f"{spec['nproc_per_node']} process(es); `fab logs {spec['job']} --follow`, "
            f"`fab jobs`, `fab cancel {spec['job']}`",
            highlight=False,
            soft_wrap=True,
        )


def _follow_to_end(c: Context, fleet: Fleet, spec: Mapping[str, Any], timeout: float) -> None:
    """Stream the job's log until it ends; exit 1 unless it succeeded."""
    # A resume's --follow shows the new attempt, not the earlier ones again (issue 24).
    resumed = int(spec.get("attempt") or 1) > 1
    _follow(c, fleet, spec, rank=None, follow=True, connect_timeout=timeout, this_attempt=resumed)
    rows, _ = collect_jobs(c, fleet, spec["jobs_dir"], timeout)
    final = next((r for r in rows if r.job == spec["job"]), None)
    state = final.state if final else "unknown"
    print(f"job {spec['job']}: {state}", file=sys.stderr)
    if state != "succeeded":
        raise Exit(code=1)


def _new_request(**options: Any) -> tuple[TrainRequest, dict[str, list[Any]]]:
    """A new job's request (``parse_request``'s options) and its workdir's manifest."""
    try:
        req = parse_request(**options, cwd=Path.cwd())
        return req, build_manifest(
            req.workdir, workdir_files(req.workdir), req.max_workdir_mb * 1e6
        )
    except TrainError as exc:
        raise _fail(str(exc)) from None


def _check_restorable(
    c: Context,
    fleet: Fleet,
    old: Mapping[str, Any],
    from_scratch: bool,
    console: Console,
    quiet: bool,
    timeout: float,
) -> None:
    """Refuse a resume with nothing to restore (no checkpoint on the head, none complete in
    the bucket) unless ``from_scratch``: it would start from step 0 and call it resumed."""
    head = replace(fleet, hosts=tuple(h for h in fleet.hosts if rank_of(old, h) == 0))
    report = _run(
        c,
        head,
        "train",
        [resume_check_step],
        {"spec": old},
        console=None if quiet else console,
        connect_timeout=timeout,
    )
    if _problems(report) or not head.hosts:
        _warn_unreachable(report)
        raise _fail(f"job {old['job']}: cannot tell what to resume from: nothing started")
    found = next(s for s in report.hosts[0].steps if s.name == "resume-check").result.details
    if not nothing_to_restore(found["restorable"]):
        return
    said = restorable_line(found["restorable"])
    if not from_scratch:
        raise _fail(
            f"job {old['job']}: nothing to restore ({said}); --from-scratch starts it "
            "again from step 0"
        )
    console.print(
        f"gpufleet: job {old['job']}: nothing to restore ({said}): starting from step 0 "
        "(--from-scratch)",
        highlight=False,
        soft_wrap=True,
    )


def _job_spec_for(
    c: Context,
    fleet: Fleet,
    req: TrainRequest | None,
    old: Mapping[str, Any] | None,
    *,
    venv: str,
    stop_when_done: bool,
    console: Console,
    quiet: bool,
    timeout: float,
) -> dict[str, Any]:
    """The spec to start: a new job from ``req`` or the next attempt of ``old``, once every
    node passed train-check."""
    python = f"{(venv or DEFAULT_VENV).rstrip('/')}/bin/python" if old is None else old["python"]
    head = fleet.hosts[0]
    check_extra = {
        "head": head,
        "python": python,
        "venv": str(Path(python).parent.parent),
        "jobs_dir": req.jobs_dir if req else str(old["jobs_dir"]) if old else JOBS_ROOT,
        "ckpt_parent": f"{fleet.scratch.path.rstrip('/')}/checkpoints",
        "cpu": req.cpu if req else bool(old and old.get("cpu")),
        "master_port": req.master_port if req else 0,
        "nproc": req.nproc_per_node if req else int(old["nproc_per_node"]) if old else 0,
    }
    facts = _checked_node_facts(c, fleet, check_extra, console, quiet, timeout)
    port = (req.master_port if req else 0) or int(facts[head].get("port") or 29500)
    addr = master_address(fleet.outputs, fleet, None)
    if old is not None:
        return resume_spec(old, master_addr=addr, master_port=port, stop_when_done=stop_when_done)
    assert req is not None
    now = dt.datetime.now(dt.UTC)
    gpus = min(int(f.get("gpus") or 0) for f in facts.values())
    nproc = req.nproc_per_node or (1 if req.cpu else gpus)
    job = new_job_id(req.name, now, secrets.token_hex(2))
    return job_spec(req, fleet, job=job, nproc=nproc, master_addr=addr, master_port=port, now=now)


def _start(
    c: Context,
    fleet: Fleet,
    spec: Mapping[str, Any],
    manifest: dict[str, list[Any]] | None,
    *,
    console: Console | None,
    timeout: float,
) -> FleetReport:
    """Send the workdir (when ``manifest``), write job.json, start every node's supervisor."""
    extra = {
        "spec": spec,
        "manifest": manifest,
        "local_workdir": Path(str(spec.get("local_workdir"))),
        "remote_workdir": spec["workdir"],
    }
    return _run(
        c, fleet, "train", [train_start_step], extra, console=console, connect_timeout=timeout
    )


@fleet_task(help=TRAIN_HELP, bounds=TRAIN_BOUNDS)
def train(
    c: Context,
    fleet_args: FleetArgs,
    script: str = "",
    args: str = "",
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
    sync_interval: float = 60.0,
    node_env: str = "",
    s3_endpoint: str = "",
    master_port: int = 0,
    detach: str = "auto",
    from_scratch: bool = False,
    rerun: bool = False,
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
    if not resume:
        req, manifest = _new_request(
            script=script,
            args=args,
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
        )
    fleet = resolve_fleet(c, fleet_args)
    if len({(h.address, h.port) for h in fleet.hosts}) != len(fleet.hosts):
        raise _fail("the same host is listed twice: each node takes one node rank")

    old: Mapping[str, Any] | None = None
    if resume:
        found = _job_to_resume(c, fleet, resume, jobs_dir, max_workdir_mb, timeout, rerun)
        if found is None:
            print("gpufleet: nothing to resume: no interrupted job on these nodes")
            return
        old, fleet, manifest = found
    spec = _job_spec_for(
        c,
        fleet,
        req,
        old,
        venv=venv,
        stop_when_done=stop_when_done,
        console=console,
        quiet=quiet,
        timeout=timeout,
    )
    if old is not None:
        _check_restorable(c, fleet, old, from_scratch, console, quiet, timeout)
    started = _start(c, fleet, spec, manifest, console=None if quiet else console, timeout=timeout)
    _report_started(started, spec, old is not None, json, console, len(fleet.hosts))
    if follow:
        _follow_to_end(c, fleet, spec, timeout)


@fleet_task(help={"jobs_dir": TRAIN_HELP["jobs_dir"]})
def jobs(c: Context, fleet_args: FleetArgs, jobs_dir: str = "") -> None:
    """Every job on the fleet: state, start, runtime, cost so far, last log line."""
    fleet = resolve_fleet(c, fleet_args)
    rows, report = collect_jobs(c, fleet, jobs_dir or JOBS_ROOT, fleet_args.connect_timeout)
    _warn_unreachable(report)
    if fleet_args.json:
        doc = {
            "jobs": [r.to_json() for r in rows],
            "unreachable": _problems(report),
        }
        sys.stdout.write(jsonlib.dumps(doc, indent=2) + "\n")
    else:
        literal_console().print(jobs_table(rows))
    if report.failed_hosts:
        raise Exit(code=1)


def _resolve(
    c: Context, fleet_args: FleetArgs, ref: str | None, jobs_dir: str
) -> tuple[Fleet, JobRow]:
    if not ref:
        raise _fail("name the job: its id or --name (`fab jobs` lists them)")
    fleet = resolve_fleet(c, fleet_args)
    rows, report = collect_jobs(c, fleet, jobs_dir or JOBS_ROOT, fleet_args.connect_timeout)
    _warn_unreachable(report)
    try:
        row = find_job(rows, ref)
    except TrainError as exc:
        raise _fail(str(exc)) from None
    return _job_hosts(fleet, row.spec), row


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
    report = _follow(
        c,
        fleet,
        row.spec,
        rank=None if rank < 0 else rank,
        follow=follow,
        connect_timeout=fleet_args.connect_timeout,
    )
    if report.failed_hosts:
        _warn_unreachable(report)
        raise Exit(code=1)


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
    report = _run(
        c,
        fleet,
        "cancel",
        [cancel_step],
        {"spec": row.spec, "wait": wait, "s3_endpoint": s3_endpoint},
        console=None if (json or _quiet()) else console,
        connect_timeout=fleet_args.connect_timeout,
    )
    if json:
        sys.stdout.write(jsonlib.dumps(report.to_json(), indent=2, default=str) + "\n")
    else:
        console.print(summary_table(report))
    if report.failed_hosts:
        raise Exit(code=1)
