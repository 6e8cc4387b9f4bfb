"""One folder per cloud: everything that knows that cloud lives in infra/clouds/<name>/.

The list of clouds is the list of subpackages here (folders with an ``__init__.py`` on
this package's path): nothing elsewhere keeps a table of cloud names. A folder holds
``catalog.toml`` (its types, tiers, prices and facts, read by infra.catalog) and some of
``program.py`` (the Pulumi resources), ``reaper.py`` (the scheduled teardown's client),
``prices.py`` (live prices), ``mocks.py`` (what the offline plan's Pulumi mocks answer for
its resource types and invokes), ``rules.py`` (what the policy pack knows about its
resource types) and ``package.py`` (a function package with its own layout);
callers ask for the part they need by the cloud's name and :func:`module` imports only
that part, so this package stays free of any SDK and of Pulumi (the reaper imports it).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

HOME = Path(__file__).resolve().parent


def folders(having: str | None = None, homes: Iterable[Path] | None = None) -> dict[str, Path]:
    """Each cloud's folder by name, sorted: the package folders of ``homes`` (default: this
    package's path, where a test may add a folder of its own); with ``having``, only those
    that have that file (``"reaper.py"``, ``"catalog.toml"``). The first folder of a name
    wins, as it does for the import."""
    found: dict[str, Path] = {}
    for home in homes if homes is not None else [Path(p) for p in __path__]:
        for d in sorted(Path(home).iterdir()):
            if (d / "__init__.py").is_file() and (having is None or (d / having).is_file()):
                found.setdefault(d.name, d)
    return dict(sorted(found.items()))


def names(having: str | None = None, homes: Iterable[Path] | None = None) -> tuple[str, ...]:
    """The clouds' names (sorted), as :func:`folders` finds them."""
    return tuple(folders(having, homes))


def module(name: str, part: str) -> ModuleType:
    """One cloud's module for ``part`` (its SDK imported only now); LookupError naming the
    clouds that have one when ``name`` has none."""
    if name not in names(f"{part}.py"):
        known = ", ".join(names(f"{part}.py"))
        raise LookupError(f"no cloud {name!r} with a {part}.py; known: {known}")
    return importlib.import_module(f"{__name__}.{name}.{part}")
