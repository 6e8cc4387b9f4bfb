"""Run steps on every host at once and report per host.

One thread per host: each opens its own SSH connection, runs the steps in order and stops at
the first failed one (later steps are reported as skipped with the reason). A host that cannot
be reached, or refuses the key, is reported as such; it never aborts the other hosts.

Every connection checks the host's SSH key against the run's known_hosts file
(``bootstrap.fleet.hostkeys``): unknown hosts are recorded, a changed key fails that host only.

The runner owns all output: progress lines while steps run (unless ``--json``), then either a
rich summary table or one JSON document on stdout. Tasks call :func:`fleet_run`.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import paramiko
from fabric import Connection
from invoke.config import Config
from invoke.exceptions import Exit
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from bootstrap.fleet.api import Host, HostContext, Status, Step, StepFailed, StepResult
from bootstrap.fleet.hostkeys import (
    HostKeyCheck,
    HostKeyError,
    HostKeyEvent,
    HostKeySettings,
    HostKeyVerifier,
    fingerprint,
    resolve_settings,
)
from infra.render import literal, output_width, wrap_prose

# Where resolve_fleet leaves the run's HostKeySettings in the invoke config, for run_fleet.
HOST_KEY_SETTINGS_KEY = "gpufleet_host_key_settings"

# How long to wait for the TCP connect + SSH handshake before calling a host unreachable.
DEFAULT_CONNECT_TIMEOUT_S = 10.0

_STATUS_STYLE = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.SKIPPED: "cyan",
    Status.FAILED: "bold red",
}


@dataclass
class StepRecord:
    name: str
    result: StepResult
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "status": self.result.status.value,
            "message": self.result.message,
            "details": _jsonable(dict(self.result.details)),
            "seconds": round(self.seconds, 3),
        }


@dataclass
class HostReport:
    host: Host
    # Set when no step could run: "unreachable", "auth-failed", "key-missing",
    # "host-key-mismatch", "host-key-error" or "ssh-error".
    connection_error: str | None = None
    connection_message: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    seconds: float = 0.0
    host_key: HostKeyEvent | None = None  # what the host-key check did (None: never got there)

    @property
    def failed(self) -> bool:
        return self.connection_error is not None or any(s.result.is_failure for s in self.steps)

    @property
    def reboot_required(self) -> bool:
        """A step (e.g. a driver install) left the node needing a reboot to take effect."""
        return any(bool(s.result.details.get("reboot_required")) for s in self.steps)

    @property
    def status(self) -> str:
        if self.connection_error:
            return self.connection_error
        if self.failed:
            return Status.FAILED.value
        if any(s.result.status is Status.CHANGED for s in self.steps):
            return Status.CHANGED.value
        if self.steps and all(s.result.status is Status.SKIPPED for s in self.steps):
            return Status.SKIPPED.value
        return Status.OK.value

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.address,
            "port": self.host.port,
            "user": self.host.user,
            "name": self.host.name,
            "role": self.host.role,
            "status": self.status,
            "error": self.connection_message or None,
            "reboot_required": self.reboot_required,
            "host_key": self.host_key.to_json() if self.host_key else None,
            "seconds": round(self.seconds, 3),
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass
class FleetReport:
    task: str
    hosts: list[HostReport]
    seconds: float

    @property
    def failed_hosts(self) -> list[HostReport]:
        return [h for h in self.hosts if h.failed]

    @property
    def changed(self) -> bool:
        return any(s.result.status is Status.CHANGED for h in self.hosts for s in h.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "ok": not self.failed_hosts,
            "changed": self.changed,
            "seconds": round(self.seconds, 3),
            "hosts": [h.to_json() for h in self.hosts],
        }


def _jsonable(value: Any) -> Any:
    """Details are free-form; make sure ``--json`` never crashes on them."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Status):
        return value.value
    return str(value)


