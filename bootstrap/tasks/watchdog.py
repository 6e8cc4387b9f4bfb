"""The idle watchdog on the nodes: `fab install-watchdog`, `fab keep-alive`, `fab idle-status`.

``install_watchdog_step`` is also the last step of ``fab setup``. The node side is
``gpufleet_node.watchdog`` (the loop) and what it imports in that package: its concerns
(``watchdog_*.py``, ``scratch_sync.py``), its clouds (``clouds/<name>.py``), the shared idle
rules (``idle_rules.py``, the reaper's own), its bucket client (``bucket.py``, stdlib only:
nothing else to install on the node, so the sync path cannot be missing), installed as
``<prefix>/gpufleet_node/`` and run as ``python3 -m gpufleet_node.watchdog``, and two
systemd units; everything the steps do on the node is a command built by a pure function
below, so the plan is tested without a node.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke import Context
from rich.table import Table

from bootstrap.fleet import node_package
from bootstrap.fleet.api import HostContext, Options, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport
from bootstrap.fleet.system import root_sh, sh
from gpufleet_node.idle_rules import MAX_LEASE_HOURS
from gpufleet_node.verify_health import STATE_DIR as NODE_STATE_DIR
from infra.nodes import NODE_INFO_PATH as NODE_INFO  # the stack's first-boot facts

# The units beside the node package (package data); the package itself goes under PREFIX.
UNIT_SOURCE = node_package.PACKAGE_DIR
PREFIX = "/opt/gpufleet"
ETC = "/etc/gpufleet"
UNIT_DIR = "/etc/systemd/system"
STATE_DIR = str(NODE_STATE_DIR)  # the node's own default, read from the node package
TIMER = "gpufleet-watchdog.timer"
SERVICE = "gpufleet-watchdog.service"
# What the watchdog runs: the module and, through its imports, the rest it needs.
TOOL = "watchdog"


@dataclass(frozen=True)
class WatchdogOptions:
    """The watchdog tasks' options (install-watchdog, keep-alive, idle-status, and fab stop /
    start's watchdog steps); an empty string is the default (the constants above) or the
    stack's value."""

    enable_timer: bool = True  # --no-watchdog-timer: files only, the timer not armed
    prefix: str = ""
    etc: str = ""
    unit_dir: str = ""
    state_dir: str = ""
    hours: float = 2.0  # keep-alive's lease
    sync_timeout_s: float = 0.0  # save-scratch's bound (0: the watchdog's own)
    bucket: str = ""  # over the stack's bucket
    dry_run: bool = False
    # Endpoint overrides: tests (moto and fakes on 127.0.0.1) and private endpoints.
    storage_endpoint_url: str = ""
    metadata_url: str = ""
    endpoint_url: str = ""

    def as_options(self) -> Options:
        return Options(tasks=(self,))


def _watchdog_options(ctx: HostContext) -> WatchdogOptions:
    return ctx.options.of(WatchdogOptions) or WatchdogOptions()


def node_files(prefix: str = PREFIX, unit_dir: str = UNIT_DIR) -> list[tuple[Path, str, str]]:
    """(source here, where it goes on the node, mode): the watchdog's part of the node
    package under ``<prefix>/gpufleet_node/`` (its import closure: the loop, its concerns,
    the idle rules, the names, the bucket client, every node cloud), then the two units."""
    return [
        *(
            (node_package.source(name), f"{prefix}/{name}", "0644")
            for name in node_package.closure(TOOL)
        ),
        (UNIT_SOURCE / SERVICE, f"{unit_dir}/{SERVICE}", "0644"),
        (UNIT_SOURCE / TIMER, f"{unit_dir}/{TIMER}", "0644"),
    ]


def systemd_quote(arg: str) -> str:
    """One argument of an ExecStart= line, as systemd reads it back: double-quoted with C
    escapes for a backslash and a quote, ``%%`` for a literal ``%`` (specifiers) and ``$$``
    for a literal ``$`` (variable expansion): systemd.service(5), "Command lines", and
    systemd.unit(5), "Specifiers" (freedesktop.org man pages, read 2026-12-05)."""
    if arg and all(ch.isalnum() or ch in "/_.:+-=,@" for ch in arg):
        return arg  # nothing systemd would read differently: the unit stays as shipped
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def systemd_env_quote(assignment: str) -> str:
    """One ``VAR=value`` of an Environment= line, as systemd reads it back: double-quoted
    with C escapes for a backslash and a quote, ``%%`` for a literal ``%`` (specifiers); a
    ``$`` is literal there (no variable expansion): systemd.exec(5), "Environment="."""
    if all(ch.isalnum() or ch in "/_.:+-=,@" for ch in assignment):
        return assignment
    escaped = assignment.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%") + '"'


