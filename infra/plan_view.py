"""The offline plan as text, in the shape of `pulumi preview`.

A tree under the stack: each component with its children beneath it, a `+` (create) marker
per resource, type and name on one line, the resource's key inputs beneath it as `key: value`
lines; then Outputs (whole), the Resources count, Policies, the hourly cost with its price date
and source, and the notes. Types are shown the way the Pulumi CLI shows them
(`aws:ec2/vpc:Vpc` as `aws:ec2:Vpc`); `--json` keeps the full tokens.

Input: the plan document of scripts/plan.py (`resources` with `type`, `name`, `urn`, `parent`,
`inputs`). Pure: no Pulumi import, no I/O; `width=None` means no limit (piped).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.render import value_text, wrap, wrap_line, wrap_prose

STACK_TYPE = "pulumi:pulumi:Stack"

# What a person wants to see of each resource, in this order; everything else is in --json.
KEY_INPUTS = (
    "region",
    "instanceType",
    "hardwareProfile",  # Azure VM: its size
    "priority",  # Azure VM: Regular or Spot
    "evictionPolicy",
    "billingProfile",  # Azure Spot's max price
    "zones",  # Azure: the availability zone
    "availabilityZone",
    "zoneId",
    "instanceChargeType",
    "spotStrategy",
    "instanceMarketOptions",
    "placementGroup",
    "cidrBlock",
    "cidrIpv4",
    "cidrIp",
    "fromPort",
    "toPort",
    "portRange",
    "ipProtocol",
    "strategy",
    "bucketPrefix",
    "bucket",
    "scheduleExpression",
    "cronExpression",
    "runtime",
    "handler",
    "threshold",
    "alarmActions",
    "systemDiskSize",
    "systemDiskCategory",
    "dataDisks",
    "rootBlockDevice",
    "ebsBlockDevices",
    "networkInterfaces",
    "triggerConfig",
)


@dataclass
class Node:
    type: str
    name: str
    urn: str
    inputs: dict[str, Any] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)
    dependencies: tuple[str, ...] = ()


def display_type(token: str) -> str:
    """The type as the Pulumi CLI displays it: `aws:ec2/vpc:Vpc` -> `aws:ec2:Vpc`."""
    parts = token.split(":")
    if len(parts) == 3 and "/" in parts[1]:
        module, member = parts[1].split("/", 1)
        if member.lower() == parts[2].lower():
            return f"{parts[0]}:{module}:{parts[2]}"
    return token


def key_inputs(inputs: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key in KEY_INPUTS:
        value = inputs.get(key)
        if value in (None, "", [], {}):
            continue
        if key == "networkInterfaces" and isinstance(value, list):
            kinds = sorted({str(i.get("interfaceType", "ena")) for i in value})
            text = f"{len(value)} interfaces ({', '.join(kinds)})"
        else:
            text = value_text(without_tags(value))
        out.append((key, text))
    return out


def without_tags(value: Any) -> Any:
    """Nested `tags` left out of the summary (a resource's tags are in --json): a disk's
    inputs are its size and type, not the stack's nine labels again."""
    if isinstance(value, dict):
        return {k: without_tags(v) for k, v in value.items() if k != "tags"}
    if isinstance(value, list):
        return [without_tags(v) for v in value]
    return value


def build_tree(doc: dict[str, Any]) -> Node:
    """The stack node with every resource beneath its parent, in a stable order.

    Siblings come in dependency order (a resource after what it refers to, counting whole
    subtrees for components), ties by type and name; a resource whose parent is unknown hangs
    under the stack, so nothing is ever left out."""
    stack_urn = doc.get("stack_urn") or ""
    # the stack's own name, as the engine names it: <project>-<stack>
    name = stack_urn.rsplit("::", 1)[-1] if stack_urn else f"gpufleet-{doc['stack']}"
    root = Node(STACK_TYPE, name, stack_urn)
    nodes = [
        Node(
            r["type"],
            r["name"],
            r.get("urn") or f"{r['type']}::{r['name']}",
            r.get("inputs", {}),
            [],
            tuple(r.get("dependencies", ())),
        )
        for r in doc["resources"]
    ]
    by_urn = {n.urn: n for n in nodes}
    for r, node in zip(doc["resources"], nodes, strict=True):
        parent = by_urn.get(r.get("parent", ""))
        (parent if parent is not None and parent is not node else root).children.append(node)
    _order(root)
    return root


def _subtree_urns(node: Node) -> set[str]:
    urns = {node.urn}
    for child in node.children:
        urns |= _subtree_urns(child)
    return urns


def _subtree_deps(node: Node) -> set[str]:
    deps = set(node.dependencies)
    for child in node.children:
        deps |= _subtree_deps(child)
    return deps


def _order(node: Node) -> None:
    # providers first, as preview lists them: every resource uses one, though no input says so
    kids = sorted(
        node.children,
        key=lambda n: (not n.type.startswith("pulumi:providers:"), display_type(n.type), n.name),
    )
    owned = {id(k): _subtree_urns(k) for k in kids}
    needs = {id(k): _subtree_deps(k) - owned[id(k)] for k in kids}
    placed: list[Node] = []
    left = list(kids)
    while left:
        pending: set[str] = set().union(*(owned[id(k)] for k in left))
        # the first (by type, name) that needs none of the siblings still to place; a cycle
        # cannot happen in a real program, but would just fall back to the sorted order
        pick = next((k for k in left if not needs[id(k)] & pending), left[0])
        placed.append(pick)
        left.remove(pick)
    node.children = placed
    for child in placed:
        _order(child)


def walk(
    node: Node, prefix: str = "", last: bool = True, depth: int = 0
) -> Iterable[tuple[Node, str, str]]:
    """(node, branch prefix for its own line, prefix for lines beneath it) in display order."""
    if depth == 0:
        own, below = "", ""
    else:
        own = prefix + ("└─ " if last else "├─ ")
        below = prefix + ("   " if last else "│  ")
    yield node, own, below
    for i, child in enumerate(node.children):
        yield from walk(child, below, i == len(node.children) - 1, depth + 1)


def count(node: Node) -> int:
    return 1 + sum(count(c) for c in node.children)


MARK = " +  "  # the create marker column, as preview prints it
BLANK = "    "


def tree_lines(root: Node, width: int | None) -> list[str]:
    rows = list(walk(root))
    heads = [MARK + own + display_type(n.type) for n, own, _ in rows]
    name_col = max(len(h) for h in heads) + 2
    aligned = width is None or all(
        name_col + len(n.name) <= width for (n, _, _), h in zip(rows, heads, strict=True)
    )
    lines = []
    for (node, _own, below), head in zip(rows, heads, strict=True):
        # the text beneath a resource hangs under its branch: its children's rail, or spaces
        rail = below + ("│  " if node.children else "   ")
        if aligned:
            lines.append(head.ljust(name_col) + node.name)
        elif width is None or len(head) + 2 + len(node.name) <= width:
            lines.append(f"{head}  {node.name}")
        else:
            lines.extend(wrap(head, width, "", BLANK + rail))
            lines.extend(wrap(node.name, width, BLANK + rail + "  "))
        for key, text in key_inputs(node.inputs):
            lines.extend(wrap(text, width, f"{BLANK}{rail}  {key}: ", f"{BLANK}{rail}    "))
    return lines


def outputs_lines(outputs: dict[str, Any], width: int | None) -> list[str]:
    lines = ["Outputs:"]
    for key, value in outputs.items():
        lines.extend(wrap(value_text(value), width, f"    {key}: ", "        "))
    return lines


def cost_lines(cost: dict[str, Any], width: int | None) -> list[str]:
    span = ""
    if "low" in cost:
        span = f" (range {value_text(cost['low'])}-{value_text(cost['high'])})"
    estimate = ", estimate" if cost.get("estimate") else ""
    text = (
        f"{value_text(cost['amount'])} {cost['currency']}/h{span} for {cost['nodes']}x "
        f"{cost['instance_type']}, {cost['billing']} (price of {cost['price_date']}, "
        f"source: {cost['source']}{estimate})"
    )
    return wrap(text, width, "Hourly cost: ", "    ")


def render_plan(
    doc: dict[str, Any], notes: Sequence[str], policies_text: str, width: int | None
) -> str:
    """The whole human plan. `policies_text`: the Policies section as preview lays it out."""
    root = build_tree(doc)
    total = count(root)
    lines = [
        *wrap(
            f"Previewing update ({doc['stack']}), offline under Pulumi's mocks: nothing is created",
            width,
        ),
        "",
        *tree_lines(root, width),
        "",
        *outputs_lines(doc["outputs"], width),
        "",
        "Resources:",
        f"    + {total} to create",
        "",
    ]
    for line in policies_text.splitlines():
        lines.extend(wrap_line(line, width))
    lines += ["", *cost_lines(doc["cost"], width)]
    if doc.get("ttl"):  # when the hard TTL stops the nodes, busy or not (scripts/plan.py)
        lines.extend(wrap(doc["ttl"]["line"], width, "", "    "))
    for note in notes:
        lines.extend(wrap_prose(note, width, "note: ", "      "))
    return "\n".join(lines) + "\n"