class KeyFileMissing(OSError):
    """The private key named for a host does not exist (said before any connection)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def classify_connect_error(
    exc: BaseException, host: Host, timeout_s: float | None = None
) -> tuple[str, str]:
    """(kind, message) for an exception raised while opening the SSH connection: one line
    that says what happened and what to try, never paramiko's own words alone."""
    target = f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"
    within = f" within {timeout_s:g} s" if timeout_s else ""
    if isinstance(exc, HostKeyError):
        return (exc.kind, exc.message)
    if isinstance(exc, KeyFileMissing):
        return (
            "key-missing",
            f"{target}: key file {exc.path} does not exist: pass an existing private key with "
            "-i KEY (or ssh_key in the inventory)",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            "host-key-mismatch",
            f"{target} presented host key {fingerprint(exc.key.asbytes())} but "
            f"{fingerprint(exc.expected_key.asbytes())} was expected: not connecting",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = f" with key {host.key_filename}" if host.key_filename else ""
        return (
            "auth-failed",
            f"{target} refused authentication{key}: wrong key or user? "
            "Pass the key with -i KEY (or ssh_key in the inventory) and the user with "
            "user@host or ssh_user.",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return ("unreachable", f"{target}: connection refused (is sshd running on that port?)")
    # a port that accepts and stays silent: paramiko says "Error reading SSH protocol banner",
    # or, when the connect timeout ends the handshake first, "No existing session"
    handshake = ("banner", "no existing session", "negotiation timed out")
    if isinstance(exc, paramiko.SSHException) and any(h in str(exc).lower() for h in handshake):
        return (
            "unreachable",
            f"{target} accepted the connection but sent no SSH banner{within}: not an SSH "
            "server on that port, or sshd is overloaded",
        )
    if isinstance(exc, socket.gaierror):
        return ("unreachable", f"{target}: unknown host name ({exc.strerror or exc})")
    if isinstance(exc, TimeoutError | socket.timeout):
        return (
            "unreachable",
            f"{target}: connection timed out{within} (host down, wrong address, or a "
            "firewall dropping SSH?)",
        )
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return ("key-missing", f"{target}: key file {exc.filename} does not exist")
    if isinstance(exc, OSError):
        return ("unreachable", f"{target} is unreachable: {exc.strerror or exc}")
    return ("ssh-error", f"{target}: SSH failed: {exc.__class__.__name__}: {exc}")


def _quiet_paramiko() -> None:
    """paramiko logs a failed handshake (a silent port, a reset) as a traceback through the
    logging module; with no handler, Python prints it on stderr. The failure is reported as one
    line per host instead; a user who configures logging still gets paramiko's records."""
    import logging

    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def connect(
    host: Host, config: Config | None, timeout_s: float, *, host_keys: HostKeyCheck
) -> Connection:
    """An open Connection to ``host`` whose key ``host_keys`` accepted (else raises)."""
    _quiet_paramiko()
    connect_kwargs: dict[str, Any] = {}
    if config is not None:
        connect_kwargs.update(dict(config.get("connect_kwargs", {}) or {}))
    if host.key_filename:
        connect_kwargs["key_filename"] = [host.key_filename]
    keys = connect_kwargs.get("key_filename") or []
    for key in [keys] if isinstance(keys, str) else keys:
        if not os.path.isfile(os.path.expanduser(key)):
            raise KeyFileMissing(key)
    if connect_kwargs.get("key_filename"):
        # An explicit key is the whole truth: do not quietly fall back to an agent or ~/.ssh,
        # which would hide a wrong key and could log in as someone else.
        connect_kwargs.setdefault("look_for_keys", False)
        connect_kwargs.setdefault("allow_agent", False)
    connect_kwargs["banner_timeout"] = timeout_s
    connect_kwargs["auth_timeout"] = timeout_s
    kwargs: dict[str, Any] = {
        "host": host.address,
        "port": host.port,
        "connect_timeout": timeout_s,
        "connect_kwargs": connect_kwargs,
    }
    if host.user:
        kwargs["user"] = host.user
    if config is not None:
        # Each thread gets its own copy: Config objects are not meant to be shared.
        kwargs["config"] = config.clone()
    conn = Connection(**kwargs)
    # Steps run unattended in threads: never forward the terminal's stdin to a remote
    # command (a prompt would hang the host's thread, and stdin belongs to no one thread).
    conn.config.run.in_stream = False
    # Replaces Fabric's AutoAddPolicy: pinned keys are checked, unknown ones recorded.
    host_keys.install(conn.client)
    try:
        conn.open()
    except BaseException:
        conn.close()  # a refused host key leaves paramiko's transport thread running
        raise
    return conn


# A live line piped to a file (no terminal to update it in place) is printed this often,
# or whenever it has moved on by a tenth.
PIPED_TICK_SECONDS = 10.0
# Progress lines piped with no COLUMNS are continued past this width (as tables fit 80).
PIPED_COLUMNS = 80


def tick_due(
    last: tuple[float, float | None] | None,
    now: float,
    fraction: float | None,
    interval_s: float = PIPED_TICK_SECONDS,
) -> bool:
    """Should a piped live line be printed? ``last`` is (when, fraction) of the last one."""
    if last is None:
        return True
    at, was = last
    if now - at >= interval_s:
        return True
    return fraction is not None and was is not None and int(fraction * 10) > int(was * 10)


class _Printer:
    """Serialises progress lines from the host threads, and keeps each host's live line
    (:attr:`HostContext.tick`): on a terminal one line per host under the progress lines,
    redrawn in place; piped, a plain line now and then (:func:`tick_due`)."""

    def __init__(
        self,
        console: Console | None,
        *,
        interval_s: float = PIPED_TICK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.lock = threading.Lock()
        self.interval_s, self.clock = interval_s, clock
        self.live: Live | None = None
        self.ticks: dict[Host, Text] = {}
        self.last_tick: dict[Host, tuple[float, float | None]] = {}

    @staticmethod
    def _text(host: Host, message: str, style: str | None) -> Text:
        return Text.assemble((f"[{host.label}] ", "bold"), (message, style or ""))

    def _print_wrapped(self, host: Host, message: str, style: str | None) -> None:
        """One progress line, continued on indented lines where it is wider than the
        output (the terminal's, COLUMNS, else 80 when piped); a value is never cut."""
        assert self.console is not None
        width = output_width(self.console.file) or PIPED_COLUMNS
        prefix = f"[{host.label}] "
        pieces = wrap_prose(prefix + message, width, "", "    ")
        for i, piece in enumerate(pieces):
            if i == 0 and piece.startswith(prefix):
                text = Text.assemble((prefix, "bold"), (piece[len(prefix) :], style or ""))
            else:
                text = Text(piece, style or "")
            # While live lines show, rich prints this above them.
            self.console.print(text, highlight=False, soft_wrap=True)

    def line(self, host: Host, message: str, style: str | None = None) -> None:
        if self.console is None:
            return
        with self.lock:
            self._print_wrapped(host, message, style)

    def tick(self, host: Host, message: str, fraction: float | None = None) -> None:
        if self.console is None:
            return
        with self.lock:
            if not self.console.is_terminal:
                now = self.clock()
                if tick_due(self.last_tick.get(host), now, fraction, self.interval_s):
                    self.last_tick[host] = (now, fraction)
                    self._print_wrapped(host, message, "dim")
                return
            text = self._text(host, message, "dim")
            text.no_wrap, text.overflow = True, "ellipsis"  # one screen line per host
            self.ticks[host] = text
            if self.live is None:
                self.live = Live(
                    console=self.console,
                    auto_refresh=False,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self.live.start()
            self.live.update(Group(*self.ticks.values()), refresh=True)

    def end_tick(self, host: Host) -> None:
        """The host's live line is over (its step ended)."""
        with self.lock:
            self.last_tick.pop(host, None)
            if self.ticks.pop(host, None) is None or self.live is None:
                return
            if self.ticks:
                self.live.update(Group(*self.ticks.values()), refresh=True)
            else:
                self.close_live()

    def close_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class ConnectFailed(Exception):
    """The SSH connection to a host could not be opened (or its key was refused):
    ``kind`` and ``message`` as :func:`classify_connect_error` gives them."""

    def __init__(self, kind: str, message: str, host_key: HostKeyEvent | None) -> None:
        super().__init__(message)
        self.kind, self.message, self.host_key = kind, message, host_key


def open_checked(
    host: Host,
    config: Config | None,
    timeout_s: float,
    verifier: HostKeyVerifier,
    *,
    on_pinned: Callable[[HostKeyEvent], None] | None = None,
) -> tuple[Connection, HostKeyEvent]:
    """An open connection whose host key the run's ``verifier`` accepted, and what the key
    check did; raises :class:`ConnectFailed` with the one-line reason otherwise.
    ``on_pinned`` hears of a key pinned from the stack outputs before connecting."""
    check = verifier.check(host)
    if check.event is not None and on_pinned is not None:
        on_pinned(check.event)
    try:
        conn = connect(host, config, timeout_s, host_keys=check)
        return conn, check.confirm(conn.client)
    except Exception as exc:
        explained = check.explain(exc)
        mismatch = explained.event if isinstance(explained, HostKeyError) else None
        kind, message = classify_connect_error(explained, host, timeout_s)
        raise ConnectFailed(kind, message, mismatch or check.event) from None


def run_host(
    host: Host,
    steps: Sequence[Step],
    make_context: Callable[[Host], HostContext],
    config: Config | None,
    printer: _Printer,
    timeout_s: float,
    verifier: HostKeyVerifier,
) -> HostReport:
    report = HostReport(host)
    started = time.monotonic()
    try:
        conn, event = open_checked(
            host,
            config,
            timeout_s,
            verifier,
            on_pinned=lambda pinned: printer.line(host, pinned.message, "yellow"),
        )
    except ConnectFailed as exc:
        report.host_key = exc.host_key
        report.connection_error, report.connection_message = exc.kind, exc.message
        printer.line(host, report.connection_message, "bold red")
        report.seconds = time.monotonic() - started
        return report
    if event.noteworthy and event.origin == "connection":
        printer.line(host, event.message, "yellow")
    report.host_key = event
    try:
        ctx = make_context(host)
        ctx.progress = lambda message: printer.line(host, message, "dim")
        ctx.tick = functools.partial(printer.tick, host)
        failed_step: str | None = None
        for st in steps:
            name = st.step_name
            if failed_step is not None:
                result = StepResult.skipped(f"not run: {failed_step} failed")
                report.steps.append(StepRecord(name, result, 0.0))
                continue
            printer.line(host, f"{name} ...")
            t0 = time.monotonic()
            try:
                result = run_step(st, conn, ctx)
            finally:
                printer.end_tick(host)
            record = StepRecord(name, result, time.monotonic() - t0)
            report.steps.append(record)
            printer.line(
                host,
                f"{name}: {result.status.value}: {result.message}",
                _STATUS_STYLE[result.status],
            )
            if result.is_failure:
                failed_step = name
    finally:
        conn.close()
    report.seconds = time.monotonic() - started
    return report


def run_step(st: Step, conn: Connection, ctx: HostContext) -> StepResult:
    """Call a step, turning anything it raises into a failed result with a clear message.

    GPU steps on a node the preflight found without an NVIDIA GPU are not called: they are
    reported skipped with ``--allow-no-gpu`` (never as passed) and failed without it.
    """
    if getattr(st, "needs_gpu", False) and ctx.facts.get("gpu_count") == 0:
        if ctx.options.allow_no_gpu:
            return StepResult.skipped("no NVIDIA GPU on this node (--allow-no-gpu): not checked")
        return StepResult.failed(
            f"no NVIDIA GPU on this node ({ctx.facts.get('gpu_evidence', 'none detected')}); "
            "pass --allow-no-gpu to bootstrap it anyway with the GPU steps skipped"
        )
    try:
        result = st(conn, ctx)
    except StepFailed as exc:
        return StepResult.failed(exc.message, **exc.details)
    except paramiko.SSHException as exc:
        return StepResult.failed(f"SSH connection lost: {exc}")
    except Exception as exc:
        return StepResult.failed(f"{exc.__class__.__name__}: {exc}")
    if not isinstance(result, StepResult):
        return StepResult.failed(f"step {st.step_name} returned {result!r}, not a StepResult")
    return result


def run_fleet(
    task: str,
    hosts: Sequence[Host],
    steps: Sequence[Step],
    make_context: Callable[[Host], HostContext],
    *,
    config: Config | None = None,
    console: Console | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    host_keys: HostKeySettings | None = None,
) -> FleetReport:
    """Run ``steps`` on all ``hosts`` concurrently; never raises for a host's failure.

    Host keys are checked against ``host_keys`` (default: the settings ``resolve_fleet`` left
    in ``config``, else the known_hosts file for hosts without a stack).
    """
    printer = _Printer(console)
    started = time.monotonic()
    verifier = HostKeyVerifier(host_keys or host_key_settings(config))
    verifier.prepare(hosts)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(hosts), 64))) as pool:
            futures = [
                pool.submit(
                    run_host, h, steps, make_context, config, printer, connect_timeout_s, verifier
                )
                for h in hosts
            ]
            reports = [f.result() for f in futures]
    finally:
        printer.close_live()
    return FleetReport(task, reports, time.monotonic() - started)


def host_key_settings(config: Config | None) -> HostKeySettings:
    """The run's host-key settings from ``config``, or the defaults for hosts without a stack."""
    settings = config.get(HOST_KEY_SETTINGS_KEY) if config is not None else None
    if isinstance(settings, HostKeySettings):
        return settings
    return resolve_settings(stack=None)


def summary_table(report: FleetReport) -> Table:
    """One row per host and step: the per-host summary printed at the end of every task."""
    table = Table(title=f"fab {report.task}: {len(report.hosts)} host(s)", show_lines=False)
    table.add_column("host", style="bold")
    table.add_column("step")
    table.add_column("status")
    table.add_column("message", overflow="fold")
    for h in report.hosts:
        if h.connection_error:
            table.add_row(
                literal(h.host.label),
                "connect",
                Text(h.status, "bold red"),
                literal(h.connection_message),
            )
            continue
        first = True
        if h.host_key is not None and h.host_key.noteworthy:
            # A first or changed key is worth seeing at the end, next to what ran on the host.
            table.add_row(
                literal(h.host.label),
                "host-key",
                Text(h.host_key.status, "yellow"),
                literal(h.host_key.message),
            )
            first = False
        for s in h.steps:
            table.add_row(
                literal(h.host.label if first else ""),
                literal(s.name),
                Text(s.result.status.value, _STATUS_STYLE[s.result.status]),
                literal(s.result.message),
            )
            first = False
        table.add_section()
    return table


def verdict_line(report: FleetReport, *, read_only: bool = False) -> str:
    """The last line of a task. A read-only task (status, idle-status) changes nothing by
    design, so it says what it read instead of "nothing changed"."""
    failed = report.failed_hosts
    reboot = [h.host.label for h in report.hosts if h.reboot_required]
    suffix = f"; REBOOT REQUIRED on {', '.join(reboot)}" if reboot else ""
    if failed:
        names = ", ".join(h.host.label for h in failed)
        return f"{len(failed)} of {len(report.hosts)} host(s) failed: {names}{suffix}"
    if read_only:
        return f"all {len(report.hosts)} host(s) answered{suffix}"
    if report.changed:
        return f"all {len(report.hosts)} host(s) done; changes were made{suffix}"
    return f"all {len(report.hosts)} host(s) already in the desired state; nothing changed{suffix}"


def emit(
    report: FleetReport,
    *,
    as_json: bool,
    console: Console,
    render: Callable[[FleetReport], Iterable[Any]] | None = None,
    read_only: bool = False,
) -> None:
    """Print the final report (table or JSON) and exit non-zero if any host failed."""
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        sys.stdout.flush()
    else:
        for renderable in render(report) if render else [summary_table(report)]:
            console.print(renderable)
        console.print(literal(verdict_line(report, read_only=read_only)))
    if report.failed_hosts:
        # Exit with no message: the table / JSON already says what failed.
        raise Exit(code=1)
