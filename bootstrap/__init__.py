"""Fabric tasks that turn freshly provisioned nodes into working GPU training machines.

``ns`` is the task collection that the repo's ``fabfile.py`` exposes to ``fab``. Tasks are
collected from the modules below: every ``@task`` / ``@fleet_task`` *defined in* a listed
module becomes a top-level task (``install_driver`` is typed ``install-driver``).

Adding a module: write ``bootstrap/<concern>.py`` with its steps and tasks (see
``bootstrap.api`` and ``bootstrap.cli``) and add its name to ``TASK_MODULES``.
``OPTIONAL_MODULES`` are picked up when their file exists and skipped silently when it does
not, so the watchdog and GPU verification can land independently.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from invoke import Collection, Task

TASK_MODULES: tuple[str, ...] = (
    "bootstrap.driver",
    "bootstrap.pytorch",
    "bootstrap.scratch",
    "bootstrap.status",
    "bootstrap.setup",
    "bootstrap.hostkey_tasks",
)
# Written by other work streams; absent modules are simply not offered as tasks.
OPTIONAL_MODULES: tuple[str, ...] = (
    "bootstrap.watchdog",
    "bootstrap.verify",
)


def import_optional(name: str) -> ModuleType | None:
    """Import ``name`` if its file exists; a module that exists but is broken still raises."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def tasks_defined_in(module: ModuleType) -> Iterable[Task[Any]]:
    for value in vars(module).values():
        # Only tasks defined here: a module importing another's task must not re-register it.
        if isinstance(value, Task) and getattr(value.body, "__module__", None) == module.__name__:
            yield value


def build_collection() -> Collection:
    ns = Collection()
    modules = [importlib.import_module(m) for m in TASK_MODULES]
    modules += [m for m in map(import_optional, OPTIONAL_MODULES) if m is not None]
    for module in modules:
        for t in tasks_defined_in(module):
            ns.add_task(t)
    return ns


ns = build_collection()
