"""Fabric tasks that turn freshly provisioned nodes into working GPU training machines.

- :mod:`bootstrap.fleet`: SSH and fleet plumbing (the step API, hosts, host keys, the
  parallel runner, shell helpers, the ``fleet_task`` decorator);
- :mod:`bootstrap.tasks`: one module per task family (``setup``, ``driver``, ``pytorch``,
  ``scratch``, ``watchdog``, ``status``, ``verify``, ``train``, ``host_keys``);
- :mod:`bootstrap.verify`: verify-gpu's judgement, one registered function per check;
- the node side is the top-level package ``gpufleet_node`` (shipped to and run on the node;
  it imports nothing from here), shipped by :mod:`bootstrap.fleet.node_package`.

``ns`` is the task collection that the repo's ``fabfile.py`` exposes to ``fab``: every
``@task`` / ``@fleet_task`` *defined in* a module of :mod:`bootstrap.tasks` becomes a
top-level task (``install_driver`` is typed ``install-driver``). Adding a task family is
adding a module there; nothing lists the modules by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from invoke import Collection, Task

TASKS_PACKAGE = "bootstrap.tasks"


def task_modules(package: str = TASKS_PACKAGE) -> Iterator[ModuleType]:
    """Every module of ``package``, in name order (private ``_name`` modules left out)."""
    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{package}.{info.name}")


def tasks_defined_in(module: ModuleType) -> Iterable[Task[Any]]:
    for value in vars(module).values():
        # Only tasks defined here: a module importing another's task must not re-register it.
        if isinstance(value, Task) and getattr(value.body, "__module__", None) == module.__name__:
            yield value


def build_collection(package: str = TASKS_PACKAGE) -> Collection:
    ns = Collection()
    where: dict[str, str] = {}
    for module in task_modules(package):
        for t in tasks_defined_in(module):
            if t.name in where:
                # invoke would keep the last one silently; a task must have one home.
                raise ValueError(
                    f"task {t.name!r} is defined in both {where[t.name]} and {module.__name__}"
                )
            where[t.name] = module.__name__
            ns.add_task(t)
    return ns


ns = build_collection()
