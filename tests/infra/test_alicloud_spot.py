"""An Alicloud spot node that ECS reclaims is stopped in economical mode, not released:
its disks and the checkpoints on them survive. The input's name and value are checked
against the installed pulumi_alicloud's own InstanceArgs (its docstring lists the values)."""

from __future__ import annotations

import inspect
import re

import pulumi_alicloud as ali

from infra.clouds.alicloud.program import SPOT_INTERRUPTION_BEHAVIOR
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
from tests.infra.conftest import STACKS


def _documented_values(arg: str) -> set[str]:
    """The backticked values the SDK's InstanceArgs docstring lists for ``arg``."""
    doc = inspect.getdoc(ali.ecs.InstanceArgs.__init__) or ""
    part = doc.split(f":param pulumi.Input[_builtins.str] {arg}:", 1)[1].split(":param", 1)[0]
    return set(re.findall(r"- `(\w+)`", part))


def test_the_sdk_documents_stop_as_economical_mode_and_terminate_as_the_default() -> None:
    assert _documented_values("spot_interruption_behavior") == {"Terminate", "Stop"}
    assert "spot_interruption_behavior" in inspect.signature(ali.ecs.InstanceArgs).parameters


def test_a_spot_node_is_stopped_on_reclaim_and_keeps_its_scratch_disk() -> None:
    cfg = load_stack_file(
        STACKS / "Pulumi.a100x4.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY, "billing": "spot"}
    )
    (node,) = evaluate(cfg).of_type("alicloud:ecs/instance:Instance")
    assert SPOT_INTERRUPTION_BEHAVIOR == "Stop"
    assert node.inputs["spotInterruptionBehavior"] == "Stop"
    assert node.inputs["spotStrategy"] in {"SpotAsPriceGo", "SpotWithPriceLimit"}
    assert node.inputs["stoppedMode"] == "StopCharging"
    (disk,) = node.inputs["dataDisks"]
    assert disk["deleteWithInstance"] is False  # kept on destroy too, unless destroyData


def test_an_on_demand_node_sets_no_spot_interruption_behavior() -> None:
    cfg = load_stack_file(STACKS / "Pulumi.a100x4.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    (node,) = evaluate(cfg).of_type("alicloud:ecs/instance:Instance")
    assert "spotInterruptionBehavior" not in node.inputs
