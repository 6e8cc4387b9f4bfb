"""What ``fab train`` was asked, the job spec every node gets, and whether a node can run it.

Every check that needs no node runs here, before anything is touched (a TrainError with
one line); the node's own facts (python, torch, GPUs, CPUs, write access) are judged by
:func:`judge_check` once the train-check step has read them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootstrap.fleet.api import Host
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.interconnect import network_env
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.train.placeholders import refusal as placeholder_refusal
from bootstrap.verify.ship import parse_node_env
from gpufleet_node.job_notify import check_url as check_notify_url
from gpufleet_node.job_policy import parse_duration
from gpufleet_node.job_sync import QUIET_S as DEFAULT_SYNC_QUIET_S

JOBS_ROOT = "/var/lib/gpufleet/jobs"
DEFAULT_MAX_WORKDIR_MB = 200.0
DEFAULT_SYNC_INTERVAL_S = 60.0
DETACH_MODES = ("auto", "systemd", "fork")
SPEC_SCHEMA = "gpufleet.job/1"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")
_NEWEST = re.compile(r"\{newest\s+([^{}\s]+)\}")


class TrainError(Exception):
    """Bad input: one line for the person at the keyboard; nothing was changed."""


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
    args: tuple[str, ...]  # placeholders kept as typed: the node expands them
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
    resume_args: tuple[str, ...] = ()  # added on every attempt that restored something
    # How long the checkpoint folder must stay unchanged before a periodic push.
    sync_quiet_s: float = DEFAULT_SYNC_QUIET_S
    # Walk-away runs (gpufleet_node/job_policy.py): restarts after a crash or a hang, the
    # silence that is a hang (None: never), the run's spend that stops it (None: none).
    max_restarts: int = 0
    hang_after_s: float | None = None
    max_cost: float | None = None
    # The run's webhook (gpufleet_node/job_notify.py): a secret, shown by its host only.
    notify_url: str = ""


def split_args(option: str, text: str | None) -> tuple[str, ...]:
    """``--args``/``--resume-args`` as the script's argv, placeholders checked (not
    expanded: the node does that); a TrainError with one line."""
    # `{newest checkpoint-*}` is one placeholder, whether or not it is quoted.
    held = _NEWEST.sub(lambda m: "{newest\0" + m.group(1) + "}", text or "")
    try:
        argv = tuple(a.replace("\0", " ") for a in shlex.split(held))
    except ValueError as exc:
        raise TrainError(f"{option} {text!r}: {exc}") from None
    why = placeholder_refusal(option, argv)
    if why:
        raise TrainError(why)
    return argv


def recovery_options(max_restarts: int, hang_after: str, max_cost: float) -> dict[str, Any]:
    """``--max-restarts``, ``--hang-after``, ``--max-cost`` as job.json fields (those not
    given left out), or a TrainError with one line."""
    out: dict[str, Any] = {}
    if max_restarts < 0:
        raise TrainError(f"--max-restarts {max_restarts}: must be 0 or more")
    if max_restarts:
        out["max_restarts"] = max_restarts
    if hang_after:
        try:
            out["hang_after_s"] = parse_duration(hang_after)
        except ValueError as exc:
            raise TrainError(f"--hang-after {exc}") from None
    if max_cost < 0:
        raise TrainError(f"--max-cost {max_cost:g}: must be above 0")
    if max_cost:
        out["max_cost"] = max_cost
    return out


def notify_option(url: str) -> str:
    """``--notify URL`` checked before anything starts, or a TrainError with one line that
    names the host only (the URL's path or query is the webhook's token)."""
    problem = check_notify_url(url)
    if problem:
        raise TrainError(f"--notify: {problem}")
    return url


def check_recovery(
    fields: Mapping[str, Any], *, nnodes: int, price: float | None, bucket: bool = True
) -> None:
    """Refuse what the supervisors cannot do, in one line: on more than one node, restarts
    and hang detection meet in the stack's bucket (gpufleet_node/job_group.py: the head's
    attempt records), so they need one; a budget needs the stack's hourly price."""
    if nnodes > 1 and not bucket:
        for key, option in (("max_restarts", "--max-restarts"), ("hang_after_s", "--hang-after")):
            if fields.get(key):
                raise TrainError(
                    f"{option}: on {nnodes} nodes the nodes meet in the stack's bucket, and "
                    "this stack has none; run on one node, or without it"
                )
    if fields.get("max_cost") and price is None:
        raise TrainError(
            "--max-cost: the stack's outputs give no hourly_cost to count the spend with"
        )


def check_detach(detach: str) -> str:
    if detach and detach not in DETACH_MODES:
        raise TrainError(f"--detach {detach!r}: one of {', '.join(DETACH_MODES)}")
    return detach or "auto"


