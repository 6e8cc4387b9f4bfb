"""Fabric tasks that turn freshly provisioned nodes into working GPU training machines.

``ns`` is the task collection that the repo's ``fabfile.py`` exposes to ``fab``. Tasks are
collected from the modules below: every ``@task`` / ``@fleet_task`` *defined in* a listed
module becomes a top-level task (``install_driver`` is typed ``install-driver``).

Adding a module: write ``bootstrap/<concern>.py`` with its steps and tasks (see
``bootstrap.api`` and ``bootstrap.cli``) and add its name to ``TASK_MODULES``.
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
    "bootstrap.watchdog",
    "bootstrap.verify.task",
    "bootstrap.train",
)


def tasks_defined_in(module: ModuleType) -> Iterable[Task[Any]]:
    for value in vars(module).values():
        # Only tasks defined here: a module importing another's task must not re-register it.
        if isinstance(value, Task) and getattr(value.body, "__module__", None) == module.__name__:
            yield value


def build_collection() -> Collection:
    ns = Collection()
    for module in map(importlib.import_module, TASK_MODULES):
        for t in tasks_defined_in(module):
            ns.add_task(t)
    return ns


ns = build_collection()
