"""The node package on its own: the watchdog's files copied out of the repo in the package's
layout (``<dir>/gpufleet_node/...``), run as ``python -m gpufleet_node.watchdog`` by a clean
interpreter (``-S -E``: no site-packages, no environment) with only the shipped folder on
its path, against fakes and moto on 127.0.0.1 — as the node runs them. Plus the boundary
itself: every ``gpufleet_node/*.py`` parses as Python 3.10 (the nodes' Ubuntu 22.04) and
imports only the standard library (and torch for verify_train) or, relatively, its own
package."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bootstrap.fleet import node_package
from bootstrap.tasks.watchdog import PREFIX, node_files
from tests.gpufleet_node.watchdog_fakes import INSTANCE_ID, FakeIMDS, serve
from tests.support.moto_server import moto_server

REMOTE = Path(__file__).resolve().parents[2] / "gpufleet_node"
# What `fab install-watchdog` ships to /opt/gpufleet/gpufleet_node: its own list, not a copy
# (each cloud's node module comes from its folder, infra/clouds/<name>/node.py).
NODE_FILES = tuple(
    dest.removeprefix(f"{PREFIX}/gpufleet_node/")
    for _src, dest, _mode in node_files()
    if dest.endswith(".py")
)
PYTHON310 = Path("/root/.pyenv/versions/3.10.13/bin/python3.10")
BUCKET = "gpufleet-alone-test"


def remote_modules() -> list[Path]:
    """Every file the node package ships: its own, and each cloud's node module."""
    return sorted(node_package.files().values())


def _id(path: Path) -> str:
    shipped = {src: name for name, src in node_package.files().items()}
    return shipped[path].removeprefix("gpufleet_node/")


def _optional(node: ast.Try) -> bool:
    caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
    return "ImportError" in caught or "ModuleNotFoundError" in caught