def parse_request(
    *,
    script: str,
    args: str | None,
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
    resume_args: str | None = None,
    sync_quiet: float = 0.0,
    max_restarts: int = 0,
    hang_after: str = "",
    max_cost: float = 0.0,
    notify: str = "",
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
    argv = split_args("--args", args)
    resume_argv = split_args("--resume-args", resume_args)
    if nproc_per_node < 0:
        raise TrainError(f"--nproc-per-node {nproc_per_node}: must be 1 or more")
    if max_workdir_mb <= 0:
        raise TrainError("--max-workdir-mb must be above 0")
    if sync_interval < 0:  # 0: not given
        raise TrainError("--sync-interval must be above 0 seconds")
    if sync_quiet < 0:  # 0: not given
        raise TrainError("--sync-quiet must be above 0 seconds")
    detach = check_detach(detach)
    recovery = recovery_options(max_restarts, hang_after, max_cost)
    notify_url = notify_option(notify) if notify else ""
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
        sync_interval_s=sync_interval or DEFAULT_SYNC_INTERVAL_S,
        node_env=extra_env,
        s3_endpoint=s3_endpoint,
        master_port=master_port,
        detach=detach,
        resume_args=resume_argv,
        sync_quiet_s=sync_quiet or DEFAULT_SYNC_QUIET_S,
        max_restarts=int(recovery.get("max_restarts") or 0),
        hang_after_s=recovery.get("hang_after_s"),
        max_cost=recovery.get("max_cost"),
        notify_url=notify_url,
    )