def render_service(template: str, prefix: str, etc: str) -> str:
    """The watchdog's service unit for this install: its ExecStart runs the watchdog's
    module from the package --prefix put (on PYTHONPATH, its Environment= line) with the
    config where --etc put it (the shipped file names the defaults), each path quoted for
    systemd."""
    exec_start = " ".join(
        systemd_quote(a)
        for a in (
            "/usr/bin/python3",
            "-m",
            f"{node_package.PACKAGE}.{TOOL}",
            "run",
            "--config",
            f"{etc}/watchdog.json",
        )
    )
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={exec_start}"
        elif line.startswith(("Environment=PYTHONPATH=", 'Environment="PYTHONPATH=')):
            line = "Environment=" + systemd_env_quote(f"PYTHONPATH={prefix}")
        elif line.startswith("Documentation="):
            uri = "file://" + urllib.parse.quote(f"{prefix}/{node_package.PACKAGE}/{TOOL}.py")
            line = "Documentation=" + uri.replace("%", "%%")
        lines.append(line)
    return "\n".join(lines) + "\n"


def install_contents(prefix: str, etc: str, unit_dir: str) -> list[tuple[bytes, str, str]]:
    """(bytes, where they go on the node, mode) of every installed file, the service unit
    rendered for these paths."""
    out = []
    for src, dest, mode in node_files(prefix, unit_dir):
        data = src.read_bytes()
        if src.name == SERVICE:
            data = render_service(data.decode(), prefix, etc).encode()
        out.append((data, dest, mode))
    return out


def watchdog_command(prefix: str, etc: str, command: str) -> str:
    """``PYTHONPATH=<prefix> python3 -m gpufleet_node.watchdog COMMAND --config
    <etc>/watchdog.json`` for a shell, each path quoted: a space splits nothing, a shell
    character runs nothing."""
    config = shlex.quote(f"{etc}/watchdog.json")
    return f"{node_package.module_command(prefix, TOOL)} {command} --config {config}"


def watchdog_config(ctx: HostContext, opts: WatchdogOptions) -> dict[str, Any]:
    """What /etc/gpufleet/watchdog.json adds to the first-boot node.json (stack facts)."""
    # The kind decides whether unsynced checkpoints may be left behind by a stop: an
    # instance store ("nvme") is erased, a data disk ("disk") survives.
    cfg: dict[str, Any] = {"scratch_path": ctx.scratch.path, "scratch_kind": ctx.scratch.kind}
    if ctx.host.name:
        cfg["node"] = ctx.host.name
    if ctx.host.role:
        cfg["role"] = ctx.host.role
    if ctx.stack:
        cfg["stack"] = ctx.stack
    if ctx.tier.name:
        cfg["tier"] = ctx.tier.name
    out = ctx.outputs
    idle = out.get("idle") or {}
    from_stack = {
        "bucket": out.get("bucket"),
        "provider": out.get("provider"),
        "region": out.get("region"),
        "idle_minutes": idle.get("idle_minutes"),
        "ttl_hours": idle.get("ttl_hours"),
    }
    given = {"bucket": opts.bucket, "dry_run": opts.dry_run or None}
    for key in ("bucket", "provider", "region", "idle_minutes", "ttl_hours", "dry_run"):
        value = given.get(key)
        if value in (None, ""):
            value = from_stack.get(key)
        if value not in (None, ""):
            cfg[key] = value
    overrides = {
        "state_dir": opts.state_dir,
        "storage_endpoint_url": opts.storage_endpoint_url,
        "metadata_url": opts.metadata_url,
        "endpoint_url": opts.endpoint_url,
    }
    cfg.update({key: value for key, value in overrides.items() if value})
    return cfg


def parse_sha256sum(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        # "<digest>  <path>": the path may hold spaces (a --prefix with one).
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[1]] = parts[0]
    return out


