"""The offline plan skips the SDK's URN collapse of aliases the engine resolves from specs
(infra/offline.py `_aliases_sent_as_specs`): the plan and the aliases the monitor receives
are the same as with the SDK's own code, and the SDK reads those URNs nowhere else."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from typing import Any

import pulumi
import pulumi.resource
import pytest
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.proto import resource_pb2

import infra.offline
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, RecordingMonitor, evaluate

STACKS = Path(__file__).resolve().parents[2] / "stacks"
SDK = Path(pulumi.__file__).parent


def sent(monkeypatch: pytest.MonkeyPatch, stack: str) -> tuple[Any, list[tuple[str, str]]]:
    """(the plan as dicts, every resource's aliases as the monitor received them)."""
    aliases: list[tuple[str, str]] = []
    register = RecordingMonitor.RegisterResource

    def recording(self: RecordingMonitor, request: Any) -> Any:
        for alias in request.aliases:
            aliases.append((f"{request.type}::{request.name}", str(alias).replace("\n", " ")))
        return register(self, request)

    monkeypatch.setattr(RecordingMonitor, "RegisterResource", recording)
    path = STACKS / f"Pulumi.{stack}.yaml"
    result = evaluate(load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY}))
    monkeypatch.undo()
    plan = (
        [r.to_json() | {"outputs": r.outputs, "id": r.id} for r in result.resources],
        result.outputs,
        result.invokes,
        result.stack_urn,
    )
    return comparable(plan), sorted(aliases)


def comparable(value: Any) -> Any:
    """`value` with each asset or archive as its class and path (they compare by identity)."""
    if isinstance(value, pulumi.Asset | pulumi.Archive):
        return (type(value).__name__, getattr(value, "path", None))
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    return value


def sdk_collapse_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts each call of the SDK's own collapse_alias_to_urn from now on."""
    calls: list[int] = []
    real = pulumi.resource.collapse_alias_to_urn

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(pulumi.resource, "collapse_alias_to_urn", counted)
    return calls


@pytest.mark.parametrize("stack", ["azure-t4x1", "a100x8"])
def test_the_plan_and_the_aliases_sent_are_those_of_the_sdks_own_code(
    monkeypatch: pytest.MonkeyPatch, stack: str
) -> None:
    fast = sent(monkeypatch, stack)
    monkeypatch.setattr(infra.offline, "_aliases_sent_as_specs", contextlib.nullcontext)
    calls = sdk_collapse_calls(monkeypatch)
    own = sent(monkeypatch, stack)
    assert fast == own
    if stack.startswith("azure"):
        # the case it is for: every azure-native resource carries older API versions
        assert len(fast[1]) > 300 and all("azure-native:" in a for _, a in fast[1])
        assert len(calls) >= len(fast[1])


def test_the_sdks_collapse_is_skipped_only_for_an_engine_that_takes_alias_specs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = sdk_collapse_calls(monkeypatch)
    with_specs = sent(monkeypatch, "azure-t4x1")
    calls = sdk_collapse_calls(monkeypatch)
    assert calls == []  # with specs: not one URN collapsed
    specs = resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS
    supports = pulumi_settings.monitor_supports_feature

    def without_specs(feature: int) -> bool:
        return feature != specs and supports(feature)

    for module in (pulumi_settings, pulumi.runtime.resource):
        monkeypatch.setattr(module, "monitor_supports_feature", without_specs)
    without = sent(monkeypatch, "azure-t4x1")
    assert len(calls) > 300  # the SDK's own collapse ran for each alias
    assert without[0] == with_specs[0]  # the same resources, inputs and outputs


def _reads_of_aliases(tree: ast.AST) -> list[ast.AST]:
    """Each `x._aliases` read other than `x._aliases.append(...)` (the collapse's writer)."""
    appended = {
        id(node.func.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "append"
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "_aliases"
        and isinstance(node.ctx, ast.Load)
        and id(node) not in appended
    ]


def test_the_sdk_reads_the_collapsed_urns_only_when_the_engine_takes_no_specs() -> None:
    """If a Pulumi upgrade reads `Resource._aliases` anywhere else, or calls `all_aliases`
    for an engine with alias specs, skipping the collapse would change what is sent: this
    fails, and `_aliases_sent_as_specs` must be checked against the new SDK."""
    readers: list[str] = []
    callers: list[tuple[str, ast.If | None]] = []
    for path in sorted(SDK.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if _reads_of_aliases(func):
                readers.append(func.name)
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "all_aliases"
                ):
                    guard = next(
                        (
                            n
                            for n in ast.walk(func)
                            if isinstance(n, ast.If)
                            and any(node is m for s in n.orelse for m in ast.walk(s))
                        ),
                        None,
                    )
                    callers.append((func.name, guard))
    assert sorted(set(readers)) == ["all_aliases"]
    assert [name for name, _ in callers] == ["prepare_aliases"]
    guard = callers[0][1]
    assert guard is not None and ast.unparse(guard.test) == "supports_alias_specs"