def imports_of(tree: ast.Module) -> set[str]:
    """Top-level module names a file needs: not those under ``if TYPE_CHECKING:`` (never
    run) nor in a ``try:`` that catches ImportError (optional, with a fallback)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Try) and _optional(node):
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


@pytest.mark.parametrize("path", remote_modules(), ids=_id)
def test_every_node_file_parses_as_python_3_10(path: Path) -> None:
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


@pytest.mark.parametrize("path", remote_modules(), ids=_id)
def test_every_node_file_imports_only_the_stdlib_or_its_own_package(path: Path) -> None:
    """Absolute imports: the standard library only (the package's own modules are imported
    relatively, ``from . import bucket``, which imports_of leaves out, or, from a cloud's
    node module written in its cloud's folder, absolutely: ``from gpufleet_node import``)."""
    allowed = set(sys.stdlib_module_names)
    if REMOTE not in path.parents:
        allowed.add("gpufleet_node")
    if path.name == "verify_train.py":
        allowed.add("torch")
    foreign = imports_of(ast.parse(path.read_text())) - allowed - {"__future__"}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"


# Issue 23: every function at most about 90 lines (a longer one does several things).
MAX_FUNCTION_LINES = 90


@pytest.mark.parametrize("path", remote_modules(), ids=_id)
def test_every_function_in_a_node_file_is_at_most_90_lines(path: Path) -> None:
    long = {
        f"{node.name} ({(node.end_lineno or node.lineno) - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert not long, f"{path.name}: {sorted(long)}"


def test_the_import_check_sees_a_project_import() -> None:
    code = (
        "import os\nfrom bootstrap.fleet import x\nfrom . import y\n"
        "if TYPE_CHECKING:\n import infra\n"
        "try:\n import boto3\nexcept ImportError:\n boto3 = None\n"
        "try:\n import yaml\nexcept ValueError:\n pass\n"
    )
    assert imports_of(ast.parse(code)) == {"os", "bootstrap", "yaml"}


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def imds() -> Iterator[tuple[FakeIMDS, str]]:
    fake = FakeIMDS(tags={"managed-by": "gpufleet", "gpufleet:stack": "alone"})
    with serve(fake.handler()) as url:
        yield fake, url


def ship(tmp_path: Path, files: tuple[str, ...] = NODE_FILES) -> Path:
    """What `fab install-watchdog` puts in /opt/gpufleet: the folder that holds the package."""
    node_dir = tmp_path / "opt"
    node_dir.mkdir()
    for name in files:
        (node_dir / "gpufleet_node" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(node_package.source(f"gpufleet_node/{name}"), node_dir / "gpufleet_node" / name)
    return node_dir


def node_config(tmp_path: Path, **kw: Any) -> Path:
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True, exist_ok=True)
    data = {
        "provider": "aws",
        "region": "us-east-1",
        "stack": "alone",
        "node": "alone-0",
        "tier": "t4x1",
        "bucket": BUCKET,
        "scratch_path": str(scratch),
        "state_dir": str(tmp_path / "state"),
        "jobs_dir": str(tmp_path / "jobs"),  # not this machine's /var/lib/gpufleet/jobs
        "samples_per_run": 1,
        **kw,
    }
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps(data))
    return path


def run_node(
    node_dir: Path, *args: str, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    # -m puts the working directory first on sys.path: the shipped folder, and only it (-S: no
    # site-packages, so not this repo's editable install; -E: no PYTHONPATH).
    return subprocess.run(
        [python, "-S", "-E", "-m", "gpufleet_node.watchdog", *args],
        cwd=node_dir,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # no AWS_* variables: credentials come from the role
        check=False,
    )


@pytest.mark.integration
def test_shipped_watchdog_runs_once_dry_with_only_its_own_files(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str]
) -> None:
    fake, imds_url = imds
    node_dir = ship(tmp_path)
    config = node_config(tmp_path, endpoint_url=moto, metadata_url=imds_url)
    done = run_node(node_dir, "run", "--dry-run", "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # No nvidia-smi here: an unreadable GPU counts as activity, never as idle.
    assert out["action"] == "keep"
    assert out["problems"] == []
    assert fake.tag_reads >= 1  # it asked the metadata service for its tags
    state = json.loads((tmp_path / "state" / "watchdog-state.json").read_text())
    assert state["tags"]["tags"] == fake.tags
    # A publish failure is only a warning on the node (metrics are the second layer's
    # input): say it here, not as an empty metric list below.
    assert "could not publish metrics" not in done.stderr, done.stderr
    cw = boto3.client("cloudwatch", endpoint_url=moto, region_name="us-east-1")
    # moto's store is one per process: other tests' nodes may have beaten too.
    listed = cw.list_metrics(Namespace="gpufleet", MetricName="Heartbeat")["Metrics"]
    assert any({"Name": "InstanceId", "Value": INSTANCE_ID} in m["Dimensions"] for m in listed)


@pytest.mark.integration
def test_shipped_watchdog_reports_unreadable_tags(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str]
) -> None:
    fake, imds_url = imds
    fake.tags = None  # InstanceMetadataTags disabled
    node_dir = ship(tmp_path)
    config = node_config(tmp_path, endpoint_url=moto, metadata_url=imds_url)
    done = run_node(node_dir, "status", "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["action"] == "keep"
    assert out["unreadable"] and "InstanceMetadataTags" in out["unreadable"][0]


@pytest.mark.integration
def test_shipped_sync_saves_scratch_to_moto_s3_and_then_has_nothing_left(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str]
) -> None:
    _, imds_url = imds
    s3 = boto3.client("s3", endpoint_url=moto, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    node_dir = ship(tmp_path)
    config = node_config(tmp_path, storage_endpoint_url=moto, metadata_url=imds_url)
    ckpt = tmp_path / "scratch" / "checkpoints"
    (ckpt / "step-7").mkdir()
    (ckpt / "step-7" / "optim.pt").write_bytes(b"\x00\x01" * 50_000)
    (ckpt / "latest").write_text("step-7")

    check = run_node(node_dir, "check-sync", "--json", "--config", str(config))
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["ok"] is True

    first = run_node(node_dir, "sync", "--json", "--config", str(config))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["uploaded"] == 2
    got = s3.get_object(Bucket=BUCKET, Key="checkpoints/alone-0/step-7/optim.pt")["Body"].read()
    assert got == b"\x00\x01" * 50_000
    again = json.loads(run_node(node_dir, "sync", "--json", "--config", str(config)).stdout)
    assert (again["ok"], again["uploaded"], again["unsynced_files"]) == (True, 0, 0)


@pytest.mark.integration
def test_shipped_check_sync_fails_clearly_for_a_missing_bucket(
    tmp_path: Path, moto: str, imds: tuple[FakeIMDS, str]
) -> None:
    _, imds_url = imds
    node_dir = ship(tmp_path)
    config = node_config(
        tmp_path, bucket="gpufleet-never-made", storage_endpoint_url=moto, metadata_url=imds_url
    )
    done = run_node(node_dir, "check-sync", "--json", "--config", str(config))
    assert done.returncode == 1
    out = json.loads(done.stdout)
    assert out["ok"] is False
    assert "NoSuchBucket" in out["detail"]


def test_the_install_task_ships_the_watchdog_its_policy_sync_and_names() -> None:
    assert set(NODE_FILES) == {
        "__init__.py",
        "watchdog.py",
        "watchdog_config.py",
        "watchdog_probe.py",
        "watchdog_state.py",
        "watchdog_signals.py",
        "watchdog_metrics.py",
        "scratch_sync.py",
        "idle_rules.py",
        "bucket.py",
        "fleet_names.py",
        "clouds/__init__.py",
        "clouds/base.py",
        "clouds/aws.py",
        "clouds/alicloud.py",
        "clouds/tencent.py",
        "clouds/azure.py",
    }


@pytest.mark.parametrize(
    "missing", ["idle_rules", "bucket", "fleet_names", "watchdog_signals", "scratch_sync"]
)
def test_shipped_watchdog_without_one_of_its_files_does_not_run(
    tmp_path: Path, missing: str
) -> None:
    node_dir = ship(tmp_path, tuple(f for f in NODE_FILES if f != f"{missing}.py"))
    config = node_config(tmp_path, publish_metrics=False, metadata_url="http://127.0.0.1:9")
    done = run_node(node_dir, "status", "--json", "--config", str(config))
    assert done.returncode != 0
    # `from .x import y` names the module; `from . import x` the name it could not import
    assert (
        f"No module named 'gpufleet_node.{missing}'" in done.stderr
        or f"cannot import name '{missing}' from 'gpufleet_node'" in done.stderr
    ), done.stderr


def test_the_shipped_clouds_are_the_node_modules_shipped_from_the_clouds_folders(
    tmp_path: Path,
) -> None:
    """Each cloud's node module is written in its folder (infra/clouds/<name>/node.py) and
    shipped as gpufleet_node/clouds/<name>.py; alone, the node finds each there by name."""
    node_dir = ship(tmp_path)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from gpufleet_node import clouds\n"
        "for name, cls in clouds.CLOUDS.items():\n"
        "    module = sys.modules[cls.__module__]\n"
        "    print(name, cls.__module__, module.__file__, clouds.node_cloud(name, 'r').name)\n"
        "print(clouds.HOMES)\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-I", "-c", code, str(node_dir)],
        cwd=node_dir.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *rows, homes = done.stdout.splitlines()
    shipped = {
        n.removeprefix("clouds/").removesuffix(".py") for n in NODE_FILES if n.startswith("clouds/")
    }
    assert {row.split()[0] for row in rows} == shipped - {"__init__", "base"}
    assert len(rows) >= 4  # the four clouds at least
    for name, module, file, made in (row.split() for row in rows):
        assert module == f"gpufleet_node.clouds.{name}" and made == name
        assert Path(file) == node_dir / "gpufleet_node" / "clouds" / f"{name}.py"
    assert homes == "[]"  # no checkout on a node: only what was shipped


def test_the_shipped_policy_reads_the_shipped_names_not_the_projects(tmp_path: Path) -> None:
    node_dir = ship(tmp_path)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from gpufleet_node import idle_rules as p, fleet_names\n"
        "assert p.names is fleet_names, p.names\n"
        "print(fleet_names.__file__, p.decide_node.__module__)\n"
        "import importlib.util; print(importlib.util.find_spec('infra'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-I", "-c", code, str(node_dir)],
        cwd=node_dir.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shipped, module = done.stdout.split("\n")[0].split()
    assert Path(shipped).parent == node_dir / "gpufleet_node"
    assert module == "gpufleet_node.idle_rules"
    assert done.stdout.split("\n")[1] == "None"  # nothing of the project is importable


