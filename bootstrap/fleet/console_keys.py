"""SSH host keys from the instance's console output, so even the first connection is checked.

cloud-init prints the node's SSH host public keys to the serial console at first boot,
between ``-----BEGIN SSH HOST KEY KEYS-----`` and ``-----END SSH HOST KEY KEYS-----``. The
console output comes through the cloud's API (EC2 ``GetConsoleOutput``), an authenticated
channel that does not pass through the network path an impostor would sit on, so keys read
there can be pinned before we ever connect. Where they cannot be read (no credentials, the API
refuses, the console has not printed them yet) the run falls back to trust on first use and
says so.

``parse_console_host_keys`` is pure; ``with_console_host_keys`` adds the keys to the stack
outputs' nodes (``nodes[].host_keys``, the field bootstrap.fleet.hosts already pins).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
END = "-----END SSH HOST KEY KEYS-----"
KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
)
# Off in tests and wherever no cloud API should be asked ("0"); on by default.
ENV_SWITCH = "GPUFLEET_CONSOLE_HOST_KEYS"

Fetch = Callable[[str], str]  # instance id -> console text


def parse_console_host_keys(text: str) -> tuple[str, ...]:
    """The ``TYPE BASE64`` lines of the last complete host-key block in a console log.

    The last block wins: a node rebooted with new keys prints a newer block after the old one.
    Lines are taken only between the markers, and only for known key types, so kernel noise
    or a half-printed block never becomes a pinned key.
    """
    found: tuple[str, ...] = ()
    block: list[str] | None = None
    for raw in text.splitlines():
        # Serial consoles prefix lines with timestamps or "ci-info:"; the key starts at its type.
        line = raw.strip()
        if line.endswith(BEGIN):
            block = []
        elif line.endswith(END):
            if block:
                found = tuple(block)
            block = None
        elif block is not None:
            for kind in KEY_TYPES:
                at = line.find(kind + " ")
                if at >= 0:
                    parts = line[at:].split()
                    if len(parts) >= 2:
                        block.append(f"{parts[0]} {parts[1]}")
                    break
    return found


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def fetcher_for(provider: str, region: str) -> Fetch:
    """The console reader of this cloud's folder (infra/clouds/<cloud>/console.py);
    LookupError where the cloud has none."""
    from infra import clouds

    fetcher: Callable[[str], Fetch] = clouds.module(provider, "console").fetcher
    return fetcher(region)


def with_console_host_keys(
    outputs: Mapping[str, Any], fetch: Fetch
) -> tuple[dict[str, Any], list[str]]:
    """(outputs with ``host_keys`` filled from the console where missing, notes for people).

    A node that already lists host keys keeps them; a node whose console cannot be read or
    shows no keys yet is left as it was (trust on first use) with a note naming why.
    """
    notes: list[str] = []
    nodes = []
    for node in outputs.get("nodes") or []:
        node = dict(node)
        instance = node.get("instance_id")
        label = node.get("name") or instance or "?"
        if node.get("host_keys") or not isinstance(instance, str) or not instance:
            nodes.append(node)
            continue
        try:
            keys = parse_console_host_keys(fetch(instance))
        except Exception as exc:  # any API or credential failure: fall back, and say so
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            notes.append(f"{label}: console output unreadable ({reason}); trusting on first use")
        else:
            if keys:
                node["host_keys"] = list(keys)
                notes.append(f"{label}: {len(keys)} host key(s) pinned from the console output")
            else:
                notes.append(
                    f"{label}: no host keys in the console output yet; trusting on first use"
                )
        nodes.append(node)
    return {**outputs, "nodes": nodes}, notes