# What gpufleet put flat under the prefix before the node code was one package (f23798a):
# the watchdog, its concerns, the shared modules and the node clouds. The unit now runs
# <prefix>/gpufleet_node/ and ignores them, so the install removes them: they would only lie
# there, runnable by hand as a watchdog that no longer matches its config. watchdog.py goes
# last, the mark that the rest may still be there: an interrupted removal is finished next time.
OLD_FLAT_FILES = (
    "watchdog_*.py",
    "scratch_sync.py",
    "idle_rules.py",
    "bucket.py",
    "fleet_names.py",
    "clouds/*.py",
    "watchdog.py",
)


def old_flat_command(prefix: str) -> str:
    """A root shell command that removes an older flat install's files (and their compiled
    copies) from ``prefix`` and prints each removed file's name; nothing where the prefix
    holds no flat watchdog*.py (a fresh node, or one already moved to the package)."""
    names = " ".join(OLD_FLAT_FILES)
    return (
        f"cd {shlex.quote(prefix)} 2>/dev/null || exit 0; "
        '[ -n "$(ls -d watchdog.py watchdog_*.py 2>/dev/null)" ] || exit 0; '
        f"for f in {names}; do "
        '[ -f "$f" ] && [ ! -L "$f" ] || continue; '
        'd=$(dirname "$f"); b=$(basename "$f" .py); '
        'rm -f "$d/__pycache__/$b".*.pyc && rm -f -- "$f" || exit 1; echo "$f"; '
        "done; rmdir clouds/__pycache__ clouds __pycache__ 2>/dev/null; exit 0"
    )


def remove_old_flat(conn: Connection, ctx: HostContext, prefix: str) -> list[str] | str:
    """The older flat install's files removed from ``prefix``, or why they could not be."""
    done = root_sh(conn, ctx, old_flat_command(prefix))
    if not done.ok:
        return (done.stderr or done.stdout).strip()[:300] or f"exit {done.exited}"
    return done.stdout.split()


def old_flat_line(prefix: str, removed: list[str]) -> str:
    """What the install says about an older flat install it removed (one line)."""
    return (
        f"removed {len(removed)} file(s) of an older flat install from {prefix} "
        f"(the unit runs {prefix}/{node_package.PACKAGE}/)"
    )


def enable_commands(unit_dir: str = UNIT_DIR) -> list[str]:
    del unit_dir
    return ["systemctl daemon-reload", f"systemctl enable --now {TIMER}"]


def _paths(ctx: HostContext) -> tuple[str, str, str, str]:
    opts = _watchdog_options(ctx)
    return (
        opts.prefix or PREFIX,
        opts.etc or ETC,
        opts.unit_dir or UNIT_DIR,
        opts.state_dir or STATE_DIR,
    )


