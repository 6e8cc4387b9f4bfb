"""``fab top``: a live view of the fleet, per node and per GPU, with the job running there.

Each refresh runs ONE shell command per node over an SSH connection opened once for the
whole view (``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``, the job runner's
``list``, the watchdog's state file), all nodes at once. A node that stops answering is
shown as lost and reconnected on a later refresh; it never stops the view.

Everything shown is decided by pure functions here (parsing, the marks, both layouts,
``--json``), so the layouts are tested as golden text without a node. Two marks:

- under-fed: a job runs on the node but every GPU sits below the watchdog's idle threshold
  (``Policy.active_util_pct``, the one ``idle_rules`` judges by): paid for, not working;
- stop soon: the node's watchdog warned (a stalled job), decided to stop, or its idle clock
  is within :data:`STOP_SOON_MINUTES` of the limit (read from its state file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import re
import shlex
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from fabric import Connection
from invoke import Context
from invoke.config import Config
from invoke.exceptions import Exit

from bootstrap.fleet.api import Host, StepFailed
from bootstrap.fleet.cli import FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hostkeys import HostKeyVerifier
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import ConnectFailed, host_key_settings, open_checked
from bootstrap.fleet.system import sh, split_sections
from bootstrap.tasks.watchdog import STATE_DIR
from bootstrap.train.jobs import JobRow, fmt_duration, merge_jobs
from bootstrap.train.spec import JOBS_ROOT, rank_of
from bootstrap.train.steps import runner_command, ship_runner
from gpufleet_node.idle_rules import Policy
from infra.render import output_width

# Field names as ``nvidia-smi --help-query-gpu`` lists them. The name goes last: it is the
# only free text, so a comma in it cannot shift the numbers.
QUERY_FIELDS = (
    "index",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "name",
)
STATE_FILE = "watchdog-state.json"  # gpufleet_node/watchdog_state.py's STATE_FILE
# The idle clock this close to the node's limit is shown as "stop soon".
STOP_SOON_MINUTES = 5.0
# At this width and above, one line per GPU with the last log line; below, one per node.
WIDE_COLUMNS = 120
NARROW_COLUMNS = 80  # piped with no COLUMNS: the narrow layout at 80
COMMAND_TIMEOUT_S = 20.0
MAX_ASKING = 64  # nodes asked at once; a bigger fleet is asked in turns within a refresh
POLL_S = 0.1  # how often a refresh in flight looks for Ctrl-C
_T = TypeVar("_T")
_R = TypeVar("_R")
_STEP = re.compile(r"\bstep[\s:=#]*(\d+)", re.IGNORECASE)

# What the watchdog's state file says, in a few hundred bytes rather than its whole sample
# history; python3 is on every node (the watchdog runs on it).
_WATCHDOG_SNIPPET = (
    "import json,sys\n"
    "try: s=json.load(open(sys.argv[1]))\n"
    "except Exception: sys.exit(0)\n"
    "k=('last_decision','stall_warned','refused_since')\n"
    "print(json.dumps({x: s.get(x) for x in k}))\n"
)


# ---------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    util: float | None  # percent
    mem_used: float | None  # MiB
    mem_total: float | None  # MiB
    power: float | None  # W
    power_limit: float | None  # W
    temp: float | None  # C

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "util_pct": self.util,
            "mem_used_mib": self.mem_used,
            "mem_total_mib": self.mem_total,
            "power_w": self.power,
            "power_limit_w": self.power_limit,
            "temp_c": self.temp,
        }


def _value(text: str) -> float | None:
    """A number, or None for what nvidia-smi prints when it has none ('[N/A]', 'N/A',
    '[Not Supported]', '[Unknown Error]')."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_gpus(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`` -> GPUs.
    Lines that are not a GPU's (a driver warning, a cut-off line) are left out."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", len(QUERY_FIELDS) - 1)]
        if len(parts) != len(QUERY_FIELDS) or not parts[0].isdigit():
            continue
        util, used, total, power, limit, temp = (_value(p) for p in parts[1:7])
        gpus.append(Gpu(int(parts[0]), parts[7], util, used, total, power, limit, temp))
    return gpus


