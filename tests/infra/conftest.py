"""Stack evaluation under Pulumi's mocks, shared by the infra tests (each stack runs once)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.config import (
    StackConfig,
    load_stack_file,
    parse_config,
    read_stack_file,
    stack_name_from_file,
    strip_namespace,
)
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from tests.support.sdk_inputs import Constructed, capture_constructed

STACKS = Path(__file__).resolve().parents[2] / "stacks"
STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))


def stack_id(path: Path) -> str:
    return path.name[len("Pulumi.") : -len(".yaml")]


@dataclass(frozen=True)
class Built:
    """One run of the program: its config, what the engine received, what was constructed."""

    cfg: StackConfig
    result: PlanResult
    constructed: tuple[Constructed, ...]


def build_capturing(cfg: StackConfig) -> Built:
    """Evaluate `cfg`, keeping each resource's constructor inputs too (tests/support/sdk_inputs)."""
    with capture_constructed() as constructed:
        result = evaluate(cfg)
    return Built(cfg, result, tuple(constructed))


@functools.cache
def built(path: Path) -> Built:
    return build_capturing(load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY}))


def planned(path: Path) -> tuple[StackConfig, PlanResult]:
    run = built(path)
    return run.cfg, run.result


def variant_config(
    path: Path, changes: Mapping[str, Any], drop: tuple[str, ...] = ()
) -> StackConfig:
    """A shipped stack with some keys changed or dropped, validated as a stack file would be
    (ConfigError when the catalog does not allow the combination)."""
    raw = strip_namespace(read_stack_file(path))
    for key in drop:
        raw.pop(key, None)
    raw.update({"sshPublicKey": PLACEHOLDER_SSH_KEY, **changes})
    return parse_config(raw, stack_name_from_file(path))


@pytest.fixture(params=STACK_FILES, ids=stack_id)
def stack(request: pytest.FixtureRequest) -> tuple[StackConfig, PlanResult]:
    return planned(request.param)