@pytest.mark.skipif(not PYTHON310.exists(), reason="no CPython 3.10 here (pyenv 3.10.13)")
def test_shipped_watchdog_answers_status_under_a_real_python_3_10(tmp_path: Path) -> None:
    node_dir = ship(tmp_path)
    config = node_config(tmp_path, publish_metrics=False, metadata_url="http://127.0.0.1:9")
    done = run_node(node_dir, "status", "--json", "--config", str(config), python=str(PYTHON310))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["action"] == "keep"
    assert out["idle_limit_minutes"] == 30
    assert out["unreadable"]  # no metadata service on port 9: tags unknown, said so


def test_watchdog_cli_rejects_a_bad_config_with_exit_2_and_one_line(tmp_path: Path) -> None:
    node_dir = ship(tmp_path)
    config = tmp_path / "watchdog.json"
    config.write_text("{not json")
    done = run_node(node_dir, "status", "--config", str(config))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not readable JSON" in done.stderr


@pytest.mark.parametrize(
    "tool", ["watchdog", "job_runner", "data_sync", "verify_node", "verify_health"]
)
def test_the_package_alone_answers_help_for_each_tool(tmp_path: Path, tool: str) -> None:
    """The whole package copied out of the repo (each cloud's node module from its folder,
    as fab ships it), run as ``python -m gpufleet_node.<tool>``
    by a clean interpreter with only the folder above it on the path."""
    for name, src in node_package.files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-m", f"gpufleet_node.{tool}", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
