"""The node files the train steps ship: exactly what the job runner imports, and enough."""

from __future__ import annotations

import ast
import base64
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from bootstrap.fleet import node_package
from bootstrap.train.steps import REMOTE_FILES, bundle


def test_fab_train_ships_exactly_what_the_job_runner_imports() -> None:
    """No more and no less: the runner's own modules and the data tasks' tool and, following
    their imports within the package, the bucket client, the node clouds (each from its
    cloud's folder) and the names (not the watchdog: fab setup installs it), in the
    package's layout."""
    shipped = {n.removeprefix("gpufleet_node/"): src for n, src in node_package.files().items()}
    wanted: set[str] = set()
    todo = ["job_runner.py", "job_launch.py", "job_sync.py", "data_sync.py", "__init__.py"]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        folder = Path(name).parent
        if Path(name).name == "__init__.py" and folder != Path("."):  # clouds/: all of it
            todo += [n for n in shipped if Path(n).parent == folder]
        for node in ast.walk(ast.parse(shipped[name].read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                here = folder
                for _ in range(node.level - 1):
                    here = here.parent
                base = here / node.module.replace(".", "/") if node.module else here
            elif (node.module or "").startswith("gpufleet_node"):  # a cloud's node module
                base = Path(*str(node.module).split(".")[1:])
            else:
                continue
            for target in [base, *(base / a.name for a in node.names)]:
                module = [target.with_suffix(".py")] if target.name else []
                for candidate in (*module, target / "__init__.py"):
                    if candidate.as_posix() in shipped:
                        todo.append(candidate.as_posix())
    assert set(REMOTE_FILES) == {f"gpufleet_node/{n}" for n in wanted}
    assert "gpufleet_node/watchdog.py" not in REMOTE_FILES


def test_the_bundle_holds_the_files_under_the_package_folder() -> None:
    _sha, b64 = bundle()
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(b64)), mode="r:xz") as tar:
        assert sorted(tar.getnames()) == sorted(REMOTE_FILES)
    # it travels inside one command line: Linux caps one argument at 128 KiB
    assert len(b64) < 120_000


def test_the_node_files_run_on_a_bare_interpreter_with_only_the_shipped_files(
    tmp_path: Path,
) -> None:
    """The boundary: the runner's modules need nothing from the repo, only the shipped
    package, run as the node runs them (``python -m gpufleet_node.job_runner``)."""
    for name in REMOTE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(node_package.source(name).read_bytes())
    code = (
        "from gpufleet_node import job_runner, job_sync, job_launch, data_sync\n"
        "print(job_runner.STATE_SCHEMA)"
    )
    done = subprocess.run(
        # -S: no site-packages (so not the editable install of this repo); -E: no PYTHONPATH;
        # the working directory (the shipped folder) is the only other entry on the path.
        [sys.executable, "-S", "-E", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpufleet.job-state/1"
    runner = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "gpufleet_node.job_runner", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert runner.returncode == 0 and "supervise" in runner.stdout, runner.stderr