def refresh_command(jobs_dir: str, state_dir: str, runner: str | None) -> str:
    """The one command a refresh runs on a node (POSIX sh)."""
    fields = ",".join(QUERY_FIELDS)
    lines = [
        "echo ==smi",
        f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1"
        " || echo 'nvidia-smi: exit '$?",
        "echo ==watchdog",
        f"python3 -c {shlex.quote(_WATCHDOG_SNIPPET)}"
        f" {shlex.quote(state_dir.rstrip('/') + '/' + STATE_FILE)} 2>/dev/null",
        "echo ==jobs",
    ]
    if runner:
        lines.append(f"{runner_command(runner)} list --root {shlex.quote(jobs_dir)} 2>/dev/null")
    lines.append("echo ==now; date -u +%Y-%m-%dT%H:%M:%SZ")
    return "\n".join(lines) + "\n"


def _json_line(text: str) -> dict[str, Any]:
    lines = text.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------- one node


@dataclass(frozen=True)
class NodeJob:
    """The job a node runs, as ``fab jobs`` merges it across the job's nodes."""

    job: str
    name: str
    rank: int  # this node's node rank
    state: str
    runtime_s: float
    cost: float | None
    currency: str
    last_line: str
    step_rate: float | None = None  # steps per second between two refreshes, when logged

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "name": self.name,
            "node_rank": self.rank,
            "state": self.state,
            "runtime_s": round(self.runtime_s, 1),
            "cost": None if self.cost is None else round(self.cost, 4),
            "currency": self.currency or None,
            "last_line": self.last_line,
            "steps_per_s": None if self.step_rate is None else round(self.step_rate, 3),
        }


@dataclass(frozen=True)
class NodeView:
    """One node in one refresh."""

    label: str  # the node's name, else its address
    address: str
    error: str | None = None  # set: the node did not answer this refresh
    gpus: tuple[Gpu, ...] = ()
    smi_error: str | None = None  # nvidia-smi missing or failing on a reachable node
    job: NodeJob | None = None
    watchdog: Mapping[str, Any] = field(default_factory=dict)
    marks: tuple[str, ...] = ()  # what needs a person's eye, each a short phrase

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.label,
            "address": self.address,
            "reachable": self.error is None,
            "error": self.error,
            "gpus": [g.to_json() for g in self.gpus],
            "nvidia_smi_error": self.smi_error,
            "job": None if self.job is None else self.job.to_json(),
            "watchdog": dict(self.watchdog) or None,
            "marks": list(self.marks),
        }


def under_fed(gpus: Sequence[Gpu], job: NodeJob | None, policy: Policy) -> str | None:
    """Why the node is under-fed: a job runs and every GPU reads below the idle threshold."""
    if job is None or job.state != "running" or not gpus:
        return None
    utils = [g.util for g in gpus]
    if any(u is None for u in utils):
        return None  # an unreadable GPU is not called idle, as the watchdog does not
    top = max(u for u in utils if u is not None)
    if top >= policy.active_util_pct:
        return None
    return (
        f"under-fed: every GPU under {policy.active_util_pct:g} % (the idle threshold) "
        f"while {job.name} runs (busiest {top:.0f} %)"
    )


def stop_soon(watchdog: Mapping[str, Any]) -> str | None:
    """Why the node's watchdog is about to stop it, from its state file's last run."""
    last = watchdog.get("last_decision") or {}
    if not isinstance(last, Mapping):
        return None
    reason = str(last.get("reason") or "")
    if last.get("action") == "stop":
        refused = " (power-off refused: scratch not saved)" if last.get("refused") else ""
        return f"STOP: the watchdog decided to stop it: {reason}{refused}"
    if last.get("warning"):
        return f"stop soon: {last['warning']}"
    if watchdog.get("stall_warned"):
        return f"stop soon: the watchdog warned of a stalled job ({reason})"
    idle, limit = last.get("idle_minutes"), last.get("idle_limit_minutes")
    if not (isinstance(idle, int | float) and isinstance(limit, int | float)):
        return None
    if idle > 0 and limit - idle <= STOP_SOON_MINUTES:
        return (
            f"stop soon: idle {idle:.0f} of {limit:g} min, the watchdog stops it at "
            f"{limit:g} ({reason})"
        )
    return None


