"""The node files the train steps ship: exactly what the job runner imports, and enough."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bootstrap.train.steps import REMOTE_DIR, REMOTE_FILES


def test_fab_train_ships_exactly_what_the_job_runner_imports() -> None:
    """No more and no less: the runner's own files and the data tasks' tool and, following
    their imports, the bucket client, the node clouds and the names (not the watchdog: fab
    setup installs it)."""
    from tests.bootstrap.remote.test_watchdog_alone import imports_of

    remote = REMOTE_DIR
    wanted: set[str] = set()
    todo = ["job_runner.py", "job_launch.py", "job_sync.py", "data_sync.py"]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        path = remote / name
        if path.name == "__init__.py":  # a package: every module in it is imported
            todo += [f"{path.parent.name}/{p.name}" for p in path.parent.glob("*.py")]
        for module in imports_of(ast.parse(path.read_text())):
            for candidate in (f"{module}.py", f"{module}/__init__.py"):
                if (remote / candidate).is_file():
                    todo.append(candidate)
    assert set(REMOTE_FILES) == wanted


def test_the_node_files_run_on_a_bare_interpreter_with_only_the_shipped_files(
    tmp_path: Path,
) -> None:
    """The boundary: job_*.py need nothing from the repo, only their shipped neighbours."""
    for name in REMOTE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((REMOTE_DIR / name).read_bytes())
    code = "import job_runner, job_sync, job_launch, data_sync; print(job_runner.STATE_SCHEMA)"
    done = subprocess.run(
        # -S: no site-packages (so not the editable install of this repo); -E: no PYTHONPATH.
        [sys.executable, "-S", "-E", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpufleet.job-state/1"
