"""What train-check learnt about a node's venv, kept on this machine between launches.

train-check used to import torch on the node at every launch to read its version (2.3 to
4.7 s on a loaded machine, issue 24). The version is kept here instead, per node and venv,
with the venv's fingerprint as the node reported it (device, inode, size and mtime of its
python and of torch's version.py: a reinstall of torch or a new venv changes it). Each
launch still asks the node for the fingerprint, in the same round trip as the other
checks, and imports torch only when it differs from the one kept: a stale entry can never
pass for the venv that is there.

The node is named by its SSH host key (as this run verified it) and its address and port,
so a replaced node (a new host key) never reuses an entry. One JSON file,
``$GPUFLEET_CACHE_DIR`` or ``$XDG_CACHE_HOME/gpufleet`` or ``~/.cache/gpufleet``, written
whole and atomically; an unreadable file counts as empty.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "GPUFLEET_CACHE_DIR"
FILE = "train-check.json"
SCHEMA = "gpufleet.train-check/1"
MAX_ENTRIES = 512  # a bounded file: the oldest entries go first


@dataclass(frozen=True)
class Known:
    """A venv as it was last checked: its fingerprint and the torch version it held."""

    venv_id: str
    torch: str


def cache_file(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]) / FILE
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "gpufleet" / FILE


def entry_key(host_key: str, address: str, port: int, python: str) -> str:
    """One node (its host key, where it answers) and one venv (its python)."""
    return f"{host_key} {address}:{port} {python}"


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    entries = doc.get("entries")
    return entries if isinstance(entries, dict) else {}


def lookup(key: str, path: Path | None = None) -> Known | None:
    entry = _load(path or cache_file()).get(key)
    if not isinstance(entry, dict) or not entry.get("venv_id") or not entry.get("torch"):
        return None
    return Known(str(entry["venv_id"]), str(entry["torch"]))


def remember(found: Mapping[str, Known], path: Path | None = None) -> None:
    """Keep ``found`` (key -> what the node said now); never raises: a cache that cannot be
    written only costs the next launch a torch import."""
    path = path or cache_file()
    entries = _load(path)
    for key, known in found.items():
        entries.pop(key, None)  # re-inserted last: the newest stays longest
        entries[key] = {"venv_id": known.venv_id, "torch": known.torch}
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".train-check.")
        with os.fdopen(fd, "w") as f:
            json.dump({"schema": SCHEMA, "entries": kept}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        return
