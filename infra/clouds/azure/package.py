"""The Azure function package: the Functions host's layout around the reaper's code.

Azure Functions (Python, v2 model) runs ``function_app.py`` from the package root with
``host.json`` beside it; dependencies deployed with the package live in
``.python_packages/lib/site-packages`` (the folder the Python worker puts on sys.path for
run-from-package deployments). The runtime ships no Azure SDK, so that folder carries the
closure of :data:`AZURE_SDKS`, taken from this environment's installed distributions.

Every file of that closure is pure Python (azure-mgmt-compute, azure-monitor-query,
azure-core, azure-functions and their helpers): the same bytes import on any CPython the
Functions runtime offers for them (3.10 to 3.12). Compiled speed-ups with a pure fallback in
the same package are left out; any other compiled file refuses the build, so a future pin
that needs a runtime-matched wheel fails here instead of in the cloud. The credential is
the reaper's own stdlib managed-identity client (reaper.py), which keeps msal and the
compiled ``cryptography`` out.

Only the zip build imports this module (it is not in the function).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The reaper's dependency walk (handler.sdk_closure), handed in by the zip build: this module
# does not import the handler, which finds this one by its folder.
Closure = Callable[[tuple[str, ...]], list[Any]]

AZURE_SDKS = ("azure-mgmt-compute", "azure-monitor-query", "azure-functions")
SITE = ".python_packages/lib/site-packages"
ENTRY = "function_app.py"
# Compiled accelerators whose package falls back to pure Python without them.
PURE_FALLBACK = frozenset({"charset-normalizer", "markupsafe"})
_COMPILED = (".so", ".pyd", ".dylib")
_SKIP_DIST_INFO = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})

HOST_JSON = {
    "version": "2.0",
    # The reaper itself bounds its calls; the host's limit only catches a hung run.
    "functionTimeout": "00:09:00",
    "logging": {"logLevel": {"default": "Information"}},
    "extensionBundle": {
        "id": "Microsoft.Azure.Functions.ExtensionBundle",
        "version": "[4.*, 5.0.0)",
    },
}


class PackageError(RuntimeError):
    """The Azure package cannot be built from this environment."""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(sdk_closure: Closure, roots: tuple[str, ...] = AZURE_SDKS) -> list[Any]:
    """The installed distributions the roots need: the same walk as every vendored zip
    (handler.sdk_closure), a missing one a PackageError."""
    try:
        return sdk_closure(roots)
    except FileNotFoundError as exc:
        raise PackageError(str(exc)) from None


def site_files(dists: list[Any]) -> list[tuple[str, bytes]]:
    """The distributions' files under SITE; PackageError on a compiled file without a
    pure fallback."""
    out: list[tuple[str, bytes]] = []
    compiled: list[str] = []
    for dist in dists:
        key = _key(dist.metadata["Name"])
        for f in dist.files or []:
            name = str(f).replace("\\", "/")
            parts = name.split("/")
            if parts[0] == ".." or "__pycache__" in parts or name.endswith((".pyc", ".pth")):
                continue
            if parts[0].endswith(".dist-info") and parts[-1] in _SKIP_DIST_INFO:
                continue
            if name.endswith(_COMPILED):
                if key in PURE_FALLBACK:
                    continue
                compiled.append(f"{key}: {name}")
                continue
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                out.append((f"{SITE}/{name}", path.read_bytes()))
    if compiled:
        raise PackageError(
            "the Azure package must be pure Python, these need a runtime-matched wheel: "
            + ", ".join(compiled[:5])
        )
    return out


def entries(common: list[tuple[str, bytes]], sdk_closure: Closure) -> list[tuple[str, bytes]]:
    """The reaper's code and table (``common``) plus the Functions host's files and the
    vendored SDKs."""
    here = Path(__file__).resolve().parent
    out = list(common)
    out.append((ENTRY, (here / ENTRY).read_bytes()))
    out.append(("host.json", (json.dumps(HOST_JSON, indent=2) + "\n").encode()))
    out += site_files(closure(sdk_closure))
    return out