@step("install-watchdog")
def install_watchdog_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Copy the watchdog and its units, write its config, enable the timer (idempotent)."""
    prefix, etc, unit_dir, _state = _paths(ctx)
    opts = _watchdog_options(ctx)
    py = sh(conn, "python3 -c 'import sys; print(sys.version_info >= (3, 10))'")
    if not py.ok or py.stdout.strip() != "True":
        return StepResult.failed("the watchdog needs python3 >= 3.10 on the node")

    config = watchdog_config(ctx, opts)
    unknown = [k for k in ("provider", "region", "stack", "node") if k not in config]
    if unknown and not sh(conn, f"test -f {NODE_INFO}").ok:
        # A plain `-H` host with no stack behind it (a workstation, a foreign VM): the watchdog
        # could only power it off blind, so it is not installed, and the report says so.
        return StepResult.skipped(
            f"no stack facts for this host ({', '.join(unknown)} unknown: no --stack or "
            f"--inventory, and no {NODE_INFO} from a gpufleet first boot): idle watchdog not "
            "installed; for a stack's node run `fab install-watchdog --stack S`"
        )
    files = install_contents(prefix, etc, unit_dir)
    config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    wanted = {dest: hashlib.sha256(data).hexdigest() for data, dest, _ in files}
    wanted[f"{etc}/watchdog.json"] = hashlib.sha256(config_text.encode()).hexdigest()
    have = parse_sha256sum(
        sh(conn, "sha256sum " + " ".join(shlex.quote(p) for p in wanted) + " 2>/dev/null").stdout
    )
    stale = [p for p, digest in wanted.items() if have.get(p) != digest]

    for data, dest, mode in files:
        if dest in stale:
            _put(conn, ctx, data, dest, mode)
    if f"{etc}/watchdog.json" in stale:
        _put(conn, ctx, config_text.encode(), f"{etc}/watchdog.json", "0644")
    removed = remove_old_flat(conn, ctx, prefix)
    if isinstance(removed, str):
        return StepResult.failed(
            f"could not remove the older flat watchdog files from {prefix}: {removed}",
            updated=stale,
        )

    enable = opts.enable_timer
    if enable:
        refused = arm_timer(conn, ctx, unit_dir)
        if refused is not None:
            return StepResult.failed(refused, updated=stale)

    check = root_sh(conn, ctx, watchdog_command(prefix, etc, "status --json"))
    if not check.ok:
        return StepResult.failed(
            f"the watchdog does not run on this node: {check.stderr.strip()[:300]}"
        )
    status = json.loads(check.stdout)
    armed = "timer active" if enable else "timer not enabled (--no-watchdog-timer)"
    note = f"{status['action']}: {status['reason']}"
    # The sync path is proven, not assumed: the node writes a probe object to the bucket
    # with its own role. Without it the watchdog would refuse every power-off (checkpoints
    # unsaved) and only the hard TTL would stop the node.
    probe = root_sh(conn, ctx, watchdog_command(prefix, etc, "check-sync --json"))
    try:
        synced = json.loads(probe.stdout)
    except ValueError:
        synced = {"ok": False, "detail": (probe.stderr or probe.stdout).strip()[:300]}
    if not synced.get("ok"):
        return StepResult.failed(
            f"scratch cannot be saved from this node: {synced.get('detail')}; the watchdog "
            "will refuse to power it off while checkpoints are unsaved (fix the bucket or "
            "the node role, then rerun fab install-watchdog)",
            updated=stale,
        )
    note += f"; sync ok ({synced['detail']})"
    if removed:
        note += "; " + old_flat_line(prefix, removed)
    if not stale and not removed:
        return StepResult.ok(f"up to date, {armed}; {note}")
    return StepResult.changed(f"installed {len(stale)} file(s), {armed}; {note}", updated=stale)


def arm_timer(conn: Connection, ctx: HostContext, unit_dir: str) -> str | None:
    """Enable and start the watchdog's timer; why it could not be, or None."""
    if not sh(conn, "test -d /run/systemd/system").ok:
        return "systemd is not running on this node: the watchdog timer cannot be armed"
    for command in enable_commands(unit_dir):
        done = root_sh(conn, ctx, command)
        if not done.ok:
            return f"{command}: {done.stderr.strip()[:300]}"
    if not sh(conn, f"systemctl is-active --quiet {TIMER}").ok:
        return f"{TIMER} is not active after enabling it"
    return None


def put_command(data: bytes, dest: str, mode: str) -> str:
    """A shell command that writes ``data`` to ``dest`` with ``mode``, atomically enough.

    The bytes travel inside the command (base64): nodes without an SFTP subsystem work too,
    and the files are small (the watchdog is ~40 KB).
    """
    b64 = base64.b64encode(data).decode("ascii")
    return (
        f't=$(mktemp) && echo {b64} | base64 -d > "$t" && '
        f'install -D -m {mode} "$t" {shlex.quote(dest)}; rc=$?; rm -f "$t"; exit $rc'
    )


def _put(conn: Connection, ctx: HostContext, data: bytes, dest: str, mode: str) -> None:
    done = root_sh(conn, ctx, put_command(data, dest, mode))
    if not done.ok:
        raise RuntimeError(f"could not install {dest}: {done.stderr.strip()[:300]}")


@step("keep-alive")
def keep_alive_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Write the lease (file + instance tag) through the watchdog on the node."""
    prefix, etc, _unit, _state = _paths(ctx)
    hours = _watchdog_options(ctx).hours
    done = root_sh(conn, ctx, watchdog_command(prefix, etc, f"lease --hours {hours:g} --json"))
    if not done.ok:
        return StepResult.failed(
            f"lease not written: {(done.stderr or done.stdout).strip()[:300]} "
            "(is the watchdog installed? fab install-watchdog)"
        )
    out = json.loads(done.stdout)
    message = f"kept until {out['lease_until']} (tag {out['tag']})"
    if str(out["tag"]).startswith("failed"):
        # The node's watchdog honours the file; the cloud reaper only sees the tag, but it
        # leaves nodes with a live watchdog alone, so the lease holds either way.
        return StepResult.changed(message + "; the node's watchdog honours the file", **out)
    return StepResult.changed(message, **out)


@step("idle-status")
def idle_status_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The watchdog's idle clock and what keeps the node alive (reads only)."""
    prefix, etc, _unit, _state = _paths(ctx)
    done = sh(conn, watchdog_command(prefix, etc, "status --json"))
    if not done.ok:
        return StepResult.failed(
            f"no watchdog answer: {(done.stderr or done.stdout).strip()[:200]} "
            "(fab install-watchdog)"
        )
    status = json.loads(done.stdout)
    idle = status.get("idle_minutes")
    clock = (
        f"idle {idle:.0f}/{status['idle_limit_minutes']:g} min"
        if isinstance(idle, int | float)
        else "no idle clock"
    )
    return StepResult.ok(idle_status_message(status, clock), **status)


