"""How this package's tools start one another: ``python -m gpufleet_node.<tool>`` with the
folder above the package first on PYTHONPATH (where fab unpacked it), so a child finds the
package from any working directory; :func:`env_without` gives a user's script its own path
back. Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PACKAGE = __name__.rpartition(".")[0]  # "gpufleet_node"
# The folder that holds this package: on the node <prefix> or <jobs>/bin-<sha>.
ROOT = str(Path(__file__).resolve().parents[1])


def argv(python: str, tool: str, *args: str) -> list[str]:
    """``python -m gpufleet_node.<tool> ARGS``."""
    return [python, "-m", f"{PACKAGE}.{tool}", *args]


def _paths(env: Mapping[str, str]) -> list[str]:
    return [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != ROOT
    ]


def env_with(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this package's folder first on PYTHONPATH (the rest kept, in order)."""
    return {**env, "PYTHONPATH": os.pathsep.join([ROOT, *_paths(env)])}


def env_without(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without this package's folder on PYTHONPATH (none left: no PYTHONPATH)."""
    out = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    rest = _paths(env)
    if rest:
        out["PYTHONPATH"] = os.pathsep.join(rest)
    return out
