"""infra/automation.py's node methods (fab recover): the Automation API calls they make.

The Pulumi CLI cannot run here, so the engine gets a stand-in for its
``pulumi.automation.Stack`` that records each call's keywords and answers with the SDK's
own result and event classes (pulumi.automation._stack UpResult / PreviewResult /
RefreshResult / UpdateSummary, pulumi.automation.events EngineEvent / ResOutputsEvent /
StepEventMetadata / OpType), as the installed SDK builds them from the CLI's output.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult
from pulumi.automation._output import OutputValue
from pulumi.automation._stack import PreviewResult, RefreshResult, UpdateSummary, UpResult
from pulumi.automation.errors import CommandError

from infra.automation import PulumiEngine
from infra.failover import UpdateFailed

NODE = "urn:pulumi:s::gpufleet::gpufleet:node:GpuNode$aws:ec2/instance:Instance::s-1"
EIP = "urn:pulumi:s::gpufleet::gpufleet:node:GpuNode$aws:ec2/eip:Eip::s-1-eip"


def summary(changes: dict[events.OpType, int]) -> UpdateSummary:
    now = dt.datetime.now(dt.UTC)
    return UpdateSummary("update", now, "", {}, {}, "succeeded", now, resource_changes=changes)


def deleted(urn: str) -> events.EngineEvent:
    """The event a refresh sends for a resource the cloud no longer has (op delete)."""
    meta = events.StepEventMetadata(events.OpType.DELETE, urn, "aws:ec2/instance:Instance", "")
    return events.EngineEvent(1, 0, res_outputs_event=events.ResOutputsEvent(meta))


class Stack:
    """Records each call with its keywords; answers as the SDK does."""

    def __init__(self, fail_up: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_up = fail_up

    def preview_refresh(self, **kw: Any) -> PreviewResult:
        self.calls.append(("preview_refresh", kw))
        on_event: Callable[[events.EngineEvent], None] = kw["on_event"]
        on_event(deleted(NODE))
        on_event(deleted("urn:pulumi:s::gpufleet::aws:s3/bucket:Bucket::s-bucket"))  # not asked
        return PreviewResult("", "", {events.OpType.DELETE: 1})

    def refresh(self, **kw: Any) -> RefreshResult:
        self.calls.append(("refresh", kw))
        return RefreshResult("", "", summary({events.OpType.DELETE: 1, events.OpType.SAME: 1}))

    def preview(self, **kw: Any) -> PreviewResult:
        self.calls.append(("preview", kw))
        return PreviewResult("", "", {events.OpType.CREATE: 1, events.OpType.UPDATE: 1})

    def up(self, **kw: Any) -> UpResult:
        self.calls.append(("up", kw))
        if self.fail_up:
            raise CommandError(CommandResult("", "error: quota", 255))
        return UpResult("", "", summary({events.OpType.CREATE: 1}), {})

    def outputs(self) -> dict[str, OutputValue]:
        return {"nodes": OutputValue([{"name": "s-1"}], False)}


def engine(stack: Stack) -> PulumiEngine:
    made = PulumiEngine.__new__(PulumiEngine)  # no create_or_select_stack: no CLI here
    made._auto = auto
    made._say = lambda text: None
    made.stack = stack  # type: ignore[assignment]
    return made


def test_the_gone_check_is_a_targeted_refresh_preview_read_from_its_events() -> None:
    stack = Stack()
    assert engine(stack).refresh_would_delete([NODE]) == [NODE]
    ((name, kw),) = stack.calls
    assert name == "preview_refresh" and kw["target"] == [NODE]


def test_refresh_preview_and_update_name_only_the_given_urns() -> None:
    stack = Stack()
    e = engine(stack)
    assert e.refresh_only([NODE, EIP]) == {"delete": 1, "same": 1}
    assert e.preview_only([NODE, EIP]) == {"create": 1, "update": 1}
    assert e.update_only([NODE, EIP]) == {"create": 1}
    assert [c[0] for c in stack.calls] == ["refresh", "preview", "up"]
    for _, kw in stack.calls:
        assert kw["target"] == [NODE, EIP]
    # the refresh adopts the cloud's state for these URNs only; the preview and the update
    # take what depends on them along (the dashboard naming the instance), with the policy
    assert "target_dependents" not in stack.calls[0][1]
    for _, kw in stack.calls[1:]:
        assert kw["target_dependents"] is True and kw["policy_packs"]
        assert "replace" not in kw  # a deleted instance is created, nothing replaced


def test_a_failed_update_is_update_failed_and_outputs_are_plain_values() -> None:
    e = engine(Stack(fail_up=True))
    with pytest.raises(UpdateFailed) as exc:
        e.update_only([NODE])
    assert "quota" in exc.value.text
    assert e.outputs() == {"nodes": [{"name": "s-1"}]}