def idle_status_message(status: Mapping[str, Any], clock: str) -> str:
    """One line per node: the decision, then what a person must know (pure)."""
    parts = [f"{status['action']}: {status['reason']} ({clock})"]
    if status.get("power_off_refused_since"):
        parts.append(
            f"POWER-OFF REFUSED since {status['power_off_refused_since']}: "
            f"{status.get('unsynced_files', '?')} checkpoint file(s) not in the bucket"
        )
    elif status.get("unsynced_files"):
        parts.append(f"{status['unsynced_files']} checkpoint file(s) not yet in the bucket")
    parts.extend(str(p) for p in status.get("unreadable") or [])
    return "; ".join(parts)


def _watchdog_json(conn: Connection, ctx: HostContext, command: str) -> dict[str, Any] | str:
    """``watchdog.py COMMAND --json`` as root: its answer, or why there is none."""
    prefix, etc, _unit, _state = _paths(ctx)
    done = root_sh(conn, ctx, watchdog_command(prefix, etc, f"{command} --json"))
    try:
        out = json.loads(done.stdout)
    except ValueError:
        return (done.stderr or done.stdout).strip()[:300] or f"exit {done.exited}"
    return out if isinstance(out, dict) else f"not a JSON object: {done.stdout[:200]}"


@step("watchdog-running")
def watchdog_running_step(conn: Connection, ctx: HostContext) -> StepResult:
    """After a start: the installed watchdog's timer armed again, and its verdict (the
    files and config are left as ``fab install-watchdog`` wrote them)."""
    _prefix, etc, unit_dir, _state = _paths(ctx)
    if not sh(conn, f"test -f {shlex.quote(etc + '/watchdog.json')}").ok:
        return StepResult.failed(
            f"no watchdog on this node ({etc}/watchdog.json missing): fab install-watchdog"
        )
    armed = "timer not checked (--no-watchdog-timer)"
    if _watchdog_options(ctx).enable_timer:
        refused = arm_timer(conn, ctx, unit_dir)
        if refused is not None:
            return StepResult.failed(refused)
        armed = "timer active"
    status = _watchdog_json(conn, ctx, "status")
    if isinstance(status, str):
        return StepResult.failed(f"the watchdog does not answer: {status}")
    return StepResult.ok(f"{armed}; {status.get('action')}: {status.get('reason')}")