def running_job(
    rows: Sequence[JobRow], host: Host, records: Sequence[Mapping[str, Any]]
) -> tuple[JobRow, int] | None:
    """The newest running job among this node's records (merged across the job's nodes as
    ``fab jobs`` merges them) and this host's node rank in it: by the job's node list, as
    ``fab logs`` finds it (nodes sharing a disk list each other's records), else the
    record's own rank."""
    mine = {str(r.get("job")): int(r.get("node_rank") or 0) for r in records}
    for row in reversed(rows):
        if row.job not in mine or row.state not in ("running", "starting"):
            continue
        rank = rank_of(row.spec, host) if row.spec.get("nodes") else mine[row.job]
        if rank is not None:
            return row, rank
    return None


def node_view(
    host: Host,
    sections: Mapping[str, str],
    rows: Sequence[JobRow],
    records: Sequence[Mapping[str, Any]],
    *,
    policy: Policy,
    rates: Mapping[str, float] | None = None,
) -> NodeView:
    """One reachable node's view from its refresh output and the merged job rows."""
    smi = sections.get("smi", "")
    gpus = tuple(parse_gpus(smi))
    smi_error = None if gpus else (smi.strip().splitlines() or ["no GPU lines"])[-1][:120]
    job = None
    found = running_job(rows, host, records)
    if found is not None:
        row, rank = found
        job = NodeJob(
            row.job,
            row.name,
            rank,
            row.state,
            row.runtime_s,
            row.cost,
            row.currency,
            row.last_line,
            (rates or {}).get(row.job),
        )
    watchdog = _json_line(sections.get("watchdog", ""))
    marks = tuple(m for m in (under_fed(gpus, job, policy), stop_soon(watchdog)) if m)
    return NodeView(
        label=host.name or host.address,
        address=host.label,
        gpus=gpus,
        smi_error=smi_error,
        job=job,
        watchdog=watchdog,
        marks=marks,
    )


def logged_step(line: str) -> int | None:
    """The step number a training log line names ("step 1200 loss 2.31"), if any."""
    match = _STEP.search(line)
    return int(match.group(1)) if match else None


@dataclass
class StepClock:
    """Steps per second of each job from the step numbers its last log line shows."""

    seen: dict[str, tuple[float, int]] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)

    def update(self, rows: Iterable[JobRow], now: float) -> dict[str, float]:
        for row in rows:
            step = logged_step(row.last_line)
            if step is None:
                continue
            before = self.seen.get(row.job)
            if before is not None and now > before[0] and step >= before[1]:
                if step > before[1]:
                    self.rates[row.job] = (step - before[1]) / (now - before[0])
                else:
                    continue  # the same line again: keep the rate and its time
            self.seen[row.job] = (now, step)
        return dict(self.rates)


# ---------------------------------------------------------------------------- layouts


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _gib(used: float | None, total: float | None) -> str:
    if used is None or total is None:
        return "-"
    return f"{used / 1024:.0f}/{total / 1024:.0f}"


def _watts(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}kW" if value >= 1000 else f"{value:.0f}W"


def _temp(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}C"


def _cost(job: NodeJob | None) -> str:
    return "-" if job is None or job.cost is None else f"{job.cost:.2f}"


def _sum(values: Iterable[float | None]) -> float | None:
    known = list(values)
    if not known or any(v is None for v in known):
        return None
    return sum(v for v in known if v is not None)


