"""Each stack in stacks/ planned once under Pulumi's mocks, as the policies see it."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.config import StackConfig, load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from policy.plan_check import resources_from_plan
from policy.resources import Resource

STACKS = Path(__file__).resolve().parents[2] / "stacks"
STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))


def stack_id(path: Path) -> str:
    return path.name[len("Pulumi.") : -len(".yaml")]


@dataclasses.dataclass(frozen=True)
class Planned:
    cfg: StackConfig
    result: PlanResult
    resources: tuple[Resource, ...]

    def one(self, type_: str, name_suffix: str = "") -> Resource:
        found = [r for r in self.resources if r.type == type_ and r.name.endswith(name_suffix)]
        assert found, f"{self.cfg.stack} declares no {type_} named *{name_suffix}"
        return found[0]

    def mutate(self, target: Resource, change: Callable[[dict[str, Any]], None]) -> list[Resource]:
        """The recorded resources with `target`'s inputs changed (deep copy; the cache stays)."""
        out = []
        for r in self.resources:
            if r is target:
                inputs = copy.deepcopy(dict(r.inputs))
                change(inputs)
                r = dataclasses.replace(r, inputs=inputs)
            out.append(r)
        return out

    def without(self, *targets: Resource) -> list[Resource]:
        return [r for r in self.resources if all(r is not t for t in targets)]


@functools.cache
def planned(name: str) -> Planned:
    cfg = load_stack_file(STACKS / f"Pulumi.{name}.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    result = evaluate(cfg)
    return Planned(cfg, result, tuple(resources_from_plan(result, cfg)))


@pytest.fixture(params=STACK_FILES, ids=stack_id)
def shipped(request: pytest.FixtureRequest) -> Planned:
    return planned(stack_id(request.param))
