#!/usr/bin/env python3
"""gpufleet job runner: runs one node's share of a ``fab train`` job, detached from SSH.

Standard library only, Python 3.10+, shipped by ``fab train`` to ``<jobs root>/bin/`` with
``job_launch.py``, ``job_sync.py`` and what that imports (``bucket.py``, ``clouds/``,
``fleet_names.py``).

Job folder on each node (``<jobs root>``, default /var/lib/gpufleet/jobs)::

    bin/                       these files
    work/<slug>/               the synced workdir (+ .gpufleet-sync.json: what fab copied)
    <job>/job.json             the job's spec, written by fab train (the same on every node)
    <job>/logs/rank-<G>.log    stdout + stderr of global rank G (appended across attempts)
    <job>/node-<R>/state.json  node R's job state: THE CONTRACT WITH THE WATCHDOG (below)
    <job>/node-<R>/supervisor.pid, torchrun.log, cancel (present: fab cancel asked)
    <job>/node-<R>/events.jsonl       the job's events on node R (start, resume, checkpoint,
                                      cancel, end), one JSON object a line
    <job>/node-<R>/gpu-samples.jsonl  the watchdog's GPU samples while the job ran here
    <job>/node-<R>/sync-now    the watchdog asks for a push now (a spot notice; taken)

``state.json`` (schema ``gpufleet.job-state/1``), written only by this node's supervisor (and
by ``cancel`` when the supervisor is gone), always whole: a temp file renamed over the old::

    job, name, node_rank, nnodes, attempt    identity
    state        starting | running | succeeded | failed | cancelled
    pid, boot_id the supervisor; a "running" state whose pid is dead or whose boot_id is not
                 this boot's is read as "interrupted" (see :func:`effective_state`)
    started_at, ended_at, heartbeat_at       UTC ISO times; ended_at starts the idle clock
    exit_code, runtime_s_before              torchrun's exit status; earlier attempts' time
    checkpoint_dir, bucket, bucket_prefix, provider   what to sync and where to
    stop_when_done                           the watchdog powers off once final_sync is ok
    last_sync, final_sync                    {at, ok, detail, newest_step, version, pushed,
                                             wrote_nothing, regressed, ...} of the last push
    restore      what this attempt's restore did ({ok, detail, cause, version, step, files,
                 fetched, kept, bytes, seconds}); a failed one ends the state as failed
                 with ``error`` (cause and what to do) and torchrun never starts
    resumed_from {version, step} the attempt restored, or None
    attempts     one record per attempt of the run (job_policy.attempt_line): attempt,
                 reason (succeeded, crash, hang, budget, cancel; on more nodes also
                 reclaimed, waiting, superseded), torchrun_exit, node, rank, exit_code,
                 signal, seconds, resumed_from, newest_step, version, lost_s and
                 lost_steps (since the newest checkpoint); a hang's last_progress_at,
                 silent_s and tails (each rank's last lines); waiting's waiting_for
    waiting_for  the head of a multi-node run: the nodes its attempt's rendezvous waits
                 for; waiting_for_head (a worker): the head's attempt it waits for;
                 group_attempt: the head's attempt record (job_group.py)
    end_reason   why the run ended (the last attempt's reason); budget: ``budget`` says
                 what was spent of max_cost (job.json max_restarts, hang_after_s,
                 max_cost, hourly_price: job_policy.py)
    warnings     one-line strings: an attempt that wrote an older checkpoint than it
                 restored, output that says the script started from scratch, a torn
                 save that a push left out (last_sync/final_sync ``torn``: the file)

Commands (all print one JSON document, except ``follow``)::

    job_runner.py start     --job-dir D --node-rank R   detach a supervisor for node R
    job_runner.py supervise --job-dir D --node-rank R   (what start runs, in its own session)
    job_runner.py list      --root ROOT                 every job state on this node
    job_runner.py cancel    --job-dir D --node-rank R   SIGTERM, bounded wait, SIGKILL, sync
    job_runner.py follow    --job-dir D --node-rank R   this node's rank logs (--follow: tail)
    job_runner.py sync      --job-dir D --node-rank R   push the checkpoint folder now
    job_runner.py restore   --job-dir D --node-rank R   the newest version into node R's
                                                        checkpoint folder (node-R/restore.json)
    job_runner.py history   --job-dir D --node-rank R   node R's events and GPU samples
    job_runner.py put       --job-dir D --file F        F into the bucket, beside the job's
                                                        checkpoints (its chart)
    job_runner.py boot      --root ROOT                 at boot: rejoin the runs a reclaim
                                                        interrupted (job_boot.py)
    (start and supervise take --rejoin: a node that is back, or one fab recover set up)
    job_runner.py unpack    --workdir W --tar T         apply a workdir update from fab
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import job_boot, job_group, job_notify, job_policy, job_sync, modules

SPEC_SCHEMA = "gpufleet.job/1"
STATE_SCHEMA = "gpufleet.job-state/1"
ACTIVE = ("starting", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
# Periodic syncs in a row that found the checkpoint folder being written: then a warning,
# since a job killed now would have nothing newer in the bucket.
NEVER_QUIET_SYNCS = 5


# ---------------------------------------------------------------------------- files


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)  # noqa: UP017


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Whole or not at all: readers (fab, the watchdog) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def node_dir(job_dir: Path, node_rank: int) -> Path:
    return job_dir / f"node-{node_rank}"


EVENTS_FILE = "events.jsonl"
SAMPLES_FILE = "gpu-samples.jsonl"  # written by the watchdog (watchdog_state.py)
# The watchdog's request to push the checkpoint folder now, not at the next interval (on a
# spot interruption notice: watchdog.py's JOB_SYNC_NOW_FILE): {at, why, budget_s}.
SYNC_NOW_FILE = "sync-now"
# A periodic push's budget when nothing else says one.
SYNC_BUDGET_S = 600.0
# What history returns at most per file: a chart needs no more points than that.
HISTORY_POINTS = 4000


def add_event(nd: Path, event: str, **detail: Any) -> None:
    """One line in the node's event log; a failed write never stops the job."""
    line = json.dumps({"at": utcnow(), "event": event, **detail}, sort_keys=True)
    with contextlib.suppress(OSError):
        nd.mkdir(parents=True, exist_ok=True)
        with open(nd / EVENTS_FILE, "a") as f:
            f.write(line + "\n")


def read_lines(path: Path, limit: int = HISTORY_POINTS) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file, thinned evenly to ``limit`` (first and last
    kept); unreadable lines are skipped."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    if len(out) > limit > 1:
        step = (len(out) - 1) / (limit - 1)
        out = [out[round(i * step)] for i in range(limit)]
    return out


def history(job_dir: Path, node_rank: int) -> dict[str, Any]:
    nd = node_dir(job_dir, node_rank)
    return {
        "ok": True,
        "node_rank": node_rank,
        "events": read_lines(nd / EVENTS_FILE),
        "samples": read_lines(nd / SAMPLES_FILE),
    }


# A test seam (documented in docs/train.md): the boot id this process reads instead of
# the kernel's, so a test can play a node that rebooted without rebooting.
BOOT_ID_ENV = "GPUFLEET_BOOT_ID"


def boot_id() -> str:
    if os.environ.get(BOOT_ID_ENV):
        return os.environ[BOOT_ID_ENV]
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    # A zombie is dead for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def rank_pids(nd: Path) -> list[int]:
    """The live ranks of one node (each writes rank-<G>.pid next to the state file)."""
    out = []
    for path in nd.glob("rank-*.pid"):
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(pid) and _is_rank(pid):
            out.append(pid)
    return sorted(out)


