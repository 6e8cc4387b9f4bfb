"""The fleet's jobs: every node's state records merged into one row per job, and the table.

A node sharing a disk with another reports the same record twice, and nodes of one job
may disagree (the worst news wins); the cost so far is the stack's hourly price per node
times the nodes times the runtime.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from bootstrap.fleet.ttl import ttl_cell, ttl_note
from bootstrap.train.spec import TrainError, hourly_price
from gpufleet_node.job_notify import host_of
from gpufleet_node.job_policy import attempt_line
from infra.render import output_width, wrap

# Which state wins when the nodes of one job disagree: the worst news first.
_STATE_ORDER = ("cancelled", "failed", "interrupted", "starting", "running", "succeeded")


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
    # While it runs: the time before the hard TTL stops the first of its nodes
    # (bootstrap/fleet/ttl.py ttl_left of that node), else None.
    ttl: Mapping[str, Any] | None = None

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
            "ttl": None if self.ttl is None else dict(self.ttl),
            "nodes": {str(k): v.get("effective") for k, v in sorted(self.nodes.items())},
            "resumed_from": self.resumed_from,
            "warnings": self.warnings,
            "attempts": self.attempts,
            "end_reason": self.head.get("end_reason"),
            "max_cost": self.spec.get("max_cost"),
            "budget": self.head.get("budget"),
            "waiting_for": self.waiting_for,
            # The webhook URL is a secret (its token): its host only.
            "notify": host_of(self.spec["notify_url"]) if self.spec.get("notify_url") else None,
        }

    @property
    def head(self) -> Mapping[str, Any]:
        return self.nodes.get(0) or next(iter(self.nodes.values()), {})

    @property
    def waiting_for(self) -> list[int]:
        """The nodes a running multi-node attempt waits for (the head's state.json
        ``waiting_for``: their rendezvous has not completed)."""
        if self.state not in ("running", "starting"):
            return []
        return [int(n) for n in self.head.get("waiting_for") or []]

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """Each attempt of the run as its head recorded it (state.json ``attempts``: why
        it ended, its steps and time), the earliest first."""
        return [dict(a) for a in self.head.get("attempts") or [] if isinstance(a, Mapping)]

    @property
    def resumed_from(self) -> dict[str, Any] | None:
        """The checkpoint version (and step) this attempt resumed from, as its head
        recorded it (state.json ``resumed_from``); None when it did not resume from one."""
        head = self.nodes.get(0) or next(iter(self.nodes.values()), {})
        found = head.get("resumed_from")
        return dict(found) if isinstance(found, Mapping) else None

    @property
    def warnings(self) -> list[str]:
        """Each node's warnings (state.json ``warnings``: an attempt that wrote an older
        checkpoint than it was given, output saying it started from scratch), one line
        each, ``node R: `` first when the job has several nodes; the same line from two
        nodes sharing a disk is said once."""
        out: list[str] = []
        for rank, node in sorted(self.nodes.items()):
            for text in node.get("warnings") or []:
                line = " ".join(str(text).split())
                line = f"node {rank}: {line}" if self.nnodes > 1 else line
                if line not in out:
                    out.append(line)
        return out


def _parse_time(text: Any) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


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
    price = hourly_price(outputs)
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
        if state in ("running", "starting"):
            row.ttl = nearest_ttl([n.get("node_ttl") for n in nodes.values()])
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


def nearest_ttl(ttls: Iterable[Any]) -> Mapping[str, Any] | None:
    """The job's TTL: its node the hard TTL stops first; else an unknown one; else off."""
    known = [t for t in ttls if isinstance(t, Mapping)]
    left = [t for t in known if t.get("state") == "left"]
    if left:
        return min(left, key=lambda t: float(t.get("seconds") or 0))
    return next((t for t in known if t.get("state") == "unknown"), None) or next(
        (t for t in known if t.get("state") == "off"), None
    )


# Piped with no COLUMNS, the table fits this many columns (as `fab top` does).
NARROW_COLUMNS = 80
JOB_COLUMN_MAX = 30  # a longer job label gets a line of its own (never cut)
_HEADINGS = ("job", "state", "started (UTC)", "runtime", "cost", "TTL left")