def _mean(values: Iterable[float | None]) -> float | None:
    known = list(values)
    total = _sum(known)
    return None if total is None else total / len(known)


def _short_model(names: Sequence[str]) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100': what fits a narrow column."""
    if not names:
        return "-"
    words = [w for w in names[0].replace("-", " ").split() if w not in ("NVIDIA", "Tesla")]
    return words[0] if words else names[0]


def header(
    views: Sequence[NodeView], stack: str | None, at: dt.datetime, interval: float | None
) -> str:
    every = f", every {interval:g}s" if interval else ""
    when = at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    currency = _currency(views)
    cost = f", cost in {currency}" if currency else ""
    return f"fab top: {stack or 'hosts'}, {len(views)} node(s), {when}{every}{cost}"


_NARROW = "  {mark:1} {node:<10} {gpus:>7} {util:>5} {mem:>8} {power:>6} {temp:>4}  {job:<11} {rank:>2} {time:>6} {cost:>7}"  # noqa: E501
_WIDE = (
    "  {mark:1} {node:<16} {gpu:>3} {model:<22} {util:>5} {mem:>9} {power:>11} {temp:>4}  "
    "{job:<20} {rank:>4} {time:>6} {rate:>7} {cost:>9}  {line}"
)


def _currency(views: Sequence[NodeView]) -> str:
    found = {v.job.currency for v in views if v.job and v.job.currency}
    return found.pop() if len(found) == 1 else ""


def narrow_lines(views: Sequence[NodeView], width: int) -> list[str]:
    """One line per node (aggregates: mean utilisation, memory and power summed, the
    hottest GPU), then one note per mark or lost node."""
    lines = [
        _NARROW.format(
            mark="",
            node="node",
            gpus="GPUs",
            util="util",
            mem="mem GiB",
            power="power",
            temp="temp",
            job="job",
            rank="rk",
            time="time",
            cost="cost",
        )
    ]
    for v in views:
        if v.error is not None:
            lines.append(f"  ! {_fit(v.label, 10):<10} lost: " + _fit(v.error, width - 21))
            continue
        job = v.job
        lines.append(
            _NARROW.format(
                mark="!" if v.marks else "",
                node=_fit(v.label, 10),
                gpus=f"{len(v.gpus)}x{_short_model([g.name for g in v.gpus])}"[:7]
                if v.gpus
                else "no GPU",
                util=_pct(_mean(g.util for g in v.gpus)),
                mem=_gib(_sum(g.mem_used for g in v.gpus), _sum(g.mem_total for g in v.gpus)),
                power=_watts(_sum(g.power for g in v.gpus)),
                temp=_temp(max((g.temp for g in v.gpus if g.temp is not None), default=None)),
                job=_fit(job.name, 11) if job else "idle",
                rank=str(job.rank) if job else "",
                time=fmt_duration(job.runtime_s) if job else "",
                cost=_cost(job) if job else "",
            )
        )
    return [_fit(line.rstrip(), width) for line in lines] + notes(views, width)


