"""The exact ``pulumi up --replace`` for a failed node: its instance's URN, built as the
offline plan builds it (infra/offline.py evaluates the real program under Pulumi's mocks,
whose URNs are the engine's: ``urn:pulumi:<stack>::gpufleet::<parent type>$<type>::<name>``).

The instance is the GpuNode component's child that carries the node's own name (every
cloud's program names it so: aws:ec2 Instance, alicloud:ecs Instance, azure-native
VirtualMachine, tencentcloud Instance), so nothing here names a cloud. Replacing the
component itself would replace nothing: Pulumi replaces the resource the URN names.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

NODE_TYPE = "gpufleet:node:GpuNode"


def instance_urns(stack: str, names: Iterable[str]) -> dict[str, str]:
    """node name -> its instance's URN in ``stack`` (ValueError, one line, when the stack
    cannot be planned offline)."""
    from infra.config import ConfigError, load_stack_file
    from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
    from infra.stackfiles import STACKS_DIR, StackNotFound, find_stack

    try:
        cfg = load_stack_file(find_stack(stack, STACKS_DIR), {"sshPublicKey": PLACEHOLDER_SSH_KEY})
        resources = evaluate(cfg).resources
    except (StackNotFound, ConfigError) as exc:
        raise ValueError(f"cannot build the node URNs of stack {stack!r}: {exc}") from None
    components = {r.urn: r.name for r in resources if r.type == NODE_TYPE}
    wanted = set(names)
    return {
        r.name: r.urn
        for r in resources
        if r.parent in components and components[r.parent] == r.name and r.name in wanted
    }


def replace_command(stack: str, urn: str) -> str:
    """What replaces one node: a new instance, its scratch and first boot (run it from the
    repository root, where Pulumi.yaml is)."""
    return f"pulumi up --stack {shlex.quote(stack)} --replace {shlex.quote(urn)}"
