"""Fixtures for the public training scripts kept in examples/ (nanoGPT, transformers'
run_clm.py), driven end to end by ``fab train`` over the local sshd nodes.

The node venv is the one ``fab install-pytorch`` makes once per test run
(tests/bootstrap/conftest.py ``node_venv``), which also installs transformers and its
companions there from requirements-dev.txt's pins before any test uses it, with the venv's
own torch held where it is (a constraint), so pip never swaps torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bootstrap.conftest import EXTRAS_RECORD, FabResult, node_venv
from tests.support.sshd import sshd_server

__all__ = ["node_venv", "sshd_server"]


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model, tokenizer or dataset is ever fetched from a hub, on the laptop side either."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def hf_node_venv(node_venv: tuple[Path, FabResult]) -> Path:
    """The session's node venv, which node_venv made with requirements-dev.txt's
    transformers pins already in (tests/bootstrap/conftest.py install_extras)."""
    venv, installed = node_venv
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    done = json.loads((venv.parent / EXTRAS_RECORD).read_text())
    assert done["rc"] == 0, f"pip install of the transformers pins into {venv}: {done['out']}"
    return venv
