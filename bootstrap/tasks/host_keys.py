"""Tasks on the pinned SSH host keys themselves: show them, forget them.

Both work on this machine's known_hosts file only (see ``bootstrap.fleet.hostkeys``) and never
connect to a node. ``fab -H ubuntu@1.2.3.4 forget-host-key`` is what a host-key mismatch
message tells a person to run once they know the node was replaced.
"""

from __future__ import annotations

from collections.abc import Callable

from invoke import Context
from invoke.exceptions import Exit
from rich.table import Table

from bootstrap.fleet.cli import HOST_KEY_HELP, FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hostkeys import (
    Entry,
    HostKeyError,
    KnownHostsFile,
    PublicKey,
    forget_host,
    host_alias,
    keys_for,
)
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.runner import host_key_settings
from infra.render import literal_console

_HELP = {"known_hosts": HOST_KEY_HELP["known_hosts"]}
# These tasks read and write this machine's known_hosts file only: they never connect, so
# they take neither --json nor --connect-timeout (nor the host-key options of connecting tasks).
_SHARED = ("stack", "inventory")


def _file(c: Context, fleet_args: FleetArgs, known_hosts: str) -> tuple[Fleet, KnownHostsFile]:
    fleet = resolve_fleet(c, fleet_args, known_hosts=known_hosts)
    return fleet, KnownHostsFile(host_key_settings(c.config).path)


def _forget(alias: str) -> Callable[[list[Entry]], tuple[list[Entry], list[PublicKey]]]:
    return lambda entries: forget_host(entries, alias)


# "SHA256:" and 43 base64 characters, as ssh-keygen -l prints an ed25519/RSA key's
FINGERPRINT_WIDTH = 50


@fleet_task(shared=_SHARED, host_key_options=False, help=_HELP)
def forget_host_key(c: Context, fleet_args: FleetArgs, known_hosts: str = "") -> None:
    """Forget the pinned SSH host key of each host, so the next connection records a new one."""
    fleet, store = _file(c, fleet_args, known_hosts)
    console = literal_console(soft_wrap=True)
    for host in fleet.hosts:
        alias = host_alias(host.address, host.port)
        try:
            removed = store.update(_forget(alias))
        except HostKeyError as exc:
            raise Exit(f"gpufleet: {exc.message}", code=2) from None
        if removed:
            keys = ", ".join(f"{k.fingerprint} ({k.key_type})" for k in removed)
            console.print(
                f"{alias}: forgot {keys} from {store.path}; "
                "the next connection records the key the host presents"
            )
        else:
            console.print(f"{alias}: no key pinned in {store.path}")


@fleet_task(shared=_SHARED, host_key_options=False, help=_HELP)
def host_keys(c: Context, fleet_args: FleetArgs, known_hosts: str = "") -> None:
    """Show the pinned SSH host key fingerprints of each host (to compare out of band)."""
    fleet, store = _file(c, fleet_args, known_hosts)
    try:
        entries = store.read()
    except HostKeyError as exc:
        raise Exit(f"gpufleet: {exc.message}", code=2) from None
    table = Table(title=f"pinned host keys in {store.path}")
    for column in ("host", "name", "type"):
        table.add_column(column, overflow="fold")
    # a fingerprint is compared character by character: never cut, never wrapped
    table.add_column("fingerprint", no_wrap=True, min_width=FINGERPRINT_WIDTH)
    for host in fleet.hosts:
        alias = host_alias(host.address, host.port)
        keys = keys_for(entries, alias)
        if not keys:
            table.add_row(alias, host.name or "", "", "(none: recorded on first connection)")
        for k in keys:
            table.add_row(alias, host.name or "", k.key_type, k.fingerprint)
    literal_console().print(table)
