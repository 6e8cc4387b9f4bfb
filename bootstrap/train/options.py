"""The options of the train steps (``fab train``, ``jobs``, ``logs``, ``cancel``, the
resume and the job's chart), one frozen dataclass per step family.

The tasks put them in :attr:`bootstrap.fleet.api.Options.tasks` (``run_steps(...,
tasks=(...))``) and the steps of :mod:`bootstrap.train.steps` read them back by type with
``ctx.options.need(T)``: a misspelt option is a type error, not a key nobody reads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bootstrap.fleet.api import Host


@dataclass(frozen=True)
class JobRef:
    """The recorded job (its job.json spec) a step acts on: train-restore, train-start,
    resume-check, logs, cancel, history and chart."""

    spec: Mapping[str, Any]


@dataclass(frozen=True)
class TrainCheck:
    """train-check's: can this node run the job?"""

    head: Host  # the node that picks the rendezvous port (unless master_port is given)
    python: str  # the job's interpreter on the nodes
    venv: str
    jobs_dir: str
    ckpt_parent: str  # where the job's checkpoint folders are made
    cpu: bool
    master_port: int  # 0: the head finds a free one
    nproc: int  # 0: one rank per GPU
    ignore_health: bool


@dataclass(frozen=True)
class ResumeCheck:
    """resume-check's: the recorded spec with what this resume changes (its endpoint, its
    credentials in --node-env), checked in a folder of its own; None: the recorded job."""

    proposed: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WorkdirSync:
    """The workdir to send: the laptop's manifest, the folder here and on the node."""

    manifest: dict[str, list[Any]]
    local: Path
    remote: str


@dataclass(frozen=True)
class TrainSend:
    """train-restore's and train-start's: the workdir to send (None: nothing to send), and
    for train-start after every node restored (``restored``) a start only."""

    workdir: WorkdirSync | None = None
    restored: bool = False
    restore_timeout: float = 3600.0  # seconds train-restore waits for the node's restore


@dataclass(frozen=True)
class JobsList:
    """fab jobs's: the jobs folder to list, and the watchdog's state dir for the TTL
    ("" : the default)."""

    jobs_dir: str
    state_dir: str = ""


@dataclass(frozen=True)
class LogsOptions:
    """fab logs's: which rank (None: all), follow or not, this attempt only, and where the
    lines go (one shared output, written under ``lock``)."""

    out: TextIO
    lock: threading.Lock
    rank: int | None = None
    follow: bool = False
    this_attempt: bool = False


@dataclass(frozen=True)
class CancelOptions:
    """fab cancel's: seconds between SIGTERM and SIGKILL, the bucket endpoint override."""

    wait: float = 120.0
    s3_endpoint: str = ""


@dataclass(frozen=True)
class ChartKeep:
    """The chart step's: the PNG drawn here and its file name in the job's folder."""

    png: bytes
    name: str