def wide_lines(views: Sequence[NodeView], width: int) -> list[str]:
    """One line per GPU; the node's job (with its step rate and last log line) on the
    node's first line."""
    head = {
        "mark": "",
        "node": "node",
        "gpu": "gpu",
        "model": "model",
        "util": "util",
        "mem": "mem GiB",
        "power": "power/limit",
        "temp": "temp",
        "job": "job",
        "rank": "rank",
        "time": "time",
        "rate": "steps/s",
        "cost": "cost",
        "line": "last log line",
    }
    lines = [_WIDE.format(**head)]
    for v in views:
        if v.error is not None:
            lines.append(f"  ! {_fit(v.label, 16):<16} lost: " + _fit(v.error, width - 27))
            continue
        job = v.job
        first = {
            "job": _fit(job.name, 20) if job else "idle",
            "rank": str(job.rank) if job else "",
            "time": fmt_duration(job.runtime_s) if job else "",
            "rate": "" if not job else "-" if job.step_rate is None else f"{job.step_rate:.2f}",
            "cost": _cost(job) if job else "",
            "line": job.last_line if job else "",
        }
        if not v.gpus:
            row = dict.fromkeys(("gpu", "model", "util", "mem", "power", "temp"), "")
            row["model"] = _fit(v.smi_error or "no GPU", 22)
            lines.append(
                _WIDE.format(mark="!" if v.marks else "", node=_fit(v.label, 16), **row, **first)
            )
            continue
        for i, g in enumerate(v.gpus):
            power = _watts(g.power) + ("/" + _watts(g.power_limit) if g.power_limit else "")
            cells = {
                "gpu": str(g.index),
                "model": _fit(g.name, 22),
                "util": _pct(g.util),
                "mem": _gib(g.mem_used, g.mem_total),
                "power": power,
                "temp": _temp(g.temp),
            }
            rest = first if i == 0 else dict.fromkeys(first, "")
            lines.append(
                _WIDE.format(
                    mark="!" if v.marks and i == 0 else "",
                    node=_fit(v.label, 16) if i == 0 else "",
                    **cells,
                    **rest,
                )
            )
    return [_fit(line.rstrip(), width) for line in lines] + notes(views, width)


