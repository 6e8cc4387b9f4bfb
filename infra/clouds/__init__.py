"""One folder per cloud: everything that knows that cloud lives in infra/clouds/<name>/.

The list of clouds is the list of folders here that are packages (an ``__init__.py``):
nothing elsewhere keeps a table of cloud names. A folder holds ``catalog.toml`` (its types,
tiers, prices and facts, read by infra.catalog) and some of ``program.py`` (the Pulumi
resources), ``reaper.py`` (the scheduled teardown's client) and ``package.py`` (a
function package with its own layout); callers ask for the part they need by the cloud's
name and :func:`module` imports only that part, so this package stays free of any SDK and
of Pulumi (the reaper imports it).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

HOME = Path(__file__).resolve().parent


def names(having: str | None = None, home: Path | None = None) -> tuple[str, ...]:
    """The clouds, one per package folder of ``home`` (default: here), sorted; with
    ``having``, only those whose folder has that file (``"reaper.py"``, ``"catalog.toml"``)."""
    folders = (d for d in (home or HOME).iterdir() if (d / "__init__.py").is_file())
    return tuple(sorted(d.name for d in folders if having is None or (d / having).is_file()))


def module(name: str, part: str) -> ModuleType:
    """One cloud's module for ``part`` (its SDK imported only now); LookupError naming the
    clouds that have one when ``name`` has none."""
    if name not in names(f"{part}.py"):
        known = ", ".join(names(f"{part}.py"))
        raise LookupError(f"no cloud {name!r} with a {part}.py; known: {known}")
    return importlib.import_module(f"{__name__}.{name}.{part}")