@step("save-scratch")
def save_scratch_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Before a stop: scratch to the bucket the watchdog's way (``watchdog.py sync``).
    Refused while a job runs; ``force`` (fab stop --force) only turns a refusal into a
    warning: the caller decides whether the node is stopped."""
    force = bool(ctx.options.force)
    status = _watchdog_json(conn, ctx, "status")
    if isinstance(status, str):
        return _unsaved(f"the watchdog does not answer ({status}; fab install-watchdog)", force)
    jobs = status.get("running_jobs") or 0
    if jobs and not force:
        return StepResult.failed(
            f"{jobs} job(s) running (fab jobs): fab cancel saves their last checkpoint; "
            "not stopped (--force stops it anyway)"
        )
    timeout = _watchdog_options(ctx).sync_timeout_s
    command = "sync" + (f" --timeout {timeout:g}" if timeout else "")
    synced = _watchdog_json(conn, ctx, command)
    if isinstance(synced, str):
        return _unsaved(f"scratch not saved: {synced}", force)
    if not synced.get("ok"):
        return _unsaved(f"scratch not saved: {synced.get('detail')}", force)
    uploaded = synced.get("uploaded") or 0
    note = f"scratch saved to the bucket ({synced.get('detail')})"
    if uploaded:
        return StepResult.changed(note, saved=True, uploaded=uploaded)
    return StepResult.ok(note, saved=True, uploaded=0)


def _unsaved(message: str, force: bool) -> StepResult:
    if force:
        return StepResult.skipped(f"{message}; stopping anyway (--force)", saved=False)
    return StepResult.failed(f"{message}; not stopped (--force stops it anyway)", saved=False)


@fleet_task(
    help={
        "bucket": "bucket that scratch checkpoints are saved to (default: the stack's)",
        "dry_run": "the watchdog decides and logs but never powers off",
        "watchdog_timer": "arm the systemd timer (--no-watchdog-timer: install the files only, "
        "for images and hosts without systemd; the same switch as fab setup's)",
        "prefix": f"where the watchdog goes on the node (default {PREFIX})",
        "etc": f"its config directory (default {ETC})",
        "unit_dir": f"systemd unit directory (default {UNIT_DIR})",
        "state_dir": f"lease and history directory (default {STATE_DIR})",
        "storage_endpoint": "bucket API URL instead of the cloud's own (private endpoints, tests)",
        "metadata_url": "instance metadata service URL instead of the cloud's own (tests)",
        "api_endpoint": "metrics and tagging API URL instead of the cloud's own (tests)",
    },
)
def install_watchdog(
    c: Context,
    fleet_args: FleetArgs,
    bucket: str = "",
    dry_run: bool = False,
    watchdog_timer: bool = True,
    prefix: str = "",
    etc: str = "",
    unit_dir: str = "",
    state_dir: str = "",
    storage_endpoint: str = "",
    metadata_url: str = "",
    api_endpoint: str = "",
) -> None:
    """Install (or update) the idle watchdog, prove it can save scratch to the bucket, and
    arm its systemd timer on every node."""
    options = WatchdogOptions(
        bucket=bucket,
        dry_run=dry_run,
        enable_timer=watchdog_timer,
        prefix=prefix,
        etc=etc,
        unit_dir=unit_dir,
        state_dir=state_dir,
        storage_endpoint_url=storage_endpoint,
        metadata_url=metadata_url,
        endpoint_url=api_endpoint,
    ).as_options()
    fleet_run(
        c,
        "install-watchdog",
        [install_watchdog_step],
        fleet_args,
        options=options,
    )


@fleet_task(
    help={
        "hours": "keep every node alive this many hours from now (at most 336)",
        "prefix": f"where the watchdog is on the node (default {PREFIX})",
        "etc": f"its config directory (default {ETC})",
    },
    # Checked before any connection: a lease of no time, or one past the cap.
    bounds={"hours": Bound(0, high=MAX_LEASE_HOURS, above=True, example="8")},
)
def keep_alive(
    c: Context,
    fleet_args: FleetArgs,
    hours: float = 2.0,
    prefix: str = "",
    etc: str = "",
) -> None:
    """Lease the nodes for N hours: the watchdog and the reaper leave them running."""
    fleet_run(
        c,
        "keep-alive",
        [keep_alive_step],
        fleet_args,
        options=WatchdogOptions(hours=float(hours), prefix=prefix, etc=etc).as_options(),
    )


def idle_table(report: FleetReport) -> list[Table]:
    table = Table(title="idle status")
    for column in ("node", "action", "idle clock", "lease until", "why"):
        table.add_column(column)
    for host in report.hosts:
        result = next((s.result for s in host.steps if s.name == "idle-status"), None)
        d = dict(result.details) if result is not None else {}
        idle = d.get("idle_minutes")
        clock = (
            f"{idle:.0f}/{d.get('idle_limit_minutes', 0):g} min"
            if isinstance(idle, int | float)
            else "-"
        )
        table.add_row(
            host.host.label,
            str(d.get("action", "?")),
            clock,
            str(d.get("lease_until") or "-"),
            str(d.get("reason") or (result.message if result else host.status)),
        )
    return [table]


@fleet_task(
    help={
        "prefix": f"where the watchdog is on the node (default {PREFIX})",
        "etc": f"its config directory (default {ETC})",
    }
)
def idle_status(
    c: Context,
    fleet_args: FleetArgs,
    prefix: str = "",
    etc: str = "",
) -> None:
    """Each node's idle clock and what keeps it alive (SSH, GPU use, job, lease, boot grace)."""
    fleet_run(
        c,
        "idle-status",
        [idle_status_step],
        fleet_args,
        options=WatchdogOptions(prefix=prefix, etc=etc).as_options(),
        readonly=True,
        render=idle_table,
    )
