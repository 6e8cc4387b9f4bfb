"""Stack evaluation under Pulumi's mocks, shared by the infra tests (each stack runs once)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from infra.config import StackConfig, load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate

STACKS = Path(__file__).resolve().parents[2] / "stacks"
STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))


def stack_id(path: Path) -> str:
    return path.name[len("Pulumi.") : -len(".yaml")]


@functools.cache
def planned(path: Path) -> tuple[StackConfig, PlanResult]:
    cfg = load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    return cfg, evaluate(cfg)


@pytest.fixture(params=STACK_FILES, ids=stack_id)
def stack(request: pytest.FixtureRequest) -> tuple[StackConfig, PlanResult]:
    return planned(request.param)
