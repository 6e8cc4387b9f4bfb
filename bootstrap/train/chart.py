"""A job's chart: GPU utilisation and memory per node over the job's life, with its events.

The data is what the nodes already keep (gpufleet_node/job_runner.py ``history``): the
watchdog's samples while the job ran on each node (``gpu-samples.jsonl``: per-GPU
utilization and the fullest GPU's memory %, every 15 s) and the job's own events
(``events.jsonl``: start, resume, checkpoint, cancel, end). :func:`job_figure` builds the
figure on matplotlib's object API (no pyplot state, the Agg backend, as scripts/cost.py's
comparison does) and returns it, so tests read its lines back; :func:`save_chart` writes
the PNG.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CHART_NAME = "gpufleet-chart.png"  # beside the job's record, and its key in the bucket
# One colour per event kind, the same on every chart; "end" takes the job's final state.
EVENT_COLOURS = {
    "start": "tab:green",
    "resume": "tab:blue",
    "checkpoint": "tab:gray",
    "cancel": "tab:red",
    "end": "black",
}


@dataclass(frozen=True)
class Point:
    at: dt.datetime
    util: float | None  # mean over the node's GPUs, percent
    mem: float | None  # the fullest GPU's memory, percent


@dataclass(frozen=True)
class Event:
    at: dt.datetime
    kind: str
    node_rank: int
    label: str


@dataclass(frozen=True)
class JobHistory:
    job: str
    name: str
    nodes: Mapping[int, Sequence[Point]] = field(default_factory=dict)
    events: Sequence[Event] = ()

    @property
    def empty(self) -> bool:
        return not any(self.nodes.values()) and not self.events


def _time(text: Any) -> dt.datetime | None:
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _label(item: Mapping[str, Any]) -> str:
    kind = str(item.get("event"))
    if kind == "checkpoint":
        return f"step {item.get('step')}"
    if kind in ("start", "resume"):
        return f"{kind} (attempt {item.get('attempt', 1)})"
    if kind == "end":
        return str(item.get("state") or "end")
    return kind


def history_of(job: str, name: str, answers: Mapping[int, Mapping[str, Any]]) -> JobHistory:
    """The job's history from each node's ``job_runner.py history`` answer, by node rank.
    Samples and events that cannot be read are left out, never guessed."""
    nodes: dict[int, list[Point]] = {}
    events: list[Event] = []
    for rank, answer in sorted(answers.items()):
        points = nodes.setdefault(rank, [])
        for s in answer.get("samples") or []:
            at = _time(s.get("at"))
            if at is None:
                continue
            utils = s.get("gpu_util")
            util = sum(utils) / len(utils) if isinstance(utils, list) and utils else None
            mem = s.get("gpu_mem")
            points.append(Point(at, util, float(mem) if isinstance(mem, int | float) else None))
        points.sort(key=lambda p: p.at)
        for e in answer.get("events") or []:
            at = _time(e.get("at"))
            if at is not None and e.get("event") in EVENT_COLOURS:
                events.append(Event(at, str(e["event"]), rank, _label(e)))
    # A multi-node job's start, checkpoint and end happen on every node: shown once, at
    # the first node that reports them (checkpoints are the head's alone anyway).
    seen: set[tuple[str, str]] = set()
    unique = []
    for ev in sorted(events, key=lambda e: (e.at, e.node_rank)):
        key = (ev.kind, ev.label)
        if ev.kind != "cancel" and key in seen:
            continue
        seen.add(key)
        unique.append(ev)
    return JobHistory(job, name, nodes, unique)


def job_figure(history: JobHistory) -> Figure:
    """Two panels sharing the time axis: GPU utilisation (mean over the node's GPUs) and
    GPU memory (the fullest GPU) per node, in percent; each event a vertical line with its
    label. Lines are labelled ``node N`` (their data is the samples as read)."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6), layout="constrained")
    ax_util, ax_mem = fig.subplots(2, 1, sharex=True)
    for rank, points in sorted(history.nodes.items()):
        xs = [p.at for p in points]
        ax_util.plot(xs, [p.util for p in points], label=f"node {rank}", linewidth=1.2)
        ax_mem.plot(xs, [p.mem for p in points], label=f"node {rank}", linewidth=1.2)
    for ax, what in ((ax_util, "GPU utilisation %"), (ax_mem, "GPU memory used %")):
        ax.set_ylim(0, 105)
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.set_axisbelow(True)
    for ev in history.events:
        colour = EVENT_COLOURS[ev.kind]
        for ax in (ax_util, ax_mem):
            ax.axvline(ev.at, color=colour, linestyle="--", linewidth=0.9, gid=f"event:{ev.kind}")
        ax_util.annotate(
            ev.label,
            (ev.at, 103),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=colour,
        )
    locator = AutoDateLocator()
    ax_mem.xaxis.set_major_locator(locator)
    ax_mem.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    ax_mem.set_xlabel("UTC")
    if history.nodes:
        ax_util.legend(loc="lower left", fontsize=8)
    fig.suptitle(f"{history.name}: {history.job}", fontsize=11)
    return fig


def save_chart(fig: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # Agg: no display needed, the same file on CI and laptops
    fig.savefig(path, dpi=100)
    return path