def check_bucket_home(fleet: Fleet) -> None:
    """A TrainError when the stack names a bucket without its cloud or region: the node's
    bucket client needs both to reach it, and no default cloud is guessed."""
    bucket = fleet.outputs.get("bucket")
    region = fleet.outputs.get("region")
    missing = [n for n, v in (("provider", fleet.provider), ("region", region)) if not v]
    if bucket and missing:
        names = " and ".join(f'"{n}"' for n in missing)
        raise TrainError(
            f"the stack's bucket {bucket!r} comes without its {' and '.join(missing)}: "
            f"add {names} to the inventory (stack outputs name both)"
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
    price = hourly_price(outputs)
    return {
        "schema": SPEC_SCHEMA,
        "job": job,
        "name": req.name,
        "attempt": 1,
        "resume": False,
        "created_at": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "script": req.script,
        "args": list(req.args),
        "resume_args": list(req.resume_args),
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
        "sync_quiet_s": req.sync_quiet_s,
        "stop_when_done": req.stop_when_done,
        "detach": req.detach,
        "jobs_dir": req.jobs_dir,
        "max_restarts": req.max_restarts,
        "hang_after_s": req.hang_after_s,
        "max_cost": req.max_cost,
        # One node's hourly price (the stack's hourly_cost over its nodes): the node's
        # supervisor counts the run's spend with it.
        "hourly_price": price[0] if price else None,
        "currency": price[1] if price else "",
        # The head's supervisor posts each attempt's end and the run's end here; a secret
        # (a webhook token): fab shows its host only, the node's state and events never it.
        "notify_url": req.notify_url or None,
        # A spot stack's run resumes by itself when a reclaimed node boots again
        # (gpufleet_node/job_boot.py; multi-node: through the bucket, job_group.py).
        # More than one node meets in the bucket: without one, a node that comes back
        # has nobody to rejoin (fab train --resume then).
        "reclaim_recovery": spot_stack(outputs) and (len(fleet.hosts) == 1 or bool(bucket)),
        "nodes": [
            {"name": node_name(h), "address": h.address, "port": h.port, "label": h.label}
            for h in fleet.hosts
        ],
    }


def spot_stack(outputs: Mapping[str, Any]) -> bool:
    """Whether the stack's nodes are spot: its hourly_cost output names the billing mode
    (infra/program.py: currency, billing, amount)."""
    cost = outputs.get("hourly_cost")
    return isinstance(cost, Mapping) and str(cost.get("billing") or "").lower() == "spot"


def hourly_price(outputs: Mapping[str, Any]) -> tuple[float, str] | None:
    """The stack's hourly price for one node (its ``hourly_cost`` covers every node), with
    its currency; None when the outputs give none. (``fab jobs`` prices runtime with it.)"""
    cost = outputs.get("hourly_cost") or {}
    nodes = outputs.get("nodes") or []
    try:
        amount = float(cost["amount"])
    except (KeyError, TypeError, ValueError):
        return None
    return amount / max(1, len(nodes)), str(cost.get("currency") or "")


@dataclass(frozen=True)
class ResumeOptions:
    """What ``fab train --resume JOB`` was given besides the job: each option set here
    replaces the recorded one in the new attempt's spec (None, "" or 0: not given)."""

    args: str | None = None
    resume_args: str | None = None
    workdir: str = ""
    name: str = ""
    nproc_per_node: int = 0
    cpu: bool = False
    stop_when_done: bool = False
    venv: str = ""
    sync_interval: float = 0.0
    node_env: str = ""
    s3_endpoint: str = ""
    detach: str = ""
    sync_quiet: float = 0.0
    max_restarts: int = 0
    hang_after: str = ""
    max_cost: float = 0.0
    notify: str = ""


def resume_changes(old: Mapping[str, Any], given: ResumeOptions) -> dict[str, Any]:
    """The spec fields a resume's options change, or a TrainError (one line) for an option
    a resume cannot apply: none is left unsaid. The recorded arguments are checked too,
    as the node will expand them."""
    job = old.get("job")
    if given.workdir:
        raise TrainError(
            f"--workdir: job {job} runs from its recorded workdir "
            f"({old.get('local_workdir')}); start a new job for another one"
        )
    if given.name and given.name != old.get("name"):
        raise TrainError(f"--name: job {job} keeps its name {old.get('name')!r} on a resume")
    if given.cpu and not old.get("cpu"):
        raise TrainError(
            f"--cpu: job {job} ran on GPUs and resumes on them; start a new job with --cpu"
        )
    if given.nproc_per_node < 0:
        raise TrainError(f"--nproc-per-node {given.nproc_per_node}: must be 1 or more")
    if given.sync_interval < 0:
        raise TrainError("--sync-interval must be above 0 seconds")
    if given.sync_quiet < 0:
        raise TrainError("--sync-quiet must be above 0 seconds")
    out: dict[str, Any] = {}
    if given.args is not None:
        out["args"] = list(split_args("--args", given.args))
    else:
        why = placeholder_refusal("--args", [str(a) for a in old.get("args") or []])
        if why:
            raise TrainError(f"job {job}'s recorded {why}: give --args again")
    if given.resume_args is not None:
        out["resume_args"] = list(split_args("--resume-args", given.resume_args))
    if given.nproc_per_node:
        out["nproc_per_node"] = given.nproc_per_node
    if given.venv:
        out["python"] = f"{given.venv.rstrip('/')}/bin/python"
    if given.sync_interval:
        out["sync_interval_s"] = given.sync_interval
    if given.sync_quiet:
        out["sync_quiet_s"] = given.sync_quiet
    if given.node_env:
        try:
            extra = parse_node_env(given.node_env)
        except ValueError as exc:
            raise TrainError(str(exc)) from None
        out["env"] = {**dict(old.get("env") or {}), **extra}
    if given.s3_endpoint:
        out["s3_endpoint"] = given.s3_endpoint
    if given.detach:
        out["detach"] = check_detach(given.detach)
    if given.stop_when_done:
        out["stop_when_done"] = True
    recovery = recovery_options(given.max_restarts, given.hang_after, given.max_cost)
    price = old.get("hourly_price")
    check_recovery(
        recovery,
        nnodes=int(old.get("nnodes") or 1),
        price=None if price is None else float(price),
        bucket=bool(old.get("bucket")),
    )
    out.update(recovery)
    if given.notify:
        out["notify_url"] = notify_option(given.notify)
    return {k: v for k, v in out.items() if old.get(k) != v}


def resume_spec(
    old: Mapping[str, Any],
    *,
    master_addr: str,
    master_port: int,
    changes: Mapping[str, Any] | None = None,
    attempt: int = 0,
) -> dict[str, Any]:
    """The next attempt of ``old``: ``changes`` (from :func:`resume_changes`) applied and
    listed in ``changed`` (the option names, for the job's record). ``attempt``: the one
    the nodes last ran (a resume whose restore failed started nothing, so the number is
    taken again), else the spec's."""
    spec = dict(old)
    spec.setdefault("resume_args", [])
    spec.update(changes or {})
    spec.update(
        attempt=(attempt or int(old.get("attempt") or 1)) + 1,
        resume=True,
        master_addr=master_addr,
        master_port=master_port,
        changed=sorted(changes or {}),
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


def venv_id_command(python: str) -> str:
    """The venv's fingerprint on the node: device, inode, size and mtime of its python and
    of torch's version.py (a new venv or a reinstalled torch changes it)."""
    venv = str(Path(python).parent.parent)
    files = f"{shlex.quote(python)} {shlex.quote(venv)}/lib/python3*/site-packages/torch/version.py"
    return f"stat -L -c '%d.%i.%s.%Y' {files} 2>/dev/null | paste -sd ' ' -"


def check_command(
    req_python: str,
    jobs_dir: str,
    ckpt_parent: str,
    want_port: bool,
    known: tuple[str, str] | None = None,
) -> str:
    """One round trip of cheap reads; torch is imported only when the venv's fingerprint
    is not ``known`` ((fingerprint, torch version) from the last launch: check_cache)."""
    py = shlex.quote(req_python)
    # One python3 for its version and, on the head, a free port (each start costs ~0.2 s).
    port = 's=socket.socket(); s.bind(("", 0)); print("port=%d" % s.getsockname()[1])'
    probe = 'import sys, socket; print("python3=%d.%d" % sys.version_info[:2])' + (
        f"; {port}" if want_port else ""
    )
    import_torch = f"echo torch=$({py} -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    torch = import_torch
    if known:
        fp, version = (shlex.quote(v) for v in known)
        torch = (
            f'if [ -n "$v" ] && [ "$v" = {fp} ]; then echo torch={version}; '
            f"echo torch_cached=yes; else {import_torch}; fi"
        )
    lines = [
        f"python3 -c {shlex.quote(probe)} 2>/dev/null",
        f"v=$({venv_id_command(req_python)}); echo venv_id=$v",
        torch,
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
