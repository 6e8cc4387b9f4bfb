"""A provider SDK's subpackage, imported one name at a time instead of all at once.

Pulumi's generated Python SDKs (pulumi_aws, pulumi_azure_native, pulumi_alicloud,
tencentcloud_iac_pulumi) load each subpackage lazily: ``aws.ec2`` is a placeholder module
until its first attribute is read. That first read then runs ``ec2/__init__.py``, which is
one ``from .<module> import *`` per resource and function of the service, ~400 of them for
ec2: about 1 s of CPU to declare the dozen resources a stack uses. Planning an AWS stack
spent more time there than anywhere else.

:func:`narrow` makes each subpackage of an SDK that is still such a placeholder find a name,
when it is first read, in the one module of the subpackage that defines it, and import only
that module: ``aws.ec2.Instance`` imports ``pulumi_aws.ec2.instance`` (which itself imports
the shared ``_inputs``, ``_enums`` and ``outputs`` modules it needs), not the other ~400.

It changes when modules are imported, never which object a name is:

- Only a subpackage whose ``__init__.py`` is exactly the generated form is narrowed: its
  three header lines, ``from .<module> import *`` lines and ``from . import <module>``
  lines, nothing else (anything else might be a side effect that must run). Any other
  subpackage loads whole, as before.
- A name is taken from a module only if that module lists it in ``__all__`` (what its star
  import binds). The module is guessed from the name as the SDK's code generator names
  files: ``RouteTableAssociation`` and ``RouteTableAssociationArgs`` in
  ``route_table_association``, ``get_parameter_output`` in ``get_parameter``, nested input
  types in ``_inputs``, enums in ``_enums``.
- A name not found that way (or any dunder) runs the subpackage's real ``__init__.py`` in
  the same module object, as its first read would have without this: the whole subpackage,
  every name bound as Python binds it. The modules imported before are the ones it
  imports again (``sys.modules``), so each name is the same object either way;
  tests/infra/test_clouds_sdk_import.py checks that for every name the programs read.

This module imports no SDK and no Pulumi: it works on the module objects it is given.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

# The lines of a generated subpackage __init__.py before its imports (pulumi-language-python)
_HEADER = frozenset({"import builtins as _builtins", "from .. import _utilities", "import typing"})
_STAR = re.compile(r"from \.(\w+) import \*")
_PLAIN = re.compile(r"from \. import (\w+)")
# CamelCase -> snake_case as the generator names a resource's file: a boundary before an
# upper-case letter that follows a lower-case letter or digit, and inside an acronym before
# its last letter when a lower-case one follows (PublicIPAddress -> public_ip_address).
_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

_LOCK = threading.RLock()
# Per narrowed subpackage (by its full name): None until its __init__.py has been read; then
# (the star-imported modules in their order, the plainly imported ones), or False when the
# file is not the generated form (the subpackage is loaded whole at its first read).
_LAYOUT: dict[str, tuple[tuple[str, ...], frozenset[str]] | bool | None] = {}
# What was resolved narrowly, and which subpackages had to load whole (for the tests)
resolved: dict[tuple[str, str], Any] = {}
loaded_whole: list[str] = []


def layout(init_source: str) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """(star-imported modules in order, plainly imported modules) of a generated subpackage
    ``__init__.py``; None when a line of it is anything else."""
    star: list[str] = []
    plain: set[str] = set()
    for raw in init_source.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line in _HEADER:
            continue
        if m := _STAR.fullmatch(line):
            star.append(m[1])
        elif m := _PLAIN.fullmatch(line):
            plain.add(m[1])
        else:
            return None
    return tuple(star), frozenset(plain)


def module_guesses(name: str) -> list[str]:
    """The modules the generator would put ``name`` in, most likely first."""
    if name[:1].islower():  # a function: get_x and get_x_output live in get_x
        return [name.removesuffix("_output"), name] if name.endswith("_output") else [name]
    guesses = [_WORD.sub("_", name).lower()]
    for suffix in ("ArgsDict", "Args"):  # a resource's own args class sits beside it
        if name.endswith(suffix) and len(name) > len(suffix):
            guesses.append(_WORD.sub("_", name[: -len(suffix)]).lower())
            break
    return [*guesses, "_enums", "_inputs"]


class NarrowedPackage(types.ModuleType):
    """A generated SDK subpackage whose names are imported one module at a time.

    Python calls ``__getattr__`` only for a name the module does not have yet: each name
    found is set on the module, so it is looked up once."""

    def __getattr__(self, name: str) -> Any:
        with _LOCK:
            if type(self) is not NarrowedPackage:  # another thread loaded it whole meanwhile
                return types.ModuleType.__getattribute__(self, name)
            found = _find(self, name)
            if found is not _MISSING:
                types.ModuleType.__setattr__(self, name, found)
                resolved[(self.__name__, name)] = found
                _rebind_shadowed(self)
                return found
            return _load_whole(self, name)


_MISSING = object()


def _find(pkg: types.ModuleType, name: str) -> Any:
    if name.startswith("__"):
        return _MISSING
    full = pkg.__name__
    shape = _LAYOUT.get(full)
    if shape is None:
        spec = pkg.__spec__
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        try:
            text = origin.read_text(encoding="utf-8") if origin is not None else ""
        except OSError:
            text = ""
        shape = _LAYOUT[full] = layout(text) or False
    if shape is False or not isinstance(shape, tuple):
        return _MISSING
    star, plain = shape
    if name in plain:
        return importlib.import_module(f"{full}.{name}")
    for guess in module_guesses(name):
        if guess not in star:
            continue
        mod = importlib.import_module(f"{full}.{guess}")
        exported = getattr(mod, "__all__", None)
        if exported is not None and name in exported:
            return getattr(mod, name)
    return _MISSING


def _rebind_shadowed(pkg: types.ModuleType) -> None:
    """Importing ``pkg.get_x`` binds the module itself as ``pkg.get_x`` (Python sets each
    submodule on its parent); the whole ``__init__.py`` then rebinds that name to the
    function ``get_x`` its star import exports. Do the same for every star-imported module
    loaded so far, so that ``aws.ec2.get_x`` is the function, not its module, after
    ``aws.ec2.get_x_output`` was read."""
    shape = _LAYOUT.get(pkg.__name__)
    if not isinstance(shape, tuple):
        return
    ns = types.ModuleType.__getattribute__(pkg, "__dict__")
    for child in shape[0]:
        mod = ns.get(child)
        if not isinstance(mod, types.ModuleType) or child in shape[1]:
            continue
        if mod is sys.modules.get(f"{pkg.__name__}.{child}") and child in getattr(
            mod, "__all__", ()
        ):
            value = getattr(mod, child)
            ns[child] = value
            resolved[(pkg.__name__, child)] = value


def _load_whole(pkg: types.ModuleType, name: str) -> Any:
    """Run the subpackage's own ``__init__.py`` in it (what its first read would have done),
    then read ``name`` as Python would."""
    full = pkg.__name__
    pkg.__class__ = types.ModuleType
    _LAYOUT.pop(full, None)
    loaded_whole.append(full)
    spec = pkg.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(pkg)
    return types.ModuleType.__getattribute__(pkg, name)


def _placeholder(value: object, full: str) -> bool:
    """Whether ``value`` is the subpackage ``full`` not loaded yet: a module of a lazy type
    whose code has not run (exec gives a module's namespace __builtins__), loaded from
    source by the standard file loader. Read without triggering a lazy load."""
    if not isinstance(value, types.ModuleType) or type(value) is types.ModuleType:
        return False
    if type(value) is NarrowedPackage:
        return False
    ns = types.ModuleType.__getattribute__(value, "__dict__")
    spec = ns.get("__spec__")
    return (
        ns.get("__name__") == full
        and "__builtins__" not in ns
        and "__path__" in ns
        and spec is not None
        and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
        and sys.modules.get(full) is value
    )


def narrow(sdk: types.ModuleType) -> int:
    """Narrow every subpackage of the imported SDK ``sdk`` that is still a lazy placeholder
    (one already loaded, or not of the generated form, is left as it is). Returns how many.
    Idempotent; changes no object any name of the SDK is bound to."""
    count = 0
    with _LOCK:
        for attr, value in list(vars(sdk).items()):
            full = f"{sdk.__name__}.{attr}"
            if _placeholder(value, full):
                value.__class__ = NarrowedPackage
                _LAYOUT[full] = None
                count += 1
    return count
