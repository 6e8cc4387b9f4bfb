"""The step API every bootstrap task is built from.

A *step* is a plain function ``(conn, ctx) -> StepResult``: it inspects the node through
``conn`` (a ``fabric.Connection`` that is already open), changes it only when needed, and says
what it found or did. The runner (``bootstrap.fleet.runner``) calls steps for every host in
parallel, catches what they raise and renders the summary, so a step never prints and never
exits.

Other modules add tasks by writing steps and handing them to ``bootstrap.fleet.cli.fleet_run``::

    from bootstrap.fleet.api import HostContext, StepResult, step

    @step("install-watchdog")
    def install_watchdog_step(conn, ctx):
        if already_there(conn):
            return StepResult.ok("watchdog timer active")
        ...
        return StepResult.changed("installed gpufleet-watchdog.timer")
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fabric import Connection


class Status(enum.StrEnum):
    """What a step did. ``skipped`` is never a pass: it means "not checked"."""

    OK = "ok"  # already in the desired state; nothing touched
    CHANGED = "changed"  # the node was modified to reach the desired state
    SKIPPED = "skipped"  # not applicable or not run (the message says why)
    FAILED = "failed"  # could not reach the desired state


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step on one host."""

    status: Status
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, message: str, **details: Any) -> StepResult:
        return cls(Status.OK, message, details)

    @classmethod
    def changed(cls, message: str, **details: Any) -> StepResult:
        return cls(Status.CHANGED, message, details)

    @classmethod
    def skipped(cls, message: str, **details: Any) -> StepResult:
        return cls(Status.SKIPPED, message, details)

    @classmethod
    def failed(cls, message: str, **details: Any) -> StepResult:
        return cls(Status.FAILED, message, details)

    @property
    def is_failure(self) -> bool:
        return self.status is Status.FAILED


class StepFailed(Exception):
    """Raised inside a step (or a helper it calls) to end the step with a clear message."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Host:
    """One SSH target: where to connect and what the stack says about it."""

    address: str
    user: str | None = None
    port: int = 22
    name: str | None = None  # the node name from the stack outputs, when known
    role: str | None = None  # head | worker, when known
    key_filename: str | None = None

    @property
    def label(self) -> str:
        """How the host is shown in progress lines and tables."""
        target = self.address if self.port == 22 else f"{self.address}:{self.port}"
        return f"{self.name} ({target})" if self.name else target


@dataclass(frozen=True)
class ScratchSpec:
    """Where and from what the scratch volume is built (the stack's ``scratch`` output)."""

    path: str = "/scratch"
    kind: str = "nvme"  # nvme: instance-store NVMe; disk: a cloud data disk (Alicloud ESSD)
    devices: int | None = None  # how many devices the instance type promises, when known
    size_gb: int | None = None


@dataclass(frozen=True)
class TierInfo:
    """The subset of the stack's ``tier`` output bootstrap decisions depend on."""

    name: str | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    nvswitch: bool = False
    efa: bool = False  # the fabric between nodes (bootstrap/fleet/interconnect.py reads the output)
    infiniband: bool = False


# The setup options' defaults, written once: Options below and the tasks' signatures and
# help text read these.
DEFAULT_VENV = "/opt/gpufleet/venv"
DEFAULT_TORCH = "2.13.0"
DEFAULT_TORCH_INDEX = "auto"  # auto | default (the node's pip config) | a URL
DEFAULT_APT_LOCK_TIMEOUT_S = 300
DEFAULT_FSTAB = "/etc/fstab"


_T = TypeVar("_T")


@dataclass(frozen=True)
class Options:
    """Task options shared by all steps (each task fills in what it exposes).

    What only one task family reads is that family's own frozen dataclass in ``tasks``
    (``WatchdogOptions``, ``HealthOptions``, ``DataMove`` ...), read back by its type with
    :meth:`of` or :meth:`need`: a misspelt option is a type error, not a key nobody reads.
    """

    allow_no_gpu: bool = False
    force: bool = False
    venv: str = DEFAULT_VENV
    torch_version: str = DEFAULT_TORCH
    torch_index: str = DEFAULT_TORCH_INDEX
    driver_branch: str | None = None  # None: chosen from the GPU architecture
    apt_lock_timeout_s: int = DEFAULT_APT_LOCK_TIMEOUT_S
    scratch_devices: tuple[str, ...] = ()  # explicit devices instead of discovery
    fstab: str = DEFAULT_FSTAB
    scratch_path: str | None = None  # overrides the stack's scratch.path
    tasks: tuple[object, ...] = ()  # each task family's own options, one object per type

    def of(self, kind: type[_T]) -> _T | None:
        """This run's options of one task family (an instance of ``kind``), None if not given."""
        return next((o for o in self.tasks if isinstance(o, kind)), None)

    def need(self, kind: type[_T]) -> _T:
        """As :meth:`of`, for a step that cannot run without them (a programming error)."""
        found = self.of(kind)
        if found is None:
            raise TypeError(f"this step needs {kind.__name__} in Options.tasks")
        return found


ProgressFn = Callable[[str], None]
# A live line: the message, and how far along it is (0-1) when that is known.
TickFn = Callable[[str, float | None], None]


def _no_progress(message: str) -> None:
    del message


def _no_tick(message: str, fraction: float | None) -> None:
    del message, fraction


@dataclass
class HostContext:
    """Everything a step knows about its host besides the connection.

    ``facts`` is shared by the steps of one run on one host (e.g. the preflight step stores
    the OS and the GPU inventory there so later steps need not probe again); it is never
    shared between hosts.

    ``progress(message)`` prints a line of the host's progress; ``tick(message, fraction)``
    sets the host's live line for a long wait (a download), which a terminal shows updated
    in place and a pipe every 10 s or 10 %; it ends with the step.
    """

    host: Host
    options: Options = field(default_factory=Options)
    tier: TierInfo = field(default_factory=TierInfo)
    scratch: ScratchSpec = field(default_factory=ScratchSpec)
    stack: str | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)  # the stack outputs, if known
    facts: dict[str, Any] = field(default_factory=dict)
    progress: ProgressFn = _no_progress
    tick: TickFn = _no_tick
    cancel: threading.Event = field(default_factory=threading.Event)


class Step(Protocol):
    """A named step; ``@step`` turns a plain function into one."""

    step_name: str
    needs_gpu: bool

    def __call__(self, conn: Connection, ctx: HostContext) -> StepResult: ...


StepFn = Callable[[Connection, HostContext], StepResult]


def step(name: str, *, needs_gpu: bool = False) -> Callable[[StepFn], Step]:
    """Name a step function (the name is what summaries and ``--json`` show).

    ``needs_gpu`` marks steps that only make sense on a node with an NVIDIA GPU: with
    ``--allow-no-gpu`` on a node without one, the runner reports them as skipped.
    """

    def wrap(fn: StepFn) -> Step:
        fn.step_name = name  # type: ignore[attr-defined]
        fn.needs_gpu = needs_gpu  # type: ignore[attr-defined]
        return fn  # type: ignore[return-value]

    return wrap