def _is_rank(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return modules.PACKAGE.encode() + b".job_launch" in cmd


def kill_node(nd: Path, pgid: int, sig: int) -> None:
    """``sig`` to torchrun's group and to every rank (each in a session of its own)."""
    if pgid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in rank_pids(nd):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def effective_state(state: Mapping[str, Any], *, alive: bool, current_boot: str) -> str:
    """What a state file means now: an active state nobody supervises any more (the node
    rebooted or was stopped, the supervisor was killed) is ``interrupted``."""
    raw = str(state.get("state", "unknown"))
    if raw in ACTIVE:
        same_boot = not state.get("boot_id") or not current_boot or state["boot_id"] == current_boot
        if not (same_boot and alive):
            return "interrupted"
    return raw


def state_now(path: Path) -> dict[str, Any] | None:
    """The state file with ``effective`` (see :func:`effective_state`) filled in."""
    state = read_json(path)
    if state is None:
        return None
    pid = int(state.get("pid") or 0)
    alive = pid_alive(pid) and _is_supervisor(pid)
    state["effective"] = effective_state(state, alive=alive, current_boot=boot_id())
    if state["effective"] == "interrupted" and rank_pids(path.parent):
        # The supervisor is gone but ranks still train: nobody records or syncs them.
        state["unsupervised_ranks"] = rank_pids(path.parent)
    return state


def _is_supervisor(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return modules.PACKAGE.encode() + b".job_runner" in cmd and b"supervise" in cmd


def last_line(path: Path, limit: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------------------- the command


def rank_env(spec: Mapping[str, Any], node_rank: int) -> dict[str, str]:
    """The job's environment contract (docs/train.md), on top of the spec's own env."""
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    env.update(
        {
            "GPUFLEET_JOB": str(spec["job"]),
            "GPUFLEET_JOB_NAME": str(spec.get("name", spec["job"])),
            "GPUFLEET_ATTEMPT": str(spec.get("attempt", 1)),
            "GPUFLEET_NODE_RANK": str(node_rank),
            "GPUFLEET_CHECKPOINT_DIR": str(spec["checkpoint_dir"]),
            "GPUFLEET_BUCKET": str(spec.get("bucket") or ""),
            "GPUFLEET_BUCKET_PREFIX": str(spec.get("bucket_prefix") or ""),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def torchrun_argv(
    spec: Mapping[str, Any],
    node_rank: int,
    job_dir: Path,
    args: Sequence[str] | None = None,
    rdzv_id: str = "",
) -> list[str]:
    """torchrun with a static rendezvous on the head; each rank runs job_launch.py.

    torchrun's own log folder is the node's folder of the job: without --log-dir it makes
    a /tmp/torchelastic_* folder per launch and never removes it (one per job, attempt and
    node, left in the node's /tmp). ``args``: the script's arguments, expanded (else the
    spec's as they are). ``rdzv_id``: a multi-node attempt's own rendezvous (job_group.py):
    its id prefixes the agents' keys, and a node that has not joined within the join
    timeout fails the head's torchrun before any rank starts."""
    workdir = Path(spec["workdir"])
    rdzv = []
    if rdzv_id:
        join = float(spec.get("rdzv_join_timeout_s") or job_group.JOIN_TIMEOUT_S)
        rdzv = [f"--rdzv-id={rdzv_id}", f"--rdzv-conf=timeout={int(max(1.0, join))}"]
    return [
        str(spec["python"]),
        "-m",
        "torch.distributed.run",
        f"--nnodes={int(spec['nnodes'])}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={int(spec['nproc_per_node'])}",
        f"--master-addr={spec['master_addr']}",
        f"--master-port={int(spec['master_port'])}",
        # The supervisor restarts torchrun itself (--max-restarts in job.json): torchrun's
        # own restart reuses the argv and the folder as the crash left them, with no restore
        # and no resume arguments (job_policy.py says more).
        "--max-restarts=0",
        *rdzv,
        f"--log-dir={node_dir(job_dir, node_rank) / 'torchelastic'}",
        # each rank runs `python -m gpufleet_node.job_launch` (the package on PYTHONPATH)
        "--module",
        f"{modules.PACKAGE}.job_launch",
        "--log-dir",
        str(job_dir / "logs"),
        "--pid-dir",
        str(node_dir(job_dir, node_rank)),
        "--",
        str(workdir / spec["script"]),
        *[str(a) for a in (spec.get("args") or [] if args is None else args)],
    ]


# ---------------------------------------------------------------------------- supervisor


class Supervisor:
    """Runs torchrun for one node, keeps state.json current, uploads new checkpoints."""

    def __init__(self, job_dir: Path, node_rank: int, *, rejoin: bool = False) -> None:
        self.job_dir = job_dir
        self.node_rank = node_rank
        spec = read_json(job_dir / "job.json")
        if spec is None:
            raise SystemExit(f"job_runner: no readable {job_dir / 'job.json'}")
        self.spec = spec
        self.use_job_env()
        self.dir = node_dir(job_dir, node_rank)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.dir / "state.json"
        self.cancel_requested = False
        self.proc: subprocess.Popen[bytes] | None = None
        previous = read_json(self.state_path) or {}
        # A node that comes back (job_runner boot, or fab recover on a new node): the run
        # goes on with a new attempt; the interrupted one is recorded as reclaimed.
        self.rejoined = rejoin
        self.rejoin_after = int(previous.get("attempt") or 0) if rejoin else 0
        interrupted = rejoin and previous.get("state") in ACTIVE
        if rejoin:
            spec["attempt"] = max(int(spec.get("attempt") or 1), self.rejoin_after + 1)
            spec["resume"] = True
        before = float(previous.get("runtime_s_before") or 0.0)
        if previous.get("attempt") != spec.get("attempt"):
            start, end = (
                parse_time(previous.get("started_at")),
                parse_time(previous.get("ended_at") or previous.get("heartbeat_at")),
            )
            if start and end:
                before += max(0.0, (end - start).total_seconds())
        self.state: dict[str, Any] = {
            "schema": STATE_SCHEMA,
            "job": spec["job"],
            "name": spec.get("name", spec["job"]),
            "node_rank": node_rank,
            "nnodes": spec["nnodes"],
            "nproc_per_node": spec["nproc_per_node"],
            "attempt": spec.get("attempt", 1),
            "state": "starting",
            "pid": os.getpid(),
            "boot_id": boot_id(),
            "started_at": utcnow(),
            "heartbeat_at": utcnow(),
            "ended_at": None,
            "exit_code": None,
            "runtime_s_before": before,
            "checkpoint_dir": spec["checkpoint_dir"],
            "bucket": spec.get("bucket") or "",
            "bucket_prefix": spec.get("bucket_prefix") or "",
            "provider": spec.get("provider") or "",
            "stop_when_done": bool(spec.get("stop_when_done")),
            "last_sync": None,
            "final_sync": None,
            "restore": None,
            "resumed_from": None,
            "warnings": [],
            # One record per attempt of the run (job_policy.attempt_line), earlier
            # supervisors' (a --resume's) too.
            "attempts": list(previous.get("attempts") or []),
        }
        if rejoin:
            self.state["restarts"] = int(previous.get("restarts") or 0)
        if interrupted:
            self.state["attempts"].append(reclaimed_record(previous, node_rank))
        if previous.get("attempt") == spec.get("attempt"):
            # The same attempt seen again (sync, cancel, a supervisor started once more): what
            # it restored still decides which step a push may not go below.
            for key in ("restore", "resumed_from", "warnings"):
                if previous.get(key) is not None:
                    self.state[key] = previous[key]
        self.scan_offsets: dict[str, int] = {}
        self.torchrun_offset = 0
        self.t0 = time.monotonic()
        # The run's webhook (--notify), on the head only: made by run(), never by the
        # other commands that read the job (cancel, sync, restore).
        self.notifier: job_notify.Notifier | None = None
        # A multi-node run's bucket (job_group.py); None: one node, or no bucket.
        self.group: job_sync.bucket.BucketStore | None = None
        self.group_cause: dict[str, Any] = {}
        self.group_checked = 0.0
        self.worker_progress: float | None = None  # epoch s: the newest a worker reported
        self.ranks_started = False
        self.said_waiting = False
        self.checkpoints: list[tuple[float, int]] = []  # (monotonic, step) of this attempt

    def use_job_env(self) -> None:
        """The job's own environment (--node-env) applies to the supervisor too: its uploads
        use the same credentials and endpoints as the ranks."""
        for key, value in (self.spec.get("env") or {}).items():
            os.environ[str(key)] = str(value)

    def save(self) -> None:
        self.state["heartbeat_at"] = utcnow()
        write_json(self.state_path, self.state)

    def store(self) -> job_sync.bucket.BucketStore | None:
        return job_sync.make_store(
            str(self.spec.get("provider") or ""),
            str(self.spec.get("bucket") or ""),
            str(self.spec.get("region") or ""),
            str(self.spec.get("s3_endpoint") or ""),
            str(self.spec.get("metadata_url") or ""),
        )

    def sync(
        self, budget_s: float = SYNC_BUDGET_S, *, final: bool = False
    ) -> dict[str, Any] | None:
        """Push the head's checkpoint folder as a new version (only rank 0 pushes: it is the
        one that saves) into ``bucket_prefix``; ``final``: the job ended, no quiet period."""
        if self.node_rank != 0:
            return None
        store = self.store()
        if store is None:
            return {
                "at": utcnow(),
                "ok": True,
                "detail": "no bucket: checkpoints stay on this node",
                "newest_step": None,
            }
        out = job_sync.push(
            Path(self.spec["checkpoint_dir"]),
            store,
            str(self.spec["sync_node"]),
            budget_s,
            prefix=str(self.spec.get("bucket_prefix") or ""),
            final=final,
            quiet_s=float(self.spec.get("sync_quiet_s") or job_sync.QUIET_S),
            attempt=int(self.spec.get("attempt") or 1),
            restored_from=self.state.get("resumed_from"),
        )
        return {"at": utcnow(), **out.to_json()}

    def record_sync(self, result: dict[str, Any] | None, *, final: bool = False) -> None:
        """The last push in the state file; a newer checkpoint step is an event, a version
        that regressed a warning, and so is a torn file that the ``final`` push found, or
        two periodic ones in a row (then it is no save still being written)."""
        if result is None:
            return
        previous = self.state.get("last_sync") or {}
        before = previous.get("newest_step")
        self.state["last_sync"] = result
        step = result.get("newest_step")
        if result.get("ok") and step is not None and step != before:
            add_event(self.dir, "checkpoint", step=step, version=result.get("version"))
        busy = int(self.state.get("changing_syncs") or 0) + 1 if result.get("changing") else 0
        self.state["changing_syncs"] = busy
        if busy == NEVER_QUIET_SYNCS:
            self.warn(
                f"no checkpoint version uploaded in the last {busy} syncs: the checkpoint "
                "folder never stayed unchanged long enough (a log written inside it?); keep "
                "logs outside GPUFLEET_CHECKPOINT_DIR",
                "never_quiet",
            )
        torn = result.get("torn")
        if torn and (final or previous.get("torn") == torn):
            self.warn(str(result.get("detail")), "torn", file=torn)
        if result.get("regressed"):
            self.warn(
                f"version {result.get('version')} regressed: {result.get('note')}",
                "regressed",
                version=result.get("version"),
                step=step,
            )

    def periodic_sync(self, interval: float) -> float:
        """A push while the job runs: at its interval, or at once when the watchdog asked
        (SYNC_NOW_FILE, taken before the push, so one written during it is seen after).
        Returns when the next one is due."""
        asked = self.take_sync_request()
        budget = SYNC_BUDGET_S
        if asked is not None:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                budget = min(SYNC_BUDGET_S, max(1.0, float(asked["budget_s"])))
            why = str(asked.get("why") or "no reason given")
            self.log(f"pushing the checkpoint folder now, as the watchdog asked: {why}")
            add_event(self.dir, "sync_now", why=why, budget_s=budget)
        self.scan_output()
        self.record_sync(self.sync(budget))
        return time.monotonic() + interval

    def take_sync_request(self) -> dict[str, Any] | None:
        """The watchdog's request in SYNC_NOW_FILE, removed; None when there is none (an
        unreadable one is still a request)."""
        path = self.dir / SYNC_NOW_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError:
            text = ""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        return doc if isinstance(doc, dict) else {}

    def warn(self, line: str, event: str, **detail: Any) -> None:
        """A one-line warning in the state (once) and an event."""
        warnings = list(self.state.get("warnings") or [])
        if line in warnings:
            return
        self.state["warnings"] = [*warnings, line]
        add_event(self.dir, "warning", kind=event, message=line, **detail)
        self.log(f"warning: {line}")

    def restore(self, version: int | None = None, *, local: bool = False) -> dict[str, Any]:
        """The newest version (``version``: that one; ``local``: none, the head found
        none) into this node's checkpoint folder (every node: each rank loads its
        checkpoint from its own disk); the result also goes to restore.json with the
        attempt, where a supervisor of the same attempt finds it."""
        root = Path(self.spec["checkpoint_dir"])
        attempt = int(self.spec.get("attempt") or 1)
        try:
            store = None if local else self.store()
        except (ValueError, job_sync.bucket.StoreError) as exc:
            out = job_sync.RestoreOutcome(False, str(exc), "error").to_json()
        else:
            if store is None:
                root.mkdir(parents=True, exist_ok=True)
                n = len(job_sync.local_listing(root))
                detail = f"no bucket: the node's own checkpoint folder is reused ({n} file(s))"
                out = job_sync.RestoreOutcome(True, detail, files=n).to_json()
            else:
                node = str(self.spec.get("sync_node") or "") if self.node_rank == 0 else ""
                out = job_sync.restore(
                    root,
                    store,
                    str(self.spec.get("bucket_prefix") or ""),
                    float(self.spec.get("restore_deadline_s") or 6 * 3600),
                    node=node,
                    version=version,
                ).to_json()
        if not out["ok"]:
            out["error"] = job_sync.error_line(str(out["cause"] or "error"), str(out["detail"]))
        write_json(self.dir / "restore.json", {**out, "attempt": attempt, "at": utcnow()})
        return out

    def prepare(self, head: Mapping[str, Any] | None = None) -> list[str] | None:
        """Before torchrun: a resume's restore (this attempt's restore.json when a
        ``restore`` command already did it, else here), then the script's arguments with
        their placeholders expanded and, after a restore that put something in the folder,
        the resume arguments. None: the attempt failed (state and error already set).
        ``head``: the head's attempt record (a worker of a multi-node run): exactly the
        version the head restored, or none when the head restored none."""
        root = Path(self.spec["checkpoint_dir"])
        put_something = False
        if head is not None:
            self.spec["resume"] = bool(head.get("restored"))
        if self.spec.get("resume"):
            attempt = int(self.spec.get("attempt") or 1)
            saved = read_json(self.dir / "restore.json") or {}
            want = (head or {}).get("version", saved.get("version"))
            if saved.get("attempt") == attempt and saved.get("ok") and saved.get("version") == want:
                out = {k: v for k, v in saved.items() if k not in ("attempt", "at")}
                self.log("restore: done by the restore command for this attempt")
            elif head is not None:
                out = self.restore(head.get("version"), local=head.get("version") is None)
            else:
                out = self.restore()
            self.state["restore"] = out
            self.log(f"restore: {out.get('detail')}")
            if not out.get("ok"):
                self.fail(str(out.get("error") or out.get("detail")), "restore")
                return None
            if out.get("version") is not None:
                self.state["resumed_from"] = {"version": out["version"], "step": out.get("step")}
            put_something = int(out.get("files") or 0) > 0
            add_event(self.dir, "restore", version=out.get("version"), step=out.get("step"))
        values = {
            "checkpoint_dir": str(root),
            "job": str(self.spec["job"]),
            "attempt": str(self.spec.get("attempt") or 1),
            "node_rank": str(self.node_rank),
            "scratch": str(root.parent.parent),
        }
        args = [str(a) for a in self.spec.get("args") or []]
        if put_something:
            args += [str(a) for a in self.spec.get("resume_args") or []]
        self.state["resume_args_used"] = put_something and bool(self.spec.get("resume_args"))
        try:
            return job_sync.expand_args(args, values, root)
        except job_sync.PlaceholderError as exc:
            self.fail(str(exc), "args")
            return None

    def fail(self, error: str, why: str) -> None:
        """The attempt ends before torchrun starts: failed, with a one-line error."""
        self.state.update(state="failed", error=error, ended_at=utcnow(), exit_code=None)
        add_event(self.dir, "end", state="failed", reason=why, error=error)
        self.save()
        self.log(f"failed before torchrun: {error}")

    def scan_output(self) -> None:
        """A resumed attempt whose ranks say they started from scratch gets a warning (the
        script ignored the restored checkpoint: most need a resume flag)."""
        if not (self.state.get("restore") or {}).get("files"):
            return
        start = self.state.get("log_offsets") or {}
        for r in ranks_of(None, self.spec, self.node_rank):
            path = self.job_dir / "logs" / f"rank-{r}.log"
            at = self.scan_offsets.get(str(r), int(start.get(str(r)) or 0))
            try:
                with open(path, "rb") as f:
                    f.seek(max(at, _size(path) - 1024 * 1024))
                    data = f.read(1024 * 1024)
                    self.scan_offsets[str(r)] = f.tell()
            except OSError:
                continue
            line = job_sync.started_from_scratch(data.decode(errors="replace"))
            if line:
                self.warn(
                    f"rank {r} started from scratch after a restore ({line!r}): give the "
                    "script its resume flag (--resume-args)",
                    "from_scratch",
                    rank=r,
                )

    def log(self, message: str) -> None:
        print(f"{utcnow()} {message}", flush=True)

    def _on_term(self, signum: int, frame: object) -> None:
        del frame
        if not self.cancel_requested:
            add_event(self.dir, "cancel", signal=signum)
        self.cancel_requested = True
        self.log(f"signal {signum}: stopping the ranks")
        self._signal_group(signal.SIGTERM)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:
            kill_node(self.dir, self.proc.pid if self.proc.poll() is None else 0, sig)

    def run(self) -> int:
        """The job on this node: attempts until one ends the run (job_policy.after_attempt:
        success, a cancel, the budget, a crash or hang with no restart left); between
        them a push, a backoff, and a restore of the newest version with the resume
        arguments. On a worker of a multi-node run: :meth:`run_worker`."""
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        (self.dir / "supervisor.pid").write_text(f"{os.getpid()}\n")
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "cancel").unlink()
        self.save()
        Path(self.spec["checkpoint_dir"]).mkdir(parents=True, exist_ok=True)
        (self.job_dir / "logs").mkdir(parents=True, exist_ok=True)
        policy = job_policy.Policy.from_spec(self.spec)
        if int(self.spec.get("nnodes") or 1) > 1:
            with contextlib.suppress(ValueError, job_sync.bucket.StoreError):
                self.group = self.store()
        if self.group is not None and self.node_rank != 0:
            return self.run_worker()
        if self.group is not None:
            # Attempt numbers only go up: a head that comes back (or a resume that counted
            # from an older state) continues after the newest record in the bucket.
            newest = job_group.newest_attempt(self.group, self.prefix()) or {}
            self.spec["attempt"] = max(self.attempt_no(), int(newest.get("attempt") or 0) + 1)
            self.state["attempt"] = self.spec["attempt"]
        self.notifier = self.make_notifier()
        restarts = int(self.state.get("restarts") or 0)
        waiting_since: float | None = None
        while True:
            args = self.prepare()
            if args is not None and self.group is not None and not self.announce():
                self.fail("could not write the attempt record to the bucket", "bucket")
                args = None
            if args is None:
                self.notify("run_end", f"failed before torchrun: {self.state.get('error')}")
                self.end_group("failed", "restore")
                self.close_notifier()
                return 1
            began = time.monotonic()
            rc, why = self.attempt(args, policy)
            self.state.update(exit_code=rc, ended_at=utcnow())
            why = self.group_why(rc, why)
            final = self.end_attempt(rc, why, time.monotonic() - began)
            if why in job_policy.NODE_GONE:
                waiting_since = waiting_since or time.monotonic()
            elif self.ranks_started:
                waiting_since = None
            decision = job_policy.after_attempt(
                policy,
                why=why,
                rc=rc,
                restarts_done=restarts,
                spent=self.spent(policy),
                waited_s=time.monotonic() - (waiting_since or time.monotonic()),
                wait_limit_s=float(self.spec.get("node_wait_s") or job_group.NODE_WAIT_S),
            )
            if decision.action == "restart" and rank_pids(self.dir):
                # Never two copies of one rank: a rank that outlived SIGKILL ends the run.
                stuck = f"rank(s) {rank_pids(self.dir)} of attempt {self.attempt_no()} still run"
                decision = job_policy.Decision("end", "failed", "stuck", detail=stuck)
            if decision.action != "restart":
                break
            restarts += 1 if decision.counts else 0
            if not self.wait_to_restart(decision, restarts, policy):
                decision = job_policy.Decision("end", "cancelled", "cancelled")
                if policy.over_budget(self.spent(policy)):
                    decision = job_policy.Decision("end", "cancelled", "budget")
                break
            self.next_attempt()
        return self.finish(decision, rc, final, policy)

    def finish(
        self,
        decision: job_policy.Decision,
        rc: int | None,
        final: Mapping[str, Any] | None,
        policy: job_policy.Policy,
    ) -> int:
        """The run's end: the state, the event, the others told (multi-node), the message."""
        self.state.update(state=decision.state, end_reason=decision.reason)
        if decision.reason == "budget":
            self.state.setdefault("budget", self.budget_line(policy))
        add_event(
            self.dir,
            "end",
            state=decision.state,
            reason=decision.reason,
            exit_code=rc,
            detail=decision.detail,
        )
        self.state.pop("syncing", None)
        self.state.pop("waiting_for", None)
        self.save()
        self.end_group(decision.state, decision.reason)
        self.log(f"done: {self.state['state']} ({decision.reason}, exit {rc}); final sync: {final}")
        self.notify("run_end", self.end_said(decision, final), policy)
        self.close_notifier()
        return 0

    def end_group(self, state: str, reason: str) -> None:
        """The head tells the other nodes the run ended (they stop and end alike)."""
        if self.group is None or self.node_rank != 0:
            return
        doc = {"attempt": self.attempt_no(), "state": state, "reason": reason, "at": utcnow()}
        for pause in (0.0, 2.0, 5.0):
            time.sleep(pause)
            if job_group.write_run_end(self.group, self.prefix(), doc):
                return
        self.log("could not write the run's end to the bucket: the other nodes wait it out")

    def run_worker(self) -> int:
        """A worker of a multi-node run: each attempt is the head's (job_group.py): wait
        for its record, restore exactly its version, run torchrun for it, say how it
        ended; until the head's run-end record, a cancel, or no news for worker_wait_s.
        The head alone decides hangs, the budget and restarts."""
        assert self.group is not None
        policy = job_policy.Policy()
        want = since = self.attempt_no()
        if self.rejoined:
            newest = job_group.newest_attempt(self.group, self.prefix()) or {}
            want = max(self.rejoin_after + 1, int(newest.get("attempt") or 0), 1)
            since = max(1, self.rejoin_after)
        while True:
            head, end = self.wait_for_head(want, since)
            if head is None:
                return self.worker_end(end)
            self.spec["attempt"] = int(head["attempt"])
            self.state["attempt"] = self.spec["attempt"]
            for key in ("restore", "resumed_from", "hang", "exit_code", "waiting_for_head"):
                self.state.pop(key, None)
            args = self.prepare(head)
            if args is None:
                self.report(None, state="ended", rc=None, why="restore")
                return 1
            began = time.monotonic()
            rc, why = self.attempt(args, policy)
            self.state.update(exit_code=rc, ended_at=utcnow())
            self.end_attempt(rc, why, time.monotonic() - began)
            failure = self.own_failure() if rc else {}
            self.report(None, state="ended", rc=rc, why=why, **failure)
            if why == "cancel":
                return self.worker_end({"state": "cancelled", "reason": "cancelled"})
            if rank_pids(self.dir):  # never two copies of one rank
                stuck = f"rank(s) {rank_pids(self.dir)} of attempt {self.attempt_no()} still run"
                return self.worker_end({"state": "failed", "reason": "stuck", "detail": stuck})
            since = self.attempt_no()
            want = since + 1
            self.spec["resume"] = True

    def mark_log_start(self) -> None:
        """Where this attempt's lines start in the ranks' logs, appended across attempts: a
        follow of a resume shows this attempt, not the earlier ones again. Set before the
        state first says running (a worker says so while it waits for the head's record,
        and fab's follow reads the offsets as soon as it does)."""
        self.state["log_offsets"] = {
            str(r): _size(self.job_dir / "logs" / f"rank-{r}.log")
            for r in ranks_of(None, self.spec, self.node_rank)
        }

    def wait_for_head(self, want: int, since: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the head's attempt ``want`` or newer, {}) or (None, how the run ended: the
        head's run-end record of attempt ``since`` or later, a cancel, no news)."""
        assert self.group is not None
        limit = float(self.spec.get("worker_wait_s") or job_group.WORKER_WAIT_S)
        until = time.monotonic() + limit
        self.mark_log_start()
        self.state.update(state="running", waiting_for_head=want)
        self.save()
        while time.monotonic() < until:
            if self.cancel_requested or (self.dir / "cancel").exists():
                return None, {"state": "cancelled", "reason": "cancelled"}
            end = job_group.run_end(self.group, self.prefix(), since)
            if end is not None:
                return None, end
            newest = job_group.newest_attempt(self.group, self.prefix())
            if newest is not None and int(newest.get("attempt") or 0) >= want:
                return newest, {}
            time.sleep(self.group_poll_s())
            self.save()
        detail = f"node 0 wrote no attempt {want} within {limit:g} s"
        return None, {"state": "failed", "reason": "head", "detail": detail}

    def worker_end(self, end: Mapping[str, Any]) -> int:
        """A worker's end: the run's, as the head recorded it (or a cancel, or no news)."""
        state, reason = str(end.get("state") or "failed"), str(end.get("reason") or "?")
        self.state.pop("waiting_for_head", None)
        self.state.update(state=state, end_reason=reason, ended_at=utcnow())
        add_event(self.dir, "end", state=state, reason=reason, detail=end.get("detail") or "")
        self.save()
        self.log(f"done: {state} ({reason}) as node 0 ended the run")
        return 0

    def attempt(self, args: list[str], policy: job_policy.Policy) -> tuple[int, str]:
        """One torchrun, watched until it exits: (its exit status, why it ended: exit,
        cancel, hang or budget)."""
        env = modules.env_with({**os.environ, **rank_env(self.spec, self.node_rank)})
        env.update(job_policy.nccl_env(env, policy.hang_after_s))
        venv_bin = str(Path(self.spec["python"]).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        rdzv = job_group.rdzv_id(str(self.spec["job"]), self.attempt_no()) if self.group else ""
        argv = torchrun_argv(self.spec, self.node_rank, self.job_dir, args, rdzv)
        self.ranks_started, self.worker_progress = False, None
        self.group_checked, self.checkpoints = time.monotonic(), []
        if self.node_rank != 0:
            self.report(None)  # this node came: the head no longer waits for it
        self.mark_log_start()
        self.torchrun_offset = _size(self.dir / "torchrun.log")
        self.log("start: " + " ".join(argv))
        attempt = int(self.spec.get("attempt") or 1)
        add_event(self.dir, "resume" if self.spec.get("resume") else "start", attempt=attempt)
        with open(self.dir / "torchrun.log", "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=str(self.spec["workdir"]),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: cancel signals every rank at once
            )
        self.state.update(
            state="running",
            torchrun_pid=self.proc.pid,
            pgid=self.proc.pid,
            exit_code=None,
            ended_at=None,
        )
        self.save()
        return self.watch(policy)

    def watch(self, policy: job_policy.Policy) -> tuple[int, str]:
        """Wait for torchrun, pushing at the sync interval, acting on a cancel, stopping
        the ranks when no progress came for ``hang_after_s`` or the budget is spent."""
        assert self.proc is not None
        interval = max(0.5, float(self.spec.get("sync_interval_s") or 60.0))
        grace = float(self.spec.get("cancel_grace_s") or 30.0)
        poll = min(interval, 5.0)
        if policy.hang_after_s:
            poll = min(poll, max(0.2, policy.hang_after_s / 10))
        if self.group is not None:
            poll = min(poll, self.group_poll_s())
        next_sync = time.monotonic() + interval
        progress = Progress(self)
        term_at: float | None = None
        while True:
            try:
                return self.proc.wait(timeout=poll), "cancel" if self.cancel_requested else "exit"
            except subprocess.TimeoutExpired:
                pass
            if (self.dir / "cancel").exists() and not self.cancel_requested:
                self._on_term(signal.SIGTERM, None)
            if self.cancel_requested:
                term_at = term_at or time.monotonic()
                if time.monotonic() - term_at > grace:
                    self.log(f"ranks still running {grace:g} s after SIGTERM: SIGKILL")
                    self._signal_group(signal.SIGKILL)
            if time.monotonic() >= next_sync or (self.dir / SYNC_NOW_FILE).exists():
                next_sync = self.periodic_sync(interval)
            progress.look()
            stop = self.group_tick(progress)
            if stop and not self.cancel_requested:
                return self.stop_ranks(grace), stop
            hung = policy.hang_after_s and progress.silent_s() >= policy.hang_after_s
            if hung and not self.cancel_requested:
                self.record_hang(progress)
                return self.stop_ranks(grace), "hang"
            if policy.over_budget(self.spent(policy)) and not self.cancel_requested:
                self.state["budget"] = self.budget_line(policy)  # as it was when reached
                self.log(f"budget reached: {self.state['budget']}; stopping the ranks")
                add_event(self.dir, "budget", spent=self.spent(policy), max_cost=policy.max_cost)
                return self.stop_ranks(grace), "budget"
            self.save()

    def stop_ranks(self, grace: float) -> int:
        """SIGTERM to torchrun and every rank, SIGKILL after ``grace``; torchrun's status."""
        assert self.proc is not None
        self._signal_group(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.log(f"ranks still running {grace:g} s after SIGTERM: SIGKILL")
            self._signal_group(signal.SIGKILL)
            return self.proc.wait(timeout=60)

    def end_attempt(self, rc: int, why: str, seconds: float) -> dict[str, Any] | None:
        """After torchrun: no rank left (never two copies of one), the checkpoint pushed,
        the attempt in the record (why it ended, its steps and time)."""
        self._signal_group(signal.SIGKILL)  # a rank that ignored torchrun's SIGTERM goes too
        deadline = time.monotonic() + 30
        while rank_pids(self.dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.state["syncing"] = True
        self.scan_output()
        self.save()
        final = self.sync(final=True)
        self.state["final_sync"] = final
        self.record_sync(final, final=True)
        rec: dict[str, Any] = {
            "attempt": int(self.spec.get("attempt") or 1),
            "reason": why if why != "exit" else ("succeeded" if rc == 0 else "crash"),
            "node": self.node_rank if self.group is not None else None,
            "torchrun_exit": rc,
            "seconds": round(seconds, 1),
            "ended_at": utcnow(),
            "resumed_from": self.state.get("resumed_from"),
            "newest_step": (self.state.get("last_sync") or {}).get("newest_step"),
            "version": (self.state.get("last_sync") or {}).get("version"),
        }
        if rec["reason"] == "crash" and not self.group_cause.get("node"):
            rec.update(job_policy.failure_of(self.torchrun_output()))
        rec.update(self.group_cause)
        if why == "hang":
            rec.update(self.state.get("hang") or {})
        if self.node_rank == 0 and rec["reason"] != "succeeded":
            rec.update(self.time_lost(seconds, rec))
        self.state["attempts"] = [*(self.state.get("attempts") or []), rec]
        add_event(self.dir, "attempt_end", **rec)
        self.log(job_policy.attempt_line(rec))
        return final

    def own_failure(self) -> dict[str, Any]:
        """The rank torchrun names as this attempt's root cause, and whether its last
        lines say it only lost a peer."""
        out = job_policy.failure_of(self.torchrun_output())
        if out.get("rank") is not None:
            log = self.job_dir / "logs" / f"rank-{out['rank']}.log"
            out["peer_lost"] = job_policy.peer_lost(tail_lines(log, 20))
        return out

    def time_lost(self, seconds: float, rec: Mapping[str, Any]) -> dict[str, Any]:
        """What an attempt that did not succeed lost: the time since its newest checkpoint
        file was written (since its start when it wrote none), and the steps trained in it
        at the attempt's own pace (newest step over the time it took), a hang's silence
        left out."""
        now = time.time()
        began = now - seconds
        try:
            files = job_sync.local_files(Path(self.spec["checkpoint_dir"]))
        except OSError:
            files = {}
        newest = max((f.mtime_ns / 1e9 for f in files.values()), default=0.0)
        saved_at = newest if newest > began else began
        out: dict[str, Any] = {"lost_s": round(max(0.0, now - saved_at), 1)}
        start = (rec.get("resumed_from") or {}).get("step") or 0
        step = rec.get("newest_step")
        if isinstance(step, int) and step > start and newest > began + 1:
            pace = (step - start) / (newest - began)
            training = max(0.0, now - saved_at - float(rec.get("silent_s") or 0.0))
            out["lost_steps"] = round(pace * training)
        return out

    def torchrun_output(self) -> str:
        """What torchrun wrote during this attempt (its summary names the failed rank)."""
        try:
            path = self.dir / "torchrun.log"
            with open(path, "rb") as f:
                f.seek(max(self.torchrun_offset, _size(path) - 65536))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_to_restart(
        self, decision: job_policy.Decision, restarts: int, policy: job_policy.Policy
    ) -> bool:
        """The backoff before restart number ``restarts``; False when a cancel or the
        budget ended it."""
        left = policy.max_restarts - restarts
        said = f"{decision.reason}, restart {restarts} of {policy.max_restarts}"
        if not decision.counts:
            gone = self.group_cause.get("waiting_for") or [self.group_cause.get("node")]
            said = f"{decision.reason} (node {', '.join(str(r) for r in gone)}), no restart used"
        said += f" in {decision.wait_s:g} s"
        self.log(said)
        add_event(
            self.dir,
            "restart",
            attempt=int(self.spec.get("attempt") or 1) + 1,
            after=decision.reason,
            wait_s=decision.wait_s,
            restarts_left=left,
        )
        if decision.reason != "waiting":
            self.notify("attempt_end", said, policy)
            self.said_waiting = False
        elif not self.said_waiting:  # once per wait: the rendezvous times out again and again
            gone = ", ".join(str(r) for r in self.group_cause.get("waiting_for") or [])
            self.notify("waiting", f"waiting for node {gone} to come back (capacity)", policy)
            self.said_waiting = True
        self.state.update(state="running", restarting_at=utcnow(), restarts=restarts)
        self.state.pop("syncing", None)
        self.save()
        until = time.monotonic() + decision.wait_s
        while time.monotonic() < until:
            if (self.dir / "cancel").exists() or self.cancel_requested:
                return False
            if policy.over_budget(self.spent(policy)):
                return False
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))
            self.save()
        return not self.cancel_requested

    def next_attempt(self) -> None:
        """The next attempt restores (prepare): a new attempt number, this one's fields
        cleared."""
        self.spec["attempt"] = int(self.spec.get("attempt") or 1) + 1
        self.spec["resume"] = True
        self.state["attempt"] = self.spec["attempt"]
        for key in ("restore", "resumed_from", "hang", "restarting_at", "exit_code"):
            self.state.pop(key, None)
        self.state["waiting_for"] = []
        self.scan_offsets = {}

    def spent(self, policy: job_policy.Policy) -> float | None:
        """The run's spend so far: every node-hour of every attempt (earlier supervisors'
        too: runtime_s_before)."""
        seconds = float(self.state.get("runtime_s_before") or 0.0) + time.monotonic() - self.t0
        return job_policy.spend(policy.price_per_node_hour, int(self.spec["nnodes"]), seconds)

    def budget_line(self, policy: job_policy.Policy) -> str:
        spent = self.spent(policy) or 0.0
        return f"spent {spent:.4f} of {policy.max_cost:g} {policy.currency}".rstrip()

    def make_notifier(self) -> job_notify.Notifier | None:
        """The job's webhook on the head node (one message per event for the whole run);
        a URL it cannot use is an event and a log line, never a failed job."""
        url = str(self.spec.get("notify_url") or "")
        if self.node_rank != 0 or not url:
            return None
        problem = job_notify.check_url(url)
        if problem:
            add_event(self.dir, "notify", ok=False, host=job_notify.host_of(url), error=problem)
            self.log(f"notify: not used: {problem}")
            return None
        return job_notify.Notifier(
            url,
            record=lambda event, **detail: add_event(self.dir, event, **detail),
            log=self.log,
            tries=int(self.spec.get("notify_tries") or job_notify.TRIES),
            timeout=float(self.spec.get("notify_timeout_s") or job_notify.TIMEOUT_S),
        )

    def notify(self, kind: str, what: str, policy: job_policy.Policy | None = None) -> None:
        """One message (queued: the job never waits for it) with the last attempt's line
        and the spend so far."""
        if self.notifier is None:
            return
        attempts = [a for a in self.state.get("attempts") or [] if isinstance(a, dict)]
        last = attempts[-1] if attempts else {}
        self.notifier.send(
            kind,
            job=str(self.spec["job"]),
            name=str(self.spec.get("name") or ""),
            what=what,
            state=self.state.get("state"),
            reason=self.state.get("end_reason") or last.get("reason"),
            attempt=int(self.spec.get("attempt") or 1),
            attempt_line=job_policy.attempt_line(last) if last else "",
            newest_step=last.get("newest_step"),
            spent=self.spent(policy) if policy else None,
            max_cost=policy.max_cost if policy else None,
            currency=policy.currency if policy else "",
        )

    def end_said(self, decision: job_policy.Decision, final: Mapping[str, Any] | None) -> str:
        """What the run's end message says happened, and why."""
        if decision.reason == "budget":
            pushed = "checkpoint pushed" if (final or {}).get("ok") else "checkpoint NOT pushed"
            return f"budget reached: ranks stopped, {pushed}"
        if decision.state == "succeeded":
            n = len(self.state.get("attempts") or []) or 1
            return f"succeeded after {n} attempt(s)"
        if decision.state == "failed":
            return f"failed: {decision.reason}" + (
                f" ({decision.detail})" if decision.detail else ""
            )
        return decision.state

    def close_notifier(self) -> None:
        if self.notifier is not None:
            self.notifier.close()

    # ------------------------------------------------------------ multi-node (job_group.py)

    def group_poll_s(self) -> float:
        return max(0.2, float(self.spec.get("group_poll_s") or 5.0))

    def prefix(self) -> str:
        return str(self.spec.get("bucket_prefix") or "")

    def attempt_no(self) -> int:
        return int(self.spec.get("attempt") or 1)

    def group_tick(self, progress: Progress) -> str:
        """Every group_poll_s while torchrun runs: the head reads the others' records (a
        node whose attempt failed stops it here too: "node"; their progress counts
        against a hang); a worker reports its progress, and stops its ranks once the head
        wrote a newer attempt or the run's end ("superseded")."""
        if self.group is None or time.monotonic() - self.group_checked < self.group_poll_s():
            return ""
        self.group_checked = time.monotonic()
        n = self.attempt_no()
        if self.node_rank == 0:
            records = job_group.node_records(self.group, self.prefix(), n)
            self.worker_progress = job_group.newest_progress(records)
            missing = job_group.missing_nodes(int(self.spec["nnodes"]), records)
            self.state["waiting_for"] = [] if self.ranks_started else missing
            failed = job_group.failed_node(records)
            if failed is None:
                return ""
            self.group_cause = node_cause(failed)
            self.log(f"node {failed.get('node_rank')}'s attempt {n} failed: stopping the ranks")
            return "node"
        self.report(progress)
        newer = job_group.read_attempt(self.group, self.prefix(), n + 1)
        if newer is not None or job_group.run_end(self.group, self.prefix(), n):
            self.log("the head moved on: stopping this node's ranks")
            return "superseded"
        return ""

    def report(self, progress: Progress | None, **extra: Any) -> None:
        """This worker's record of the current attempt: running with its last progress, or
        ``extra`` (its end)."""
        if self.group is None:
            return
        doc: dict[str, Any] = {"state": "running", "boot_id": boot_id(), "at": utcnow()}
        if progress is not None:
            doc["progress_t"] = round(progress.last_epoch(), 3)
        doc.update(extra)
        job_group.write_node(self.group, self.prefix(), self.attempt_no(), self.node_rank, doc)

    def announce(self) -> bool:
        """The head's attempt record, after its restore and before its torchrun: what
        every other node restores and joins (3 tries)."""
        assert self.group is not None
        last = (self.state.get("attempts") or [{}])[-1] if self.state.get("attempts") else {}
        doc = {
            "attempt": self.attempt_no(),
            "rdzv_id": job_group.rdzv_id(str(self.spec["job"]), self.attempt_no()),
            "restored": bool(self.spec.get("resume")),
            "version": (self.state.get("resumed_from") or {}).get("version"),
            "step": (self.state.get("resumed_from") or {}).get("step"),
            "after": last.get("reason"),
            "at": utcnow(),
        }
        for pause in (0.0, 2.0, 5.0):
            time.sleep(pause)
            if job_group.write_attempt(self.group, self.prefix(), doc):
                self.state["group_attempt"] = doc  # what the other nodes join
                return True
        return False

    def group_why(self, rc: int, why: str) -> str:
        """Why a multi-node attempt ended, read by the head once its torchrun is done: no
        rank started and a node never came (``waiting``), a node whose attempt failed
        first (``crash`` on that node), a node that never said its attempt ended
        (``reclaimed``), else this node's own ``why``."""
        self.group_cause = self.group_cause if why == "node" else {}
        if why == "node":
            return "crash"
        if self.group is None or self.node_rank != 0 or why != "exit" or rc == 0:
            return why
        nnodes, n = int(self.spec["nnodes"]), self.attempt_no()
        records = job_group.node_records(self.group, self.prefix(), n)
        if not self.ranks_started and job_group.missing_nodes(nnodes, records):
            self.group_cause = {"waiting_for": job_group.missing_nodes(nnodes, records)}
            return "waiting"
        until = time.monotonic() + float(self.spec.get("end_records_s") or job_group.END_RECORDS_S)
        while time.monotonic() < until:
            ended = [r for r in range(1, nnodes) if records.get(r, {}).get("state") == "ended"]
            if len(ended) == nnodes - 1:
                break
            time.sleep(min(1.0, self.group_poll_s()))
            records = job_group.node_records(self.group, self.prefix(), n)
        failed = job_group.failed_node(records)
        own = self.own_failure()
        if failed is not None and first_failure(node_cause(failed), own):
            self.group_cause = node_cause(failed)
            return "crash"
        lost = [r for r in range(1, nnodes) if records.get(r, {}).get("state") != "ended"]
        if lost:
            self.group_cause = {"node": lost[0], "lost": lost}
            return "reclaimed"
        self.group_cause = {"node": 0}
        return why

    def record_hang(self, progress: Progress) -> None:
        """The hang in the state and the events: when the last progress came and the last
        lines of each of this node's ranks."""
        hang = {
            "last_progress_at": progress.last_at,
            "silent_s": round(progress.silent_s(), 1),
            "tails": progress.tails(),
        }
        self.state["hang"] = hang
        add_event(self.dir, "hang", **hang)
        self.log(f"no progress for {hang['silent_s']} s (last at {progress.last_at}): stopping")


def node_cause(record: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's failed end record as an attempt's cause: its node, rank and exit."""
    out = {"node": int(record.get("node_rank") or 0)}
    for key in ("rank", "exit_code", "signal", "failed_at", "peer_lost"):
        if record.get(key) is not None:
            out[key] = record[key]
    return out


def first_failure(theirs: Mapping[str, Any], own: Mapping[str, Any]) -> bool:
    """Whether a worker's failure came first, before the head's own: a failed rank that
    says it lost its peer (job_policy.peer_lost) failed second; else torchrun's summary
    times, to the second; on a tie the one that did not exit 1; then the worker's."""
    if not own:
        return True
    if bool(own.get("peer_lost")) != bool(theirs.get("peer_lost")):
        return bool(own.get("peer_lost"))
    mine, other = str(own.get("failed_at") or ""), str(theirs.get("failed_at") or "")
    if mine and other and mine != other:
        return other < mine
    return not (own.get("exit_code") != 1 and theirs.get("exit_code") == 1)


def reclaimed_record(previous: Mapping[str, Any], node_rank: int) -> dict[str, Any]:
    """The attempt a reclaim interrupted, as the run's record has it: its node stopped with
    its supervisor (no end of its own), so it ended at its last heartbeat."""
    start, end = parse_time(previous.get("started_at")), parse_time(previous.get("heartbeat_at"))
    seconds = (end - start).total_seconds() if start and end else 0.0
    last = previous.get("last_sync") or {}
    return {
        "attempt": int(previous.get("attempt") or 1),
        "reason": "reclaimed",
        "node": node_rank,
        "seconds": round(max(0.0, seconds), 1),
        "ended_at": previous.get("heartbeat_at"),
        "resumed_from": previous.get("resumed_from"),
        "newest_step": last.get("newest_step"),
        "version": last.get("version"),
    }


# On a GPU node, SM activity with power above idle is progress too (a rank inside a long
# kernel prints nothing), read with nvidia-smi's CSV query (nvidia-smi(1), --query-gpu and
# --format=csv,noheader,nounits: https://manpages.ubuntu.com/manpages/noble/man1/
# nvidia-smi.1.html). Utilization alone is not enough: a collective that spins waiting
# for a lost peer keeps it at 100 % at little power, so the draw must be at least
# GPU_BUSY_POWER of the board's power.limit (job.json gpu_busy_power).
GPU_QUERY = ("--query-gpu=utilization.gpu,power.draw,power.limit", "--format=csv,noheader,nounits")
GPU_BUSY_POWER = 0.4
GPU_LOOK_S = 10.0  # how often (job.json gpu_look_s); each query is bounded by 10 s


def gpu_active(text: str, power_frac: float = GPU_BUSY_POWER) -> bool:
    """Whether any GPU in nvidia-smi's CSV answer (utilization %, draw W, limit W) runs
    kernels at a draw of at least ``power_frac`` of its limit; [N/A] fields are no."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            util, draw, limit = (float(p) for p in parts)
        except ValueError:
            continue
        if util > 0 and limit > 0 and draw >= power_frac * limit:
            return True
    return False


def gpu_sample(timeout: float = 10.0) -> str:
    """nvidia-smi's answer to GPU_QUERY, "" where there is none (no GPU, no tool, an error)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        done = subprocess.run(
            [exe, *GPU_QUERY], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


class Progress:
    """Any new output on one of this node's rank logs, a new checkpoint version or (on a
    GPU node) SM activity above idle power is progress; ``silent_s`` is the time since the
    last."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.paths = [
            sup.job_dir / "logs" / f"rank-{r}.log" for r in ranks_of(None, sup.spec, sup.node_rank)
        ]
        self.seen = self.snapshot()
        self.last = time.monotonic()
        self.last_at = utcnow()
        spec = sup.spec
        self.gpu_every = float(spec.get("gpu_look_s") or GPU_LOOK_S)
        self.gpu_power = float(spec.get("gpu_busy_power") or GPU_BUSY_POWER)
        self.gpu_next = 0.0 if not spec.get("cpu") else float("inf")

    def snapshot(self) -> tuple[Any, ...]:
        version = (self.sup.state.get("last_sync") or {}).get("version")
        return (version, *(_size(p) for p in self.paths))

    def look(self) -> None:
        now = self.snapshot()
        sup = self.sup
        if not sup.ranks_started:
            offsets = sup.state.get("log_offsets") or {}
            start = [int(offsets.get(p.stem.rpartition("-")[2]) or 0) for p in self.paths]
            sup.ranks_started = any(n > s for n, s in zip(now[1:], start, strict=True))
            if sup.group is not None and not sup.ranks_started:
                # A multi-node attempt in its rendezvous: the join timeout governs it.
                self.seen, self.last, self.last_at = now, time.monotonic(), utcnow()
        if now != self.seen or self.gpu_busy():
            self.seen, self.last, self.last_at = now, time.monotonic(), utcnow()

    def gpu_busy(self) -> bool:
        """SM activity above idle power on this node's GPUs, looked at every gpu_look_s."""
        if time.monotonic() < self.gpu_next:
            return False
        self.gpu_next = time.monotonic() + self.gpu_every
        return gpu_active(gpu_sample(), self.gpu_power)

    def silent_s(self) -> float:
        """Since the last progress here or (the head of a multi-node run) on any node."""
        silent = time.monotonic() - self.last
        if self.sup.worker_progress is not None:
            silent = min(silent, max(0.0, time.time() - self.sup.worker_progress))
        return silent

    def last_epoch(self) -> float:
        return time.time() - (time.monotonic() - self.last)

    def tails(self) -> dict[str, list[str]]:
        out = {}
        for path in self.paths:
            rank = path.stem.rpartition("-")[2]
            out[rank] = tail_lines(path, job_policy.HANG_TAIL_LINES)
        return out


def tail_lines(path: Path, count: int, limit: int = 16384) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, _size(path) - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-count:]


# ---------------------------------------------------------------------------- detaching


def systemd_available() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemd-run") is not None


def unit_name(job: str, node_rank: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in job)
    return f"gpufleet-job-{safe}-n{node_rank}"


def systemd_argv(
    job_dir: Path, node_rank: int, job: str, *, sudo: bool, rejoin: bool = False
) -> list[str]:
    """A transient unit that outlives the SSH session and runs as the calling user."""
    argv = ["sudo", "-n"] if sudo else []
    return [
        *argv,
        "systemd-run",
        f"--unit={unit_name(job, node_rank)}",
        "--collect",
        "--quiet",
        f"--uid={os.getuid()}",
        f"--gid={os.getgid()}",
        f"--working-directory={job_dir}",
        f"--setenv=HOME={os.environ.get('HOME', '/')}",
        f"--setenv=PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
        f"--setenv=PYTHONPATH={modules.env_with(os.environ)['PYTHONPATH']}",
        "--property=KillMode=mixed",
        "--property=TimeoutStopSec=120",
        *modules.argv(
            sys.executable,
            "job_runner",
            "supervise",
            f"--job-dir={job_dir}",
            f"--node-rank={node_rank}",
            *(["--rejoin"] if rejoin else []),
        ),
    ]


def double_fork(job_dir: Path, node_rank: int, rejoin: bool = False) -> None:
    """The supervisor in a new session with no terminal, reparented to init: a dropped SSH
    connection (SIGHUP to the session) never reaches it."""
    out = node_dir(job_dir, node_rank) / "supervisor.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = modules.argv(
        sys.executable,
        "job_runner",
        "supervise",
        f"--job-dir={job_dir}",
        f"--node-rank={node_rank}",
        *(["--rejoin"] if rejoin else []),
    )
    env = modules.env_with(os.environ)
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the middle child exits at once
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        log = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(job_dir)
        os.execve(sys.executable, argv, env)
    except BaseException:
        os._exit(127)


def start(
    job_dir: Path, node_rank: int, detach: str, wait_s: float = 30.0, rejoin: bool = False
) -> dict[str, Any]:
    """A detached supervisor for node ``node_rank`` (``rejoin``: a node that comes back,
    job_boot.py); a job with reclaim recovery also gets the boot unit that does that."""
    spec = read_json(job_dir / "job.json")
    if spec is None:
        return {"ok": False, "error": f"no readable {job_dir / 'job.json'}"}
    path = node_dir(job_dir, node_rank) / "state.json"
    current = state_now(path)
    if current and current["effective"] in ACTIVE:
        return {"ok": False, "error": f"job {spec['job']} already runs on this node"}
    mode = detach
    if mode == "auto":
        mode = "systemd" if systemd_available() and _can_sudo() else "fork"
    before = (read_json(path) or {}).get("pid")
    if mode == "systemd":
        done = subprocess.run(
            systemd_argv(
                job_dir, node_rank, str(spec["job"]), sudo=os.geteuid() != 0, rejoin=rejoin
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            return {"ok": False, "error": f"systemd-run: {done.stderr.strip()[:300]}"}
    else:
        double_fork(job_dir, node_rank, rejoin)
    # A node fab recover set up afresh needs the unit too; at boot it is there already.
    # job.json boot_unit false: never (tests, whose machine is no node).
    wanted = spec.get("reclaim_recovery") and spec.get("boot_unit", True) is not False
    boot_unit = install_boot_unit(job_dir) if wanted else None
    # Running (or already over) under a new supervisor: the restore, if any, is done.
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = state_now(path)
        if state and state.get("pid") != before and state["state"] != "starting":
            return {"ok": True, "mode": mode, "state": state, "boot_unit": boot_unit}
        time.sleep(0.1)
    tail = last_line(node_dir(job_dir, node_rank) / "supervisor.log")
    return {"ok": False, "error": f"the supervisor did not start within {wait_s:g} s: {tail}"}


def install_boot_unit(job_dir: Path) -> dict[str, Any]:
    """gpufleet-jobs-boot.service for this install (job_boot.py): this interpreter, the
    shipped package, the jobs root, this user; enabled where systemd and sudo are."""
    import pwd

    text = job_boot.render_unit(
        sys.executable, modules.ROOT, str(job_dir.parent), pwd.getpwuid(os.getuid()).pw_name
    )
    if os.geteuid() != 0 and not _can_sudo():
        return {"ok": False, "detail": "no sudo: nothing resumes this node at boot"}
    return job_boot.install_unit(text, sudo=os.geteuid() != 0)


def boot(root: Path, detach: str = "auto", wait_s: float = 60.0) -> dict[str, Any]:
    """The boot entry (job_boot.py): a rejoining supervisor for every run on this node
    that a reclaim interrupted."""
    current = boot_id()
    started = []
    for job_dir, node_rank in job_boot.to_resume(root, current, read_json):
        out = start(job_dir, node_rank, detach, wait_s, rejoin=True)
        started.append({"job_dir": str(job_dir), "node_rank": node_rank, **out})
    return {"ok": all(s.get("ok") for s in started), "boot_id": current, "resumed": started}


def _can_sudo() -> bool:
    if os.geteuid() == 0:
        return True
    if shutil.which("sudo") is None:
        return False
    done = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=20, check=False)
    return done.returncode == 0


# ---------------------------------------------------------------------------- list, cancel, logs


def list_jobs(root: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for job_dir in sorted(p for p in root.iterdir() if (p / "job.json").is_file()):
        spec = read_json(job_dir / "job.json") or {}
        for state_path in sorted(job_dir.glob("node-*/state.json")):
            state = state_now(state_path)
            if state is None:
                continue
            nproc = int(state.get("nproc_per_node") or 1)
            first = int(state.get("node_rank") or 0) * nproc
            state["last_line"] = last_line(job_dir / "logs" / f"rank-{first}.log")
            state["job_dir"] = str(job_dir)
            state["spec"] = spec
            out.append(state)
    return out


def cancel(job_dir: Path, node_rank: int, wait_s: float, endpoint: str = "") -> dict[str, Any]:
    """Stop the node's ranks and save their last checkpoint; ``endpoint`` replaces the
    job's bucket endpoint for a save done here (a running supervisor saves with its own)."""
    nd = node_dir(job_dir, node_rank)
    path = nd / "state.json"
    state = state_now(path)
    if state is None:
        return {"ok": False, "error": "no state for this node"}
    if state["effective"] in TERMINAL:
        note = f"already {state['effective']}"
        return {"ok": True, "changed": False, "state": state, "note": note}
    (nd / "cancel").write_text(utcnow() + "\n")
    if state["effective"] in ACTIVE:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(state["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            now = state_now(path)
            if now and now["effective"] in TERMINAL and not now.get("syncing"):
                return {"ok": True, "state": now}
            if now and now["effective"] == "interrupted":
                break
            time.sleep(0.2)
    # No supervisor (interrupted) or it did not finish in time: stop the ranks ourselves, save
    # the checkpoints, record the end.
    now = state_now(path) or state
    add_event(nd, "cancel", supervisor="gone")
    kill_node(nd, int(now.get("pgid") or 0), signal.SIGKILL)
    sup = Supervisor(job_dir, node_rank)
    if endpoint:
        sup.spec["s3_endpoint"] = endpoint
    final = sup.sync(final=True)
    if final and final.get("torn"):  # the supervisor would have warned: said here instead
        now["warnings"] = [*(now.get("warnings") or []), str(final["detail"])]
    now.pop("effective", None)
    now.update(state="cancelled", ended_at=now.get("ended_at") or utcnow(), final_sync=final)
    write_json(path, now)
    return {"ok": True, "state": state_now(path), "note": "supervisor gone: cancelled here"}


def restorable(job_dir: Path) -> dict[str, Any]:
    """What a resume would start from, read on the head before anything starts: the files
    in the job's checkpoint folder here and the bucket's newest version that did not
    regress (``version``: {seq, step, files, bytes}; ``bucket_step`` and ``bucket_files``
    are its step and file count)."""
    sup = Supervisor(job_dir, 0)  # the job's own environment: its bucket credentials
    root = Path(sup.spec["checkpoint_dir"])
    local = len(job_sync.local_listing(root))
    out: dict[str, Any] = {"ok": True, "local_files": local, "checkpoint_dir": str(root)}
    try:
        store = sup.store()
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    if store is None:
        return {**out, "bucket": None, "bucket_step": None, "version": None}
    where = f"{sup.spec['bucket']}/{sup.spec['bucket_prefix']}"
    try:
        version = job_sync.newest_restorable(store, str(sup.spec["bucket_prefix"] or ""))
    except job_sync.LIST_ERRORS as exc:
        return {"ok": False, "error": f"cannot list {where}: {exc}"}
    return {
        **out,
        "bucket": where,
        "version": version,
        "bucket_step": version["step"] if version else None,
        "bucket_files": version["files"] if version else 0,
    }


def restore_node(job_dir: Path, node_rank: int) -> dict[str, Any]:
    """The ``restore`` command: the newest version into node ``node_rank``'s checkpoint
    folder before ``start`` (which then reuses it); also in node-R/restore.json."""
    sup = Supervisor(job_dir, node_rank)
    out = sup.restore()
    error = out.get("error") or ""
    return {"ok": bool(out["ok"]), "restore": out, "error": error}


def put_file(job_dir: Path, file: Path) -> dict[str, Any]:
    """``file`` into the job's bucket prefix under its own name, with the job's credentials
    (its chart beside its checkpoints). No bucket: said, not an error."""
    sup = Supervisor(job_dir, 0)
    store = sup.store()
    if store is None:
        return {"ok": True, "key": None, "detail": "no bucket: the file stays on the node"}
    key = f"{str(sup.spec.get('bucket_prefix') or '').rstrip('/')}/{file.name}".lstrip("/")
    try:
        store.put(key, file.read_bytes(), time.monotonic() + 120)
    except (OSError, job_sync.bucket.StoreError) as exc:
        return {"ok": False, "error": f"could not upload {file.name}: {exc}"}
    return {"ok": True, "key": key, "bucket": sup.spec.get("bucket")}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def follow(
    job_dir: Path,
    ranks: Sequence[int],
    *,
    keep_following: bool,
    poll_s: float = 0.3,
    this_attempt_of: int | None = None,
) -> int:
    """Print the ranks' logs, each line prefixed; with ``keep_following`` until the node's
    job ends (the SSH side can drop at any time: the job does not depend on this process).
    With ``this_attempt_of`` (a node rank), from where that node's current attempt began."""
    spec = read_json(job_dir / "job.json") or {}
    offsets = {r: 0 for r in ranks}
    if this_attempt_of is not None:
        state = read_json(node_dir(job_dir, this_attempt_of) / "state.json") or {}
        start = state.get("log_offsets") or {}
        offsets = {r: int(start.get(str(r)) or 0) for r in ranks}
    partial = {r: "" for r in ranks}
    wide = len(str(max(ranks))) if ranks else 1

    def drain() -> None:
        for r in ranks:
            path = job_dir / "logs" / f"rank-{r}.log"
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[r])
                    data = f.read()
                    offsets[r] = f.tell()
            except OSError:
                continue
            text = partial[r] + data.decode(errors="replace")
            lines = text.split("\n")
            partial[r] = lines.pop()
            for line in lines:
                sys.stdout.write(f"[rank {r:>{wide}}] {line}\n")
        sys.stdout.flush()

    nodes = sorted(job_dir.glob("node-*/state.json"))
    while True:
        drain()
        if not keep_following:
            break
        states = [state_now(p) for p in nodes] or [None]
        if all(s is not None and s["effective"] not in ACTIVE for s in states):
            time.sleep(poll_s)
            drain()
            break
        time.sleep(poll_s)
    for r in ranks:
        if partial[r]:
            sys.stdout.write(f"[rank {r:>{wide}}] {partial[r]}\n")
    sys.stdout.flush()
    del spec
    return 0


SYNC_MANIFEST = ".gpufleet-sync.json"
PLAN_MEMBER = ".gpufleet-plan.json"


def unpack(workdir: Path, tar_path: Path) -> dict[str, Any]:
    """Apply one workdir update from fab: the tar's files replace theirs one by one (each a
    rename, so a job reading the folder never sees half a file), files fab synced before and
    the laptop no longer has are removed, and the new manifest is written last."""
    import tarfile

    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / f".gpufleet-unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    placed = 0
    try:
        with tarfile.open(tar_path, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                    return {"ok": False, "error": f"refusing tar member {m.name!r}"}
                members.append(m)
            for m in members:
                if m.isfile():
                    src = tar.extractfile(m)
                    assert src is not None
                    dest = tmp / m.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with open(dest, "wb") as out:
                        shutil.copyfileobj(src, out)
                    os.chmod(dest, m.mode & 0o777 or 0o644)
        plan = read_json(tmp / PLAN_MEMBER) or {}
        for dirpath, _dirs, files in os.walk(tmp):
            for name in files:
                src_path = Path(dirpath) / name
                rel = src_path.relative_to(tmp)
                if rel.as_posix() == PLAN_MEMBER:
                    continue
                dest = workdir / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src_path, dest)
                placed += 1
        removed = 0
        for rel in plan.get("delete") or []:
            target = workdir / rel
            if ".." in Path(rel).parts or rel.startswith("/"):
                continue
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                target.unlink()
                removed += 1
        write_json(workdir / SYNC_MANIFEST, {"files": plan.get("files") or {}})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            tar_path.unlink()
    return {"ok": True, "placed": placed, "removed": removed}


def ranks_of(state: Mapping[str, Any] | None, spec: Mapping[str, Any], node_rank: int) -> list[int]:
    nproc = int((state or {}).get("nproc_per_node") or spec.get("nproc_per_node") or 1)
    return list(range(node_rank * nproc, (node_rank + 1) * nproc))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gpufleet job runner (node side of fab train)")
    p.add_argument(
        "command",
        choices=[
            "start",
            "supervise",
            "list",
            "cancel",
            "follow",
            "sync",
            "unpack",
            "restorable",
            "history",
            "put",
            "restore",
            "boot",
        ],
    )
    p.add_argument("--job-dir", type=Path)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--root", type=Path)
    p.add_argument("--detach", choices=["auto", "systemd", "fork"], default="auto")
    p.add_argument("--wait", type=float, default=60.0)
    p.add_argument("--rank", type=int, action="append", help="follow: only these global ranks")
    p.add_argument("--follow", action="store_true")
    p.add_argument("--rejoin", action="store_true", help="start/supervise: a node that is back")
    p.add_argument("--this-attempt", action="store_true", help="follow: the current attempt only")
    p.add_argument("--s3-endpoint", default="", help="cancel: the bucket's endpoint")
    p.add_argument("--workdir", type=Path, help="unpack: the node's copy of the workdir")
    p.add_argument("--tar", type=Path, help="unpack: the update fab sent")
    p.add_argument("--file", type=Path, help="put: the file to upload")
    args = p.parse_args(argv)
    if args.command == "unpack":
        if args.workdir is None or args.tar is None:
            p.error("unpack needs --workdir and --tar")
        result = unpack(args.workdir, args.tar)
        print(json.dumps(result))
        return 0 if result.get("ok") else 1
    if args.command == "boot":
        if args.root is None:
            p.error("boot needs --root")
        out = boot(args.root, args.detach, args.wait)
        print(json.dumps(out))
        return 0 if out.get("ok") else 1
    if args.command == "list":
        if args.root is None:
            p.error("list needs --root")
        print(json.dumps({"jobs": list_jobs(args.root), "boot_id": boot_id(), "now": utcnow()}))
        return 0
    if args.job_dir is None:
        p.error(f"{args.command} needs --job-dir")
    job_dir: Path = args.job_dir
    if args.command == "supervise":
        return Supervisor(job_dir, args.node_rank, rejoin=args.rejoin).run()
    if args.command == "start":
        out = start(job_dir, args.node_rank, args.detach, args.wait, args.rejoin)
    elif args.command == "cancel":
        out = cancel(job_dir, args.node_rank, args.wait, args.s3_endpoint)
    elif args.command == "restorable":
        out = restorable(job_dir)
    elif args.command == "restore":
        out = restore_node(job_dir, args.node_rank)
    elif args.command == "history":
        out = history(job_dir, args.node_rank)
    elif args.command == "put":
        if args.file is None:
            p.error("put needs --file")
        out = put_file(job_dir, args.file)
    elif args.command == "sync":
        sup = Supervisor(job_dir, args.node_rank)
        out = {"ok": True, "sync": sup.sync()}
    else:
        spec = read_json(job_dir / "job.json") or {}
        state = read_json(node_dir(job_dir, args.node_rank) / "state.json")
        mine = ranks_of(state, spec, args.node_rank)
        wanted = [r for r in mine if not args.rank or r in args.rank]
        node = args.node_rank if args.this_attempt else None
        return follow(job_dir, wanted, keep_following=args.follow, this_attempt_of=node)
    print(json.dumps(out))
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
