"""One folder per cloud: everything that knows that cloud lives in infra/clouds/<name>/.

The list of clouds is the list of folders here that are packages (an ``__init__.py``):
nothing elsewhere keeps a table of cloud names. A folder holds some of ``program.py`` (the
Pulumi resources), ``reaper.py`` (the scheduled teardown's client) and ``package.py`` (a
function package with its own layout); callers ask for the part they need by the cloud's
name and :func:`module` imports only that part, so this package stays free of any SDK and
of Pulumi (the reaper imports it).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

HOME = Path(__file__).resolve().parent


def names(part: str | None = None) -> tuple[str, ...]:
    """The clouds, one per package folder here (sorted); with ``part``, only the clouds
    whose folder has that module (``"reaper"``: those with a reaper.py)."""
    return tuple(
        sorted(
            d.name
            for d in HOME.iterdir()
            if (d / "__init__.py").is_file() and (part is None or (d / f"{part}.py").is_file())
        )
    )


def module(name: str, part: str) -> ModuleType:
    """One cloud's module for ``part`` (its SDK imported only now); LookupError naming the
    clouds that have one when ``name`` has none."""
    if name not in names(part):
        known = ", ".join(names(part))
        raise LookupError(f"no cloud {name!r} with a {part}.py; known: {known}")
    return importlib.import_module(f"{__name__}.{name}.{part}")
