"""The ``fab`` task collection is built from the modules of bootstrap/tasks/, nothing listed by
hand, and the task names and options people type stay the same."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap import build_collection, ns, task_modules
from bootstrap.fleet import system

# A CLI contract: scripts, docs and people's shell history type these names.
TASK_NAMES = {
    "cancel",
    "data-fetch",
    "data-pull",
    "data-push",
    "forget-host-key",
    "health",
    "host-keys",
    "idle-status",
    "install-driver",
    "install-pytorch",
    "install-watchdog",
    "jobs",
    "keep-alive",
    "logs",
    "mount-scratch",
    "recover",
    "setup",
    "start",
    "status",
    "stop",
    "top",
    "train",
    "verify-gpu",
}

FLEET_OPTIONS = {"stack", "inventory", "json", "connect-timeout"}


def test_fab_shows_exactly_the_task_names_it_always_had() -> None:
    assert set(ns.task_names) == TASK_NAMES


def test_every_module_in_the_tasks_folder_is_collected() -> None:
    found = {m.__name__ for m in task_modules()}
    on_disk = {
        f"bootstrap.tasks.{p.stem}"
        for p in (Path(__file__).resolve().parents[2] / "bootstrap" / "tasks").glob("*.py")
        if not p.stem.startswith("_")
    }
    assert found == on_disk


def test_every_task_that_reaches_nodes_takes_the_shared_fleet_options() -> None:
    for name in TASK_NAMES - {"host-keys", "forget-host-key"}:
        flags = {arg.name.replace("_", "-") for arg in ns[name].get_arguments()}
        # `logs` streams a job's output: there is no JSON document to print instead.
        wanted = FLEET_OPTIONS - {"json"} if name == "logs" else FLEET_OPTIONS
        # `recover` reads the stack through Pulumi (its state is the truth about a deleted
        # node), never an inventory, and says each stage in a line.
        wanted = {"stack", "connect-timeout"} if name == "recover" else wanted
        assert wanted <= flags, (name, wanted - flags)


def test_each_step_function_is_named_after_its_step() -> None:
    steps = {
        value
        for module in [system, *task_modules()]
        for value in vars(module).values()
        if callable(value) and isinstance(getattr(value, "step_name", None), str)
    }
    assert len(steps) >= 15
    for st in steps:
        assert st.__name__ == st.step_name.replace("-", "_") + "_step", st.__name__


def test_each_task_function_is_named_after_its_task() -> None:
    for name in TASK_NAMES:
        body = ns[name].body
        assert body.__name__.replace("_", "-") == name, body.__name__


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "fakepkg_tasks"
    root.mkdir()
    (root / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        yield root
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("fakepkg_tasks")]:
            del sys.modules[name]


TASK_SOURCE = """
from invoke import task

@task
def {name}(c):
    \"\"\"A task.\"\"\"
"""


def test_a_new_module_in_the_folder_adds_its_task_without_any_list(package: Path) -> None:
    (package / "alpha.py").write_text(TASK_SOURCE.format(name="do_alpha"))
    (package / "beta.py").write_text(TASK_SOURCE.format(name="do_beta"))
    (package / "_helpers.py").write_text(TASK_SOURCE.format(name="hidden"))
    assert set(build_collection("fakepkg_tasks").task_names) == {"do-alpha", "do-beta"}


def test_two_modules_defining_the_same_task_name_are_refused(package: Path) -> None:
    (package / "alpha.py").write_text(TASK_SOURCE.format(name="same"))
    (package / "beta.py").write_text(TASK_SOURCE.format(name="same"))
    with pytest.raises(ValueError, match="'same' is defined in both"):
        build_collection("fakepkg_tasks")
