"""Fixtures for the public training scripts kept in examples/ (nanoGPT, transformers'
run_clm.py), driven end to end by ``fab train`` over the local sshd nodes.

The node venv is the one ``fab install-pytorch`` makes once per test run
(tests/bootstrap/conftest.py ``node_venv``); the Trainer script also needs transformers and
its companions there, installed once per run from requirements-dev.txt's pins, with the
venv's own torch held where it is (a constraint), so pip never swaps torch.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bootstrap.conftest import REPO, FabResult, node_venv
from tests.support import run_shared
from tests.support.sshd import sshd_server

__all__ = ["node_venv", "sshd_server"]

# What run_clm.py imports, by the name requirements-dev.txt pins it under, and numpy
# (nanoGPT's train.py reads its tokens with it; torch does not bring it).
HF_PACKAGES = (
    "numpy",
    "transformers",
    "accelerate",
    "tokenizers",
    "safetensors",
    "datasets",
    "evaluate",
    "huggingface-hub",
)


def hf_pins(requirements: Path = REPO / "requirements-dev.txt") -> list[str]:
    """``name==version`` of each of HF_PACKAGES as requirements-dev.txt pins it."""
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m and m.group(1).lower() in HF_PACKAGES:
            pins[m.group(1).lower()] = f"{m.group(1)}=={m.group(2)}"
    missing = [p for p in HF_PACKAGES if p not in pins]
    assert not missing, f"requirements-dev.txt pins none of {missing}"
    return [pins[p] for p in HF_PACKAGES]


def torch_pin(venv: Path) -> str:
    """``torch==<the version in venv>``, read from its dist-info (no torch import)."""
    found = sorted(venv.glob("lib/python3*/site-packages/torch-*.dist-info"))
    assert found, f"{venv}: no torch installed"
    return "torch==" + found[-1].name.removeprefix("torch-").removesuffix(".dist-info")


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model, tokenizer or dataset is ever fetched from a hub, on the laptop side either."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def hf_node_venv(node_venv: tuple[Path, FabResult]) -> Iterator[Path]:
    """The session's node venv with requirements-dev.txt's transformers pins added (once per
    test run, across xdist workers: 20-30 s of pip)."""
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    with run_shared.made_once("node-venv-hf") as (base, first):
        recorded = base / "pip.json"
        if first:
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
                constraints.write(torch_pin(venv) + "\n")
                constraints.flush()
                proc = subprocess.run(
                    [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", "-c", constraints.name, *hf_pins()],
                    capture_output=True, text=True, timeout=900, check=False,
                )  # fmt: skip
            recorded.write_text(json.dumps({"rc": proc.returncode, "out": proc.stderr[-3000:]}))
        elif not recorded.exists():  # the first worker died mid-install
            pytest.fail(f"{venv}: another worker's install of the transformers pins did not end")
    done = json.loads(recorded.read_text())
    assert done["rc"] == 0, f"pip install of the transformers pins into {venv}: {done['out']}"
    yield venv