def notes(views: Sequence[NodeView], width: int) -> list[str]:
    """Each mark in full, wrapped to the width (what the "!" on a node's line means)."""
    out = []
    for v in views:
        for mark in v.marks:
            out += textwrap.wrap(
                f"{v.label}: {mark}",
                width,
                initial_indent="  ! ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
    return out


def render(
    views: Sequence[NodeView],
    *,
    width: int,
    stack: str | None,
    at: dt.datetime,
    interval: float | None,
) -> list[str]:
    """The text of one refresh at ``width`` columns."""
    top = _fit(header(views, stack, at, interval), width)
    body = wide_lines(views, width) if width >= WIDE_COLUMNS else narrow_lines(views, width)
    return [top, *body]


def refresh_json(views: Sequence[NodeView], *, stack: str | None, at: dt.datetime) -> str:
    doc = {
        "at": at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "stack": stack,
        "nodes": [v.to_json() for v in views],
    }
    return json.dumps(doc)


# ---------------------------------------------------------------------------- the session


@contextlib.contextmanager
def ctrl_c_sets(stop: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C sets ``stop`` instead of raising KeyboardInterrupt wherever
    the main thread happens to be (in a lock's wait, in a library's cleanup): the view
    ends at its next look at ``stop``, and nothing is left half-done for exit to wait
    on. A second Ctrl-C raises KeyboardInterrupt as usual. Only in the main thread, and
    only in place of Python's own handler (an embedding program's handler is kept)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def on_ctrl_c(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ask_each(
    items: Sequence[_T], ask: Callable[[_T], _R], stop: threading.Event, *, at_once: int
) -> list[_R] | None:
    """``ask(item)`` for every item, ``at_once`` at a time, in order; None as soon as
    ``stop`` is set. The askers are daemon threads and are not waited for once stopped:
    a node that hangs past its timeouts can hold up neither Ctrl-C nor the exit."""
    answers: list[_R | None] = [None] * len(items)
    todo = iter(range(len(items)))
    lock = threading.Lock()
    done = threading.Event()
    workers = max(1, min(at_once, len(items)))
    left = [workers]
    failed: list[Exception] = []

    def work() -> None:
        try:
            while not stop.is_set():
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                answers[i] = ask(items[i])
        except Exception as exc:  # raised again in the caller's thread
            failed.append(exc)
        finally:
            with lock:
                left[0] -= 1
                if not left[0]:
                    done.set()

    for k in range(workers):
        threading.Thread(target=work, name=f"fab-top-ask-{k}", daemon=True).start()
    while not done.wait(POLL_S) and not stop.is_set():
        pass
    if stop.is_set():
        return None
    if failed:
        raise failed[0]
    return cast("list[_R]", answers)  # every slot was filled


@dataclass
class _Node:
    host: Host
    conn: Connection | None = None
    runner: str | None = None  # "": it could not be installed (jobs_error says why)
    error: str | None = None
    jobs_error: str = ""


@dataclass
class TopSession:
    """The fleet's connections, opened once and reused by every refresh; a lost node is
    reconnected (within the connect timeout) on the next refresh."""

    fleet: Fleet
    config: Config | None
    jobs_dir: str
    state_dir: str
    connect_timeout_s: float
    policy: Policy = field(default_factory=Policy)
    clock: Callable[[], float] = time.monotonic
    steps: StepClock = field(default_factory=StepClock)
    nodes: list[_Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.verifier = HostKeyVerifier(host_key_settings(self.config))
        self.verifier.prepare(self.fleet.hosts)
        self.nodes = [_Node(h) for h in self.fleet.hosts]
        self._closed = False

    def _ask(self, node: _Node) -> tuple[dict[str, str] | None, list[dict[str, Any]]]:
        """The node's refresh output, or None (with ``node.error`` set) when it is lost."""
        try:
            if node.conn is None:
                conn, _ = open_checked(
                    node.host, self.config, self.connect_timeout_s, self.verifier
                )
                if self._closed:  # the view ended while this node was connecting
                    with contextlib.suppress(Exception):
                        conn.close()
                    return None, []
                node.conn = conn
            if node.runner is None and sh(node.conn, f"test -d {shlex.quote(self.jobs_dir)}").ok:
                try:
                    node.runner = ship_runner(node.conn, self.jobs_dir)
                except StepFailed as exc:  # the GPUs are still worth showing
                    node.runner, node.jobs_error = "", exc.message
            done = sh(
                node.conn,
                refresh_command(self.jobs_dir, self.state_dir, node.runner),
                timeout=COMMAND_TIMEOUT_S,
            )
            if not node.conn.is_connected or done.exited == -1:
                # paramiko's "no exit status": the session ended under the command
                raise ConnectionResetError("the SSH session ended during the refresh")
        except ConnectFailed as exc:
            node.error = exc.message
            return None, []
        except Exception as exc:  # a dropped connection, a timeout: lost until it answers
            node.error = f"no answer ({exc.__class__.__name__}: {str(exc)[:80]}); retrying"
            self._drop(node)
            return None, []
        node.error = None
        sections = split_sections(str(done.stdout))
        records = list(_json_line(sections.get("jobs", "")).get("jobs") or [])
        return sections, records

    def _drop(self, node: _Node) -> None:
        if node.conn is not None:
            with contextlib.suppress(Exception):  # already gone: nothing to close
                node.conn.close()
        node.conn = None

    def refresh(
        self, now: dt.datetime | None = None, stop: threading.Event | None = None
    ) -> list[NodeView] | None:
        """Every node's view, asked all at once; None when ``stop`` is set first."""
        answers = ask_each(self.nodes, self._ask, stop or threading.Event(), at_once=MAX_ASKING)
        if answers is None:
            return None
        records = [r for _, recs in answers for r in recs]
        at = now or dt.datetime.now(dt.UTC)
        rows = merge_jobs(records, now=at, outputs=self.fleet.outputs)
        rates = self.steps.update(rows, self.clock())
        views = []
        for node, (sections, recs) in zip(self.nodes, answers, strict=True):
            if sections is None:
                views.append(
                    NodeView(node.host.name or node.host.address, node.host.label, node.error)
                )
                continue
            view = node_view(node.host, sections, rows, recs, policy=self.policy, rates=rates)
            if node.jobs_error:
                why = f"jobs unknown: {node.jobs_error}"
                view = dataclasses.replace(view, marks=(*view.marks, why))
            views.append(view)
        return views

    def close(self) -> None:
        self._closed = True
        for node in self.nodes:
            self._drop(node)


def run_top(
    session: TopSession,
    *,
    count: int,
    interval: float,
    as_json: bool,
    width: int,
    out: Any,
    live: bool,
    stop: threading.Event | None = None,
) -> list[list[NodeView]]:
    """``count`` refreshes (0: until Ctrl-C or ``stop``), ``interval`` seconds apart;
    each printed as a block of text (redrawn in place on a terminal) or one JSON line.
    Ctrl-C ends the view at once, in a refresh or between two: what was shown stays."""
    stop = stop or threading.Event()
    shown: list[list[NodeView]] = []
    screen = None
    if live:
        from rich.live import Live

        from infra.render import literal_console

        screen = Live(console=literal_console(), auto_refresh=False, screen=False)
        screen.start()
    try:
        with ctrl_c_sets(stop):
            _refresh_until_stopped(
                session, stop, count, interval, as_json, width, out, screen, shown
            )
    except KeyboardInterrupt:
        pass  # Ctrl-C before its handler was in place: the view ends the same way
    finally:
        if screen is not None:
            screen.stop()
    return shown


def _refresh_until_stopped(
    session: TopSession,
    stop: threading.Event,
    count: int,
    interval: float,
    as_json: bool,
    width: int,
    out: Any,
    screen: Any,
    shown: list[list[NodeView]],
) -> None:
    n = 0
    while (count == 0 or n < count) and not stop.is_set():
        if n and stop.wait(interval):
            return
        views = session.refresh(stop=stop)
        if views is None:
            return
        shown.append(views)
        at = dt.datetime.now(dt.UTC)
        stack = session.fleet.stack
        if as_json:
            out.write(refresh_json(views, stack=stack, at=at) + "\n")
        else:
            text = render(
                views,
                width=width,
                stack=stack,
                at=at,
                interval=interval if count != 1 else None,
            )
            if screen is not None:
                from rich.text import Text

                screen.update(Text("\n".join(text)), refresh=True)
            else:
                out.write("\n".join(text) + "\n\n")
        out.flush()
        n += 1


@fleet_task(
    help={
        "once": "one refresh, then exit (for scripts; with --json one JSON document)",
        "count": "refreshes before exiting (default 0: until Ctrl-C)",
        "interval": "seconds between refreshes (default 3)",
        "width": "columns to fit (default: the terminal's, else 80); 120 or more shows "
        "one line per GPU",
        "jobs_dir": f"fab train's job folder on the nodes (default {JOBS_ROOT})",
        "state_dir": f"the watchdog's state folder on the nodes (default {STATE_DIR})",
    },
    bounds={
        "count": Bound(0, example="10"),
        "interval": Bound(0.5, high=3600, example="3"),
        "width": Bound(0, high=1000, example="80"),
    },
)
def top(
    c: Context,
    fleet_args: FleetArgs,
    once: bool = False,
    count: int = 0,
    interval: float = 3.0,
    width: int = 0,
    jobs_dir: str = "",
    state_dir: str = "",
) -> None:
    """Live per-node, per-GPU view: utilisation, memory, power, temperature,
    the job and its cost; marks under-fed nodes and nodes the watchdog is
    about to stop."""
    if width and width < 40:
        raise Exit(f"gpufleet: --width {width}: give 40 columns or more (e.g. --width 80)", 2)
    fleet = resolve_fleet(c, fleet_args)
    session = TopSession(
        fleet,
        c.config,
        jobs_dir or JOBS_ROOT,
        state_dir or STATE_DIR,
        fleet_args.connect_timeout,
    )
    refreshes = 1 if once else count
    tty = sys.stdout.isatty()
    try:
        shown = run_top(
            session,
            count=refreshes,
            interval=interval,
            as_json=fleet_args.json,
            width=width or output_width() or NARROW_COLUMNS,
            out=sys.stdout,
            live=tty and not fleet_args.json and refreshes != 1,
        )
    finally:
        session.close()
    # A one-shot for scripts says by its status whether every node answered.
    if once and shown and any(v.error for v in shown[-1]):
        raise Exit(code=1)
