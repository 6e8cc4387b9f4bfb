"""infra/short_lived.py: a one-shot command runs without cyclic GC, and its exit still runs
every cleanup it registered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import atexit, gc, tempfile
from pathlib import Path
from infra.short_lived import one_command

one_command()
print("enabled", gc.isenabled())
kept = tempfile.TemporaryDirectory()  # its finalizer removes it at exit
Path(kept.name, "f").write_text("x")
print("folder", kept.name)

def later():  # registered after: runs before the freeze (atexit is last-in first-out)
    print("cleanup ran, frozen", gc.get_freeze_count(), flush=True)

atexit.register(later)
"""


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_one_command_turns_gc_off_and_freezes_only_after_every_other_exit_handler() -> None:
    done = run_child(CHILD)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "enabled False"
    assert lines[-1] == "cleanup ran, frozen 0"
    folder = Path(lines[1].removeprefix("folder "))
    assert not folder.exists()  # the temporary folder's finalizer still ran at exit


@pytest.mark.parametrize("script", ["plan", "cost", "size", "gpus", "where"])
def test_each_one_shot_script_runs_so_as_a_program_and_not_when_its_main_is_called(
    script: str,
) -> None:
    """Run as a program, the script turns GC off; the tests call these scripts' main() in
    their own long process, which must keep collecting."""
    done = run_child(
        f"""
        import atexit, gc, runpy, sys
        # registered first, so it runs last: after the script's freeze
        atexit.register(lambda: print("as program", gc.isenabled(), gc.get_freeze_count() > 0))
        sys.argv = ["scripts/{script}.py", "--help"]
        ns = runpy.run_path("scripts/{script}.py", run_name="not_main")
        try:
            ns["main"](["--help"])
        except SystemExit:
            pass
        print("main() called", gc.isenabled())
        runpy.run_path("scripts/{script}.py", run_name="__main__")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("as program", "main()"))]
    assert lines == ["main() called True", "as program False True"]


def test_fab_imports_its_tasks_without_gc_then_collects_and_skips_the_exit_one() -> None:
    """fab's tasks may run for hours (top, --follow): the collector is on while they run."""
    done = run_child(
        """
        import atexit, gc
        atexit.register(lambda: print("frozen at exit", gc.get_freeze_count() > 0))
        import fabfile  # what `fab` imports before it runs a task
        print("collecting", gc.isenabled())
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["collecting True", "frozen at exit True"]


def test_no_collection_restores_the_collector_as_it_was() -> None:
    import gc

    from infra.short_lived import no_collection

    assert gc.isenabled()
    with no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
