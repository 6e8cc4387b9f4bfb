"""Fixtures for driving the real ``fab`` tasks against the local sshd."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_shared
from tests.support.sshd import SshServer, sshd_server

__all__ = ["sshd_server"]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class FabResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.stdout)
        return data

    def host(self, index: int = 0) -> dict[str, Any]:
        host: dict[str, Any] = self.doc["hosts"][index]
        return host

    def step(self, name: str, index: int = 0) -> dict[str, Any]:
        for s in self.host(index)["steps"]:
            if s["step"] == name:
                return dict(s)
        raise AssertionError(f"no step {name!r} in {self.host(index)['steps']}")


def run_fab(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> FabResult:
    """``fab ARGS`` from the repo root, as a person would type it."""
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )
    return FabResult(proc.returncode, proc.stdout, proc.stderr)


def unwrap_progress(text: str) -> str:
    """fab's output with each progress line whole again: the printer continues a
    ``[host] ...`` line past the width on lines indented by four spaces (runner._Printer),
    and a message is searched for as it was said, not where it broke."""
    out: list[str] = []
    in_progress = False
    for line in text.splitlines():
        if in_progress and line.startswith("    "):
            out[-1] += " " + line.strip()
            continue
        in_progress = line.startswith("[")
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def fab_in_process(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[object, str, str]:
    """``fab *argv`` run in this process from the repo, as fab's own main reads it: (the
    status it exits with, stdout, stderr). For parse errors and help, which end in exit."""
    import fabric.main

    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exc:
        fabric.main.program.run(["fab", *argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def install_pytorch_args(server: SshServer, venv: Path, *extra: str) -> list[str]:
    """``fab`` arguments of install-pytorch on the test node, from the node's pip config."""
    return [
        *server.fab_args(),
        "install-pytorch",
        "--allow-no-gpu",
        "--torch-index",
        "default",
        "--venv",
        str(venv),
        *extra,
    ]


def node_dir(prefix: str) -> Path:
    """A directory the SSH test user can reach (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def node_venv(sshd_server: SshServer) -> tuple[Path, FabResult]:
    """``fab install-pytorch`` run once for the test run: (venv path, its result).

    The pip install is the slow part of these tests (40-60 s of CPU), so the tests that
    need a bootstrapped venv share this one, across the xdist workers too: the first
    worker to need it installs it, the others wait and read its recorded result. The
    run's folder (tests/support/run_shared.py) is removed when the run ends.
    """
    with run_shared.made_once("node-venv") as (base, first):
        venv = base / "venv"
        recorded = base / "install-pytorch.json"
        if first:
            result = run_fab(*install_pytorch_args(sshd_server, venv, "--json"))
            if result.returncode == 0:
                # The public scripts' packages (tests/examples) go in now, before any test
                # runs in this venv: pip swapping a package torch imports while another
                # worker's job imports torch there made that import fail.
                (base / EXTRAS_RECORD).write_text(json.dumps(install_extras(venv)))
            recorded.write_text(json.dumps(asdict(result)))
        elif not recorded.exists():  # the first worker died mid-install
            pytest.fail(f"{venv}: the install of another worker did not finish")
    return venv, FabResult(**json.loads(recorded.read_text()))


# What examples/hf_trainer/run_clm.py imports, by the names requirements-dev.txt pins them
# under, and numpy (examples/nanogpt's train.py reads its tokens with it; torch does not
# bring it).
EXTRA_PACKAGES = (
    "numpy",
    "transformers",
    "accelerate",
    "tokenizers",
    "safetensors",
    "datasets",
    "evaluate",
    "huggingface-hub",
)
EXTRAS_RECORD = "pip-extras.json"


def extra_pins(requirements: Path = REPO / "requirements-dev.txt") -> list[str]:
    """``name==version`` of each of EXTRA_PACKAGES as requirements-dev.txt pins it."""
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m and m.group(1).lower() in EXTRA_PACKAGES:
            pins[m.group(1).lower()] = f"{m.group(1)}=={m.group(2)}"
    missing = [p for p in EXTRA_PACKAGES if p not in pins]
    assert not missing, f"requirements-dev.txt pins none of {missing}"
    return [pins[p] for p in EXTRA_PACKAGES]


def torch_pin(venv: Path) -> str:
    """``torch==<the version in venv>``, read from its dist-info (no torch import)."""
    found = sorted(venv.glob("lib/python3*/site-packages/torch-*.dist-info"))
    assert found, f"{venv}: no torch installed"
    return "torch==" + found[-1].name.removeprefix("torch-").removesuffix(".dist-info")


def install_extras(venv: Path) -> dict[str, Any]:
    """pip install of extra_pins() into ``venv`` with its torch held where it is (a
    constraint, so pip never swaps torch): {"rc", "out"}."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write(torch_pin(venv) + "\n")
        constraints.flush()
        proc = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
             "--disable-pip-version-check", "-c", constraints.name, *extra_pins()],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    return {"rc": proc.returncode, "out": proc.stderr[-3000:]}