def jobs_lines(rows: Sequence[JobRow], width: int) -> list[str]:
    """The jobs in at most ``width`` columns: one row per job (id, state, start, runtime,
    cost so far, the time before the hard TTL stops its first node while it runs), its last
    log line beneath it (its start: the end is cut, with "...") and what the TTL cell cannot
    say."""
    table = []
    for r in rows:
        cost = "-" if r.cost is None else f"{r.cost:.2f} {r.currency}".strip()
        if r.cost is not None and r.spec.get("max_cost"):
            cost = f"{r.cost:.2f}/{float(r.spec['max_cost']):g} {r.currency}".strip()
        started = (r.started_at or "-")[5:16].replace("T", " ") or "-"
        label = r.job if r.name in r.job else f"{r.job} ({r.name})"
        state = r.state if r.attempt == 1 else f"{r.state} (attempt {r.attempt})"
        if r.head.get("end_reason") == "budget":
            state = "budget reached" + ("" if r.attempt == 1 else f" (attempt {r.attempt})")
        if r.waiting_for:  # a multi-node attempt whose rendezvous waits for a node
            state = f"waiting for node {', '.join(str(n) for n in r.waiting_for)}"
        ttl = ttl_cell(r.ttl) if r.ttl is not None else "-"
        table.append((r, [label, state, started, fmt_duration(r.runtime_s), cost, ttl]))
    widths = [max([len(h), *(len(c[i]) for _, c in table)]) for i, h in enumerate(_HEADINGS)]
    # The job column takes what the others leave (a label longer goes on its own line).
    rest = sum(w + 2 for w in widths[1:])
    widths[0] = max(len(_HEADINGS[0]), min(widths[0], JOB_COLUMN_MAX, width - rest))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [f"{len(rows)} job(s)", line(_HEADINGS)]
    for r, cells in table:
        if len(cells[0]) > widths[0]:
            out.extend(wrap(cells[0], width))
            cells = ["", *cells[1:]]
        out.extend(wrap(line(cells), width, "", " " * (widths[0] + 2)))
        room = max(20, width - len("  last: "))
        if r.last_line:
            text = r.last_line
            shown = text if len(text) <= room else text[: room - 3] + "..."
            out.append(f"  last: {shown}")
        if r.ttl is not None and ttl_note(r.ttl):
            out.extend(wrap(ttl_note(r.ttl), width, "  ", "    "))
        if r.resumed_from is not None:
            out.extend(wrap(resumed_text(r.resumed_from), width, "  ", "    "))
        for warning in r.warnings:
            out.extend(wrap(warning, width, "  warning: ", "    "))
        records = r.attempts
        if len(records) > 1 or any(a.get("reason") != "succeeded" for a in records):
            for said in attempt_lines(records):  # each attempt and why it ended
                out.extend(wrap(said, width, "  ", "    "))
    return out


def attempt_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each attempt in a line; a row of attempts that waited for the same node (its
    rendezvous timed out again and again) in one."""
    out: list[str] = []
    i = 0
    while i < len(records):
        rec = records[i]
        j = i
        while (
            rec.get("reason") == "waiting"
            and j + 1 < len(records)
            and records[j + 1].get("reason") == "waiting"
            and records[j + 1].get("waiting_for") == rec.get("waiting_for")
        ):
            j += 1
        if j == i:
            out.append(attempt_line(rec))
        else:
            seconds = sum(float(r.get("seconds") or 0) for r in records[i : j + 1])
            nodes = ", ".join(str(n) for n in rec.get("waiting_for") or [])
            out.append(
                f"attempts {rec.get('attempt')}-{records[j].get('attempt')}: waiting "
                f"(for node {nodes}) {j - i + 1} times, {seconds:.0f}s"
            )
        i = j + 1
    return out


def resumed_text(found: Mapping[str, Any]) -> str:
    """``resumed from version 3 (step 200)``."""
    version, step = found.get("version"), found.get("step")
    what = f"version {version}" if version is not None else "the node's own checkpoint folder"
    return f"resumed from {what}" + (f" (step {step})" if step is not None else "")


def jobs_table(rows: Sequence[JobRow], width: int | None = None) -> Text:
    """The `fab jobs` table as literal text, at ``width`` columns (default: the output's,
    else 80 when piped)."""
    return Text("\n".join(jobs_lines(rows, width or output_width() or NARROW_COLUMNS)))
