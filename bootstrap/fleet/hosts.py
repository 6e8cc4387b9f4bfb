"""Which hosts a task runs on: stack outputs, an inventory file, or ``-H``.

Order of precedence (closest to the person typing wins):

1. ``-H user@host:port,...`` on the ``fab`` command line: exactly these hosts. Stack metadata
   (tier, scratch path) is still read when ``--inventory`` or ``--stack`` is given explicitly.
2. ``--inventory FILE`` (or ``GPUFLEET_INVENTORY``): a JSON file shaped like the stack outputs,
   e.g. ``pulumi stack output --json > hosts.json`` or a hand-written one for any SSH hosts.
3. The Pulumi stack: ``pulumi stack output --json --stack S`` with S from ``--stack``,
   ``PULUMI_STACK``, or the currently selected stack.

Beyond the stack outputs contract, an inventory may carry ``ssh_port``, ``ssh_key`` and, per
node, ``host`` / ``ssh_port`` / ``ssh_user`` (for bastions, port forwards and test sshds).
A node may also carry ``host_keys``: its SSH host public keys as ``"TYPE BASE64 [COMMENT]"``
strings (the ``/etc/ssh/ssh_host_*_key.pub`` lines, e.g. from the instance's console output);
they are pinned before the first connection (see ``bootstrap.fleet.hostkeys``).
Everything here except :func:`pulumi_stack_outputs` is pure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bootstrap.fleet.api import Host, HostContext, Options, ScratchSpec, TierInfo
from bootstrap.fleet.hostkeys import PublicKey

INVENTORY_ENV = "GPUFLEET_INVENTORY"


class HostDiscoveryError(Exception):
    """No usable host list; the message says how to give one."""


@dataclass(frozen=True)
class Fleet:
    """The hosts of one run plus what the stack says about them."""

    hosts: tuple[Host, ...]
    stack: str | None = None
    provider: str | None = None
    tier: TierInfo = field(default_factory=TierInfo)
    scratch: ScratchSpec = field(default_factory=ScratchSpec)
    source: str = ""  # where the list came from, for messages
    # address -> the node's SSH host keys from the stack outputs (optional nodes[].host_keys)
    host_keys: Mapping[str, tuple[PublicKey, ...]] = field(default_factory=dict)
    # The stack outputs as read (bucket, region, idle, ... beyond what the fields above keep)
    outputs: Mapping[str, Any] = field(default_factory=dict)

    def context(
        self, host: Host, options: Options, scratch: ScratchSpec | None = None
    ) -> HostContext:
        """What a step knows of ``host`` in this fleet: ``options``, the fleet's tier, stack,
        outputs and scratch (``scratch`` instead where given)."""
        return HostContext(
            host=host,
            options=options,
            tier=self.tier,
            scratch=self.scratch if scratch is None else scratch,
            stack=self.stack,
            outputs=self.outputs,
        )


def _require(mapping: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in mapping:
        raise HostDiscoveryError(f"{where}: missing {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise HostDiscoveryError(
            f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def _optional(mapping: Mapping[str, Any], key: str, where: str, kind: Any, what: str) -> Any:
    """mapping[key] when it is present and not null, checked against `kind`."""
    value = mapping.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise HostDiscoveryError(f"{where}.{key}: expected {what}, got {value!r}")
    return value


def _object(mapping: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = mapping.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise HostDiscoveryError(f"{where}.{key}: expected an object, got {value!r}")
    return value


def _plain_path(value: str, where: str) -> str:
    """An absolute path in normal form: remote commands mount and sync exactly this path."""
    parts = value.split("/")[1:]
    if (
        not value.startswith("/")
        or value == "/"
        or any(p in ("", ".", "..") for p in parts)
        or not value.isprintable()
    ):
        raise HostDiscoveryError(
            f"{where}: {value!r} is not a plain absolute path (no //, ., .. or trailing /), "
            "e.g. /scratch"
        )
    return value


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise HostDiscoveryError(f"{where}: port must be an integer, got {value!r}")
    try:
        port = int(value)
    except ValueError:
        raise HostDiscoveryError(f"{where}: port must be an integer, got {value!r}") from None
    if not 1 <= port <= 65535:
        raise HostDiscoveryError(f"{where}: port {port} is outside 1-65535")
    return port


def _host_keys(value: Any, where: str) -> tuple[PublicKey, ...]:
    if not isinstance(value, list):
        raise HostDiscoveryError(
            f"{where}: expected a list of 'TYPE BASE64' strings, got {type(value).__name__}"
        )
    keys: list[PublicKey] = []
    for j, line in enumerate(value):
        if not isinstance(line, str):
            raise HostDiscoveryError(f"{where}[{j}]: expected a 'TYPE BASE64' string, got {line!r}")
        try:
            keys.append(PublicKey.parse(line))
        except ValueError as exc:
            raise HostDiscoveryError(
                f"{where}[{j}]: {exc} (copy the line from /etc/ssh/ssh_host_*_key.pub)"
            ) from None
    return tuple(keys)


def parse_stack_outputs(outputs: Mapping[str, Any], *, source: str = "stack outputs") -> Fleet:
    """Hosts and metadata from stack outputs (or an inventory file of the same shape)."""
    if not isinstance(outputs, Mapping):
        raise HostDiscoveryError(f"{source}: expected a JSON object, got {type(outputs).__name__}")
    nodes = _require(outputs, "nodes", source, list)
    if not nodes:
        raise HostDiscoveryError(
            f"{source}: 'nodes' is empty; is the stack deployed (pulumi up) and running?"
        )
    default_user = _optional(outputs, "ssh_user", source, str, "a user name")
    for name_key in ("stack", "provider"):
        _optional(outputs, name_key, source, str, "a name")
    default_port = _port(outputs.get("ssh_port", 22), f"{source}.ssh_port")
    key = outputs.get("ssh_key")
    if key is not None and not isinstance(key, str):
        raise HostDiscoveryError(f"{source}.ssh_key: expected a path string, got {key!r}")
    hosts: list[Host] = []
    host_keys: dict[str, tuple[PublicKey, ...]] = {}
    for i, node in enumerate(nodes):
        where = f"{source}.nodes[{i}]"
        if not isinstance(node, Mapping):
            raise HostDiscoveryError(f"{where}: expected an object, got {node!r}")
        # Prefer an explicit host, then the public address; a private-only node is reachable
        # from inside the VPC (or through a bastion configured in ~/.ssh/config).
        address = node.get("host") or node.get("public_ip") or node.get("private_ip")
        if not address or not isinstance(address, str):
            name = node.get("name", i)
            raise HostDiscoveryError(
                f"{where} ({name}): no address (host, public_ip or private_ip); "
                "a stopped instance has no public IP: start it, or pass -H"
            )
        for text_key in ("ssh_user", "name", "role"):
            _optional(node, text_key, where, str, "a string")
        if node.get("host_keys") is not None:
            keys = _host_keys(node["host_keys"], f"{where}.host_keys")
            # Filed under every address of the node: -H may name it by any of them.
            for addr in (node.get("host"), node.get("public_ip"), node.get("private_ip")):
                if isinstance(addr, str) and addr and keys:
                    host_keys[addr] = keys
        hosts.append(
            Host(
                address=address,
                user=node.get("ssh_user") or default_user,
                port=_port(node.get("ssh_port", default_port), f"{where}.ssh_port"),
                name=node.get("name"),
                role=node.get("role"),
                key_filename=key,
            )
        )
    tier_raw = _object(outputs, "tier", source)
    tier_where = f"{source}.tier"
    tier = TierInfo(
        name=_optional(tier_raw, "name", tier_where, str, "a tier name"),
        gpu_model=_optional(tier_raw, "gpu_model", tier_where, str, "a GPU model name"),
        gpu_count=_optional(tier_raw, "gpu_count", tier_where, int, "a whole number"),
        nvswitch=bool(_optional(tier_raw, "nvswitch", tier_where, bool, "true or false")),
        efa=bool(_optional(tier_raw, "efa", tier_where, bool, "true or false")),
        infiniband=bool(_optional(tier_raw, "infiniband", tier_where, bool, "true or false")),
    )
    scratch_raw = _object(outputs, "scratch", source)
    scratch_where = f"{source}.scratch"
    path = _optional(scratch_raw, "path", scratch_where, str, "a path") or "/scratch"
    scratch = ScratchSpec(
        path=_plain_path(path, f"{scratch_where}.path"),
        kind=_optional(scratch_raw, "kind", scratch_where, str, "'nvme' or 'disk'") or "nvme",
        devices=_optional(scratch_raw, "devices", scratch_where, int, "a whole number"),
        size_gb=_optional(scratch_raw, "size_gb", scratch_where, int, "a whole number of GB"),
    )
    if scratch.kind not in ("nvme", "disk"):
        raise HostDiscoveryError(
            f"{source}.scratch.kind: {scratch.kind!r} is not one of 'nvme', 'disk'"
        )
    # Head first, so multi-node output reads top-down the way people think of the cluster.
    hosts.sort(key=lambda h: (h.role != "head", h.name or h.address))
    return Fleet(
        hosts=tuple(hosts),
        stack=outputs.get("stack"),
        provider=outputs.get("provider"),
        tier=tier,
        scratch=scratch,
        source=source,
        host_keys=host_keys,
        outputs=MappingProxyType(dict(outputs)),
    )


def parse_host_string(value: str, *, default_user: str | None = None) -> Host:
    """``[user@]host[:port]`` (IPv6 as ``[::1]:2222``), as accepted by ``fab -H``."""
    text = value.strip()
    if not text:
        raise HostDiscoveryError("empty host in -H")
    user = default_user
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not user:
            raise HostDiscoveryError(f"-H {value!r}: empty user before '@'")
    port = 22
    if text.startswith("["):
        address, sep, rest = text[1:].partition("]")
        if not sep:
            raise HostDiscoveryError(f"-H {value!r}: unclosed '[' in an IPv6 address")
        if rest:
            if not rest.startswith(":"):
                raise HostDiscoveryError(f"-H {value!r}: expected ':port' after ']'")
            port = _port(rest[1:], f"-H {value!r}")
    elif text.count(":") == 1:
        address, _, port_text = text.partition(":")
        port = _port(port_text, f"-H {value!r}")
    else:
        address = text  # a bare IPv6 address has several colons and no port
    if not address:
        raise HostDiscoveryError(f"-H {value!r}: no host name")
    return Host(address=address, user=user, port=port)


def load_inventory(path: str | os.PathLike[str]) -> Fleet:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostDiscoveryError(
            f"inventory {p} does not exist; write one with "
            f"`pulumi stack output --json --stack STACK > {p}`"
        ) from None
    except IsADirectoryError:
        raise HostDiscoveryError(f"inventory {p} is a directory, not a JSON file") from None
    except UnicodeDecodeError as exc:
        raise HostDiscoveryError(
            f"inventory {p} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise HostDiscoveryError(f"inventory {p!s:.80} cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise HostDiscoveryError(f"inventory {p} is not valid JSON: {exc}") from None
    return parse_stack_outputs(data, source=f"inventory {p}")


def pulumi_stack_outputs(stack: str | None, *, cwd: str | None = None) -> dict[str, Any]:
    """``pulumi stack output --json`` for ``stack`` (None: the selected stack)."""
    exe = shutil.which("pulumi")
    if exe is None:
        raise HostDiscoveryError(
            "the pulumi CLI is not installed, so the stack's hosts cannot be read. "
            "Give the hosts another way: --inventory hosts.json (the stack outputs as JSON, "
            f"also via {INVENTORY_ENV}) or -H user@host[:port]"
        )
    cmd = [exe, "stack", "output", "--json"]
    if stack:
        cmd += ["--stack", stack]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False, timeout=120)
    if proc.returncode != 0:
        which = f"stack {stack!r}" if stack else "the current stack"
        raise HostDiscoveryError(
            f"`{' '.join(cmd[1:])}` failed for {which}: {proc.stderr.strip() or proc.stdout}"
            " (select a stack with --stack or PULUMI_STACK, or pass --inventory / -H)"
        )
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise HostDiscoveryError(f"pulumi printed something that is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HostDiscoveryError("pulumi stack output --json did not print an object")
    return data


def discover(
    *,
    cli_hosts: Sequence[str] = (),
    inventory: str | None = None,
    stack: str | None = None,
    env: Mapping[str, str] | None = None,
    key_filename: str | None = None,
    default_user: str | None = None,
) -> Fleet:
    """Resolve the host list with the precedence described in the module docstring."""
    env = os.environ if env is None else env
    inventory = inventory or env.get(INVENTORY_ENV) or None
    meta: Fleet | None = None
    if inventory:
        meta = load_inventory(inventory)
    elif not cli_hosts:
        stack = stack or env.get("PULUMI_STACK") or None
        meta = parse_stack_outputs(
            pulumi_stack_outputs(stack), source=f"stack {stack or '(current)'}"
        )
    elif stack:
        # Only an explicit --stack next to -H reads the stack (for its scratch/tier metadata);
        # a PULUMI_STACK left in the environment must not make `fab -H` need the pulumi CLI.
        meta = parse_stack_outputs(pulumi_stack_outputs(stack), source=f"stack {stack}")
    if cli_hosts:
        user = default_user or (meta.hosts[0].user if meta and meta.hosts else None)
        hosts = tuple(parse_host_string(h, default_user=user) for h in cli_hosts)
        fleet = dataclasses.replace(meta or Fleet(hosts=()), hosts=hosts, source="-H")
    else:
        assert meta is not None
        fleet = meta
    if key_filename:
        # -i on the command line beats the inventory's ssh_key.
        fleet = dataclasses.replace(
            fleet, hosts=tuple(_with_key(h, key_filename) for h in fleet.hosts)
        )
    if not fleet.hosts:
        raise HostDiscoveryError("no hosts to run on")
    return fleet


def _with_key(host: Host, key: str) -> Host:
    return Host(
        address=host.address,
        user=host.user,
        port=host.port,
        name=host.name,
        role=host.role,
        key_filename=key,
    )
